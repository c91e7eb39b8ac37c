"""Readable tensor names in a .tflite that litert-torch converted.

litert-torch names each tensor after the PyTorch module stack that computed it, one `package.module.Class_instance`
per level, joined with `/` and closed with `;` (fused ops join several), then a number that keeps names unique:
`optimize.convert.onnx_ops.NamedIO/onnx2torch.node_converters.matmul.OnnxMatMul_enc/layers/0/MatMul;1`. The
class paths are ours or a library's (the wrappers that name inputs and outputs, onnx2torch's converters,
torch.export's unflattened modules); what a user recognises is the instance path: the ONNX node's name, or
the PyTorch module's attribute path (`enc/0/self_attn;19`). Float islands, per-layer errors and the delegate
reports print these names, so the conversion keeps only that part (and the number).

A name that would become empty (an op outside any named module) is called after its op (`softmax;3`); one
that would clash with another tensor's gets `#2`, `#3`, ... (LiteRT Quantizer addresses tensors by name, so
names stay unique). Signature tensors (the model's inputs and outputs) keep their names.
"""

from __future__ import annotations

import re

#: `package.module.Class` or `package.module.Class_instance`: one level of litert-torch's module stack.
_LEVEL = re.compile(r"^(?:[A-Za-z_]\w*\.)+(?:<locals>\.)?([A-Z][A-Za-z0-9]*)(?:_(.+))?$")
#: Levels that are our own wrappers or torch.export's scaffolding, dropped with their instance names.
_WRAPPERS = {"NamedIO", "Program", "UnflattenedModule", "ChannelLastIOWrapper"}


def _path(location: str) -> str:
    """One location (`a/b/c`) with class paths removed and wrapper levels dropped."""
    out: list[str] = []
    for part in location.split("/"):
        m = _LEVEL.match(part)
        if m is None:
            out.append(part)
        elif m.group(1) not in _WRAPPERS and m.group(2):
            out.append(m.group(2))
    return "/".join(p for p in out if p)


def readable(name: str) -> str:
    """A litert-torch tensor name with the module class paths removed ('' when nothing readable is left)."""
    if not any(_LEVEL.match(level) for level in re.split(r"[/;]", name)):
        return name  # not a module stack (a constant's `arith.constant3`, a Keras name)
    parts = name.split(";")
    suffix = parts.pop() if parts and re.fullmatch(r"\d*", parts[-1]) else ""
    paths: list[str] = []
    for p in parts:
        clean = _path(p)
        if clean and clean not in paths:
            paths.append(clean)
    return ";".join(paths) + (f";{suffix}" if suffix else ";") if paths else (f";{suffix}" if suffix else "")


def clean(content: bytes) -> bytes:
    """The .tflite with readable tensor names (see the module docstring); the same bytes when none changes."""
    from optimize.models.normalize import _load, _save, _schema

    model = _load(content)
    s = _schema()
    codes = {v: k for k, v in vars(s.BuiltinOperator).items() if not k.startswith("_")}
    changed = False
    for sg in model.subgraphs or []:
        keep = set(sg.inputs if sg.inputs is not None else []) | set(sg.outputs if sg.outputs is not None else [])
        producer = {int(t): op for op in sg.operators or [] for t in (op.outputs if op.outputs is not None else [])}
        names = [t.name.decode() if isinstance(t.name, bytes) else str(t.name or "") for t in sg.tensors]
        taken = set(names)
        for i, t in enumerate(sg.tensors):
            if i in keep:
                continue
            new = readable(names[i])
            if new.startswith(";") or not new:
                op = producer.get(i)
                code = model.operatorCodes[op.opcodeIndex] if op is not None else None
                what = codes.get(max(code.builtinCode or 0, code.deprecatedBuiltinCode or 0), "op") if code else "op"
                new = what.lower() + (new or ";")
            if new == names[i]:
                continue
            base, k = new, 2
            while new in taken:  # fused ops of one module share its path: numbered apart
                new, k = f"{base}#{k}", k + 1
            taken.add(new)
            t.name = new
            changed = True
    return _save(model) if changed else content

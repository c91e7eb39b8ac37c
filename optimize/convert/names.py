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
#: Our own converters' class paths (`optimize.convert.onnx_dense.Linear_optimize/dense`).
_OWN = "optimize.convert."


def _path(location: str) -> str:
    """One location (`a/b/c`) with class paths removed and wrapper levels dropped."""
    out: list[str] = []
    for part in location.split("/"):
        m = _LEVEL.match(part)
        if m is None:
            out.append(part)
        elif m.group(1) not in _WRAPPERS and m.group(2) and not (part.startswith(_OWN) and m.group(2) == "optimize"):
            out.append(m.group(2))  # (onnx2torch prepends a node's domain: our fused nodes' `optimize/` dropped)
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
    from optimize.models.normalize import _load, _save

    model = _load(content)
    changed = False
    for sg in model.subgraphs or []:
        changed |= _rename(model, sg)
    return _save(model) if changed else content


def _text(name) -> str:
    return name.decode() if isinstance(name, bytes) else str(name or "")


def _op_name(model, op) -> str:
    """A builtin op's name in lower case (`softmax`), for a tensor whose name says nothing else."""
    from optimize.models.normalize import _schema

    codes = {v: k for k, v in vars(_schema().BuiltinOperator).items() if not k.startswith("_")}
    if op is None:
        return "op"
    code = model.operatorCodes[op.opcodeIndex]
    return codes.get(max(code.builtinCode or 0, code.deprecatedBuiltinCode or 0), "op").lower()


def _ints(values) -> list:
    return [] if values is None else list(values)


def _rename(model, sg) -> bool:
    """Readable names for one subgraph's tensors (its inputs and outputs kept); whether any changed."""
    keep = {int(i) for i in _ints(sg.inputs)} | {int(i) for i in _ints(sg.outputs)}
    producer = {int(t): op for op in sg.operators or [] for t in _ints(op.outputs)}
    names = [_text(t.name) for t in sg.tensors]
    taken = set(names)
    changed = False
    for i, t in enumerate(sg.tensors):
        new = readable(names[i]) if i not in keep else names[i]
        if not new or new.startswith(";"):
            new = _op_name(model, producer.get(i)) + (new or ";")
        if new != names[i]:
            t.name = _unique(new, taken)
            changed = True
    return changed


def _unique(name: str, taken: set[str]) -> str:
    """`name`, or `name#2`, `name#3`, ... where it is taken (fused ops of one module share its path)."""
    new, k = name, 2
    while new in taken:
        new, k = f"{name}#{k}", k + 1
    taken.add(new)
    return new


# ------------------------------------------------------------------------------------------- where a lowering failed
def _fx_node(e: BaseException):
    """The torch.fx node being run when `e` was raised (litert-torch's lowering interpreter or torch.fx's own
    interpreter hold it in their `run_node` frame), the innermost one; None when no such frame is in the way."""
    import torch

    found, tb = None, e.__traceback__
    while tb is not None:
        f = tb.tb_frame
        if f.f_code.co_name == "run_node":
            n = f.f_locals.get("node", f.f_locals.get("n"))
            found = n if isinstance(n, torch.fx.Node) else found
        tb = tb.tb_next
    return found


def failed_at(e: BaseException) -> str:
    """` at ONNX node 'TopK' (op TopK; torch op aten.topk)`: the node of the model that the converter was
    lowering when `e` was raised, named as the user knows it (the ONNX node's name and op, or the module's
    attribute path and class), or '' when the error does not say."""
    n = _fx_node(e)
    if n is None:
        return ""
    target = str(getattr(n, "target", "")).replace("aten::", "aten.")
    stack = list((n.meta.get("nn_module_stack") or {}).values())
    levels = [(path, cls) for path, cls in stack if str(cls).rsplit(".", 1)[-1] not in _WRAPPERS]
    if not levels:
        return f" (at torch op {target})" if target else ""
    path, cls = levels[-1]
    cls_name = str(cls).rsplit(".", 1)[-1]
    onnx = str(cls).startswith(("onnx2torch.", "optimize.convert.onnx"))
    name = path.split("inner.", 1)[-1] if onnx else path
    if onnx:
        op = cls_name[4:] if cls_name.startswith("Onnx") else cls_name
        return f" (at ONNX node {name!r}, op {op}; torch op {target})"
    return f" (at module {name!r}, {cls_name}; torch op {target})"

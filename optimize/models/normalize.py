"""The .tflite front door: any float flatbuffer made into the plain float32 model every technique expects.

What third-party models (MediaPipe's, for one) bring, and what is done about it:
- old-schema operator codes (`builtin_code` 0, the op in `deprecated_builtin_code`): the code is moved
  into `builtin_code`, as the schema says readers should take the larger of the two;
- no SignatureDef: a `serving_default` signature is made from the graph's inputs and outputs, with
  clean, unique names taken from the tensors;
- float16 weights behind DEQUANTIZE: each DEQUANTIZE of a constant float16 tensor is folded into a
  float32 constant, so every scheme starts from float32 (a float16 tensor on a non-constant path is
  left alone);
- sparse weights behind DENSIFY: the dense values are read from the runtime (the op's output does not
  depend on the input) and stored as a constant, so the weights can be quantized;
- tensor names repeated across subgraphs (the branches of an IF from an ONNX converter: arg0, arg1, ...):
  made unique, as LiteRT Quantizer addresses tensors by name.
Custom ops and everything else are kept as they are. The model is written with the flatbuffer object
API of the schema that ai-edge-litert ships; the result is checked to compute what the original
computes (when the runtime can run it).
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass, field

import numpy as np

from optimize.core.errors import ModelError

SIGNATURE = "serving_default"
FLOAT16, FLOAT32 = 1, 0  # schema TensorType values
DEQUANTIZE, DENSIFY = 6, 124  # schema BuiltinOperator values


@dataclass
class Normalized:
    """The plain float32 model and what was done to get it (facts for the candidate's notes); its parse
    (validated) and its inputs and outputs as its signature names them (`signature_io`)."""

    content: bytes
    facts: list[str] = field(default_factory=list)
    model: object = field(default=None, repr=False)  # flatbuffer.Model of `content`
    inputs: tuple[tuple[str, tuple[int, ...], str], ...] = ()  # (name, shape with -1 for free, numpy dtype name)
    outputs: tuple[str, ...] = ()

    @property
    def changed(self) -> bool:
        return bool(self.facts)


def _schema():
    from ai_edge_litert import schema_py_generated

    return schema_py_generated


def _load(content: bytes, copy: bool = True):
    """The object model, with buffers stored after the flatbuffer (offset/size, as LiteRT Quantizer writes
    them) read inline: writing the model again would otherwise leave their offsets pointing past its end.
    `copy=False`: its weights are read-only views of `content` (no second copy of them; for a caller that only
    writes the model out again with other metadata)."""
    s = _schema()
    model = s.ModelT.InitFromObj(s.Model.GetRootAsModel(bytearray(content) if copy else content, 0))
    for buf in model.buffers or []:
        if buf.data is None and (buf.offset or 0) > 1:
            buf.data = np.frombuffer(content, np.uint8, count=buf.size, offset=buf.offset)
            buf.offset = buf.size = 0
    return model


def _save(model) -> bytes:
    """The object model as a flatbuffer. The builder starts at about the size of the model's weights (grown by
    doubling from a small start, it held the old and the new buffer at once at every step: a 437 MB model's
    transient peak went to 1.3 GB), and its bytes are copied out once."""
    import flatbuffers

    weights = sum(0 if buf.data is None else len(buf.data) for buf in model.buffers or [])
    b = flatbuffers.Builder(weights + weights // 64 + (1 << 20))
    b.Finish(model.Pack(b), file_identifier=b"TFL3")
    out = bytes(memoryview(b.Bytes)[b.Head() :])  # Output() slices a copy, and bytes() copied it again
    return out


def _fix_opcodes(model) -> int:
    fixed = 0
    for code in model.operatorCodes or []:
        real = max(code.builtinCode or 0, code.deprecatedBuiltinCode or 0)
        if real != code.builtinCode:
            code.builtinCode = real
            fixed += 1
    return fixed


def _clean(name: str, taken: set[str]) -> str:
    base = re.sub(r"[^A-Za-z0-9_]", "_", name.split(":")[0]).strip("_") or "tensor"
    if base[0].isdigit():
        base = f"t_{base}"
    out, i = base, 1
    while out in taken:
        i += 1
        out = f"{base}_{i}"
    taken.add(out)
    return out


def _tensor_name(t) -> str:
    n = t.name
    return n.decode(errors="replace") if isinstance(n, bytes) else (n or "")  # a name is any bytes the file holds


def _add_signature(model) -> bool:
    if model.signatureDefs:
        return False
    sg = model.subgraphs[0]
    named = {}
    for attr in ("inputs", "outputs"):
        taken: set[str] = set()
        names = [_clean(_tensor_name(sg.tensors[idx]), taken) for idx in getattr(sg, attr)]
        if names != sorted(names):  # the runtime lists signature keys by name: keep the graph's order
            names = [f"{attr[:-1]}_{i}_{n}" for i, n in enumerate(names)]
        named[attr] = names
    _set_signature(model, named["inputs"], named["outputs"])
    return True


def _set_signature(model, inputs: list[str], outputs: list[str]) -> None:
    """The model's one signature, serving_default: the main subgraph's inputs and outputs by these names."""
    s = _schema()
    sg = model.subgraphs[0]
    sig = s.SignatureDefT()
    sig.signatureKey, sig.subgraphIndex = SIGNATURE, 0
    for attr, names in (("inputs", inputs), ("outputs", outputs)):
        maps = []
        for name, idx in zip(names, getattr(sg, attr)):
            m = s.TensorMapT()
            m.name, m.tensorIndex = name, int(idx)
            maps.append(m)
        setattr(sig, attr, maps)
    model.signatureDefs = [sig]


def named_signature(content: bytes, inputs: list[str], outputs: list[str]) -> bytes:
    """`content` with a serving_default signature naming its main subgraph's inputs and outputs, in graph order,
    `inputs` and `outputs` (a converter that leaves none, as the TFLite converter does for concrete functions)."""
    model = _load(content)
    sg = model.subgraphs[0]
    if len(inputs) != len(sg.inputs) or len(outputs) != len(sg.outputs):
        raise ValueError(f"{len(sg.inputs)} inputs and {len(sg.outputs)} outputs, not {len(inputs)} and {len(outputs)}")
    _set_signature(model, inputs, outputs)
    return _save(model)


def _unique_names(model) -> int:
    """Give every tensor a name no other tensor has, in any subgraph (LiteRT Quantizer addresses tensors by
    name: "Tensor name arg0 is not unique"). Converters from other frameworks reuse names across the
    branches of IF and WHILE (arg0, arg1, ...). The main subgraph keeps its names; later ones are suffixed."""
    taken: set[str] = set()
    renamed = 0
    for si, sg in enumerate(model.subgraphs):
        for ti, t in enumerate(sg.tensors or []):
            name = _tensor_name(t)
            if name and name not in taken:
                taken.add(name)
                continue
            base, i = f"{name or 'tensor'}_sg{si}" if si else f"{name or 'tensor'}_{ti}", 1
            new = base
            while new in taken:
                i += 1
                new = f"{base}_{i}"
            taken.add(new)
            t.name = new
            renamed += 1
    return renamed


def _const_data(model, tensor) -> np.ndarray | None:
    buf = model.buffers[tensor.buffer] if tensor.buffer and tensor.buffer < len(model.buffers) else None
    data = getattr(buf, "data", None)
    return None if data is None or len(data) == 0 else np.asarray(data, dtype=np.uint8)


def _set_const(model, tensor, values: np.ndarray) -> None:
    """Give `tensor` its own buffer holding `values` (float32), and make it a plain dense constant."""
    s = _schema()
    buf = s.BufferT()
    buf.data = np.frombuffer(values.astype(np.float32).tobytes(), dtype=np.uint8)
    model.buffers.append(buf)
    tensor.buffer = len(model.buffers) - 1
    tensor.type = FLOAT32
    tensor.sparsity = None
    tensor.quantization = None


def _opcode(model, op) -> int:
    return model.operatorCodes[op.opcodeIndex].builtinCode


def _drop_ops(model, sg, dead: set[int]) -> None:
    """Remove ops, then empty the buffers no remaining tensor reads (the float16 or sparse originals)."""
    sg.operators = [op for i, op in enumerate(sg.operators) if i not in dead]
    used = {int(i) for op in sg.operators for i in list(op.inputs) + list(op.outputs) if i >= 0}
    used |= {int(i) for i in sg.inputs} | {int(i) for i in sg.outputs}
    keep = {sg.tensors[i].buffer for i in used}
    for i, t in enumerate(sg.tensors):
        if i not in used and t.buffer and t.buffer not in keep:
            model.buffers[t.buffer].data = None
            t.sparsity = None  # no data left to be sparse: a layout over nothing would be a lie


def _fold_dequantize(model, values: dict[int, np.ndarray]) -> int:
    """DEQUANTIZE(const float16) -> float32 constant. `values` holds densified tensors' values."""
    sg = model.subgraphs[0]
    dead = set()
    for i, op in enumerate(sg.operators):
        if _opcode(model, op) != DEQUANTIZE:
            continue
        src = sg.tensors[op.inputs[0]]
        if src.type != FLOAT16:
            continue
        if op.inputs[0] in values:
            data = values[op.inputs[0]]
        else:
            raw = _const_data(model, src)
            if raw is None:
                continue  # float16 on a non-constant path: left alone
            data = raw.view(np.float16)
        out = sg.tensors[op.outputs[0]]
        _set_const(model, out, data.astype(np.float32))
        out.shape, out.shapeSignature = src.shape, src.shapeSignature  # DEQUANTIZE's output has its input's shape
        dead.add(i)
    _drop_ops(model, sg, dead)
    return len(dead)


def _densified(content: bytes, model) -> dict[int, np.ndarray]:
    """The dense values of every DENSIFY op's output, read from the runtime after one invoke."""
    sg = model.subgraphs[0]
    outs = [int(op.outputs[0]) for op in sg.operators if _opcode(model, op) == DENSIFY]
    if not outs:
        return {}
    from optimize.models import runtime

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        runner = runtime.Runner(runtime.load(content, threads=1, keep_tensors=True))
    runner.run(runner.zeros())
    return {i: np.array(runner.it.get_tensor(i)) for i in outs}


def _drop_densify(model, values: dict[int, np.ndarray]) -> int:
    """DENSIFY(const sparse) -> dense constant (float16 stays float16 until its DEQUANTIZE is folded)."""
    sg = model.subgraphs[0]
    dead = set()
    for i, op in enumerate(sg.operators):
        if _opcode(model, op) == DENSIFY and int(op.outputs[0]) in values:
            out = sg.tensors[op.outputs[0]]
            data = values[int(op.outputs[0])]
            s = _schema()
            buf = s.BufferT()
            buf.data = np.frombuffer(data.tobytes(), dtype=np.uint8)
            model.buffers.append(buf)
            out.buffer = len(model.buffers) - 1
            dead.add(i)
    _drop_ops(model, sg, dead)
    return len(dead)


def normalize(content: bytes) -> Normalized:
    """The plain float32 equivalent of a float .tflite, and the facts of what changed (none: unchanged).
    The flatbuffer is validated first (delegates/validate.py): nothing below reads an unchecked index."""
    from optimize.models.tflite import read_model, signature_io

    parsed = read_model(content)
    try:
        model = _load(content)
    except Exception as e:  # noqa: BLE001 - any failure to parse is a model we cannot read
        raise ModelError(f"This .tflite cannot be read as a flatbuffer ({e.__class__.__name__}).") from None
    facts = []
    if n := _fix_opcodes(model):
        facts.append(f"{n} operator code(s) moved from the old schema's deprecated_builtin_code")
    dense = (
        _densified(content, model) if any(_opcode(model, op) == DENSIFY for op in model.subgraphs[0].operators) else {}
    )
    if dense:
        facts.append(f"{_drop_densify(model, dense)} sparse weight tensor(s) densified")
    if n := _fold_dequantize(model, {}):
        facts.append(f"{n} float16 weight tensor(s) behind DEQUANTIZE folded into float32 constants")
    if _add_signature(model):
        facts.append("a serving_default signature made from the graph's inputs and outputs")
    if n := _unique_names(model):
        facts.append(f"{n} duplicate tensor name(s) made unique (LiteRT Quantizer addresses tensors by name)")
    if facts:
        content = _save(model)
        parsed = read_model(content, "The normalised model")
    return Normalized(content, facts, parsed, *signature_io(parsed))

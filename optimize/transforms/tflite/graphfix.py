"""Graph edits the quantize technique makes around the quantizers, each exact where it claims to be:

    clamp_divisors(q, tensors)       int8 DIV whose divisor rounds to its zero point (digital silence): the
                                     divisor is clamped to one quantization step, MAXIMUM(d, zp + 1), inside
                                     the integer graph (divisors the int8 model can represent are unchanged)
    split_outputs(f)                 a graph output that ops also read gets its own tensor (an identity
                                     RESHAPE), so integer I/O quantizes a pure output (float model unchanged)
    fix_signature(q, f)              signature entries re-pointed, by position, at the subgraph's inputs and
                                     outputs where a quantizer left them at tensors that no longer are
    pin_inputs(f, sample)            inputs with free dimensions given the data's shape as their default
                                     (the shape signature stays free): calibrators allocate at the default
    weights_behind_dequantize(q, ..) float32 weights no quantizer reaches (constants passed into IF/WHILE,
                                     and those inside their branch subgraphs), or that a weight recipe left
                                     float32 (a GATHER's table, an ADD's position embeddings), stored as
                                     float16 or int8 behind a DEQUANTIZE, which the runtime folds back once
                                     at load
    negations_as_mul(f)              float NEG computed as MUL by -1 (exact), which int8 quantizers do have

All of them read and write with normalize's loader (the schema object API ai-edge-litert ships).
"""

from __future__ import annotations

import numpy as np

from optimize.models.normalize import _load, _save, _schema
from optimize.models.tflite import read_model

_TYPES = {0: "float32", 1: "float16", 2: "int32", 3: "uint8", 4: "int64", 7: "int16", 9: "int8"}
CONTROL_FLOW = ("IF", "WHILE", "CALL_ONCE")


def _codes(model) -> list[str]:
    s = _schema()
    by_code = {v: k for k, v in vars(s.BuiltinOperator).items() if not k.startswith("_")}
    return [by_code.get(max(c.builtinCode or 0, c.deprecatedBuiltinCode or 0), "?") for c in model.operatorCodes]


def _opcode(model, name: str) -> int:
    """The index of builtin op `name` in the model's operator codes (added if missing)."""
    s = _schema()
    code = getattr(s.BuiltinOperator, name)
    for i, c in enumerate(model.operatorCodes):
        if max(c.builtinCode or 0, c.deprecatedBuiltinCode or 0) == code:
            return i
    oc = s.OperatorCodeT()
    oc.builtinCode, oc.deprecatedBuiltinCode, oc.version = code, min(code, 127), 1
    model.operatorCodes.append(oc)
    return len(model.operatorCodes) - 1


def _name(t) -> str:
    n = t.name
    return n.decode() if isinstance(n, bytes) else (n or "")


def _buffer(model, data: bytes) -> int:
    buf = _schema().BufferT()
    buf.data = np.frombuffer(data, np.uint8)
    model.buffers.append(buf)
    return len(model.buffers) - 1


def _tensor(sg, name: str, shape, dtype: int, buffer: int = 0, quant=None, signature=None) -> int:
    t = _schema().TensorT()
    t.name, t.type, t.buffer = name, dtype, buffer
    t.shape = None if shape is None else np.array(shape, np.int32)
    t.shapeSignature = None if signature is None else np.array(signature, np.int32)
    t.quantization = quant
    sg.tensors.append(t)
    return len(sg.tensors) - 1


def _quant(scale, zero, dim: int = 0):
    q = _schema().QuantizationParametersT()
    q.scale = np.array(scale, np.float32).reshape(-1)
    q.zeroPoint = np.array(zero, np.int64).reshape(-1)
    q.quantizedDimension = dim
    return q


def _op(model, name: str, inputs, outputs, options_type=None, options=None):
    o = _schema().OperatorT()
    o.opcodeIndex = _opcode(model, name)
    o.inputs, o.outputs = np.array(inputs, np.int32), np.array(outputs, np.int32)
    if options_type is not None:
        o.builtinOptionsType, o.builtinOptions = options_type, options
    return o


# ------------------------------------------------------------------------------------------ divisors
def _divisor(model, op) -> tuple[object, int] | None:
    """(the divisor tensor, its zero point) of an int8 DIV whose divisor is a non-negative activation (its
    calibrated range starts at 0, so its zero point is the type's minimum): the only case a clamp is exact."""
    sg = model.subgraphs[0]
    d = sg.tensors[int(op.inputs[1])]
    q = d.quantization
    if d.type not in (9, 3) or q is None or q.scale is None or len(q.scale) != 1:
        return None
    if d.buffer and model.buffers[d.buffer].data is not None and len(model.buffers[d.buffer].data):
        return None  # a constant divisor: nothing the data changes
    zero = int(q.zeroPoint[0]) if q.zeroPoint is not None and len(q.zeroPoint) else 0
    lowest = -128 if d.type == 9 else 0
    return (d, zero) if zero == lowest else None


def clampable(content: bytes, tensor: str) -> bool:
    """Whether the op writing `tensor` is an int8 DIV whose divisor `clamp_divisors` can clamp exactly."""
    model = _load(content)
    codes = _codes(model)
    sg = model.subgraphs[0]
    for op in sg.operators:
        if codes[op.opcodeIndex] == "DIV" and len(op.outputs) and _name(sg.tensors[int(op.outputs[0])]) == tensor:
            return _divisor(model, op) is not None
    return False


def clamp_divisors(content: bytes, tensors: set[str] | frozenset[str]) -> tuple[bytes, list[str]]:
    """Each int8 DIV writing one of `tensors` divides by MAXIMUM(divisor, zero point + 1) instead: the int8
    kernel refuses a divisor equal to its zero point (div.cc: `data[i] != zero_point`), which a non-negative
    divisor below half a step rounds to. The clamp keeps the divisor's scale and zero point, so every
    divisor the int8 model can represent divides as before; the one it cannot becomes the smallest it can.
    Returns the model and the tensors clamped."""
    if not tensors:
        return content, []
    s = _schema()
    model = _load(content)
    codes = _codes(model)
    sg = model.subgraphs[0]
    ops, done = [], []
    for op in sg.operators:
        out = _name(sg.tensors[int(op.outputs[0])]) if len(op.outputs) else ""
        found = _divisor(model, op) if codes[op.opcodeIndex] == "DIV" and out in tensors else None
        if found is not None:
            d, zero = found
            dtype = np.int8 if d.type == 9 else np.uint8
            quant = _quant(d.quantization.scale, [zero])
            step = _tensor(
                sg, f"{_name(d)}/one_step", [1], d.type, _buffer(model, np.array([zero + 1], dtype).tobytes()), quant
            )
            clamped = _tensor(
                sg, f"{_name(d)}/clamped", d.shape, d.type, 0, _quant(d.quantization.scale, [zero]), d.shapeSignature
            )
            ops.append(
                _op(
                    model,
                    "MAXIMUM",
                    [int(op.inputs[1]), step],
                    [clamped],
                    s.BuiltinOptions.MaximumMinimumOptions,
                    s.MaximumMinimumOptionsT(),
                )
            )
            op.inputs[1] = clamped
            done.append(out)
        ops.append(op)
    sg.operators = ops
    return (_save(model), done) if done else (content, [])


# ------------------------------------------------------------------------------------------ outputs
def _shared_outputs(sg) -> list[int]:
    read = {int(i) for op in sg.operators for i in op.inputs if i >= 0}
    return [k for k, t in enumerate(sg.outputs) if int(t) in read]


def shared_outputs(content: bytes) -> int:
    """How many of the main graph's outputs other ops also read."""
    return len(_shared_outputs(_load(content).subgraphs[0]))


def split_outputs(content: bytes) -> tuple[bytes, int]:
    """Each main-graph output that ops also read is given its own tensor (an identity RESHAPE): a quantizer
    asked for integer outputs then has a pure output to quantize (LiteRT Quantizer otherwise adds a
    DEQUANTIZE to a new tensor and leaves the signature at the old one). Exact: the float model computes
    the same. Outputs with more than one free dimension are left alone (RESHAPE takes one -1)."""
    s = _schema()
    model = _load(content)
    sg = model.subgraphs[0]
    done = 0
    for k in _shared_outputs(sg):
        t = int(sg.outputs[k])
        src = sg.tensors[t]
        shape = list(
            src.shapeSignature if src.shapeSignature is not None else (src.shape if src.shape is not None else [])
        )
        if not shape or sum(1 for d in shape if d < 0) > 1:
            continue
        const = _tensor(sg, f"{_name(src)}/shape", [len(shape)], 2, _buffer(model, np.array(shape, np.int32).tobytes()))
        out = _tensor(sg, f"{_name(src)}/output", src.shape, src.type, 0, None, src.shapeSignature)
        opts = s.ReshapeOptionsT()
        opts.newShape = np.array(shape, np.int32)
        sg.operators.append(_op(model, "RESHAPE", [t, const], [out], s.BuiltinOptions.ReshapeOptions, opts))
        sg.outputs[k] = out
        for sd in model.signatureDefs or []:
            for tm in sd.outputs or []:
                if int(tm.tensorIndex) == t and sd.subgraphIndex == 0:
                    tm.tensorIndex = out
        done += 1
    return (_save(model), done) if done else (content, 0)


def fix_signature(content: bytes, original: bytes) -> tuple[bytes, int]:
    """Signature inputs and outputs that point at a tensor that is not (any more) one of the subgraph's inputs
    or outputs, re-pointed by position: a SignatureDef lists them against the original model's subgraph
    inputs and outputs, which keep their order through quantization."""
    model, orig = _load(content), _load(original)
    fixed = 0
    for sd in model.signatureDefs or []:
        si = sd.subgraphIndex or 0
        sg, osg = model.subgraphs[si], orig.subgraphs[si]
        for attr in ("inputs", "outputs"):
            now = [int(i) for i in getattr(sg, attr)]
            before = [int(i) for i in getattr(osg, attr)]
            for tm in getattr(sd, attr) or []:
                t = int(tm.tensorIndex)
                if t in now or t not in before or len(now) != len(before):
                    continue
                tm.tensorIndex = now[before.index(t)]
                fixed += 1
    return (_save(model), fixed) if fixed else (content, 0)


def stale_signature(content: bytes) -> bool:
    """Whether a signature points at a tensor that is not one of its subgraph's inputs or outputs (read
    without the validator, which refuses exactly that)."""
    from optimize.models.flatbuffer import _parse

    try:
        m = _parse(content)
    except Exception:  # noqa: BLE001 - unreadable: the validator will say so
        return False
    for sig in m.signatures:
        if not 0 <= sig.subgraph < len(m.subgraphs):
            return False
        sg = m.subgraphs[sig.subgraph]
        for maps, ends in ((sig.inputs, sg.inputs), (sig.outputs, sg.outputs)):
            if any(t not in ends for _, t in maps or ()):
                return True
    return False


def fix_signature_if_stale(content: bytes, original: bytes) -> bytes:
    """`fix_signature` where a quantizer left the signature stale; the model as it is otherwise."""
    return fix_signature(content, original)[0] if stale_signature(content) else content


# ------------------------------------------------------------------------------------------ inputs
def pin_inputs(content: bytes, shapes: dict[str, tuple[int, ...]]) -> tuple[bytes, list[str]]:
    """Main-graph inputs (by tensor name) whose shape signature has free dimensions take `shapes[name]` as
    their default shape; their signature stays free. Returns the model and the inputs pinned."""
    model = _load(content)
    sg = model.subgraphs[0]
    done = []
    for i in sg.inputs:
        t = sg.tensors[int(i)]
        sig = t.shapeSignature
        want = shapes.get(_name(t))
        if sig is None or want is None or not any(int(d) < 0 for d in sig) or len(want) != len(sig):
            continue
        if all(int(s) in (-1, int(w)) for s, w in zip(sig, want)) and list(t.shape) != list(want):
            t.shape = np.array(want, np.int32)
            done.append(_name(t))
    return (_save(model), done) if done else (content, [])


# ------------------------------------------------------------------------------------------ weights
def _unreached(model, codes) -> list[tuple[int, int]]:
    """(subgraph, tensor) of float32 constants no quantizer reaches: those a control-flow op reads, and
    every one inside a subgraph that a control-flow op calls."""
    found = []
    for si, sg in enumerate(model.subgraphs):
        readers: dict[int, list[str]] = {}
        for op in sg.operators:
            for i in op.inputs:
                if i >= 0:
                    readers.setdefault(int(i), []).append(codes[op.opcodeIndex])
        for ti, names in readers.items():
            t = sg.tensors[ti]
            data = model.buffers[t.buffer].data if t.buffer and t.buffer < len(model.buffers) else None
            if t.type != 0 or data is None or len(data) == 0:
                continue
            if si > 0 or any(n in CONTROL_FLOW for n in names):
                found.append((si, ti))
    return found


def _left_float(model, codes) -> list[tuple[int, int]]:
    """(subgraph, tensor) of float32 constants a weight recipe left float32 in the main graph: a Keras
    embedding's GATHER table, the position embeddings an ADD reads, ... (what DEQUANTIZE already reads aside)."""
    sg = model.subgraphs[0]
    found = []
    dequantized = {int(i) for op in sg.operators if codes[op.opcodeIndex] == "DEQUANTIZE" for i in op.inputs}
    read = {int(i) for op in sg.operators for i in op.inputs if i >= 0}
    for ti in sorted(read - dequantized):
        t = sg.tensors[ti]
        data = model.buffers[t.buffer].data if t.buffer and t.buffer < len(model.buffers) else None
        if t.type == 0 and data is not None and len(data):
            found.append((0, ti))
    return found


#: The largest magnitude float16 holds: a weight beyond it (a mask's -1e9) stays float32.
FLOAT16_MAX = 65504.0


def _storable(values: np.ndarray, kind: str, min_elements: int) -> bool:
    """Whether a float32 weight is stored at `kind`: big enough, finite, and within float16's range for it."""
    if values.size < min_elements or not np.all(np.isfinite(values)):
        return False
    return kind != "float16" or float(np.abs(values).max()) <= FLOAT16_MAX


def _stored(model, sg, t, values: np.ndarray, shape: list[int], kind: str) -> int:
    """A new constant holding `values` as float16, or as int8 (symmetric, one scale per row of the first axis)."""
    if kind == "float16":
        return _tensor(sg, f"{_name(t)}/float16", shape, 1, _buffer(model, values.astype(np.float16).tobytes()))
    rows = values.reshape(shape[0], -1) if len(shape) > 1 else values.reshape(1, -1)
    scale = np.maximum(np.abs(rows).max(axis=1), 1e-30) / 127.0
    q = np.clip(np.round(rows / scale[:, None]), -127, 127).astype(np.int8)
    quant = _quant(scale, np.zeros(len(scale), np.int64), 0)
    return _tensor(sg, f"{_name(t)}/int8", shape, 9, _buffer(model, q.tobytes()), quant)


def weights_behind_dequantize(
    content: bytes, kind: str, min_elements: int = 1024, left_float: bool = False
) -> tuple[bytes, int]:
    """Float32 weights of at least `min_elements` that no quantizer reaches (`_unreached`), or with `left_float`
    those the weight recipe left float32 in the main graph (`_left_float`), stored as `kind` ("float16", or
    "int8": symmetric, one scale per row of the first axis) behind a DEQUANTIZE in their own subgraph, which
    every reader then reads instead. The runtime dequantizes a constant once, at load. Weights that are not
    finite, or beyond float16's range for float16, stay as they are. Returns the model and how many tensors
    were stored so."""
    model = _load(content)
    codes = _codes(model)
    targets = _left_float(model, codes) if left_float else _unreached(model, codes)
    done = 0
    new_ops: dict[int, list] = {}
    for si, ti in targets:
        sg = model.subgraphs[si]
        t = sg.tensors[ti]
        values = np.frombuffer(bytes(np.asarray(model.buffers[t.buffer].data, np.uint8)), np.float32)
        if not _storable(values, kind, min_elements):
            continue
        shape = [int(d) for d in (t.shape if t.shape is not None else [values.size])]
        stored = _stored(model, sg, t, values, shape, kind)
        out = _tensor(sg, f"{_name(t)}/dequantized", shape, 0, 0, None, t.shapeSignature)
        for op in sg.operators:
            op.inputs = np.array([out if int(i) == ti else int(i) for i in op.inputs], np.int32)
        new_ops.setdefault(si, []).append(_op(model, "DEQUANTIZE", [stored], [out]))
        shared = sum(x.buffer == t.buffer for g in model.subgraphs for x in g.tensors) > 1
        if not shared:
            model.buffers[t.buffer].data = None  # the float32 original is read no more
        done += 1
    for si, ops in new_ops.items():
        model.subgraphs[si].operators = ops + list(model.subgraphs[si].operators)
    return (_save(model), done) if done else (content, 0)


# ------------------------------------------------------------------------------------------ negation
def _holds(content: bytes, *opcodes: str) -> bool:
    """Whether the main graph holds an op of one of `opcodes` (the validated structure, read in place: a pass that
    rewrites only those asks first, as unpacking a model costs 0.1-0.3 s on MobileNetV2 and most hold none)."""
    return any(op.opcode in opcodes for op in read_model(content).main.ops)


def negations_as_mul(content: bytes) -> tuple[bytes, int]:
    """Each float NEG of the main graph computed as MUL by a constant -1 instead (exact in float: the same
    bits). No int8 quantizer has an integer NEG (the converter's MLIR quantizer and LiteRT Quantizer both leave
    it float, between DEQUANTIZE and QUANTIZE: Keras 3's LayerNormalization holds one), while an int8 MUL by
    -1 (stored as -127 at scale 1/127) is exact too. Returns the model and how many NEGs were rewritten."""
    if not _holds(content, "NEG"):
        return content, 0
    s = _schema()
    model = _load(content)
    codes = _codes(model)
    sg = model.subgraphs[0]
    negs = [op for op in sg.operators if codes[op.opcodeIndex] == "NEG" and sg.tensors[int(op.inputs[0])].type == 0]
    if not negs:
        return content, 0
    minus_one = _tensor(sg, "optimize/minus_one", [], 0, _buffer(model, np.array(-1.0, np.float32).tobytes()))
    mul = _opcode(model, "MUL")
    for op in negs:
        op.opcodeIndex = mul
        op.inputs = np.array([int(op.inputs[0]), minus_one], np.int32)
        op.builtinOptionsType, op.builtinOptions = s.BuiltinOptions.MulOptions, s.MulOptionsT()
    return _save(model), len(negs)

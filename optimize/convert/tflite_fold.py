"""Constant subgraphs of a converted .tflite computed once, at conversion, and stored as constants.

litert-torch lowers what a module computes from its own buffers at run time: Hugging Face's ViT builds an
all-ones attention mask and broadcasts it (BROADCAST_TO, SELECT_V2 on constants), a detector its anchor grid.
The ONNX route folds the same values (`onnx_graph` evaluates every node whose inputs are constant), so the same
module converted from its `.pt2` kept ops its ONNX export did not: ops the GPU delegate refuses
(BROADCAST_TO) and XNNPACK does not take, which changed the delegate verdicts between routes. `fold` evaluates
every op whose inputs are all constant (once, in the runtime, on a zero input: none of them reads the input)
and stores the values its other ops read as constants: the outputs are the same bits. A constant operand of an
elementwise op with a lower rank than its reader's (a positional table [T, C] added to [1, T, C]: Whisper's
encoder through torch.export; torch.onnx writes it [1, T, C]) is given leading ones: the same broadcast, which
the GPU delegate otherwise refuses.

Never folded: control flow, variables, random ops, custom ops, QUANTIZE / DEQUANTIZE (a weight stored behind a
DEQUANTIZE is compression), and any op whose result would be bigger than MAX_BYTES (a BROADCAST_TO to a big
tensor is smaller as the op).
"""

from __future__ import annotations

import numpy as np

from optimize.core.errors import ModelError
from optimize.models.normalize import _load, _save, _schema

NEVER = frozenset(
    {
        "IF", "WHILE", "CALL_ONCE", "VAR_HANDLE", "READ_VARIABLE", "ASSIGN_VARIABLE", "RANDOM_STANDARD_NORMAL",
        "RANDOM_UNIFORM", "MULTINOMIAL", "CUSTOM", "QUANTIZE", "DEQUANTIZE", "STABLEHLO_COMPOSITE",
    }
)  # fmt: skip
MAX_BYTES = 1 << 20
_ITEM = {0: 4, 1: 2, 2: 4, 3: 1, 4: 8, 6: 1, 7: 2, 9: 1, 10: 8, 11: 8}  # schema TensorType -> bytes per element


def _codes(model) -> list[str]:
    s = _schema()
    by_code = {v: k for k, v in vars(s.BuiltinOperator).items() if not k.startswith("_")}
    return [by_code.get(max(c.builtinCode or 0, c.deprecatedBuiltinCode or 0), "?") for c in model.operatorCodes]


def _is_const(model, t) -> bool:
    buf = model.buffers[t.buffer] if t.buffer and t.buffer < len(model.buffers) else None
    return getattr(buf, "data", None) is not None and len(buf.data) > 0 and not t.isVariable


def _bytes(t) -> int:
    shape = [int(d) for d in t.shape] if t.shape is not None else []
    return int(np.prod(shape, dtype=np.int64)) * _ITEM.get(t.type, 8) if all(d >= 0 for d in shape) else MAX_BYTES + 1


def _foldable(model, sg, codes) -> list[int]:
    """Indices of the ops every input of which is a constant or what an earlier foldable op computes."""
    known = {i for i, t in enumerate(sg.tensors) if _is_const(model, t)}
    found = []
    for k, op in enumerate(sg.operators):
        ins = [int(i) for i in op.inputs if i >= 0]
        outs = [int(o) for o in op.outputs]
        if codes[op.opcodeIndex] in NEVER or not ins or not all(i in known for i in ins):
            continue
        if any(_bytes(sg.tensors[o]) > MAX_BYTES for o in outs):
            continue
        found.append(k)
        known.update(outs)
    return found


#: Elementwise ops whose constant operand of a lower rank broadcasts by leading ones (numpy's rule).
ELEMENTWISE = frozenset({"ADD", "SUB", "MUL", "DIV", "SQUARED_DIFFERENCE", "MAXIMUM", "MINIMUM"})


def _full_rank(model, sg, codes) -> int:
    """Constant operands of elementwise ops given their reader's rank (leading ones: the same values, the same
    broadcast): torch.export keeps a positional table [T, C] added to [1, T, C] (Whisper's encoder), which the GPU
    delegate refuses as broadcasting, where torch.onnx wrote it [1, T, C]. Only a constant one op reads."""
    readers: dict[int, int] = {}
    for op in sg.operators:
        for i in op.inputs:
            readers[int(i)] = readers.get(int(i), 0) + 1
    done = 0
    for op in sg.operators:
        ins = [int(i) for i in op.inputs]
        if codes[op.opcodeIndex] not in ELEMENTWISE or len(ins) != 2 or min(ins) < 0:
            continue
        for c, other in ((ins[0], ins[1]), (ins[1], ins[0])):
            t, o = sg.tensors[c], sg.tensors[other]
            rank, want = len(t.shape if t.shape is not None else []), len(o.shape if o.shape is not None else [])
            if _is_const(model, t) and readers.get(c) == 1 and 0 < rank < want <= 4:
                t.shape = np.array([1] * (want - rank) + [int(d) for d in t.shape], np.int32)
                t.shapeSignature = None
                done += 1
    return done


def fold(content: bytes) -> tuple[bytes, list[str]]:
    """The model with its constant subgraphs (in the main graph) stored as constants and constant operands of
    elementwise ops at their reader's rank, and what that did (conversion facts); the model as it was when it
    has none or the runtime cannot run it."""
    model = _load(content)
    codes, sg = _codes(model), model.subgraphs[0]
    ops = _foldable(model, sg, codes)
    if not ops:
        ranked = _full_rank(model, sg, codes)
        return (_save(model), _said(0, ranked)) if ranked else (content, [])
    dropped = {id(sg.operators[k]) for k in ops}
    made = {int(o) for k in ops for o in sg.operators[k].outputs}
    read = {int(i) for op in sg.operators if id(op) not in dropped for i in op.inputs if i >= 0}
    needed = sorted(made & (read | {int(o) for o in sg.outputs}))
    values = _values(content, needed)
    if values is None:
        return content, []
    for t, v in zip(needed, values):
        buf = _schema().BufferT()
        buf.data = np.frombuffer(np.ascontiguousarray(v).tobytes(), np.uint8)
        model.buffers.append(buf)
        sg.tensors[t].buffer = len(model.buffers) - 1
    sg.operators = [op for op in sg.operators if id(op) not in dropped]
    return _save(model), _said(len(ops), _full_rank(model, sg, codes))


def _said(folded: int, ranked: int) -> list[str]:
    return [f"{folded} op(s) on constants computed once and stored"] * bool(folded) + [
        f"{ranked} constant operand(s) of elementwise ops given their reader's rank (no broadcast)"
    ] * bool(ranked)


def _values(content: bytes, tensors: list[int]) -> list[np.ndarray] | None:
    """The tensors' values after one run on zeros (they depend on no input); None when the model cannot run."""
    from optimize.models import runtime

    try:
        loaded = runtime.load(content, threads=1, keep_tensors=True)
        it = loaded.interpreter
        for d in it.get_input_details():
            it.set_tensor(d["index"], np.zeros(d["shape"], d["dtype"]))
        it.invoke()
        return [np.array(it.get_tensor(t)) for t in tensors]
    except (ModelError, ValueError, RuntimeError):
        return None

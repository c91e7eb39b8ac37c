"""Structural checks on a parsed model, before any delegate rule looks at it.

A model the runtime refuses to load must not get a delegate verdict. These are the runtime's own load-time
checks (LiteRT f67457790c9c), each answered with one ModelError (exit 2):
- every tensor's buffer index is in range (core/interpreter_builder.cc:749-754);
- every tensor type is known (interpreter_builder.cc:735-738);
- shapes are non-negative and a tensor's byte size is one a device could hold (util.cc:243-258 refuses
  overflowing sizes; we stop at 1 TiB, far below the overflow and far above any edge model);
- a constant's buffer holds at least the bytes its shape needs (core/subgraph.cc:1955-1966);
- operator, graph input and output tensor indices are in range, -1 only for an operator's omitted
  inputs (core/subgraph.cc:916-937, 843-851, 1116-1120 accept -1 everywhere, but kernels write their
  outputs unchecked: an output of -1 is a crash);
- the data flow has no cycle (an op reading its own output included): otherwise some node never becomes
  ready and partitioning fails (graph_info.cc:124-127).

And what the runtime does not check, where a bad value reaches native code unchecked (a crash, not an
error), or where nothing downstream could work:
- quantization parameters as `InterpreterBuilder::ParseQuantization` requires them (as many zero points
  as scales, quantized_dimension inside the shape, one scale per channel of that dimension): the
  quantizers and the normaliser read them before any interpreter does;
- every SignatureDef has a key, inputs and outputs, runs a subgraph that exists, and maps names to that
  subgraph's own inputs and outputs: `InterpreterBuilder::ParseSignatureDefs` copies the subgraph index
  and tensor indices unchecked and the signature runner indexes with them;
- control-flow ops (IF, WHILE, CALL_ONCE, the StableHLO region ops) name subgraphs that exist, and no
  subgraph calls itself, directly or through others (preparing it would recurse without end);
- the first subgraph has outputs: a model that computes nothing cannot be measured or quantized.
"""

from __future__ import annotations

import math

import numpy as np

from optimize.core.errors import ModelError
from optimize.core.shown import named
from optimize.models import sparsity
from optimize.models.flatbuffer import Model, Op, Subgraph, Tensor

MAX_TENSOR_BYTES = 1 << 40  # 1 TiB
_ITEM_BYTES = {
    "float32": 4,
    "float16": 2,
    "int32": 4,
    "uint8": 1,
    "int64": 8,
    "bool": 1,
    "int16": 2,
    "complex64": 8,
    "int8": 1,
    "float64": 8,
    "complex128": 16,
    "uint64": 8,
    "uint32": 4,
    "uint16": 2,
    "bfloat16": 2,
}
_PACKED = {"int4": 2, "int2": 4}  # elements per byte
_UNSIZED = frozenset({"string", "resource", "variant"})
_FIX = "The file is corrupt or hand-edited: re-export the model."


def _fail(where: str, problem: str) -> ModelError:
    return ModelError(f"{where}: {problem}.", _FIX)


def tensor_bytes(t: Tensor) -> int | None:
    """Bytes the tensor's shape needs (None for strings, resources and variants)."""
    if t.dtype in _UNSIZED:
        return None
    n = math.prod(t.shape)
    if t.dtype in _PACKED:
        return -(-n // _PACKED[t.dtype])
    return n * _ITEM_BYTES[t.dtype]


def _check_tensor(t: Tensor, sg: int, n_buffers: int, where: str) -> None:
    at = f"tensor {t.index} ({named(t.name)}) of subgraph {sg}"
    if t.buffer and t.buffer >= n_buffers:
        raise _fail(where, f"{at} refers to buffer {t.buffer}, but the model has {n_buffers} buffers")
    if t.dtype.startswith("type"):
        raise _fail(where, f"{at} has an unknown tensor type ({t.dtype})")
    if any(d < 0 for d in t.shape):
        raise _fail(where, f"{at} has a negative dimension in its shape {list(t.shape)}")
    size = tensor_bytes(t)
    if size is not None and size > MAX_TENSOR_BYTES:
        raise _fail(
            where, f"{at} has shape {list(t.shape)}: {size:.3g} bytes, more than any device holds (limit 1 TiB)"
        )
    if size is not None and t.data is not None and not t.sparse and len(t.data) < size:
        raise _fail(where, f"{at} needs {size} bytes but its constant buffer holds {len(t.data)}")
    if t.sparse:
        _check_sparsity(t, at, where)
    if t.quant_table is not None:
        _check_quant(t, at, where)


def _check_sparsity(t: Tensor, at: str, where: str) -> None:
    """A sparse constant's layout walks inside its shape and its buffer holds every value it keeps
    (`models.sparsity`): the runtime's format converter trusts both."""

    def fail(problem: str) -> ModelError:
        return _fail(where, f"{at} {problem}")

    try:
        layout = sparsity.read(t.sparsity_table)
    except Exception as e:  # noqa: BLE001 - offsets outside the file: corrupt
        raise fail(f"has unreadable sparsity parameters ({e.__class__.__name__})") from None
    kept = sparsity.check(layout, t.shape, fail)
    needed = -(-kept // _PACKED[t.dtype]) if t.dtype in _PACKED else kept * _ITEM_BYTES.get(t.dtype, 1)
    if t.data is not None and len(t.data) < needed:  # no data at all: refused where an op reads it (_check_read)
        raise fail(f"keeps {kept} values, but its buffer holds {len(t.data)} bytes")


#: The integer types that hold quantized real values, and the zero points each can hold.
_ZERO_POINTS = {
    "int8": (-128, 127), "uint8": (0, 255), "int16": (-32768, 32767), "int4": (-8, 7), "int2": (-2, 1),
    "uint16": (0, 65535), "int32": (-(2**31), 2**31 - 1), "uint32": (0, 2**32 - 1),
}  # fmt: skip
#: Types whose kernels divide by a computed tensor's scale (requantizing, XNNPACK's checks): 0 is a crash there.
#: A constant may hold 0 (TensorFlow's int16x8 converter writes it for a channel whose weights are all zero:
#: every value dequantizes to 0); no scale may be negative or non-finite.
_SCALED = frozenset({"int8", "uint8", "int16", "int4", "int2", "uint16"})


def _check_quant(t: Tensor, at: str, where: str) -> None:
    """The affine quantization InterpreterBuilder::ParseQuantization accepts (blockwise is not checked there),
    and what the kernels then assume unchecked: scales finite, never negative, above 0 on what the runtime
    computes (a scale of 0, below 0, NaN or infinite on an int8 input crashed LiteRT while it allocated tensors),
    zero points inside their type, one scale per channel."""
    q = t.quant
    if q is None or q.blockwise:
        return
    if q.zp_count != q.count:
        raise _fail(where, f"{at} has {q.count} quantization scales but {q.zp_count} zero points")
    if q.count != 1 and not t.shape:
        raise _fail(where, f"{at} has {q.count} quantization scales but no dimension to hold them")
    if t.shape and not 0 <= q.dim < len(t.shape):
        raise _fail(where, f"{at} is quantized along dimension {q.dim} of a rank-{len(t.shape)} shape")
    if q.count != 1 and t.shape and q.count != t.shape[q.dim]:
        raise _fail(where, f"{at} has {q.count} scales for {t.shape[q.dim]} channels along dimension {q.dim}")
    if t.dtype in _ZERO_POINTS:
        _check_scales(t, q, at, where)


def _check_scales(t: Tensor, q, at: str, where: str) -> None:
    scales = q.scales
    computed = t.dtype in _SCALED and not t.is_const
    bad = ~np.isfinite(scales) | (scales <= 0 if computed else scales < 0)
    if bad.any():
        k = int(np.argmax(bad))
        channel = f" (channel {k})" if q.count > 1 else ""
        above = "above 0" if computed else "0 or above"
        raise _fail(
            where, f"{at} has a quantization scale of {float(scales[k])!r}{channel}: scales are finite, {above}"
        )
    low, high = _ZERO_POINTS[t.dtype]
    zps = q.zero_points
    out = (zps < low) | (zps > high)
    if out.any():
        k = int(np.argmax(out))
        raise _fail(where, f"{at} has the zero point {int(zps[k])}, outside {t.dtype}'s {low}..{high}")


def _check_indices(indices, n: int, what: str, where: str, optional: bool = False) -> None:
    """Tensor indices in range; -1 (an omitted tensor) only where `optional` (an operator's inputs): a
    kernel writes its outputs without checking, so an output of -1 crashes the interpreter (found by
    tests/test_fuzz.py)."""
    for i in indices:
        if (i != -1 or not optional) and not 0 <= i < n:
            raise _fail(where, f"{what} refers to tensor {i}, but the subgraph has {n} tensors")


#: Inputs a builtin kernel treats as optional (GetOptionalInputTensor), by position: only there may a model
#: omit one (-1). Elsewhere the kernel reads the tensor unchecked: an omitted FULLY_CONNECTED weight is a
#: crash (found by tests/test_fuzz.py). The recurrent ops take many optional inputs: any but the first.
OPTIONAL_INPUTS = {
    "FULLY_CONNECTED": {2},
    "CONV_2D": {2},
    "DEPTHWISE_CONV_2D": {2},
    "CONV_3D": {2},
    "TRANSPOSE_CONV": {3},
    "CONV_3D_TRANSPOSE": {3},
    "SVDF": {3},
}
_RECURRENT = frozenset({"LSTM", "UNIDIRECTIONAL_SEQUENCE_LSTM", "BIDIRECTIONAL_SEQUENCE_LSTM", "RNN",
                        "UNIDIRECTIONAL_SEQUENCE_RNN", "BIDIRECTIONAL_SEQUENCE_RNN"})  # fmt: skip


def _check_omitted(op: Op, what: str, where: str) -> None:
    """An omitted input (-1) only where the op's kernel takes it as optional (custom ops: their own say)."""
    if op.opcode == "CUSTOM" or op.opcode in _RECURRENT and -1 not in op.inputs[:1]:
        return
    allowed = OPTIONAL_INPUTS.get(op.opcode, set())
    missing = [i for i, t in enumerate(op.inputs) if t == -1 and i not in allowed]
    if missing:
        raise _fail(where, f"{what} omits its input {missing[0]}, which the {op.opcode} kernel requires")


def _check_ops(sg: Subgraph, where: str) -> None:
    n = len(sg.tensors)
    _check_indices(sg.inputs, n, f"subgraph {sg.index}'s input list", where)
    _check_indices(sg.outputs, n, f"subgraph {sg.index}'s output list", where)
    for op in sg.ops:
        what = f"operator {op.index} ({op.name}) of subgraph {sg.index}"
        _check_indices(op.inputs, n, what, where, optional=True)
        _check_indices(op.outputs, n, what, where)
        _check_omitted(op, what, where)
        _check_written(sg, op.outputs, f"{what} writes its output into", where)
        _check_read(sg, op.inputs, what, where)
    _check_written(sg, sg.inputs, f"subgraph {sg.index}'s input is", where)


def _check_read(sg: Subgraph, indices, what: str, where: str) -> None:
    """A sparse tensor an operator reads holds its compressed values (DENSIFY and the sparse kernels read them
    as a constant's; one left over by an edit, and read by nothing, is harmless)."""
    for i in indices:
        t = sg.tensors[i] if i >= 0 else None
        if t is not None and t.sparse and t.data is None:
            raise _fail(where, f"{what} reads tensor {i} ({named(t.name)}), sparse but with no constant data")


def _check_written(sg: Subgraph, indices, what: str, where: str) -> None:
    """Tensors the runtime writes (graph inputs, operator outputs) are not constants: their bytes are the
    model file's, read-only where the runtime maps it (an input backed by a constant buffer fails in
    `set_tensor`, or a kernel writes into the mapped file)."""
    for i in indices:
        t = sg.tensors[i] if i >= 0 else None
        if t is not None and t.is_const:
            raise _fail(where, f"{what} tensor {i} ({named(t.name)}), a constant backed by buffer {t.buffer}")


def _dependencies(sg: Subgraph) -> tuple[list[int], dict[int, set[int]]]:
    """Per op, how many distinct producer ops it waits for; per op, the ops reading its outputs."""
    producer = sg.producer
    waiting, readers = [], {}
    for op in sg.ops:
        deps = {producer[t] for t in op.inputs if t >= 0 and t in producer}
        waiting.append(len(deps))
        for d in deps:
            readers.setdefault(d, set()).add(op.index)
    return waiting, readers


def _check_acyclic(sg: Subgraph, where: str) -> None:
    """Kahn's algorithm over the ops: every op must become ready once its producers have run."""
    waiting, readers = _dependencies(sg)
    ready = [i for i, w in enumerate(waiting) if w == 0]
    while ready:
        for r in readers.get(ready.pop(), ()):
            waiting[r] -= 1
            if waiting[r] == 0:
                ready.append(r)
    stuck = next((i for i, w in enumerate(waiting) if w > 0), None)
    if stuck is not None:
        raise _fail(
            where, f"subgraph {sg.index} has a cycle: operator {stuck} ({sg.ops[stuck].name}) depends on itself"
        )


#: Ops whose builtin options name other subgraphs (every option field with "subgraph" in its name).
_CALLERS = frozenset({"IF", "WHILE", "CALL_ONCE", "CALL"})


def _callees(op: Op) -> list[int]:
    if op.opcode not in _CALLERS and not op.opcode.startswith("STABLEHLO_"):
        return []
    out: list[int] = []
    for key, value in op.options.items():
        if "subgraph" in key:
            out.extend(value if isinstance(value, tuple) else [value])
    return [int(v) for v in out if isinstance(v, int)]


def _check_calls(model: Model, where: str) -> None:
    """Control flow names subgraphs that exist, and no subgraph reaches itself through calls."""
    n = len(model.subgraphs)
    calls: dict[int, set[int]] = {}
    for sg in model.subgraphs:
        for op in sg.ops:
            for callee in _callees(op):
                if not 0 <= callee < n:
                    raise _fail(
                        where, f"operator {op.index} ({op.name}) of subgraph {sg.index} runs subgraph {callee}, "
                        f"but the model has {n} subgraphs"
                    )  # fmt: skip
                calls.setdefault(sg.index, set()).add(callee)
    state: dict[int, int] = {}  # 1: on the current path, 2: done
    for start in calls:
        stack = [(start, iter(sorted(calls.get(start, ()))))]
        state[start] = state.get(start) or 1
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                state[node] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                raise _fail(where, f"subgraph {nxt} calls itself (through control flow): it would never finish")
            elif state.get(nxt) is None:
                state[nxt] = 1
                stack.append((nxt, iter(sorted(calls.get(nxt, ())))))


def _check_maps(sig, name: str, sg: Subgraph, where: str) -> None:
    """A signature maps names to its subgraph's own inputs and outputs (nothing else is fed or read)."""
    for kind, maps, allowed in (("input", sig.inputs, sg.inputs), ("output", sig.outputs, sg.outputs)):
        for tname, index in maps:
            if index not in allowed:
                raise _fail(
                    where, f"{name}'s {kind} {tname!r} is tensor {index}, which is not one of subgraph "
                    f"{sg.index}'s {kind}s {list(allowed)}"
                )  # fmt: skip


def _check_signatures(model: Model, where: str) -> None:
    n = len(model.subgraphs)
    keys = [sig.key for sig in model.signatures]
    twice = next((k for k in keys if keys.count(k) > 1), None)
    if twice is not None:
        raise _fail(where, f"two signatures share the key {twice!r}: a runner could not tell them apart")
    for i, sig in enumerate(model.signatures):
        name = f"signature {i} ({sig.key!r})" if sig.key is not None else f"signature {i}"
        if sig.key is None or sig.inputs is None or sig.outputs is None:
            missing = "key" if sig.key is None else "inputs" if sig.inputs is None else "outputs"
            raise _fail(where, f"{name} has no {missing}")
        if not 0 <= sig.subgraph < n:
            raise _fail(where, f"{name} runs subgraph {sig.subgraph}, but the model has {n} subgraphs")
        _check_maps(sig, name, model.subgraphs[sig.subgraph], where)


def _check_outputs(sg: Subgraph, where: str) -> None:
    """The model's outputs are computed: an output backed by a constant buffer is the file's bytes, whatever
    the input (and, written by an operator, a kernel writing into the mapped file)."""
    for i in sg.outputs:
        t = sg.tensors[i]
        if t.is_const:
            raise _fail(where, f"output tensor {i} ({named(t.name)}) is a constant backed by buffer {t.buffer}")


def validate(model: Model, where: str) -> None:
    """Raise ModelError for the first structural problem that would make the runtime refuse the model, or
    reach native code unchecked."""
    for sg in model.subgraphs:
        for t in sg.tensors:
            _check_tensor(t, sg.index, model.n_buffers, where)
        _check_ops(sg, where)
        _check_acyclic(sg, where)
    if model.subgraphs and not model.main.outputs:
        raise _fail(where, "subgraph 0 has no outputs: the model computes nothing anyone can read")
    if model.subgraphs:
        _check_outputs(model.main, where)
    _check_calls(model, where)
    _check_signatures(model, where)

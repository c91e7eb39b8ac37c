"""Structural checks on a parsed model, before any delegate rule looks at it.

A model the runtime refuses to load must not get a delegate verdict. These are the runtime's own load-time
checks (LiteRT f67457790c9c), each answered with one ModelError (exit 2):
- every tensor's buffer index is in range (core/interpreter_builder.cc:749-754);
- every tensor type is known (interpreter_builder.cc:735-738);
- shapes are non-negative and a tensor's byte size is one a device could hold (util.cc:243-258 refuses
  overflowing sizes; we stop at 1 TiB, far below the overflow and far above any edge model);
- a constant's buffer holds at least the bytes its shape needs (core/subgraph.cc:1955-1966);
- operator, graph input and output tensor indices are in range, -1 only for omitted inputs
  (core/subgraph.cc:916-937, 843-851, 1116-1120);
- the data flow has no cycle (an op reading its own output included): otherwise some node never becomes
  ready and partitioning fails (graph_info.cc:124-127).
"""

from __future__ import annotations

import math

from ..errors import ModelError
from .flatbuffer import Model, Subgraph, Tensor

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
    at = f"tensor {t.index} ('{t.name}') of subgraph {sg}"
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


def _check_indices(indices, n: int, what: str, where: str) -> None:
    for i in indices:
        if i != -1 and not 0 <= i < n:
            raise _fail(where, f"{what} refers to tensor {i}, but the subgraph has {n} tensors")


def _check_ops(sg: Subgraph, where: str) -> None:
    n = len(sg.tensors)
    _check_indices(sg.inputs, n, f"subgraph {sg.index}'s input list", where)
    _check_indices(sg.outputs, n, f"subgraph {sg.index}'s output list", where)
    for op in sg.ops:
        what = f"operator {op.index} ({op.name}) of subgraph {sg.index}"
        _check_indices(op.inputs, n, what, where)
        _check_indices(op.outputs, n, what, where)


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


def validate(model: Model, where: str) -> None:
    """Raise ModelError for the first structural problem that would make the runtime refuse the model."""
    for sg in model.subgraphs:
        for t in sg.tensors:
            _check_tensor(t, sg.index, model.n_buffers, where)
        _check_ops(sg, where)
        _check_acyclic(sg, where)

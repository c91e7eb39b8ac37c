"""A sparse constant's sparsity parameters, read and checked against its shape and its buffer.

LiteRT stores a sparse constant compressed (TACO-style): `traversal_order` orders the tensor's dimensions and
its block dimensions, `block_map` says which dimension each block dimension splits, and one `dim_metadata`
per level is either DENSE (`dense_size` entries) or SPARSE_CSR (`array_segments`, one span per parent, and
`array_indices`, the positions kept). The runtime's format converter (DENSIFY, the sparse FULLY_CONNECTED
kernels) walks these vectors and writes into the dense tensor without checking them, so a crafted file
(traversal order `[0, 7, 9]`, segments `[0, 2147483647, -4]`) writes outside its memory, and the quantizers copy
it unchanged into what they write. `check` holds a file to what the converter assumes: the traversal order a
permutation (the tensor's dimensions first, then the block dimensions in order), each level as large as the
dimension it walks, segments that start at 0, never decrease and end at the number of indices, indices inside
their dimension, and a buffer holding every value the levels keep. Anything else is a ModelError naming the
tensor (the caller's `fail`).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from optimize.models.flatbuffer import _Table

DENSE, SPARSE_CSR = 0, 1
#: SparseIndexVector's union members: Int32Vector, Uint16Vector, Uint8Vector (schema.fbs), by type code.
_INDEX_DTYPES = {1: "<i4", 2: "<u2", 3: "u1"}
_I32 = struct.Struct("<i")
_U32 = struct.Struct("<I")


@dataclass(frozen=True)
class Level:
    """One level of the compressed layout (a DimensionMetadata table)."""

    format: int
    dense_size: int
    segments: np.ndarray | None
    indices: np.ndarray | None


@dataclass(frozen=True)
class Sparsity:
    traversal_order: tuple[int, ...]
    block_map: tuple[int, ...]
    levels: tuple[Level, ...]


def _index_vector(table: _Table, type_slot: int, slot: int) -> np.ndarray | None:
    """A SparseIndexVector union member's values (any of its three integer widths), or None when absent."""
    dtype = _INDEX_DTYPES.get(table.byte(type_slot))
    inner = table.table(slot)
    if dtype is None or inner is None:
        return None
    start, n = inner.vector(4)
    if not start:
        return None
    return np.frombuffer(table.buf, dtype, count=n, offset=start).astype(np.int64)


def read(table: tuple) -> Sparsity:
    """The SparsityParameters table whose offset is at (buffer, position): traversal_order 0, block_map 1,
    dim_metadata 2; DimensionMetadata: format 0, dense_size 1, array_segments 2-3, array_indices 4-5 (schema
    field ids). A table that points outside the file raises (struct.error, ValueError): the caller says it is
    corrupt."""
    buf, at = table
    t = _Table(buf, at + _U32.unpack_from(buf, at)[0])
    levels = tuple(
        Level(d.byte(4), d.scalar(6, _I32), _index_vector(d, 8, 10), _index_vector(d, 12, 14)) for d in t.tables(8)
    )
    return Sparsity(t.ints(4) or (), t.ints(6) or (), levels)


def _check_order(sp: Sparsity, rank: int, fail: Callable[[str], Exception]) -> None:
    """The traversal order is the tensor's dimensions (in any order), then its block dimensions in order; each
    block splits a different dimension, in increasing order."""
    n = rank + len(sp.block_map)
    if len(sp.traversal_order) != n or len(sp.levels) != n:
        raise fail(
            f"has {len(sp.traversal_order)} traversal dimensions and {len(sp.levels)} sparsity levels for a "
            f"rank-{rank} tensor with {len(sp.block_map)} block dimension(s) (both should be {n})"
        )
    order = list(sp.traversal_order)
    if sorted(order[:rank]) != list(range(rank)) or order[rank:] != list(range(rank, n)):
        raise fail(f"has the traversal order {order[:8]}, which is not an order of its {n} dimensions")
    blocks = list(sp.block_map)
    if any(not 0 <= b < rank for b in blocks) or blocks != sorted(set(blocks)):
        raise fail(f"has the block map {blocks[:8]}, which does not name its dimensions in increasing order")


def _level_sizes(sp: Sparsity, shape: tuple[int, ...], fail: Callable[[str], Exception]) -> list[int]:
    """How many positions each level walks: a dimension's size (divided by its block size when blocked), or
    a block dimension's block size."""
    rank = len(shape)
    block_sizes = [sp.levels[rank + b].dense_size for b, _ in enumerate(sp.block_map)]
    outer = list(shape)
    for b, dim in enumerate(sp.block_map):
        size = block_sizes[b]
        if sp.levels[rank + b].format != DENSE or size <= 0 or shape[dim] % size:
            raise fail(f"has a block of {size} along dimension {dim} of size {shape[dim]}")
        outer[dim] = shape[dim] // size
    return [outer[d] if d < rank else block_sizes[d - rank] for d in sp.traversal_order]


def _check_sparse_level(level: Level, i: int, parents: int, size: int, fail: Callable[[str], Exception]) -> int:
    """One SPARSE_CSR level: a span of indices per parent position; returns how many positions it keeps."""
    seg, idx = level.segments, level.indices
    if seg is None or idx is None:
        raise fail(f"has a sparse level {i} without its segments or indices")
    if len(seg) != parents + 1:
        raise fail(f"has {len(seg)} segments at level {i}, where {parents} parent positions need {parents + 1}")
    if seg[0] != 0 or np.any(np.diff(seg) < 0) or seg[-1] != len(idx):
        shown = [int(v) for v in seg[:4]]
        raise fail(f"has segments {shown}{'...' if len(seg) > 4 else ''} at level {i} that do not run from 0 "
                   f"to its {len(idx)} indices without decreasing")  # fmt: skip
    if len(idx) and (idx.min() < 0 or idx.max() >= size):
        raise fail(f"has an index outside 0..{size - 1} at level {i}")
    return len(idx)


def check(sp: Sparsity, shape: tuple[int, ...], fail: Callable[[str], Exception]) -> int:
    """How many values the layout keeps (what the buffer must hold); `fail(problem)` is raised unless it is a
    layout the runtime's format converter walks inside the tensor."""
    _check_order(sp, len(shape), fail)
    sizes = _level_sizes(sp, shape, fail)
    parents = 1
    for i, (level, size) in enumerate(zip(sp.levels, sizes, strict=True)):
        if level.format == DENSE:
            if level.dense_size != size:
                raise fail(f"has a dense level {i} of {level.dense_size}, where its dimension holds {size}")
            parents *= size
        elif level.format == SPARSE_CSR:
            parents = _check_sparse_level(level, i, parents, size, fail)
        else:
            raise fail(f"has level {i} in format {level.format} (neither dense nor sparse)")
    return parents

"""Which tensors preparing the graph makes dynamic, and which it computes at prepare time.

`core/subgraph.cc` ModifyGraphWithDelegateImpl (lines 2538-2552) prepares every op before a delegate
without kTfLiteDelegateFlagsAllowDynamicTensors is applied, and refuses the delegate when a tensor is
dynamic afterwards: PrepareOpsStartingAt (1549-1567) stops at the first op whose output is kTfLiteDynamic
or whose Prepare returns kTfLiteOutputShapeNotKnown.

A kernel makes its output dynamic when a shape-defining input is neither constant nor *persistent*
(IsConstantOrPersistentTensor, kernels/kernel_util.h:195). Some kernels compute their output during
Prepare and mark it kTfLitePersistentRo (SetTensorToPersistentRo) when their own inputs are constant or
persistent: SHAPE and RANK always, STRIDED_SLICE, CONCATENATION, GATHER, RESHAPE, MUL, TILE, RANGE,
BROADCAST_ARGS and REDUCE_PROD (small outputs) when their inputs are. So SHAPE -> STRIDED_SLICE -> RESHAPE,
common in models exported with a dynamic batch, is static. Each table entry cites its kernel file:line
at LiteRT f67457790c9c (docs/delegate-rules-audit.md lists them).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from optimize.models.flatbuffer import Op, Subgraph, Tensor

# Output shape depends on the *value* of these inputs (position): not constant or persistent -> dynamic.
SHAPE_INPUTS: dict[str, tuple[int, ...]] = {
    "RESIZE_BILINEAR": (1,),  # resize_bilinear.cc:84
    "RESIZE_NEAREST_NEIGHBOR": (1,),  # resize_nearest_neighbor.cc:80
    "FILL": (0,),  # fill.cc:104
    "RANGE": (0, 1, 2),  # range.cc:166-177
    "TILE": (1,),  # tile.cc:325-334
    "BROADCAST_TO": (1,),  # broadcast_to.cc:97-101
    "PAD": (1,),  # pad.cc:405-426 (also a rank-0 input, see _rank0_pad)
    "PADV2": (1,),  # pad.cc:405-426
    "MIRROR_PAD": (1,),  # mirror_pad.cc:393
    "EXPAND_DIMS": (1,),  # expand_dims.cc:92-98
    "SPLIT": (0,),  # split.cc:104
    "SPLIT_V": (1, 2),  # split_v.cc:175
    "TRANSPOSE": (1,),  # transpose.cc:84
    "MEAN": (1,),  # reduce.cc:440 (PrepareSimple)
    "SUM": (1,),
    "REDUCE_MAX": (1,),
    "REDUCE_MIN": (1,),
    "REDUCE_PROD": (1,),
    "REDUCE_ANY": (1,),
    "REDUCE_ALL": (1,),
    "ONE_HOT": (1,),  # one_hot.cc:161
    "SPACE_TO_BATCH_ND": (1, 2),  # space_to_batch_nd.cc:121
    "BATCH_TO_SPACE_ND": (1, 2),  # batch_to_space_nd.cc:120
    "ARG_MAX": (1,),  # arg_min_max.cc:136
    "ARG_MIN": (1,),
    "RANDOM_UNIFORM": (0,),  # random_ops.cc:188
    "RANDOM_STANDARD_NORMAL": (0,),
    "MULTINOMIAL": (0, 1),  # random_ops.cc:217
    "SEGMENT_SUM": (0, 1),  # segment_sum.cc:126
    "UNSORTED_SEGMENT_SUM": (1, 2),  # unsorted_segment.cc:138
    "UNSORTED_SEGMENT_MAX": (1, 2),
    "UNSORTED_SEGMENT_MIN": (1, 2),
    "UNSORTED_SEGMENT_PROD": (1, 2),
    "WHERE": (0,),  # where.cc:67
    "NON_MAX_SUPPRESSION_V4": (2,),  # non_max_suppression.cc:103 (max_output_size)
    "NON_MAX_SUPPRESSION_V5": (2,),
    "RFFT2D": (1,),  # rfft2d.cc:233
}

# Prepare can compute these outputs (SetTensorToPersistentRo) when the listed inputs are known; None: all.
PERSISTENT_WHEN: dict[str, tuple[int, ...] | None] = {
    "SHAPE": (),  # shape.cc:66, always
    "RANK": (),  # rank.cc:44, always
    "STRIDED_SLICE": (0, 1, 2),  # strided_slice.cc:335-338
    "CONCATENATION": None,  # concatenation.cc:159-166, 250-251
    "GATHER": (0, 1),  # gather.cc:139-142
    "RESHAPE": (0, 1),  # reshape.cc:136-139 (a 1-input RESHAPE needs only its input)
    "MUL": (0, 1),  # mul.cc:131-133
    "TILE": (0, 1),  # tile.cc:325-327
    "RANGE": (0, 1, 2),  # range.cc:166-169
    "BROADCAST_ARGS": (0, 1),  # broadcast_args.cc:65-67
    "REDUCE_PROD": (0, 1),  # reduce.cc:402-416, 559-561: and at most 8 output elements
}
_MAX_CONSTANT_REDUCE = 8  # reduce.cc:57 kMaxConstantOutputTensorSize


@dataclass(frozen=True)
class Dynamics:
    """What preparing one subgraph leaves: the first dynamic tensor (and its op), the persistent tensors."""

    first_dynamic: tuple[Tensor | None, Op] | None  # (its dynamic output, if it has one; the op)
    persistent: frozenset[int]


def _known(sg: Subgraph, persistent: set[int], op: Op, k: int) -> bool:
    """Input k is constant (kTfLiteMmapRo) or persistent; an absent input counts as known."""
    if k >= len(op.inputs) or op.inputs[k] < 0:
        return True
    i = op.inputs[k]
    return sg.tensors[i].is_const or i in persistent


def _unspecified(sg: Subgraph, op: Op, k: int) -> bool:
    """HasUnspecifiedDimension (kernel_util.cc:588): a -1 in the input's shape signature."""
    if k >= len(op.inputs) or op.inputs[k] < 0:
        return False
    sig = sg.tensors[op.inputs[k]].shape_signature
    return bool(sig) and -1 in sig


def _strided_slice(sg: Subgraph, persistent: set[int], op: Op) -> bool:
    """strided_slice.cc:327-333: dynamic unless strides are known and (offset or begin and end are known)."""
    known = _known(sg, persistent, op, 3)
    offset = bool(op.options.get("offset"))
    return not (known and (offset or (_known(sg, persistent, op, 1) and _known(sg, persistent, op, 2))))


def _slice(sg: Subgraph, persistent: set[int], op: Op) -> bool:
    """slice.cc:153-156: begin and size known, and an input without unspecified dimensions."""
    return not (_known(sg, persistent, op, 1) and _known(sg, persistent, op, 2)) or _unspecified(sg, op, 0)


def _topk(sg: Subgraph, persistent: set[int], op: Op) -> bool:
    """topk_v2.cc:275: k known and an input without unspecified dimensions."""
    return not _known(sg, persistent, op, 1) or _unspecified(sg, op, 0)


def _transpose_conv(sg: Subgraph, persistent: set[int], op: Op) -> bool:
    """transpose_conv.cc:401: the output shape must be a *constant* (persistent is not enough)."""
    return bool(op.inputs) and op.inputs[0] >= 0 and not sg.tensors[op.inputs[0]].is_const


def _reshape(sg: Subgraph, persistent: set[int], op: Op) -> bool:
    """reshape.cc:136-150: with a shape input that is not known, Prepare returns kTfLiteOutputShapeNotKnown."""
    return len(op.inputs) >= 2 and not _known(sg, persistent, op, 1)


def _read_variable(sg: Subgraph, persistent: set[int], op: Op) -> bool:
    """read_variable.cc:48-52: a scalar (rank-0) output is set dynamic."""
    return bool(op.outputs) and op.outputs[0] >= 0 and sg.tensors[op.outputs[0]].rank == 0


def _rank0_pad(sg: Subgraph, persistent: set[int], op: Op) -> bool:
    """pad.cc:426: an unranked (rank-0) input also defers the output size."""
    return bool(op.inputs) and op.inputs[0] >= 0 and sg.tensors[op.inputs[0]].rank == 0


def _always(sg: Subgraph, persistent: set[int], op: Op) -> bool:
    return True


_SPECIAL: dict[str, Callable[[Subgraph, set[int], Op], bool]] = {
    "STRIDED_SLICE": _strided_slice,  # strided_slice.cc:327-333
    "SLICE": _slice,
    "TOPK_V2": _topk,
    "TRANSPOSE_CONV": _transpose_conv,
    "RESHAPE": _reshape,
    "READ_VARIABLE": _read_variable,
    "PAD": _rank0_pad,
    "PADV2": _rank0_pad,
    "UNIQUE": _always,  # unique.cc:78
}


def makes_dynamic(sg: Subgraph, persistent: set[int], op: Op) -> bool:
    """Whether preparing `op` leaves a dynamic output (or an unknown output shape)."""
    special = _SPECIAL.get(op.opcode)
    if special is not None and special(sg, persistent, op):
        return True
    return any(not _known(sg, persistent, op, k) for k in SHAPE_INPUTS.get(op.opcode, ()))


def makes_persistent(sg: Subgraph, persistent: set[int], op: Op) -> bool:
    """Whether Prepare computes `op`'s output itself (kTfLitePersistentRo)."""
    inputs = PERSISTENT_WHEN.get(op.opcode, ())
    if op.opcode not in PERSISTENT_WHEN or not op.outputs or op.outputs[0] < 0:
        return False
    positions = range(len(op.inputs)) if inputs is None else inputs
    if not all(_known(sg, persistent, op, k) for k in positions):
        return False
    if op.opcode == "REDUCE_PROD":
        return sg.tensors[op.outputs[0]].numel <= _MAX_CONSTANT_REDUCE
    return True


def analyse(sg: Subgraph) -> Dynamics:
    """Prepare the subgraph in execution order, as PrepareOpsStartingAt does; stop at the first dynamic op."""
    persistent: set[int] = set()
    for op in sg.ops:
        if makes_dynamic(sg, persistent, op):
            tensor = sg.tensors[op.outputs[0]] if op.outputs and op.outputs[0] >= 0 else None
            return Dynamics((tensor, op), frozenset(persistent))
        if makes_persistent(sg, persistent, op):
            persistent.update(t for t in op.outputs if t >= 0)
    return Dynamics(None, frozenset(persistent))


def first_dynamic_tensor(sg: Subgraph) -> tuple[Tensor | None, Op] | None:
    """The first tensor that preparing the ops would make dynamic, with its producer, or None."""
    return analyse(sg).first_dynamic

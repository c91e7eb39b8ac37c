"""The runtime's graph machinery, in Python: node views, partitioning, partition selection, dynamic tensors.

Follows, as facts (no code copied):
- `tflite/graph_info.cc` PartitionGraphIntoIndependentNodeSubsets: greedy epochs in execution order, a
  chain of control edges between ops that might have side effects (resource/variant tensors, control flow).
- `tflite/delegates/utils.cc` GraphPartitionHelper::GetFirstNLargestPartitions: sort delegated partitions
  by size, keep up to N, stop at the first one smaller than the minimum; FP16GraphPartitionHelper for
  float16 weights behind DEQUANTIZE.
- `tflite/core/subgraph.cc` ModifyGraphWithDelegate: a delegate without kTfLiteDelegateFlagsAllowDynamicTensors
  is not applied when any tensor is dynamic after preparing the ops.
"""

from __future__ import annotations

from dataclasses import dataclass

from .flatbuffer import Op, Subgraph, Tensor

SOURCE = "tflite/graph_info.cc, tflite/delegates/utils.cc, tflite/core/subgraph.cc @ LiteRT f67457790c9c"

CONTROL_FLOW = frozenset({"WHILE", "IF", "CALL_ONCE"})


class NodeView:
    """One operator as a delegate's IsSupported sees it: tensors by position, constness, neighbours.

    `remap` points inputs at other tensors: FP16GraphPartitionHelper makes a consumer of a float16
    DEQUANTIZE read the float16 constant itself while it is being checked.
    """

    __slots__ = ("sg", "op", "remap", "_inputs")

    def __init__(self, sg: Subgraph, op: Op, remap: dict[int, int] | None = None):
        self.sg = sg
        self.op = op
        self.remap = remap or {}
        tensors = sg.tensors
        self._inputs = [None if i < 0 else tensors[self.remap.get(i, i)] for i in op.inputs]

    @property
    def name(self) -> str:
        return self.op.opcode

    @property
    def version(self) -> int:
        return self.op.version

    @property
    def opts(self) -> dict:
        return self.op.options

    @property
    def inputs(self) -> list[Tensor | None]:
        """All input slots; None for an omitted optional (-1) input."""
        return self._inputs

    @property
    def outputs(self) -> list[Tensor]:
        return [self.sg.tensors[i] for i in self.op.outputs if i >= 0]

    def input(self, i: int) -> Tensor | None:
        return self._inputs[i] if i < len(self._inputs) else None

    def output(self, i: int = 0) -> Tensor | None:
        outs = self.op.outputs
        return self.sg.tensors[outs[i]] if i < len(outs) and outs[i] >= 0 else None

    @property
    def runtime_inputs(self) -> list[Tensor]:
        """Inputs that are present and not constant (gpu_compatibility.cc's 'runtime inputs')."""
        return [t for t in self._inputs if t is not None and not t.is_const]

    @property
    def const_inputs(self) -> list[Tensor]:
        return [t for t in self._inputs if t is not None and t.is_const]

    def consumers(self, t: Tensor) -> list[Op]:
        return [self.sg.ops[i] for i in self.sg.consumers.get(t.index, [])]

    def producer(self, t: Tensor) -> Op | None:
        i = self.sg.producer.get(t.index)
        return None if i is None else self.sg.ops[i]

    def is_graph_output(self, t: Tensor) -> bool:
        return t.index in self.sg.outputs


def _side_effect(sg: Subgraph, op: Op) -> bool:
    """Subgraph::OpMightHaveSideEffect: resource/variant tensors, or control flow."""
    if op.opcode in CONTROL_FLOW:
        return True
    for i in op.inputs + op.outputs:
        if i >= 0 and sg.tensors[i].dtype in ("resource", "variant"):
            return True
    return False


@dataclass
class Partition:
    delegated: bool
    nodes: list[int]


def partition(sg: Subgraph, supported: set[int]) -> list[Partition]:
    """PartitionGraphIntoIndependentNodeSubsets, greedy mode: epochs of same-kind ready nodes.

    Each epoch takes the kind (delegated or not) of the first ready node in execution order, then keeps
    sweeping the execution order adding every ready node of that kind until nothing changes.
    """
    ops = sg.ops
    n = len(ops)
    producer = sg.producer
    consumers = sg.consumers
    # Inputs not yet available: tensors some node produces (graph inputs and constants are always ready).
    waiting = [len({t for t in op.inputs if t >= 0 and t in producer}) for op in ops]
    # Control edges: a chain between ops that might have side effects.
    next_ctrl: dict[int, int] = {}
    last = -1
    for i, op in enumerate(ops):
        if _side_effect(sg, op):
            if last >= 0:
                next_ctrl[last] = i
                waiting[i] += 1
            last = i
    done = [False] * n
    remaining = n
    result: list[Partition] = []
    while remaining:
        kind: bool | None = None
        nodes: list[int] = []
        progress = True
        while progress:
            progress = False
            for i in range(n):
                if done[i] or waiting[i]:
                    continue
                is_sup = i in supported
                if kind is None:
                    kind = is_sup
                if is_sup != kind:
                    continue
                done[i] = True
                remaining -= 1
                nodes.append(i)
                progress = True
                for t in ops[i].outputs:
                    if t >= 0:
                        for c in set(consumers.get(t, ())):
                            waiting[c] -= 1
                if i in next_ctrl:
                    waiting[next_ctrl[i]] -= 1
        if not nodes:  # unreachable for a well-formed graph; guards against cycles
            break
        result.append(Partition(bool(kind), nodes))
    return result


def largest(parts: list[Partition], max_partitions: int | None, min_nodes: int) -> list[Partition]:
    """GetFirstNLargestPartitions: biggest first, at most N, stop at the first one below min_nodes.

    The runtime's std::sort is not stable; ties are broken here by execution order (first wins).
    """
    delegated = sorted((p for p in parts if p.delegated), key=lambda p: -len(p.nodes))
    limit = len(delegated) if max_partitions is None or max_partitions <= 0 else max_partitions
    out = []
    for p in delegated[:limit]:
        if len(p.nodes) < min_nodes:
            break
        out.append(p)
    return out


# Output shape depends on the *value* of these inputs (index); a non-constant one makes the output dynamic.
_SHAPE_INPUTS: dict[str, tuple[int, ...]] = {
    "RESHAPE": (1,),
    "RESIZE_BILINEAR": (1,),
    "RESIZE_NEAREST_NEIGHBOR": (1,),
    "FILL": (0,),
    "RANGE": (0, 1, 2),
    "TILE": (1,),
    "BROADCAST_TO": (1,),
    "PAD": (1,),
    "PADV2": (1,),
    "MIRROR_PAD": (1,),
    "TOPK_V2": (1,),
    "SLICE": (1, 2),
    "STRIDED_SLICE": (1, 2, 3),
    "EXPAND_DIMS": (1,),
    "SPLIT": (0,),
    "SPLIT_V": (1, 2),
    "TRANSPOSE": (1,),
    "MEAN": (1,),
    "SUM": (1,),
    "REDUCE_MAX": (1,),
    "REDUCE_MIN": (1,),
    "REDUCE_PROD": (1,),
    "REDUCE_ANY": (1,),
    "REDUCE_ALL": (1,),
    "ONE_HOT": (1,),
    "SPACE_TO_BATCH_ND": (1, 2),
    "BATCH_TO_SPACE_ND": (1, 2),
    "ARG_MAX": (1,),
    "ARG_MIN": (1,),
    "TRANSPOSE_CONV": (0,),
    "GATHER": (),
    "ZEROS_LIKE": (),
    "BROADCAST_ARGS": (0, 1),
    "RANDOM_UNIFORM": (0,),
    "RANDOM_STANDARD_NORMAL": (0,),
    "MULTINOMIAL": (1,),
    "SEGMENT_SUM": (1,),
    "UNSORTED_SEGMENT_SUM": (2,),
    "UNSORTED_SEGMENT_MAX": (2,),
    "UNSORTED_SEGMENT_MIN": (2,),
    "UNSORTED_SEGMENT_PROD": (2,),
}
# Output shape depends on the data itself: always dynamic.
_ALWAYS_DYNAMIC = frozenset({"WHERE", "UNIQUE", "NON_MAX_SUPPRESSION_V4", "NON_MAX_SUPPRESSION_V5"})


def first_dynamic_tensor(sg: Subgraph) -> tuple[Tensor, Op] | None:
    """The first tensor that preparing the ops would make dynamic, with its producer, or None.

    A shape-defining input counts as known when it is constant, or the output of SHAPE on a tensor whose
    shape is itself known (the runtime keeps such outputs as persistent, prepare-time values).
    """
    known: set[int] = set()
    for op in sg.ops:
        name = op.opcode
        dynamic = name in _ALWAYS_DYNAMIC
        if not dynamic:
            for k in _SHAPE_INPUTS.get(name, ()):
                if k < len(op.inputs) and op.inputs[k] >= 0:
                    t = sg.tensors[op.inputs[k]]
                    if not t.is_const and t.index not in known:
                        dynamic = True
                        break
        if dynamic and op.outputs:
            return sg.tensors[op.outputs[0]], op
        if name == "SHAPE" and op.outputs:
            known.add(op.outputs[0])
    return None

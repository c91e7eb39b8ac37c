"""The runtime's graph machinery, in Python: node views, partitioning, partition selection, dynamic tensors.

Follows, as facts (no code copied):
- `tflite/graph_info.cc` PartitionGraphIntoIndependentNodeSubsets: greedy epochs in execution order, a
  chain of control edges between ops that might have side effects (resource tensors, control flow:
  `core/subgraph.cc` OpMightHaveSideEffect).
- `tflite/delegates/utils.cc` GraphPartitionHelper::GetFirstNLargestPartitions: sort delegated partitions
  by size, keep up to N, stop at the first one smaller than the minimum; FP16GraphPartitionHelper for
  float16 weights behind DEQUANTIZE.

The dynamic-tensor veto (`core/subgraph.cc` ModifyGraphWithDelegate) lives in `dynamic.py`.
"""

from __future__ import annotations

from dataclasses import dataclass

from optimize.models.flatbuffer import Op, Subgraph, Tensor

SOURCE = "tflite/graph_info.cc, tflite/delegates/utils.cc, tflite/core/subgraph.cc @ LiteRT f67457790c9c"

CONTROL_FLOW = frozenset({"WHILE", "IF", "CALL_ONCE"})


class NodeView:
    """One operator as a delegate's IsSupported sees it: tensors by position, constness, neighbours.

    `remap` points inputs at other tensors: FP16GraphPartitionHelper makes a consumer of a float16
    DEQUANTIZE read the float16 constant itself while it is being checked. The views are built once per
    model and shared by every delegate, so what each rule asks is computed here once.
    """

    __slots__ = ("sg", "op", "name", "version", "persistent", "inputs", "outputs", "runtime_inputs", "const_inputs")

    def __init__(
        self, sg: Subgraph, op: Op, remap: dict[int, int] | None = None, persistent: frozenset[int] = frozenset()
    ):
        tensors = sg.tensors
        remap = remap or {}
        self.sg = sg
        self.op = op
        self.name = op.opcode
        self.version = op.version
        self.persistent = persistent  # tensors computed at prepare time (kTfLitePersistentRo), not arena tensors
        #: All input slots; None for an omitted optional (-1) input.
        self.inputs: list[Tensor | None] = [None if i < 0 else tensors[remap.get(i, i)] for i in op.inputs]
        self.outputs: list[Tensor] = [tensors[i] for i in op.outputs if i >= 0]
        #: Inputs that are present and not constant (gpu_compatibility.cc's 'runtime inputs').
        self.runtime_inputs = [t for t in self.inputs if t is not None and not t.is_const]
        self.const_inputs = [t for t in self.inputs if t is not None and t.is_const]

    @property
    def opts(self) -> dict:
        return self.op.options

    def input(self, i: int) -> Tensor | None:
        inputs = self.inputs
        return inputs[i] if i < len(inputs) else None

    def output(self, i: int = 0) -> Tensor | None:
        outs = self.op.outputs
        return self.sg.tensors[outs[i]] if i < len(outs) and outs[i] >= 0 else None

    def consumers(self, t: Tensor) -> list[Op]:
        return [self.sg.ops[i] for i in self.sg.consumers.get(t.index, [])]

    def producer(self, t: Tensor) -> Op | None:
        i = self.sg.producer.get(t.index)
        return None if i is None else self.sg.ops[i]

    def is_graph_output(self, t: Tensor) -> bool:
        return t.index in self.sg.outputs


def _side_effect(sg: Subgraph, op: Op) -> bool:
    """Subgraph::OpMightHaveSideEffect: a resource tensor among its inputs or outputs, or control flow.
    (Variant tensors do not count.)"""
    if op.opcode in CONTROL_FLOW:
        return True
    tensors = sg.tensors
    return any(i >= 0 and tensors[i].dtype == "resource" for i in op.inputs + op.outputs)


@dataclass
class Partition:
    delegated: bool
    nodes: list[int]


def control_edges(sg: Subgraph) -> dict[int, int]:
    """graph_info.cc:318-327: a chain between ops that might have side effects, each waiting for the previous."""
    edges: dict[int, int] = {}
    last = -1
    for i, op in enumerate(sg.ops):
        if _side_effect(sg, op):
            if last >= 0:
                edges[last] = i
            last = i
    return edges


class _Epochs:
    """The state of PartitionGraphIntoIndependentNodeSubsets: which nodes wait for how many inputs/edges."""

    def __init__(self, sg: Subgraph, supported: set[int], edges: dict[int, int]):
        ops = sg.ops
        producer = sg.producer
        self.ops, self.consumers, self.supported = ops, sg.consumers, supported
        # Inputs not yet available: tensors some node produces (graph inputs and constants are always ready).
        self.waiting = [len({t for t in op.inputs if t >= 0 and t in producer}) for op in ops]
        for later in edges.values():
            self.waiting[later] += 1
        self.next_ctrl = edges
        self.done = [False] * len(ops)
        self.remaining = len(ops)

    def _schedule(self, i: int) -> None:
        self.done[i] = True
        self.remaining -= 1
        for t in self.ops[i].outputs:
            if t >= 0:
                for c in set(self.consumers.get(t, ())):
                    self.waiting[c] -= 1
        if i in self.next_ctrl:
            self.waiting[self.next_ctrl[i]] -= 1

    def _sweep(self, kind: bool | None, nodes: list[int]) -> bool | None:
        """One pass over the execution order; returns the epoch's kind (set by its first ready node)."""
        for i in range(len(self.ops)):
            if self.done[i] or self.waiting[i]:
                continue
            is_sup = i in self.supported
            if kind is None:
                kind = is_sup
            if is_sup == kind:
                self._schedule(i)
                nodes.append(i)
        return kind

    def epoch(self) -> Partition | None:
        """The next epoch: the kind of the first ready node, then every ready node of that kind."""
        kind: bool | None = None
        nodes: list[int] = []
        while True:
            before = len(nodes)
            kind = self._sweep(kind, nodes)
            if len(nodes) == before:
                break
        return Partition(bool(kind), nodes) if nodes else None


def partition(sg: Subgraph, supported: set[int], edges: dict[int, int] | None = None) -> list[Partition]:
    """PartitionGraphIntoIndependentNodeSubsets, greedy mode: epochs of same-kind ready nodes.

    Each epoch takes the kind (delegated or not) of the first ready node in execution order, then keeps
    sweeping the execution order adding every ready node of that kind until nothing changes. When every
    node is of one kind, that is one epoch with every node (`edges`: `control_edges(sg)`, if known).
    """
    n = len(sg.ops)
    if not supported or len(supported) == n:
        return [Partition(bool(supported), list(range(n)))] if n else []
    state = _Epochs(sg, supported, control_edges(sg) if edges is None else edges)
    result: list[Partition] = []
    while state.remaining:
        part = state.epoch()
        if part is None:  # unreachable for a validated graph (flatbuffer.validate refuses cycles)
            break
        result.append(part)
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

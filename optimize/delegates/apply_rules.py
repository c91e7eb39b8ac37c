"""Run one delegate's rules over a whole model the way the runtime would, and build its DelegateReport.

Per subgraph (validation subgraphs skipped): the per-node decision (with the FP16 helper's float16
DEQUANTIZE folding where the delegate uses it), the dynamic-tensor veto, partitioning, selection of the
largest partitions, then the second stage: the delegate building its graph from the chosen partitions,
where the first node that fails fails the whole delegation (`BUILD_FAILURE`: the report names that node,
and says how many nodes the delegate would otherwise have taken). `run_rules` calls the `DelegateRules`
protocol only; facts every delegate needs (dynamic tensors, the model's scheme) are computed once per
model in `ModelFacts` and shared.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from optimize.core.results import DelegateReport, NodeVerdict
from optimize.core.vocab import Scheme
from optimize.delegates.dynamic import Dynamics, analyse
from optimize.delegates.graph import NodeView, Partition, control_edges, largest, partition
from optimize.delegates.rules import Boundary, DelegateRules, Finding, Policy, Reason, Verdict, reject
from optimize.delegates.target import TargetParams
from optimize.models.flatbuffer import Model, Subgraph

FP16_DEQUANT = "float16 weights DEQUANTIZE: folded into its consumers only when the whole graph is delegated."


@dataclass
class _Views:
    """One subgraph's nodes as a delegate sees them: with or without the FP16 helper's remapping."""

    nodes: list[NodeView | None]  # None: a float16 DEQUANTIZE the helper folds
    fp16_deq: set[int]
    remap: dict[int, int]


class ModelFacts:
    """What every delegate's run reads from one parsed model, computed once and shared: dynamic and
    persistent tensors, the node views (with and without FP16 remapping), control edges, the scheme."""

    def __init__(self, model: Model):
        self.model = model
        self._dynamics: dict[int, Dynamics] = {}
        self._views: dict[tuple[int, bool], _Views] = {}
        self._edges: dict[int, dict[int, int]] = {}

    def views(self, sg: Subgraph, fp16_helper: bool) -> _Views:
        key = (sg.index, fp16_helper)
        if key not in self._views:
            other = self._views.get((sg.index, not fp16_helper))
            if other is not None and not other.fp16_deq and not _has_fp16_dequantize(sg):
                self._views[key] = other  # no float16 DEQUANTIZE: the helper changes nothing
            else:
                self._views[key] = _node_views(sg, fp16_helper, self.dynamics(sg).persistent)
        return self._views[key]

    def edges(self, sg: Subgraph) -> dict[int, int]:
        if sg.index not in self._edges:
            self._edges[sg.index] = control_edges(sg)
        return self._edges[sg.index]

    @cached_property
    def subgraphs(self) -> list[Subgraph]:
        """The subgraphs a delegate is applied to (validation subgraphs are skipped)."""
        return [sg for sg in self.model.subgraphs if not sg.name.startswith("VALIDATION:")]

    def dynamics(self, sg: Subgraph) -> Dynamics:
        if sg.index not in self._dynamics:
            self._dynamics[sg.index] = analyse(sg)
        return self._dynamics[sg.index]

    @cached_property
    def scheme(self) -> Scheme:
        """Which numeric scheme the model looks like: hints key on it."""
        sg = self.model.main
        runtime = {t.dtype for t in sg.tensors if not t.is_const}
        if "int16" in runtime:
            return Scheme.INT16X8
        if runtime & {"int8", "uint8"}:
            return Scheme.INT8
        deq = {sg.tensors[op.inputs[0]].dtype for op in sg.ops if op.opcode == "DEQUANTIZE" and op.inputs}
        if "float16" in deq:
            return Scheme.FLOAT16
        if any(t.is_const and t.dtype in ("int8", "uint8") for t in sg.tensors):
            return Scheme.DYNAMIC
        return Scheme.FLOAT32


def scheme_of(model: Model) -> Scheme:
    return ModelFacts(model).scheme


def verdict(delegated: int, total: int) -> str:
    if total and delegated == total:
        return "full"
    return "partial" if delegated else "none"


@dataclass
class _Run:
    """What a delegate's pass over the model accumulates."""

    findings: dict[tuple[int, int], Finding] = field(default_factory=dict)
    total: int = 0
    delegated: int = 0
    partitions: int = 0
    veto: Verdict | None = None
    build_error: Finding | None = None

    def note(self, sg: Subgraph, i: int, v: Verdict) -> None:
        op = sg.ops[i]
        self.findings[(sg.index, i)] = Finding(sg.index, i, op.name, op.version, v)


def _fp16_dequantize(sg: Subgraph, op) -> int | None:
    """The float16 constant a DEQUANTIZE expands (FP16GraphPartitionHelper::IsNodeSupported), or None."""
    if op.opcode != "DEQUANTIZE" or not op.inputs or op.inputs[0] < 0 or not op.outputs:
        return None
    x = sg.tensors[op.inputs[0]]
    return x.index if x.dtype == "float16" and x.is_const else None


def _has_fp16_dequantize(sg: Subgraph) -> bool:
    return any(_fp16_dequantize(sg, op) is not None for op in sg.ops)


def _node_views(sg: Subgraph, fp16_helper: bool, persistent: frozenset[int]) -> _Views:
    """With the FP16 helper, a node reads the float16 constants of the DEQUANTIZEs before it directly."""
    v = _Views([], set(), {})
    for op in sg.ops:
        src = _fp16_dequantize(sg, op) if fp16_helper else None
        if src is not None:
            v.remap[op.outputs[0]] = src
            v.fp16_deq.add(op.index)
            v.nodes.append(None)
        else:
            v.nodes.append(NodeView(sg, op, v.remap, persistent))
    return v


def _decide(views: _Views, rules: DelegateRules, target: TargetParams) -> dict[int, Verdict]:
    """The rejected nodes and their verdicts."""
    rejected: dict[int, Verdict] = {}
    for i, node in enumerate(views.nodes):
        if node is not None:
            v = rules.check(node, target)
            if v is not None:
                rejected[i] = v
    return rejected


def _dropped(size: int, pol: Policy) -> Verdict:
    if size < pol.min_nodes:
        return reject(
            Reason.PARTITION_SIZE,
            f"Supported, but its partition of {size} node(s) is below min_nodes_per_partition={pol.min_nodes}.",
            limit=pol.min_nodes,
        )
    return reject(
        Reason.PARTITION_LIMIT,
        f"Supported, but its partition of {size} node(s) is not among the {pol.max_partitions} largest "
        f"the delegate keeps (max_delegated_partitions={pol.max_partitions}).",
        limit=pol.max_partitions,
    )


def _choose(sg: Subgraph, views: _Views, rejected: dict[int, Verdict], pol: Policy, run: _Run, edges) -> set[int]:
    """The nodes the delegate replaces: FP16 scenario 1 (everything) or the largest partitions."""
    n = len(sg.ops)
    supported = {i for i in range(n) if i not in rejected and i not in views.fp16_deq}
    if views.fp16_deq and len(supported) + len(views.fp16_deq) == n:
        return set(range(n))  # FP16 helper, scenario 1: full delegation, DEQUANTIZE nodes included
    candidates: list[Partition] = partition(sg, supported, edges)
    chosen = {i for p in largest(candidates, pol.max_partitions, pol.min_nodes) for i in p.nodes}
    for i in views.fp16_deq:
        run.note(sg, i, reject(Reason.FP16_DEQUANT, FP16_DEQUANT))
    for p in candidates:
        if p.delegated and not chosen.issuperset(p.nodes):
            why = _dropped(len(p.nodes), pol)
            for i in p.nodes:
                run.note(sg, i, why)
    return chosen


def boundary(sg: Subgraph, nodes: list[int]) -> Boundary:
    """What one partition's delegate kernel reads from outside and hands back (computed when a rule asks)."""
    return Boundary(sg, nodes)


def _build_failure(
    sg: Subgraph, views: _Views, parts: list[Partition], rules: DelegateRules, target: TargetParams
) -> Finding | None:
    """The second stage: each delegated partition is built node by node, in order; the first failure wins."""
    for p in parts:
        b = boundary(sg, p.nodes)
        for i in p.nodes:
            node = views.nodes[i]
            if node is None:
                continue
            v = rules.build_failure(node, target, b)
            if v is not None:
                return Finding(sg.index, i, node.op.name, node.version, v)
    return None


def _dynamic_veto(sg: Subgraph, dyn: Dynamics) -> Verdict:
    t, op = dyn.first_dynamic
    what = f"tensor#{t.index} '{t.name}' from {op.name}" if t is not None else f"the output of {op.name}"
    return reject(
        Reason.DYNAMIC_TENSOR,
        "Attempting to use a delegate that only supports static-sized tensors with a graph that has "
        f"dynamic-sized tensors ({what}, subgraph {sg.index}).",
    )


def _subgraph(facts: ModelFacts, sg: Subgraph, rules: DelegateRules, target: TargetParams, pol: Policy, run: _Run):
    dyn = facts.dynamics(sg)
    views = facts.views(sg, pol.fp16_helper)
    run.total += len(sg.ops)
    # Per-node decision (recorded even when vetoed: it tells the user what would still be missing).
    rejected = _decide(views, rules, target)
    for i, v in rejected.items():
        run.note(sg, i, v)
    if run.veto is not None:
        return
    if not pol.allows_dynamic and dyn.first_dynamic is not None:
        run.veto = _dynamic_veto(sg, dyn)  # the interpreter stops applying the delegate here
        return
    edges = facts.edges(sg)
    chosen = _choose(sg, views, rejected, pol, run, edges)
    parts = [p for p in partition(sg, chosen, edges) if p.delegated] if chosen else []
    if run.build_error is None:
        run.build_error = _build_failure(sg, views, parts, rules, target)
    run.delegated += len(chosen)
    run.partitions += len(parts)


def _build_veto(run: _Run) -> Verdict:
    """The whole-delegation effect of one build failure, and the failing node's own verdict (noted on it)."""
    f = run.build_error
    where = f"#{f.subgraph}:{f.index}" if f.subgraph else f"#{f.index}"
    culprit = f"{where} {f.op} v{f.version}"
    run.findings[(f.subgraph, f.index)] = f._replace(
        verdict=reject(
            Reason.BUILD_FAILURE,
            f"Accepted node by node, but fails the delegate's build ({f.verdict.text}): the whole delegation "
            "fails with it.",
            detail=f.verdict.detail or f.verdict.code.value,
        )
    )
    return reject(
        Reason.BUILD_FAILURE,
        f"The delegate would take {run.delegated} of {run.total} nodes, but fails while building its graph at "
        f"{culprit} ({f.verdict.text}); the runtime then restores the original CPU plan: every node runs on "
        "the CPU.",
        limit=run.delegated,
        detail=culprit,
    )


def _veto_text(run: _Run) -> Verdict | None:
    if run.veto is not None:
        return run.veto
    if run.build_error is not None:
        return _build_veto(run)
    return None


def _hints(rules: DelegateRules, run: _Run, target: TargetParams, scheme: Scheme, veto: Verdict | None) -> list[str]:
    found = [run.findings[k] for k in sorted(run.findings)]
    hints = list(rules.hints(found, target, scheme))
    if veto is not None and veto.code is Reason.DYNAMIC_TENSOR:
        hints.append(
            f"{rules.name}: the model has a dynamic tensor; give shape-defining inputs (RESHAPE shape, "
            "RESIZE size, ...) constant values or fix the input shape before converting."
        )
    return hints


def latent_build_failures(model: Model | ModelFacts, rules: DelegateRules, target: TargetParams) -> list[Finding]:
    """The nodes whose build would fail were the delegate given every node it accepts in one partition: what
    a partial delegation hides (only the partitions it keeps are built). The graph's fitting reads them, so a
    rewrite that removes a refused node and shows the build failure behind it counts as a step forward."""
    facts = model if isinstance(model, ModelFacts) else ModelFacts(model)
    pol = rules.policy(target)
    out = []
    for sg in facts.subgraphs:
        views = facts.views(sg, pol.fp16_helper)
        rejected = _decide(views, rules, target)
        whole = Boundary(sg, range(len(sg.ops)))
        for i, node in enumerate(views.nodes):
            v = rules.build_failure(node, target, whole) if node is not None and i not in rejected else None
            if v is not None:
                out.append(Finding(sg.index, i, node.op.name, node.version, v))
    return out


def run_rules(model: Model | ModelFacts, rules: DelegateRules, target: TargetParams) -> DelegateReport:
    """The DelegateReport of one delegate's rules on one model (`ModelFacts` shares work across delegates)."""
    facts = model if isinstance(model, ModelFacts) else ModelFacts(model)
    pol = rules.policy(target)
    run = _Run(veto=rules.veto(facts.model, target))
    for sg in facts.subgraphs:
        _subgraph(facts, sg, rules, target, pol, run)
    veto = _veto_text(run)
    delegated, parts = (0, 0) if veto else (run.delegated, run.partitions)
    cpu = [
        NodeVerdict(
            subgraph=f.subgraph,
            index=f.index,
            op=f.op,
            version=f.version,
            reason=f.verdict.text,
            code=f.verdict.code.value,
        )
        for _, f in sorted(run.findings.items())
    ]
    return DelegateReport(
        delegate=rules.name,
        source="rules",
        rules_version=rules.source,
        params=pol.params,
        nodes_total=run.total,
        nodes_delegated=delegated,
        partitions=parts,
        verdict=verdict(delegated, run.total),
        cpu_nodes=cpu,
        hints=_hints(rules, run, target, facts.scheme, veto),
        vetoed=veto.text if veto else None,
        veto_code=veto.code.value if veto else None,
        nodes_accepted=run.delegated if veto is not None and veto.code is Reason.BUILD_FAILURE else None,
    )

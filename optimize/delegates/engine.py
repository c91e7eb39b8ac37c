"""Run one delegate's rules over a whole model the way the runtime would, and build its DelegateReport.

Per subgraph (validation subgraphs skipped): the dynamic-tensor veto, the per-node decision (with the
FP16 helper's float16 DEQUANTIZE folding where the delegate uses it), partitioning, selection of the
largest partitions, re-partitioning of the chosen nodes, then build-time all-or-nothing failures.
"""

from __future__ import annotations

from types import ModuleType

from ..results import DelegateReport, NodeVerdict
from .flatbuffer import Model
from .graph import NodeView, first_dynamic_tensor, largest, partition
from .target import TargetParams

FP16_DEQUANT = "float16 weights DEQUANTIZE: folded into its consumers only when the whole graph is delegated."


def scheme_of(model: Model) -> str:
    """Which numeric scheme the model looks like (float32, float16, dynamic, int8, int16x8): hints key on it."""
    sg = model.main
    runtime = {t.dtype for t in sg.tensors if not t.is_const}
    if "int16" in runtime:
        return "int16x8"
    if runtime & {"int8", "uint8"}:
        return "int8"
    deq_inputs = {sg.tensors[op.inputs[0]].dtype for op in sg.ops if op.opcode == "DEQUANTIZE" and op.inputs}
    if "float16" in deq_inputs:
        return "float16"
    if any(t.is_const and t.dtype in ("int8", "uint8") for t in sg.tensors):
        return "dynamic"
    return "float32"


def verdict(delegated: int, total: int) -> str:
    if total and delegated == total:
        return "full"
    return "partial" if delegated else "none"


def run_rules(model: Model, rules: ModuleType, target: TargetParams) -> DelegateReport:
    pol = rules.policy(target)
    reasons: dict[tuple[int, int], tuple[str, int, str]] = {}
    vetoed: str | None = getattr(rules, "veto", lambda m, t: None)(model, target)
    total = delegated = parts = 0
    build_error: str | None = None
    stop = vetoed is not None
    for sg in model.subgraphs:
        if sg.name.startswith("VALIDATION:"):
            continue
        n = len(sg.ops)
        total += n
        # Per-node decision (recorded even when vetoed: it tells the user what would still be missing).
        remap: dict[int, int] = {}
        fp16_deq: set[int] = set()
        rejected: dict[int, str] = {}
        for op in sg.ops:
            if pol.fp16_helper and op.opcode == "DEQUANTIZE" and op.inputs and op.inputs[0] >= 0:
                x = sg.tensors[op.inputs[0]]
                if x.dtype == "float16" and x.is_const and op.outputs:
                    remap[op.outputs[0]] = x.index
                    fp16_deq.add(op.index)
                    continue
            node = NodeView(sg, op, remap)
            reason = rules.check(node, target)
            if reason:
                rejected[op.index] = reason
        for i, r in rejected.items():
            op = sg.ops[i]
            reasons[(sg.index, i)] = (op.name, op.version, r)
        if stop:
            continue
        if not pol.allows_dynamic:
            if "_dynamic" not in sg.__dict__:  # same answer for every delegate: compute once per subgraph
                sg.__dict__["_dynamic"] = first_dynamic_tensor(sg)
            dyn = sg.__dict__["_dynamic"]
            if dyn is not None:
                t, op = dyn
                vetoed = (
                    "Attempting to use a delegate that only supports static-sized tensors with a graph that has "
                    f"dynamic-sized tensors (tensor#{t.index} '{t.name}' from {op.name}, subgraph {sg.index})."
                )
                stop = True  # the interpreter stops applying the delegate at the first failing subgraph
                continue
        supported = {i for i in range(n) if i not in rejected and i not in fp16_deq}
        if fp16_deq and len(supported) + len(fp16_deq) == n:
            chosen = set(range(n))  # FP16 helper, scenario 1: full delegation, DEQUANTIZE nodes included
        else:
            candidates = partition(sg, supported)
            kept = largest(candidates, pol.max_partitions, pol.min_nodes)
            chosen = {i for p in kept for i in p.nodes}
            for i in fp16_deq:
                reasons[(sg.index, i)] = ("DEQUANTIZE", sg.ops[i].version, FP16_DEQUANT)
            for p in candidates:
                if p.delegated and not chosen.issuperset(p.nodes):
                    why = _dropped_reason(len(p.nodes), pol)
                    for i in p.nodes:
                        reasons[(sg.index, i)] = (sg.ops[i].name, sg.ops[i].version, why)
        if hasattr(rules, "build_failure") and build_error is None:
            for i in sorted(chosen):
                err = rules.build_failure(NodeView(sg, sg.ops[i], remap), target)
                if err:
                    build_error = err
                    break
        delegated += len(chosen)
        parts += sum(1 for p in partition(sg, chosen) if p.delegated) if chosen else 0
    if build_error:
        vetoed = (
            f"The delegate would fail while building its graph ({build_error}); the runtime then restores "
            "the original CPU plan."
        )
    if vetoed:
        delegated = parts = 0
    # model_construct: the fields are built here with the right types; validation would cost more than the rules.
    cpu = [
        NodeVerdict.model_construct(subgraph=sg_i, index=i, op=op, version=v, reason=r)
        for (sg_i, i), (op, v, r) in sorted(reasons.items())
    ]
    hints = list(rules.hints(reasons, target, scheme_of(model)))
    if vetoed and "dynamic-sized" in vetoed:
        hints.append(
            f"{rules.NAME}: the model has a dynamic tensor; give shape-defining inputs (RESHAPE shape, "
            "RESIZE size, ...) constant values or fix the input shape before converting."
        )
    return DelegateReport(
        delegate=rules.NAME,
        source="rules",
        rules_version=rules.SOURCE,
        params=pol.params,
        nodes_total=total,
        nodes_delegated=delegated,
        partitions=parts,
        verdict=verdict(delegated, total),
        cpu_nodes=cpu,
        hints=hints,
        vetoed=vetoed,
    )


def _dropped_reason(size: int, pol) -> str:
    if size < pol.min_nodes:
        return f"Supported, but its partition of {size} node(s) is below min_nodes_per_partition={pol.min_nodes}."
    return (
        f"Supported, but its partition of {size} node(s) is not among the {pol.max_partitions} largest "
        f"the delegate keeps (max_delegated_partitions={pol.max_partitions})."
    )

"""Delegate compatibility matrix: would GPU, NNAPI, Hexagon, Core ML (and XNNPACK) take this model?

GPU, NNAPI, Hexagon and Core ML are predicted from each delegate's own acceptance rules (one module each,
tagged with the source it follows, each satisfying the `rules.DelegateRules` protocol), partitioned the
way the runtime partitions. XNNPACK is observed in the real interpreter. Every report says which it is
(`source`: "rules" or "runtime"). The model is parsed once and its structure validated before any rule
runs; an interpreter already loaded for measuring can be passed in so XNNPACK costs no second load.

    >>> reports = check_delegates("model.tflite", ["gpu", "xnnpack"])
    >>> print(format_report(reports))
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from optimize.core.errors import OptimizeError
from optimize.core.results import DelegateReport
from optimize.core.vocab import Delegate
from optimize.delegates.target import TargetParams

DELEGATES: tuple[Delegate, ...] = tuple(Delegate)

__all__ = ["DELEGATES", "SOURCE_CONFLICTS", "TargetParams", "check_delegates", "format_report", "rules_for"]


def __getattr__(name: str):
    if name == "SOURCE_CONFLICTS":  # data for reports and the recommender, loaded on first use
        from optimize.delegates.conflicts import SOURCE_CONFLICTS

        return SOURCE_CONFLICTS
    raise AttributeError(name)


def rules_for(name: str):
    """The `DelegateRules` object of a rules-checked delegate (gpu, nnapi, hexagon, coreml)."""
    from optimize.delegates import coreml, gpu, hexagon, nnapi

    return {Delegate.GPU: gpu, Delegate.NNAPI: nnapi, Delegate.HEXAGON: hexagon, Delegate.COREML: coreml}[name].RULES


def _names(delegates: Iterable[str] | str) -> list[str]:
    names = [d.strip().lower() for d in ([delegates] if isinstance(delegates, str) else delegates) if d.strip()]
    unknown = [d for d in names if d not in DELEGATES]
    if unknown:
        raise OptimizeError(f"Unknown delegate {', '.join(unknown)}.", f"Choose from {', '.join(DELEGATES)}.")
    return list(dict.fromkeys(names))


def check_delegates(
    model: str | Path | bytes,
    delegates: Iterable[str] = DELEGATES,
    target: TargetParams | None = None,
    threads: int = 2,
    *,
    loaded=None,
    parsed=None,
    observe: Iterable[str] = (),
) -> dict[str, DelegateReport]:
    """One DelegateReport per requested delegate, in the order asked.

    `loaded`: an interpreter already built for this model with the default XNNPACK delegate
    (`runtime.load(model, xnnpack=True)`); the XNNPACK column then reads it instead of loading again.
    `parsed`: the model already read with `optimize.models.tflite.read_model` (validated), so it is not read twice.
    `observe`: delegates to also observe in the runtime where this machine can ("gpu": LiteRT's GPU
    accelerator, reported under "gpu-observed"; left out when no device exists, see `observe.UNAVAILABLE`).
    Raises ModelError for a file that is not a readable, structurally valid TFLite model, OptimizeError
    for an unknown delegate.
    """
    from optimize.delegates.apply_rules import ModelFacts, run_rules
    from optimize.models.tflite import read_model

    names = _names(delegates)
    target = target or TargetParams()
    facts = ModelFacts(parsed if parsed is not None else read_model(model))
    out: dict[str, DelegateReport] = {}
    for name in names:
        if name == Delegate.XNNPACK:
            from optimize.delegates import xnnpack

            versions = {op.index: op.version for op in facts.model.main.ops}
            out[name] = xnnpack.check(model, threads=threads, versions=versions, loaded=loaded)
        else:
            out[name] = run_rules(facts, rules_for(name), target)
    from optimize.delegates.observe import OBSERVED, check, observe_gpu

    for name in check(observe):
        report = observe_gpu(model)
        if report is not None:
            out[OBSERVED[name]] = report
    from optimize.delegates.tail import with_tail

    return with_tail(_with_transposes(out, facts.model), facts.model.main)


def _with_transposes(out: dict[str, DelegateReport], model) -> dict[str, DelegateReport]:
    """The reports with the model's TRANSPOSE count, and how many of them change an image layout."""
    moved = [op for g in model.subgraphs for op in g.ops if op.name == "TRANSPOSE"]
    if not moved:
        return out
    spatial = any(op.name in SPATIAL for g in model.subgraphs for op in g.ops)
    layout = sum(1 for g in model.subgraphs for op in g.ops if op.name == "TRANSPOSE" and _layout_change(g, op))
    layout = layout if spatial else 0  # an attention model's [0, 2, 3, 1] moves heads, not image channels
    return {k: r.model_copy(update={"transposes": len(moved), "layout_transposes": layout}) for k, r in out.items()}


#: Ops on images: a model with none of them has no image layout for a TRANSPOSE to change.
SPATIAL = {
    "CONV_2D", "DEPTHWISE_CONV_2D", "CONV_3D", "TRANSPOSE_CONV", "AVERAGE_POOL_2D", "MAX_POOL_2D",
    "RESIZE_BILINEAR", "RESIZE_NEAREST_NEIGHBOR", "SPACE_TO_DEPTH", "DEPTH_TO_SPACE",
}  # fmt: skip
#: Permutations that move the channel axis between second and last: NCHW <-> NHWC (and NCDHW <-> NDHWC).
LAYOUT_PERMS = {(0, 2, 3, 1), (0, 3, 1, 2), (0, 2, 3, 4, 1), (0, 4, 1, 2, 3)}


def _layout_change(sg, op) -> bool:
    """Whether a TRANSPOSE changes an image layout (its constant permutation is NCHW <-> NHWC), not the heads
    of an attention layer ([0, 2, 1, 3]) or any other axes."""
    perm = sg.tensors[op.inputs[1]].values() if len(op.inputs) > 1 and op.inputs[1] >= 0 else None
    return perm is not None and tuple(int(v) for v in perm) in LAYOUT_PERMS


_VERDICT = {"full": "fully delegated", "partial": "partial", "none": "none"}


def _veto_lines(r: DelegateReport) -> list[str]:
    """Why nothing runs on the delegate; a build failure names the node that fails the whole delegation. A
    report whose first CPU node is only a consequence (its partition dropped) names the node that blocks."""
    if not r.vetoed:
        return _blocked_line(r)
    c = next((v for v in r.cpu_nodes if v.code == "build-failure"), None)
    if r.veto_code == "build-failure" and c is not None:
        return [f"  build fails at #{c.index} {c.op} v{c.version} (the whole delegation): {r.vetoed}"]
    return [f"  vetoed: {r.vetoed}"]


def _blocked_line(r: DelegateReport) -> list[str]:
    from optimize.delegates.blocking import blocker, own_words, where

    node = blocker(r)
    if node is None or not r.cpu_nodes or r.cpu_nodes[0] is node:
        return []
    return [
        f"  blocked at {where(node)} {node.op} v{node.version}: {own_words(node)}; the supported nodes listed "
        "with it fall to the CPU with their partition"
    ]


def _transpose_lines(reports: dict[str, DelegateReport]) -> list[str]:
    """What the model's TRANSPOSE ops are: layout changes a converter left (which --layout channels-last
    removes from a PyTorch or ONNX model), and the model's own reordering of other axes (attention heads)."""
    r = max(reports.values(), key=lambda x: x.transposes, default=None)
    if r is None or not r.transposes:
        return []
    lines = [f"TRANSPOSE ops: {r.transposes}, each a copy of its tensor on every delegate:"]
    if r.layout_transposes:
        lines += [
            f"  {r.layout_transposes} NCHW <-> NHWC layout change(s) a converter left (a PyTorch or ONNX",
            "  model converted with --layout channels-last has fewer)",
        ]
    if r.transposes > r.layout_transposes:
        lines += [
            f"  {r.transposes - r.layout_transposes} reorder other axes (the heads of multi-head attention, a",
            "  sequence's axes): the model's own computation, which no layout option removes",
        ]
    return [*lines, ""]


def format_report(reports: dict[str, DelegateReport], max_nodes: int = 25) -> str:
    """Plain text for the terminal: one block per delegate, CPU nodes with reasons, hints."""
    lines: list[str] = []
    from optimize.delegates.observe import OBSERVED

    lines += _transpose_lines(reports)

    labels = {key: f"{d} (observed)" for d, key in OBSERVED.items()}
    for name, r in reports.items():
        how = "observed in the runtime" if r.source == "runtime" else "predicted from the delegate's rules"
        name = labels.get(name, name)
        lines.append(
            f"{name.upper():8} {_VERDICT[r.verdict]:15} {r.nodes_delegated}/{r.nodes_total} nodes, "
            f"{r.partitions} partition(s)"
        )
        lines.append(f"  {how}" + (f", following {r.rules_version}" if r.rules_version else ""))
        lines += _veto_lines(r)
        for v in r.cpu_nodes[:max_nodes]:
            where = f"{v.subgraph}:" if v.subgraph else ""
            lines.append(f"  cpu  #{where}{v.index:<4} {v.op} v{v.version}: {v.reason}")
        if len(r.cpu_nodes) > max_nodes:
            lines.append(f"  ... and {len(r.cpu_nodes) - max_nodes} more node(s) on the CPU (use --json for all)")
        if r.cpu_tail:
            lines.append(f"  tail: {', '.join(dict.fromkeys(r.cpu_tail))} on the CPU after the delegated body, as a")
            lines.append("      shipped detector runs: the model counts as running on this delegate")
        for h in r.hints:
            lines.append(f"  hint: {h}")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"

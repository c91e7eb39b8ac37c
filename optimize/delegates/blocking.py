"""What blocks a delegate, read from its report: the node to name, and how much the delegate would run.

A report lists every node left on the CPU in graph order, and the first of them is often not the cause: a
supported node whose partition was not among those the delegate keeps (`partition-limit`, `partition-size`),
or a float16 DEQUANTIZE the FP16 helper folds only when everything is delegated, is left there *because*
another node was refused. Naming that one ("RESHAPE: Supported, but its partition of 15 node(s) is not among
the 1 largest") sends the user after a node the delegate takes. So:

    blocker(report)    the node that blocks: the one that fails the delegate's build (the whole delegation
                       fails with it), else the first node the delegate refuses for a reason of its own
    accepted(report)   the nodes the delegate would run: for a build failure, all it accepted before the
                       build failed (the report's `nodes_delegated` is then 0); else what it runs
    words(report)      the blocker in one phrase, the dropped partitions said as their consequence

Ranking candidates by `accepted` puts a float32 that the GPU takes node by node (177/177) and fails to build
on one CONCATENATION ahead of an int16x8 it takes 1 node of. Rules read: this module only reads reports.
"""

from __future__ import annotations

import re

from optimize.core.results import DelegateReport, NodeVerdict

#: Reason codes of nodes left on the CPU only because of another node (`optimize.delegates.rules.Reason`).
CONSEQUENCES = frozenset({"partition-limit", "partition-size", "fp16-dequantize"})
BUILD_FAILURE = "build-failure"
#: How a report before `nodes_accepted` said it (`apply_rules._build_veto`).
_WOULD_TAKE = re.compile(r"would take (\d+) of (\d+) nodes")
#: The delegate's own words inside a build-failing node's reason (`apply_rules._build_veto`).
_INNER = re.compile(r"fails the delegate's build \((.*)\): the whole delegation", re.S)


def causes(report: DelegateReport) -> list[NodeVerdict]:
    """The nodes refused for a reason of their own (a build failure included), in graph order."""
    return [v for v in report.cpu_nodes if v.code not in CONSEQUENCES]


def blocker(report: DelegateReport) -> NodeVerdict | None:
    """The node that blocks the delegate: the one its build fails at, else the first it refuses itself; None
    when the report names none (a model-level veto, or nothing refused)."""
    if report.verdict == "full":
        return None
    if report.veto_code == BUILD_FAILURE:
        built = next((v for v in report.cpu_nodes if v.code == BUILD_FAILURE), None)
        if built is not None:
            return built
    found = causes(report)
    return found[0] if found else None


def accepted(report: DelegateReport) -> int:
    """The nodes the delegate would run: all it accepted when only its build fails, else what it runs."""
    if report.veto_code != BUILD_FAILURE:
        return report.nodes_delegated
    if report.nodes_accepted is not None:
        return report.nodes_accepted
    m = _WOULD_TAKE.search(report.vetoed or "")
    return int(m.group(1)) if m else report.nodes_delegated


def closeness(report: DelegateReport) -> float:
    """The share of the model's nodes the delegate would run (`accepted`), 0..1."""
    return accepted(report) / max(report.nodes_total, 1)


def own_words(node: NodeVerdict) -> str:
    """The delegate's own reason for a node: for a build failure, what failed inside the build."""
    m = _INNER.search(node.reason) if node.code == BUILD_FAILURE else None
    return (m.group(1) if m else node.reason).rstrip(".")


def where(node: NodeVerdict) -> str:
    return f"#{node.subgraph}:{node.index}" if node.subgraph else f"#{node.index}"


def words(report: DelegateReport) -> str:
    """What blocks the delegate, in one phrase: the build failure and its node, a model-level veto, or the
    first node it refuses (with how many supported nodes fell to the CPU with it)."""
    node = blocker(report)
    if node is not None and node.code == BUILD_FAILURE:
        return f"its build fails at {where(node)} {node.op}: {own_words(node)}"
    if report.vetoed and node is None:
        return report.vetoed.rstrip(".")
    if node is None:
        return report.verdict
    dropped = sum(1 for v in report.cpu_nodes if v.code in CONSEQUENCES)
    after = f" ({dropped} supported node(s) fall to the CPU with it)" if dropped else ""
    return f"blocked at {where(node)} {node.op}: {own_words(node)}{after}"

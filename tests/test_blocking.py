"""The blocker named is the blocker (issue 45): a dropped partition is the consequence of a node the delegate
refuses, a build failure's node is named with what the delegate would otherwise run, and the summary's
"comes closest" ranks candidates by what the delegate would run."""

from __future__ import annotations

from study_fixtures import candidate, study

from optimize.core.results import DelegateReport, FitRecord, FitStep, NodeVerdict
from optimize.decide.choose import recommend
from optimize.delegates.blocking import accepted, blocker, closeness, words
from optimize.present.report import render_markdown
from optimize.present.report_text import fit_lines, next_steps

LIMIT = "Supported, but its partition of 15 node(s) is not among the 1 largest the delegate keeps."
ADD = "Doesn't support broadcasting - input0: [1,100,64], input1: [100,64]."
CONCAT = "CONCATENATION: Expected a 4D tensor of shape BxHxWxC but got [1,1,64] (constant input)."


def _node(index: int, op: str, reason: str, code: str) -> NodeVerdict:
    return NodeVerdict(index=index, op=op, version=1, reason=reason, code=code)


def whisper_like() -> DelegateReport:
    """130 of 146 nodes: a RESHAPE dropped with its partition listed before the ADD that splits the graph."""
    nodes = [_node(3, "RESHAPE", LIMIT, "partition-limit"), _node(14, "ADD", ADD, "broadcast")]
    nodes += [_node(15 + i, "MEAN", LIMIT, "partition-limit") for i in range(14)]
    return DelegateReport(
        delegate="gpu", source="rules", nodes_total=146, nodes_delegated=130, partitions=1, verdict="partial",
        cpu_nodes=nodes,
    )  # fmt: skip


def vit_like(legacy: bool = False) -> DelegateReport:
    """Every node accepted, then the build fails on the class token's CONCATENATION: nothing runs on the GPU."""
    veto = (
        "The delegate would take 177 of 177 nodes, but fails while building its graph at #5 CONCATENATION v1 "
        f"({CONCAT}); the runtime then restores the original CPU plan: every node runs on the CPU."
    )
    inner = f"Accepted node by node, but fails the delegate's build ({CONCAT}): the whole delegation fails with it."
    return DelegateReport(
        delegate="gpu", source="rules", nodes_total=177, nodes_delegated=0, partitions=0, verdict="none",
        cpu_nodes=[_node(5, "CONCATENATION", inner, "build-failure")], vetoed=veto, veto_code="build-failure",
        nodes_accepted=None if legacy else 177,
    )  # fmt: skip


def int16x8_like() -> DelegateReport:
    nodes = [
        _node(i, "CONV_2D", "OP is supported, but tensor type/shape isn't compatible.", "tensor-type")
        for i in range(198)
    ]
    return DelegateReport(
        delegate="gpu", source="rules", nodes_total=199, nodes_delegated=1, partitions=1, verdict="partial",
        cpu_nodes=nodes,
    )  # fmt: skip


def test_a_dropped_partition_is_named_as_the_consequence_of_the_node_that_blocks():
    r = whisper_like()
    assert r.cpu_nodes[0].op == "RESHAPE"  # listed first, and supported
    node = blocker(r)
    assert (node.index, node.op) == (14, "ADD")
    assert words(r) == (
        "blocked at #14 ADD: Doesn't support broadcasting - input0: [1,100,64], input1: [100,64] "
        "(15 supported node(s) fall to the CPU with it)"
    )


def test_a_build_failure_names_its_node_and_what_the_delegate_would_run():
    for r in (vit_like(), vit_like(legacy=True)):  # a study from before nodes_accepted reads the veto's words
        assert accepted(r) == 177 and closeness(r) == 1.0
        assert blocker(r).op == "CONCATENATION"
        assert words(r) == f"its build fails at #5 CONCATENATION: {CONCAT.rstrip('.')}"


def test_comes_closest_ranks_by_what_the_delegate_would_run():
    cands = [
        candidate("float32", delegates={"gpu": vit_like()}),
        candidate("int16x8", "int16x8", delegates={"gpu": int16x8_like()}),
    ]
    lines = next_steps(study(cands), None)
    gpu = next(line for line in lines if line.strip().startswith("gpu"))
    assert "float32 comes closest (177/177 accepted); its build fails at #5 CONCATENATION" in gpu, gpu
    assert "int16x8" not in gpu


def test_the_summary_says_which_rewrite_bought_which_target():
    fit = FitRecord(
        steps=[
            FitStep(rewrite="flatten-into-dense", node="#4 RESHAPE", targets=["coreml"], max_abs_diff=0.0),
            FitStep(rewrite="batch-axis", node="#9 ADD", targets=["coreml"], kept=False, why="no better"),
        ],
        bought=["coreml"],
        samples=32,
    )
    fitted = candidate("fit-float16", "float16", size=76_000).model_copy(update={"fit": fit})
    (line,) = fit_lines(study([candidate("float32"), fitted]))
    assert line.startswith("  fitted   coreml by flatten-into-dense (#4 RESHAPE)") and "bit for bit" in line
    assert "batch-axis" not in line  # dropped rewrites bought nothing
    assert fit_lines(study([candidate("float32")])) == []
    rec = recommend(study([candidate("float32"), fitted]), "coreml")
    assert rec.chosen == "fit-float16"
    assert any(f.startswith("fit-float16 is made from the float graph rewritten for coreml") for f in rec.facts)
    assert recommend(study([candidate("float32"), fitted]), "gpu").chosen == "float32"  # made for coreml only
    md = render_markdown(study([candidate("float32"), fitted]))
    assert "## The graph fitted to its targets" in md and "| flatten-into-dense | #4 RESHAPE | coreml |" in md

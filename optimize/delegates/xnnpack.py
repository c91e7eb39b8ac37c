"""XNNPACK column: runtime evidence, not prediction.

The model is loaded in the real LiteRT interpreter (`runtime.load`, XNNPACK on, as shipped). Release
builds do not print TFLite's "Replacing N out of M node(s)" line (it is a debug-only TFLITE_LOG), so the
evidence is read from the interpreter itself: after allocate_tensors, `_get_ops_details()` lists the
original nodes of the primary subgraph followed by one DELEGATE node per XNNPACK partition. Each DELEGATE
node's outputs are traced back through the original nodes' producers, stopping at the DELEGATE node's
inputs: the nodes reached are exactly the ones that partition replaced (a partition's inputs are all
tensors its nodes read from outside it).
"""

from __future__ import annotations

from pathlib import Path

from optimize.core.errors import ModelError
from optimize.core.results import DelegateReport, NodeVerdict
from optimize.delegates.apply_rules import verdict
from optimize.delegates.rules import Reason

SOURCE = "runtime: ai-edge-litert interpreter with the default XNNPACK delegate (primary subgraph)"
NAME = "xnnpack"


def _covered(delegate: dict, producer: dict[int, int], by_index: dict[int, dict]) -> set[int]:
    """The original nodes one DELEGATE node replaced: trace its outputs back to its inputs."""
    boundary = {int(t) for t in delegate["inputs"]}
    covered: set[int] = set()
    stack = [int(t) for t in delegate["outputs"]]
    while stack:
        t = stack.pop()
        p = producer.get(t) if t not in boundary else None
        if p is None or p in covered:
            continue
        covered.add(p)
        stack.extend(int(x) for x in by_index[p]["inputs"] if int(x) >= 0)
    return covered


def replaced_nodes(ops: list[dict]) -> tuple[list[set[int]], int]:
    """(nodes replaced by each DELEGATE partition, number of original nodes) from `_get_ops_details()`."""
    originals = [d for d in ops if d["op_name"] != "DELEGATE"]
    producer = {int(t): int(d["index"]) for d in originals for t in d["outputs"]}
    by_index = {int(d["index"]): d for d in originals}
    parts = [_covered(d, producer, by_index) for d in ops if d["op_name"] == "DELEGATE"]
    return parts, len(originals)


def _nodes(interpreter) -> list[dict]:
    """Name, inputs and outputs of every node of the primary subgraph (what `_get_ops_details()` gives,
    without building its per-operand type lists)."""
    w = getattr(interpreter, "_interpreter", None)
    if w is None or not hasattr(w, "NodeInputs"):
        return interpreter._get_ops_details()
    return [
        {"index": i, "op_name": w.NodeName(i), "inputs": w.NodeInputs(i), "outputs": w.NodeOutputs(i)}
        for i in range(w.NumNodes())
    ]


def check(
    model: str | Path | bytes, threads: int = 2, versions: dict[int, int] | None = None, loaded=None
) -> DelegateReport:
    """Load the model with XNNPACK (or read `loaded`, an interpreter built that way) and report which nodes
    it replaced. `versions`: node index -> op version."""
    from optimize.models import runtime

    versions = versions or {}
    try:
        loaded = loaded or runtime.load(model, threads=threads, xnnpack=True)
    except ModelError as e:
        return DelegateReport(
            delegate=NAME,
            source="runtime",
            rules_version=SOURCE,
            params={"threads": threads},
            nodes_total=len(versions),
            nodes_delegated=0,
            partitions=0,
            verdict="none",
            vetoed=f"The runtime could not load the model: {e.problem}",
            veto_code=Reason.RUNTIME.value,
        )
    ops = _nodes(loaded.interpreter)
    parts, total = replaced_nodes(ops)
    taken = set().union(*parts) if parts else set()
    names = {int(d["index"]): d["op_name"] for d in ops if d["op_name"] != "DELEGATE"}
    cpu = [
        NodeVerdict(
            subgraph=0,
            index=i,
            op=names[i],
            version=versions.get(i, 1),
            reason="Runs on the built-in CPU kernels: XNNPACK did not replace it (observed).",
            code=Reason.RUNTIME.value,
        )
        for i in sorted(names)
        if i not in taken
    ]
    hints = []
    if not parts:
        hints.append(
            "XNNPACK took no node: int16x8 and other types it lacks run on the reference kernels; "
            "float32, float16 and int8 models get XNNPACK."
        )
    return DelegateReport(
        delegate=NAME,
        source="runtime",
        rules_version=SOURCE,
        params={"threads": threads},
        nodes_total=total,
        nodes_delegated=len(taken),
        partitions=len(parts),
        verdict=verdict(len(taken), total),
        cpu_nodes=cpu,
        hints=hints,
    )

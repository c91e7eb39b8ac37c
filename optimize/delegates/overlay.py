"""Delegate verdicts as Model Explorer node data: see the matrix on the graph, in the tool people already use.

Model Explorer (PyPI `ai-edge-model-explorer`) overlays "custom node data" on a graph: a JSON object from
graph id to `{"results": {node id: {"value": ..., "bgColor": ...}}}` (its `node_data_builder.ModelNodeData`).
It shows one value per node, so each delegate gets its own file; load them together with
`model-explorer model.tflite --node_data_paths=a.json,b.json` and switch between them in the side panel.

Ids follow Model Explorer's TFLite flatbuffer adapter: a node is its operator index in the subgraph, and a
subgraph is its name, or `main` for an unnamed first subgraph and `subgraph_<i>` for the other unnamed ones.
A node's value is `delegated`, or `cpu: <reason code>: <the delegate's reason>`. When the delegate would fail
while building its graph, the failing node says so (`cpu: build-failure: ...`, red) and every node it would
otherwise have taken is marked as lost with the whole delegation (`cpu: build-failure: accepted, lost ...`,
in a colour of its own); nodes the node rules refused keep their own reasons.
"""

from __future__ import annotations

import json
from pathlib import Path

from optimize.core.errors import OptimizeError
from optimize.core.results import DelegateReport, write_atomic
from optimize.delegates.rules import Reason
from optimize.models.flatbuffer import Model, Subgraph

DELEGATED = "delegated"
GREEN, AMBER, RED = "#81c784", "#ffb74d", "#e57373"
LOST = "#ba68c8"  # accepted node by node, lost when another node fails the delegate's build
# Supported by the delegate, but left on the CPU by partitioning: worth a different colour.
_PARTITIONING = frozenset({Reason.PARTITION_LIMIT, Reason.PARTITION_SIZE, Reason.FP16_DEQUANT})


def graph_id(sg: Subgraph) -> str:
    """The id Model Explorer's TFLite adapter gives a subgraph."""
    if sg.name:
        return sg.name
    return "main" if sg.index == 0 else f"subgraph_{sg.index}"


def _cpu(code: str | None, reason: str) -> dict:
    color = AMBER if code in _PARTITIONING else RED
    return {"value": f"cpu: {code or 'cpu'}: {reason}", "bgColor": color}


def _graph_node_data(name: str, results: dict) -> dict:
    """A GraphNodeData with every field as Model Explorer's own `to_json_string` writes it. String values
    (NodeDataResult.value is annotated as a number, but the viewer shows strings too, and GraphNodeData's
    summary options exist for them) carry the reason; the summaries list how many nodes share each one."""
    return {
        "results": results,
        "name": name,
        "thresholds": [],
        "gradient": [],
        "hideInAggregatedStatsTable": False,
        "hideInChildrenStatsTable": False,
        "showExpandedSummaryOnGroupNode": True,
        "showLabelCountColumnsInChildrenStatsTable": True,
    }


def _lost(report: DelegateReport) -> dict | None:
    """The value of the nodes a build failure takes down with the delegation (None: no build failure)."""
    if report.veto_code != Reason.BUILD_FAILURE:
        return None
    c = next((v for v in report.cpu_nodes if v.code == Reason.BUILD_FAILURE), None)
    at = f"#{c.index} {c.op}" if c is not None else "another node"
    return {"value": f"cpu: build-failure: accepted, lost with the delegation ({at} fails its build)", "bgColor": LOST}


def node_data(report: DelegateReport, model: Model) -> dict:
    """One delegate's verdicts as a Model Explorer ModelNodeData (JSON-able)."""
    cpu = {(v.subgraph, v.index): (v.code, v.reason) for v in report.cpu_nodes}
    lost = _lost(report)
    veto = report.vetoed if lost is None else None  # other vetoes (dynamic tensors, platform) mark every node
    out = {}
    for sg in model.subgraphs:
        if sg.name.startswith("VALIDATION:"):
            continue
        results = {}
        for op in sg.ops:
            if veto:
                results[str(op.index)] = _cpu(report.veto_code, veto)
            elif (sg.index, op.index) in cpu:
                results[str(op.index)] = _cpu(*cpu[(sg.index, op.index)])
            else:
                results[str(op.index)] = lost or {"value": DELEGATED, "bgColor": GREEN}
        out[graph_id(sg)] = _graph_node_data(f"{report.delegate} ({report.source})", results)
    return out


def overlay_paths(path: Path, delegates: list[str]) -> dict[str, Path]:
    """Where each delegate's file goes: `path` itself for one delegate, `<stem>.<delegate><suffix>` for more."""
    path = Path(path)
    if len(delegates) == 1:
        return {delegates[0]: path}
    suffix = path.suffix or ".json"
    return {d: path.with_name(f"{path.stem}.{d}{suffix}") for d in delegates}


def write_overlays(path: Path, reports: dict[str, DelegateReport], model: Model | str | Path | bytes) -> list[Path]:
    """Write one node-data file per delegate, each atomically; everything is serialized before any write."""
    from optimize.models.tflite import read_model

    model = model if isinstance(model, Model) else read_model(model)
    paths = overlay_paths(path, list(reports))
    for p in (Path(path), *paths.values()):
        if p.is_dir():
            raise OptimizeError(
                f"{p} is a folder.", "Pass a file name for the Model Explorer overlay, e.g. overlay.json."
            )
    blobs = {d: json.dumps(node_data(r, model), indent=1).encode() for d, r in reports.items()}
    return [write_atomic(paths[d], blob) for d, blob in blobs.items()]

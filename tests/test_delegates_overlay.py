"""`optimize compat M.tflite --model-explorer overlay.json`: delegate verdicts as Model Explorer node data.

The files are checked against Model Explorer's own package (ai-edge-model-explorer): they load into its
node-data classes and serialize back identically, and every node id is one its TFLite adapter gives the
same model. Without the package those two tests are skipped; the format tests still run.
"""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
from delegate_fixtures import load_t, op, save_t, tensor, tiny

from optimize.delegates import check_delegates
from optimize.delegates.overlay import DELEGATED, GREEN, RED, graph_id, node_data, overlay_paths, write_overlays
from optimize.models.tflite import read_model


@pytest.fixture(scope="module")
def model() -> bytes:
    """Two subgraphs (the second named), ADD -> RELU -> RESHAPE: Core ML refuses RESHAPE on iOS 13+."""
    tensors = [tensor([1, 4]), tensor([4], data=np.ones(4, np.float32)), tensor([1, 4]), tensor([1, 4])]
    tensors += [tensor([4]), tensor([1], "int32", [4])]
    ops = [op("ADD", [0, 1], [2], ("AddOptions", {})), op("RELU", [2], [3]), op("RESHAPE", [3, 5], [4])]
    m = load_t(tiny(tensors, ops, [0], [4]))
    second = copy.deepcopy(m.subgraphs[0])
    second.name = "second"
    m.subgraphs.append(second)
    return save_t(m)


def test_node_data_per_delegate(model):
    reports = check_delegates(model, ["gpu", "coreml"])
    gpu = node_data(reports["gpu"], read_model(model))
    assert set(gpu) == {"main", "second"}
    assert gpu["main"]["results"]["0"] == {"value": DELEGATED, "bgColor": GREEN}
    coreml = node_data(reports["coreml"], read_model(model))["main"]["results"]
    assert coreml["2"]["value"].startswith("cpu: feature-level: RESHAPE is delegated only with Core ML version 2")
    assert coreml["2"]["bgColor"] == RED


def test_paths_and_atomic_write(model, tmp_path):
    assert overlay_paths(tmp_path / "o.json", ["gpu"]) == {"gpu": tmp_path / "o.json"}
    assert overlay_paths(tmp_path / "o.json", ["gpu", "nnapi"])["nnapi"] == tmp_path / "o.nnapi.json"
    reports = check_delegates(model, ["gpu", "hexagon"])
    written = write_overlays(tmp_path / "sub" / "overlay.json", reports, model)
    assert [p.name for p in written] == ["overlay.gpu.json", "overlay.hexagon.json"]
    assert sorted(p.name for p in (tmp_path / "sub").iterdir()) == ["overlay.gpu.json", "overlay.hexagon.json"]
    data = json.loads(written[1].read_text())
    # Hexagon: float ADD and RESHAPE fail the 8-bit type lists; RELU is taken at version 2 only (utils.cc:104-107).
    values = [r["value"].split(":")[1].strip() for r in data["main"]["results"].values()]
    assert values == ["tensor-type", "op-version", "tensor-type"]


def test_vetoed_model_marks_every_node(tmp_path):
    """A dynamic RESHAPE (shape from a graph input) vetoes the GPU: every node carries the veto."""
    data = tiny(
        [tensor([1, 8]), tensor([2], "int32"), tensor([8, 1]), tensor([8, 1])],
        [op("RESHAPE", [0, 1], [2]), op("RELU", [2], [3])],
        [0, 1],
        [3],
    )
    results = node_data(check_delegates(data, ["gpu"])["gpu"], read_model(data))["main"]["results"]
    assert {r["value"].split(":")[1].strip() for r in results.values()} == {"dynamic-tensor"}


def test_cli_writes_the_overlay(model, tmp_path, cli):
    path = tmp_path / "m.tflite"
    path.write_bytes(model)
    r = cli("compat", str(path), "--delegate", "gpu", "--model-explorer", str(tmp_path / "ov.json"), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["gpu"]["verdict"] == "full"
    assert json.loads((tmp_path / "ov.json").read_text())["main"]["results"]["1"]["value"] == DELEGATED
    assert "Model Explorer node data" in r.stderr
    bad = cli("compat", str(path), "--model-explorer", str(tmp_path))
    assert bad.returncode == 2 and bad.stderr.count("error:") == 1 and "is a folder" in bad.stderr


def test_loads_with_model_explorer_classes(model, tmp_path):
    """The file round-trips through the package's node-data classes (node_data_builder.py). Their
    NodeDataResult.value is annotated as a number, but the viewer also shows strings (the same module's
    GraphNodeData docs describe string values), which is what a reason needs."""
    builder = pytest.importorskip("model_explorer.node_data_builder")
    (path,) = write_overlays(tmp_path / "ov.json", check_delegates(model, ["coreml"]), model)
    raw = json.loads(path.read_text())
    graphs = {}
    for gid, g in raw.items():
        fields = {k: v for k, v in g.items() if k != "results"}
        results = {k: builder.NodeDataResult(**v) for k, v in g["results"].items()}
        graphs[gid] = builder.GraphNodeData(results=results, **fields)
    loaded = builder.ModelNodeData(graphsData=graphs)
    assert json.loads(loaded.to_json_string()) == raw


def test_ids_match_the_model_explorer_adapter(model, tmp_path):
    """Graph and node ids are the ones Model Explorer's TFLite flatbuffer adapter gives this model."""
    adapter = pytest.importorskip("ai_edge_model_explorer_adapter")
    path = tmp_path / "m.tflite"
    path.write_bytes(model)
    graphs = json.loads(adapter.ConvertFlatbufferDirectlyToJson(adapter.VisualizeConfig(), str(path)))[0]["subgraphs"]
    ops = {g["id"]: {n["id"] for n in g["nodes"] if n["label"] in ("add", "relu", "reshape")} for g in graphs}
    ours = node_data(check_delegates(model, ["gpu"])["gpu"], read_model(model))
    assert {gid: set(g["results"]) for gid, g in ours.items()} == ops
    assert [graph_id(sg) for sg in read_model(model).subgraphs] == [g["id"] for g in graphs]

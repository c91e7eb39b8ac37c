"""What the conversion stage must keep while its code moves: the converted .tflite's tensor names (per-layer
errors, float islands and the delegate reports print them) and the fingerprints every cache key is made of
(a source's fingerprint, the data's; `engine.cache.key_for` over them). Small seeded models of each kind that
the door converts or opens: a .pt2, an nn.Module, an ONNX graph written byte by byte here (so its fingerprint
does not depend on an exporter), a tf_keras model and its float32 baseline's names.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the torch extra (pip install -e '.[torch]') is not installed")
pytest.importorskip("litert_torch", reason="the torch extra is not installed")
pytest.importorskip("onnxruntime", reason="the torch extra is not installed")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from optimize.convert.front import open_inputs  # noqa: E402
from optimize.models.source import file_fingerprint  # noqa: E402
from optimize.models.spec import fingerprint_of  # noqa: E402
from optimize.models.tflite import read_model  # noqa: E402


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.head = torch.nn.Linear(4, 3)

    def forward(self, x):
        return torch.softmax(self.head(torch.relu(self.conv(x)).mean((2, 3))), -1)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    d = tmp_path_factory.mktemp("pins")
    rng = np.random.default_rng(0)
    torch.manual_seed(0)
    net = Net().eval()
    x = rng.normal(size=(12, 3, 8, 8)).astype(np.float32)
    np.savez(d / "img.npz", x=x)
    torch.export.save(torch.export.export(net, (torch.from_numpy(x[:1]),)), str(d / "net.pt2"))
    w, b = rng.normal(size=(6, 5)).astype(np.float32), rng.normal(size=(5,)).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["h"], name="dense"),
        helper.make_node("Add", ["h", "B"], ["z"], name="bias"),
        helper.make_node("Relu", ["z"], ["y"], name="act"),
    ]
    g = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 5])],
        [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "B")],
    )  # fmt: skip
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    (d / "mlp.onnx").write_bytes(m.SerializeToString())
    np.savez(d / "vec.npz", x=rng.normal(size=(12, 6)).astype(np.float32))
    return d, net


def _names(content: bytes) -> list[str]:
    return [t.name for t in read_model(content).main.tensors]


def _plan(shape, layout) -> str:
    """What a conversion's input plan is keyed by (`Plan.key`), written out: one float input, nothing frozen."""
    return json.dumps([[["x", shape, "batch", "float32", layout]], [], "source"])


def test_an_onnx_graph_keeps_its_names_and_keys(folder):
    d, _ = folder
    src, ds = open_inputs(d / "mlp.onnx", d / "vec.npz")
    assert file_fingerprint(d / "mlp.onnx") == "49d7d238ec39f804"  # the bytes written here
    assert src.fingerprint == fingerprint_of("49d7d238ec39f804", _plan([1, 6], "")) == "5f17e5bd1cd2a6f7"
    assert ds.fingerprint == "45642d57a2c62431"
    assert [(i.name, i.shape, i.dtype) for i in src.inputs] == [("x", (1, 6), "float32")] and src.outputs == ("y",)
    # MatMul + its bias Add convert as one linear layer (issue 42: PT2E quantizes `linear`), named after the MatMul
    assert _names(src.content) == ["serving_default_x", "dense;", "dense;1", "serving_default_y_output"]


def test_a_pt2_keeps_its_names_and_keys(folder):
    d, _ = folder
    src, ds = open_inputs(d / "net.pt2", d / "img.npz")
    assert src.fingerprint == fingerprint_of(file_fingerprint(d / "net.pt2"), _plan([1, 3, 8, 8], "NCHW"))
    assert ds.fingerprint == "daf363c60ffb340f"
    assert src.inputs[0].shape == (1, 3, 8, 8) and src.outputs == ("output",)
    assert _names(src.content) == [
        "serving_default_x", "head;", "head;1", "op;", "conv;", "arith.constant", "conv;#2", "arith.constant1",
        "conv;1", "conv;1#2", "transpose;1", "mean;2", "head;2", "serving_default_output_output",
    ]  # fmt: skip


def test_an_nn_module_keeps_its_names(folder):
    d, net = folder
    src, _ = open_inputs(net, d / "img.npz")
    assert src.kind == "pt2" and src.name == "Net"
    assert _names(src.content) == [
        "serving_default_x", "inner/head;", "inner/head;1", "inner;", "inner;inner/conv;", "arith.constant",
        "inner/conv;", "arith.constant1", "inner/conv;1", "inner;inner/conv;1", "inner;1", "inner;2",
        "inner/head;2", "serving_default_output_output",
    ]  # fmt: skip


def test_a_keras_model_keeps_its_fingerprint_and_baseline_names(folder):
    tf_keras = pytest.importorskip("tf_keras")
    from optimize.convert.keras import float32_direct
    from optimize.models.source import load_keras2

    d, _ = folder
    inp = tf_keras.Input((6,), name="x")
    hidden = tf_keras.layers.Dense(5, activation="relu", name="hidden")(inp)
    head = tf_keras.layers.Dense(3, activation="softmax", name="head")(hidden)
    tf_keras.Model(inp, head, name="model").save(d / "mlp.keras")  # named: a model built earlier would make it model_1
    src, ds = open_inputs(d / "mlp.keras", d / "vec.npz", check=True)
    assert src.kind == "keras2" and src.fingerprint == file_fingerprint(d / "mlp.keras")
    assert ds.fingerprint == "45642d57a2c62431" and src.outputs == ("head",)
    made = float32_direct(load_keras2(src), ds)
    assert _names(made.content) == [
        "x", "model/head/MatMul", "model/hidden/MatMul", "model/hidden/MatMul;model/hidden/Relu", "model/head/MatMul1",
        "Identity",
    ]  # fmt: skip


def test_the_result_cache_keys_a_run_by_those_fingerprints(folder, tmp_path):
    from optimize.engine.cache import key_for
    from optimize.engine.runs import open_run

    d, _ = folder
    run = open_run(d / "mlp.onnx", d / "vec.npz", output=tmp_path / "out", cache=False)
    assert run.src.fingerprint == "5f17e5bd1cd2a6f7" and run.ds.fingerprint == "45642d57a2c62431"
    common = {"model": "5f17e5bd1cd2a6f7", "data": "45642d57a2c62431", "settings": run.settings}
    base = run.baseline
    base_key = key_for(steps=[s.model_dump(mode="json") for s in base.steps], **common)
    keys = run.keys()
    assert len(keys) == len(run.recipes) > 1
    for r in run.recipes:
        steps = [s.model_dump(mode="json") for s in r.steps]
        assert keys[r.name] == key_for(steps=steps, baseline=None if r is base else base_key, **common)

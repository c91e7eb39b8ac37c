"""PyTorch and ONNX models in: a seeded CNN as a .pt2, the same CNN exported to ONNX, and as an nn.Module, each
converted once to a float .tflite by litert-torch; channel-last I/O; an input whose batch axis is not first;
both int8 routes; every bad input as one line; a .pt2 carrying a pickle payload (refused, the payload never
runs). Everything is built here (no downloads). Needs the torch extra, which the test extra installs.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the torch extra (pip install -e '.[torch]') is not installed")
pytest.importorskip("litert_torch", reason="the torch extra is not installed")
pytest.importorskip("onnxruntime", reason="the torch extra is not installed")

from tests_support import one_line_error as assert_one_line_error  # noqa: E402
from tests_support import too_wide  # noqa: E402

from optimize.convert.front import open_inputs  # noqa: E402
from optimize.core.errors import DataError, ModelError, OptimizeError  # noqa: E402


class SmallCNN(torch.nn.Module):
    """Conv + BatchNorm + ReLU, a strided conv, global pooling, a classifier: what image models are made of."""

    def __init__(self):
        super().__init__()
        self.c1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.c2 = torch.nn.Conv2d(8, 16, 3, stride=2, padding=1)
        self.fc = torch.nn.Linear(16, 5)

    def forward(self, x):
        y = torch.relu(self.bn(self.c1(x)))
        y = torch.relu(self.c2(y))
        return torch.softmax(self.fc(y.mean((2, 3))), -1)


class Recurrent(torch.nn.Module):
    """A step of a streaming model: silero-vad's interface, the state's batch axis second ([2, batch, 8])."""

    def __init__(self):
        super().__init__()
        self.inp = torch.nn.Linear(12, 8)
        self.mix = torch.nn.Linear(8, 8)

    def forward(self, audio, state):
        h = torch.tanh(self.inp(audio) + self.mix(state[0]) + state[1])
        return torch.sigmoid(h.sum(-1, keepdim=True)), torch.stack([h, h * 0.5])


@pytest.fixture(scope="module")
def cnn():
    torch.manual_seed(0)
    net = SmallCNN().eval()
    with torch.no_grad():  # trained-looking statistics, not the identity
        net.bn.running_mean.uniform_(-0.5, 0.5)
        net.bn.running_var.uniform_(0.5, 2.0)
    return net


@pytest.fixture(scope="module")
def files(tmp_path_factory, cnn):
    """The CNN as a .pt2, as ONNX (torch.onnx.export, the TorchScript exporter: offline), its data (NCHW)."""
    d = tmp_path_factory.mktemp("torch")
    x = np.random.default_rng(0).normal(size=(40, 3, 16, 16)).astype(np.float32)
    np.savez(d / "data.npz", x=x)
    sample = (torch.from_numpy(x[:1]),)
    torch.export.save(torch.export.export(cnn, sample), str(d / "cnn.pt2"))
    torch.onnx.export(
        cnn, sample, str(d / "cnn.onnx"), dynamo=False, input_names=["x"], output_names=["probs"],
        dynamic_axes={"x": {0: "batch"}},
    )  # fmt: skip
    return d


def test_pt2_converts_to_a_float_tflite_with_its_own_error_measured(files):
    from optimize.convert import fidelity as conversion

    src, ds = open_inputs(files / "cnn.pt2", files / "data.npz", check=True)
    assert src.kind == "pt2" and src.flat and src.content[4:8] == b"TFL3"
    assert [(i.name, i.shape) for i in src.inputs] == [("x", (1, 3, 16, 16))]
    c = conversion.measure(src, ds).conversion
    assert c.source == "pt2" and "litert-torch" in c.route and c.inputs[0].layout == "NCHW"
    assert c.fidelity.samples == 8 and "PyTorch" in c.fidelity.reference
    assert c.fidelity.relative_error < 1e-5 and c.fidelity.top1_agreement == 1.0


def test_onnx_converts_against_onnx_runtime(files):
    from optimize.convert import fidelity as conversion

    src, ds = open_inputs(files / "cnn.onnx", files / "data.npz", check=True)
    c = conversion.measure(src, ds).conversion
    assert src.outputs == ("probs",) and c.outputs == ["probs"]
    assert "ONNX Runtime" in c.fidelity.reference and c.fidelity.relative_error < 1e-5
    assert any("fixed to [1, 3, 16, 16]" in f for f in c.facts)  # the free batch, fixed from the data
    again, _ = open_inputs(files / "cnn.onnx", files / "data.npz")
    assert again.conversion.cached and again.content == src.content  # converted once, then reused


def test_channel_last_io_takes_nhwc_and_keeps_the_data_in_nchw(files):
    from optimize.convert import fidelity as conversion

    src, ds = open_inputs(files / "cnn.onnx", files / "data.npz", layout="channels-last")
    assert src.inputs[0].shape == (1, 16, 16, 3) and ds.x_test.shape[1:] == (16, 16, 3)
    c = conversion.measure(src, ds).conversion
    assert c.layout == "channels-last" and c.inputs[0].layout == "NHWC" and c.inputs[0].source_shape == [1, 3, 16, 16]
    assert c.fidelity.relative_error < 1e-5  # compared with ONNX Runtime fed the same data in NCHW
    nchw, _ = open_inputs(files / "cnn.onnx", files / "data.npz")
    assert c.transposes < nchw.conversion.transposes  # the input's layout TRANSPOSE is gone
    assert src.fingerprint != nchw.fingerprint  # cached apart


def test_an_nn_module_from_python(cnn, files):
    src, ds = open_inputs(cnn, files / "data.npz", check=True)
    assert src.kind == "pt2" and src.name == "SmallCNN" and src.inputs[0].name == "x"
    with_sample, _ = open_inputs((cnn, (torch.zeros(1, 3, 16, 16),)), None)
    assert with_sample.inputs[0].shape == (1, 3, 16, 16)


def test_an_nn_modules_export_leaves_nothing_in_the_temp_folder(tmp_path):
    """The .pt2 an nn.Module is exported to (what the run's workers read) is removed when the process ends."""
    import os
    import subprocess
    import sys
    import textwrap

    script = tmp_path / "module.py"
    script.write_text(
        textwrap.dedent(
            """
            import torch
            from optimize.convert.front import open_inputs

            class Twice(torch.nn.Module):
                def forward(self, x):
                    return x * 2

            src, _ = open_inputs((Twice(), (torch.zeros(1, 4),)), None)
            assert src.kind == "pt2" and src.path.exists()
            """
        )
    )
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp)}
    r = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert not list(tmp.glob("optimize-module-*"))


def test_a_batch_axis_that_is_not_first(tmp_path):
    """The state's rows are whole inputs ([2, 1, 8] each); the .tflite takes them with a leading 1, and its
    state output comes back the same way, ready to feed back."""
    from optimize.convert import fidelity as conversion

    torch.manual_seed(1)
    rng = np.random.default_rng(1)
    np.savez(tmp_path / "d.npz", **{"x:audio": rng.normal(size=(12, 12)).astype(np.float32),
                                    "x:state": rng.normal(size=(12, 2, 1, 8)).astype(np.float32)})  # fmt: skip
    sample = (torch.zeros(1, 12), torch.zeros(2, 1, 8))  # what says which axis is the batch's
    src, ds = open_inputs((Recurrent().eval(), sample), tmp_path / "d.npz", check=True)
    shapes = {i.name: i.shape for i in src.inputs}
    assert shapes == {"audio": (1, 12), "state": (1, 2, 1, 8)}
    c = conversion.measure(src, ds).conversion
    assert c.whole_outputs == ["output_1"] and c.fidelity.relative_error < 1e-5


def test_a_scalar_configuration_input_is_frozen(tmp_path):
    """An ONNX input that is one value in every sample (a sample rate) becomes a constant of the graph."""
    from onnx import TensorProto, helper, numpy_helper

    then_g = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["t"])], "then", [], [helper.make_tensor_value_info("t", 1, None)]
    )
    else_g = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["e"])], "else", [], [helper.make_tensor_value_info("e", 1, None)]
    )
    nodes = [
        helper.make_node("Equal", ["sr", "k"], ["c"]),
        helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g),
    ]
    g = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", 1, ["n", 4]), helper.make_tensor_value_info("sr", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("y", 1, None)], [numpy_helper.from_array(np.array(16000, np.int64), "k")],
    )  # fmt: skip
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 16)])
    m.ir_version = 8
    (tmp_path / "vad.onnx").write_bytes(m.SerializeToString())
    x = np.random.default_rng(0).normal(size=(10, 4)).astype(np.float32)
    np.savez(tmp_path / "d.npz", **{"x:x": x, "x:sr": np.full(10, 16000, np.int64)})
    src, ds = open_inputs(tmp_path / "vad.onnx", tmp_path / "d.npz", check=True)
    assert [i.name for i in src.inputs] == ["x"] and src.conversion.frozen == {"sr": 16000}
    assert set(ds.x_test) == {"x"}
    np.savez(tmp_path / "d2.npz", **{"x:x": x, "x:sr": np.where(np.arange(10) % 2, 8000, 16000)})
    with pytest.raises(ModelError, match="If node .* branches on a value computed at run time"):
        open_inputs(tmp_path / "vad.onnx", tmp_path / "d2.npz")


# ------------------------------------------------------------------------------------------- int8 routes


def test_both_int8_routes_side_by_side(files, tmp_path):
    from optimize.core.recipe import build
    from optimize.engine import single

    made = {}
    for name, steps in (
        ("int8", [{"technique": "quantize", "scheme": "int8"}]),
        ("int8-pt2e", [{"technique": "pt2e", "samples": 16}]),
    ):
        cand = single.run(build(name, steps), files / "cnn.onnx", files / "data.npz", tmp_path / name, jobs=0)
        assert cand.ok, cand.error
        made[name] = cand
    assert made["int8"].backend == "litert" and made["int8-pt2e"].backend == "pt2e"
    for c in made.values():
        assert c.scheme == "int8" and c.composition.shrink < 0.5
        assert c.metrics.fidelity.relative_error < 0.05
        assert c.notes[0].startswith("conversion of cnn.onnx")
    # the note says what the artifact's edges hold, read from it (this CNN's softmax output stays float32)
    from optimize.transforms.pt2e import io_words

    pt2e = made["int8-pt2e"]
    edges = io_words((tmp_path / "int8-pt2e" / pt2e.artifact).read_bytes())
    assert edges.startswith("int8 input") and any(edges in n for n in pt2e.notes), (edges, pt2e.notes)


@pytest.mark.slow
def test_a_sweep_of_a_pt2(files, tmp_path, cli):
    out = tmp_path / "out"
    r = cli(
        "sweep",
        str(files / "cnn.pt2"),
        "-d",
        str(files / "data.npz"),
        "-o",
        str(out),
        "-j",
        "2",
        "--layout",
        "channels-last",
    )
    assert r.returncode == 0, r.stderr[-3000:]
    study = json.loads((out / "study.json").read_text())
    names = [c["name"] for c in study["candidates"]]
    assert names[:7] == ["float32", "float16", "dynamic", "int8", "int8-pt2e", "int8-int8io", "int16x8"]
    backends = {c["name"]: c["backend"] for c in study["candidates"]}
    assert backends["int8"] == "litert" and backends["int8-pt2e"] == "pt2e"
    assert study["conversion"]["layout"] == "channels-last" and study["conversion"]["fidelity"]["samples"] == 8
    assert study["dropped"][0]["recipes"] == ["prune-int8", "cluster-int8", "prune-cluster-int8", "qat-int8"]
    assert "conversion of cnn.pt2" in r.stdout and "TRANSPOSE" not in r.stdout.split("conversion of")[0]
    assert not too_wide(r.stdout), too_wide(r.stdout)  # a path longer than a line stands whole on its own
    assert cli("report", str(out / "study.json")).returncode == 0
    md = (out / "report.md").read_text()
    assert "## Conversion" in md and "| output | rel err | max abs diff | agree |" in md
    assert 'id="conversion"' in (out / "report.html").read_text()
    again = cli(
        "sweep",
        str(files / "cnn.pt2"),
        "-d",
        str(files / "data.npz"),
        "-o",
        str(tmp_path / "again"),
        "--layout",
        "channels-last",
        "--json",
    )
    assert all(c["cached"] for c in json.loads(again.stdout)["candidates"])  # keyed by the source's fingerprint


# ------------------------------------------------------------------------------------------- bad input, one line


def test_state_dicts_checkpoints_and_torchscript_are_named(cnn, tmp_path, cli):
    torch.save(cnn.state_dict(), tmp_path / "weights.pth")
    assert_one_line_error(cli("compat", str(tmp_path / "weights.pth")), "is a state dict", "torch.export.save")
    torch.save({"step": 3, "model_state": cnn.state_dict()}, tmp_path / "ckpt.pt")
    assert_one_line_error(cli("sweep", str(tmp_path / "ckpt.pt")), "a training checkpoint", "torch.export.save")
    torch.jit.save(torch.jit.script(cnn), str(tmp_path / "scripted.pt"))
    assert_one_line_error(cli("compat", str(tmp_path / "scripted.pt")), "TorchScript is not read", "torch.export.save")


def test_a_pt2_from_another_torch(files, tmp_path):
    other = tmp_path / "other.pt2"
    with zipfile.ZipFile(files / "cnn.pt2") as zi, zipfile.ZipFile(other, "w") as zo:
        for info in zi.infolist():
            data = zi.read(info.filename)
            if info.filename.endswith("models/model.json"):
                meta = json.loads(data)
                meta["schema_version"], meta["torch_version"] = {"major": 7, "minor": 3}, "2.5.1"
                data = json.dumps(meta).encode()
            zo.writestr(info, data)
    with pytest.raises(ModelError, match=r"written by torch 2\.5\.1 \(export schema 7\.3\)") as e:
        open_inputs(other, files / "data.npz")
    assert "Export it again with this torch" in str(e.value)


def test_onnx_ops_the_route_cannot_convert_are_named(tmp_path, cli):
    from onnx import helper

    node = helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "s", "z"], name="quant_in")
    g = helper.make_graph(
        [node], "q", [helper.make_tensor_value_info("x", 1, [4])], [helper.make_tensor_value_info("y", 2, None)]
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 12)])
    (tmp_path / "quantized.onnx").write_bytes(m.SerializeToString())
    assert_one_line_error(
        cli("compat", str(tmp_path / "quantized.onnx")),
        "no converter for 1 ONNX op(s): DynamicQuantizeLinear (opset 12, node quant_in)",
    )


class Gate(torch.nn.Module):
    def forward(self, x):
        if x.sum() > 0:  # a Python branch on tensor data: torch.export cannot trace it
            return x * 2
        return x


def test_a_model_torch_export_cannot_trace_says_where(tmp_path):
    np.savez(tmp_path / "d.npz", x=np.ones((4, 3), np.float32))
    with pytest.raises(
        ModelError, match=r"torch.export cannot trace Gate: .*at test_torch\.py:\d+ in forward \(if x\.sum\(\) > 0"
    ):
        open_inputs(Gate(), tmp_path / "d.npz")


def test_without_torch_the_extra_is_named(files, cli):
    hide = "import sys; sys.modules['torch'] = None; sys.modules['litert_torch'] = None; from optimize.cli import main; main()"
    for model in ("cnn.pt2", "cnn.onnx"):
        r = subprocess.run(
            [sys.executable, "-c", hide, "compat", str(files / model)], capture_output=True, text=True, timeout=300
        )
        assert_one_line_error(r, "needs torch, litert_torch", 'pip install -e ".[torch]"')


def test_pruning_clustering_and_qat_say_why_not(files, cli):
    r = cli("prune", str(files / "cnn.onnx"), "--data", str(files / "data.npz"))
    assert_one_line_error(r, "pruning, clustering and QAT fine-tune Keras models (tfmot)", "fine-tune in PyTorch")
    r = cli("qat", str(files / "cnn.pt2"), "--data", str(files / "data.npz"))
    assert_one_line_error(r, "a PyTorch, ONNX or TF1 graph model has none")


def test_data_that_does_not_fit_is_one_line(files, tmp_path):
    np.savez(tmp_path / "bad.npz", x=np.zeros((4, 3, 9, 9, 2), np.float32))
    with pytest.raises(DataError, match="input x"):
        open_inputs(files / "cnn.onnx", tmp_path / "bad.npz")
    with pytest.raises(OptimizeError, match="free dimensions"):
        open_inputs(files / "cnn.onnx", None)


def test_pt2e_is_for_pytorch_models(float_tflite, data_npz, cli, tmp_path):
    r = cli("quantize", str(float_tflite), "-c", str(data_npz), "--backend", "pt2e", "-o", str(tmp_path / "o"))
    assert_one_line_error(r, "pt2e quantizes a PyTorch or ONNX model's torch graph")


# ------------------------------------------------------------------------------------------- untrusted files


class _Payload:
    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        import builtins

        return (builtins.exec, (f"open({self.marker!r}, 'w').write('ran')",))


def _with_member(src: Path, dst: Path, edit) -> None:
    """A copy of a zip with `edit(name, data, extra)` changing members (and adding to `extra`)."""
    with zipfile.ZipFile(src) as zi, zipfile.ZipFile(dst, "w") as zo:
        extra: dict[str, bytes] = {}
        for info in zi.infolist():
            zo.writestr(info, edit(info.filename, zi.read(info.filename), extra))
        for name, data in extra.items():
            zo.writestr(name, data)


def _evil(files: Path, tmp_path: Path) -> dict[str, tuple[Path, Path]]:
    """{variant: (.pt2, marker)}: a pickle payload as the sample inputs (torch.export.load falls back to full
    unpickling for it), and as an opaque-object constant (read with plain pickle.loads)."""
    out = {}
    m = tmp_path / "MARKER_sample_inputs"
    payload = pickle.dumps(_Payload(str(m)), protocol=2)
    _with_member(
        files / "cnn.pt2",
        tmp_path / "evil_inputs.pt2",
        lambda n, d, x: payload if n.endswith("data/sample_inputs/model.pt") else d,
    )
    out["sample_inputs"] = (tmp_path / "evil_inputs.pt2", m)
    m2 = tmp_path / "MARKER_opaque"
    payload2 = pickle.dumps(_Payload(str(m2)), protocol=2)

    def opaque(n, d, extra):
        if n.endswith("data/constants/model_constants_config.json"):
            cfg = json.loads(d)
            cfg["config"]["evil"] = {
                "path_name": "opaque_obj_0",
                "is_param": False,
                "use_pickle": True,
                "tensor_meta": None,
            }
            extra[n.rsplit("/", 1)[0] + "/opaque_obj_0"] = payload2
            return json.dumps(cfg).encode()
        return d

    _with_member(files / "cnn.pt2", tmp_path / "evil_constant.pt2", opaque)
    out["opaque_constant"] = (tmp_path / "evil_constant.pt2", m2)
    return out


def test_a_pt2_carrying_a_pickle_payload_is_refused_and_never_runs(files, tmp_path, cli):
    for path, marker in _evil(files, tmp_path).values():
        r = cli("sweep", str(path), "-d", str(files / "data.npz"), "-o", str(tmp_path / "out"))
        assert_one_line_error(r, path.name)
        assert "refused" in r.stderr and not marker.exists()
        with pytest.raises(ModelError, match="refused"):  # the Python API, in this process
            open_inputs(path, files / "data.npz")
        assert not marker.exists()
        assert not (tmp_path / "out").exists()
    plain = subprocess.run(  # torch's own loader runs it: what the inspection guards against
        [sys.executable, "-c", "import sys, torch; torch.export.load(sys.argv[1])", str(tmp_path / "evil_inputs.pt2")],
        capture_output=True, text=True, timeout=300, env={k: v for k, v in os.environ.items() if k != "TORCH_FORCE_WEIGHTS_ONLY_LOAD"},
    )  # fmt: skip
    assert (tmp_path / "MARKER_sample_inputs").exists(), plain.stderr[-500:]

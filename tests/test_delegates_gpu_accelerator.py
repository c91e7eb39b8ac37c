"""The GPU column against LiteRT's real GPU accelerator, where this machine can run it.

ai-edge-litert's CompiledModel has a GPU accelerator (libLiteRtWebGpuAccelerator.so: ML Drift on WebGPU,
Dawn underneath). Without a GPU it runs on a software Vulkan device: Mesa's lavapipe from Mesa 25
(Debian bookworm-backports); lavapipe 22.3 is refused by Dawn (docs/platform-notes.md). Each model runs
in a subprocess (a driver problem must not take the test run down) on the GPU alone and on the CPU, with
the same seeded input. Skipped when no such device is found.

The accelerator is ML Drift, not the classic TfLiteGpuDelegateV2 whose rules `gpu.py` follows, so it
confirms the models both take whole and the outputs the GPU computes; where the two delegates differ,
the test pins the difference instead of hiding it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from delegate_fixtures import models_fixture  # noqa: F401  (the session fixture `models`)

from optimize.delegates import check_delegates

pytestmark = pytest.mark.slow

ICDS = [Path("/usr/share/vulkan/icd.d/lvp_icd.json"), Path("/usr/share/vulkan/icd.d/lvp_icd.x86_64.json")]

PROBE = r"""
import json, sys, numpy as np
from ai_edge_litert.compiled_model import CompiledModel
from ai_edge_litert.hardware_accelerator import HardwareAccelerator as HA

def run(model, x):
    sig = list(model.get_signature_list())[0]
    inp, out = model.create_input_buffers(0), model.create_output_buffers(0)
    for buf, arr in zip(inp, x):
        buf.write(arr)
    model.run_by_index(0, inp, out)
    det = model.get_output_tensor_details(sig)
    return [b.read(int(np.prod(d["shape"])), d["dtype"]).reshape(d["shape"]) for d, b in zip(det.values(), out)]

path, accel = sys.argv[1], {"gpu": HA.GPU, "gpu+cpu": HA.GPU | HA.CPU}[sys.argv[2]]
gpu = CompiledModel.from_file(path, hardware_accel=accel)
cpu = CompiledModel.from_file(path, hardware_accel=HA.CPU)
sig = list(cpu.get_signature_list())[0]
rng = np.random.default_rng(0)
xs = [rng.standard_normal(d["shape"]).astype(d["dtype"]) if np.dtype(d["dtype"]).kind == "f"
      else rng.integers(-5, 5, d["shape"]).astype(d["dtype"]) for d in cpu.get_input_tensor_details(sig).values()]
g, c = run(gpu, xs), run(cpu, xs)
diff = max(float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))) for a, b in zip(g, c))
scale = max(float(np.max(np.abs(b.astype(np.float64)))) for b in c)
print("JSON" + json.dumps({"max_abs_diff": diff, "max_abs_cpu": scale}))
"""


def _probe(path: Path, accel: str, icd: Path) -> tuple[dict | None, str]:
    env = {**os.environ, "VK_ICD_FILENAMES": str(icd)}
    r = subprocess.run(
        [sys.executable, "-c", PROBE, str(path), accel], capture_output=True, text=True, env=env, timeout=300
    )
    lines = [ln[4:] for ln in r.stdout.splitlines() if ln.startswith("JSON")]
    return (json.loads(lines[0]) if lines else None), r.stderr


@pytest.fixture(scope="module")
def icd(models, tmp_path_factory) -> Path:
    """A software Vulkan driver the accelerator accepts, or skip; CI sets one up (.ci/run) and says so with
    OPTIMIZE_REQUIRE_GPU_DEVICE, and then a missing device fails instead of skipping."""
    path = tmp_path_factory.mktemp("gpu") / "float32.tflite"
    path.write_bytes(models["float32"])
    for icd in ICDS:
        if icd.is_file():
            result, log = _probe(path, "gpu", icd)
            if result is not None:
                return icd
    why = "no Vulkan device the LiteRT GPU accelerator accepts (see docs/platform-notes.md)"
    if os.environ.get("OPTIMIZE_REQUIRE_GPU_DEVICE"):
        pytest.fail(f"{why}, although .ci/run set Mesa's lavapipe up")
    pytest.skip(why)


def _write(models, name: str, tmp_path: Path) -> Path:
    path = tmp_path / f"{name}.tflite"
    path.write_bytes(models[name])
    return path


@pytest.mark.parametrize("name", ["float32", "float16", "int8", "dynamic", "greater_cast", "reshape"])
def test_models_the_rules_delegate_whole_run_whole_on_the_gpu(models, icd, name, tmp_path):
    """The rules say 'full'; the accelerator compiles the model with the GPU alone (no CPU fallback) and
    its outputs match the CPU's within float16 precision. An 8-bit model's integer output may differ by one
    quantization step: ML Drift dequantizes and computes in float, so a value on a rounding boundary can land
    on either side (CI saw 1 step in 84 once; never more)."""
    assert check_delegates(models[name], ["gpu"])["gpu"].verdict == "full"
    result, log = _probe(_write(models, name, tmp_path), "gpu", icd)
    assert result is not None, log[-2000:]
    assert "Following operations are not supported" not in log
    if name == "int8":
        assert result["max_abs_diff"] <= 1.0, result
    else:
        assert result["max_abs_diff"] <= 2e-3 * max(result["max_abs_cpu"], 1.0), result


def test_rank5_stays_on_the_cpu(models, icd, tmp_path):
    """Both refuse rank-5 tensors; with a CPU fallback allowed the accelerator runs nothing on the GPU."""
    assert check_delegates(models["rank5"], ["gpu"])["gpu"].verdict == "none"
    result, log = _probe(_write(models, "rank5", tmp_path), "gpu+cpu", icd)
    assert result is not None and "No operations will run on the GPU" in log


def test_where_ml_drift_differs_from_the_classic_delegate(models, icd, tmp_path):
    """Pinned differences (the rules follow the classic delegate): ML Drift also takes a comparison whose
    bool output is a graph output (model_builder.cc:1073-1092 refuses it), and an int16 ADD of an int16x8
    model (the classic delegate's type gate refuses int16, model_builder.cc:3318-3350)."""
    assert check_delegates(models["greater_out"], ["gpu"])["gpu"].verdict == "partial"
    result, log = _probe(_write(models, "greater_out", tmp_path), "gpu", icd)
    assert result is not None and result["max_abs_diff"] == 0.0
    assert check_delegates(models["int16x8"], ["gpu"])["gpu"].nodes_delegated == 0
    result, log = _probe(_write(models, "int16x8", tmp_path), "gpu+cpu", icd)
    assert result is not None and "1 operations will run on the GPU" in log


# ---- the observed column (issue 21): optimize.delegates.observe beside the rules ---------------------------


def _int4(weight_only: bool) -> bytes:
    """FULLY_CONNECTED with channel-wise int4 weights, read directly (dynamic int4, what the int4 scheme makes)
    or through a DEQUANTIZE (LiteRT Quantizer's weight-only int4)."""
    import numpy as np
    from delegate_fixtures import op, tensor, tiny

    w = np.random.default_rng(0).integers(-7, 8, (16, 32))
    tensors = [tensor([1, 32]), tensor([16, 32], "int4", w, quant=([0.05] * 16, [0] * 16)), tensor([1, 16])]
    fc = ("FullyConnectedOptions", {})
    if not weight_only:
        return tiny(tensors, [op("FULLY_CONNECTED", [0, 1, -1], [2], fc)], [0], [2])
    tensors.append(tensor([16, 32]))
    ops = [op("DEQUANTIZE", [1], [3]), op("FULLY_CONNECTED", [0, 3, -1], [2], fc)]
    return tiny(tensors, ops, [0], [2])


def test_observed_column_beside_the_rules(models, icd):
    """compat --observe gpu: the accelerator's own verdict, source runtime, next to the prediction. Agreement
    on the models both take whole, and on a partial one (a rank-5 tail the two refuse alike)."""
    from optimize.delegates.observe import OBSERVED

    for name in ("float32", "int8", "rank5"):
        r = check_delegates(models[name], ["gpu"], observe=["gpu"])
        seen = r[OBSERVED["gpu"]]
        assert seen.source == "runtime" and "ML Drift" in seen.rules_version
        assert (seen.verdict, seen.nodes_total) == (r["gpu"].verdict, r["gpu"].nodes_total), name
        assert seen.nodes_delegated == r["gpu"].nodes_delegated, name


def test_int4_weights_where_ml_drift_and_the_classic_delegate_part(icd):
    """The classic delegate's float reader has no int4 (model_builder_helper.cc:259-281): the rules predict a
    build failure. ML Drift reads 4-bit weights and runs the dynamic int4 model whole on the GPU (pinned: an app
    on the CompiledModel API gets the GPU; one on the Interpreter API's GPU delegate does not). Through a
    DEQUANTIZE (weight-only int4) ML Drift fails to build too, as the rules predict."""
    from optimize.delegates.observe import OBSERVED

    direct = check_delegates(_int4(False), ["gpu"], observe=["gpu"])
    assert direct["gpu"].veto_code == "build-failure" and direct[OBSERVED["gpu"]].verdict == "full"
    dequantized = check_delegates(_int4(True), ["gpu"], observe=["gpu"])
    assert dequantized["gpu"].veto_code == "build-failure"
    seen = dequantized[OBSERVED["gpu"]]
    assert (seen.verdict, seen.veto_code) == ("none", "build-failure") and "failed to build" in seen.vetoed


def test_sweep_observes_every_candidate(keras_model, data_npz, tmp_path, icd):
    """sweep --observe gpu: each candidate carries the observed column, shown beside the predicted one (on a
    machine with a device the accelerator accepts: `icd` skips, saying why, elsewhere)."""
    import optimize
    from optimize.core.recipe import build
    from optimize.delegates.observe import OBSERVED
    from optimize.present.report_text import _columns

    recipes = [build("float16", [{"technique": "convert", "scheme": "float16"}])]
    study = optimize.sweep(
        keras_model, data_npz, tmp_path, recipes=recipes, jobs=0, runs=3, cache=False, observe=("gpu",)
    )
    for c in study.candidates:
        seen = c.delegates[OBSERVED["gpu"]]
        assert seen.verdict == c.delegates["gpu"].verdict == "full", c.name
    assert "gpu seen" in [col.header for col in _columns(study.candidates, 200, True)]

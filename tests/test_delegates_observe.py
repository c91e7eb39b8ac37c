"""optimize.delegates.observe without a device: reading the accelerator's log, the clear line where no Vulkan
device exists, and refusing what cannot be observed. (With a device: tests/test_delegates_gpu_accelerator.py.)"""

from __future__ import annotations

import numpy as np
import pytest
from delegate_fixtures import op, tensor, tiny

from optimize.core.errors import OptimizeError
from optimize.delegates import check_delegates, format_report
from optimize.delegates import observe as obs

# The accelerator's own words (ai-edge-litert 2.3.0, ML Drift on lavapipe), as captured on this machine.
PARTIAL = [
    "INFO: [compiled_model.cc:829] Flatbuffer model initialized directly from incoming litert model.",
    "ERROR: Following operations are not supported by GPU delegate:",
    "LOG_SOFTMAX: Operation is not supported.",
    "2 operations will run on the GPU, and the remaining 2 operations will run on the CPU.",
    "I0000 00:00:1795470440.439227   15973 delegate_kernel.cc:984] Initializing WebGPU-based API from graph.",
]
FAILED = [
    "third_party/odml/litert/ml_drift/delegate/delegate_kernel_litert.cc:143",
    "ERROR: Failed to initialize kernel.",
    "ERROR: Restored original execution plan after delegate application failure.",
]


def test_the_accelerators_log_is_read():
    assert obs._refused(PARTIAL) == [("LOG_SOFTMAX", "Operation is not supported.")]
    assert obs._counts({"compiled": True, "full": False}, PARTIAL, 4) == (2, 4, None)
    assert obs._counts({"compiled": True, "full": True}, [], 3) == (3, 3, None)
    got, total, why = obs._counts({"compiled": False, "error": "└ Failed to modify graph with delegate"}, FAILED, 6)
    assert (got, total) == (
        0,
        6,
    ) and why == "the accelerator failed to build its graph (Failed to modify graph with delegate)"
    assert obs._counts({"compiled": False, "error": "no answer within 300 s"}, [], 2)[2].startswith(
        "the accelerator refused"
    )


@pytest.fixture
def no_device(monkeypatch, tmp_path):
    monkeypatch.setattr(obs, "ICDS", (tmp_path / "none.json",))
    monkeypatch.delenv("VK_ICD_FILENAMES", raising=False)
    obs.gpu_device.cache_clear()
    yield
    obs.gpu_device.cache_clear()


def _model() -> bytes:
    return tiny(
        [tensor([1, 4]), tensor([4], data=np.ones(4, np.float32)), tensor([1, 4])], [op("ADD", [0, 1], [2])], [0], [2]
    )


def test_without_a_device_the_rules_stand_alone_and_compat_says_so(no_device, tmp_path):
    from typer.testing import CliRunner

    from optimize.cli import app

    reports = check_delegates(_model(), ["gpu"], observe=["gpu"])
    assert list(reports) == ["gpu"] and obs.gpu_device() is None
    path = tmp_path / "m.tflite"
    path.write_bytes(_model())
    r = CliRunner().invoke(app, ["compat", str(path), "--delegate", "gpu", "--observe", "gpu"], env={"NO_COLOR": "1"})
    assert r.exit_code == 0, r.output
    assert r.output.rstrip().endswith(obs.UNAVAILABLE)
    assert " ".join(format_report(reports).split()) in " ".join(r.output.split())  # wrapped to the terminal


def test_only_the_gpu_can_be_observed():
    with pytest.raises(OptimizeError, match="nnapi cannot be observed here"):
        check_delegates(_model(), ["gpu"], observe=["nnapi"])
    assert obs.check("gpu, gpu") == ["gpu"] and obs.check(()) == []


def test_the_probe_model_is_valid():
    """The one-op model the device check compiles is a model the interpreter runs."""
    from optimize.models import runtime

    runtime.load(obs._tiny_model(), xnnpack=False).interpreter.invoke()

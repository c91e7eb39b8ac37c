"""The robustness probe: a candidate that breaks on inputs its float model handles is a failed candidate.

The seeded model divides a dense layer's output by the mean |x| of its input plus 1e-3 (an input-derived
divisor, as an audio model's loudness normalisation has). In float32 all-zero input (digital silence)
divides by 1e-3 and is fine; in int8 that divisor rounds to its zero point and the DIV kernel refuses to
invoke (`div.cc:262 data[i] != zero_point`). Real samples never show it. Here the quantizer's output is
taken as it is (`repair = false`); the failure rescue that makes it run is tests/test_repair.py's.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from tests_support import one_line_error

from optimize.core.recipe import build
from optimize.measure import memory, probe
from optimize.models import _tf, runtime
from optimize.models.data import load_data


def _divide_by_input(tmp_path_factory) -> bytes:
    tf = _tf.tf()
    rng = np.random.default_rng(0)
    w1 = tf.constant(rng.normal(size=(64, 16)).astype(np.float32))
    w2 = tf.constant(rng.normal(size=(16, 4)).astype(np.float32))

    class M(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([1, 64], tf.float32, name="x")])
        def serve(self, x):
            loud = tf.reduce_mean(tf.abs(x), axis=-1, keepdims=True) + 1e-3
            return {"y": tf.matmul(tf.matmul(x, w1) / loud, w2)}

    m = M()
    return tf.lite.TFLiteConverter.from_concrete_functions([m.serve.get_concrete_function()], m).convert()


@pytest.fixture(scope="module")
def div_model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("div")
    model = folder / "div.tflite"
    model.write_bytes(_divide_by_input(tmp_path_factory))
    np.savez(folder / "audio.npz", x=np.random.default_rng(1).normal(size=(120, 64)).astype(np.float32))
    np.savez(folder / "silence.npz", x=np.zeros((8, 64), np.float32))
    return model, folder / "audio.npz", folder / "silence.npz"


@pytest.fixture(scope="module")
def div_sweep(div_model, tmp_path_factory):
    from optimize.engine import sweeps

    model, data, _ = div_model
    recipes = [build("int8", [{"technique": "quantize", "scheme": "int8", "repair": False}])]
    out = tmp_path_factory.mktemp("div-sweep")
    return sweeps.sweep(model, data, out, recipes=recipes, delegates=False, runs=3, jobs=0, cache=False), out


def test_int8_failing_on_silence_is_a_failed_candidate_naming_the_op(div_sweep):
    study, out = div_sweep
    base, int8 = study.candidates
    assert base.ok and base.probe is not None and base.probe.ok, base
    assert set(base.probe.inputs) >= {"all-zero input", "real sample 0", "random values in the data's range"}
    assert not int8.ok and int8.error_kind == "ProbeFailed"
    assert int8.error.startswith("fails on all-zero input: DIV node ")
    assert "data[i] != zero_point" in int8.error
    (failure,) = [f for f in int8.probe.failures if f.input == "all-zero input"]
    assert failure.kind == "invoke" and failure.op == "DIV" and isinstance(failure.node, int)
    assert not (out / "int8.tflite").exists()  # a failed candidate leaves no artifact
    saved = json.loads((out / "study.json").read_text())["candidates"][1]
    assert saved["probe"]["failures"][0]["op"] == "DIV"


def test_a_failed_probe_is_never_recommended(div_sweep):
    from optimize.decide.choose import recommend

    study, _ = div_sweep
    for target in ("cpu", "mcu"):
        try:
            rec = recommend(study, target=target)
        except Exception:  # noqa: BLE001 - "nothing fits" is fine; picking the broken int8 is not
            continue
        assert rec.chosen != "int8" and "int8" not in rec.ranked


def test_evaluate_on_silence_is_one_line_naming_the_node(div_model, div_sweep, tmp_path, cli):
    from optimize.core.registry import Context, get

    model, data, silence = div_model
    tech = get("quantize")
    made = tech.fn(model, tech.params(scheme="int8", repair=False), Context(workdir=tmp_path, data=load_data(data)))
    made.rename(tmp_path / "q.tflite")
    r = cli("evaluate", str(tmp_path / "q.tflite"), "--data", str(silence))
    line = one_line_error(r, "q.tflite fails to invoke on test sample 0 of silence.npz", "DIV node")
    assert "zero_point" in line
    peak = memory.peak_memory_bytes(tmp_path / "q.tflite", 1, np.zeros((1, 64), np.float32))
    assert isinstance(peak, str) and "DIV" in peak  # the memory probe says why, never just nothing
    assert isinstance(memory.peak_memory_bytes(tmp_path / "q.tflite", 1, load_data(data).x_test[:1]), int)


def test_inputs_the_float_model_fails_on_are_not_held_against_the_candidate(tmp_path):
    """x / sum(x) is NaN on zeros in float32 too: listed as the reference's failure, not the candidate's."""
    from delegate_fixtures import from_function

    tf = _tf.tf()
    content = from_function(lambda x: x / tf.reduce_sum(x), tf.TensorSpec([1, 8], tf.float32))
    model = tmp_path / "ratio.tflite"
    model.write_bytes(content)
    np.savez(tmp_path / "d.npz", x=np.random.default_rng(0).random((20, 8)).astype(np.float32) + 0.1)
    ds = load_data(tmp_path / "d.npz")
    runner = runtime.Runner(runtime.load(model, threads=1))
    alone = probe.run(runner, ds)
    assert [f.input for f in alone.failures] == ["all-zero input"]
    assert alone.failures[0].kind == "non-finite" and "NaN" in alone.failures[0].message
    compared = probe.run(runner, ds, reference=model, threads=1)
    assert compared.ok and compared.reference_failures == ["all-zero input"]
    assert compared.line == f"passed ({len(compared.inputs)} inputs)"


def test_runtime_errors_are_read_into_node_op_and_message():
    f = runtime.invoke_failure(
        "tensorflow/lite/kernels/div.cc:262 data[i] != zero_point was not true.Node number 7 (DIV) failed to invoke."
    )
    assert (f.node, f.op) == (7, "DIV")
    assert str(f) == "DIV node 7 (div.cc:262 data[i] != zero_point was not true)"
    other = runtime.invoke_failure("something else went wrong")
    assert (other.node, other.op, str(other)) == (None, None, "something else went wrong")


def test_a_deterministic_failure_is_cached_and_served_again(div_model, tmp_path):
    """The failed int8 (probe), like every failure of the technique's own, is remembered: an unchanged
    re-run produces nothing, the failure comes back from the cache with its reason and probe."""
    from optimize.engine import sweeps

    model, data, _ = div_model
    recipes = [build("int8", [{"technique": "quantize", "scheme": "int8", "repair": False}])]
    cold = sweeps.sweep(model, data, tmp_path / "a", recipes=recipes, delegates=False, runs=3, jobs=0)
    warm = sweeps.sweep(model, data, tmp_path / "b", recipes=recipes, delegates=False, runs=3, jobs=0)
    assert [c.cached for c in cold.candidates] == [False, False]
    assert [c.cached for c in warm.candidates] == [True, True]
    assert warm.candidates[1].error == cold.candidates[1].error and warm.candidates[1].probe.failures

"""Variable-size inputs: a .tflite whose input is [-1, -1] (a batch of signals of any length) sweeps.

The runtime allocates such an input at [1, 1]; this model frames the signal with two strided convolutions,
so at length 1 XNNPACK fails to reshape and the model does not even load. Every interpreter is resized to
the data's shape before it is allocated (measurement, the probe, the memory probe, the XNNPACK column);
LiteRT Quantizer's calibrator, which allocates at the default shape, gives way to the TFLite calibrator.
Without data, the failure names the free dimensions.
"""

from __future__ import annotations

import numpy as np
import pytest

from optimize.core.errors import ModelError
from optimize.models import _tf, runtime


@pytest.fixture(scope="module")
def framed(tmp_path_factory):
    tf = _tf.tf()
    rng = np.random.default_rng(0)
    w1 = tf.constant(rng.normal(size=(3, 1, 16)).astype(np.float32))
    w2 = tf.constant(rng.normal(size=(3, 16, 16)).astype(np.float32) / 4)
    w3 = tf.constant(rng.normal(size=(16, 4)).astype(np.float32))

    class Framed(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, None], tf.float32, name="audio")])
        def serve(self, x):
            h = tf.nn.relu(tf.nn.conv1d(tf.expand_dims(x, -1), w1, stride=2, padding="VALID"))
            h = tf.nn.relu(tf.nn.conv1d(h, w2, stride=2, padding="VALID"))
            return {"scores": tf.matmul(tf.reduce_mean(h, axis=1), w3)}

    m = Framed()
    folder = tmp_path_factory.mktemp("framed")
    model = folder / "framed.tflite"
    model.write_bytes(tf.lite.TFLiteConverter.from_concrete_functions([m.serve.get_concrete_function()], m).convert())
    np.savez(folder / "clips.npz", x=rng.normal(size=(48, 100)).astype(np.float32))
    return model, folder / "clips.npz"


def test_a_minus_one_minus_one_input_tflite_sweeps(framed, tmp_path):
    from optimize.engine import sweeps

    model, data = framed
    with pytest.raises(ModelError, match=r"input audio \[-1, -1\] has free dimensions"):
        runtime.load(model)  # at [1, 1] it cannot even be prepared
    study = sweeps.sweep(model, data, tmp_path / "out", delegates=True, runs=3, jobs=0, cache=False)
    by = {c.name: c for c in study.candidates}
    for name in ("float32", "float16", "int8"):
        c = by[name]
        assert c.ok, (name, c.error)
        assert c.probe.ok and c.metrics.memory is not None and (name == "float32" or c.metrics.fidelity)
        assert c.delegates["xnnpack"].nodes_delegated > 0, c.delegates["xnnpack"]  # observed at the data's shape
    assert by["int8"].backend == "calibrator" and any("free dimensions" in n for n in by["int8"].notes)
    assert by["int8"].metrics.fidelity.relative_error < 0.1


def test_without_data_the_free_dimensions_are_named(framed, cli):
    model, _ = framed
    r = cli("compat", str(model), "--delegate", "xnnpack")
    assert r.returncode == 0, r.stderr
    assert "input audio [-1, -1] has free dimensions" in r.stdout.replace("\n", " ")


def test_the_runner_resizes_to_each_sample(framed):
    model, data = framed
    x = np.load(data)["x"]
    loaded = runtime.load(model, like=x[:1])
    runner = runtime.Runner(loaded)
    short, long_ = runner.run(x[:1, :40]), runner.run(x[:1])
    assert short[0].shape == long_[0].shape == (4,)
    assert list(runner.inputs[0]["shape"]) == [1, 100]

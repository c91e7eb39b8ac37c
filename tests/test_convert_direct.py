"""The float32 baseline straight from a loaded Keras model (`convert.keras.float32_direct`): the same model as the
SavedModel route it replaces on the baseline's path (signature, input names, shapes and dtypes, outputs), used
only when its outputs match the Keras model's, and the SavedModel route kept for what it does not take."""

from __future__ import annotations

import numpy as np
import pytest

from optimize.convert import keras as conv
from optimize.models import _tf
from optimize.models.data import from_arrays


def _signature(content: bytes):
    from optimize.models import runtime

    it = runtime.describe(content)
    runner = it.get_signature_runner(runtime.signature_key(it))
    inputs = {
        k: (tuple(int(v) for v in d["shape_signature"]), np.dtype(d["dtype"]).name)
        for k, d in runner.get_input_details().items()
    }
    return it.get_signature_list(), inputs


def _outputs(content: bytes, feeds: dict) -> dict:
    from optimize.models import runtime

    it = runtime.describe(content)
    return it.get_signature_runner(runtime.signature_key(it))(**feeds)


def _via_savedmodel(model, tmp_path, batch=None) -> bytes:
    sm = conv.export_saved_model(model, tmp_path / "sm", batch=batch)
    return _tf.tf().lite.TFLiteConverter.from_saved_model(str(sm)).convert()


def _two_heads(K):
    a, b = K.Input((8,), name="image"), K.Input((4,), name="features")
    h = K.layers.Concatenate()([K.layers.Dense(6, activation="relu")(a), b])
    return K.Model([a, b], [K.layers.Dense(3, activation="softmax", name="cls")(h), K.layers.Dense(1, name="val")(h)])


def _cnn(K):
    return K.Sequential(
        [
            K.Input((8, 8, 1), name="image"),
            K.layers.Conv2D(4, 3, activation="relu"),
            K.layers.BatchNormalization(),
            K.layers.Flatten(),
            K.layers.Dense(10, activation="softmax"),
        ]
    )


@pytest.mark.parametrize(
    "which,build,batch",
    [("tf_keras", _cnn, None), ("tf_keras", _two_heads, None), ("keras3", _cnn, 1), ("keras3", _two_heads, 1)],
)
def test_the_direct_route_makes_the_savedmodel_routes_model(tmp_path, which, build, batch):
    K = _tf.keras() if which == "tf_keras" else _tf.keras3()
    K.utils.set_random_seed(0)
    model = build(K)
    rng = np.random.default_rng(0)
    shapes = {t.name.split(":")[0]: (4, *t.shape[1:]) for t in model.inputs}
    xs = {n: rng.normal(size=s).astype(np.float32) for n, s in shapes.items()}
    ds = from_arrays(
        x_cal=xs if len(xs) > 1 else next(iter(xs.values())), x_test=xs if len(xs) > 1 else next(iter(xs.values()))
    )
    made = conv.float32_direct(model, ds, batch)
    assert made is not None and made.notes == ()
    before = _via_savedmodel(model, tmp_path, batch)
    assert _signature(made.content) == _signature(before)  # the same interface: names, shapes, dtypes, outputs
    for i in range(4):
        feeds = {n: x[i : i + 1] for n, x in xs.items()}
        now, then = _outputs(made.content, feeds), _outputs(before, feeds)
        assert now.keys() == then.keys()
        for k in now:
            np.testing.assert_allclose(now[k], then[k], rtol=1e-5, atol=1e-6)


def test_recurrent_models_keep_the_savedmodel_route():
    K = _tf.keras()
    model = K.Sequential([K.Input((6, 2)), K.layers.LSTM(4), K.layers.Dense(1)])
    assert conv.float32_direct(model, None) is None


def test_a_conversion_that_differs_from_the_keras_model_is_not_used(monkeypatch):
    """The outputs check is what decides: with a tolerance nothing meets, the route gives way."""
    K = _tf.keras()
    K.utils.set_random_seed(0)
    model = _cnn(K)
    assert conv.float32_direct(model, None) is not None  # zeros and seeded inputs, without data
    monkeypatch.setattr(conv, "DIRECT_ATOL", -1.0)
    assert conv.float32_direct(model, None) is None


def test_a_sweep_baseline_made_directly_matches_the_keras_model(tmp_path, keras_model, digits):
    """The float32 candidate of a Keras model's sweep comes from the direct route and measures as the model does."""
    from optimize.core.recipe import build
    from optimize.engine import sweeps

    x = digits["x_test"][:40]
    np.savez(tmp_path / "d.npz", x=x)
    recipes = [build("float32", [{"technique": "convert"}])]
    study = sweeps.sweep(
        keras_model, tmp_path / "d.npz", tmp_path / "out", recipes=recipes, cache=False, delegates=False
    )
    base = study.candidates[0]
    assert base.ok and base.name == "float32", base.error
    content = (tmp_path / "out" / base.artifact).read_bytes()
    sig, inputs = _signature(content)
    assert sig["serving_default"]["outputs"] == ["output_0"] and len(inputs) == 1
    from optimize.models import runtime

    names = [d["name"] for d in runtime.describe(content).get_input_details()]
    assert not any(n.startswith("serving_default_") for n in names), names  # traced, not read from a SavedModel
    model = _tf.keras().models.load_model(keras_model, compile=False)
    want = np.asarray(model(x[:8], training=False))
    got = np.concatenate([_outputs(content, {next(iter(inputs)): x[i : i + 1]})["output_0"] for i in range(8)])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_candidates_released_before_the_baseline_is_measured_get_its_deltas(tmp_path, keras_model, data_npz):
    """With the float32 converted in the sweep's process, the quantized candidates start at once (compared with
    that file) and their accuracy deltas are filled in from the measured baseline."""
    from optimize.core.recipe import build
    from optimize.engine import sweeps

    recipes = [
        build("float32", [{"technique": "convert"}]),
        build("dynamic", [{"technique": "convert"}, {"technique": "quantize", "scheme": "dynamic"}]),
    ]
    study = sweeps.sweep(keras_model, data_npz, tmp_path / "out", recipes=recipes, cache=False, delegates=False, jobs=2)
    base, dyn = study.candidates
    assert base.ok and dyn.ok, (base.error, dyn.error)
    assert dyn.metrics.accuracy_delta == pytest.approx(dyn.metrics.accuracy.top1 - base.metrics.accuracy.top1)
    assert dyn.probe is not None and dyn.probe.reference == "float32.tflite"
    assert dyn.metrics.fidelity is not None and dyn.metrics.fidelity.reference == "float32.tflite"

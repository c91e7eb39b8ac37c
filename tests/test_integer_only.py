"""Integer kernels where they exist: an int8 model computes no op in float that the runtime has an int8
kernel for, and one with int8 I/O computes no op in float at all.

LiteRT Quantizer leaves PRELU and LEAKY_RELU float between DEQUANTIZE and QUANTIZE, with float or int8 I/O.
Every int8 variant is then made by the TFLite calibrator (the converter's own calibration and quantizer,
on the float .tflite), whatever the source; the candidate says which and why, with a quick p50 of both.
`integer_kernels = false` keeps LiteRT Quantizer's float islands, and the recommender never gives an
integer-only target a candidate that still computes in float.
"""

from __future__ import annotations

import numpy as np
import pytest

from optimize.core.recipe import build
from optimize.engine import sweeps
from optimize.measure import verify
from optimize.models import _tf
from optimize.models.tflite import read_model


@pytest.fixture(scope="module")
def prelu(tmp_path_factory):
    """A seeded tf_keras CNN with a PReLU and a LeakyReLU, its float32 .tflite, and seeded data."""
    tf, keras = _tf.tf(), _tf.keras()
    keras.utils.set_random_seed(0)
    inp = keras.Input((8, 8, 3))
    h = keras.layers.PReLU(shared_axes=[1, 2])(keras.layers.Conv2D(8, 3, padding="same")(inp))
    h = keras.layers.LeakyReLU(0.1)(keras.layers.Conv2D(8, 3, padding="same")(h))
    model = keras.Model(inp, keras.layers.Dense(4)(keras.layers.Flatten()(h)))
    folder = tmp_path_factory.mktemp("prelu")
    model.save(folder / "prelu.keras")
    (folder / "prelu.tflite").write_bytes(tf.lite.TFLiteConverter.from_keras_model(model).convert())
    rng = np.random.default_rng(0)
    np.savez(folder / "d.npz", x=rng.random((64, 8, 8, 3)).astype(np.float32), y=rng.integers(0, 4, 64))
    return folder


def _sweep(folder, model: str, step: str):
    recipes = [
        build("int8-int8io", [{"technique": step, "scheme": "int8", "io": "int8"}]),
        build("int8", [{"technique": step, "scheme": "int8"}]),
        build("int8-islands", [{"technique": "quantize", "scheme": "int8", "integer_kernels": False}]),
    ]
    out = folder / f"out-{model}"
    return sweeps.sweep(folder / model, folder / "d.npz", out, recipes=recipes, delegates=False, runs=3, jobs=0), out


def _float_ops(path) -> list[str]:
    return verify.float_compute(read_model(path.read_bytes()))


@pytest.mark.parametrize(("model", "step"), [("prelu.keras", "convert"), ("prelu.tflite", "quantize")])
def test_every_int8_variant_of_a_prelu_model_uses_the_integer_kernels(prelu, model, step):
    study, out = _sweep(prelu, model, step)
    io8, int8, islands = study.candidate("int8-int8io"), study.candidate("int8"), study.candidate("int8-islands")
    for c in (io8, int8):
        assert c.ok, c.error
        assert _float_ops(out / c.artifact) == [] and c.composition.float_compute_ops == []
        assert c.backend == "calibrator" and any("the TFLite calibrator made it" in n for n in c.notes), c.notes
        said = " ".join(c.notes)
        assert "PRELU" in said and "LEAKY_RELU" in said and "Quick p50 here" in said
        ops = {op.name for op in read_model((out / c.artifact).read_bytes()).main.ops}
        assert {"PRELU", "LEAKY_RELU"} <= ops
    assert "DEQUANTIZE" not in {op.name for op in read_model((out / io8.artifact).read_bytes()).main.ops}
    # integer_kernels = false: LiteRT Quantizer's float islands, listed in the composition and as islands
    assert islands.ok and islands.backend == "litert"
    assert set(islands.composition.float_compute_ops) == {"LEAKY_RELU", "PRELU"}
    assert {i.op for i in islands.islands} == {"LEAKY_RELU", "PRELU"}
    assert all(i.precision == "float" and "no integer version" in i.reason for i in islands.islands)
    assert islands.composition.float_compute_count == 2 and int8.composition.float_compute_count == 0


def test_integer_only_targets_never_get_float_compute(prelu):
    from optimize.decide.choose import recommend

    study, _ = _sweep(prelu, "prelu.tflite", "quantize")
    for target in ("hexagon", "mcu", "edgetpu", "nnapi"):
        rec = recommend(study, target=target)
        assert rec.chosen != "int8-islands", (target, rec.chosen)
        why = {r.candidate: r.reason for r in rec.rejected}
        assert "computes LEAKY_RELU, PRELU in float" in why["int8-islands"], why


def test_verification_fails_an_integer_only_candidate_with_float_compute(prelu, tmp_path):
    from optimize.core.registry import Context, get
    from optimize.models.data import load_data

    tech = get("quantize")
    params = tech.params(scheme="int8", io="int8", integer_kernels=False)
    ctx = Context(workdir=tmp_path, data=load_data(prelu / "d.npz"), source_kind="keras2")  # left to the converter
    made = tech.fn(prelu / "prelu.tflite", params, ctx)
    recipe = build("int8-int8io", [{"technique": "quantize", "scheme": "int8", "io": "int8"}])
    problem = verify.check(recipe, verify.compose(made.read_bytes()))
    assert problem == "int8 with int8 I/O still computes LEAKY_RELU, PRELU in float (not integer-only)"

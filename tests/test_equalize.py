"""Accuracy rescue that keeps 8 bits (issue 19): equalization and smoothing keep the float function, bias
correction and learned rounding make int8 weights closer, chosen ranges, the techniques in chains."""

from __future__ import annotations

import numpy as np
import pytest

from optimize.core.recipe import build, chain, with_rescue
from optimize.measure import tensors
from optimize.models import runtime
from optimize.transforms.tflite import equalize, flatedit, ranges, rescue, rounding
from optimize.transforms.tflite.flatedit import Graph

TOL = 1e-5


@pytest.fixture(scope="module")
def mixed_tflite(tmp_path_factory) -> bytes:
    """An untrained seeded net with every pair kind: conv -> depthwise (ReLU), 1x1 conv with ReLU6 (a clip
    not crossed), global average pool -> dense, dense -> dense, and a flatten between conv and dense."""
    from optimize.models import _tf

    tf, k = _tf.tf(), _tf.keras()
    k.utils.set_random_seed(1)
    inp = k.Input((8, 8, 3))
    h = k.layers.Conv2D(8, 3, padding="same", activation="relu")(inp)
    h = k.layers.DepthwiseConv2D(3, padding="same", depth_multiplier=2, activation="relu")(h)
    h = k.layers.Conv2D(8, 1, activation="relu6")(h)
    h = k.layers.Conv2D(8, 1, activation="relu")(h)
    c = k.layers.Conv2D(8, 3, strides=2, padding="valid")(h)
    a = k.layers.Dense(16, activation="relu")(k.layers.GlobalAveragePooling2D()(c))
    d = k.layers.Conv2D(6, 1, activation="relu")(h)
    b = k.layers.Dense(16)(k.layers.Flatten()(k.layers.MaxPooling2D()(d)))
    out = k.layers.Dense(4)(k.layers.Concatenate()([k.layers.Dense(8)(a), b]))
    folder = tmp_path_factory.mktemp("mixed")
    k.Model(inp, out).export(str(folder / "sm"))
    return tf.lite.TFLiteConverter.from_saved_model(str(folder / "sm")).convert()


def _outputs(content: bytes, xs: np.ndarray) -> list[np.ndarray]:
    return runtime.Runner(runtime.load(content, threads=1)).predict(xs)


def _random(shape, n=16, seed=0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, *shape)).astype(np.float32)


def rescaled(content: bytes, factors=(300.0, 0.005, 40.0)) -> bytes:
    """A function-preserving rescale of the first conv's output channels (and the next layer's inputs)."""
    g = Graph.load(content)
    found, _ = equalize.pairs(g)
    first = found[0]
    s = np.ones(equalize._out_ranges(g, first.a).shape, np.float32)
    s[: len(factors)] = factors
    equalize._apply(g, first, 1 / s)  # A's channels times s, B's inputs over s
    return g.save()


def test_pairs_cross_relu_pooling_and_flatten_but_not_a_relu6_clip(mixed_tflite):
    g = Graph.load(mixed_tflite)
    found, skipped = equalize.pairs(g)
    kinds = {(g.names[p.a], g.names[p.b], p.period is not None) for p in found}
    assert ("CONV_2D", "DEPTHWISE_CONV_2D", False) in kinds
    assert any(p.period for p in found)  # conv -> max pool -> flatten -> dense
    assert any("RELU6" in why for why in skipped)
    assert not any(g.activation(p.a) == "RELU6" for p in found)


@pytest.mark.parametrize("how", ["cle", "smooth"])
def test_equalization_keeps_the_float_function(mixed_tflite, how):
    xs = _random((8, 8, 3))
    if how == "cle":
        made = equalize.equalize(mixed_tflite)
    else:
        g = Graph.load(mixed_tflite)
        idx = sorted({g.inputs(k)[0] for k, n in enumerate(g.names) if n in flatedit.LINEAR})
        seen = tensors.channel_extremes(mixed_tflite, [xs[i : i + 1] for i in range(8)], idx)
        act = {g.tensor_name(i): np.maximum(-lo, hi) for i, (lo, hi) in seen.items()}
        made = equalize.smooth(mixed_tflite, act, 0.5)
    assert made.pairs and made.max_scale > 1.01  # it really moved something
    assert rescue.relative_error(_outputs(mixed_tflite, xs), _outputs(made.content, xs)) < TOL
    before, after = Graph.load(mixed_tflite), Graph.load(made.content)
    assert before.names == after.names  # the graph is untouched; only constants change
    assert len(made.content) < 1.05 * len(mixed_tflite)


def test_equalization_balances_a_rescaled_model_and_keeps_it_exact(float_tflite):
    content = float_tflite.read_bytes()
    bad = rescaled(content)
    xs = _random((8, 8, 1), seed=3)
    assert rescue.relative_error(_outputs(content, xs), _outputs(bad, xs)) < TOL  # the rescale is exact too
    made = equalize.equalize(bad)
    assert rescue.relative_error(_outputs(content, xs), _outputs(made.content, xs)) < TOL
    g, p = Graph.load(made.content), equalize.pairs(Graph.load(made.content))[0][0]
    r1, r2 = equalize._out_ranges(g, p.a), equalize._in_ranges(g, p, len(equalize._out_ranges(g, p.a)))
    assert np.allclose(r1, r2, rtol=1e-3)  # both sides of the pair now share each channel's range


def test_fake_quant_matches_litert_quantizer_weights(float_tflite, tmp_path, digits):
    """The rounding the corrections anticipate is the quantizer's own, weight for weight."""
    from optimize.core.registry import Context
    from optimize.models.data import from_arrays
    from optimize.models.tflite import read_model

    content = float_tflite.read_bytes()
    ctx = Context(workdir=tmp_path, data=from_arrays(**digits))
    for gran in ("channel", "tensor"):
        q = {t.name: t for t in read_model(rescue.session(content, ctx, gran, n=32).quantize()).main.tensors}
        g = Graph.load(content)
        for k in rounding._linear(g):
            w = g.const(g.inputs(k)[1])
            mine = np.clip(np.round(w / rounding.weight_scales(w, g.names[k], gran == "tensor")), -127, 127)
            theirs = q[g.tensor_name(g.inputs(k)[1])]
            assert theirs.dtype == "int8"
            assert np.array_equal(theirs.values().reshape(w.shape), mine), (gran, g.names[k])


def _int8_error(content: bytes, reference: bytes, ctx, xs, gran="tensor") -> float:
    q = rescue.session(content, ctx, gran, n=64).quantize()
    a, b = _outputs(reference, xs), _outputs(q, xs)
    return float(np.mean(np.abs(a[0] - b[0])))


def test_bias_correction_removes_the_int8_weights_mean_shift(float_tflite, tmp_path, digits):
    from optimize.core.registry import Context
    from optimize.models.data import from_arrays

    content = float_tflite.read_bytes()
    samples = [digits["x_train"][i : i + 1] for i in range(64)]
    made = rounding.bias_correct(content, samples, per_tensor=True)
    assert len(made.layers) == 3 and not made.skipped
    # the corrected float model with int8-rounded weights has the original's mean outputs
    g = Graph.load(made.content)
    for k in rounding._linear(g):
        w = g.const(g.inputs(k)[1])
        g.set_const(g.inputs(k)[1], rounding.fake_quant(w, g.names[k], True))
    xs = digits["x_test"][:64]
    shifted = np.mean(_outputs(g.save(), xs)[0] - _outputs(content, xs)[0])
    g0 = Graph.load(content)
    for k in rounding._linear(g0):
        w = g0.const(g0.inputs(k)[1])
        g0.set_const(g0.inputs(k)[1], rounding.fake_quant(w, g0.names[k], True))
    plain = np.mean(_outputs(g0.save(), xs)[0] - _outputs(content, xs)[0])
    assert abs(shifted) < abs(plain)
    ctx = Context(workdir=tmp_path, data=from_arrays(**digits))
    assert _int8_error(made.content, content, ctx, xs) <= _int8_error(content, content, ctx, xs) * 1.02


def test_learned_rounding_is_kept_by_the_quantizer_and_beats_nearest(float_tflite, tmp_path, digits):
    from optimize.core.registry import Context
    from optimize.models.data import from_arrays
    from optimize.models.tflite import read_model

    content = float_tflite.read_bytes()
    samples = [digits["x_train"][i : i + 1] for i in range(64)]
    made = rounding.adaround(content, samples, iters=200)
    assert made.layers and all(after <= before for _, _, before, after in made.layers)
    assert any(after < 0.8 * before for _, _, before, after in made.layers)
    ctx = Context(workdir=tmp_path, data=from_arrays(**digits))
    q = {t.name: t for t in read_model(rescue.session(made.content, ctx, "channel", n=32).quantize()).main.tensors}
    g = Graph.load(made.content)
    for k in rounding._linear(g):
        w = g.const(g.inputs(k)[1])
        grid = w / rounding.weight_scales(w, g.names[k], False)
        assert np.allclose(grid, np.round(grid), atol=1e-3)  # the weights sit on the int8 grid
        ints = q[g.tensor_name(g.inputs(k)[1])].values().reshape(w.shape)
        assert np.array_equal(ints, np.round(grid))  # and the quantizer keeps exactly those integers


def test_ranges_choose_per_tensor():
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.normal(size=20000), [400.0]])  # one outlier stretches min/max
    lo, hi, how = ranges.choose(x, "auto")
    assert how in ("mse", "percentile") and hi < 400
    assert ranges._mse(x, lo, hi) < ranges._mse(x, x.min(), x.max())
    y = rng.uniform(0, 1, 20000)  # nothing to clip: min/max stays
    assert ranges.choose(y, "auto")[2] == "minmax"
    assert ranges.choose(y, "percentile")[2] == "percentile"


def test_the_rescue_recovers_what_plain_int8_breaks(float_tflite, tmp_path, digits):
    """Seeded: channels made 300x larger by an exact rescale break int8 (per-channel weights, per-tensor
    activations); equalization and bias correction bring it back to within a point of float, all 8-bit."""
    from optimize.core.registry import Context
    from optimize.models.data import from_arrays

    content = rescaled(float_tflite.read_bytes())
    ctx = Context(workdir=tmp_path, data=from_arrays(**digits))
    xs, y = digits["x_test"], digits["y_test"]

    def top1(model: bytes) -> float:
        return float(np.mean(_outputs(model, xs)[0].argmax(-1) == y))

    base = top1(content)
    plain = top1(rescue.session(content, ctx).quantize())
    fixed = equalize.equalize(content).content
    fixed = rounding.bias_correct(fixed, [digits["x_train"][i : i + 1] for i in range(64)]).content
    saved = top1(rescue.session(fixed, ctx).quantize())
    assert base - plain > 0.2, (base, plain)  # plain int8 really breaks it
    assert base - saved <= 0.01, (base, saved)


_F32 = {"technique": "convert", "scheme": "float32"}


def test_chains_and_the_cli_shortcut_build_the_rescue_steps():
    steps = chain({"technique": "prune"}, "cluster,equalize,int8")
    assert [s["technique"] for s in steps] == ["prune", "cluster", "convert", "equalize", "quantize"]
    assert steps[2]["scheme"] == "float32" and steps[-1]["scheme"] == "int8"
    build("prune-cluster-equalize-int8", steps)  # a valid recipe: stages in order
    made = with_rescue({"technique": "convert", "scheme": "int8", "io": "float"}, ["adaround", "equalize"], "auto")
    assert [s["technique"] for s in made] == ["convert", "equalize", "adaround", "quantize"]
    assert made[-1]["calibration"] == "auto"
    recipe = build("int8", made).with_backend("converter")
    assert [s.technique for s in recipe.steps] == ["convert", "equalize", "adaround", "quantize"]
    # ranges, per-tensor weights or blocks only LiteRT Quantizer makes: never folded into the converter
    for extra in ({"calibration": "mse"}, {"granularity": "tensor"}):
        q = build("int8", [dict(_F32), {"technique": "quantize", "scheme": "int8", **extra}]).with_backend("converter")
        assert [s.technique for s in q.steps] == ["convert", "quantize"], extra
        assert q.steps[-1].params.model_dump(include=set(extra)) == extra
    plain = build("int8", [dict(_F32), {"technique": "quantize", "scheme": "int8"}]).with_backend("converter")
    assert [(s.technique, s.params.scheme) for s in plain.steps] == [("convert", "int8")]  # min/max: folded


def test_rescue_techniques_run_in_a_recipe_and_are_recorded(keras_model, data_npz, tmp_path):
    import optimize

    recipe = build(
        "int8-rescue",
        with_rescue({"technique": "convert", "scheme": "int8"}, ["equalize", "bias_correction"], "auto"),
    )
    cand = optimize.run(recipe, keras_model, data_npz, tmp_path, delegates=False, jobs=0)
    assert cand.ok, cand.error
    assert [r.transform for r in cand.rescue] == ["equalize", "bias_correction"]
    assert cand.composition.float_ops == 0 and cand.composition.shrink <= 0.30
    assert any(n.startswith("equalize: cle rescaled") for n in cand.notes)
    assert any("auto ranges (" in n and " tensors) from " in n for n in cand.notes)  # what auto picked


def test_cli_quantize_takes_the_rescue_options(cli, keras_model, data_npz):
    r = cli("quantize", str(keras_model), "-c", str(data_npz), "--equalize", "--ranges", "bogus")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    r = cli("quantize", str(keras_model), "-c", str(data_npz), "--equalize", "--float-fallback")
    assert r.returncode == 2 and "Float fallback" in r.stderr


def test_high_bias_absorption_keeps_the_function_where_the_floor_holds(float_tflite, digits):
    """Biases raised so the conv and hidden Dense outputs never fall below a floor: absorbing it into the
    next layer's bias keeps the outputs (to 1e-5) on data where the floor holds, and shrinks the range."""
    g = Graph.load(float_tflite.read_bytes())
    for k in rounding._linear(g)[:2]:
        b = g.inputs(k)[2]
        g.set_const(b, g.const(b) + 5.0)
    high = g.save()
    xs = digits["x_train"][:64]  # the samples the floors were measured on (elsewhere a floor may not hold)
    floors = equalize.output_minima(high, [xs[i : i + 1] for i in range(64)])
    made = equalize.absorb_high_bias(high, floors)
    assert len(made.pairs) == 2 and made.max_scale > 1  # (for absorption, max_scale is the largest floor)
    assert rescue.relative_error(_outputs(high, xs), _outputs(made.content, xs)) < TOL
    after = equalize.output_minima(made.content, [xs[i : i + 1] for i in range(64)])
    name = next(iter(floors))
    assert after[name].min() < 0.5 * floors[name].min()


def test_clustered_weights_stay_clustered(float_tflite, digits):
    """prune -> cluster -> equalize -> int8: a pair whose second layer is clustered is left; rows scaled
    whole keep their values per output channel; learned rounding leaves clustered layers alone."""
    g = Graph.load(float_tflite.read_bytes())
    dense = next(k for k in rounding._linear(g) if g.names[k] == "FULLY_CONNECTED")
    w = g.const(g.inputs(dense)[1])
    centroids = np.quantile(w, np.linspace(0.02, 0.98, 16))
    g.set_const(g.inputs(dense)[1], centroids[np.abs(w[..., None] - centroids).argmin(-1)])
    content = g.save()
    made = equalize.equalize(content)
    assert any(s.endswith("clustered weights") for s in made.skipped)
    after = Graph.load(made.content).const(g.inputs(dense)[1])
    assert max(len(np.unique(row)) for row in after) <= 16  # rows scaled whole: 16 values per channel
    rounded = rounding.adaround(content, [digits["x_train"][i : i + 1] for i in range(16)], iters=20)
    assert g.tensor_name(g.output(dense)) not in [t for t, *_ in rounded.layers]


@pytest.mark.slow
def test_prune_cluster_equalize_int8_runs_and_keeps_its_clusters(keras_model, data_npz, tmp_path):
    import optimize

    steps = chain({"technique": "prune", "epochs": 1}, "cluster,equalize,int8")
    cand = optimize.run(build("prune-cluster-equalize-int8", steps), keras_model, data_npz, tmp_path, delegates=False)
    assert cand.ok, cand.error  # verification: sparsity and clusters survived the equalization
    assert [r.transform for r in cand.rescue] == ["equalize"]
    assert cand.composition.shrink <= 0.30


def test_data_hungry_transforms_without_data_say_so_in_one_line(mixed_tflite, tmp_path):
    """absorb=true, smoothing and bias correction need calibration samples: without data, one DataError naming
    the technique and the fix (absorb used to be skipped without a word)."""
    from optimize.core.errors import DataError
    from optimize.core.registry import Context, get

    model = tmp_path / "m.tflite"
    model.write_bytes(mixed_tflite)
    ctx = Context(workdir=tmp_path)
    for name, raw in (("equalize", {"absorb": True}), ("equalize", {"method": "smooth"}), ("bias_correction", {})):
        t = get(name)
        with pytest.raises(DataError, match="needs calibration data") as e:
            t.fn(model, t.parse(raw), ctx)
        assert "--calibration" in e.value.fix, name

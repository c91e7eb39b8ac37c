"""The int4 scheme: 4-bit Dense/MatMul weights by LiteRT Quantizer, verified, run by XNNPACK, refused by the
GPU and NNAPI builds, offered by the decision tree and by the default sweep where Dense weights dominate."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import optimize.models.data
import optimize.transforms.tflite.quantize  # noqa: F401  (registers the technique)
from optimize.core import registry
from optimize.core.errors import RecipeError, TechniqueFailed
from optimize.core.recipe import build
from optimize.core.registry import Context
from optimize.core.results import Goals
from optimize.decide.advice import advise
from optimize.delegates import check_delegates
from optimize.measure import verify
from optimize.models import runtime, weights
from optimize.models.tflite import read_model


@pytest.fixture(scope="module")
def dense(tmp_path_factory) -> dict[str, Path]:
    """A seeded MLP (48 -> 256 -> 256 -> 10: its Dense matrices hold 99% of the weights; 48 inputs are not a
    whole number of 32-blocks) and a small CNN, as Keras files and float32 .tflite."""
    from optimize.models import _tf

    tf, k = _tf.tf(), _tf.keras()
    k.utils.set_random_seed(0)
    mlp = k.Sequential([k.layers.Input((48,)), k.layers.Dense(256, activation="relu"), k.layers.Dense(256)])
    mlp.add(k.layers.Dense(10))
    cnn = k.Sequential([k.layers.Input((8, 8, 1)), k.layers.Conv2D(32, 3), k.layers.Conv2D(32, 3)])
    cnn.add(k.layers.Flatten())
    cnn.add(k.layers.Dense(2))
    folder = tmp_path_factory.mktemp("int4")
    out = {}
    for name, model in (("mlp", mlp), ("cnn", cnn)):
        out[name + ".keras"] = folder / f"{name}.keras"
        model.save(out[name + ".keras"])
        out[name] = folder / f"{name}.tflite"
        out[name].write_bytes(tf.lite.TFLiteConverter.from_keras_model(model).convert())
    return out


def run(model: Path, tmp_path: Path, **raw) -> Path:
    tech = registry.get("quantize")
    x = np.random.default_rng(0).uniform(0, 1, (8, 48)).astype(np.float32)
    ctx = Context(workdir=tmp_path, data=optimize.models.data.from_arrays(x=x))
    return tech.fn(model, tech.parse(raw), ctx)


@pytest.mark.parametrize("block_size", [0, 32])
def test_int4_weights_really_are_4_bit_and_xnnpack_runs_them(dense, tmp_path, block_size):
    path = run(dense["mlp"], tmp_path, scheme="int4", block_size=block_size)
    c = verify.compose(path.read_bytes())
    assert set(c.weight_bytes) >= {"int4"} and c.weight_bytes["int4"] >= 0.95 * sum(c.weight_bytes.values()) - 4096
    assert c.shrink <= 0.16, c.shrink  # 4 bits are 0.125; scales and the float32 biases add the rest
    assert verify.check(build("int4", [{"technique": "quantize", "scheme": "int4"}]), c) is None
    m = read_model(path.read_bytes()).main
    big = {t.shape: t.quant for t in m.tensors if t.dtype == "int4"}
    assert set(big) == {(256, 48), (256, 256), (10, 256)}
    # Blockwise where the rows split into whole blocks; the 48-wide rows keep one scale per output channel.
    assert {s: q.blockwise for s, q in big.items()} == {
        (256, 48): False,
        (256, 256): bool(block_size),
        (10, 256): bool(block_size),
    }
    if block_size:
        assert any(t.dtype == "float16" and t.shape == (256, 256 // 32) for t in m.tensors)  # the block scales
    x = np.random.default_rng(1).uniform(0, 1, (16, 48)).astype(np.float32)
    ref = runtime.Runner(runtime.load(dense["mlp"])).predict(x)[0]
    got = runtime.Runner(runtime.load(path)).predict(x)[0]
    assert np.corrcoef(got.ravel(), ref.ravel())[0, 1] > 0.95  # random weights at 4 bits: close, not equal
    reports = check_delegates(path, ["xnnpack", "gpu", "nnapi"])
    assert reports["xnnpack"].verdict == "full"  # observed: XNNPACK's 4-bit kernels take the whole model
    for d in ("gpu", "nnapi"):  # neither reads 4-bit weights: the whole delegation fails at build time
        assert reports[d].veto_code == "build-failure" and "int4" in reports[d].vetoed.lower()


def test_int4_without_dense_weights_is_a_failed_candidate(tmp_path):
    """A model whose Dense weights are all under 1,024 elements keeps them float: int4 did nothing, and
    verify says so instead of reporting it."""
    c = verify.compose(_small_dense_model())
    why = verify.check(build("int4", [{"technique": "quantize", "scheme": "int4"}]), c)
    assert why is not None and why.startswith("int4: no weights were made 4-bit")


def _small_dense_model() -> bytes:
    from delegate_fixtures import op, tensor, tiny

    w = np.ones((4, 8), np.float32)
    ops = [op("FULLY_CONNECTED", [0, 1, -1], [2], ("FullyConnectedOptions", {}))]
    return tiny([tensor([1, 8]), tensor([4, 8], data=w), tensor([1, 4])], ops, [0], [2])


def test_block_size_belongs_to_int4(dense, tmp_path):
    with pytest.raises(RecipeError, match="block_size applies to int4"):
        build("x", [{"technique": "quantize", "scheme": "dynamic", "block_size": 32}])
    with pytest.raises(RecipeError):
        build("x", [{"technique": "quantize", "scheme": "int4", "block_size": 48}])


def test_the_converter_backend_leaves_int4_to_litert_quantizer():
    r = build("int4", [{"technique": "convert", "scheme": "int4"}]).with_backend("converter")
    assert [(s.technique, str(s.params.scheme)) for s in r.steps] == [("convert", "float32"), ("quantize", "int4")]
    from optimize.convert.keras import ConvertParams, configure

    with pytest.raises(TechniqueFailed, match="makes no int4 weights"):
        configure(object(), ConvertParams(scheme="int4"), None)


def test_dense_share_decides_the_default_sweep(dense):
    """The default sweep tries int4 only where Dense/MatMul matrices of >= 1,024 elements hold most weights."""
    from optimize.engine.plan import plan
    from optimize.models import source as models

    assert weights.tflite_share(dense["mlp"].read_bytes()) > 0.95
    assert weights.tflite_share(dense["cnn"].read_bytes()) < 0.5
    for kind in ("mlp.keras", "mlp", "cnn.keras", "cnn"):
        src = models.open_model(dense[kind])
        names = [r.name for r in plan(src, None, None, None)]
        assert ("int4" in names) == kind.startswith("mlp"), (kind, names)
        assert weights.mostly_dense(src) == kind.startswith("mlp")


def test_the_decision_tree_offers_int4_for_dense_weights_on_the_cpu():
    rec = advise("cpu", dense_weights=True)
    assert rec.pipeline == [{"technique": "convert", "scheme": "int4"}]
    assert rec.path[-1].question == "Are most weights large Dense or attention matrices?"
    assert any("int4" in f and "GPU" in f for f in rec.facts)
    tight = advise("cpu", dense_weights=True, goals=Goals(max_accuracy_drop=0.002))
    assert tight.pipeline[-1]["scheme"] != "int4" and any(a.startswith("int4:") for a in tight.alternatives)
    assert advise("cpu").pipeline[-1]["scheme"] == "int8"  # without Dense-heavy weights, nothing changes
    assert all(s.get("scheme") != "int4" for s in advise("gpu", dense_weights=True).pipeline)

"""Stock Keras 3 layers rebuilt in tf_keras for pruning, clustering and QAT (issue 42 item 4): Keras 3's own
activation names (hard_silu, silu, its hard_sigmoid), operations outside any layer (`x + 3.0`), settings tf_keras
does not take that hold Keras 3's defaults (Resizing's data_format and fill_mode), and MultiHeadAttention, each
rebuilt exactly (outputs compared) and saved and loaded again; a setting away from its default still refused,
naming it. keras.applications' MobileNetV3Small (weights=None) and an attention encoder rebuild whole.
"""

from __future__ import annotations

import numpy as np
import pytest

from optimize.core.errors import ModelError
from optimize.models import _tf, rebuild
from optimize.models.source import ModelSource, load_keras2

RNG = np.random.default_rng(0)


def _exact(model3, data=None) -> float:
    model2 = rebuild.rebuild(model3)
    return rebuild.check_exact(model3, model2, data)


def test_keras3_activation_names_and_operations_rebuild_exactly(tmp_path):
    k = _tf.keras3()
    k.utils.set_random_seed(0)
    inp = k.Input((8, 8, 3))
    h = k.layers.Conv2D(8, 3, padding="same")(inp)
    h = k.layers.Activation("hard_silu")(h)
    gate = k.layers.ReLU(6.0)(k.layers.GlobalAveragePooling2D(keepdims=True)(h) + 3.0) * (1.0 / 6.0)  # MobileNetV3's
    h = k.layers.Multiply()([h, gate])
    h = k.layers.Dense(6, activation="silu")(k.layers.Flatten()(h))
    out = k.layers.Dense(4, activation="hard_sigmoid")(k.layers.Activation("relu6")(h))
    model3 = k.Model(inp, out)
    x = RNG.normal(size=(4, 8, 8, 3)).astype(np.float32) * 3
    model2 = rebuild.rebuild(model3)
    np.testing.assert_allclose(model2(x).numpy(), np.asarray(model3(x)), atol=1e-5)
    path = tmp_path / "twin.keras"
    model2.save(path)
    again = load_keras2(ModelSource(path, "keras2", ""))  # our activations load again, by name
    np.testing.assert_allclose(again(x).numpy(), np.asarray(model3(x)), atol=1e-5)


def test_settings_at_keras3_defaults_are_dropped_and_others_named():
    k = _tf.keras3()
    inp = k.Input((16, 16, 3))
    out = k.layers.Dense(2)(k.layers.Flatten()(k.layers.Resizing(8, 8)(inp)))  # data_format, fill_mode at defaults
    assert _exact(k.Model(inp, out)) <= 1e-5
    inp = k.Input((16, 12, 3))
    padded = k.layers.Resizing(8, 8, pad_to_aspect_ratio=True, fill_mode="reflect")(inp)
    with pytest.raises(ModelError, match=r"away from their defaults: \['fill_mode', 'pad_to_aspect_ratio'\]"):
        rebuild.rebuild(k.Model(inp, k.layers.Dense(2)(k.layers.Flatten()(padded))))


def _encoder(k):
    ids = k.Input((12,), dtype="int32", name="ids")
    x = k.layers.Embedding(50, 16)(ids)
    x = k.layers.LayerNormalization()(x + k.layers.MultiHeadAttention(num_heads=2, key_dim=8)(x, x))
    x = k.layers.LayerNormalization()(x + k.layers.Dense(16)(k.layers.Dense(32, activation="gelu")(x)))
    return k.Model(ids, k.layers.Dense(3, activation="softmax")(k.layers.GlobalAveragePooling1D()(x)))


def test_an_attention_encoder_rebuilds_exactly():
    k = _tf.keras3()
    k.utils.set_random_seed(0)
    model3 = _encoder(k)
    twin = rebuild.rebuild(model3)
    assert any(type(layer).__name__ == "MultiHeadAttention" for layer in twin.layers)
    ids = RNG.integers(0, 50, size=(6, 12)).astype(np.int32)
    np.testing.assert_allclose(twin(ids).numpy(), np.asarray(model3(ids)), atol=1e-5)


@pytest.mark.slow
def test_keras_applications_mobilenet_v3_small_rebuilds_exactly():
    k = _tf.keras3()
    model3 = k.applications.MobileNetV3Small(input_shape=(64, 64, 3), weights=None, classes=5)
    assert _exact(model3) <= 1e-4


@pytest.mark.slow
def test_an_attention_encoder_gets_pruned_clustered_and_qat_candidates(tmp_path, cli):
    k = _tf.keras3()
    k.utils.set_random_seed(0)
    _encoder(k).save(tmp_path / "enc.keras")
    np.savez(tmp_path / "d.npz", x=RNG.integers(0, 50, size=(160, 12)).astype(np.int32), y=RNG.integers(0, 3, 160))
    r = cli("sweep", str(tmp_path / "enc.keras"), "-d", str(tmp_path / "d.npz"), "-o", str(tmp_path / "out"),
            "--no-cache", env={"NO_COLOR": "1"}, timeout=1800)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    from optimize.core.results import load_study

    made = {c.name: c for c in load_study(tmp_path / "out" / "study.json").candidates}
    for name in ("prune-int8", "cluster-int8", "qat-int8"):
        assert made[name].ok, (name, made[name].error)
        assert any("rebuilt in tf_keras" in n for n in made[name].notes), made[name].notes

"""Keras models as users bring them: Keras 3 files, and models with several outputs labelled y:<output>.

- A Keras 3 Flatten CNN converts with a fixed batch of 1, so its float16 is fully GPU-delegable by the
  rules (with a free batch Keras 3 emits SHAPE -> STRIDED_SLICE -> PACK -> RESHAPE, which they refuse).
- The same Keras 3 model is rebuilt in tf_keras (exactly, or not at all) for pruning; one that cannot be
  rebuilt has its Keras-stage recipes dropped, each listed with the reason in the study.
- A two-output Keras 2 model with y:<name> labels is scored without --label-output and prunes, though
  tfmot renames its outputs (prune_low_magnitude_<name>).
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from optimize.core.recipe import build
from optimize.engine import plan, sweeps
from optimize.models import _tf


@pytest.fixture(scope="module")
def keras3_cnn(tmp_path_factory, digits):
    k = _tf.keras3()
    k.utils.set_random_seed(0)
    model = k.Sequential(
        [
            k.Input((8, 8, 1)),
            k.layers.Conv2D(8, 3, padding="same", activation="relu"),
            k.layers.MaxPooling2D(),
            k.layers.Flatten(),
            k.layers.Dense(16, activation="relu"),
            k.layers.Dense(10),
        ]
    )
    folder = tmp_path_factory.mktemp("k3")
    model.save(folder / "cnn3.keras")
    np.savez(folder / "d.npz", **{k_: v[:200] for k_, v in digits.items()})
    return folder


def test_a_keras3_flatten_cnns_float16_is_fully_gpu_delegable(keras3_cnn):
    recipes = [
        build("float16", [{"technique": "convert", "scheme": "float16"}]),
        build("prune-int8", [{"technique": "prune", "epochs": 1}, {"technique": "convert", "scheme": "int8"}]),
    ]
    study = sweeps.sweep(
        keras3_cnn / "cnn3.keras", keras3_cnn / "d.npz", keras3_cnn / "out", recipes=recipes, runs=3, jobs=0
    )
    f16 = study.candidate("float16")
    assert f16.ok, f16.error
    gpu = f16.delegates["gpu"]
    assert gpu.verdict == "full" and gpu.source == "rules", gpu
    assert any("fixed batch of 1" in n for n in f16.notes), f16.notes
    pruned = study.candidate("prune-int8")
    assert pruned.ok, pruned.error
    assert any("rebuilt in tf_keras" in n for n in pruned.notes), pruned.notes
    assert pruned.composition.sparsity > 0.2
    # issue 24: the trained candidate is exported like the rest, with a static batch of 1 and the route noted;
    # with a free batch, its RESHAPE read the batch at run time and the GPU took none of its nodes
    assert any("fixed batch of 1" in n for n in pruned.notes), pruned.notes
    assert pruned.delegates["gpu"].verdict == "full", pruned.delegates["gpu"]
    from optimize.models import runtime

    (inp,) = runtime.load(keras3_cnn / "out" / pruned.artifact).interpreter.get_input_details()
    assert list(inp["shape_signature"]) == [1, 8, 8, 1]


def test_a_keras3_model_that_cannot_be_rebuilt_lists_what_was_dropped(tmp_path, digits):
    k = _tf.keras3()
    inp = k.Input((8, 8, 1))
    out = k.layers.Dense(10)(k.layers.Flatten()(k.ops.cumsum(inp, axis=1)))  # a Keras 3 op tf_keras has no twin for
    k.Model(inp, out).save(tmp_path / "op3.keras")
    np.savez(tmp_path / "d.npz", **{k_: v[:100] for k_, v in digits.items()})
    src = __import__("optimize.models.source", fromlist=["open_model"]).open_model(tmp_path / "op3.keras")
    dropped: list = []
    from optimize.models.data import load_data

    planned = plan.plan(src, load_data(tmp_path / "d.npz"), None, None, dropped=dropped)
    assert [r.name for r in planned] == ["float32", "float16", "dynamic", "int8", "int8-int8io", "int16x8"]
    (d,) = dropped
    assert d.recipes == ["prune-int8", "cluster-int8", "prune-cluster-int8", "qat-int8"]
    # Keras 3 numbers op names per process ('cumsum', 'cumsum_1', ...): the test order decides the suffix
    assert re.search(r"Keras 3 operation 'cumsum(_\d+)?'", d.reason) and "outside any layer" in d.reason


@pytest.fixture(scope="module")
def two_outputs(tmp_path_factory, digits):
    keras = _tf.keras()
    keras.utils.set_random_seed(0)
    inp = keras.Input((8, 8, 1), name="image")
    h = keras.layers.Flatten()(keras.layers.Conv2D(8, 3, padding="same", activation="relu")(inp))
    h = keras.layers.Dense(32, activation="relu")(h)
    digit = keras.layers.Dense(10, activation="softmax", name="digit")(h)
    odd = keras.layers.Dense(1, activation="sigmoid", name="odd")(h)
    model = keras.Model(inp, [digit, odd])
    model.compile("adam", {"digit": "sparse_categorical_crossentropy", "odd": "binary_crossentropy"})
    y_odd = (digits["y_train"] % 2).astype(np.float32)
    model.fit(digits["x_train"], {"digit": digits["y_train"], "odd": y_odd}, epochs=10, verbose=0)
    folder = tmp_path_factory.mktemp("two")
    model.save(folder / "two.keras")
    arrays = {
        "x_train": digits["x_train"],
        "x_test": digits["x_test"],
        "y_train:digit": digits["y_train"],
        "y_train:odd": y_odd,
        "y_test:digit": digits["y_test"],
        "y_test:odd": (digits["y_test"] % 2).astype(np.float32),
    }
    np.savez(folder / "d.npz", **arrays)
    return folder


def test_a_two_output_keras2_model_with_per_output_labels_prunes(two_outputs):
    import optimize

    recipe = build("prune", [{"technique": "prune", "epochs": 1}, {"technique": "convert", "scheme": "float32"}])
    cand = optimize.run(recipe, two_outputs / "two.keras", two_outputs / "d.npz", two_outputs / "out", jobs=0)
    assert cand.ok, cand.error
    acc = cand.metrics.accuracy
    assert acc is not None and acc.output == "digit" and acc.top1 > 0.7  # scored without --label-output
    assert cand.composition.sparsity > 0.2


def test_label_output_picks_the_output_and_a_wrong_name_is_one_line(two_outputs, cli):
    import optimize
    from optimize.core.errors import DataError
    from optimize.models.inputs import MeasureOptions

    recipe = build("f32", [{"technique": "convert", "scheme": "float32"}])
    odd = optimize.run(
        recipe, two_outputs / "two.keras", two_outputs / "d.npz", two_outputs / "o2", jobs=0,
        measuring=MeasureOptions(label_output="odd"), delegates=False,
    )  # fmt: skip
    assert odd.metrics.accuracy.output == "odd" and odd.metrics.accuracy.task == "binary"
    with pytest.raises(DataError, match="'nope' is not an output of the model"):
        optimize.run(
            recipe, two_outputs / "two.keras", two_outputs / "d.npz", two_outputs / "o3", jobs=0,
            measuring=MeasureOptions(label_output="nope"),
        )  # fmt: skip
    r = cli("prune", str(two_outputs / "two.keras"), "--data", str(two_outputs / "d.npz"), "--label-output", "nope")
    assert r.returncode == 2 and "'nope' is not an output of the model (it has digit, odd)" in r.stderr, r.stderr

"""The fit (issue 45): rewrites of a float graph that let a delegate take a node it refuses, each kept only where the
delegate takes more and the outputs stay the same, and never moving the model's inputs or outputs.

Tiny seeded graphs, one per rewrite, converted with the TFLite converter (or edited with the fit's own `Edit`
where the converter folds the pattern away); the CNN of conftest (Conv, MaxPool, Flatten, Dense, Dense) and one
with GlobalAveragePooling2D for Core ML.
"""

from __future__ import annotations

import numpy as np
import pytest
from delegate_fixtures import from_function

from optimize.delegates.blocking import causes
from optimize.models import _tf
from optimize.models.tflite import read_model
from optimize.transforms.tflite import fit_rewrites
from optimize.transforms.tflite.fit import OutputCheck, fit_graph, reports
from optimize.transforms.tflite.fit_edit import Edit
from optimize.transforms.tflite.fit_rewrites import FLOAT_MASK, NON_NEGATIVE_IDS, Facts, Rewrite

RNG = np.random.default_rng(0)
POS = RNG.standard_normal((10, 8)).astype(np.float32)
TOKEN = RNG.standard_normal((1, 1, 8)).astype(np.float32)
TABLE = RNG.standard_normal((100, 8)).astype(np.float32)


@pytest.fixture(scope="module")
def graphs() -> dict[str, bytes]:
    tf = _tf.tf()
    spec = tf.TensorSpec
    return {
        "pos_const": from_function(lambda x: tf.nn.relu(x + POS) * 2.0, spec([1, 10, 8])),
        "pos_runtime": from_function(lambda x: x + tf.reshape(x * 2.0, [10, 8]), spec([1, 10, 8])),
        "cls": from_function(lambda x: tf.concat([TOKEN, x], axis=1) * 2.0, spec([1, 4, 8])),
        "bcast": from_function(lambda x, y: x * 2.0 + y, spec([1, 1, 8]), spec([1, 4, 8])),
        "wrap": from_function(
            lambda ids: tf.gather(TABLE, tf.where(ids < 0, ids + 100, ids)) * 2.0, spec([1, 6], tf.int32)
        ),
        "mask": from_function(
            lambda x, m: tf.where(tf.cast(m, tf.bool)[..., None], x * 2.0, 0.0),
            spec([1, 4, 8]),
            spec([1, 4], tf.int32),
        ),
    }


@pytest.fixture(scope="module")
def gap_cnn() -> bytes:
    """Conv -> Conv -> GlobalAveragePooling2D -> Dense: its MEAN keeps it off Core ML."""
    keras = _tf.keras()
    keras.utils.set_random_seed(0)
    x = keras.Input((12, 12, 3))
    h = keras.layers.Conv2D(8, 3, padding="same", activation="relu")(x)
    h = keras.layers.Conv2D(16, 3, strides=2, padding="same", activation="relu")(h)
    y = keras.layers.Dense(5)(keras.layers.GlobalAveragePooling2D()(h))
    return _tf.tf().lite.TFLiteConverter.from_keras_model(keras.Model(x, y)).convert()


def _samples(content: bytes, n: int = 8, ids: bool = False) -> list:
    from optimize.models import runtime

    details = runtime.Runner(runtime.load(content, threads=1)).inputs
    rng = np.random.default_rng(1)
    out = []
    for _ in range(n):
        xs = [
            rng.integers(0, 100 if ids else 2, d["shape"]).astype(d["dtype"])
            if np.dtype(d["dtype"]).kind == "i"
            else rng.standard_normal(d["shape"]).astype(np.float32)
            for d in details
        ]
        out.append(xs[0] if len(xs) == 1 else xs)
    return out


def _io(content: bytes) -> list[tuple]:
    """The model's inputs and outputs as a user sees them: name, shape, dtype."""
    from optimize.models import runtime

    r = runtime.Runner(runtime.load(content, threads=1))
    return [(d["name"], tuple(d["shape"]), np.dtype(d["dtype"]).name) for d in [*r.inputs, *r.outputs]]


def _outputs(content: bytes, samples: list) -> list[np.ndarray]:
    from optimize.models import runtime

    r = runtime.Runner(runtime.load(content, threads=1))
    return [np.concatenate([np.ravel(o) for o in r.run_fresh(s)]) for s in samples]


def _fit(content: bytes, facts: Facts | None = None, ids: bool = False, targets=("gpu", "coreml", "nnapi")):
    samples = _samples(content, ids=ids)
    fitted = fit_graph(content, targets, facts, OutputCheck(content, samples, 1))
    return fitted, samples


def _same(a: bytes, b: bytes, samples, exact: bool = True) -> None:
    for x, y in zip(_outputs(a, samples), _outputs(b, samples)):
        if exact:
            assert np.array_equal(x, y)
        else:
            np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)


def test_a_flatten_before_dense_layers_is_folded_and_core_ml_takes_all_of_it(float_tflite, digits):
    content = float_tflite.read_bytes()
    assert reports(content, ["coreml"])["coreml"].verdict == "partial"  # the Flatten's RESHAPE (Core ML 3+)
    samples = [digits["x_test"][i : i + 1] for i in range(40)]
    fitted = fit_graph(content, ("coreml", "gpu"), None, OutputCheck(content, samples, 1))
    assert fitted.bought == ["coreml"] and fitted.after == {"coreml": "full", "gpu": "full"}
    (step,) = fitted.kept
    assert step.rewrite == "flatten-into-dense" and step.node.endswith("RESHAPE") and step.max_abs == 0.0
    assert "convolution" in step.detail  # the map is more than one row: Core ML's dense layer takes one row
    _same(content, fitted.content, samples)  # bit for bit
    assert _io(fitted.content) == _io(content)


def test_a_global_average_pool_becomes_average_pool_2d(gap_cnn):
    fitted, samples = _fit(gap_cnn)
    assert fitted.bought == ["coreml"]
    (step,) = fitted.kept
    assert step.rewrite == "mean-as-pool" and step.relative <= 1e-5
    names = [op.name for op in read_model(fitted.content).main.ops]
    assert "MEAN" not in names and "AVERAGE_POOL_2D" in names and "RESHAPE" not in names  # the dense layer flattens
    _same(gap_cnn, fitted.content, samples, exact=False)
    assert _io(fitted.content) == _io(gap_cnn)


@pytest.mark.parametrize("name", ["pos_const", "pos_runtime"])
def test_a_broadcast_operand_is_given_its_batch_axis(graphs, name):
    content = graphs[name]
    fitted, samples = _fit(content, targets=("gpu",))
    assert fitted.before == {"gpu": "partial"} and fitted.bought == ["gpu"]
    assert [s.rewrite for s in fitted.kept] == ["batch-axis"]
    assert ("constant" in fitted.kept[0].detail) == (name == "pos_const")  # a constant is read in the new shape
    _same(content, fitted.content, samples)
    assert _io(fitted.content) == _io(content)


def test_a_class_token_concatenation_is_built_in_4d(graphs):
    content = graphs["cls"]
    gpu = reports(content, ["gpu"])["gpu"]
    assert gpu.veto_code == "build-failure" and gpu.nodes_accepted == 2  # accepted, then the build fails
    fitted, samples = _fit(content, targets=("gpu",))
    assert fitted.bought == ["gpu"] and [s.rewrite for s in fitted.kept] == ["class-token"]
    _same(content, fitted.content, samples)
    assert _io(fitted.content) == _io(content)


def _with_broadcast(content: bytes) -> bytes:
    """The bcast graph with a BROADCAST_TO between its MUL [1,1,8] and its ADD (the converter leaves it to ADD)."""
    e = Edit(content)
    mul = next(k for k in range(e.count) if e.name(k) == "MUL")
    add = next(k for k in range(e.count) if e.name(k) == "ADD")
    y = e.out(mul)
    shape = e.constant("shape", np.array([1, 4, 8], np.int32), 2)
    wide = e.tensor(y, (1, 4, 8), "wide")
    e.insert(add, "BROADCAST_TO", [y, shape], [wide])
    e.model.operatorCodes[e.op(add).opcodeIndex].version = 2  # the runtime registers BROADCAST_TO from version 2
    e.set_input(add + 1, e.ins(add + 1).index(y), wide)
    return e.save()


def test_a_broadcast_its_reader_does_itself_is_left_out(graphs):
    content = _with_broadcast(graphs["bcast"])
    assert reports(content, ["gpu"])["gpu"].verdict == "partial"  # BROADCAST_TO: not supported
    fitted, samples = _fit(content, targets=("gpu",))
    assert fitted.bought == ["gpu"] and [s.rewrite for s in fitted.kept] == ["implicit-broadcast"]
    _same(content, fitted.content, samples)


def test_the_id_wrap_goes_only_where_the_ids_are_declared_non_negative(graphs):
    content = graphs["wrap"]
    kept, _ = _fit(content, Facts(), ids=True, targets=("gpu",))
    assert not kept.kept  # ids the model may be given negative: the wrap is the model's own computation
    declared, samples = _fit(content, Facts(non_negative=frozenset({"ids"})), ids=True, targets=("gpu",))
    assert [s.rewrite for s in declared.kept] == ["ids-wrap"]
    refused = [len(causes(reports(c, ["gpu"])["gpu"])) for c in (content, declared.content)]
    assert refused == [4, 1]  # LESS, ADD, SELECT and GATHER; then GATHER alone (its ids are 2-D)
    _same(content, declared.content, samples)
    named, _ = _fit(content, Facts(options=frozenset({NON_NEGATIVE_IDS})), ids=True, targets=("gpu",))
    assert [s.rewrite for s in named.kept] == ["ids-wrap"]
    assert _io(declared.content) == _io(content)


def test_a_float_mask_is_an_option_never_a_default(graphs):
    content = graphs["mask"]
    default, samples = _fit(content, targets=("gpu",))
    assert not default.kept and default.content == content  # the input's dtype is the model's contract
    opted, _ = _fit(content, Facts(options=frozenset({FLOAT_MASK})), targets=("gpu",))
    assert [s.rewrite for s in opted.kept][:2] == ["float-mask", "bool-late"]  # then the bool reshaped as float
    before, after = _io(content), _io(opted.content)
    assert [io[2] for io in before[:2]] == ["float32", "int32"] and [io[2] for io in after[:2]] == [
        "float32",
        "float32",
    ]
    _same(content, opted.content, samples)  # the same 0/1 mask, fed as float


def test_a_rewrite_that_moves_the_outputs_is_dropped(graphs, monkeypatch):
    def shifted(e: Edit, k: int, f) -> str:
        """batch-axis, then its constant moved by 0.5: the GPU takes it, the outputs are not the same."""
        detail = fit_rewrites.batch_axis(e, k, f)
        const = next(t for t in e.ins(k) if e.is_const(t))
        e.g.set_const(const, e.const(const) + 0.5)
        return detail

    real = fit_rewrites.REWRITES["batch-axis"]
    monkeypatch.setitem(fit_rewrites.REWRITES, "batch-axis", Rewrite("batch-axis", real.ops, real.when, shifted, ""))
    content = graphs["pos_const"]
    fitted, _ = _fit(content, targets=("gpu",))
    assert not fitted.kept and fitted.content == content and fitted.bought == []
    (step,) = fitted.steps
    assert step.why.startswith("the outputs moved") and step.max_abs == pytest.approx(1.0)  # relu(x + c) * 2


def test_nothing_is_rewritten_on_a_graph_every_target_takes(gap_cnn):
    fitted = fit_graph(gap_cnn, ("gpu", "nnapi"))
    assert fitted.before == fitted.after == {"gpu": "full", "nnapi": "full"}
    assert not fitted.steps and fitted.content == gap_cnn


@pytest.mark.slow
def test_a_sweep_makes_the_missing_schemes_from_the_fitted_graph_and_core_ml_gets_a_pick(
    keras_model, data_npz, tmp_path
):
    from optimize.core.recipe import build
    from optimize.core.results import load_study
    from optimize.decide.choose import recommend
    from optimize.engine import sweeps
    from optimize.models.data import load_data

    recipes = [
        build("float16", [{"technique": "convert", "scheme": "float16"}]),
        build("int8", [{"technique": "convert", "scheme": "int8"}]),
    ]
    study = sweeps.sweep(keras_model, data_npz, tmp_path, recipes=recipes, runs=3, jobs=0, cache=False)
    names = [c.name for c in study.candidates]
    assert names == ["float32", "float16", "int8", "fit-float32", "fit-float16"]  # int8 is no Core ML candidate
    fitted = study.candidate("fit-float16")
    assert fitted.ok and fitted.delegates["coreml"].verdict == "full" and fitted.fit.bought == ["coreml"]
    assert [s.rewrite for s in fitted.fit.kept] == ["flatten-into-dense"]
    assert recommend(study, "coreml").chosen == "fit-float16"
    assert load_study(tmp_path).candidate("fit-float32").fit == study.candidate("fit-float32").fit  # in study.json
    x = load_data(data_npz).x_test
    _same(
        (tmp_path / "float16.tflite").read_bytes(),
        (tmp_path / "fit-float16.tflite").read_bytes(),
        [x[i : i + 1] for i in range(len(x))],
    )
    no_fit = sweeps.sweep(keras_model, data_npz, tmp_path / "no", recipes=recipes[:1], runs=3, jobs=0, fit=False)
    assert [c.name for c in no_fit.candidates] == ["float32", "float16"]


def _cnn(head) -> bytes:
    keras = _tf.keras()
    keras.utils.set_random_seed(0)
    x = keras.Input((8, 8, 3))
    h = keras.layers.Conv2D(8, 3, padding="same", activation="relu")(x)
    return _tf.tf().lite.TFLiteConverter.from_keras_model(keras.Model(x, head(keras.layers, h))).convert()


HEADS = {
    # a Flatten after a global pool: a RESHAPE to the same shape, left out, then the MEAN as a pool
    "gap-flatten": (
        lambda L, h: L.Dense(4)(L.Flatten()(L.GlobalAveragePooling2D()(h))),
        ["identity-reshape", "mean-as-pool"],
    ),
    "global-max": (lambda L, h: L.Dense(4)(L.GlobalMaxPooling2D()(h)), ["max-as-pool"]),
    # two branches added before the last dense layer: the convolution's row carried through the ADD as 4-D
    "two-branches": (
        lambda L, h: L.Dense(4)(
            L.Add()([L.Dense(8)(L.Flatten()(L.MaxPooling2D()(h))), L.Dense(8)(L.GlobalAveragePooling2D()(h))])
        ),
        ["flatten-into-dense", "mean-as-pool"],
    ),
    "prelu-channel-pad": (
        lambda L, h: L.Conv2D(12, 1)(
            L.PReLU(shared_axes=[1, 2])(L.Lambda(lambda t: _tf.tf().pad(t, [[0, 0], [0, 0], [0, 0], [0, 4]]))(h))
        ),
        ["channel-pad", "prelu-as-relu"],
    ),
}


@pytest.mark.parametrize("name", sorted(HEADS))
def test_core_ml_takes_more_cnn_shapes_once_fitted(name):
    head, rewrites = HEADS[name]
    content = _cnn(head)
    fitted, samples = _fit(content, targets=("coreml", "gpu"))
    assert fitted.before["coreml"] != "full" and fitted.bought == ["coreml"], fitted.steps
    assert sorted({s.rewrite for s in fitted.kept}) == rewrites
    assert fitted.after["gpu"] == "full"  # what the GPU ran fully it still runs fully
    _same(content, fitted.content, samples, exact=name in ("global-max", "prelu-channel-pad"))
    assert _io(fitted.content) == _io(content)

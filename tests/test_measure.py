"""Measurements you can trust on any task: several inputs and outputs, labels for the right output,
regression in its own units, yes/no heads, label-free goals, seeded calibration sampling, noisy latency."""

from __future__ import annotations

import numpy as np
import pytest

import optimize
from optimize.core.errors import DataError
from optimize.core.recipe import build
from optimize.core.vocab import Task
from optimize.models import tasks
from optimize.models.data import from_arrays, load_data
from optimize.models.tasks import Head


@pytest.fixture(scope="module")
def two_input(tmp_path_factory, digits):
    """image + features -> logits (10 classes) and score (a value): a functional tf_keras model."""
    from optimize.models import _tf

    keras = _tf.keras()
    keras.utils.set_random_seed(0)
    img = keras.Input((8, 8, 1), name="image")
    feat = keras.Input((3,), name="features")
    h = keras.layers.Flatten()(keras.layers.Conv2D(8, 3, activation="relu")(img))
    h = keras.layers.Concatenate()([h, keras.layers.Dense(8, activation="relu")(feat)])
    logits = keras.layers.Dense(10, name="logits")(h)
    score = keras.layers.Dense(1, name="score")(h)
    model = keras.Model([img, feat], [logits, score])
    x, y = digits["x_train"], digits["y_train"]
    f = np.random.default_rng(0).normal(size=(len(x), 3)).astype(np.float32)
    s = (x.mean(axis=(1, 2, 3)) * 4 + f[:, 0]).astype(np.float32)[:, None]
    model.compile("adam", [keras.losses.SparseCategoricalCrossentropy(from_logits=True), "mse"])
    model.fit([x, f], [y, s], epochs=20, batch_size=32, verbose=0)
    folder = tmp_path_factory.mktemp("two")
    path = folder / "two.keras"
    model.save(path)
    data = folder / "two.npz"
    np.savez(data, **{"x:image": x, "x:features": f, "y:logits": y, "y:score": s})
    return path, data


def test_two_inputs_two_outputs_are_fed_and_scored_by_name(two_input, tmp_path):
    model, data = two_input
    cand = optimize.run(build("int8", [{"technique": "convert", "scheme": "int8"}]), model, data, tmp_path, jobs=0)
    assert cand.ok, cand.error
    m = cand.metrics
    assert m.accuracy.task == "classification" and m.accuracy.output == "logits"
    assert m.accuracy.top1 > 0.8  # the logits head, not the score head
    # every output measured, by the model's own names (not the converted model's output_0, output_1)
    assert [o.name for o in m.fidelity.outputs] == ["logits", "score"]
    assert [o.labelled for o in m.fidelity.outputs] == [True, False]
    assert all(o.relative_error is not None for o in m.fidelity.outputs)
    logits, score = m.fidelity.outputs
    assert logits.top1_agreement is not None and score.top1_agreement is None  # agreement where outputs are classes
    assert m.accuracy_delta is not None and abs(m.accuracy_delta) < 0.05


def test_label_output_picks_the_regression_head(two_input, tmp_path):
    from optimize.models.inputs import MeasureOptions

    model, data = two_input
    recipe = build("f16", [{"technique": "convert", "scheme": "float16"}])
    opts = MeasureOptions(label_output="score")
    cand = optimize.run(recipe, model, data, tmp_path, jobs=0, measuring=opts)
    acc = cand.metrics.accuracy
    assert acc.task == "regression" and acc.output == "score" and acc.mae is not None and acc.rmse >= acc.mae
    assert cand.metrics.error_ratio == pytest.approx(1.0, abs=0.05)
    assert cand.metrics.accuracy_delta is None


@pytest.mark.parametrize(
    "arrays, expected",
    [
        ({"x:image": np.zeros((4, 8, 8, 1), np.float32)}, "no array for the model's input features"),
        ({"x:image": np.zeros((4, 8, 8, 1), np.float32), "x:features": np.zeros((3, 3), np.float32)}, "has 3 samples"),
        ({"x": np.zeros((4, 8, 8, 1), np.float32)}, "The model has 2 inputs"),
        ({"x:image": np.zeros((4, 8, 8, 1), np.float32), "x:feats": np.zeros((4, 3), np.float32)}, "x:feats"),
    ],
)
def test_several_inputs_bad_data_is_one_line(two_input, tmp_path, arrays, expected):
    model, _ = two_input
    bad = tmp_path / "bad.npz"
    np.savez(bad, **arrays)
    with pytest.raises(DataError, match=expected):
        optimize.run(build("f16", [{"technique": "convert", "scheme": "float16"}]), model, bad, tmp_path / "o", jobs=0)
    assert not (tmp_path / "o").exists()


def test_hostile_npz_files_are_refused_by_name(tmp_path):
    import zipfile

    cases = {}
    np.savez(tmp_path / "scalar.npz", x=np.float32(3))
    cases["scalar.npz"] = "is a scalar"
    nan = np.zeros((10, 4), np.float32)
    nan[2, 1] = np.nan
    np.savez(tmp_path / "nan.npz", x=nan)
    cases["nan.npz"] = "x contains 1 NaN values"
    inf = np.zeros((10, 4), np.float32)
    inf[:3] = np.inf
    np.savez(tmp_path / "inf.npz", x_train=inf)
    cases["inf.npz"] = "contains 12 infinite values"
    with zipfile.ZipFile(tmp_path / "junk.npz", "w") as z:
        z.writestr("x.npy", b"\x93NUMPY garbage that is not a header")
    cases["junk.npz"] = "not a readable .npy"
    # a header that claims 233 TiB: forged shape, tiny payload
    header = np.lib.format.header_data_from_array_1_0(np.zeros((1,), np.float32))
    header["shape"] = (2**45 // 4 * 233 // 32, 32)
    import io

    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, header)
    with zipfile.ZipFile(tmp_path / "liar.npz", "w") as z:
        z.writestr("x.npy", buf.getvalue() + b"\0" * 64)
    cases["liar.npz"] = "claims"
    np.savez(tmp_path / "extra.npz", x=np.zeros((4, 2)), colour=np.zeros(3))
    cases["extra.npz"] = "unknown array 'colour'"
    for name, expected in cases.items():
        with pytest.raises(DataError, match=expected):
            load_data(tmp_path / name)


def test_one_sample_serves_every_split():
    ds = from_arrays(x=np.ones((1, 4), np.float32))
    assert len(ds.x_cal) == len(ds.x_test) == 1


def test_calibration_samples_are_seeded_and_spread():
    x = np.arange(1000, dtype=np.float32)[:, None]
    a = from_arrays(x_train=x, calibration_seed=0).calibration(100)
    b = from_arrays(x_train=x, calibration_seed=0).calibration(100)
    c = from_arrays(x_train=x, calibration_seed=1).calibration(100)
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    assert a.max() > 500  # not the first 100 in file order


def test_coverage_says_how_much_of_the_test_data_calibration_misses():
    from optimize.models.data import coverage

    ds = from_arrays(
        x_train=np.linspace(0, 1, 100, dtype=np.float32)[:, None], x_test=np.array([[0.5], [2.0]], np.float32)
    )
    assert coverage(ds, 100) == {"x": 0.5}


@pytest.mark.parametrize(
    "head, y, task",
    [
        (Head((1, 10), "softmax"), np.array([1, 2, 3]), Task.CLASSIFICATION),
        (Head((1, 10), "linear"), np.array([1, 2, 3]), Task.CLASSIFICATION),
        (Head((1, 1), "sigmoid"), np.array([0, 1, 1]), Task.BINARY),
        (Head((1, 1), "linear"), np.array([0, 1, 1]), Task.BINARY),
        (Head((1, 1), "linear"), np.array([0.3, 1.7]), Task.REGRESSION),
        (Head((1, 4), "sigmoid"), np.array([[0, 1, 1, 0]]), Task.MULTILABEL),
        (Head((1, 63), "linear"), None, Task.OTHER),
        (Head((1, 10), "softmax"), None, Task.CLASSIFICATION),
        (Head((1, 64, 64, 1), "sigmoid"), None, Task.OTHER),
    ],
)
def test_task_detection(head, y, task):
    assert tasks.detect(head, y) == task


def test_labels_that_do_not_fit_the_task_are_refused():
    head = Head((1, 10), "softmax")
    with pytest.raises(DataError, match="one-hot"):
        tasks.check_labels(Task.CLASSIFICATION, head, np.eye(10)[:3])
    with pytest.raises(DataError, match="float labels"):
        tasks.check_labels(Task.CLASSIFICATION, head, np.array([0.5, 1.5]))
    with pytest.raises(DataError, match="class ids 0..12"):
        tasks.check_labels(Task.CLASSIFICATION, head, np.array([0, 12]))
    assert tasks.check_labels(Task.CLASSIFICATION, head, np.array([1.0, 2.0])).dtype == np.int64


def test_binary_scores_accuracy_at_half_and_auc():
    out = np.array([[0.9], [0.2], [0.7], [0.4]])
    got = tasks.scores(Task.BINARY, out, np.array([1, 0, 0, 1]), Head((1, 1), "sigmoid"))
    assert got["top1"] == 0.5 and got["auc"] == pytest.approx(0.75)


def test_mask_iou():
    a = np.zeros((1, 4, 4, 1))
    b = np.zeros((1, 4, 4, 1))
    a[0, :2], b[0, 1:3] = 1, 1
    from optimize.measure import metrics

    assert metrics.mask_iou(a, b) == pytest.approx(4 / 12)


@pytest.fixture(scope="module")
def sigmoid_model(tmp_path_factory, digits):
    """A face / not-face style net: one sigmoid unit, 0/1 labels (here: digit >= 5)."""
    from optimize.models import _tf

    keras = _tf.keras()
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.layers.Input((8, 8, 1)),
            keras.layers.Conv2D(8, 3, activation="relu"),
            keras.layers.Flatten(),
            keras.layers.Dense(16, activation="relu"),
            keras.layers.Dense(1, activation="sigmoid"),
        ]
    )
    y = (digits["y_train"] >= 5).astype(np.int64)
    model.compile("adam", "binary_crossentropy")
    model.fit(digits["x_train"], y, epochs=15, verbose=0)
    folder = tmp_path_factory.mktemp("sig")
    model.save(folder / "sig.keras")
    data = folder / "sig.npz"
    np.savez(
        data,
        x_train=digits["x_train"],
        y_train=y,
        x_test=digits["x_test"],
        y_test=(digits["y_test"] >= 5).astype(np.int64),
    )
    return folder / "sig.keras", data


def test_a_sigmoid_head_is_scored_as_binary_and_fine_tunes(sigmoid_model, tmp_path):
    model, data = sigmoid_model
    cand = optimize.run(
        build("p", [{"technique": "prune", "epochs": 1}, {"technique": "convert"}]), model, data, tmp_path, jobs=0
    )
    assert cand.ok, cand.error
    acc = cand.metrics.accuracy
    assert acc.task == "binary" and acc.top1 > 0.8 and acc.auc > 0.85 and acc.mae is None
    assert cand.metrics.fidelity.top1_agreement is None  # one unit: no argmax to agree on


def test_the_measured_split_is_whole_by_default_and_bounded_by_the_outputs_memory(monkeypatch):
    """The whole test split by default (issue 43); a split whose outputs would outgrow OUTPUT_BUDGET (a
    segmenter's masks on thousands of samples) is measured on a stratified sample of what fits, said so."""
    from types import SimpleNamespace

    from optimize.measure import metrics

    y = np.repeat(np.arange(2), 300)
    x = np.zeros((600, 4), np.float32)
    ds = from_arrays(x_train=x, y_train=y, x_test=x, y_test=y)
    runner = SimpleNamespace(outputs=[{"shape": np.array([1, 64, 64, 1])}])  # 16 KiB a sample
    cut, t = metrics.measured_split(ds, None, runner)
    assert cut is ds and t.samples == 600 and t.method == "whole"
    cut, t = metrics.measured_split(ds, 100, runner)
    assert t.samples == 100 and t.why == "--test-samples 100"
    monkeypatch.setattr(metrics, "OUTPUT_BUDGET", 16 * 1024 * 50)
    cut, t = metrics.measured_split(ds, None, runner)
    assert (t.samples, t.of, t.method) == (50, 600, "stratified") and len(cut.x_test) == 50
    assert t.why.startswith("the outputs of 600 would hold") and "50 keep them under" in t.why


def test_accuracy_is_the_whole_test_split_by_an_independent_count(float_tflite, tmp_path):
    """Issue 43: 600 test samples sorted by class; the tool scored the first 500 (a head slice) where Keras and
    an independent run of the file scored all 600. The figure must equal a count made here with the plain
    LiteRT interpreter on every test sample."""
    from ai_edge_litert.interpreter import Interpreter
    from sklearn.datasets import load_digits

    d = load_digits()
    x = (d.images / 16.0).astype(np.float32)[..., None]
    y = d.target.astype(np.int64)
    order = np.argsort(y, kind="stable")[:600]  # sorted by class: a head slice would miss the last classes
    data = tmp_path / "sorted.npz"
    np.savez(data, x_train=x[:100], y_train=y[:100], x_test=x[order], y_test=y[order])
    m = optimize.evaluate(float_tflite, data, timing=False)
    it = Interpreter(model_path=str(float_tflite))
    it.allocate_tensors()
    inp, out = it.get_input_details()[0], it.get_output_details()[0]
    right = 0
    for xi, yi in zip(x[order], y[order]):
        it.set_tensor(inp["index"], xi[None])
        it.invoke()
        right += int(it.get_tensor(out["index"])[0].argmax() == yi)
    assert m.accuracy.samples == 600 and m.test.words() == "all 600 test samples"
    assert m.accuracy.top1 == right / 600
    capped = optimize.evaluate(float_tflite, data, timing=False, samples=100)
    assert capped.accuracy.samples == 100 and capped.test.method == "stratified" and capped.test.of == 600


def test_batched_outputs_are_the_one_sample_outputs(float_tflite, tmp_path):
    """The whole split goes through in batches where the model takes one (issue 43: the figures must not move,
    only the time): the same arrays as one invoke a sample; a model without a free batch axis, one at a time."""
    from optimize.core.registry import Context, get
    from optimize.measure import batched
    from optimize.models import runtime

    x = np.random.default_rng(0).random((130, 8, 8, 1), dtype=np.float32)
    tech = get("quantize")
    made = {
        scheme: tech.fn(float_tflite, tech.parse({"scheme": scheme, "io": io}), Context(workdir=tmp_path / scheme, data=from_arrays(x=x)))
        for scheme, io in (("dynamic", "float"), ("int8", "int8"))
    }  # fmt: skip
    for path in (float_tflite, *made.values()):
        runner = runtime.Runner(runtime.load(path, like=x[:1]))
        assert batched.batchable(runner)
        got = batched.predict(path, runner, x)
        want = runner.predict(x)
        assert [g.shape for g in got] == [w.shape for w in want] == [(130, 10)]
        assert np.allclose(got[0], want[0], rtol=0, atol=1e-5)
    fixed = runtime.Runner(runtime.load(float_tflite, like=x[:1]))
    fixed.inputs = [{**d, "shape_signature": np.array([1, 8, 8, 1])} for d in fixed.inputs]
    assert not batched.batchable(fixed)


def test_samples_this_process_ran_already_are_not_run_again_in_a_batch(float_tflite, monkeypatch):
    """int16x8's failure check runs it on test samples (reference kernels: 0.3 s an invoke on MobileNetV2), and
    measuring it ran them again in a batch: 3.3 s of its 4.0 s accuracy. Where this process kept the model's
    outputs on half the samples or more, they go one at a time, those taken as they were; the figures are the
    same."""
    import hashlib

    from optimize.measure import batched
    from optimize.models import runtime

    x = np.random.default_rng(1).random((8, 8, 8, 1), dtype=np.float32)
    digest = hashlib.sha256(open(float_tflite, "rb").read()).hexdigest()
    runner = runtime.Runner(runtime.load(float_tflite, like=x[:1]), digest=digest)
    want = runner.predict(x[:8])
    runtime._SEEN.clear()
    invokes = []
    real = runtime.Runner.invoke
    monkeypatch.setattr(runtime.Runner, "invoke", lambda self: invokes.append(1) or real(self))
    for i in range(3):  # fewer than half seen: a batch
        runner.run_fresh(x[i : i + 1])
    assert runtime.seen_share(digest, x) == 3 / 8
    invokes.clear()
    got = batched.predict(float_tflite, runner, x)
    assert len(invokes) < 8  # batched: one invoke for the batch, two for the one-sample check
    runner.run_fresh(x[3:4])
    assert runtime.seen_share(digest, x) == 4 / 8 and runtime.seen_share(None, x) == 0.0
    invokes.clear()
    again = batched.predict(float_tflite, runner, x)
    assert len(invokes) == 4  # the four samples not seen, one invoke each
    for out in (got, again):
        assert np.allclose(out[0], want[0], rtol=0, atol=1e-5)
    runtime._SEEN.clear()


def test_nodes_list_what_ops_details_lists(float_tflite):
    """`runtime.nodes` (every runner reads it: a detector's post-processing, XNNPACK's partitions) gives the op
    names and outputs `_get_ops_details` gives, without reading every operand's details."""
    from optimize.models import runtime

    loaded = runtime.load(float_tflite)
    want = [(d["op_name"], list(d["outputs"])) for d in loaded.interpreter._get_ops_details()]
    assert runtime.nodes(loaded.interpreter) == want
    assert loaded.xnnpack == any(name == "DELEGATE" for name, _ in want)

"""Judged on held-out samples, and `debug` saying only what it measured (issue 33): the selective search and
debug judge on samples the calibration never saw; a mixed-int8 that raised nothing is not shown beside int8 as
something else; a fix is offered only when measuring it helped, and what a sweep measured is quoted from it."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from study_fixtures import candidate, study

from optimize.core.errors import StudyError
from optimize.core.recipe import build
from optimize.core.results import SearchStep, Step
from optimize.decide.debug_advice import Tried, debug_fixes
from optimize.engine import debug_fixes as fx
from optimize.models.data import count, from_arrays, take
from optimize.transforms.tflite.selective import MIN_HELD_OUT, held_out


def _rows(xs) -> set[float]:
    """Each sample's identity (its first value: the fixtures number their samples)."""
    return {float(r) for r in np.asarray(xs).reshape(count(xs), -1)[:, 0]}


def numbered(n: int, labels: bool = True) -> dict:
    x = np.arange(n, dtype=np.float32)[:, None].repeat(4, axis=1)
    return {"x": x, "y": (np.arange(n) % 3).astype(np.int64)} if labels else {"x": x}


def test_a_small_training_split_holds_a_share_out_of_the_calibration():
    """The rotation classifier: 52 training samples, all of them calibration (200 asked): before issue 33 the
    search judged on the very samples it calibrated on."""
    ds = from_arrays(**numbered(65))
    assert count(ds.x_train) == 52
    where = held_out(ds, samples=200, eval_samples=500, seed=0)
    judged = _rows(take(ds.x_train, where.pick))
    calibrated = _rows(where.calibration.calibration(200))
    assert len(judged) == MIN_HELD_OUT and len(calibrated) == 52 - MIN_HELD_OUT
    assert not judged & calibrated
    assert "held out of the calibration" in where.words


def test_a_large_training_split_judges_on_what_calibration_does_not_draw():
    ds = from_arrays(x_train=np.arange(480.0)[:, None], y_train=np.zeros(480), x_test=np.ones((10, 1)))
    where = held_out(ds, samples=200, eval_samples=50, seed=0)
    judged = _rows(take(ds.x_train, where.pick))
    assert len(judged) == 50 and not judged & _rows(ds.calibration(200))  # plain int8's calibration samples
    assert not judged & _rows(where.calibration.calibration(200))  # and the search's own
    assert where.words.startswith("50 held-out samples")


def test_a_calibration_split_of_its_own_leaves_every_training_sample_to_judge_on():
    ds = from_arrays(x_train=np.arange(30.0)[:, None], y_train=np.zeros(30), x_cal=np.ones((8, 1)) * -1)
    where = held_out(ds, samples=200, eval_samples=500, seed=0)
    assert len(where.pick) == 30 and where.calibration is ds and where.pool == "train"


def test_without_labels_the_calibration_split_is_split():
    ds = from_arrays(x_cal=np.arange(40.0)[:, None])
    where = held_out(ds, samples=200, eval_samples=500, seed=0)
    assert where.pool == "cal" and not _rows(take(ds.x_cal, where.pick)) & _rows(where.calibration.x_cal)


def _selective(name: str, notes: list[str], search=(), rescue=()):
    steps = [Step.of("convert", scheme="float32"), Step.of("selective", max_accuracy_drop=0.005)]
    c = candidate(name, "int8", steps=steps)
    return c.model_copy(update={"notes": notes, "search": list(search), "rescue": list(rescue)})


def test_a_mixed_int8_that_raised_nothing_is_left_out_as_a_duplicate_of_int8():
    from optimize.engine.runs import _duplicate_rescue

    note = (
        "selective: on 20 samples held out of the calibration (it draws from the other 32) (not the test split the "
        "table reports): full int8 0.00 pt lost; raised 0 op(s) [none] -> 0.00 pt lost"
    )
    run = SimpleNamespace(rescued="mixed-int8", done={"mixed-int8": _selective("mixed-int8", [note])})
    why = _duplicate_rescue(run)["mixed-int8"]
    assert "would duplicate int8" in why and "on 20 samples held out of the calibration" in why
    raised = SearchStep(op="CONV_2D", tensor="t", precision="float", metric=0.0, size_bytes=1, qdq_ops=2, kept=True)
    run.done["mixed-int8"] = _selective("mixed-int8", [note], search=[raised])
    assert _duplicate_rescue(run) == {}  # it raised an op: something else than int8
    run.rescued = None  # a mixed-int8 the user planned stays, whatever it found
    assert _duplicate_rescue(run) == {}


# ---- debug says only what it measured
def test_debug_offers_only_what_helped_and_says_by_how_much():
    report = SimpleNamespace(scheme="int8", output_error=0.2)
    tried = [
        Tried("keep CONV_2D #3 float", "optimize run mixed-int8 MODEL --data D.npz", 0.2, 0.19),
        Tried("keep the 3 ops feeding LOG float (its front end)", "optimize run mixed-int8 ...", 0.2, 0.01),
        Tried("other activation ranges (--ranges auto)", "optimize quantize ... --ranges auto", 0.2, 0.17),
        Tried("16-bit activations (int16x8)", "optimize quantize ... --scheme int16x8", failed="it does not load"),
        Tried("quantization-aware training", "optimize qat MODEL --data D.npz"),
    ]
    lines = debug_fixes(report, tried, cause="the power spectrum is quantized before LOG")
    assert lines[0] == "Cause: the power spectrum is quantized before LOG"
    fixes = [line for line in lines if line.startswith("Fix to try")]
    assert fixes == [
        "Fix to try: keep the 3 ops feeding LOG float (its front end): output error 0.2000 -> 0.0100 (-95%), "
        "measured here: `optimize run mixed-int8 ...`."
    ]
    assert "Measured, did not help: other activation ranges (--ranges auto): output error 0.2000 -> 0.1700 (-15%)" \
           ", measured here." in lines  # fmt: skip
    assert any(line.startswith("Measured, did not help: keep CONV_2D #3 float") for line in lines)
    assert "Not possible here: 16-bit activations (int16x8): it does not load; not suggested." in lines
    assert lines[-1] == "Not measured: quantization-aware training (`optimize qat MODEL --data D.npz`)."
    nothing = debug_fixes(report, tried[:1] + tried[2:3])
    assert not any(line.startswith("Fix to try") for line in nothing)
    assert nothing[0].startswith("No fix measured helps")
    assert debug_fixes(SimpleNamespace(scheme="int8", output_error=0.001), tried)[0].startswith("Nothing to fix")


def sweep_of_the_issue():
    """A classifier whose sweep measured int8 at -5.47 points, int16x8 at -41 points and QAT failing (its
    Keras 3 model does not rebuild in tf_keras)."""
    qat = [Step(technique="qat", params={}), Step.of("convert", scheme="int8")]
    return study(
        [
            candidate("float32"),
            candidate("int8", "int8", delta=-0.0547),
            candidate("int16x8", "int16x8", delta=-0.41),
            candidate("qat-int8", "int8", steps=qat, error="prune/cluster/qat: the Keras 3 model does not rebuild"),
        ]
    )


def test_debug_takes_what_the_sweep_measured_from_its_study():
    tried = fx.from_study(sweep_of_the_issue(), "out/study.json")
    lines = debug_fixes(SimpleNamespace(scheme="int8", output_error=0.05), tried)
    assert not any(line.startswith("Fix to try") for line in lines)
    assert (
        "Measured, did not help: 16-bit activations (int16x8): 5.5 -> 41.0 points of top-1 lost, measured by the "
        "sweep (int16x8 in out/study.json)." in lines
    )
    assert any(
        line.startswith("Failed in the sweep, as qat-int8 in out/study.json: quantization-aware training:")
        and line.endswith("not suggested.")
        for line in lines
    )
    good = study(
        [candidate("float32"), candidate("int8", "int8", delta=-0.08), candidate("int16x8", "int16x8", delta=-0.01)]
    )
    (t,) = fx.from_study(good, "s.json")
    assert t.helped and debug_fixes(SimpleNamespace(scheme="int8", output_error=0.05), [t])[0].startswith(
        "Fix to try: 16-bit activations (int16x8): 8.0 -> 1.0 points of top-1 lost, measured by the sweep"
    )


def test_debug_finds_the_study_of_the_same_model_only(tmp_path):
    s = sweep_of_the_issue()
    s.save(tmp_path / "study.json")
    model = tmp_path / "m.keras"
    mine, other = SimpleNamespace(fingerprint=s.model_fingerprint), SimpleNamespace(fingerprint="elsewhere")
    found = fx.find_study(None, model, mine)
    assert found is not None and found[1] == str(tmp_path / "study.json")
    assert fx.find_study(None, model, other) is None
    with pytest.raises(StudyError, match="the study of another model"):
        fx.find_study(tmp_path / "study.json", model, other)


@pytest.mark.slow
def test_the_mixed_int8_search_judges_on_samples_its_calibration_never_saw(keras_model, digits, tmp_path):
    """A small data set (65 samples, 52 for training): the search's note names the held-out samples."""
    import optimize

    data = tmp_path / "small.npz"
    x = np.concatenate([digits["x_train"], digits["x_test"]])[:65]
    y = np.concatenate([digits["y_train"], digits["y_test"]])[:65]
    np.savez(data, x=x, y=y)
    steps = [{"technique": "selective", "max_output_error": 1e-9, "max_evals": 4}]
    cand = optimize.run(build("sel", steps), keras_model, data, tmp_path / "out", delegates=False, jobs=0)
    assert cand.ok, cand.error
    note = next(n for n in cand.notes if n.startswith("selective: on "))
    assert "20 samples held out of the calibration (it draws from the other 32)" in note
    assert "not the test split the table reports" in note


def test_a_sweep_says_when_its_test_samples_are_its_calibration_samples(caplog):
    import logging

    from optimize.engine.runs import _judged_on_calibration

    int8 = build("int8", [{"technique": "convert", "scheme": "int8"}])
    only_test = from_arrays(x_test=np.ones((10, 2)), y_test=np.zeros(10), source="t.npz")
    with caplog.at_level(logging.WARNING):
        _judged_on_calibration(only_test, [int8])
        _judged_on_calibration(from_arrays(x=np.ones((10, 2)), y=np.zeros(10)), [int8])  # split 80/20: held out
        _judged_on_calibration(only_test, [build("f16", [{"technique": "convert", "scheme": "float16"}])])
    (message,) = [r.getMessage() for r in caplog.records]
    assert message.startswith("t.npz has no training split: int8 is calibrated on the same samples")

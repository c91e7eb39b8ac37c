"""When int8 hurts (issue 10): per-layer error analysis and the bounded selective-quantization search."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from optimize.core.recipe import build
from optimize.core.registry import Context, get
from optimize.measure import layer_error as debug
from optimize.models.tflite import read_model
from optimize.transforms.tflite import session as litert


@pytest.fixture(scope="module")
def session(float_tflite, digits, tmp_path_factory):
    from optimize.models.data import from_arrays

    ds = from_arrays(**digits)
    content = float_tflite.read_bytes()
    params = get("quantize").parse({"scheme": "int8"})
    ctx = Context(workdir=tmp_path_factory.mktemp("session"), data=ds)
    from optimize.transforms.tflite.quantize import _calibration_data, _inspect

    signature, inputs = _inspect(content, float_tflite)
    cal = _calibration_data(params, ctx, signature, inputs, float_tflite)
    return content, litert.Session(content, params, ctx, cal), ds


def test_one_op_can_be_kept_float(session):
    content, s, _ = session
    full = read_model(s.quantize())
    target = next(op for op in full.main.ops if op.name == "FULLY_CONNECTED")
    name = full.main.tensors[target.outputs[0]].name
    mixed = read_model(s.quantize({name: "float"}))
    out = next(t for t in mixed.main.tensors if t.name == name)
    assert out.dtype == "float32"
    assert full.main.tensors[target.outputs[0]].dtype == "int8"
    assert [op.name for op in mixed.main.ops].count("DEQUANTIZE") > [op.name for op in full.main.ops].count(
        "DEQUANTIZE"
    )


def test_layer_errors_compare_every_quantized_op_with_float(session):
    content, s, ds = session
    samples = debug.Samples.from_array(ds.x_test, 16)
    layers, out_err = debug.layer_errors(content, s.quantize(), samples)
    assert {le.op for le in layers} >= {"CONV_2D", "FULLY_CONNECTED"}
    for le in layers:
        assert le.rmse >= 0 and le.max_abs_error >= le.mean_abs_error >= 0
        # an int8 tensor's error is at least rounding noise and stays within a few steps on this model
        assert le.rmse_over_scale is not None and 0 < le.rmse_over_scale < 5, le
    assert abs(sum(le.weight_share for le in layers) - 1) < 0.05  # the quantized ops hold the weights
    assert 0 < out_err < 0.1


def test_analyze_ranks_and_measures_leave_one_out(session):
    content, s, ds = session
    report = debug.analyze(content, s.quantize, debug.Samples.from_array(ds.x_test, 16), leave_out=2)
    measured = [le for le in report.layers if le.output_error_without is not None]
    assert len(measured) == 2
    assert report.layers[: len(measured)] == sorted(measured, key=lambda le: le.output_error_without)
    assert report.samples == 16 and report.method.startswith("ai-edge-litert")


def test_debug_command_prints_the_table_and_json(cli, keras_model, data_npz):
    r = cli("debug", str(keras_model), "--data", str(data_npz), "--samples", "8", "--json")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["scheme"] == "int8" and rep["layers"] and rep["samples"] == 8
    r = cli("debug", str(keras_model), "--data", str(data_npz), "--samples", "8")
    assert r.returncode == 0 and "rmse/scale" in r.stdout
    assert rep["fixes"] and any(line.startswith(("Fix to try:", "Nothing to fix:")) for line in rep["fixes"])
    assert rep["fixes"][0].split(":")[0] in r.stdout  # the README's promise: the fix to try, printed


@pytest.fixture(scope="module")
def log_mel(tmp_path_factory):
    """A log-mel front end in miniature (issue 29): DFT as two matmuls, power, a mel matmul, LOG(x + 1e-6), on
    quiet and loud frames. int8 rounds the quiet frames' power to 0 and LOG makes it -inf."""
    from optimize.models import _tf

    tf = _tf.tf()
    rng = np.random.default_rng(0)
    t, f = np.arange(64)[:, None], np.arange(33)[None, :]
    cos, sin = (np.cos(2 * np.pi * t * f / 64).astype(np.float32), np.sin(2 * np.pi * t * f / 64).astype(np.float32))
    mel = (np.abs(rng.normal(size=(33, 16))) / 33).astype(np.float32)

    class LogMel(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([1, 64], tf.float32, name="audio")])
        def __call__(self, x):
            power = tf.matmul(x, cos) ** 2 + tf.matmul(x, sin) ** 2
            return {"logmel": tf.math.log(tf.matmul(power, mel) + 1e-6)}

    m = LogMel()
    folder = tmp_path_factory.mktemp("logmel")
    conv = tf.lite.TFLiteConverter.from_concrete_functions([m.__call__.get_concrete_function()], m)
    (folder / "logmel.tflite").write_bytes(conv.convert())
    levels = np.r_[np.full(16, 1e-3), np.full(16, 0.5)]
    np.savez(folder / "d.npz", x=(rng.normal(size=(32, 64)) * levels[:, None]).astype(np.float32))
    return folder


def test_debug_names_the_cause_and_only_measured_fixes_on_a_log_mel_front_end(log_mel, capsys):
    """Issue 33: on a log-mel front end `debug` printed a fix while its own leave-out column showed no change.
    Now the cause is named (the linear power spectrum quantized before LOG), the front end kept float is measured
    and offered with its figures, and every op kept float alone that changed nothing is listed as measured and
    useless, never as a fix."""
    from optimize.engine.debug import debug_model
    from optimize.present.report_text import print_debug

    report = debug_model(log_mel / "logmel.tflite", log_mel / "d.npz", samples=16, leave_out=1)
    measured = [le for le in report.layers if le.output_error_without is not None]
    assert len(measured) >= 2  # the worst by its own error, and the int8 op feeding LOG
    cause, *rest = report.fixes
    assert cause.startswith("Cause: ") and "before the float LOG" in cause and "power spectrum" in cause
    fixes = [line for line in rest if line.startswith("Fix to try: ")]
    assert fixes and "feeding LOG float (its front end)" in fixes[0] and "optimize run mixed-int8" in fixes[0]
    for line in fixes:  # each with its figures: how much it took away
        before, after = (float(x) for x in re.search(r"output error ([\d.]+) -> ([\d.]+)", line).groups())
        assert after <= before / 2, line
    for le in measured:  # no op kept float alone is offered when it did not help
        if le.output_error_without > report.output_error / 2:
            assert not any(f"keep {le.op} #{le.op_index} float:" in line for line in fixes)
            assert any(line.startswith(f"Measured, did not help: keep {le.op} #{le.op_index} float") for line in rest)
    assert any("--ranges auto" in line for line in rest) and any("int16x8" in line for line in rest)
    assert any(line.startswith("Not possible here: quantization-aware training") for line in rest)  # a .tflite
    print_debug(report, width=80)
    out = capsys.readouterr().out
    assert "Cause: " in out and "Fix to try: " in out and re.search(r"held.out", out)


def test_selective_stops_at_once_when_int8_meets_the_budget(keras_model, data_npz, tmp_path):
    import optimize

    recipe = build("sel", [{"technique": "selective", "max_accuracy_drop": 0.05}])
    cand = optimize.run(recipe, keras_model, data_npz, tmp_path, delegates=False, jobs=0)
    assert cand.ok, cand.error
    assert cand.search == []
    assert any("meets the budget" in n for n in cand.notes)
    assert cand.backend == "litert"


def test_selective_search_is_bounded_and_recorded(keras_model, data_npz, tmp_path):
    """An impossible budget: the search spends at most max_evals evaluations, records every move, and the
    candidate says plainly that the budget was not met."""
    import optimize

    steps = [{"technique": "selective", "max_output_error": 1e-9, "max_evals": 6, "eval_samples": 50}]
    cand = optimize.run(build("sel", steps), keras_model, data_npz, tmp_path, delegates=False, jobs=0)
    assert cand.ok, cand.error
    assert 1 <= len(cand.search) <= 5  # the first of 6 evaluations is full int8
    assert all(s.precision in ("float", "int16", "int8") and s.size_bytes > 0 for s in cand.search)
    assert any("does not meet the budget" in n for n in cand.notes)
    again = optimize.run(build("sel", steps), keras_model, data_npz, tmp_path / "2", delegates=False, jobs=0)
    assert [(s.tensor, s.precision, s.kept) for s in again.search] == [
        (s.tensor, s.precision, s.kept) for s in cand.search
    ]  # seeded and deterministic


def test_selective_needs_one_budget():
    from optimize.core.errors import RecipeError

    with pytest.raises(RecipeError, match="give one budget"):
        build("x", [{"technique": "selective", "max_accuracy_drop": 0.01, "max_error_increase": 0.1}])


def test_output_error_is_relative_to_the_output_range():
    f = [[np.array([0.0, 10.0])], [np.array([5.0, 0.0])]]
    q = [[np.array([1.0, 10.0])], [np.array([5.0, 0.0])]]
    assert debug.output_error(list(zip(f, q, strict=True))) == pytest.approx(0.25 / 10)


def test_the_report_shows_where_int8_loses_accuracy(keras_model, data_npz, tmp_path):
    """A selective candidate carries its per-layer analysis and search; the HTML report draws both."""
    import optimize
    from optimize.present.report import write_report

    steps = [{"technique": "selective", "max_output_error": 1e-9, "max_evals": 6, "eval_samples": 50}]
    study = optimize.sweep(
        keras_model,
        data_npz,
        tmp_path,
        recipes=[build("float32", [{"technique": "convert"}]), build("sel", steps)],
        delegates=False,
        runs=5,
        jobs=0,
        cache=False,
    )
    sel = study.candidate("sel")
    assert sel.debug is not None and sel.debug.layers and sel.search
    page = write_report(study, tmp_path / "report")["html"].read_text()
    assert 'id="debug-sel"' in page and "Where int8 loses accuracy" in page and page.count("<svg") >= 2


@pytest.fixture(scope="module")
def rescaled_keras(keras_model, tmp_path_factory):
    """The conftest CNN with its conv's output channels made up to 300x larger (the Dense rows after the
    flatten divided to match): the float function is the same, plain int8 is not."""
    from optimize.models import _tf

    model = _tf.keras().models.load_model(keras_model)
    conv, dense = model.layers[0], model.layers[3]
    s = np.ones(8, np.float32)
    s[:3] = (300.0, 0.005, 40.0)
    w, b = conv.get_weights()
    conv.set_weights([w * s, b * s])
    dw, db = dense.get_weights()
    dense.set_weights([(dw.reshape(-1, 8, dw.shape[1]) / s[None, :, None]).reshape(dw.shape), db])
    path = tmp_path_factory.mktemp("rescaled") / "rescaled.keras"
    model.save(path)
    return path


def test_selective_rescues_at_8_bits_before_raising_any_op(rescaled_keras, data_npz, tmp_path):
    """The rescue order: equalization gets the rescaled model back within budget, so no op is raised and
    every weight stays int8; the old order (rescue = false) has to raise ops for the same budget."""
    import optimize
    from optimize.present.report import render_markdown

    steps = [{"technique": "convert"}, {"technique": "selective", "max_accuracy_drop": 0.01, "max_evals": 8}]
    recipes = [
        build("float32", [{"technique": "convert"}]),
        build("int8", [{"technique": "convert", "scheme": "int8"}]),
        build("rescue", steps),
        build("raise-only", [steps[0], {**steps[1], "rescue": False}]),
    ]
    study = optimize.sweep(rescaled_keras, data_npz, tmp_path, recipes=recipes, delegates=False, jobs=0, cache=False)
    int8, new, old = study.candidate("int8"), study.candidate("rescue"), study.candidate("raise-only")
    assert int8.ok and -int8.metrics.accuracy_delta > 0.02  # plain int8 breaks it
    assert new.ok, new.error
    assert new.rescue[0].transform == "equalize" and new.rescue[0].kept
    assert new.rescue[0].layers and any(lc.after < lc.before for lc in new.rescue[0].layers)
    assert new.search == [] and not new.composition.float_compute_ops
    assert new.composition.shrink <= 0.30 and -new.metrics.accuracy_delta <= 0.01
    assert old.ok and old.rescue == [] and any(s.kept for s in old.search)
    assert "Accuracy rescue at 8 bits" in render_markdown(study)

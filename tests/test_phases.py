"""Where a sweep's time goes (issue 27): every candidate records the time of each phase, the phases add up to
the candidate's own total, study.json keeps them, `--verbose` and the report show them. No assertion is on
how long anything takes: only on presence, order and consistency."""

from __future__ import annotations

import pytest
from conftest import run_cli
from tests_support import too_wide

from optimize.core.recipe import build
from optimize.core.results import PHASES, load_study
from optimize.engine import sweeps


@pytest.fixture(scope="module")
def study(tmp_path_factory, keras_model, data_npz):
    out = tmp_path_factory.mktemp("phases") / "out"
    recipes = [build(s, [{"technique": "convert", "scheme": s}]) for s in ("float32", "float16", "int8")]
    recipes.append(
        build("prune-int8", [{"technique": "prune", "epochs": 1}, {"technique": "convert", "scheme": "int8"}])
    )
    return sweeps.sweep(keras_model, data_npz, out, recipes=recipes, cache=False, jobs=0), out


def test_every_candidate_says_where_its_time_went(study):
    st, _ = study
    for c in st.candidates:
        assert c.ok, c.error
        assert c.phases and set(c.phases) <= set(PHASES), c.phases
        assert list(c.phases) == [p for p in PHASES if p in c.phases], "phases are kept in the order they run"
        assert all(v >= 0 for v in c.phases.values())
        for p in ("verify", "load", "probe", "accuracy", "delegates", "latency", "memory"):
            assert p in c.phases, (c.name, p)
        total = sum(c.phases.values())  # within 5% (50 ms at least: a busy machine's scheduling between phases)
        assert abs(total - c.seconds) <= max(0.05 * c.seconds, 0.05), (c.name, total, c.seconds)
    by = {c.name: c for c in st.candidates}
    assert "convert" in by["float32"].phases and "quantize" not in by["float32"].phases
    assert "quantize" in by["int8"].phases  # LiteRT Quantizer on the float32 the baseline converted
    assert "convert" not in by["int8"].phases  # converted once, for the baseline: not again
    assert "train" in by["prune-int8"].phases


def test_the_study_records_the_sweep_and_the_opening(study):
    st, out = study
    assert st.seconds is not None and st.open_seconds is not None
    assert 0 <= st.open_seconds <= st.seconds
    again = load_study(out / "study.json")
    assert [c.phases for c in again.candidates] == [c.phases for c in st.candidates]


def test_verbose_and_the_report_show_the_breakdown(study, tmp_path):
    _, out = study
    r = run_cli("report", str(out / "study.json"), "-o", str(tmp_path / "report"), env={"NO_COLOR": "1"})
    assert r.returncode == 0, r.stderr
    md = (tmp_path / "report" / "report.md").read_text()
    assert "## Where the time went" in md and "| candidate | total |" in md
    assert 'id="phases"' in (tmp_path / "report" / "report.html").read_text()


def test_sweep_verbose_prints_each_phase(float_tflite, data_npz, tmp_path):
    r = run_cli(
        "sweep", str(float_tflite), "-d", str(data_npz), "-o", str(tmp_path / "o"), "--jobs", "0", "--no-cache",
        "--no-delegates", "-v", env={"NO_COLOR": "1", "COLUMNS": "80"},
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "Where the time went" in r.stdout and "Per candidate" in r.stdout
    assert "quantize" in r.stdout and "latency" in r.stdout
    assert not too_wide(r.stdout), too_wide(r.stdout)  # a path longer than a line stands whole on its own


# ---- measuring no more than the decision needs ------------------------------------------------------------
def test_what_the_quantizers_check_ran_is_not_probed_again(keras_model, data_npz, tmp_path, monkeypatch):
    """The failure repair's check runs int8 on every probe input (and more) against the same float model: the
    probe takes its verdict instead of running them again; the float32 baseline is still probed."""
    from optimize.measure import probe

    calls = []
    real = probe.run
    monkeypatch.setattr(probe, "run", lambda runner, *a, **kw: calls.append(1) or real(runner, *a, **kw))
    recipes = [build(s, [{"technique": "convert", "scheme": s}]) for s in ("float32", "int8")]
    st = sweeps.sweep(keras_model, data_npz, tmp_path / "out", recipes=recipes, cache=False, jobs=0, runs=3, fit=False)
    by = {c.name: c for c in st.candidates}
    assert all(c.ok for c in st.candidates), [c.error for c in st.candidates]
    assert len(calls) == 1  # the baseline's (no fit round: its fit-float32 would be probed as a float model too)
    assert by["int8"].probe.inputs == by["float32"].probe.inputs and by["int8"].probe.failures == []
    assert by["int8"].probe.reference == by["float32"].artifact and "probe" in by["int8"].phases


def test_a_slow_variant_is_checked_on_its_edge_inputs_and_a_few_samples(float_tflite, data_npz, monkeypatch):
    from optimize.models.data import load_data
    from optimize.transforms.tflite import repair

    content = float_tflite.read_bytes()
    check = repair.Check.build(content, load_data(data_npz), threads=1)
    ran = []
    real = repair.probe.outcome
    monkeypatch.setattr(repair.probe, "outcome", lambda runner, label, s: ran.append(label) or real(runner, label, s))
    assert check.first_failure(content) is None
    assert ran == [label for label, _ in check.inputs]  # a fast model: every input
    ran.clear()
    monkeypatch.setattr(repair, "SLOW_SECONDS", -1.0)  # every model is slow
    assert check.first_failure(content) is None
    edge = [label for label, _ in check.inputs if "calibration sample" not in label and "test sample" not in label]
    # every edge input (the real ones of the probe too), once each, on two interpreters at once
    assert set(edge) <= set(ran) and len(ran) == len(set(ran))
    for kind in ("calibration sample", "test sample"):
        assert 0 < sum(label.startswith(kind) for label in ran) <= repair.SLOW_SAMPLES


def test_the_longest_groups_are_released_first():
    from optimize.engine.plan import expected_cost

    groups = [
        [build("float16", [{"technique": "convert", "scheme": "float16"}])],
        [build("int8", [{"technique": "convert", "scheme": "int8"}])],
        [build("int16x8", [{"technique": "convert", "scheme": "int16x8"}])],
        [build("prune-int8", [{"technique": "prune"}, {"technique": "convert", "scheme": "int8"}])],
    ]
    ordered = sorted(groups, key=expected_cost, reverse=True)
    assert [g[0].name for g in ordered] == ["prune-int8", "int16x8", "int8", "float16"]


def test_a_spare_worker_is_taken_by_the_sweep_or_stopped(keras_model, float_tflite, data_npz, tmp_path):
    """A worker started while the model is opened (it imports TensorFlow meanwhile) is the sweep's first
    worker, or, never taken, is stopped: no process is left either way. Only Keras/SavedModel runs with
    worker processes get one."""
    import psutil

    from optimize.engine import executors

    assert executors.spare("local", 0, keras_model) is None
    assert executors.spare("ray", 2, keras_model) is None
    assert executors.spare("local", 2, float_tflite) is None  # its tasks quantize a .tflite: no TensorFlow
    s = executors.spare("local", 2, keras_model)
    assert s is not None and s.proc.is_alive()
    s.close()
    assert not s.proc.is_alive()
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    recipes = [build(n, [{"technique": "convert", "scheme": n}]) for n in ("float32", "float16")]
    st = sweeps.sweep(keras_model, data_npz, tmp_path / "out", recipes=recipes, cache=False, jobs=1, runs=3)
    assert all(c.ok for c in st.candidates), [c.error for c in st.candidates]
    left = [p for p in psutil.Process().children(recursive=True) if p.pid not in before and p.is_running()]
    assert not [p for p in left if p.status() != psutil.STATUS_ZOMBIE], left


def test_the_baseline_converts_what_the_checks_loaded(keras_model, data_npz, tmp_path, monkeypatch):
    """The Keras model the sweep's checks load is converted once, by the sweep's own process, and the float32
    baseline is that conversion: the model is loaded once in all (not again for the baseline), the
    artifact is byte for byte what the worker's own conversion made, and a zoo (many models) keeps none."""
    import hashlib
    import logging

    from optimize.engine import runs
    from optimize.models import source

    loads = []
    real = source.load_keras2
    monkeypatch.setattr(source, "load_keras2", lambda src: loads.append(src.path) or real(src))
    recipes = [build(s, [{"technique": "convert", "scheme": s}]) for s in ("float32", "float16")]
    monkeypatch.setattr(logging.root, "handlers", [])  # as in a plain Python session: absl would add one
    handlers = list(logging.root.handlers)
    st = sweeps.sweep(keras_model, data_npz, tmp_path / "a", recipes=recipes, cache=False, jobs=0)
    assert all(c.ok for c in st.candidates), [c.error for c in st.candidates]
    assert len(loads) == 1  # the check's load; the baseline is its conversion
    assert logging.root.handlers == handlers  # exporting here left the caller's logging as it was (absl)
    monkeypatch.setattr(source, "load_keras2", real)

    run = runs.open_run(keras_model, data_npz, tmp_path / "b", recipes=recipes[:1], cache=False)
    assert run.keras is None  # not kept unless asked: a zoo opens many models
    from optimize.engine.schedule import run_all

    (again,) = run_all([run], jobs=0)
    digest = [hashlib.sha256((d / "float32.tflite").read_bytes()).hexdigest() for d in (tmp_path / "a", tmp_path / "b")]
    assert again.candidates[0].ok and digest[0] == digest[1]


def test_a_big_keras_model_is_never_converted_beside_the_loaded_model(keras_model, data_npz, tmp_path, monkeypatch):
    """Above DIRECT_BYTES (0 here) a worker with nothing exported for it converts the model's SavedModel, never
    straight from the model it loads (the two stacked: 19x the model's bytes, issue 44); the baseline is made."""
    from optimize.convert import keras as exporting
    from optimize.engine import budget, runs
    from optimize.engine.schedule import run_all

    def never(*a, **kw):
        raise AssertionError("converted straight from the loaded model")

    monkeypatch.setattr(budget, "DIRECT_BYTES", 0)
    monkeypatch.setattr(exporting, "float32_direct", never)
    recipes = [build("float32", [{"technique": "convert", "scheme": "float32"}])]
    run = runs.open_run(keras_model, data_npz, tmp_path / "o", recipes=recipes, cache=False)
    (study,) = run_all([run], jobs=0)
    assert study.candidates[0].ok, study.candidates[0].error

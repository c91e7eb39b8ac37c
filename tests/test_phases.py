"""Where a sweep's time goes (issue 27): every candidate records the time of each phase, the phases add up to
the candidate's own total, study.json keeps them, `--verbose` and the report show them. No assertion is on
how long anything takes: only on presence, order and consistency."""

from __future__ import annotations

import pytest
from conftest import run_cli

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
    assert max(len(line) for line in r.stdout.splitlines()) <= 80

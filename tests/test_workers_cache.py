"""Sweeps in worker processes (a crash fails only its candidate) and the content-addressed result cache."""

from __future__ import annotations

import dataclasses

import pytest
from crash_fixtures import CrashingData

from optimize import sweeps
from optimize.data import load_data
from optimize.recipe import build


def quiet(msg):
    pass


RECIPES = [
    build("float32", [{"technique": "convert"}]),
    build("int8", [{"technique": "convert", "scheme": "int8"}]),
    build("float16", [{"technique": "convert", "scheme": "float16"}]),
]


def test_a_crashing_worker_fails_only_its_candidate(keras_model, data_npz, tmp_path):
    ds = load_data(data_npz)
    crashing = CrashingData(**{f.name: getattr(ds, f.name) for f in dataclasses.fields(ds)})
    study = sweeps.sweep(
        keras_model, crashing, tmp_path, recipes=RECIPES, delegates=False, runs=5, log=quiet, jobs=1, cache=False
    )
    c = {x.name: x for x in study.candidates}
    assert c["int8"].error == "worker process killed by SIGSEGV while producing or measuring this candidate"
    assert c["float32"].ok and c["float16"].ok
    assert c["float16"].metrics.latency is not None and c["float16"].metrics.fidelity is not None
    assert (tmp_path / "study.json").is_file() and not (tmp_path / "int8.tflite").exists()


@pytest.fixture
def cache_root(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("OPTIMIZE_CACHE", str(root))
    return root


def test_warm_rerun_reuses_and_never_serves_stale_or_corrupt(keras_model, data_npz, tmp_path, cache_root):
    recipes = RECIPES[:1] + RECIPES[2:]
    cold = sweeps.sweep(
        keras_model, data_npz, tmp_path / "a", recipes=recipes, delegates=False, runs=5, log=quiet, jobs=0
    )
    assert not any(c.cached for c in cold.candidates)
    warm = sweeps.sweep(
        keras_model, data_npz, tmp_path / "b", recipes=recipes, delegates=False, runs=5, log=quiet, jobs=0
    )
    assert all(c.cached for c in warm.candidates)
    assert [c.metrics for c in warm.candidates] == [c.metrics for c in cold.candidates]
    assert (tmp_path / "b" / "float16.tflite").read_bytes() == (tmp_path / "a" / "float16.tflite").read_bytes()

    # different settings never hit: another thread count is another key
    other = sweeps.sweep(
        keras_model, data_npz, tmp_path / "c", recipes=recipes, delegates=False, runs=5, log=quiet, jobs=0, threads=1
    )
    assert not any(c.cached for c in other.candidates)

    # a corrupt entry is detected and rebuilt, not served
    for artifact in cache_root.rglob("model.tflite"):
        artifact.write_bytes(b"garbage")
    logs: list[str] = []
    again = sweeps.sweep(
        keras_model, data_npz, tmp_path / "d", recipes=recipes, delegates=False, runs=5, log=logs.append, jobs=0
    )
    assert not any(c.cached for c in again.candidates)
    assert any("corrupt" in m for m in logs)
    assert (tmp_path / "d" / "float16.tflite").read_bytes() == (tmp_path / "a" / "float16.tflite").read_bytes()

    # --no-cache forces work
    forced = sweeps.sweep(
        keras_model, data_npz, tmp_path / "e", recipes=recipes, delegates=False, runs=5, log=quiet, jobs=0, cache=False
    )
    assert not any(c.cached for c in forced.candidates)

"""Sweeps in worker processes (a crash fails only its candidate) and the content-addressed result cache."""

from __future__ import annotations

import dataclasses
import os

import pytest
from crash_fixtures import CrashingData

from optimize.core.recipe import build
from optimize.engine import sweeps
from optimize.models.data import load_data

RECIPES = [
    build("float32", [{"technique": "convert"}]),
    build("int8", [{"technique": "convert", "scheme": "int8"}]),
    build("float16", [{"technique": "convert", "scheme": "float16"}]),
]


def test_a_crashing_worker_fails_only_its_candidate(keras_model, data_npz, tmp_path):
    ds = load_data(data_npz)
    crashing = CrashingData(**{f.name: getattr(ds, f.name) for f in dataclasses.fields(ds)})
    study = sweeps.sweep(keras_model, crashing, tmp_path, recipes=RECIPES, delegates=False, runs=5, jobs=1, cache=False)
    c = {x.name: x for x in study.candidates}
    # issue 34: the step it died in and the native code that step runs are named
    assert c["int8"].error == (
        "worker process killed by SIGSEGV in step `quantize scheme=int8` (LiteRT Quantizer, the TFLite calibrator "
        "or the LiteRT runtime checking the result)"
    )
    assert c["float32"].ok and c["float16"].ok
    assert c["float16"].metrics.latency is not None and c["float16"].metrics.fidelity is not None
    assert (tmp_path / "study.json").is_file() and not (tmp_path / "int8.tflite").exists()


def test_a_record_the_parent_cannot_read_back_fails_only_its_candidate(keras_model, data_npz, tmp_path, monkeypatch):
    """A worker's record that does not validate in the parent (a value the JSON round trip cannot carry) is a
    failed candidate saying so, never the end of the sweep; and it is not cached."""
    from optimize.core.results import Candidate
    from optimize.engine.cache import cacheable

    real = Candidate.model_validate_json.__func__

    def validate(cls, payload, *a, **kw):
        if '"name":"int8"' in payload.replace(" ", ""):
            payload = '{"name": 5}'
        return real(cls, payload, *a, **kw)

    monkeypatch.setattr(Candidate, "model_validate_json", classmethod(validate))
    monkeypatch.delenv("PYTHONWARNINGS", raising=False)
    study = sweeps.sweep(keras_model, data_npz, tmp_path, recipes=RECIPES, delegates=False, runs=5, jobs=1, cache=False)
    c = {x.name: x for x in study.candidates}
    assert c["int8"].error.startswith("its result record from the worker could not be read back")
    assert c["int8"].error_kind == "RecordUnreadable" and not cacheable(c["int8"])
    assert c["float32"].ok and c["float16"].ok and not (tmp_path / "int8.tflite").exists()
    assert "PYTHONWARNINGS" not in os.environ  # the workers' warning filter never leaks into the caller


@pytest.fixture
def cache_root(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("OPTIMIZE_CACHE", str(root))
    return root


def test_warm_rerun_reuses_and_never_serves_stale_or_corrupt(keras_model, data_npz, tmp_path, cache_root, caplog):
    recipes = RECIPES[:1] + RECIPES[2:]
    cold = sweeps.sweep(keras_model, data_npz, tmp_path / "a", recipes=recipes, delegates=False, runs=5, jobs=0)
    assert not any(c.cached for c in cold.candidates)
    warm = sweeps.sweep(keras_model, data_npz, tmp_path / "b", recipes=recipes, delegates=False, runs=5, jobs=0)
    assert all(c.cached for c in warm.candidates)
    assert [c.metrics for c in warm.candidates] == [c.metrics for c in cold.candidates]
    assert (tmp_path / "b" / "float16.tflite").read_bytes() == (tmp_path / "a" / "float16.tflite").read_bytes()

    # different settings never hit: another thread count is another key
    other = sweeps.sweep(
        keras_model, data_npz, tmp_path / "c", recipes=recipes, delegates=False, runs=5, jobs=0, threads=1
    )
    assert not any(c.cached for c in other.candidates)

    # a corrupt entry is detected and rebuilt, not served
    for artifact in cache_root.rglob("*.tflite"):
        artifact.write_bytes(b"garbage")
    again = sweeps.sweep(keras_model, data_npz, tmp_path / "d", recipes=recipes, delegates=False, runs=5, jobs=0)
    assert not any(c.cached for c in again.candidates)
    assert any("corrupt" in r.getMessage() for r in caplog.records)
    assert (tmp_path / "d" / "float16.tflite").read_bytes() == (tmp_path / "a" / "float16.tflite").read_bytes()

    # --no-cache forces work
    forced = sweeps.sweep(
        keras_model, data_npz, tmp_path / "e", recipes=recipes, delegates=False, runs=5, jobs=0, cache=False
    )
    assert not any(c.cached for c in forced.candidates)


def _cache_entries(root):
    return sorted(root.rglob("entries/*/*.json"))


def test_forged_records_and_stale_temp_folders_are_never_served(keras_model, data_npz, tmp_path, cache_root, caplog):
    import json
    import os
    import time

    recipes = RECIPES[:1]
    cold = sweeps.sweep(keras_model, data_npz, tmp_path / "a", recipes=recipes, delegates=False, runs=5, jobs=0)
    (entry,) = _cache_entries(cache_root)
    doc = json.loads(entry.read_text())
    record = json.loads(doc["record"])
    record["metrics"]["size"]["bytes"] = 1  # a forged figure
    doc["record"] = json.dumps(record)
    entry.write_text(json.dumps(doc))
    stale = cache_root / "results" / "tmp" / "entry.json.XYZ"  # left by a writer that crashed
    stale.write_bytes(b"half")
    os.utime(stale, (time.time() - 7200, time.time() - 7200))
    again = sweeps.sweep(keras_model, data_npz, tmp_path / "b", recipes=recipes, delegates=False, runs=5, jobs=0)
    assert not again.candidates[0].cached
    assert again.candidates[0].metrics.size == cold.candidates[0].metrics.size
    assert any("does not match its digest" in r.getMessage() for r in caplog.records)
    assert not stale.exists()


def test_environment_failures_are_not_cached_but_technique_failures_are(tmp_path):
    from optimize.core.results import Candidate
    from optimize.engine.cache import cacheable, result_cache

    r = build("int8", [{"technique": "convert", "scheme": "int8"}])
    assert not cacheable(Candidate.failed(r, OSError(28, "No space left on device")))
    assert not cacheable(Candidate.failed(r, MemoryError()))
    assert not cacheable(
        Candidate.failed(r, "worker process killed by SIGKILL", kind="WorkerCrashed", detail="SIGKILL")
    )
    assert cacheable(Candidate.failed(r, "worker process killed by SIGSEGV", kind="WorkerCrashed", detail="SIGSEGV"))
    from optimize.core.errors import TechniqueFailed

    failed = Candidate.failed(r, TechniqueFailed("conversion to int8 failed: op X"))
    assert cacheable(failed) and failed.error_kind == "TechniqueFailed"
    store = result_cache(str(tmp_path / "c"))
    store.put("k" * 64, failed, tmp_path)
    assert store.get("k" * 64, "int8", tmp_path).error == failed.error


def test_a_cache_that_cannot_be_written_warns_once_and_carries_on(tmp_path, caplog):
    from optimize.core.errors import TechniqueFailed
    from optimize.core.results import Candidate
    from optimize.engine.cache import result_cache

    store = result_cache(str(tmp_path / "c"))  # usable when the run starts (checked: a probe written)
    __import__("shutil").rmtree(tmp_path / "c")
    (tmp_path / "c").write_bytes(b"")  # then a file where the cache folder was: every write fails
    r = build("int8", [{"technique": "convert", "scheme": "int8"}])
    cand = Candidate.failed(r, TechniqueFailed("x"))
    store.put("a" * 64, cand, tmp_path)
    store.put("b" * 64, cand, tmp_path)
    warnings = [x for x in caplog.records if "Could not write the result cache" in x.getMessage()]
    assert len(warnings) == 1
    assert store.get("a" * 64, "int8", tmp_path) is None


def test_a_sweep_where_nothing_worked_exits_1(keras_model, data_npz, tmp_path):
    from optimize.core.errors import NothingWorked

    ds = load_data(data_npz)
    crashing = CrashingData(**{f.name: getattr(ds, f.name) for f in dataclasses.fields(ds)})
    study = sweeps.sweep(keras_model, crashing, tmp_path / "o", recipes=RECIPES[1:2], delegates=False, jobs=1)
    # the float32 baseline is added to given recipes, and it does not calibrate: it is the one that works
    assert [c.error_kind for c in study.candidates] == [None, "WorkerCrashed"]
    crashed = study.model_copy(update={"candidates": study.candidates[1:]})
    with pytest.raises(NothingWorked, match="All 1 candidates failed: 1 x worker process killed by SIGSEGV") as e:
        sweeps.refuse_if_nothing_worked(crashed)
    assert e.value.exit_code == 1
    assert (tmp_path / "o" / "study.json").is_file()
    assert [p.name for p in (tmp_path / "o").glob("*.tflite")] == ["float32.tflite"]  # none for the crash
    sweeps.refuse_if_nothing_worked(sweeps.sweep(keras_model, data_npz, tmp_path / "p", recipes=RECIPES[:1], jobs=0))


def test_targeted_sweep_adds_the_targets_own_recipe(keras_model, data_npz, tmp_path):
    study = sweeps.sweep(
        keras_model, data_npz, tmp_path, recipes=RECIPES[:1], delegates=True, runs=5, jobs=0, target="hexagon"
    )
    names = [c.name for c in study.candidates]
    assert names == ["float32", "hexagon-dsp", "fit-float32"]  # the Flatten fitted for Core ML (issue 45)
    hexa = study.candidate("hexagon-dsp")
    assert hexa.ok and hexa.delegates["hexagon"].verdict == "full"


def test_bad_data_leaves_no_output_folder(keras_model, tmp_path):
    import numpy as np

    from optimize.core.errors import DataError

    bad = tmp_path / "bad.npz"
    np.savez(bad, x=np.zeros((4, 28, 28), np.float32))
    with pytest.raises(DataError):
        sweeps.sweep(keras_model, bad, tmp_path / "out", recipes=RECIPES[:1], delegates=False, jobs=0)
    assert not (tmp_path / "out").exists()


def test_a_crash_in_a_single_run_fails_the_candidate_not_the_process(keras_model, data_npz, tmp_path):
    import optimize

    ds = load_data(data_npz)
    crashing = CrashingData(**{f.name: getattr(ds, f.name) for f in dataclasses.fields(ds)})
    cand = optimize.run(RECIPES[1], keras_model, crashing, tmp_path, delegates=False, jobs=1)
    assert cand.error_kind == "WorkerCrashed" and "SIGSEGV" in cand.error
    assert not (tmp_path / "int8.tflite").exists()


def _demo_files(folder):
    """A stand-in for the cached demo: a readable .keras zip and a complete .npz (no training needed)."""
    import zipfile

    import numpy as np

    folder.mkdir(parents=True)
    model, data = folder / "digits_cnn.keras", folder / "digits.npz"
    with zipfile.ZipFile(model, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("config.json", '{"class_name": "Sequential"}')
        z.writestr("model.weights.h5", bytes(range(256)) * 64)
    arrays = {k: np.arange(12, dtype=np.float32) for k in ("x_train", "y_train", "x_test", "y_test")}
    np.savez(data, **arrays)
    return model, data


@pytest.mark.parametrize("which", [0, 1])
def test_a_truncated_demo_file_is_not_taken_as_the_demo(tmp_path, which):
    from optimize.convert.demo import _intact

    files = _demo_files(tmp_path / "demo")
    assert _intact(*files)
    blob = files[which].read_bytes()
    files[which].write_bytes(blob[: len(blob) // 2])
    assert not _intact(*files)


@pytest.mark.slow
def test_a_truncated_cached_demo_is_rebuilt(tmp_path, monkeypatch):
    import numpy as np

    from optimize.convert.demo import DEMO_VERSION, demo
    from optimize.models import _tf

    monkeypatch.setenv("OPTIMIZE_CACHE", str(tmp_path))
    model, data = _demo_files(tmp_path / f"demo-v{DEMO_VERSION}")
    data.write_bytes(data.read_bytes()[:100])
    assert demo() == (model, data)
    with np.load(data, allow_pickle=False) as d:
        assert len(d["x_test"]) == 360
    assert _tf.keras().models.load_model(model, compile=False).name == "digits_cnn"


def _bad_entries(doc: dict) -> dict[str, bytes]:
    """Entries that parse as JSON (or not) but are not what put() stored: each must be a miss, rebuilt."""
    import json

    record = json.loads(doc["record"])
    record["metrics"] = "fast"
    other = {**doc, "record": json.dumps(record)}
    other["record_sha256"] = __import__("hashlib").sha256(other["record"].encode()).hexdigest()
    return {
        "wrong types": json.dumps({"format": 6, "record": 5}).encode(),
        "format as a string": json.dumps({**doc, "format": "6"}).encode(),
        "a list": b"[1, 2, 3]",
        "null": b"null",
        "deep nesting": b"[" * 100_000,
        "not UTF-8": b'{"format": 6, "record": "\xff\xfe"}',
        "digest not hex": json.dumps({**doc, "record_sha256": "z" * 64}).encode(),
        "another key's entry": json.dumps({**doc, "key": "f" * 64}).encode(),
        "artifact size negative": json.dumps({**doc, "artifact_bytes": -1}).encode(),
        "artifact size huge": json.dumps({**doc, "artifact_bytes": 2**62}).encode(),
        "artifact digest dropped": json.dumps({**doc, "artifact_sha256": None}).encode(),
        "record not a candidate (digest matching)": json.dumps(other).encode(),
        "extra field": json.dumps({**doc, "served": True}).encode(),
    }


def test_cache_entries_are_validated_by_schema_and_rebuilt_never_a_traceback(tmp_path, caplog):
    """Issue 26: an entry that parses with the wrong types (`{"format": 6, "record": 5}`) ended the sweep in a
    traceback. Each kind of entry the schema refuses is a miss with one warning, deleted, and put() writes it
    again."""
    import json

    from study_fixtures import candidate

    from optimize.engine.cache import result_cache

    out = tmp_path / "out"
    out.mkdir()
    (out / "int8.tflite").write_bytes(b"TFL3 artifact bytes")
    cand = candidate("int8", "int8").model_copy(update={"artifact": "int8.tflite"})
    store = result_cache(str(tmp_path / "c"))
    key = "a" * 64
    store.put(key, cand, out)
    (entry,) = _cache_entries(tmp_path / "c")
    good = json.loads(entry.read_bytes())
    assert store.get(key, "int8", out).cached
    for what, raw in _bad_entries(good).items():
        caplog.clear()
        entry.write_bytes(raw)
        assert store.get(key, "int8", out) is None, what
        assert not entry.exists(), what
        assert any("is corrupt" in r.getMessage() for r in caplog.records), what
        store.put(key, cand, out)
        assert store.get(key, "int8", out).metrics == cand.metrics, what


def test_a_cache_that_cannot_be_used_is_one_line_before_any_work(tmp_path, keras_model, cli):
    """Issue 26: a --cache that cannot be written is refused before the work (exit 2, nothing written); the
    default cache in the same state only warns and the run carries on without it."""
    from optimize.core.errors import OptimizeError
    from optimize.engine.cache import result_cache

    (tmp_path / "c").write_bytes(b"")
    with pytest.raises(OptimizeError, match="Cannot write the cache"):
        result_cache(str(tmp_path / "c"))
    r = cli("sweep", str(keras_model), "--cache", str(tmp_path / "c"), "-o", str(tmp_path / "out"))
    assert r.returncode == 2 and "error: Cannot write the cache" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "out").exists()


def test_a_corrupt_artifact_longer_than_the_real_one_is_replaced_on_write(tmp_path):
    """Content-addressed artifacts are shared: one corrupted to more bytes than it should hold was kept (the
    bounded read refused it, and the write gave up), so every later put of that artifact failed."""
    from study_fixtures import candidate

    from optimize.engine.cache import result_cache

    out = tmp_path / "out"
    out.mkdir()
    (out / "int8.tflite").write_bytes(b"TFL3 artifact bytes")
    cand = candidate("int8", "int8").model_copy(update={"artifact": "int8.tflite"})
    store = result_cache(str(tmp_path / "c"))
    store.put("a" * 64, cand, out)
    (artifact,) = (tmp_path / "c").rglob("artifacts/*/*.tflite")
    artifact.write_bytes(b"x" * 1000)  # no read came by since: the next write meets it
    store.put("b" * 64, cand, out)
    assert artifact.read_bytes() == b"TFL3 artifact bytes" and store.get("b" * 64, "int8", out).cached


def test_a_worker_killed_while_idle_is_replaced_not_a_traceback(float_tflite, tmp_path):
    """A worker SIGKILLed between two tasks (while the parent times a round, say) made the next dispatch fail
    with BrokenPipeError: the sweep's rescue round ended in a traceback (found by benchmarks/soak.py)."""
    from optimize.convert.front import open_inputs
    from optimize.engine.executors import ProcessExecutor
    from optimize.engine.work import Settings, Task

    src, _ = open_inputs(float_tflite, None)
    recipe = build("float16", [{"technique": "quantize", "scheme": "float16"}])
    with ProcessExecutor(1) as ex:
        for i in range(2):
            out = tmp_path / f"out{i}"
            out.mkdir()
            ex.submit(Task(src, None, (recipe,), out, Settings(delegates=False)))
            (tag, cand), *_ = list(ex.results())
            assert cand.ok, cand.error
            if i == 0:
                (w,) = ex.workers
                w.proc.kill()  # idle now: killed between two tasks
                w.proc.join(timeout=10)

"""Memory bounded by design (issue 44): the budget, each task's estimate, admission against it, the refusal of a
model too big for it, and the process tree's peak recorded in the study."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from optimize.core.errors import RecipeError
from optimize.core.recipe import build
from optimize.engine import budget
from optimize.engine.work import Task
from optimize.measure import footprint
from optimize.models.data import from_arrays
from optimize.models.spec import ModelSource

MB = 10**6


@pytest.mark.parametrize(
    ("text", "size"),
    [("6GB", 6 * 10**9), ("6gb", 6 * 10**9), ("6GiB", 6 * 2**30), ("6g", 6 * 2**30), ("512MB", 512 * MB),
     ("2.5GB", 2_500_000_000), ("100000000", 100_000_000), (" 1 TB ", 10**12)],
)  # fmt: skip
def test_memory_sizes_read_as_people_write_them(text, size):
    assert footprint.parse_size(text) == size


@pytest.mark.parametrize("text", ["six", "6XB", "6i", "-1GB", "10MB", ""])
def test_a_size_it_cannot_read_or_too_small_is_one_line(text):
    with pytest.raises(RecipeError) as e:
        footprint.parse_size(text)
    assert "\n" not in str(e.value)


def test_the_tree_is_measured_and_the_sampler_keeps_its_peak():
    before = footprint.tree_rss()
    with footprint.Sampler(every=0.01) as s:
        block = np.ones(50 * MB // 4, dtype=np.float32)  # 50 MB the tree now holds
        s.sample()
        del block
    assert s.peak >= before + 45 * MB and s.peak_pss > 0 and s.samples >= 2
    assert footprint.available_bytes() > 0 and footprint.rss(os.getpid()) > 0


def test_the_sampler_reads_pss_only_where_it_could_peak_and_at_most_so_often():
    """PSS (smaps_rollup, a walk of every mapping) cost a quarter of a core read every 0.2 s: the RSS sum is read
    each time, PSS where due; the first and last samples read it whatever the time."""
    with footprint.Sampler(every=3600, pss_every=3600) as s:  # the thread sleeps: samples are taken here
        first_pss = s.peak_pss
        block = np.ones(50 * MB // 4, dtype=np.float32)
        s.sample()  # the RSS sum now holds the block; PSS is not due for an hour
        assert s.peak_pss == first_pss and s.peak >= first_pss + 45 * MB
        s.pss_every = 0.0
        s.sample()  # due now, and the RSS sum is above the PSS peak: read
        assert s.peak_pss >= first_pss + 45 * MB
        seen = s.peak_pss
        del block
        s.sample()  # the RSS sum is no higher than where PSS was read last: not read again
        assert s.peak_pss == seen and s._pss_rss >= s.peak - 5 * MB
        more = np.ones(80 * MB // 4, dtype=np.float32)
        s.sample()  # a new high of the RSS sum: read
        assert s.peak_pss >= seen + 25 * MB
        del more
    assert s.peak_pss <= s.peak


def test_a_phase_gives_back_the_heap_it_freed():
    """A BERT-base-sized float32 conversion left its worker 2.24 GB resident where 0.82 GB was live (the allocator
    keeps freed pages), and the worker measured the model on top of that. A phase ends by giving them back."""
    held = footprint.rss()
    with footprint.phase_peak("convert"):
        blocks = [np.ones(1000) for _ in range(40_000)]  # 320 MB in 8 kB pieces, from the C heap
        pin = np.ones(1000)  # allocated last: the heap's top stays in use, so nothing is trimmed by itself
        grown = footprint.rss() - held
        del blocks
    assert grown > 250 * MB and footprint.rss() - held < 80 * MB, (grown, footprint.rss() - held)
    del pin


def test_weights_and_data_are_counted_once(tmp_path):
    f = tmp_path / "m.keras"
    f.write_bytes(b"x" * 1000)
    folder = tmp_path / "sm"
    (folder / "variables").mkdir(parents=True)
    (folder / "saved_model.pb").write_bytes(b"y" * 300)
    (folder / "variables" / "v.data").write_bytes(b"z" * 700)
    assert budget.weights_bytes(f) == 1000 and budget.weights_bytes(folder) == 1000
    assert budget.weights_bytes(ModelSource(f, "tflite", "0" * 16, content=b"t" * 10)) == 10
    x = np.zeros((10, 4), np.float32)
    ds = from_arrays(x_test=x)  # calibration falls back to the test split: the same array, counted once
    assert budget.data_bytes(ds) == x.nbytes


def _task(src, recipes, **kw) -> Task:
    return Task(src, None, tuple(recipes), Path("."), **kw)


def test_what_a_task_does_decides_its_estimate(tmp_path):
    keras = ModelSource(tmp_path / "m.keras", "keras2", "0" * 16)
    flat = ModelSource(tmp_path / "m.tflite", "tflite", "0" * 16, content=b"")
    float32 = build("float32", [{"technique": "convert"}])
    int8 = build("int8", [{"technique": "convert"}, {"technique": "quantize", "scheme": "int8"}])
    prune = build("prune-int8", [{"technique": "prune"}, {"technique": "convert", "scheme": "int8"}])
    assert budget.work_of(_task(keras, [float32])) == "convert"
    assert budget.work_of(_task(keras, [prune])) == "train"
    assert budget.work_of(_task(flat, [int8])) == "quantize"
    seeded = _task(flat, [int8], start=(tuple(int8.steps[:1]), tmp_path / "float32.tflite"))
    assert budget.work_of(seeded) == "quantize"  # it starts from the baseline's float .tflite
    from_keras = _task(keras, [int8], start=(tuple(float32.steps), tmp_path / "float32.tflite"))
    assert budget.work_of(from_keras) == "convert"  # LiteRT's result failing its checks: the converter's route
    exported = _task(keras, [float32], exported=tmp_path / "float32.tflite")
    assert budget.work_of(exported) == "quantize"  # the opener converted it already
    big = replace(_task(keras, [prune]), weights=400 * MB)
    assert budget.task_need(big) == budget.need("train", 400 * MB) > budget.need("quantize", 400 * MB)


def test_a_fine_tuning_counts_its_batches_activations_and_one_that_cannot_fit_alone_never_starts(
    float_tflite, tmp_path
):
    """Weights alone said 2.3 GB for ResNet-50's QAT; its worker held 7.1 GB (batch 32 x 70 MB of activations a
    sample, held for the backward pass). Once the baseline is made, a fine-tuning's estimate counts them; one that
    cannot fit the budget even alone fails its candidates with why, before any worker starts it (admission starts
    the first task whatever its size when nothing else runs)."""
    from optimize.engine.executors import ProcessExecutor

    keras = ModelSource(tmp_path / "m.keras", "keras2", "0" * 16)
    prune = build("prune-int8", [{"technique": "prune", "batch_size": 64}, {"technique": "convert", "scheme": "int8"}])
    before = _task(keras, [prune], weights=MB)  # no baseline yet: weights only
    after = replace(before, reference=float_tflite)
    per_sample = budget.activation_bytes(float_tflite)
    assert 0 < per_sample < float_tflite.stat().st_size  # a small CNN: its activations, not its weights
    assert budget.training_activations(after) == int(budget.TRAIN_ACTIVATIONS * 64 * per_sample)
    assert budget.task_need(after) == budget.task_need(before) + budget.training_activations(after)
    fits_weights_only = budget.Budget(budget.WORKER_BYTES + budget.task_need(before) + 1, stated=True)
    assert budget.cannot_train(before, fits_weights_only) is None
    why = budget.cannot_train(after, fits_weights_only)
    assert why is not None and "activations" in why and "--max-memory" in why
    ex = ProcessExecutor(jobs=1, limit=fits_weights_only)
    try:
        ex.submit(after)
        (tag, cand), *rest = list(ex.results())
        assert not rest and cand.name == "prune-int8" and not cand.ok and cand.error_kind == "TooBig"
        assert ex.spawned == 0  # no worker was started for it
    finally:
        ex.close()


def test_admission_waits_for_room_and_never_starves(tmp_path):
    flat = ModelSource(tmp_path / "m.tflite", "tflite", "0" * 16, content=b"")
    int8 = build("int8", [{"technique": "quantize", "scheme": "int8"}])
    small = _task(flat, [int8], weights=1 * MB)
    huge = _task(flat, [int8], weights=10**12)
    me = os.getpid()
    here = footprint.tree_rss(me)
    room = budget.Admission(budget.Budget(here + 2 * budget.task_need(small) + 50 * MB, True))
    assert room.first_fitting([small], [], spawn=True) == 0  # nothing runs: the first task always starts
    assert room.first_fitting([huge], [], spawn=True) == 0
    running = [(me, budget.task_need(small), footprint.rss(me))]
    assert room.first_fitting([huge, small], running, spawn=False) == 1  # the first that fits goes ahead
    assert room.first_fitting([huge], running, spawn=False) is None  # waits for the running task to end
    assert budget.Admission(None).first_fitting([huge], running, spawn=True) == 0  # no budget: by jobs alone


def test_a_model_too_big_for_the_budget_is_refused_in_one_line_before_any_work(keras_model, data_npz, tmp_path, cli):
    out = tmp_path / "out"
    r = cli("sweep", str(keras_model), "-d", str(data_npz), "-o", str(out), "--max-memory", "200MB")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    error = " ".join(r.stderr.split())
    assert error.startswith("error: cnn.keras (") and "of weights) needs about" in error
    assert "more than the memory budget of 200 MB (--max-memory)" in error
    assert not out.exists()  # before any work: nothing made, not even the output folder


def test_the_tree_peak_and_budget_are_recorded_and_shown(float_tflite, data_npz, tmp_path, cli):
    out = tmp_path / "out"
    r = cli("sweep", str(float_tflite), "-d", str(data_npz), "-o", str(out), "--no-cache", "-j", "1", "-v",
            "--max-memory", "8GB", "--no-delegates")  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    study = json.loads((out / "study.json").read_text())
    memory = study["memory"]
    int8 = next(c for c in study["candidates"] if c["name"] == "int8")  # each phase's peak, where it ran
    assert set(int8["phase_bytes"]) >= {"quantize", "verify", "accuracy"}
    assert all(50 * MB < b < 8 * 10**9 for b in int8["phase_bytes"].values())
    assert memory["budget_bytes"] == 8 * 10**9 and memory["budget_stated"] is True
    assert 100 * MB < memory["peak_bytes"] < 8 * 10**9 and 0 < memory["peak_pss_bytes"] <= memory["peak_bytes"]
    shown = " ".join(r.stdout.split())
    assert "Memory: the process tree peaked at" in shown and "budget 8.00 GB (--max-memory)" in shown


def test_the_opening_is_counted_in_the_refusal():
    """A budget that holds the conversion but not the opener (its imports, the model loaded and checked, the
    spare worker beside it) is refused in one line before any work, as the conversion's would be."""
    weights = 10 * MB
    converting = budget.WORKER_BYTES + budget.need("convert", weights)
    opening = budget.opening_need(weights)
    assert opening > converting and opening >= budget.FACTORS["open"] * weights + budget.TF_BYTES
    with pytest.raises(budget.TooBig, match="to open and convert"):
        budget.refuse_if_too_big("m.keras", weights, "convert", budget.Budget(converting, stated=True))
    budget.refuse_if_too_big("m.keras", weights, "convert", budget.Budget(opening, stated=True))
    budget.refuse_if_too_big("m.tflite", weights, "quantize", budget.Budget(converting, stated=True))


def test_a_big_keras_model_is_exported_for_a_worker_and_a_savedmodels_opener_leaves(tmp_path):
    """Above DIRECT_BYTES the opener exports a SavedModel (never converting beside the loaded model: the worker
    converts it after the opener left); for a SavedModel, with nothing to export, the opener leaves at once."""
    from optimize.engine.runs import Run

    asked = []
    for kind, weights in (("keras3", budget.DIRECT_BYTES), ("keras3", budget.DIRECT_BYTES + 1), ("savedmodel", 1)):
        src = ModelSource(tmp_path / "m", kind, "0" * 16)
        run = Run(src, None, tmp_path, [], {}, None, footprint=weights)
        run.exporter = lambda folder, direct=True: asked.append((folder is not None, direct))
        run.export(direct=True)
    assert asked == [(True, True), (True, False), (False, True)]


def test_the_opener_has_left_before_any_worker_converts(keras_model, data_npz, tmp_path, monkeypatch):
    """A model exported as a SavedModel (DIRECT_BYTES 0 here): the baseline converts it in a worker, and no task is
    submitted while the opener lives, so loading and converting never stack (issue 44)."""
    from optimize.engine import executors, sweeps

    monkeypatch.setattr(executors, "OPEN_HERE_BYTES", 0)
    monkeypatch.setattr(budget, "DIRECT_BYTES", 0)
    events = []
    close, submit = executors.Opener.close, executors.ProcessExecutor.submit
    monkeypatch.setattr(executors.Opener, "close", lambda self: close(self) or events.append("opener left"))
    monkeypatch.setattr(executors.ProcessExecutor, "submit", lambda self, t: events.append("task") or submit(self, t))
    study = sweeps.sweep(keras_model, data_npz, tmp_path / "o", recipes=RECIPES[:1], jobs=1, cache=False, runs=3)
    assert [c.name for c in study.candidates][:2] == ["float32", "int8"] and all(c.ok for c in study.candidates)
    assert "task" in events and events.index("opener left") < events.index("task")


RECIPES = [build("int8", [{"technique": "convert", "scheme": "int8"}]), build("float16", [{"technique": "convert", "scheme": "float16"}])]  # fmt: skip


def test_the_sweeps_own_process_never_loads_or_converts_the_keras_model(keras_model, data_npz, tmp_path, monkeypatch):
    """The opener process loads, checks and exports the model; the sweep's process only plans (issue 44). (This
    process imported TensorFlow already: a model this small would be opened here, but for OPEN_HERE_BYTES.)"""
    from optimize.convert import keras as exporting
    from optimize.engine import executors, sweeps
    from optimize.models import source

    monkeypatch.setattr(executors, "OPEN_HERE_BYTES", 0)

    def never(*a, **kw):
        raise AssertionError("the sweep's own process loaded or converted the model")

    for module, name in ((source, "check_loads"), (source, "load_keras2"), (source, "load_keras3"),
                         (exporting, "float32_direct"), (exporting, "export_saved_model")):  # fmt: skip
        monkeypatch.setattr(module, name, never)
    study = sweeps.sweep(keras_model, data_npz, tmp_path / "o", recipes=RECIPES, jobs=1, cache=False, runs=3)
    names = [c.name for c in study.candidates]  # then fit-* where the fit round buys a target (issue 45)
    assert names[:3] == ["float32", "int8", "float16"] and all(c.ok for c in study.candidates)
    assert study.candidate("float32").phases["convert"] > 0  # the opener's export, counted on the baseline
    assert study.memory is not None and study.memory.peak_bytes > 0


def test_tasks_wait_for_memory_and_big_workers_leave(float_tflite, data_npz, tmp_path, monkeypatch):
    """Each task's estimate is half the budget: never two at once, though two workers are allowed; and every worker
    that goes idle holding more than RETIRE_BYTES (here: any) leaves, its next task on a fresh one."""
    from optimize.engine import executors, sweeps

    limit = budget.budget(64 * 10**9)
    monkeypatch.setattr(executors, "task_need", lambda task: limit.bytes // 2)
    monkeypatch.setattr(budget, "task_need", lambda task: limit.bytes // 2)
    monkeypatch.setattr(executors, "RETIRE_BYTES", 1)
    seen, retired = [], []
    dispatch, retire = executors.ProcessExecutor._dispatch, executors.ProcessExecutor._retire

    def counted(self):
        dispatch(self)
        seen.append(sum(w.task is not None for w in self.workers))

    def counted_retire(self, w, heavy=False):
        retire(self, w, heavy)
        retired.append(w not in self.workers)

    monkeypatch.setattr(executors.ProcessExecutor, "_dispatch", counted)
    monkeypatch.setattr(executors.ProcessExecutor, "_retire", counted_retire)
    recipes = [build(n, [{"technique": "quantize", "scheme": n}]) for n in ("float16", "dynamic", "int8")]
    study = sweeps.sweep(float_tflite, data_npz, tmp_path / "o", recipes=recipes, jobs=2, cache=False, runs=3,
                         max_memory=limit.bytes, delegates=False)  # fmt: skip
    assert all(c.ok for c in study.candidates) and all(c.p50_ms is not None for c in study.candidates)
    assert max(seen) == 1 and len(seen) >= 4  # one at a time, though two workers were allowed
    assert retired and all(retired)


def test_a_worker_that_converted_a_big_model_leaves_when_idle(tmp_path):
    """The BERT-base-sized baseline's worker, under RETIRE_BYTES once its heap was given back, stayed for the
    quantizations with TensorFlow imported, and its quantizer's forks counted those pages again (the tree's RSS sum
    6.2 GB). A worker that converted or fine-tuned a model above DIRECT_BYTES leaves when idle; a small model's
    stays (starting one costs seconds)."""
    from optimize.engine import executors

    keras = ModelSource(tmp_path / "m.keras", "keras2", "0" * 16)
    flat = ModelSource(tmp_path / "m.tflite", "tflite", "0" * 16, content=b"")
    float32 = build("float32", [{"technique": "convert"}])
    int8 = build("int8", [{"technique": "quantize", "scheme": "int8"}])
    assert executors._converted_big(_task(keras, [float32], weights=400 * MB))
    assert not executors._converted_big(_task(keras, [float32], weights=budget.DIRECT_BYTES))
    assert not executors._converted_big(_task(flat, [int8], weights=400 * MB))
    assert not executors._converted_big(None)


def test_a_recipe_whose_work_cannot_fit_is_left_out_with_why(tmp_path):
    """A model whose conversion fits but whose fine-tuning does not: the fine-tuning recipes are dropped, said."""
    from types import SimpleNamespace

    keras = ModelSource(tmp_path / "m.keras", "keras2", "0" * 16)
    float32 = build("float32", [{"technique": "convert"}])
    int8 = build("int8", [{"technique": "convert"}, {"technique": "quantize", "scheme": "int8"}])
    prune = build("prune-int8", [{"technique": "prune"}, {"technique": "convert", "scheme": "int8"}])
    weights = 400 * MB
    run = SimpleNamespace(recipes=[float32, int8, prune], src=keras, ds=None, footprint=weights, baseline=float32)
    fits = budget.WORKER_BYTES + budget.need("convert", weights)
    limit = budget.Budget(fits, stated=True)
    assert budget.need("train", weights) > budget.need("convert", weights) > budget.need("quantize", weights)
    (dropped,) = budget.too_big(run, limit)
    assert dropped[0] is prune and "to fine-tune, more than the memory budget of" in dropped[1]
    assert "(--max-memory)" in dropped[1] and budget.too_big(run, None) == []


def test_workers_are_started_ahead_only_where_the_budget_has_room_for_them_idle(tmp_path):
    """A BERT-base-sized baseline converting under a 5.75 GB budget had an idle worker (1.2 GB, TensorFlow
    imported) started beside it for the groups after it: the tree passed the budget. Ahead of their tasks,
    workers start only where the budget holds them idle beside what runs and what is queued."""
    from optimize.engine.executors import ProcessExecutor

    keras = ModelSource(tmp_path / "m.keras", "keras2", "0" * 16)
    convert = _task(keras, [build("float32", [{"technique": "convert"}])], weights=400 * MB)
    held = footprint.tree_memory(os.getpid())[1]
    tight = budget.Budget(held + budget.task_need(convert) + budget.WORKER_BYTES // 2, stated=True)
    ample = budget.Budget(tight.bytes + budget.WORKER_BYTES + budget.TF_BYTES + 500 * MB, stated=True)
    assert not budget.Admission(tight).room_for_worker([convert], [], warm="tf")
    assert budget.Admission(ample).room_for_worker([convert], [], warm="tf")
    assert budget.Admission(None).room_for_worker([convert], [], warm="tf")
    ex = ProcessExecutor(jobs=2, limit=tight)
    try:
        ex.queue.append(convert)  # submitted, not yet dispatched
        ex.expect(2, warm="")
        assert ex.spawned == 0  # no room beside the queued conversion: started when admitted instead
    finally:
        ex.close()


def test_the_workers_after_a_small_keras_baseline_start_while_it_converts(keras_model, data_npz, tmp_path, monkeypatch):
    """A small Keras model's float32 is converted in the sweep's process (3.5 s on one core for MobileNetV2), and the
    second worker was started only after it, its imports then on the sweep's path. Now they start first, warmed for
    what follows (quantizing that .tflite: no TensorFlow to import), and import while it converts."""
    from optimize.engine import sweeps
    from optimize.engine.executors import ProcessExecutor
    from optimize.engine.runs import Run

    order = []
    expect, export = ProcessExecutor.expect, Run.export
    monkeypatch.setattr(
        ProcessExecutor, "expect", lambda ex, n, warm="": order.append(("expect", warm, n)) or expect(ex, n, warm)
    )
    monkeypatch.setattr(Run, "export", lambda run, direct=True: order.append(("export",)) or export(run, direct))
    recipes = [build(s, [{"technique": "convert", "scheme": s, "samples": 50}]) for s in ("float32", "dynamic", "int8")]
    study = sweeps.sweep(keras_model, data_npz, tmp_path / "o", recipes=recipes, jobs=2, cache=False, runs=3, fit=False)
    assert order[:2] == [("expect", "measure", 3), ("export",)], order
    assert [c.name for c in study.candidates if c.ok] == ["float32", "dynamic", "int8"]


def test_workers_ahead_of_tasks_that_only_quantize_do_not_import_tensorflow():
    """Workers started ahead for the groups after a Keras baseline imported TensorFlow (about 1.2 GB each, idle) even
    where every group quantizes the baseline's .tflite; only a group that fine-tunes or converts the source needs
    it ahead."""
    from types import SimpleNamespace

    from optimize.engine import schedule

    base = build("float32", [{"technique": "convert"}])
    int8 = build("int8", [{"technique": "convert"}, {"technique": "quantize", "scheme": "int8"}])
    prune = build("prune-int8", [{"technique": "prune"}, {"technique": "convert", "scheme": "int8"}])
    run = SimpleNamespace(src=SimpleNamespace(kind="keras2"), baseline=base)
    assert schedule._warm_for(schedule._Pending(run, [[int8]])) == "measure"
    assert schedule._warm_for(schedule._Pending(run, [[int8], [prune]])) == "tf"
    run.src.kind = "tflite"
    assert schedule._warm_for(schedule._Pending(run, [[int8], [prune]])) == "measure"


def test_an_opener_killed_once_is_started_again(keras_model, data_npz, tmp_path, monkeypatch, caplog):
    """The soak's chaos SIGKILLed an opener (a worker process to it): the sweep ended with exit 2. A killed opener
    is started again once; the sweep goes on."""
    import crash_fixtures

    from optimize.engine import executors, runs, sweeps

    marker = tmp_path / "died"
    monkeypatch.setenv("OPTIMIZE_TEST_DIE_ONCE", str(marker))
    monkeypatch.setattr(executors, "OPEN_HERE_BYTES", 0)
    monkeypatch.setattr(runs, "opened_elsewhere", crash_fixtures.open_dying_once)
    recipes = [build("float32", [{"technique": "convert"}])]
    with caplog.at_level("WARNING", logger="optimize"):
        study = sweeps.sweep(keras_model, data_npz, tmp_path / "o", recipes=recipes, jobs=1, cache=False, runs=3)
    assert marker.read_text() == "died" and study.candidates[0].ok
    said = [r.getMessage() for r in caplog.records if "Opening it again" in r.getMessage()]
    assert said and "ended, killed by SIGKILL" in said[0], said

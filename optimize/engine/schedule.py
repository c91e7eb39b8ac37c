"""Driving sweeps through an executor: one model (`optimize sweep`) or many (`optimize zoo`) at once.

    cache lookup -> produce (each model's baseline group first, its other groups once the baseline is
    known) -> time (after production, round-robin per node: optimize.measure.timing) -> store -> rescue round -> Study

Every model's tasks share one executor, so a zoo keeps every worker (or every Ray node) busy while each
model still has its float32 baseline first: the other groups of a model are submitted the moment its
baseline candidate arrives, compared with it. A recipe that only quantizes what the baseline made (float16,
dynamic, int8, ... by LiteRT Quantizer) is a task of its own, started from the baseline's artifact, so the
workers the baseline leaves idle produce those in parallel while nothing is converted twice; timing comes
after all production, alone on the machine.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from optimize.convert.keras import export_notes
from optimize.core import paths
from optimize.core.recipe import Recipe
from optimize.core.results import Candidate, Dropped, MemoryUse, Study
from optimize.engine import stop
from optimize.engine.budget import Budget, budget, converts_directly, too_big
from optimize.engine.executors import executor
from optimize.engine.pipeline import direct_notes
from optimize.engine.plan import _groups, expected_cost, from_baseline
from optimize.engine.runs import Run
from optimize.engine.work import Task, TimingTask
from optimize.measure import footprint
from optimize.models.source import TF_KINDS
from optimize.present.progress import Progress

log = logging.getLogger(__name__)


@dataclass
class _Pending:
    """One run's groups still to submit (they wait for the run's baseline) and what it produced."""

    run: Run
    waiting: list[list[Recipe]]
    fresh: list[Candidate] = field(default_factory=list)

    def task(
        self, group: list[Recipe], baseline_name: str | None = None, ref=None, metrics=None, start=None, exported=None
    ) -> Task:
        """The task for a group of this run's recipes; `exported`: (the source's SavedModel, seconds) for the
        baseline's (`Run.export`)."""
        r = self.run
        return Task(
            r.src,
            r.ds,
            tuple(group),
            r.out_dir,
            r.task_settings,
            reference=ref,
            baseline=metrics,
            baseline_name=baseline_name,
            tag=r.tag,
            start=start,
            exported=exported[0] if exported else None,
            exported_seconds=exported[1] if exported else 0.0,
            weights=r.footprint,
        )

    def release_made(self, ex, base: Recipe, float32: Path, baseline: Task) -> None:
        """Submit the waiting groups now, compared with the float32 .tflite the sweep's process converted
        (`Run.export`), while a worker measures it as the baseline (`baseline`, submitted second): they need
        its file, not its figures (the accuracy deltas are filled in once it is measured, `with_deltas`). The
        longest group goes first, to the warmest worker: it is what the sweep waits for."""
        notes = direct_notes(self.run.src.kind, export_notes(float32.parent))
        start = (tuple(base.steps), float32, tuple(notes))
        tasks = [self.task(g, ref=float32, start=start) for g in sorted(self.waiting, key=expected_cost, reverse=True)]
        for task in [*tasks[:1], baseline, *tasks[1:]]:
            ex.submit(task)
        self.waiting = []

    def with_deltas(self) -> None:
        """What each candidate gained or lost against the baseline's accuracy (points, or the error ratio),
        for those produced before the baseline was measured (`release_made`)."""
        from optimize.measure.metrics import compare

        base_name = self.run.baseline.name if self.run.baseline is not None else None
        base = next((c for c in self.fresh if c.name == base_name), None) or self.run.done.get(base_name)
        accuracy = base.metrics.accuracy if base is not None and base.ok and base.metrics is not None else None
        if accuracy is None:
            return
        for i, c in enumerate(self.fresh):
            m = c.metrics
            if c.name != base_name and m is not None and m.accuracy is not None and not _has_delta(m):
                m = _gpu_delta(m.model_copy(update=compare(m.accuracy, accuracy)), accuracy)
                self.fresh[i] = c.model_copy(update={"metrics": m})

    def release(self, ex, baseline: Candidate | None) -> None:
        """Submit the waiting groups, compared with `baseline` (none if it failed or never came)."""
        ok = baseline is not None and baseline.ok
        ref = self.run.out_dir / baseline.artifact if ok else None
        base = self.run.baseline
        start = (tuple(base.steps), ref) if ok and base is not None and base.steps else None
        for g in sorted(self.waiting, key=expected_cost, reverse=True):  # the longest first
            ex.submit(self.task(g, ref=ref, metrics=baseline.metrics if ok else None, start=start))
        self.waiting = []


def _start(ex, run: Run) -> _Pending | None:
    """Submit a run's first task: the group holding its baseline (or every group, when the baseline is
    known already, from the cache)."""
    misses = run.misses()
    if not misses:
        return None
    groups = _groups(misses)
    base = run.baseline
    known = run.done.get(base.name) if base else None
    first = None
    if base is not None and known is None:
        first = next((g for g in groups if any(r.name == base.name for r in g)), None)
    pending = _Pending(run, [g for g in groups if g is not first])
    if first is not None:
        _submit_baseline(ex, pending, first, base)
    else:  # what starts from the baseline's artifact is a task of its own (a later round's fit-*, say)
        pending.waiting = [part for g in pending.waiting for part in _split(g, base)]
        pending.release(ex, known)
    return pending


def _split(group: list[Recipe], base: Recipe | None) -> list[list[Recipe]]:
    if base is None:
        return [group]
    rest, alone = _split_off(group, base)
    return ([rest] if rest else []) + alone


def _submit_baseline(ex, pending: _Pending, first: list[Recipe], base: Recipe) -> None:
    """The baseline's group submitted (what starts from its artifact waits, each a task of its own), with the
    source made ready for it here (`Run.export`); when that is its float32 .tflite, what waits starts now."""
    run = pending.run
    first, alone = _split_off(first, base)
    pending.waiting += alone
    here = ex.name == "local" and _converts_source(base)  # same disk
    if here and _plain(base) and converts_directly(run.footprint):
        _expect(ex, pending)
    exported = run.export(_plain(base)) if here else None
    task = pending.task(first, baseline_name=base.name, exported=exported)
    made = exported is not None and exported[0].suffix == ".tflite"  # the float32 itself: nothing to convert
    if made and pending.waiting:
        pending.release_made(ex, base, exported[0], task)  # no wait for its measuring either
    else:
        ex.submit(task)
    _expect(ex, pending)  # those not started yet, started now


def _expect(ex, pending: _Pending) -> None:
    """Workers for what follows the baseline started ahead of its tasks (`ProcessExecutor.expect`), warmed for it
    (`_warm_for`). Before a small Keras model's float32 is converted here (seconds on one core), so they import on
    the other cores meanwhile, not after it; again once it is submitted."""
    if pending.waiting and hasattr(ex, "expect"):
        ex.expect(len(pending.waiting) + 1, warm=_warm_for(pending))


def _warm_for(pending: _Pending) -> str:
    """What the workers for the groups after the baseline import ahead: TensorFlow ("tf") only where one of them
    fine-tunes or converts the source itself; those that start from the baseline's .tflite quantize and measure it
    ("measure": no TensorFlow; a converter fallback imports it when it happens). An idle worker with TensorFlow
    imported holds about 1.2 GB: the BERT-base-sized sweep's tree counted such workers beside its conversion."""
    run, base = pending.run, pending.run.baseline
    if run.src.kind not in TF_KINDS:
        return "measure"
    tf = any(r.trains or base is None or not from_baseline(r, base) for g in pending.waiting for r in g)
    return "tf" if tf else "measure"


def _gpu_delta(m, accuracy):
    """The metrics with the GPU's figures compared with the baseline's accuracy too: until the baseline came,
    they were compared with themselves (a change of 0)."""
    from optimize.measure.metrics import compare

    gpu = m.on_target.gpu if m.on_target is not None else None
    if gpu is None or gpu.accuracy is None:
        return m
    gpu = gpu.model_copy(update={"accuracy_delta": None, "error_ratio": None, **compare(gpu.accuracy, accuracy)})
    return m.model_copy(update={"on_target": m.on_target.model_copy(update={"gpu": gpu})})


def _has_delta(m) -> bool:
    return m.accuracy_delta is not None or m.error_ratio is not None


def _converts_source(base: Recipe) -> bool:
    """The baseline begins by converting the source model (a Keras model: what `Run.export` exports)."""
    return bool(base.steps) and base.steps[0].technique == "convert"


def _plain(base: Recipe) -> bool:
    """The baseline is the plain float32 conversion (no Flex ops): what the direct route makes."""
    p = base.steps[0].params
    return len(base.steps) == 1 and p.scheme == "float32" and not getattr(p, "select_tf_ops", False)


def _split_off(group: list[Recipe], base: Recipe) -> tuple[list[Recipe], list[list[Recipe]]]:
    """The baseline's group, and the recipes in it that start from the baseline's artifact, each a task of
    its own to submit after the baseline: idle workers take them."""
    alone = [r for r in group if r.name != base.name and from_baseline(r, base)]
    return [r for r in group if r not in alone], [[r] for r in alone]


def produce(ex, runs: list[Run], progress: Progress) -> dict[str, _Pending]:
    """Every run's missing candidates through one executor; returns what each run produced (untimed)."""
    pending = {p.run.tag: p for p in (_start(ex, r) for r in runs) if p is not None}
    if not pending:
        return {}
    while True:
        for tag, cand in ex.results():
            p = pending[tag]
            p.fresh.append(cand)
            base = p.run.baseline
            if p.waiting and base is not None and cand.name == base.name:
                p.release(ex, cand)  # before anything else: idle workers wait for these
            progress.advance(p.run.label(cand.name), cand.ok)
        stuck = [p for p in pending.values() if p.waiting]
        if not stuck:
            for p in pending.values():
                p.with_deltas()
            return pending
        for p in stuck:  # the baseline never came: compare with nothing
            p.release(ex, None)


def time_and_store(ex, pending: dict[str, _Pending], on_candidate=None) -> None:
    """Time what was produced (after production, round-robin, one timing task per node), then cache it."""
    tasks = []
    for p in pending.values():
        r = p.run
        s = r.settings
        tasks.append(TimingTask(tuple(p.fresh), r.out_dir, r.sample, s["threads"], s["runs"], r.tag))
    n = sum(c.ok for p in pending.values() for c in p.fresh)
    if n:
        log.info("Timing %d candidate(s) together, round-robin, per node...", n)
    for tag, cands in ex.time(tasks):
        pending[tag].run.store(cands, on_candidate)


def _round(ex, runs: list[Run], progress: Progress, on_candidate) -> None:
    for r in runs:
        r.reuse(progress, on_candidate)
    pending = produce(ex, runs, progress)
    if pending:
        time_and_store(ex, pending, on_candidate)


def _rounds(ex, runs: list[Run], progress: Progress, on_candidate, limit: Budget | None) -> None:
    """The runs' round, then the round of those that added an accuracy-rescue candidate or fit-* candidates (those
    too, left out with why where their work cannot fit the budget)."""
    _round(ex, runs, progress, on_candidate)
    rescued = [r for r in runs if any([r.rescue(), r.fit_round()])]  # both asked, always
    for r in rescued:
        _drop_too_big(r, limit)
    if rescued:
        progress.start(sum(len(r.recipes) for r in runs))
        _round(ex, rescued, progress, on_candidate)


def run_all(
    runs: list[Run],
    jobs: int | None = None,
    progress: Progress | None = None,
    kind: str = "local",
    address: str | None = None,
    on_candidate: Callable[[Candidate], None] | None = None,
    spare=None,
    limit: Budget | None = None,
    sampler: footprint.Sampler | None = None,
) -> list[Study]:
    """Run every sweep through one executor (`kind` local or ray); each study saved in its folder. `spare`:
    a warm worker started before the runs were opened (executors.spare), taken as the first worker. `limit`:
    the memory budget local workers are admitted against (default: what the machine has free now); `sampler`:
    the process tree's memory, sampled since the runs were opened (default: from now), recorded in each study."""
    progress = progress or Progress()
    names = [r.tag for r in runs]
    if len(set(names)) != len(names):
        raise ValueError("every run needs its own tag")
    groups = sum(r.groups for r in runs)
    n_jobs = default_jobs(groups) if jobs is None else jobs
    limit = (limit or budget()) if kind == "local" else None  # Ray schedules by its own resources
    for r in runs:
        _drop_too_big(r, limit)
    if kind == "local":
        log.info("Producing candidates in %s process(es)...", n_jobs or "this")
    with _staged(runs, progress), contextlib.ExitStack() as stack:
        sampler = sampler or stack.enter_context(footprint.Sampler())
        try:
            with executor(n_jobs, progress, kind, address, spare, limit) as ex:
                _rounds(ex, runs, progress, on_candidate, limit)
                name = ex.name
        finally:
            progress.close()
        studies = []
        for r in runs:
            shutil.rmtree(r.out_dir / ".work", ignore_errors=True)
            r.memory = _memory_use(sampler, limit)
            studies.append(r.study(name))
        for r, study in zip(runs, studies, strict=True):
            _publish(r, study)
    return studies


def _publish(r: Run, study: Study) -> None:
    """The run's staging folder moved into its output folder, and the files of the study it replaced that
    this one did not write again removed (`_replaced`)."""
    paths.publish(r.out_dir, r.final)
    written = {c.artifact for c in study.candidates}
    for name in r.replaces:
        if name not in written:
            paths.remove_below(r.final, r.final / name)


def _replaced(r: Run) -> list[str]:
    """The .tflite files the study already in the output folder lists: what this run's study replaces. Those
    this run does not write again are removed once it publishes (a run that fails or is interrupted leaves
    the folder as it was), so another model's files never stay beside the new study.json; said before the
    run when that study is another model's."""
    from optimize.core.errors import OptimizeError
    from optimize.core.results import load_study

    if not (r.out_dir / "study.json").is_file():
        return []
    try:
        old = load_study(r.out_dir)
    except OptimizeError:  # not a study this version reads: its files are left alone
        return []
    files = [
        c.artifact for c in old.candidates if c.artifact and c.artifact.endswith(".tflite") and "/" not in c.artifact
    ]
    if files and old.model_fingerprint != r.src.fingerprint:
        log.warning(
            "%s holds the study of another model (%s): its %d .tflite file(s) are replaced when this run ends.",
            r.out_dir,
            old.model,
            len(files),
        )
    return files


@contextlib.contextmanager
def _staged(runs: list[Run], progress: Progress):
    """What the runs set up before any work: the progress bar, counting every recipe, and the folders. Each run writes into a staging folder inside its output folder; what `publish` did not move (an
    interrupted or failed run) is removed, so -o holds a whole sweep or what it held before (issue 18).
    Every temporary of the run (this process's and its workers') lives in the first run's staging folder too
    (`paths.temporaries_in`), so nothing is left in the system's temp folder, whatever ends the run; staging
    folders of a run that was killed are removed by the next run into the same folder (`paths.staging`)."""
    progress.start(sum(len(r.recipes) for r in runs))
    for r in runs:
        r.replaces = _replaced(r)
        r.final, r.out_dir = r.out_dir, paths.staging(r.out_dir)
    stages = [(r.out_dir, r.created) for r in runs]

    def unstage() -> None:
        for stage, created in stages:
            paths.discard(stage)
            paths.remove_if_empty(created)  # an -o this run made and never published into: gone again

    try:
        with stop.on_stop(unstage), paths.temporaries_in(runs[0].out_dir / paths.TMP):
            yield
    finally:
        unstage()
        for r in runs:
            r.out_dir = r.final


def _drop_too_big(r: Run, limit: Budget | None) -> None:
    """A run's recipes whose work cannot fit the memory budget, left out with why (study.json's `dropped`)."""
    for recipe, why in too_big(r, limit):
        if recipe is r.baseline:
            continue  # the baseline's conversion was checked before any work (sweeps), or fails as a candidate
        r.recipes.remove(recipe)
        r.dropped.append(Dropped(recipes=[recipe.name], reason=why))
        log.warning("Dropped %s: it %s.", recipe.name, why)


def _memory_use(sampler: footprint.Sampler, limit: Budget | None) -> MemoryUse:
    sampler.sample()
    return MemoryUse(
        peak_bytes=sampler.peak,
        peak_pss_bytes=sampler.peak_pss,
        sampled_every_s=sampler.every,
        budget_bytes=limit.bytes if limit is not None else None,
        budget_stated=bool(limit and limit.stated),
    )


def default_jobs(n_groups: int) -> int:
    """Workers: one per core (each admitted to a task only while its estimated memory fits the budget:
    `budget.Admission`), no more than there are groups of recipes to make."""
    return max(1, min(os.cpu_count() or 1, n_groups))

"""Tasks as values: what an executor runs, and the one function that runs it.

A `Task` is a plain, picklable value: the model (a `models.ModelSource`), its data, the recipes to
produce in order in one Workspace (recipes that share a Keras prefix travel together, so prune -> int8
and prune -> cluster -> int8 prune once), the settings, and what they are compared with (a reference
artifact and its metrics, or the name of the task's own baseline recipe, whose result becomes the
reference for the recipes after it). `run_task` is the one loop every executor runs: in this process,
in a worker process, or on a Ray node. Executors differ only in where and when a task runs.

A `TimingTask` is the same for latency: candidates of one model, timed together on one node after
production (`time_task`: round-robin rounds, so drift hits all alike), with the node recorded on each.
"""

from __future__ import annotations

import shutil
import socket
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

from optimize.core.errors import ModelError
from optimize.core.recipe import Recipe
from optimize.core.results import PHASES, Candidate, Memory, Metrics
from optimize.engine.pipeline import Workspace, make_candidate, own_reference
from optimize.measure import memory
from optimize.measure import metrics as measure
from optimize.present.progress import Progress

#: Signals that mean the technique itself crashed (deterministic: worth caching as a failure); anything
#: else (SIGKILL from the OOM killer, SIGTERM, a lost node) is the environment's doing.
CRASH_SIGNALS = ("SIGSEGV", "SIGBUS", "SIGILL", "SIGFPE", "SIGABRT")


@dataclass(frozen=True)
class Settings:
    """What producing a candidate needs besides its recipe and model."""

    threads: int = 2
    eval_samples: int | None = measure.DEFAULT_SAMPLES
    delegates: bool = True
    timing: bool = False  # sweeps time candidates afterwards, together in rounds per node
    data_errors_fatal: bool = True  # False in sweeps: their data was checked up front, one candidate fails alone


@dataclass(frozen=True)
class Task:
    """One (model, recipe group): everything needed to produce it anywhere."""

    src: object  # models.ModelSource
    data: object  # data.Dataset | None
    recipes: tuple[Recipe, ...]
    out_dir: Path
    settings: Settings = field(default_factory=Settings)
    reference: Path | None = None
    baseline: Metrics | None = None
    baseline_name: str | None = None  # a recipe of this task whose result is the reference for those after it
    own_reference: bool = False  # compare with a float32 conversion made for this task (single runs)
    start: tuple | None = None  # (steps, artifact[, notes]): what those steps made, for recipes that begin with them
    exported: Path | None = None  # the source model's SavedModel, exported by the parent from the model it checked
    exported_seconds: float = 0.0  # what that export took there (the baseline's convert phase counts it)
    tag: str = ""  # which run (model) the task belongs to; executors hand it back with each candidate

    def after(self, cand: Candidate) -> Task:
        """The task as it stands once `cand` is done: its baseline becomes the reference of the rest."""
        if cand.name == self.baseline_name and cand.ok:
            return replace(self, reference=self.out_dir / cand.artifact, baseline=cand.metrics)
        return self

    def rest(self, done: set[str], skip: str | None = None) -> Task | None:
        """What is left of the task (after a crash or a lost node), or None when nothing is."""
        left = tuple(r for r in self.recipes if r.name not in done and r.name != skip)
        if not left:
            return None
        keep = self.baseline_name if self.baseline_name in {r.name for r in left} else None
        return replace(self, recipes=left, baseline_name=keep)

    def first_open(self, done: set[str]) -> Recipe:
        """The recipe the task was on: tasks produce their recipes in order."""
        return next((r for r in self.recipes if r.name not in done), self.recipes[0])


class Workspaces:
    """The Workspaces of one process, one per (model, data, threads, folder): a worker keeps sharing step
    prefixes across the tasks it is given. Bounded; a workspace whose folder was removed is rebuilt."""

    def __init__(self, size: int = 4):
        self.size = size
        self.open: OrderedDict[tuple, Workspace] = OrderedDict()

    def get(self, task: Task, root: Path, shared: Path | None = None) -> Workspace:
        data_fp = task.data.fingerprint if task.data is not None else None
        key = (task.src.fingerprint, str(task.src.path), data_fp, task.settings.threads, str(root))
        ws = self.open.get(key)
        if ws is None or not ws.workdir.is_dir():
            workdir = root / f"{task.src.fingerprint}-{data_fp or 'none'}-t{task.settings.threads}"
            workdir.mkdir(parents=True, exist_ok=True)
            ws = Workspace(task.src, task.data, workdir, task.settings.threads, shared)
            self.open[key] = ws
        self.open.move_to_end(key)
        while len(self.open) > self.size:
            _, old = self.open.popitem(last=False)
            shutil.rmtree(old.workdir, ignore_errors=True)
        return ws


def run_task(ws: Workspace, task: Task, progress: Progress) -> Iterator[Candidate]:
    """Produce, measure and check each recipe of a task in order; the one loop every executor runs."""
    s = task.settings
    if task.start is not None:
        ws.seed(*task.start)
    if task.exported is not None:
        ws.seed_export(task.exported, task.exported_seconds)
    if task.own_reference and task.recipes:
        ref, base = own_reference(ws, task.recipes[0], s.eval_samples)
        task = replace(task, reference=ref, baseline=base)
    for recipe in task.recipes:
        progress.begin(recipe.name)
        cand = make_candidate(
            ws,
            recipe,
            task.out_dir,
            reference=task.reference,
            baseline=task.baseline,
            delegates=s.delegates,
            timing=s.timing,
            eval_samples=s.eval_samples,
            progress=progress,
            data_errors_fatal=s.data_errors_fatal,
        )
        task = task.after(cand)
        yield cand


def crashed(recipe, why: str, step: str | None = None) -> Candidate:
    """The failed candidate for a worker that died on `recipe` (`why`: "killed by SIGSEGV", ...), naming the
    step it died in and the native code that step runs (`step`: "convert scheme=int8"), where known."""
    where = f" in step `{step}` ({step_runs(step)})" if step else " while producing or measuring this candidate"
    return Candidate.failed(
        recipe, f"worker process {why}{where}", kind="WorkerCrashed", detail=why.removeprefix("killed by ")
    )


#: What each technique's step runs natively: what a crash in it is a crash of.
STEP_CODE = {
    "convert": "the TFLite converter",
    "quantize": "LiteRT Quantizer, the TFLite calibrator or the LiteRT runtime checking the result",
    "pt2e": "litert-torch's PT2E quantizer and converter",
    "selective": "LiteRT Quantizer and the LiteRT runtime",
    "prune": "TensorFlow fine-tuning (tfmot pruning)",
    "cluster": "TensorFlow fine-tuning (tfmot clustering)",
    "qat": "TensorFlow fine-tuning (tfmot quantization-aware training)",
}


def step_runs(step: str) -> str:
    """`the TFLite converter's int8 calibration and quantizer`: who crashed, for a step such as `convert scheme=int8`."""
    technique, _, rest = step.partition(" ")
    scheme = rest.removeprefix("scheme=")
    if technique == "convert" and scheme in ("int8", "int16x8"):
        return f"the TFLite converter's {scheme} calibration and quantizer"
    return STEP_CODE.get(technique, technique)


def received(payload: str, recipe, out_dir: Path) -> Candidate:
    """A worker's result record read back in the parent, or, when it does not validate (a value the JSON
    round trip cannot carry back, a bug), the failed candidate that says so, its artifact removed from
    `out_dir`: one record never stops a sweep, and no file stands without its record."""
    from pydantic import ValidationError

    from optimize.engine.pipeline import artifact_path

    try:
        return Candidate.model_validate_json(payload)
    except ValidationError as e:
        artifact_path(out_dir, recipe.name).unlink(missing_ok=True)
        first = e.errors()[0] if e.errors() else {"loc": (), "msg": str(e)}
        where = ".".join(str(p) for p in first.get("loc", ())) or "the record"
        why = f"its result record from the worker could not be read back ({where}: {first.get('msg')})"
        return Candidate.failed(recipe, why, kind="RecordUnreadable", detail=str(e))


def this_node() -> str:
    """How a candidate names the machine that timed it (executors on a cluster add their node id)."""
    return socket.gethostname()


@dataclass(frozen=True)
class TimingTask:
    """Candidates of one model to time together on one node, after production: round-robin, so machine
    drift hits all alike (`interleave=False`: the older one-after-another timing, kept for comparison)."""

    cands: tuple[Candidate, ...]
    out_dir: Path
    sample: object  # one input sample (array or dict of arrays), or None
    threads: int = 2
    runs: int = 50
    tag: str = ""
    interleave: bool = True


def _not_timed(c: Candidate, e: ModelError) -> Candidate:
    """A model this runtime cannot run (custom ops it lacks) keeps its size only, and says why."""
    return c.model_copy(update={"notes": [*c.notes, f"not timed: {e.problem}"]})


def _time_one(c: Candidate, t: TimingTask) -> Candidate:
    """One candidate timed on its own (the older, one-after-another timing)."""
    try:
        metrics = measure.add_timing(
            c.metrics, t.out_dir / c.artifact, t.sample, threads=t.threads, runs=t.runs, memory=False, sequential=True
        )
    except ModelError as e:
        return _not_timed(c, e)
    return c.model_copy(update={"metrics": metrics})


def _time_together(cands: list[Candidate], t: TimingTask) -> dict[str, Candidate]:
    """Every candidate timed in the same rounds (optimize.measure.timing), each with its p50 interval."""
    paths = [t.out_dir / c.artifact for c in cands]
    out = {}
    for c, lat in zip(cands, measure.time_many(paths, t.sample, t.threads, t.runs)):
        if isinstance(lat, ModelError):
            out[c.name] = _not_timed(c, lat)
        else:
            out[c.name] = c.model_copy(
                update={"metrics": c.metrics.model_copy(update={"latency": lat, "memory": None})}
            )
    return out


def _spent(c: Candidate, phase: str, seconds: float) -> Candidate:
    """The candidate with `seconds` more in `phase` and in its total (timing and memory come after production)."""
    phases = {**c.phases, phase: round(c.phases.get(phase, 0.0) + seconds, 3)}
    ordered = {p: phases[p] for p in PHASES if p in phases}
    return c.model_copy(update={"phases": ordered, "seconds": c.seconds + seconds})


def _with_memory(runnable: list[Candidate], t: TimingTask) -> dict[str, Candidate]:
    """Each candidate's peak memory from one probe process, its share of the probe's time in its `memory`."""
    if not runnable:
        return {}
    paths = [t.out_dir / c.artifact for c in runnable]
    peaks, probe_s = memory.peak_memory_timed(paths, t.threads, t.sample)
    out = {}
    for c, peak in zip(runnable, peaks):
        got = {"memory": Memory(peak_rss_bytes=peak)} if isinstance(peak, int) else {"memory_error": peak}
        measured = c.model_copy(update={"metrics": c.metrics.model_copy(update=got)})
        out[c.name] = _spent(measured, "memory", probe_s / len(runnable))
    return out


def time_task(t: TimingTask, node: str | None = None) -> list[Candidate]:
    """Latency of every working candidate, timed together in rounds, then every peak memory from one probe
    process; each timed candidate records the node (`node`, default this host)."""
    node = node or this_node()
    ok = [c for c in t.cands if c.ok]
    timed = _time_together(ok, t) if t.interleave else {c.name: _time_one(c, t) for c in ok}
    timed.update(_with_memory([c for c in timed.values() if c.metrics.latency is not None], t))
    for name, c in timed.items():
        lat = c.metrics.latency
        if lat is not None and lat.seconds is not None:
            timed[name] = _spent(c, "latency", lat.seconds)
    out = []
    for c in t.cands:
        done = timed.get(c.name, c)
        out.append(done.model_copy(update={"node": node}) if done.ok and done.p50_ms is not None else done)
    return out

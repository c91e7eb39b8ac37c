"""Executors: tasks in, candidates out, with crash isolation per task.

A `Task` is a list of recipes produced in order in one Workspace (recipes that share a Keras prefix
travel together, so prune -> int8 and prune -> cluster -> int8 prune once), plus what they are compared
with: a reference artifact and its metrics, or the name of the task's own baseline recipe, whose
result becomes the reference for the recipes after it. `run_task` is the one loop that does this.

The interface a new executor implements (a Ray one, say) is three methods:

    submit(task)        queue a task; callable while results() is being iterated
    results()           yield each Candidate as soon as it is finished, until no task is left
    close()             release workers

`SerialExecutor` runs tasks in this process (no isolation: for tests and `jobs=0`). `ProcessExecutor`
runs them in spawned worker processes: a worker that dies (a segfault in the converter or the runtime on
a hostile model) fails only the candidate it was on, as a `WorkerCrashed` candidate naming the signal,
and the rest of its task is queued again on a fresh worker.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import signal
import sys
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from multiprocessing.connection import wait
from pathlib import Path

from .errors import OptimizeError
from .progress import Progress
from .recipe import Recipe
from .results import Candidate, Metrics

log = logging.getLogger(__name__)

#: Signals that mean the technique itself crashed (deterministic: worth caching as a failure); anything
#: else (SIGKILL from the OOM killer, SIGTERM) is the environment's doing.
CRASH_SIGNALS = ("SIGSEGV", "SIGBUS", "SIGILL", "SIGFPE", "SIGABRT")


@dataclass
class Settings:
    """What producing a candidate needs besides its recipe (all picklable, for worker processes)."""

    src: object  # models.ModelSource
    data: object  # data.Dataset | None
    out_dir: Path
    threads: int = 2
    eval_samples: int = 500
    delegates: bool = True
    timing: bool = False  # sweeps time candidates afterwards, one at a time, in the parent


@dataclass
class Task:
    recipes: list[Recipe]
    reference: Path | None = None
    baseline: Metrics | None = None
    baseline_name: str | None = None  # a recipe of this task whose result is the reference for those after it
    own_reference: bool = False  # compare with a float32 conversion made for this task (single runs)


def run_task(ws, task: Task, settings: Settings, progress: Progress) -> Iterator[Candidate]:
    """Produce, measure and check each recipe of a task in order; the one loop every executor runs."""
    from .pipeline import make_candidate, own_reference

    ref, base = task.reference, task.baseline
    if task.own_reference and task.recipes:
        ref, base = own_reference(ws, task.recipes[0])
    for recipe in task.recipes:
        progress.begin(recipe.name)
        cand = make_candidate(
            ws,
            recipe,
            settings.out_dir,
            reference=ref,
            baseline=base,
            delegates=settings.delegates,
            timing=settings.timing,
            eval_samples=settings.eval_samples,
            progress=progress,
        )
        if recipe.name == task.baseline_name and cand.ok:
            ref, base = settings.out_dir / cand.artifact, cand.metrics
        yield cand


class SerialExecutor:
    """Runs tasks in this process, in order. No crash isolation."""

    def __init__(self, settings: Settings, progress: Progress | None = None):
        from .pipeline import Workspace

        self.settings, self.progress = settings, progress or Progress()
        self.ws = Workspace(settings.src, settings.data, settings.out_dir / ".work", settings.threads)
        self.queue: deque[Task] = deque()

    def submit(self, task: Task) -> None:
        self.queue.append(task)

    def results(self) -> Iterator[Candidate]:
        while self.queue:
            yield from run_task(self.ws, self.queue.popleft(), self.settings, self.progress)

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _PipeProgress(Progress):
    def __init__(self, conn):
        self.conn = conn

    def phase(self, text: str) -> None:
        self.conn.send(("phase", text))

    def begin(self, name: str) -> None:
        self.conn.send(("start", name))


class _PipeHandler(logging.Handler):
    def __init__(self, conn):
        super().__init__(logging.INFO)
        self.conn = conn

    def emit(self, record: logging.LogRecord) -> None:
        self.conn.send(("log", (record.levelno, record.getMessage())))


def _worker_main(conn, settings: Settings, index: int) -> None:
    """A worker: one Workspace for every task it is given; events go back over the pipe."""
    from .pipeline import Workspace

    root = logging.getLogger("optimize")
    root.handlers[:] = [_PipeHandler(conn)]
    root.setLevel(logging.INFO)
    root.propagate = False
    ws = Workspace(settings.src, settings.data, settings.out_dir / ".work" / f"w{index}", settings.threads)
    progress = _PipeProgress(conn)
    while True:
        task = conn.recv()
        if task is None:
            return
        try:
            for cand in run_task(ws, task, settings, progress):
                conn.send(("done", cand.model_dump_json()))
        except OptimizeError as e:
            conn.send(("user_error", (type(e).__name__, e.problem, e.fix)))
            return
        conn.send(("idle", None))


def describe_exit(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


@dataclass
class _Worker:
    proc: mp.Process
    conn: object
    task: Task | None = None
    current: str | None = None
    done: set = field(default_factory=set)


class ProcessExecutor:
    """Runs tasks in at most `jobs` spawned worker processes; a crash fails only its candidate."""

    def __init__(self, settings: Settings, jobs: int = 1, progress: Progress | None = None):
        self.settings, self.jobs, self.progress = settings, max(1, jobs), progress or Progress()
        self.ctx = mp.get_context("spawn")
        self.queue: deque[Task] = deque()
        self.workers: list[_Worker] = []
        self.spawned = 0

    def submit(self, task: Task) -> None:
        self.queue.append(task)

    def _spawn(self) -> _Worker:
        parent, child = self.ctx.Pipe()
        proc = self.ctx.Process(target=_worker_main, args=(child, self.settings, self.spawned), daemon=True)
        self.spawned += 1
        proc.start()
        child.close()
        w = _Worker(proc, parent)
        self.workers.append(w)
        return w

    def _dispatch(self) -> None:
        idle = [w for w in self.workers if w.task is None]
        while self.queue and (idle or len(self.workers) < self.jobs):
            w = idle.pop() if idle else self._spawn()
            w.task, w.current, w.done = self.queue.popleft(), None, set()
            w.conn.send(w.task)

    def _crashed(self, w: _Worker) -> Candidate | None:
        """The candidate a dead worker was on, failed; the rest of its task goes back to the queue."""
        w.proc.join(timeout=5)
        why = describe_exit(w.proc.exitcode)
        task = w.task
        self.workers.remove(w)
        if task is None:
            return None
        name = w.current or task.recipes[0].name
        log.warning("worker %s while working on %s", why, name)
        recipe = next(r for r in task.recipes if r.name == name)
        rest = [r for r in task.recipes if r.name not in w.done and r.name != name]
        if rest:
            baseline_left = task.baseline_name in {r.name for r in rest}
            self.queue.appendleft(
                replace(task, recipes=rest, baseline_name=task.baseline_name if baseline_left else None)
            )
        signame = why.removeprefix("killed by ")
        return Candidate.failed(
            recipe,
            f"worker process {why} while producing or measuring this candidate",
            kind="WorkerCrashed",
            detail=signame,
        )

    def _event(self, w: _Worker, kind: str, payload) -> Candidate | None:
        if kind == "log":
            log.log(*payload)
        elif kind == "phase":
            self.progress.phase(payload)
        elif kind == "done":
            cand = Candidate.model_validate_json(payload)
            w.done.add(cand.name)
            w.current = None
            if w.task is not None and cand.name == w.task.baseline_name and cand.ok:
                # what the rest of this task is compared with, should it have to be queued again
                w.task = replace(w.task, reference=self.settings.out_dir / cand.artifact, baseline=cand.metrics)
            return cand
        elif kind == "user_error":
            from . import errors

            cls, problem, fix = payload
            raise getattr(errors, cls, OptimizeError)(problem, fix)
        elif kind == "idle":
            w.task = None
        return None

    def results(self) -> Iterator[Candidate]:
        self._dispatch()
        while any(w.task is not None for w in self.workers) or self.queue:
            busy = {w.conn: w for w in self.workers if w.task is not None}
            for conn in wait(list(busy)):
                w = busy[conn]
                try:
                    kind, payload = conn.recv()
                except (EOFError, OSError):
                    cand = self._crashed(w)
                else:
                    if kind == "start":
                        w.current = payload
                        self.progress.begin(payload)
                        continue
                    cand = self._event(w, kind, payload)
                if cand is not None:
                    yield cand
            self._dispatch()

    def close(self) -> None:
        for w in self.workers:
            try:
                w.conn.send(None)
            except (OSError, BrokenPipeError):
                pass
        for w in self.workers:
            w.proc.join(timeout=10)
            if w.proc.is_alive():
                w.proc.kill()
        self.workers.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def executor(settings: Settings, jobs: int, progress: Progress | None = None):
    """jobs 0: in this process; otherwise that many crash-isolated worker processes."""
    if jobs and not _spawnable():
        log.info("the main script cannot be re-imported by worker processes (stdin or -c): running in this process")
        jobs = 0
    return SerialExecutor(settings, progress) if jobs == 0 else ProcessExecutor(settings, jobs, progress)


def _spawnable() -> bool:
    """Spawned workers re-import the main script by path; a script read from stdin has none and hangs them."""
    main_file = getattr(sys.modules.get("__main__"), "__file__", None)
    return main_file is None or os.path.isfile(main_file)

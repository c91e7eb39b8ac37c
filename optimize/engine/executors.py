"""Executors: tasks in, candidates out, with crash isolation per task.

Tasks are plain values (`optimize.engine.work.Task`: model, data, recipes, settings) and every executor runs
them through the one function `work.run_task`; executors differ only in scheduling. The interface a new
executor implements (the Ray one, `optimize.engine.ray_executor`, is one) is:

    name                "local" or "ray": recorded in study.json
    submit(task)        queue a task; callable while results() is being iterated
    results()           yield (task.tag, Candidate) as soon as each is finished, until no task is left
    time(tasks)         time candidates after production, in rounds, one task per node: yields (tag, candidates)
    close()             release workers

`SerialExecutor` runs tasks in this process (no isolation: for tests and `jobs=0`). `ProcessExecutor`
runs them in spawned worker processes: a worker that dies (a segfault in the converter or the runtime on
a hostile model) fails only the candidate it was on, as a `WorkerCrashed` candidate naming the signal,
and the rest of its task is queued again on a fresh worker. Both time candidates in this process.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import os
import signal
import sys
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from multiprocessing.connection import wait

from optimize.core.errors import ModelError, OptimizeError
from optimize.core.results import Candidate
from optimize.engine import stop
from optimize.engine.budget import (
    OPEN_HERE_BYTES,
    RETIRE_BYTES,
    Admission,
    Budget,
    cannot_train,
    converts_directly,
    task_need,
    weights_bytes,
)
from optimize.engine.work import CRASH_SIGNALS, Task, TimingTask, Workspaces, crashed, received, run_task, time_task
from optimize.measure import footprint
from optimize.present.progress import Progress

__all__ = [
    "CRASH_SIGNALS", "Opener", "ProcessExecutor", "SerialExecutor", "Spare", "describe_exit", "executor", "opener", "spare",
]  # fmt: skip

log = logging.getLogger(__name__)


def workspace_root(task: Task, worker: str) -> os.PathLike:
    """Where a local worker keeps its workspaces for a task: inside the task's output folder (removed when
    the sweep ends)."""
    return task.out_dir / ".work" / worker


def shared_root(task: Task) -> os.PathLike:
    """What a run's local workers share (one calibration per model and data): inside the task's output folder."""
    return task.out_dir / ".work" / "shared"


class _LocalTiming:
    """Local executors time in this process, one candidate at a time, after production."""

    name = "local"

    def time(self, tasks: list[TimingTask]) -> Iterator[tuple[str, list[Candidate]]]:
        for t in tasks:
            yield t.tag, time_task(t)

    def __enter__(self):
        return self

    def __exit__(self, kind, *exc) -> None:
        if kind is not None and not issubclass(kind, Exception):
            self.kill()  # Ctrl-C, SIGTERM: stop now, not after the task at hand
        else:
            self.close()

    def close(self) -> None:
        pass

    def kill(self) -> None:
        self.close()


class SerialExecutor(_LocalTiming):
    """Runs tasks in this process, in order. No crash isolation."""

    def __init__(self, progress: Progress | None = None):
        self.progress = progress or Progress()
        self.workspaces = Workspaces()
        self.queue: deque[Task] = deque()

    def submit(self, task: Task) -> None:
        self.queue.append(task)

    def results(self) -> Iterator[tuple[str, Candidate]]:
        while self.queue:
            task = self.queue.popleft()
            ws = self.workspaces.get(task, workspace_root(task, "serial"), shared_root(task))
            for cand in run_task(ws, task, self.progress):
                yield task.tag, cand


def _send(conn, message) -> None:
    """A worker's one way to its parent. The parent gone (the pipe broken before the kernel's parent-death
    signal lands): the worker ends quietly, with no traceback."""
    try:
        conn.send(message)
    except (OSError, EOFError):
        os._exit(0)


class _PipeProgress(Progress):
    def __init__(self, conn):
        self.conn = conn

    def phase(self, text: str) -> None:
        _send(self.conn, ("phase", text))

    def begin(self, name: str) -> None:
        _send(self.conn, ("start", name))


class _PipeHandler(logging.Handler):
    def __init__(self, conn):
        super().__init__(logging.INFO)
        self.conn = conn

    def emit(self, record: logging.LogRecord) -> None:
        step = getattr(record, "step", None)
        if step:  # the step the worker is in now: named if the worker dies in it
            _send(self.conn, ("step", step))
        _send(self.conn, ("log", (record.levelno, record.getMessage())))


def _die_with_parent() -> None:
    """A worker never outlives the process that started it (issue 18: after `kill -9` of a sweep its
    workers worked on for 20 s and more): the kernel kills it when its parent dies (PR_SET_PDEATHSIG),
    and a parent already gone by then is noticed at once. Ctrl-C is the parent's to handle: the terminal
    sends it to the whole process group, and a worker's KeyboardInterrupt would print a traceback."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    parent = os.getppid()
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the pipe's EOF ends the worker at its next task
        pass
    if os.getppid() != parent:
        os._exit(1)


def _worker_main(conn, index: int, warm: str = "") -> None:
    """A worker: its workspaces kept across the tasks it is given; events go back over the pipe. `warm`: what it
    imports before its first task (`_warm_up`: "tf" or "measure"; a spare started before the run knew its tasks
    also takes the run's temporary folder from a ("tmpdir", folder) message)."""
    _die_with_parent()
    root = logging.getLogger("optimize")
    root.handlers[:] = [_PipeHandler(conn)]
    root.setLevel(logging.INFO)
    root.propagate = False
    if warm:
        _warm_up(warm)
    workspaces = Workspaces()
    progress = _PipeProgress(conn)
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):  # the parent is gone
            return
        if task is None:  # the run is over: everything this worker made was sent; leave at once
            _leave(conn)
        if isinstance(task, tuple) and task[0] == "tmpdir":
            import tempfile

            os.environ["TMPDIR"] = tempfile.tempdir = task[1]
            continue
        if isinstance(task, TimingTask):  # after production: the candidates timed here, alone on the machine
            _send(conn, ("timed", [c.model_dump_json() for c in time_task(task)]))
            continue
        try:
            ws = workspaces.get(task, workspace_root(task, f"w{index}"), shared_root(task))
            for cand in run_task(ws, task, progress):
                _send(conn, ("done", cand.model_dump_json()))
        except OptimizeError as e:
            _send(conn, ("user_error", (type(e).__name__, e.problem, e.fix)))
            return
        _send(conn, ("idle", None))


def _leave(conn) -> None:
    """End a worker whose work is all sent: its output flushed, then out through os._exit, not through the
    interpreter's teardown of TensorFlow and the runtime (about a second per worker, on the run's path)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    conn.close()
    os._exit(0)


def _warm_up(what: str) -> None:
    """What the worker's first task imports, done while the parent is still opening the model: "tf" for a task
    that converts a Keras model or a SavedModel (TensorFlow, tf_keras: seconds), "measure" for one that only
    quantizes and measures a .tflite (the interpreter, LiteRT Quantizer, the pipeline: about a second). A
    failure here is the task's to report, not this one's."""
    with contextlib.suppress(Exception):
        if what == "tf":
            from optimize.models import _tf

            _tf.tf()
            _tf.keras()
        import litert_quantizer.quantizer  # noqa: F401

        from optimize.engine import pipeline  # noqa: F401


def _start(proc) -> None:
    """Start a worker process with SIGINT blocked: a Ctrl-C that reaches the whole process group while the
    new interpreter is still importing (before it ignores SIGINT) would print its traceback. The child keeps
    it blocked, then ignored; here it is delivered as soon as the start returns."""
    block = hasattr(signal, "pthread_sigmask")  # not on Windows
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT}) if block else None
    try:
        with _quiet_tracker():
            proc.start()
    finally:
        if block:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)


class Spare:
    """One worker started before the run knows what it needs: while this process opens and checks the model
    (TensorFlow's import and a Keras load: seconds), the worker imports TensorFlow too, so the float32
    baseline, the first task, starts warm. The process executor adopts it as its first worker; one never
    adopted (a warm re-run answered from the cache, bad input, a serial or Ray run) is killed by `close`."""

    def __init__(self, warm: str = "tf") -> None:
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker_main, args=(child, 0, warm), daemon=True)
        _start(self.proc)
        child.close()
        self.taken = False

    def take(self) -> _Worker | None:
        """The worker, for an executor (told the run's temporary folder), or None if it died meanwhile."""
        if self.taken:
            return None
        self.taken = True
        import tempfile

        try:
            self.conn.send(("tmpdir", tempfile.gettempdir()))
        except (OSError, EOFError, ValueError):
            self._stop()
            return None
        return _Worker(self.proc, self.conn)

    def close(self) -> None:
        if not self.taken:
            self.taken = True
            self._stop()

    def _stop(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(timeout=5)
        with contextlib.suppress(OSError):
            self.conn.close()


def _converted_big(task) -> bool:
    """The task converted or fine-tuned (TensorFlow in its worker) a model above DIRECT_BYTES."""
    from optimize.engine.budget import work_of

    return task is not None and not converts_directly(task.weights) and work_of(task) in ("convert", "train")


def _tf_model(kind: str, jobs: int | None, model) -> bool:
    """A local run with worker processes on a model TensorFlow opens (a Keras file, a SavedModel; None is the
    built-in Keras demo)."""
    from pathlib import Path

    if kind != "local" or jobs == 0 or not _spawnable() or unguarded_main():
        return False
    if model is not None and not isinstance(model, (str, os.PathLike)):
        return False  # an nn.Module: converted here, its tasks quantize a .tflite
    p = None if model is None else Path(model)
    return p is None or p.is_dir() or p.suffix.lower() in (".keras", ".h5", ".hdf5")


def opener(kind: str, jobs: int | None, model, request, open_fn, export_fn) -> Opener | None:
    """An opener process for a model file TensorFlow opens, in a local run with worker processes (None otherwise:
    the built-in demo, a .tflite, PyTorch and ONNX models are opened in the sweep's process, as are all models
    with `jobs=0` or Ray; so is a model of at most OPEN_HERE_BYTES when this process imported TensorFlow already,
    an API caller's: starting a process that imports it again would cost more than the model's memory)."""
    if model is None or str(model) == "demo" or not _tf_model(kind, jobs, model):
        return None
    if "tensorflow" in sys.modules and weights_bytes(model) <= OPEN_HERE_BYTES:
        return None
    return Opener(request, open_fn, export_fn)


def spare(kind: str, jobs: int | None, model) -> Spare | None:
    """A warm spare worker for a local run with worker processes whose model TensorFlow opens (Keras or
    SavedModel; None is the built-in Keras demo); None where no worker process would take it."""
    from pathlib import Path

    if not _tf_model(kind, jobs, model):
        return None
    p = None if model is None else Path(model)
    # a small Keras model's float32 is converted by the opener, straight from the model the checks load
    # (runs.Run.export): its tasks measure a .tflite; a SavedModel's baseline, or a big Keras model's (exported
    # as a SavedModel), converts it in the worker
    converts = p is not None and not converts_directly(weights_bytes(p), p.is_dir())
    return Spare("tf" if converts else "measure")


def _opener_main(conn, open_fn, export_fn, request) -> None:
    """The opener process: `open_fn(request)` (the model opened and checked: `runs.opened_elsewhere`), its records
    sent back; then, when asked, the Keras model its checks loaded exported for the float32 baseline by
    `export_fn` (`runs.export_keras`). Only errors are logged back: the sweep's process repeats the same checks
    from these records and says their warnings itself."""
    _die_with_parent()
    root = logging.getLogger("optimize")
    root.handlers[:] = [_PipeHandler(conn)]
    root.setLevel(logging.ERROR)
    root.propagate = False
    try:
        records, (src, ds, model) = open_fn(request)
    except OptimizeError as e:
        _send(conn, ("user_error", (type(e).__name__, e.problem, e.fix)))
        _leave(conn)
    _send(conn, ("opened", records))
    while True:
        try:
            asked = conn.recv()
        except (EOFError, OSError):
            _leave(conn)
        if asked is None:
            _leave(conn)
        folder, direct = asked
        made = export_fn(model, src, ds, folder, direct) if model is not None else None
        model = None  # exported once: what it held goes when this process leaves
        _send(conn, ("exported", made))


class OpenerDied(ModelError):
    """The opener process died (a signal) before it answered."""


class Opener:
    """A process that opens a TensorFlow model (a Keras file, a SavedModel) in the sweep's place: it loads the model
    to check it against the data, sends back what it found (`found`, as `known` records), and later exports the
    loaded model for the float32 baseline (`export`), then leaves. The sweep's process never imports TensorFlow
    nor holds the model's weights, and what loading and converting it took goes back to the system when the
    opener leaves (issue 44: the sweep's own process held 7.4 GB for a 434 MB model). Started at the first
    question the result cache cannot answer (`runs.Found`): a warm re-run starts none."""

    def __init__(self, request, open_fn, export_fn) -> None:
        self.args = (request, open_fn, export_fn)
        self.proc = self.conn = self.tmp = None

    def found(self) -> list:
        """Start the opener and wait for what its checks found; its one-line error for bad input, or one saying
        it died (a crash, the out-of-memory killer) while it loaded the model, twice: an opener killed once (a
        signal from outside, a transient shortage) is started again before the run gives up. Its temporaries
        (TensorFlow's traced functions) go into a folder of its own, removed when it is let go (`close`), however
        the run ends."""
        try:
            return self._open()
        except OpenerDied as e:
            log.warning("%s Opening it again.", e.problem)
            self.close()
            self._discard()
            return self._open()

    def _open(self) -> list:
        from optimize.core import paths

        request, open_fn, export_fn = self.args
        self.tmp = paths.locked_folder(paths.system_tempdir(), "optimize-opener-")
        stop.register(self._discard)
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_opener_main, args=(child, open_fn, export_fn, request), daemon=True)
        with paths.environment({"TMPDIR": str(self.tmp)}):
            _start(self.proc)
        child.close()
        return self._reply("opened", f"opening {request.model}")

    def _discard(self) -> None:
        from optimize.core import paths

        if self.tmp is not None:
            paths.discard(self.tmp)

    def export(self, folder=None, direct: bool = True):
        """The loaded model exported for the baseline (`runs.export_keras`'s result), or None (not opened here,
        or its export failed: the baseline's worker converts it itself). With no `folder`, it leaves at once
        (nothing to export: a SavedModel), so what its checks loaded is not held while the workers convert."""
        if folder is None or self.conn is None or not self.proc.is_alive():
            self.close()
            return None
        try:
            self.conn.send((folder, direct))
            return self._reply("exported", "exporting the model")
        except (OSError, EOFError, OptimizeError):
            return None
        finally:
            self.close()

    def _reply(self, kind: str, doing: str):
        while True:
            try:
                got, payload = self.conn.recv()
            except (EOFError, OSError):
                self.proc.join(timeout=5)
                why = describe_exit(self.proc.exitcode)
                raise OpenerDied(
                    f"The process {doing} ended, {why}" + (" (out of memory?)" if "SIGKILL" in why else "") + ".",
                    "Free memory, or give the model to `optimize sweep --max-memory` on a larger machine.",
                ) from None
            if got == "log":
                log.log(*payload)
            elif got == "user_error":
                from optimize.core import errors

                cls, problem, fix = payload
                raise getattr(errors, cls, OptimizeError)(problem, fix)
            elif got == kind:
                return payload

    def close(self) -> None:
        """Let the opener go: told to leave when it is idle, killed when it is still at work (an interrupted run)."""
        if self.proc is None:
            return
        with contextlib.suppress(OSError, ValueError):
            self.conn.send(None)
        self.proc.join(timeout=1)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(timeout=5)
        with contextlib.suppress(OSError):
            self.conn.close()
        self._discard()
        stop.unregister(self._discard)


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
    step: str | None = None  # the step of `current` it is in (`convert scheme=int8`)
    need: int = 0  # the estimated peak of its task above an idle worker (budget.task_need)
    base: int = 0  # its resident memory when it took the task


@contextmanager
def _quiet_tracker():
    """While a worker (and the semaphore tracker, started with the first one) is spawned: workers stopped on
    Ctrl-C or SIGTERM leave their semaphores to the tracker, which frees them and warns; the freeing is what
    matters, the warning is noise on an interrupted run's last line. The caller's environment is restored,
    so an API user's later subprocesses do not inherit the filter."""
    from optimize.core.paths import environment

    before = os.environ.get("PYTHONWARNINGS", "")
    filters = [f for f in before.split(",") if f]
    quiet = "ignore::UserWarning:multiprocessing.resource_tracker"
    with environment({} if quiet in filters else {"PYTHONWARNINGS": ",".join([*filters, quiet])}):
        yield


class ProcessExecutor(_LocalTiming):
    """Runs tasks in at most `jobs` spawned worker processes; a crash fails only its candidate."""

    def __init__(
        self, jobs: int = 1, progress: Progress | None = None, spare: Spare | None = None, limit: Budget | None = None
    ):
        self.jobs, self.progress = max(1, jobs), progress or Progress()
        self.ctx = mp.get_context("spawn")
        self.queue: deque[Task] = deque()
        self.workers: list[_Worker] = []
        self.spawned = 0
        self.spare = spare  # a warm worker started before the run: the first one taken
        self.admission = Admission(limit)  # what may start now, by memory (None: by `jobs` alone)
        self.retired: list = []  # workers told to leave (`_retire`): joined when the executor closes
        self.refused: deque[tuple[str, Candidate]] = deque()  # failed at submission (`budget.cannot_train`)

    def submit(self, task: Task) -> None:
        why = cannot_train(task, self.admission.limit)
        if why is not None:  # never started: admission would start it alone, past the budget
            log.warning("%s: %s.", ", ".join(r.name for r in task.recipes), why)
            self.refused.extend((task.tag, Candidate.failed(r, why, kind="TooBig")) for r in task.recipes)
            return
        self.queue.append(task)

    def expect(self, n: int, warm: str = "") -> None:
        """`n` more tasks will come once a running one is done (a model's groups after its baseline): start the
        workers they will need now, so their start-up (Python, and what `warm` names, `_warm_up`: TensorFlow's
        import takes seconds) overlaps the running task instead of following it; only those the memory budget
        has room for beside what runs and waits (`Admission.room_for_worker`), the rest as tasks are admitted."""
        want = min(self.jobs, len(self.workers) + n)
        while len(self.workers) < want and self.admission.room_for_worker(list(self.queue), self._busy(), warm):
            self._spawn(warm)

    def _busy(self) -> list[tuple[int, int, int]]:
        """(pid, estimate, RSS when it took its task) of each busy worker: what `Admission` weighs."""
        return [(w.proc.pid, w.need, w.base) for w in self.workers if w.task is not None]

    def _spawn(self, warm: str = "") -> _Worker:
        w = self.spare.take() if self.spare is not None and self.spawned == 0 else None
        if w is None:
            parent, child = self.ctx.Pipe()
            proc = self.ctx.Process(target=_worker_main, args=(child, self.spawned, warm), daemon=True)
            _start(proc)
            child.close()
            w = _Worker(proc, parent)
        self.spawned += 1
        self.workers.append(w)
        return w

    def _dispatch(self) -> None:
        """Queued tasks to idle workers (new ones up to `jobs`), each admitted against the memory budget: the first
        queued task whose estimate fits what the running ones leave (`budget.Admission`; one always runs). A
        worker that died while idle (killed between two tasks, or between the rounds of a sweep) is let go and its
        task goes to another."""
        while self.queue:
            idle = [w for w in self.workers if w.task is None and self._alive(w)]
            if not idle and len(self.workers) >= self.jobs:
                return
            at = self.admission.first_fitting(list(self.queue), self._busy(), spawn=not idle)
            if at is None:
                return  # nothing fits until a running task ends
            w = idle.pop(0) if idle else self._spawn()  # the longest-started first: the warmest
            task = self.queue[at]
            del self.queue[at]
            try:
                w.conn.send(task)
            except (OSError, EOFError, ValueError):  # it died between the check and the send
                self.queue.insert(at, task)
                self._let_go(w)
                continue
            w.task, w.current, w.done = task, None, set()
            w.need, w.base = task_need(task), footprint.rss(w.proc.pid)

    def _retire(self, w: _Worker, heavy: bool = False) -> None:
        """A worker that went idle holding more than RETIRE_BYTES leaves now, as does one that converted or
        fine-tuned a model above DIRECT_BYTES (`heavy`): what its task took (TensorFlow, a conversion's heap, a big
        model's interpreters) goes back to the system instead of staying with it until the run ends; the next task
        starts a fresh worker that imports only what it needs. The BERT-base-sized baseline's worker, kept once a
        phase gave its heap back, took the quantizations with TensorFlow still imported, and each of its quantizer's
        forks counted those pages again."""
        if footprint.rss(w.proc.pid) <= RETIRE_BYTES and not heavy:
            return
        log.debug("worker %s holds %s idle: it leaves", w.proc.pid, footprint.gb(footprint.rss(w.proc.pid)))
        with contextlib.suppress(OSError, ValueError):
            w.conn.send(None)
        self.workers.remove(w)
        self.retired.append(w.proc)

    def _alive(self, w: _Worker) -> bool:
        if w.proc.is_alive():
            return True
        self._let_go(w)
        return False

    def _let_go(self, w: _Worker) -> None:
        """An idle worker that is gone: nothing was lost (it held no task)."""
        log.info("worker %s while idle; starting another", describe_exit(w.proc.exitcode))
        with contextlib.suppress(OSError):
            w.conn.close()
        if w in self.workers:
            self.workers.remove(w)

    def _crashed(self, w: _Worker) -> tuple[str, Candidate] | None:
        """The candidate a dead worker was on, failed; the rest of its task goes back to the queue."""
        w.proc.join(timeout=5)
        why = describe_exit(w.proc.exitcode)
        task = w.task
        self.workers.remove(w)
        if task is None:
            return None
        recipe = next((r for r in task.recipes if r.name == w.current), None) or task.first_open(w.done)
        step = w.step if w.current == recipe.name else None
        log.warning("worker %s while working on %s%s", why, recipe.name, f" (in {step})" if step else "")
        rest = task.rest(w.done, skip=recipe.name)
        if rest is not None:
            self.queue.appendleft(rest)
        return task.tag, crashed(recipe, why, step)

    def _event(self, w: _Worker, kind: str, payload) -> tuple[str, Candidate] | None:
        if kind == "step":
            w.step = payload
        elif kind == "log":
            log.log(*payload)
        elif kind == "phase":  # measuring, probing, checking delegates: production is over
            w.step = None
            self.progress.phase(payload)
        elif kind == "done":
            recipe = next((r for r in w.task.recipes if r.name == w.current), None) or w.task.first_open(w.done)
            cand = received(payload, recipe, w.task.out_dir)
            w.done.add(cand.name)
            w.current = None
            tag = w.task.tag
            w.task = w.task.after(cand)  # what the rest is compared with, should it have to be queued again
            return tag, cand
        elif kind == "user_error":
            from optimize.core import errors

            cls, problem, fix = payload
            raise getattr(errors, cls, OptimizeError)(problem, fix)
        elif kind == "idle":
            heavy = _converted_big(w.task)
            w.task, w.need = None, 0
            self._retire(w, heavy)
        return None

    def _busy_conns(self) -> dict:
        """The busy workers by their pipe; when none is busy, what was queued meanwhile (while the refused were
        read, say) is dispatched first."""
        if not any(w.task is not None for w in self.workers):
            self._dispatch()
        return {w.conn: w for w in self.workers if w.task is not None}

    def results(self) -> Iterator[tuple[str, Candidate]]:
        self._dispatch()
        while any(w.task is not None for w in self.workers) or self.queue or self.refused:
            while self.refused:
                yield self.refused.popleft()
            busy = self._busy_conns()
            if not busy:
                continue
            for conn in wait(list(busy)):
                w = busy[conn]
                try:
                    kind, payload = conn.recv()
                except (EOFError, OSError):
                    cand = self._crashed(w)
                else:
                    if kind == "start":
                        w.current, w.step = payload, None
                        self.progress.begin(payload)
                        continue
                    cand = self._event(w, kind, payload)
                if cand is not None:
                    yield cand
            self._dispatch()

    def time(self, tasks: list[TimingTask]) -> Iterator[tuple[str, list[Candidate]]]:
        """Time candidates after production in a worker process, one timing task at a time (alone on the machine):
        the interpreters of every candidate are built there, never in the sweep's process, and go with the
        worker when it leaves."""
        for t in tasks:
            yield t.tag, self._time_in_worker(t)

    def _time_in_worker(self, t: TimingTask) -> list[Candidate]:
        for w in [w for w in self.workers if w.task is None]:
            self._retire(w)  # timing starts on a lean worker
        idle = [w for w in self.workers if w.task is None and self._alive(w)]
        w = idle[0] if idle else self._spawn("measure")
        try:
            w.conn.send(t)
            while True:
                kind, payload = w.conn.recv()
                if kind == "log":
                    log.log(*payload)
                elif kind == "timed":
                    return [Candidate.model_validate_json(c) for c in payload]
        except (OSError, EOFError, ValueError):
            w.proc.join(timeout=5)
            why = describe_exit(w.proc.exitcode)
            self._let_go(w)
            log.warning("the worker timing the candidates %s: they keep no latency", why)
            return [c.model_copy(update={"notes": [*c.notes, f"not timed: the timing worker {why}"]}) for c in t.cands]

    def close(self) -> None:
        for w in self.workers:
            try:
                w.conn.send(None)
            except (OSError, BrokenPipeError):
                pass
        for proc in [*(w.proc for w in self.workers), *self.retired]:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
        self.workers.clear()

    def kill(self) -> None:
        """Stop every worker now (an interrupted run): their half-done work is discarded with the staging."""
        procs = [*(w.proc for w in self.workers), *self.retired]
        for proc in procs:
            if proc.is_alive():
                proc.kill()
        for proc in procs:
            proc.join(timeout=5)
        self.workers.clear()


#: The executors `executor(kind=...)` builds.
EXECUTORS = ("local", "ray")


def check(kind: str = "local", address: str | None = None) -> None:
    """Before any work: the executor can run (Ray installed; a given Ray address answers in bounded time),
    else one OptimizeError line (exit 2)."""
    if kind == "ray":
        from optimize.engine.ray_executor import _ray, check_address, is_loopback, loopback_only

        if address is None or is_loopback(address):
            loopback_only()  # before Ray is imported: it reads the switch on import
        _ray()
        check_address(address)


def executor(
    jobs: int,
    progress: Progress | None = None,
    kind: str = "local",
    address: str | None = None,
    spare=None,
    limit: Budget | None = None,
):
    """kind "local": jobs 0 in this process, otherwise that many crash-isolated worker processes, each admitted to a
    task against the memory budget `limit` (`budget.Admission`). kind "ray": a task per (model, recipe group) on a
    Ray cluster (`address`; default: a local Ray started for the run)."""
    if kind == "ray":
        from optimize.engine.ray_executor import RayExecutor

        return RayExecutor(address, progress)
    if jobs and not _spawnable():
        log.info("the main script cannot be re-imported by worker processes (stdin or -c): running in this process")
        jobs = 0
    if jobs and unguarded_main():
        log.warning(
            "optimize is called at the top level of %s, which worker processes would run again: running in "
            'this process, without crash isolation (put the call under `if __name__ == "__main__":` for workers)',
            os.path.basename(sys.modules["__main__"].__file__),
        )
        jobs = 0
    return SerialExecutor(progress) if jobs == 0 else ProcessExecutor(jobs, progress, spare, limit)


def _spawnable() -> bool:
    """Spawned workers re-import the main script by path; a script read from stdin has none and hangs them."""
    main_file = getattr(sys.modules.get("__main__"), "__file__", None)
    return main_file is None or os.path.isfile(main_file)


def unguarded_main() -> bool:
    """Whether this call comes from the main script's top level outside an `if __name__ == "__main__":`
    block. A spawned worker re-imports that script, so it would run the call again while bootstrapping,
    fail, and leave the parent waiting (issue 17): such a call runs in this process instead."""
    import ast
    import inspect

    main = sys.modules.get("__main__")
    main_file = getattr(main, "__file__", None)
    frame = inspect.currentframe()
    while frame is not None and not (
        frame.f_globals is getattr(main, "__dict__", None) and frame.f_code.co_name == "<module>"
    ):
        frame = frame.f_back
    if frame is None or main_file is None or not os.path.isfile(main_file):
        return False  # not called from a script's top level (an import, a REPL, pytest, a notebook)
    line = frame.f_lineno
    try:
        tree = ast.parse(open(main_file, "rb").read())
    except (OSError, SyntaxError, ValueError):
        return False
    for node in tree.body:
        if node.lineno <= line <= (node.end_lineno or node.lineno):
            return not _is_main_guard(node)
    return True


def _is_main_guard(node) -> bool:
    """`if __name__ == "__main__":` (either side of the comparison)."""
    import ast

    if not isinstance(node, ast.If) or not isinstance(node.test, ast.Compare) or len(node.test.comparators) != 1:
        return False
    sides = [node.test.left, node.test.comparators[0]]
    names = [s.id for s in sides if isinstance(s, ast.Name)]
    values = [s.value for s in sides if isinstance(s, ast.Constant)]
    return isinstance(node.test.ops[0], ast.Eq) and names == ["__name__"] and values == ["__main__"]

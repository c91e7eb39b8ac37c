"""Worker processes for a sweep: candidates are produced in parallel, and a crash fails only its candidate.

Recipes that share Keras steps travel together as one group (so prune -> int8 and prune -> cluster ->
int8 prune once), groups go to at most `jobs` spawned workers, and each worker keeps its own
Workspace across groups. A worker that dies (a segfault in the converter or the interpreter on a
hostile model) is reported as the failure of the candidate it was working on; the rest of its group
is re-queued on a fresh worker. Latency is not measured here: the parent times every candidate once
the parallel work is done, so concurrent conversions never distort a timing.
"""

from __future__ import annotations

import multiprocessing as mp
import signal
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from pathlib import Path

from .errors import OptimizeError
from .recipe import Recipe
from .results import Candidate, Metrics


@dataclass
class Settings:
    """What every worker needs to rebuild a Workspace (all picklable)."""

    src: object  # models.ModelSource
    data: object  # data.Dataset | None
    out_dir: Path
    threads: int
    eval_samples: int
    delegates: bool


@dataclass
class _Worker:
    proc: mp.Process
    conn: object
    group: list[Recipe] = field(default_factory=list)
    current: str | None = None
    done: set = field(default_factory=set)


def _worker_main(conn, settings: Settings, index: int) -> None:
    from .pipeline import Workspace, make_candidate

    def log(msg: str) -> None:
        conn.send(("log", msg))

    ws = Workspace(settings.src, settings.data, settings.out_dir / ".work" / f"w{index}", settings.threads, log)
    while True:
        msg = conn.recv()
        if msg is None:
            return
        recipes, ref, baseline_json, baseline_name = msg
        baseline = Metrics.model_validate_json(baseline_json) if baseline_json else None
        for recipe in recipes:
            conn.send(("start", recipe.name))
            try:
                cand = make_candidate(
                    ws,
                    recipe,
                    settings.out_dir,
                    reference=ref,
                    baseline=baseline,
                    delegates=settings.delegates,
                    timing=False,
                    eval_samples=settings.eval_samples,
                )
            except OptimizeError as e:
                conn.send(("user_error", (type(e).__name__, e.problem, e.fix)))
                return
            if recipe.name == baseline_name and cand.ok:
                ref, baseline = settings.out_dir / cand.artifact, cand.metrics
            conn.send(("done", cand.model_dump_json()))
        conn.send(("idle", None))


def _describe_exit(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def run_groups(
    settings: Settings,
    groups: list[list[Recipe]],
    jobs: int,
    baseline_name: str | None,
    reference: Path | None,
    baseline: Metrics | None,
    log: Callable[[str], None],
    on_done: Callable[[Candidate], None],
) -> None:
    """Run every group; the group holding the baseline goes first and the others wait for its result."""
    ctx = mp.get_context("spawn")
    queue = deque(sorted(groups, key=lambda g: not any(r.name == baseline_name for r in g)))
    need_baseline = baseline_name is not None and reference is None
    workers: list[_Worker] = []
    idle: list[_Worker] = []
    spawned = 0

    def spawn() -> _Worker:
        nonlocal spawned
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_worker_main, args=(child, settings, spawned), daemon=True)
        spawned += 1
        proc.start()
        child.close()
        w = _Worker(proc, parent)
        workers.append(w)
        return w

    def dispatch() -> None:
        while queue and (len(workers) - len(idle) < jobs):
            group = queue[0]
            holds_baseline = any(r.name == baseline_name for r in group)
            if need_baseline and not holds_baseline and reference is None:
                return  # wait for the baseline before comparing anything with it
            queue.popleft()
            w = idle.pop() if idle else spawn()
            w.group, w.current, w.done = group, None, set()
            base_json = baseline.model_dump_json() if baseline else None
            w.conn.send((group, reference, base_json, baseline_name))

    def crashed(w: _Worker) -> None:
        w.proc.join(timeout=5)
        why = _describe_exit(w.proc.exitcode)
        name = w.current or (w.group[0].name if w.group else "?")
        log(f"  worker {why} while working on {name}")
        failed = next((r for r in w.group if r.name == name), None)
        if failed is not None:
            on_done(
                Candidate(
                    name=failed.name,
                    steps=list(failed.steps),
                    recipe_hash=failed.hash,
                    scheme=failed.scheme,
                    backend=failed.backend,
                    error=f"worker process {why} while producing or measuring this candidate",
                )
            )
        rest = [r for r in w.group if r.name not in w.done and r.name != name]
        if rest:
            queue.appendleft(rest)
        workers.remove(w)

    try:
        dispatch()
        while any(w not in idle for w in workers):
            busy = {w.conn: w for w in workers if w not in idle}
            for conn in wait(list(busy)):
                w = busy[conn]
                try:
                    kind, payload = conn.recv()
                except (EOFError, OSError):
                    crashed(w)
                    continue
                if kind == "log":
                    log(payload)
                elif kind == "start":
                    w.current = payload
                elif kind == "done":
                    cand = Candidate.model_validate_json(payload)
                    w.done.add(cand.name)
                    w.current = None
                    if cand.name == baseline_name and cand.ok and reference is None:
                        reference = settings.out_dir / cand.artifact
                        baseline = cand.metrics
                    on_done(cand)
                elif kind == "user_error":
                    cls, problem, fix = payload
                    raise OptimizeError(problem, fix)
                elif kind == "idle":
                    idle.append(w)
            if (
                need_baseline
                and reference is None
                and not any(any(r.name == baseline_name for r in w.group) and w not in idle for w in workers)
                and not any(any(r.name == baseline_name for r in g) for g in queue)
            ):
                need_baseline = False  # the baseline failed: compare with nothing rather than wait forever
            dispatch()
    finally:
        for w in workers:
            try:
                w.conn.send(None)
            except (OSError, BrokenPipeError):
                pass
        for w in workers:
            w.proc.join(timeout=10)
            if w.proc.is_alive():
                w.proc.kill()

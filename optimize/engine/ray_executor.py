"""The Ray executor: every (model, recipe group) a Ray task, run through the same `work.run_task`.

Same interface as the local executors (`optimize.engine.executors`); only scheduling and data movement differ.
Each task is a streaming Ray task that yields its candidates as they finish (so a model's other groups
start the moment its baseline is done). What a task needs travels with it, so any node can run it: the
model's files (put in the object store once per model and unpacked once per node), the data, the
reference artifact; each artifact comes back as bytes and is written into the output folder here.

Failures, as the local pool treats them: a worker process that dies fails only the candidate it was on
(a post-mortem on its node reads what `faulthandler` wrote: SIGSEGV and the like are the technique's,
deterministic, cached; anything else, like the OOM killer's SIGKILL, is the environment's, never cached),
and the rest of its task runs again. A node that is lost is the environment's: the rest of the task is
retried elsewhere (up to `RETRIES` times), never failed for it. Ray's own retries are off: it cannot tell
a segfault from a lost node.

Each task asks Ray for the memory it is estimated to need (`budget.task_need`, as Ray's `memory` resource), so a
node runs at once only what its memory holds, as the local executor admits tasks against its budget.

Latency is timed after production, a model's candidates together in rounds on one node: each node gets one timing task at a
time holding all of its CPUs, all candidates of a model on the same node, the node recorded on each.

`address` None starts a local Ray for the run, listening on 127.0.0.1 only, its session folder in a private temp
folder, and stops it at the end (the folder removed). A given address is checked before any work (`check_address`:
something must answer there within CONNECT_TIMEOUT_S, else one line and exit 2); a loopback address keeps Ray
on loopback (Ray would otherwise rewrite 127.0.0.1 to the machine's other interface and retry for minutes), and
where a Ray token exists (~/.ray/auth_token, as `ray start --head` reads it) the client presents it, as
`ray start` does. What Ray prints on the driver (`(raylet) A worker died ...`) goes to the log on stderr,
plain and on one line, never to stdout (which --json keeps for the record).

Each run keeps its files on a node under `<temp>/optimize-ray/<run id>/` (the model unpacked, workspaces, crash
notes); the driver removes them on every node when it closes, and a node removes runs left untouched for
STALE_RUN_S (their driver was killed).
"""

from __future__ import annotations

import contextlib
import faulthandler
import io
import logging
import os
import shutil
import socket
import tarfile
import tempfile
import time
import uuid
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

from optimize.core.errors import OptimizeError
from optimize.core.results import Candidate, write_atomic
from optimize.engine.budget import task_need
from optimize.engine.work import Task, TimingTask, Workspaces, crashed, received, run_task, time_task
from optimize.present.progress import Progress

log = logging.getLogger(__name__)

RETRIES = 3  # a task whose node is lost runs again at most this many times
CONNECT_TIMEOUT_S = 5.0  # a given address must answer within this (TCP), before any work
REPLY_TIMEOUT_S = 120.0  # and a first streaming task's reply must reach the driver within this
STALE_RUN_S = 6 * 3600  # a run folder on a node untouched this long was left by a driver that was killed
LOCAL_OBJECT_STORE = 1 << 30  # bytes of object store for a local Ray started for the run
#: Ray on Linux advertises and binds the machine's address even when told 127.0.0.1; this keeps a local
#: Ray on the loopback interface (every listener on 127.0.0.1).
LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
FATAL = {  # faulthandler's words for each crash signal
    "Segmentation fault": "SIGSEGV",
    "Bus error": "SIGBUS",
    "Illegal instruction": "SIGILL",
    "Floating-point exception": "SIGFPE",
    "Aborted": "SIGABRT",
}


def is_loopback(address: str | None) -> bool:
    """Whether a Ray address names this machine's loopback (127.x.x.x, localhost, ::1)."""
    host = _host_port(address)[0] if address else ""
    return host == "localhost" or host == "::1" or host.startswith("127.")


def _host_port(address: str) -> tuple[str, int | None]:
    text = str(address).strip()
    if "://" in text:
        text = text.split("://", 1)[1]
    text = text.split("/", 1)[0]
    if text.startswith("["):  # [::1]:6379
        host, _, rest = text[1:].partition("]")
        port = rest.lstrip(":")
    else:
        host, _, port = text.rpartition(":") if text.count(":") == 1 else (text, "", "")
    try:
        return host, int(port) if port else None
    except ValueError:
        return host, None


def check_address(address: str | None, timeout: float = CONNECT_TIMEOUT_S) -> None:
    """Before any work: something answers at `address` (host:port of the head's GCS) within `timeout`, else one
    OptimizeError line (exit 2). None and "auto" (a local Ray, or the one Ray finds) need no check."""
    if address in (None, "auto", "local"):
        return
    host, port = _host_port(address)
    if not host or port is None:
        raise OptimizeError(
            f"--ray-address {address!r} is not host:port.",
            "Pass the head's address, e.g. --ray-address 127.0.0.1:6379.",
        )
    try:
        with socket.create_connection((host, port), timeout=timeout):
            pass
    except OSError as e:
        why = "no answer" if isinstance(e, TimeoutError) else (e.strerror or type(e).__name__)
        raise OptimizeError(
            f"Nothing answers at the Ray address {address} ({why}, within {timeout:g} s).",
            _START_HINT.format(port=port),
        ) from None


_START_HINT = (
    "Start the head there (on one machine: RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 ray start --head "
    "--node-ip-address 127.0.0.1 --port {port}), or omit --ray-address for a local Ray."
)


AUTH_VARS = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")


def _private_token() -> dict[str, str | None]:
    """For a local Ray started for the run: its own random token in the environment (inherited by its processes),
    unless the user set Ray's authentication up. Ray 2.60 turns token authentication on for every new local
    cluster and, with no token in the environment, writes one to ~/.ray/auth_token, where it outlives the run
    and makes the next `ray start --head` on this machine demand it. What was in the environment before."""
    global _TOKEN
    import secrets

    before = {k: os.environ.get(k) for k in AUTH_VARS}
    if not any(before.values()):
        # one token per process: Ray's client keeps the first token it read for the life of the process, so a
        # second local Ray in the same process (two zoos from one Python session) must be given the same one
        _TOKEN = _TOKEN or secrets.token_hex(32)
        os.environ["RAY_AUTH_TOKEN"] = _TOKEN
    return before


_TOKEN: str | None = None


def _restore(before: dict[str, str | None]) -> None:
    for k, v in before.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def _echo():
    yield "ok"


def _check_replies(ray, timeout: float | None = None) -> None:
    """A streaming task's reply reaches this client within `timeout`: a cluster whose workers cannot call back
    (the head and this client disagree on token authentication: each item is refused with InvalidAuthToken and
    the client would wait for ever) is one line instead of a hang."""
    timeout = timeout or float(os.environ.get("OPTIMIZE_RAY_REPLY_TIMEOUT_S") or REPLY_TIMEOUT_S)
    gen = ray.remote(_echo).options(num_returns="streaming", num_cpus=0, max_retries=0).remote()
    ready, _ = ray.wait([gen], num_returns=1, timeout=timeout)
    if not ready:
        raise OptimizeError(
            f"The Ray cluster's workers cannot answer this client within {timeout:g} s (the head and optimize "
            "disagree on token authentication, or the cluster has no worker to spare).",
            "Start the head and run optimize with the same RAY_AUTH_MODE (and token: ~/.ray/auth_token or "
            "RAY_AUTH_TOKEN), or omit --ray-address for a local Ray.",
        )


def _token_auth() -> None:
    """Present Ray's token where one exists and the mode is not set, as `ray start --head` does on this machine
    (Ray's client does not for an explicit address, and a head that found ~/.ray/auth_token refuses it)."""
    if os.environ.get("RAY_AUTH_MODE") is not None:
        return
    try:
        from ray._private.authentication.authentication_token_setup import (
            maybe_enable_token_auth_if_token_available,
        )
    except ImportError:  # another Ray: its own defaults
        return
    with _quiet_loggers():
        maybe_enable_token_auth_if_token_available(warn_if_disabled=False)


@contextlib.contextmanager
def _quiet_loggers():
    """Ray's start-up notices (token mode enabled, ...) kept below warnings for the run's duration."""
    lg = logging.getLogger("ray")
    before = lg.level
    lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        lg.setLevel(before)


_ANSI = __import__("re").compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _ray_output_to_log() -> None:
    """What Ray prints on the driver's stdout (raylet notices such as `A worker died ...`, coloured): to the log
    instead (stderr; hidden under --json), plain, one line each."""
    try:
        import ray._private.worker as worker
    except ImportError:
        return

    def to_log(data, ignore_prefix=False) -> None:
        pid = data.get("pid", "ray") if isinstance(data, dict) else "ray"
        for line in (data.get("lines") or []) if isinstance(data, dict) else []:
            text = " ".join(_ANSI.sub("", str(line)).split())
            if text:
                log.info("(%s) %s", pid, text[:300])

    worker.print_to_stdstream = to_log


def loopback_only() -> None:
    """Keep a Ray started from this process on 127.0.0.1 (read when Ray is imported, so set it first; a Ray
    imported already gets the same switch on its constants)."""
    import sys

    os.environ.update(LOOPBACK_ENV)
    constants = sys.modules.get("ray._private.ray_constants")
    if constants is not None and hasattr(constants, "ENABLE_RAY_CLUSTER"):
        constants.ENABLE_RAY_CLUSTER = False


def _ray():
    try:
        import ray
    except ImportError:
        raise OptimizeError(
            "--executor ray needs Ray.", 'Install the distributed extra: pip install -e ".[distributed]".'
        ) from None
    return ray


def _session_parent() -> Path:
    """Where a local Ray's session folder goes: the system's temp folder, or /tmp when that path is so long that
    Ray's Unix sockets inside it would pass the 107-byte limit."""
    from optimize.core import paths

    base = paths.system_tempdir()
    return base if len(str(base)) <= 24 or not Path("/tmp").is_dir() else Path("/tmp")


# ------------------------------------------------------------------------------------- on the nodes
def _node_root(run: str) -> Path:
    """This run's folder on this node (touched on every use: a run folder untouched for STALE_RUN_S is stale)."""
    root = Path(tempfile.gettempdir()) / "optimize-ray" / run
    root.mkdir(parents=True, exist_ok=True)
    os.utime(root)
    return root


def _run_temporaries(root: Path) -> None:
    """This worker's temporaries in the run's folder, for as long as it serves the run (removed with it)."""
    tmp = root / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    tempfile.tempdir = str(tmp)


def clean_node(run: str) -> int:
    """A Ray task: remove this run's folder on this node, and runs left by drivers that were killed."""
    base = Path(tempfile.gettempdir()) / "optimize-ray"
    shutil.rmtree(base / run, ignore_errors=True)
    now, n = time.time(), 0
    for old in base.glob("*") if base.is_dir() else []:
        with contextlib.suppress(OSError):
            if old.is_dir() and not old.is_symlink() and now - old.stat().st_mtime > STALE_RUN_S:
                shutil.rmtree(old, ignore_errors=True)
                n += 1
    with contextlib.suppress(OSError):
        base.rmdir()  # only when empty
    return n


def _pack(path: Path) -> bytes:
    """A model file or SavedModel folder as a tar archive (what travels to the nodes)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(path, arcname=path.name)
    return buf.getvalue()


def _unpack(src, blob: bytes, run: str):
    """The model on this node: unpacked once per node and run (by fingerprint), atomically."""
    home = _node_root(run) / "models" / src.fingerprint
    if not (home / src.path.name).exists():
        home.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=home.parent, prefix=".tmp-"))
        with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
            tar.extractall(tmp, filter="data")
        try:
            os.rename(tmp, home)
        except OSError:  # another worker was first
            shutil.rmtree(tmp, ignore_errors=True)
    return replace(src, path=home / src.path.name)


_WORKSPACES = Workspaces()


def _node_name() -> str:
    import ray

    return f"{socket.gethostname()}:{ray.get_runtime_context().get_node_id()[:8]}"


def produce_on_node(task: Task, blob: bytes, data, reference: bytes | None, run: str = "run"):
    """A Ray task: the model unpacked here, the task run by `run_task`; yields its candidates with their
    artifacts. Crashes are written by faulthandler to a file the driver's post-mortem reads. Everything it
    writes on the node is in the run's folder (`_node_root`), temporaries included."""
    import ray

    node_id = ray.get_runtime_context().get_node_id()
    root = _node_root(run)
    crash = root / f"crash-{uuid.uuid4().hex}"
    yield ("node", node_id, str(crash))
    out = Path(tempfile.mkdtemp(dir=root, prefix="out-"))
    _run_temporaries(root)
    with open(crash, "w") as f:
        faulthandler.enable(file=f)
        try:
            ref = write_atomic(out / ".reference.tflite", reference) if reference is not None else None
            task = replace(task, src=_unpack(task.src, blob, run), data=data, out_dir=out, reference=ref)
            ws = _WORKSPACES.get(task, root / f"ws-{os.getpid()}", root / "shared")  # one calibration per node
            for cand in run_task(ws, task, Progress()):
                art = (out / cand.artifact).read_bytes() if cand.artifact else None
                yield ("done", cand.model_dump_json(), art)
        except OptimizeError as e:
            yield ("user_error", (type(e).__name__, e.problem, e.fix))
        finally:
            faulthandler.enable()  # back to stderr
            shutil.rmtree(out, ignore_errors=True)
    crash.unlink(missing_ok=True)


def post_mortem(crash_file: str) -> str | None:
    """The signal a worker on this node died of, from faulthandler's file (None: no crash was written,
    so it was killed from outside: SIGKILL, the OOM killer)."""
    try:
        text = Path(crash_file).read_text(errors="replace")[:4096]
    except OSError:
        return None
    finally:
        Path(crash_file).unlink(missing_ok=True)
    return next((sig for words, sig in FATAL.items() if words in text), None)


def time_on_node(jobs: list, run: str = "run"):
    """A Ray task holding all of a node's CPUs: each model's candidates timed together, in rounds."""
    import ray

    node = _node_name()
    for t, ref in jobs:
        artifacts = ray.get(ref)
        root = _node_root(run)
        _run_temporaries(root)
        out = Path(tempfile.mkdtemp(dir=root, prefix="time-"))
        try:
            for name, data in artifacts.items():
                (out / name).write_bytes(data)
            cands = time_task(replace(t, out_dir=out), node)
        finally:
            shutil.rmtree(out, ignore_errors=True)
        yield t.tag, [c.model_dump_json() for c in cands]


# ------------------------------------------------------------------------------------- the driver
@dataclass
class _Running:
    task: Task
    tries: int = 0
    node: str | None = None
    crash_file: str | None = None
    done: set = field(default_factory=set)


class RayExecutor:
    """Tasks as Ray tasks on a cluster (`address`) or on a local Ray started for the run."""

    name = "ray"

    def __init__(self, address: str | None = None, progress: Progress | None = None):
        self.address, self.progress = address, progress or Progress()
        self.queue: deque[_Running] = deque()
        self.live: dict = {}
        self.blobs: dict[str, object] = {}
        self.datas: dict[str, object] = {}
        self.ray = None
        self.owned = False
        self.run = uuid.uuid4().hex[:12]  # this driver's folder on every node
        self.session: Path | None = None  # a local Ray's own session folder, removed at the end
        self.auth: dict | None = None  # Ray's authentication variables before a local Ray's private token
        self.memory_cap: int | None = None  # the largest live node's `memory` resource (bytes), read once

    # -- connection
    def _connect(self):
        if self.ray is not None:
            return self.ray
        if self.address is None or is_loopback(self.address):
            loopback_only()  # before Ray is imported
        ray = _ray()
        if not ray.is_initialized():
            quiet = {"log_to_driver": False, "configure_logging": False, "logging_level": logging.WARNING}
            if self.address is None:
                from optimize.core import paths

                self.session = paths.locked_folder(_session_parent(), "optimize-ray-")
                self.auth = _private_token()
                with _quiet_loggers():
                    ray.init(
                        address="local",
                        _node_ip_address="127.0.0.1",
                        _temp_dir=str(self.session),
                        include_dashboard=False,
                        object_store_memory=LOCAL_OBJECT_STORE,
                        **quiet,
                    )
            else:
                check_address(self.address)
                _token_auth()
                try:
                    ray.init(address=self.address, **quiet)
                except Exception as e:  # noqa: BLE001 - Ray's many ways of not connecting: one line
                    raise OptimizeError(
                        f"Cannot connect to the Ray cluster at {self.address}: {' '.join(str(e).split())[:200]}",
                        _START_HINT.format(port=_host_port(self.address)[1] or 6379)
                        + " A head with token authentication needs its token here (~/.ray/auth_token).",
                    ) from None
                try:
                    _check_replies(ray)
                except OptimizeError:
                    ray.shutdown()
                    raise
            self.owned = True
            _ray_output_to_log()
        self.ray = ray
        self._produce = ray.remote(produce_on_node)  # options per task: its memory (`_memory`)
        self._post_mortem = ray.remote(post_mortem)
        self._time = ray.remote(time_on_node)
        self._clean = ray.remote(clean_node)
        return ray

    def submit(self, task: Task) -> None:
        self.queue.append(_Running(task))

    def _launch(self, r: _Running) -> None:
        ray, t = self._connect(), r.task
        if t.src.fingerprint not in self.blobs:
            self.blobs[t.src.fingerprint] = ray.put(_pack(t.src.path))
        fp = t.data.fingerprint if t.data is not None else None
        if fp not in self.datas:
            self.datas[fp] = ray.put(t.data)
        ref = ray.put(t.reference.read_bytes()) if t.reference is not None else None
        produce = self._produce.options(num_returns="streaming", max_retries=0, num_cpus=1, **self._memory(t))
        gen = produce.remote(replace(t, data=None), self.blobs[t.src.fingerprint], self.datas[fp], ref, self.run)
        r.node, r.crash_file, r.done = None, None, set()
        self.live[gen] = r

    def _memory(self, t: Task) -> dict:
        """The task's memory estimate as Ray's `memory` resource (`budget.task_need`): a node runs only the tasks its
        memory holds at once, as the local executor admits them against its budget. Capped at the largest node's
        memory (a task no node could hold would wait forever; it runs alone on the largest instead)."""
        if self.memory_cap is None:
            try:
                self.memory_cap = max(int(n["Resources"].get("memory", 0)) for n in self.ray.nodes() if n["Alive"])
            except Exception:  # noqa: BLE001 - no figure from Ray: tasks are scheduled by CPUs alone
                self.memory_cap = 0
        need = task_need(t)
        return {"memory": min(need, self.memory_cap)} if need and self.memory_cap else {}

    # -- results
    def results(self) -> Iterator[tuple[str, Candidate]]:
        while self.queue or self.live:
            while self.queue:
                self._launch(self.queue.popleft())
            ray = self.ray
            (gen,), _ = ray.wait(list(self.live), num_returns=1)
            r = self.live[gen]
            try:
                event = ray.get(next(gen))
            except StopIteration:
                del self.live[gen]
                continue
            except Exception as e:  # noqa: BLE001 - Ray's failures, sorted below
                del self.live[gen]
                out = self._failed(r, e)
                if out is not None:
                    yield out
                continue
            out = self._event(r, event)
            if out is not None:
                yield out

    def _event(self, r: _Running, event) -> tuple[str, Candidate] | None:
        kind = event[0]
        if kind == "node":
            r.node, r.crash_file = event[1], event[2]
            self.progress.begin(r.task.first_open(r.done).name)
            return None
        if kind == "user_error":
            from optimize.core import errors

            cls, problem, fix = event[1]
            raise getattr(errors, cls, OptimizeError)(problem, fix)
        cand = received(event[1], r.task.first_open(r.done), r.task.out_dir)
        if event[2] is not None and cand.ok:
            write_atomic(r.task.out_dir / cand.artifact, event[2])
        r.done.add(cand.name)
        tag = r.task.tag
        r.task = r.task.after(cand)  # the rest is compared with it, should it have to run again
        if len(r.done) < len(r.task.recipes):
            self.progress.begin(r.task.first_open(r.done).name)
        return tag, cand

    def _failed(self, r: _Running, e: Exception) -> tuple[str, Candidate] | None:
        """A task that ended early: a crash fails its candidate, a lost node runs the rest again."""
        ray = self.ray
        recipe = r.task.first_open(r.done)
        if isinstance(e, ray.exceptions.RayTaskError):  # not a technique's failure (those are candidates): ours
            cause = getattr(e, "cause", None) or e
            if isinstance(cause, OptimizeError):
                raise cause
            self._requeue(r.task.rest(r.done, skip=recipe.name))
            return r.task.tag, Candidate.failed(recipe, cause)
        if isinstance(e, ray.exceptions.WorkerCrashedError | ray.exceptions.OutOfMemoryError):
            why = self._why(r, e)
            if why is not None:
                log.warning("Ray worker %s while working on %s", why, recipe.name)
                self._requeue(r.task.rest(r.done, skip=recipe.name))
                return r.task.tag, crashed(recipe, why)
        rest = r.task.rest(r.done)
        if rest is None:
            return None
        if r.tries + 1 > RETRIES:
            log.warning("Ray node lost %d times while working on %s; giving up", r.tries + 1, recipe.name)
            return r.task.tag, Candidate.failed(
                recipe,
                f"the Ray node was lost {r.tries + 1} times while producing this candidate",
                kind="NodeLost",
                detail=str(e).splitlines()[0][:300],
            )
        log.warning("Ray node lost while working on %s (%s); running it again", recipe.name, type(e).__name__)
        self._requeue(rest, r.tries + 1)
        return None

    def _requeue(self, task: Task | None, tries: int = 0) -> None:
        if task is not None:
            self.queue.appendleft(_Running(task, tries=tries))

    def _why(self, r: _Running, e: Exception) -> str | None:
        """How the worker died ("killed by SIGSEGV"), or None when its node is gone (a lost node)."""
        ray = self.ray
        if isinstance(e, ray.exceptions.OutOfMemoryError):
            return "killed by Ray's memory monitor (out of memory)"
        if r.node is None or not any(n["NodeID"] == r.node and n["Alive"] for n in ray.nodes()):
            return None
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        strategy = NodeAffinitySchedulingStrategy(r.node, soft=False)
        try:
            sig = ray.get(
                self._post_mortem.options(num_cpus=0, max_retries=0, scheduling_strategy=strategy).remote(r.crash_file),
                timeout=60,
            )
        except Exception:  # noqa: BLE001 - the node went away meanwhile
            return None
        return f"killed by {sig}" if sig else "killed by SIGKILL (out of memory?)"

    # -- timing
    def time(self, tasks: list[TimingTask]) -> Iterator[tuple[str, list[Candidate]]]:
        """Each model's candidates on one node, timed together in rounds; one timing task per node at a time."""
        todo = [t for t in tasks if any(c.ok for c in t.cands)]
        for t in tasks:
            if t not in todo:
                yield t.tag, list(t.cands)
        tries = 0
        while todo:
            ray = self._connect()
            nodes = [n for n in ray.nodes() if n["Alive"] and n["Resources"].get("CPU", 0) >= 1]
            if not nodes:
                raise OptimizeError(
                    "The Ray cluster has no node with a CPU left.", "Add a node, or use --executor local."
                )
            done = yield from self._time_round(todo, nodes)
            todo = [t for t in todo if t.tag not in done]
            tries += 1
            if todo and tries > RETRIES:
                raise OptimizeError("Ray nodes kept being lost while timing.", "Check the cluster, then run again.")

    def _time_round(self, todo: list[TimingTask], nodes: list[dict]):
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        ray = self.ray
        load = {n["NodeID"]: [] for n in nodes}
        for t in sorted(todo, key=lambda t: -sum(c.ok for c in t.cands)):  # longest first, to the least loaded
            least = min(load, key=lambda k: sum(sum(c.ok for c in x.cands) for x in load[k]))
            load[least].append(t)
        cpus = {n["NodeID"]: int(n["Resources"]["CPU"]) for n in nodes}
        gens = []
        for node, ts in load.items():
            if ts:
                jobs = [(replace(t, cands=t.cands), ray.put(_artifacts(t))) for t in ts]
                strategy = NodeAffinitySchedulingStrategy(node, soft=True)
                opts = {"num_returns": "streaming", "max_retries": 0, "num_cpus": cpus[node]}
                gens.append(self._time.options(scheduling_strategy=strategy, **opts).remote(jobs, self.run))
        done = set()
        for gen in gens:
            try:
                for ref in gen:
                    tag, cands = ray.get(ref)
                    done.add(tag)
                    yield tag, [Candidate.model_validate_json(c) for c in cands]
            except Exception as e:  # noqa: BLE001 - a lost node: its models are timed again elsewhere
                log.warning("Ray node lost while timing (%s); timing its models again", type(e).__name__)
        return done

    def close(self) -> None:
        if self.ray is not None:
            self._clean_nodes()
        if self.ray is not None and self.owned:
            self.ray.shutdown()
        self.ray = None
        if self.session is not None:  # the local Ray's session folder (logs, sockets): ours, gone with it
            from optimize.core import paths

            paths.discard(self.session)
            self.session = None
        if self.auth is not None:
            _restore(self.auth)
            self.auth = None

    def _clean_nodes(self, timeout: float = 30.0) -> None:
        """This run's folder removed on every live node (best effort, bounded: a node that does not answer keeps
        it until a later run finds it stale)."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        ray = self.ray
        try:
            refs = [
                self._clean.options(
                    num_cpus=0,
                    max_retries=0,
                    scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False),
                ).remote(self.run)
                for n in ray.nodes()
                if n["Alive"]
            ]
            ray.wait(refs, num_returns=len(refs), timeout=timeout)
        except Exception as e:  # noqa: BLE001 - a cluster going away: its nodes' temp folders go with it
            log.info("could not clean the Ray nodes' run folders (%s)", type(e).__name__)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _artifacts(t: TimingTask) -> dict[str, bytes]:
    return {c.artifact: (t.out_dir / c.artifact).read_bytes() for c in t.cands if c.ok and c.artifact}

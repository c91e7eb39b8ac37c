"""A prompt stop: SIGTERM or Ctrl-C ends the whole process tree within seconds, whatever the process is doing.

Python runs a signal's handler only between two bytecodes of the main thread. While the main thread is inside one
long native call (a Keras load, a TensorFlow conversion, an int16x8 invoke on reference kernels) the handler waits
for it to return: minutes on a big model. And once the handler has run and the run is cleaned up, the interpreter's
own teardown of TensorFlow and of a big model's objects took more than a minute (issue 44: "terminated" was printed
at once, the process ended ~75 s later; container runtimes send SIGKILL after 10 s).

So the command line `install`s this once: the C-level handler Python sets for a signal also writes the signal's
number into a pipe (`signal.set_wakeup_fd`), and a watcher thread blocked on that pipe wakes at once, whatever the
main thread is doing. The main thread still stops the run itself (its handler raises, the executor kills its
workers, the staging folder is removed) and then `leave`s: what is left of the process tree is killed and the
process exits without the interpreter's teardown. When the main thread has not left within `GRACE_S` of the
signal, the watcher does all of it in its place: every descendant process killed, every clean-up registered with
`on_stop` run (the staging folders: nothing half-written is left in the output folder), the last line said,
and the process ended.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator

#: Seconds the main thread has, from the signal, to stop the run itself before the watcher stops it.
GRACE_S = 3.0
#: Exit codes a stop ends with (128 + the signal's number), and the last line said for each.
CODES = {signal.SIGTERM: 143, signal.SIGINT: 130}

_lock = threading.Lock()
_cleanups: list[Callable[[], None]] = []
_state: dict = {"installed": False, "left": False, "say": None}


def install(say: Callable[[str], None] | None = None) -> bool:
    """Watch for SIGTERM and SIGINT from now on (the main thread only, once per process). `say` prints the last
    line when the watcher has to stop the process itself ("terminated", "interrupted"). False where a wakeup
    pipe cannot be set (not the main thread): the handlers alone then stop the run, as before."""
    if _state["installed"]:
        return True
    r, w = os.pipe()
    os.set_blocking(w, False)
    try:
        signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    except ValueError:  # not the main thread
        os.close(r)
        os.close(w)
        return False
    _state.update(installed=True, say=say)
    threading.Thread(target=_watch, args=(r,), daemon=True, name="optimize-stop").start()
    return True


@contextlib.contextmanager
def on_stop(cleanup: Callable[[], None]) -> Iterator[None]:
    """Run `cleanup` if the watcher has to stop the process while this block runs (the block's own `finally` does
    the same work when the main thread stops the run itself: both must be safe to run twice)."""
    register(cleanup)
    try:
        yield
    finally:
        unregister(cleanup)


def register(cleanup: Callable[[], None]) -> None:
    """`on_stop` for what does not live in one block (a process's temporary folder): until `unregister`."""
    with _lock:
        _cleanups.append(cleanup)


def unregister(cleanup: Callable[[], None]) -> None:
    with _lock:
        with contextlib.suppress(ValueError):
            _cleanups.remove(cleanup)


def leave(code: int) -> None:
    """End a stopped run now: descendants killed, output flushed, and out through os._exit (no teardown of
    TensorFlow and a big model's objects, which took over a minute)."""
    with _lock:
        _state["left"] = True
        _end(code)


def kill_tree(timeout: float = 2.0) -> int:
    """SIGKILL every live descendant of this process (workers, their forks, probes, a local Ray), the whole tree
    taken before the first is killed (an orphan would leave the tree); how many were killed."""
    import psutil

    try:
        procs = psutil.Process().children(recursive=True)
    except psutil.Error:
        return 0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(procs, timeout=timeout)
    return len(procs)


def _end(code: int) -> None:
    kill_tree()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def _watch(fd: int) -> None:
    """The watcher: wakes at each signal's byte; gives the main thread GRACE_S after a stop signal, then stops the
    process itself."""
    while True:
        try:
            data = os.read(fd, 64)
        except InterruptedError:
            continue
        except OSError:
            return
        stops = [signal.Signals(b) for b in data if b in CODES]
        if stops:
            timer = threading.Timer(GRACE_S, _force, args=(stops[0],))
            timer.daemon = True  # a process that ends by itself meanwhile is not held up by it
            timer.start()


def _force(sig: signal.Signals) -> None:
    """The main thread did not leave in time: kill the tree, run the clean-ups, say the last line, exit."""
    with _lock:
        if _state["left"]:
            return
        kill_tree()
        for cleanup in reversed(_cleanups):
            with contextlib.suppress(Exception):
                cleanup()
        say = _state["say"]
        if say is not None:
            with contextlib.suppress(Exception):
                say("terminated" if sig == signal.SIGTERM else "interrupted")
        _end(CODES[sig])

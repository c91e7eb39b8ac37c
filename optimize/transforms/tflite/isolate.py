"""Run a native quantizer call in a forked child, so a crash in it is a failed attempt, not a dead process.

LiteRT Quantizer and the TFLite calibrator are C++ underneath; on some models they crash the process
outright (a SIGSEGV quantizing NaN activation ranges, an XNNPACK abort while allocating at a shape the
model does not run at). Run in this process, such a crash ends the worker (a sweep), or the caller
(`jobs=0`, `debug`). Run here, it is a `QuantizerCrashed` naming the signal, and the caller tries the
other backend. The child is a fork: nothing is imported again, its memory is the parent's copy-on-write,
and its result (bytes, ranges) comes back pickled through a pipe. Where fork does not exist (Windows),
the call runs in this process.
"""

from __future__ import annotations

import os
import pickle
import signal
import warnings
from collections.abc import Callable

from optimize.core import crash
from optimize.core.errors import TechniqueFailed


class QuantizerCrashed(TechniqueFailed):
    """A native quantizer call died with a signal (or exited without a result)."""


def _crash_words(status: int) -> str:
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            return f"crashed ({signal.Signals(sig).name})"
        except ValueError:
            return f"crashed (signal {sig})"
    return f"exited with code {os.WEXITSTATUS(status)} without a result"


def _die_with_parent() -> None:
    """The child never outlives this process (Linux: PR_SET_PDEATHSIG), nor takes Ctrl-C for itself."""
    import faulthandler

    faulthandler.disable()  # a crash is reported by the parent, in one line: no traceback dump from here
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def _child(fn: Callable, args: tuple, w: int) -> None:
    """The child's whole life: call, pickle the outcome into the pipe, leave without any cleanup (the
    parent's atexit handlers, buffers and temporary folders are the parent's)."""
    try:
        try:
            payload = pickle.dumps(("ok", fn(*args)), protocol=pickle.HIGHEST_PROTOCOL)
        except BaseException as e:  # noqa: BLE001 - every failure goes back to the parent as a value
            payload = pickle.dumps(("error", _portable(e)), protocol=pickle.HIGHEST_PROTOCOL)
        view = memoryview(payload)
        while view:
            view = view[os.write(w, view) :]
    finally:
        os._exit(0)


def _portable(e: BaseException) -> tuple:
    """An exception as (module, class, args, detail), which always pickles; rebuilt by `_rebuild`."""
    detail = getattr(e, "detail", None)
    args = (e.problem, e.fix) if hasattr(e, "problem") else tuple(str(a) for a in e.args)
    return type(e).__module__, type(e).__name__, args, detail


def _rebuild(module: str, name: str, args: tuple, detail) -> BaseException:
    import importlib

    try:
        cls = getattr(importlib.import_module(module), name)
        e = cls(*args)
    except Exception:  # noqa: BLE001 - a class we cannot rebuild is told as a technique failure
        e = TechniqueFailed(f"{name}: {args[0] if args else ''}")
    if detail is not None and isinstance(e, TechniqueFailed):
        e.detail = detail
    return e


def isolated(fn: Callable, *args, what: str):
    """`fn(*args)` in a forked child; its return value, its exception re-raised here, or QuantizerCrashed
    ("`what` crashed (SIGSEGV)") when the child dies. `OPTIMIZE_NO_FORK=1` runs it in this process (a crash
    is then the command's, told by its supervisor as `what`: optimize.core.crash)."""
    with crash.doing(what):
        if not hasattr(os, "fork") or os.environ.get("OPTIMIZE_NO_FORK") == "1":
            return fn(*args)
        return _forked(fn, args, what)


def _forked(fn: Callable, args: tuple, what: str):
    r, w = os.pipe()
    with warnings.catch_warnings():
        # JAX (imported by litert-torch for a PyTorch/ONNX model) warns at every fork that a child using JAX
        # may deadlock; this child runs only the TFLite quantizer or calibrator, never JAX.
        warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called", category=RuntimeWarning)
        pid = os.fork()
    if pid == 0:  # pragma: no cover - the child never returns
        os.close(r)
        _die_with_parent()
        _child(fn, args, w)
    os.close(w)
    chunks = []
    try:
        while True:
            chunk = os.read(r, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
    except BaseException:  # Ctrl-C, SIGTERM: the child goes with the call
        os.kill(pid, signal.SIGKILL)
        raise
    finally:
        os.close(r)
        _, status = os.waitpid(pid, 0)
    data = b"".join(chunks)
    if not data:
        raise QuantizerCrashed(f"{what} {_crash_words(status)}")
    kind, value = pickle.loads(data)
    if kind == "error":
        raise _rebuild(*value)
    return value

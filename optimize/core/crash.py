"""A crash in native code (LiteRT, a converter, a quantizer) told in one line, never a silent exit 139.

The command line runs every command in a forked child of a small supervising parent (`supervised`): the parent
has imported only the command line's own modules, waits for the child, hands on the signals sent to it, and
when the child dies of a signal that is not one it handed on, says `error: <step> crashed (SIGSEGV) on <file>.`
and exits 2. What the child was doing is kept in one page of memory both share: the steps that call native
code (building an interpreter, running it, the TFLite converter, a quantizer) say what they do and on which
file (`doing`, `now`); a few hundred bytes written, a microsecond. Without fork (Windows), with
`OPTIMIZE_NO_FORK=1` or from the library (no supervisor), they write into a private buffer instead.

The child runs in a process group of its own, so that a signal reaches it once: the terminal's Ctrl-C
(Ctrl-Z, Ctrl-\\) reaches the parent's group and the parent hands it to the child's whole group (its workers
included), as the terminal did before; a signal sent to the parent by a process (`kill`, `timeout`, a test)
is handed to the child alone. The child dies with the parent (PR_SET_PDEATHSIG), as workers do. Its temporaries
(and those of every process it starts) go in a folder the parent makes and removes once the child has ended, so a
crash or a SIGKILL leaves no temporary folder behind.
"""

from __future__ import annotations

import mmap
import os
import signal
import sys
from collections.abc import Callable

PAGE = 4096
SLOT = PAGE // 2  # the page: the step at 0, the command's file (`subject`) at SLOT
_LENGTH = 4  # a slot: a little-endian length, then "step\0verb\0file" (or the file) in UTF-8
_page: mmap.mmap | bytearray = bytearray(PAGE)

#: Signals the parent hands on (to the child's group when the terminal sent them, else to the child).
FORWARDED = frozenset(
    getattr(signal, name)
    for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2")
    if hasattr(signal, name)
)  # (those this platform has: `supervised` runs only where fork does)
_SI_KERNEL = 0x80  # siginfo's si_code for a signal the kernel (a terminal's line discipline) sent


def _text(file) -> str:
    if file is None or isinstance(file, bytes | bytearray | memoryview):
        return ""
    return os.fspath(file) if isinstance(file, str | os.PathLike) else str(file)


def crumb(step: str, file=None, verb: str = "on") -> bytes:
    """A step (who runs: "the LiteRT interpreter"), what it does to the file (`verb`: "loading") and the file,
    as the page holds them (encoded once, written often: `mark`)."""
    return _slot(f"{step}\0{verb}\0{_text(file)}")


def _slot(text: str) -> bytes:
    data = text.encode("utf-8", "backslashreplace")[: SLOT - _LENGTH]
    return len(data).to_bytes(_LENGTH, "little") + data


def _read(at: int) -> str:
    n = min(int.from_bytes(_page[at : at + _LENGTH], "little"), SLOT - _LENGTH)
    return bytes(_page[at + _LENGTH : at + _LENGTH + n]).decode("utf-8", "replace")


def now(step: str | bytes, file=None) -> bytes:
    """Say what native code runs from here on (until another step says otherwise); returns what the page
    held before, for `restore`."""
    n = min(int.from_bytes(_page[:_LENGTH], "little"), SLOT - _LENGTH)
    before = bytes(_page[: _LENGTH + n])
    mark(step if isinstance(step, bytes) else crumb(step, file))
    return before


def mark(data: bytes) -> None:
    """`now` for a step encoded once (`crumb`), on a hot path (every invoke): nothing read back."""
    _page[_LENGTH : len(data)] = data[_LENGTH:]
    _page[:_LENGTH] = data[:_LENGTH]  # the length last: a crash mid-write garbles a step at worst, never more


def restore(before: bytes) -> None:
    now(before or crumb(""))


class doing:  # noqa: N801 - used as a context manager, like contextlib's
    """`with doing("the TFLite converter", path, "converting"):` the step, for the length of the block (`file`
    None: the command's, `subject`)."""

    __slots__ = ("data", "before")

    def __init__(self, step: str, file=None, verb: str = "on"):
        self.data = crumb(step, file or _read(SLOT), verb)

    def __enter__(self):
        self.before = now(self.data)
        return self

    def __exit__(self, *exc) -> None:
        restore(self.before)


def subject(file) -> None:
    """The file the command works on (the model it was given): named when a crash's step names none."""
    data = _slot(_text(file))
    _page[SLOT : SLOT + len(data)] = data


def current() -> tuple[str, str, str]:
    """(step, verb, file) the page holds (the file: the step's, else the command's)."""
    step, verb, file = [*_read(0).split("\0"), "", ""][:3]
    return step, verb or "on", file or _read(SLOT)


# ------------------------------------------------------------------------------------------ the supervisor


def _signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def crash_line(sig: int, command: str) -> str:
    """The one line a crash of the child is told in (without `error: `)."""
    step, verb, file = current()
    what = step or f"optimize {command}".strip()
    on = f" {verb} {file}" if file else ""
    name = _signal_name(sig)
    if sig == signal.SIGKILL:
        return f"{what} was killed ({name}){on}: out of memory, or killed by hand. Free memory, or use fewer --jobs."
    return (
        f"{what} crashed ({name}){on}. The file may be corrupt or hand-edited, or it meets a bug in that library: "
        "re-export the model, or report the crash with the file."
    )


def _die_with_parent() -> None:
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _child(mask) -> None:
    """The child: its own process group, the parent's signal mask back, background terminal I/O never stops it."""
    try:
        os.setpgid(0, 0)
    except OSError:  # the parent made it already, or may not: either way the command runs
        pass
    _die_with_parent()
    for sig in (signal.SIGTTOU, signal.SIGTTIN):
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def _hand_on(info, pid: int) -> None:
    """A signal that reached the parent goes on to the child: to its group when the terminal sent it."""
    sig = info.si_signo
    try:
        if sig == signal.SIGTSTP:  # Ctrl-Z: the child's group stops, then this process
            os.killpg(pid, sig)
            os.kill(os.getpid(), signal.SIGSTOP)
        elif sig == signal.SIGCONT:
            os.killpg(pid, sig)
        elif info.si_code == _SI_KERNEL:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _next_signal(waited: set) -> object:
    """The next signal in `waited` and who sent it (si_code); macOS has no sigwaitinfo: every signal then counts
    as sent by a process (handed to the child alone)."""
    if hasattr(signal, "sigwaitinfo"):
        return signal.sigwaitinfo(waited)
    from types import SimpleNamespace

    return SimpleNamespace(si_signo=signal.sigwait(waited), si_code=0)


def _wait(pid: int) -> int:
    """Wait for the child, handing on every signal meanwhile; its wait status."""
    waited = {*FORWARDED, signal.SIGCHLD, signal.SIGTSTP, signal.SIGCONT}
    while True:
        info = _next_signal(waited)
        if info.si_signo != signal.SIGCHLD:
            _hand_on(info, pid)
            continue
        done, status = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return status


def _end(status: int, command: str, say: Callable[[str], None]) -> None:
    """Leave as the child left: its exit code; its signal when it was one handed on; else one line, exit 2."""
    if os.WIFEXITED(status):
        os._exit(os.WEXITSTATUS(status))
    sig = os.WTERMSIG(status)
    if sig in FORWARDED:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {sig})
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)
    try:
        say(f"error: {crash_line(sig, command)}")
    finally:
        os._exit(2)


def supervised(say: Callable[[str], None], command: str = "") -> None:
    """Fork: the child returns from here and runs the command; this process waits and leaves as the child did,
    telling a crash in one line with `say` (never returns). In this process already (no fork, OPTIMIZE_NO_FORK=1,
    or a child of a supervisor): returns at once."""
    global _page
    if not hasattr(os, "fork") or os.environ.get("OPTIMIZE_NO_FORK") == "1" or isinstance(_page, mmap.mmap):
        return
    _page = mmap.mmap(-1, PAGE)  # shared with the child (MAP_SHARED | MAP_ANONYMOUS)
    scratch = _scratch()
    sys.stdout.flush()
    sys.stderr.flush()
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {*FORWARDED, signal.SIGCHLD, signal.SIGTSTP, signal.SIGCONT})
    pid = os.fork()
    if pid == 0:
        if scratch is not None:
            _temporaries_in(scratch)
        _child(mask)
        return
    try:
        os.setpgid(pid, pid)  # as the child does: whichever runs first, the group exists before a signal is handed on
    except OSError:
        pass
    status = _wait(pid)
    if scratch is not None:  # whatever the child and its processes left there, however they ended
        import shutil

        shutil.rmtree(scratch, ignore_errors=True)
    _end(status, command, say)


def _scratch() -> str | None:
    """A folder of the command's own in the temp folder, for every temporary its child and their processes make
    (a temporary folder a native crash or SIGKILL left behind goes with it: the supervisor removes it when the
    child has ended); None where none can be made (the command then uses the temp folder as it is). Its name is
    short (Unix sockets, a local Ray's, live below it) and names the supervisor's process: one whose supervisor
    was itself killed (SIGKILL) is removed by the next command (`_clear_stale`)."""
    import tempfile

    try:
        _clear_stale(tempfile.gettempdir())
        return tempfile.mkdtemp(prefix=f"o-{os.getpid()}-")
    except OSError:
        return None


def _clear_stale(folder: str) -> None:
    """Remove the scratch folders (`o-PID-*`) this user's supervisors left in `folder` when they were killed: those
    whose process is gone."""
    import re
    import shutil

    with os.scandir(folder) as entries:
        for e in entries:
            m = re.fullmatch(r"o-(\d+)-\w+", e.name)
            if m is None or not e.is_dir(follow_symlinks=False) or e.stat(follow_symlinks=False).st_uid != os.getuid():
                continue
            try:
                os.kill(int(m.group(1)), 0)
            except ProcessLookupError:  # its supervisor is gone: nothing uses it
                shutil.rmtree(e.path, ignore_errors=True)
            except OSError:  # alive (another user's process of that number, say): left alone
                pass


def _temporaries_in(folder: str) -> None:
    """The child's temporaries (tempfile's, and $TMPDIR for the processes it starts) in `folder`."""
    import tempfile

    os.environ["TMPDIR"] = tempfile.tempdir = folder


def command_of(argv: list[str]) -> str:
    """The command's name in an argument list (`sweep`): its first word that is not an option."""
    return next((a for a in argv if not a.startswith("-")), "")[:40]

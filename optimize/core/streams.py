"""Standard streams a caller closed (`optimize ... >&-`), reclaimed before anything else is imported.

With descriptor 1 closed, Python starts with `sys.stdout` None (a traceback on the first print), and the
next file anything opens gets descriptor 1: what is then written to stdout (by optimize, or by a library's
C code) lands in that file, and a write to a file opened read-only fails with EBADF. The CLI calls
`reclaim()` first thing, before Typer, Rich or TensorFlow open anything: /dev/null takes each closed
descriptor, so output to a closed stdout is discarded as with `> /dev/null`; the exit code still says how
the run went. Standard library only.
"""

from __future__ import annotations

import os
import sys

STREAMS = ((0, "stdin", "r"), (1, "stdout", "w"), (2, "stderr", "w"))


def _usable(fd: int, mode: str) -> bool:
    """Open, and open for what the stream does: a descriptor 1 or 2 open read-only (a launcher's script left
    on it when the caller had closed it: pyenv's shims do) is not an output."""
    import fcntl

    try:
        access = fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE
    except OSError:
        return False
    return access != os.O_RDONLY if mode == "w" else access != os.O_WRONLY


def reclaim() -> list[str]:
    """/dev/null on every closed (or unusable) standard descriptor, and a Python stream for it; the names
    reclaimed."""
    done = []
    for fd, name, mode in STREAMS:
        usable = _usable(fd, mode)
        if usable and getattr(sys, name) is not None:
            continue
        if not usable:
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
        setattr(sys, name, open(fd, mode, closefd=False, encoding="utf-8", errors="backslashreplace"))
        done.append(name)
    return done

"""Progress of a long conversion on screen: a graph of PROGRESS_NODES nodes or more takes minutes in
torch.export and litert-torch, so each step is said when it starts and when it ends, with its seconds.

The conversion runs silenced (`torch_export.quiet`: logging disabled, fd 2 captured, because torch and
litert-torch talk); `say` reaches the terminal all the same, through the stderr the capture saved
(`models.runtime.outer_stderr`), by the "optimize" logger the CLI shows (so `--quiet` and the live display
apply as to any other line). A small graph says nothing.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from contextvars import ContextVar

from optimize.convert.limits import PROGRESS_NODES

log = logging.getLogger(__name__)
_CURRENT: ContextVar[tuple[str, int] | None] = ContextVar("optimize_conversion", default=None)


@contextlib.contextmanager
def _on_screen():
    """Logging enabled and fd 2 the terminal's again for one line, inside a silenced block."""
    from optimize.models.runtime import outer_stderr

    disabled = logging.root.manager.disable
    logging.disable(logging.NOTSET)
    fd, inner = outer_stderr(), None
    try:
        if fd is not None:
            sys.stderr.flush()
            inner = os.dup(2)
            os.dup2(fd, 2)
        yield
    finally:
        if inner is not None:
            with contextlib.suppress(OSError, ValueError):
                sys.__stderr__.flush()
            os.dup2(inner, 2)
            os.close(inner)
        logging.disable(disabled)


def say(text: str) -> None:
    """One progress line on screen, even from inside the conversion's silenced block."""
    with _on_screen():
        log.info("%s", text)


def begin(name: str, nodes: int, what: str) -> None:
    """The conversion of `name` (a graph of `nodes` nodes) starts: said when it is big enough to take time."""
    _CURRENT.set((name, nodes))
    if nodes >= PROGRESS_NODES:
        say(f"{name}: {what} of {nodes:,} nodes; converting a graph this size takes minutes")


@contextlib.contextmanager
def step(what: str):
    """One step of the conversion begun, said with its seconds when the graph is big."""
    current = _CURRENT.get()
    big = current is not None and current[1] >= PROGRESS_NODES
    t0 = time.perf_counter()
    if big:
        say(f"{current[0]}: {what} ...")
    yield
    if big:
        say(f"{current[0]}: {what} done in {time.perf_counter() - t0:.0f} s")

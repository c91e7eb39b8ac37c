"""Progress of a long run, and where messages go.

Library code logs with `logging` (loggers under "optimize") and reports progress through a `Progress`:
`start(total)`, `phase(text)` (what is happening now), `advance(name, ok)` (one candidate finished),
`close()`. The base class does nothing but log phases at INFO, so a library caller gets plain logging
unless it passes its own; the CLI shows a live rich display on a terminal and plain lines otherwise.
Worker processes forward both to the parent (optimize.engine.executors).
"""

from __future__ import annotations

import logging

log = logging.getLogger("optimize")


class Progress:
    """Receives a run's progress. Subclass and override what you need."""

    def start(self, total: int, what: str = "candidates") -> None:
        log.info("%d %s to produce", total, what)

    def phase(self, text: str) -> None:
        log.info(text)

    def begin(self, name: str) -> None:
        """One candidate starts."""
        self.phase(f"{name}: producing")

    def advance(self, name: str, ok: bool) -> None:
        log.info("%s: %s", name, "done" if ok else "failed")

    def close(self) -> None:
        pass


class RichProgress(Progress):
    """A live display on stderr: candidates done / total, the current phase, elapsed time and ETA.
    Log records are printed above it (a rich logging handler on the same console)."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.logging import RichHandler
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            SpinnerColumn,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )
        from rich.progress import (
            Progress as Bar,
        )

        self.console = Console(stderr=True)
        self.bar = Bar(
            SpinnerColumn(),
            TextColumn("{task.description}", style="bold"),
            BarColumn(bar_width=20),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            TextColumn("{task.fields[phase]}", style="dim"),
            console=self.console,
            transient=True,
        )
        self.task = None
        self.handler = RichHandler(console=self.console, show_time=False, show_path=False, show_level=False)
        self.handler.setLevel(logging.INFO)

    def start(self, total: int, what: str = "candidates") -> None:
        if self.task is None:
            self.bar.start()
            self.task = self.bar.add_task(what, total=total, phase="")
        else:
            self.bar.update(self.task, total=total)

    def phase(self, text: str) -> None:
        if self.task is not None:
            self.bar.update(self.task, phase=text[:60])

    def advance(self, name: str, ok: bool) -> None:
        if self.task is not None:
            self.bar.advance(self.task)
        if not ok:
            log.warning("%s failed", name)

    def close(self) -> None:
        if self.task is not None:
            self.bar.stop()
            self.task = None


def configure(quiet: bool = False, live: bool | None = None) -> Progress:
    """What the CLI uses: logging to stderr (warnings only when `quiet`), and a live display when stderr
    is a terminal (plain lines otherwise)."""
    import sys

    root = logging.getLogger("optimize")
    for h in list(root.handlers):
        root.removeHandler(h)
    root.propagate = False
    live = sys.stderr.isatty() and not quiet if live is None else live
    if live:
        progress = RichProgress()
        root.addHandler(progress.handler)
    else:
        progress = Progress()
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(_Fitted("%(message)s"))
        root.addHandler(handler)
    for h in root.handlers:
        h.addFilter(_shown)
    root.setLevel(logging.WARNING if quiet else logging.INFO)
    return progress


class _Fitted(logging.Formatter):
    """Plain log lines wrapped to the terminal's width (a log file or CI shows them as they were meant)."""

    def format(self, record: logging.LogRecord) -> str:
        from optimize.core.shown import wrap

        return wrap(super().format(record), hang=4)


def _shown(record: logging.LogRecord) -> bool:
    """Log lines carry names from outside (models, keys, candidates): shown, never obeyed by the terminal.
    Arguments are escaped whole (a newline in a name is shown as \\n); the message keeps its own lines."""
    from optimize.core.shown import escape, escape_lines

    if isinstance(record.args, tuple) and record.args:
        try:
            record.msg = str(record.msg) % tuple(escape(a) if isinstance(a, str) else a for a in record.args)
            record.args = ()
        except (TypeError, ValueError):
            pass  # formatted by logging as usual
    if not record.args:
        record.msg = escape_lines(str(record.msg))
    return True

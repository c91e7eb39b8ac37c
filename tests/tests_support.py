"""Helpers shared by the test modules (tests/ is on sys.path, as for the other fixture modules)."""

from __future__ import annotations

HANG = " " * len("error: ")  # where an error message continues when it wraps (cli.ERROR_HANG)
WIDTH = 80


def error_messages(stderr: str) -> list[str]:
    """Each `error:` message in stderr, its wrapped continuation lines joined back (one logical message each).
    Every line of one fits 80 columns unless it is a path kept whole."""
    out: list[list[str]] = []
    for line in stderr.splitlines():
        if line.startswith("error:"):
            out.append([line])
        elif out and line.startswith(HANG) and line.strip():
            out[-1].append(line.strip())
        else:
            out.append([]) if out and out[-1] else None
    return [" ".join(m) for m in out if m]


def one_line_error(r, *fragments) -> str:
    """The one `error:` message of an exit-2 run (wrapped lines joined back), holding every fragment."""
    assert r.returncode == 2, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout, r.stderr
    messages = error_messages(r.stderr)
    assert len(messages) == 1, r.stderr
    for line in r.stderr.splitlines():
        assert len(line) <= WIDTH or "/" in line.split()[-1], f"over {WIDTH} columns: {line!r}"
    for f in fragments:
        assert f in messages[0], messages[0]
    return messages[0]


def too_wide(text: str, width: int = WIDTH) -> list[str]:
    """The lines of `text` wider than `width`, leaving out a line that is one word: a path kept whole so it can
    be copied (it is longer than a line when the temporary folder's path is, whatever the wrapping)."""
    return [line for line in text.splitlines() if len(line) > width and len(line.split()) > 1]

"""Where optimize reads and writes: inputs must be regular files (or SavedModel folders) of sane size, and
an output folder must be a folder we can write, checked before any work.

A FIFO, a device (/dev/zero) or a socket given as a model, data or recipe would hang or read without
bound; a file given as `-o`, a read-only mount or /sys would fail after minutes of work. All of them
are one clear line up front instead.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

from .errors import OptimizeError

MAX_INPUT_BYTES = 2 * 2**30  # a .tflite flatbuffer cannot exceed 2 GiB; nor do we read more of anything


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISDIR, "a folder"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def regular_file(path: str | Path, what: str, error: type[OptimizeError] = OptimizeError) -> Path:
    """`path` if it is a regular file no larger than MAX_INPUT_BYTES, else one clear error."""
    p = Path(path)
    try:
        st = p.stat()
    except FileNotFoundError:
        raise error(f"No {what} at {p}.", f"Check the path of the {what}.") from None
    except OSError as e:
        raise error(f"Cannot read the {what} at {p} ({e.strerror}).", "Check the path and its permissions.") from None
    if not stat.S_ISREG(st.st_mode):
        raise error(f"{p} is {_kind(st.st_mode)}, not a {what} file.", f"Pass a regular file as the {what}.")
    if st.st_size > MAX_INPUT_BYTES:
        raise error(
            f"{p} is {st.st_size / 2**30:.1f} GiB; optimize reads {what} files up to {MAX_INPUT_BYTES // 2**30} GiB.",
            "Pass a smaller file (a .tflite flatbuffer cannot exceed 2 GiB).",
        )
    return p


def output_dir(path: str | Path) -> Path:
    """Make sure `path` is (or can become) a folder we can write into; one clear error otherwise.

    Creates the folder (and its parents). Checked before any work, so a bad `-o` costs nothing.
    """
    p = Path(path)
    for parent in [p, *p.parents]:
        if parent.exists() and not parent.is_dir():
            raise OptimizeError(
                f"Cannot write into {p}: {parent} is {_kind(parent.stat().st_mode)}.", "Pass a folder with -o."
            )
    try:
        p.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=p, prefix=".optimize-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise OptimizeError(f"Cannot write into {p} ({e.strerror}).", "Pass a writable folder with -o.") from None
    return p


def inside(root: str | Path, name: str) -> Path:
    """`root/name`, refused if it would land outside `root` (an absolute name, `..`, a separator)."""
    base = Path(root).resolve()
    target = (base / name).resolve()
    if target.parent != base:
        raise OptimizeError(f"{name!r} would be written outside {root}.", "Use a plain file name.")
    return target

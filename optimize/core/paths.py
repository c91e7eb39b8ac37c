"""Where optimize reads and writes: the one reader and the one writer every file goes through.

Reading (`open_regular`, `read_bounded`, `check_tree`): only regular files, checked on the open
descriptor (a FIFO, a device such as /dev/zero, a socket, or a symlink to one is refused before a byte
is read, and the open itself never blocks), and never more than a limit per kind. Folders (SavedModels)
are walked without following links: a link leading outside the folder, a FIFO or a device inside it is
refused, and their sizes are bounded before anything hashes or loads them.

Writing (`write_atomic`, `copy_atomic`): a temporary created with O_EXCL | O_NOFOLLOW in the target
folder, then an atomic rename over the final name, so a crash never leaves half a file and a symlink
planted at the final name (or at a temporary's name) is replaced, never followed. Below a `root` (the
output folder, the cache) no folder on the way may be a symlink: writes stay inside what the user named.
An output folder is checked before any work (`output_dir`); a sweep writes into a staging folder inside
it and publishes at the end (`staging`, `publish`, `discard`). A store (the result cache) is read and
written below its root with no link followed on the way (`read_below`, `create_new`, `remove_below`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO
from urllib.parse import urlparse

from optimize.core.errors import OptimizeError

MAX_INPUT_BYTES = 2 * 2**30  # a .tflite flatbuffer cannot exceed 2 GiB; the default for any input
#: The most optimize reads of each kind of input (bytes); any other kind (a model, a cache entry): MAX_INPUT_BYTES.
LIMITS = {
    "data": 16 * 2**30,
    "recipe": 2**20,
    "study": 256 * 2**20,
    "Keras config": 64 * 2**20,
    "SavedModel": 16 * 2**30,  # all of its files together
}
_CHUNK = 1 << 20


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISLNK, "a symlink"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def _limit(what: str, limit: int | None) -> int:
    return limit if limit is not None else LIMITS.get(what, MAX_INPUT_BYTES)


def _too_big(p: Path, size: int, what: str, limit: int, error: type[OptimizeError]) -> OptimizeError:
    unit, scale = ("GiB", 2**30) if limit >= 2**30 else ("MiB", 2**20)
    why = " (a .tflite flatbuffer cannot exceed 2 GiB)" if what == "model" else ""
    return error(
        f"{p} is {size / scale:.1f} {unit}; optimize reads {what} files up to {limit / scale:g} {unit}.",
        f"Pass a smaller file{why}.",
    )


def _not_regular(p: Path, mode: int, what: str, error: type[OptimizeError]) -> OptimizeError:
    return error(f"{p} is {_kind(mode)}, not a {what} file.", f"Pass a regular file as the {what}.")


def _unreadable(p: Path, what: str, e: OSError | ValueError, error: type[OptimizeError]) -> OptimizeError:
    if isinstance(e, FileNotFoundError):
        return error(f"No {what} file at {p}.", f"Check the path of the {what}.")
    if isinstance(e, ValueError):  # a NUL byte in the path
        return error(f"The {what} path {str(p)!r} holds a NUL byte.", f"Check the path of the {what}.")
    if e.errno == errno.ELOOP:
        return error(f"{p} is a symlink, not a {what} file.", f"Pass the {what} file itself.")
    return error(f"Cannot read the {what} at {p} ({e.strerror}).", "Check the path and its permissions.")


def regular_file(
    path: str | Path, what: str, error: type[OptimizeError] = OptimizeError, limit: int | None = None
) -> Path:
    """`path` if it is a regular file no larger than the limit for `what`, else one clear error."""
    p = Path(path)
    try:
        st = p.stat()
    except (OSError, ValueError) as e:
        raise _unreadable(p, what, e, error) from None
    if not stat.S_ISREG(st.st_mode):
        raise _not_regular(p, st.st_mode, what, error)
    lim = _limit(what, limit)
    if st.st_size > lim:
        raise _too_big(p, st.st_size, what, lim, error)
    return p


@contextlib.contextmanager
def open_regular(
    path: str | Path,
    what: str,
    error: type[OptimizeError] = OptimizeError,
    limit: int | None = None,
    follow: bool = True,
) -> Iterator[BinaryIO]:
    """The file open for reading, if it is a regular file within the limit for `what`.

    Checked on the descriptor itself (no window between the check and the open); opened non-blocking,
    so a FIFO is refused instead of waiting for a writer. `follow=False` refuses a symlink at the last
    component (cache entries are never links).
    """
    p = Path(path)
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        pre = p.stat() if follow else p.lstat()  # a device is never opened: opening some has effects
        if not stat.S_ISREG(pre.st_mode):
            raise _not_regular(p, pre.st_mode, what, error)
        fd = os.open(p, flags)
    except (OSError, ValueError) as e:
        raise _unreadable(p, what, e, error) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _not_regular(p, st.st_mode, what, error)
        lim = _limit(what, limit)
        if st.st_size > lim:
            raise _too_big(p, st.st_size, what, lim, error)
        os.set_blocking(fd, True)
        f = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    with f:
        yield f


def read_bounded(
    path: str | Path,
    what: str,
    error: type[OptimizeError] = OptimizeError,
    limit: int | None = None,
    follow: bool = True,
) -> bytes:
    """The bytes of a regular file, at most the limit for `what` (a file growing meanwhile is refused)."""
    lim = _limit(what, limit)
    with open_regular(path, what, error, lim, follow) as f:
        try:
            data = f.read(lim + 1)
        except OSError as e:
            raise _unreadable(Path(path), what, e, error) from None
    if len(data) > lim:
        raise _too_big(Path(path), len(data), what, lim, error)
    return data


def check_tree(folder: str | Path, what: str, error: type[OptimizeError] = OptimizeError) -> list[Path]:
    """Every regular file under `folder` (sorted), walked without following links.

    Refused: a FIFO, device or socket anywhere inside; a symlink leading outside the folder or to
    anything but a regular file or folder; more bytes in total than the limit for `what`.
    """
    root = Path(folder)
    real_root = root.resolve()
    files, total, lim = [], 0, _limit(what, None)
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in sorted(dirnames + filenames):
            p = Path(dirpath, name)
            st = p.lstat()
            if stat.S_ISLNK(st.st_mode):
                try:
                    target = p.resolve(strict=True)
                except (OSError, RuntimeError):  # a dangling link, or a loop
                    raise error(f"{p} is a broken or looping symlink.", f"Copy the {what} without links.") from None
                if target != real_root and real_root not in target.parents:
                    raise error(f"{p} links outside {root} (to {target}).", f"Copy the {what} without links.")
                try:
                    st = target.stat()
                except OSError as e:
                    raise _unreadable(p, what, e, error) from None
                if stat.S_ISDIR(st.st_mode):
                    continue  # a link to a folder inside: its files are walked where they live
            if stat.S_ISDIR(st.st_mode):
                continue
            if not stat.S_ISREG(st.st_mode):
                raise error(f"{p} is {_kind(st.st_mode)}, inside the {what}.", f"Pass a {what} of regular files.")
            total += st.st_size
            if total > lim:
                raise _too_big(root, total, what, lim, error)
            files.append(p)
    return sorted(files)


def output_dir(path: str | Path) -> Path:
    """Make sure `path` is (or can become) a folder we can write into; one clear error otherwise.

    Creates the folder (and its parents). Checked before any work, so a bad `-o` costs nothing. A `-o` that
    is itself a symbolic link is refused (the folder it points to is named in the fix): what is written
    stays inside the folder the user named, and a link planted where the user meant a folder to be made
    cannot send the results elsewhere. Links among its parents (a /home on another disk) are followed.
    """
    p = Path(path)
    if "\0" in str(p):
        raise OptimizeError(f"The output folder {str(p)!r} holds a NUL byte.", "Pass a folder name with -o.")
    if p.is_symlink():  # writes stay inside what the user named: a link there (planted or not) is not followed
        target = os.readlink(p)
        real = p.resolve()
        fix = f"Pass the folder itself: -o {real}." if real.is_dir() else "Pass a folder with -o."
        raise OptimizeError(
            f"Cannot write into {p}: it is a symbolic link (to {target}), which optimize does not follow.", fix
        )
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
    """`root/name` for a plain file name; refused if it could land outside `root` (empty, `.`, `..`, a
    separator, a NUL). The name itself is not resolved: a symlink planted there is replaced by the writer,
    never followed."""
    if not name or name in (".", "..") or "/" in name or "\0" in name or os.sep in name:
        raise OptimizeError(f"{name!r} would be written outside {root}.", "Use a plain file name.")
    return Path(root).resolve() / name


# ---------------------------------------------------------------------------------------------- writing
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


@contextlib.contextmanager
def _folder(folder: Path, root: Path | None, create: bool = True) -> Iterator[int]:
    """A descriptor of `folder`, created if missing (unless not `create`: FileNotFoundError). Below
    `root`, each step is opened with O_NOFOLLOW: a symlinked folder inside the root is refused
    (ELOOP/ENOTDIR), never followed."""
    if root is None or folder == root:
        if create:
            folder.mkdir(parents=True, exist_ok=True)
        fds = [os.open(folder, _DIR_FLAGS)]
    else:
        rel = folder.relative_to(root)  # ValueError: not below the root (a bug, not a user error)
        if create:
            root.mkdir(parents=True, exist_ok=True)
        fds = [os.open(root, _DIR_FLAGS)]
    try:
        if root is not None and folder != root:
            for part in rel.parts:
                if create:
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(part, dir_fd=fds[-1])
                try:
                    fds.append(os.open(part, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=fds[-1]))
                except OSError as e:
                    if e.errno in (errno.ELOOP, errno.ENOTDIR):
                        raise OptimizeError(
                            f"{root / rel} passes through a symlink or file inside {root}; optimize never "
                            "writes through one.",
                            "Remove it, or pick another folder.",
                        ) from None
                    raise
        yield fds[-1]
    finally:
        for fd in fds:
            os.close(fd)


def _write_tmp(dfd: int, name: str, chunks: Iterable[bytes]) -> str:
    """A new temporary in the folder `dfd` holding `chunks` (O_EXCL | O_NOFOLLOW: never an existing
    file, never through a link); its name."""
    for _ in range(100):
        tmp = f".{name[:80]}.{secrets.token_hex(6)}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666, dir_fd=dfd)
            break
        except FileExistsError:
            continue
    else:  # pragma: no cover - 100 collisions of 48 random bits
        raise FileExistsError(errno.EEXIST, "no free temporary name", name)
    try:
        with os.fdopen(fd, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dfd)
        raise
    return tmp


def _publish(dfd: int, tmp: str, name: str) -> None:
    try:
        os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)  # replaces a planted symlink, never follows it
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dfd)
        raise


def write_atomic(path: str | Path, data: bytes | Iterable[bytes], root: str | Path | None = None) -> Path:
    """Write a file so that a crash never leaves half of it and no link is followed: a temporary made
    with O_EXCL | O_NOFOLLOW beside it, then an atomic rename over the final name.

    `root`: the folder the user named (the output folder, the cache); no folder between it and `path`
    may be a symlink. Permissions follow the umask, as for any file the user writes.
    """
    path = Path(path)
    chunks = [bytes(data)] if isinstance(data, bytes | bytearray | memoryview) else data
    with _folder(path.parent, Path(root) if root is not None else None) as dfd:
        _publish(dfd, _write_tmp(dfd, path.name, chunks), path.name)
    return path


def copy_atomic(src: str | Path, dst: str | Path, root: str | Path | None = None, what: str = "model") -> Path:
    """Copy a regular file (read through the one reader, bounded by the limit for `what`) as
    `write_atomic` writes: a temporary beside `dst`, then an atomic rename; `dst`."""
    dst = Path(dst)
    lim = _limit(what, None)
    with open_regular(src, what, limit=lim) as f:

        def chunks() -> Iterator[bytes]:
            seen = 0
            for chunk in iter(lambda: f.read(_CHUNK), b""):
                seen += len(chunk)
                if seen > lim:  # the file grew while it was read
                    raise _too_big(Path(src), seen, what, lim, OptimizeError)
                yield chunk

        with _folder(dst.parent, Path(root) if root is not None else None) as dfd:
            _publish(dfd, _write_tmp(dfd, dst.name, chunks()), dst.name)
    return dst


# ---------------------------------------------------------------------------------------------- staging
STAGING_PREFIX = ".optimize-staging-"
LOCK = ".lock"  # held (flock) by the run writing into a staging folder, for as long as it runs
TMP = ".tmp"  # a run's temporaries (tempfile.tempdir, $TMPDIR for the processes it starts)
STALE_UNLOCKED_S = 3600  # a staging folder with no lock file yet this old is left over too
_LOCKS: dict[Path, int] = {}  # the lock descriptors this process holds, by folder


def staging(final: str | Path) -> Path:
    """A fresh, private folder inside `final` where a run writes everything; `publish` moves it into
    `final` at the end. Interrupted or failed, the run leaves `final` as it found it (`discard`).

    The folder holds a lock for as long as its run lives (a flock the kernel releases when the process
    ends, however it ends): staging folders left in `final` by a run that was killed (SIGKILL, power loss)
    are removed here, by the next run into the same folder; a live run's never are."""
    final = Path(final)
    final.mkdir(parents=True, exist_ok=True)
    return locked_folder(final, STAGING_PREFIX)


def locked_folder(parent: Path, prefix: str) -> Path:
    """A fresh folder `parent/<prefix>XXXX` holding a lock while this process lives; folders of the same
    prefix whose process is gone are removed first (`clear_stale`). Released by `discard` or `publish`."""
    clear_stale(parent, prefix)
    folder = Path(tempfile.mkdtemp(dir=parent, prefix=prefix))
    fd = _hold(folder / LOCK)
    if fd is not None:
        _LOCKS[folder] = fd
    return folder


def _hold(path: Path) -> int | None:
    """The lock file made and locked (its descriptor kept open while the run lives). Where the filesystem
    cannot lock, the file is removed again: the folder is then judged by its age, never taken for abandoned."""
    import fcntl

    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(path)
        return None
    return fd


def _abandoned(folder: Path) -> bool:
    """Whether no live process holds this folder's lock (the run that made it was killed)."""
    import fcntl
    import time

    try:
        fd = os.open(folder / LOCK, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:  # an older run's, or one between mkdtemp and its lock: by age
        return time.time() - folder.lstat().st_mtime > STALE_UNLOCKED_S
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True


def clear_stale(parent: Path, prefix: str = STAGING_PREFIX) -> list[Path]:
    """Remove the folders `parent/<prefix>*` whose process is gone; the ones removed."""
    import shutil

    gone = []
    for old in Path(parent).glob(f"{prefix}*"):
        with contextlib.suppress(OSError):
            if old.is_dir() and not old.is_symlink() and old not in _LOCKS and _abandoned(old):
                shutil.rmtree(old, ignore_errors=True)
                gone.append(old)
    return gone


def _release(folder: Path) -> None:
    fd = _LOCKS.pop(folder, None)
    if fd is not None:
        with contextlib.suppress(OSError):
            os.close(fd)


def publish(stage: Path, final: Path, last: tuple[str, ...] = ("study.json",), root: Path | None = None) -> None:
    """Move what `stage` holds into `final`, each entry by an atomic rename (a link planted at a name in
    `final` is replaced, never followed), the names in `last` after everything else; then remove `stage`."""

    names = sorted(os.listdir(stage), key=lambda n: (n in last, n))
    with _folder(stage, None) as src, _folder(final, root) as dst:
        for name in names:
            if name in (".work", LOCK, TMP):
                continue
            try:
                os.replace(name, name, src_dir_fd=src, dst_dir_fd=dst)
            except OSError as e:  # a folder onto a non-empty folder: its files one by one
                if e.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.EISDIR) or not (stage / name).is_dir():
                    raise
                publish(stage / name, final / name, (), root or final)
    _remove_locked(stage)


def absent_folders(path: str | Path) -> list[Path]:
    """The folders of `path` that do not exist yet (deepest first): what making it creates, and what an
    interrupted or aborted run removes again (`remove_if_empty`), so it leaves no empty `-o` behind."""
    p = Path(path)
    return [q for q in [p, *p.parents] if not q.exists() and not q.is_symlink()]


def remove_if_empty(folders: list[Path]) -> None:
    """Remove each folder (deepest first) while it is empty; one that holds anything stays, with its parents."""
    for q in folders:
        try:
            os.rmdir(q)
        except OSError:
            return


def discard(stage: Path) -> None:
    """Remove a staging (or `locked_folder`) folder and everything in it (an interrupted or failed run)."""
    _remove_locked(stage)


def _remove_locked(folder: Path) -> None:
    """Remove a locked folder with its lock file last: a run killed while removing it (its `.work` can take
    seconds) leaves a folder whose lock nobody holds, which the next run removes, never one with no lock file,
    which is judged by its age for an hour (found by benchmarks/soak.py)."""
    import shutil

    with contextlib.suppress(OSError):
        for entry in os.scandir(folder):
            if entry.name == LOCK:
                continue
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)
    shutil.rmtree(folder, ignore_errors=True)
    _release(folder)


_OUTER: list[str] = []


def system_tempdir() -> Path:
    """The temp folder outside any `temporaries_in` (for what must outlive a staging folder or needs a short
    path: a local Ray's session folder, which holds Unix sockets)."""
    return Path(_OUTER[0] if _OUTER else tempfile.gettempdir())


@contextlib.contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    """`values` set in this process's environment (and its children's) while this runs; each variable restored
    afterwards to what it was, or unset where it was not set."""
    before = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def temporaries_in(folder: str | Path) -> Iterator[Path]:
    """Every temporary made while this runs goes into `folder` (created): this process's (`tempfile`) and
    those of the processes it starts ($TMPDIR: worker processes, TensorFlow's converter, subprocesses). A
    run puts it inside its staging folder, so whatever a killed worker or process leaves goes with the
    staging folder: removed at the end, or by the next run if this one is killed. Restored afterwards."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    before = tempfile.tempdir
    _OUTER.append(tempfile.gettempdir())
    tempfile.tempdir = str(folder)
    try:
        with environment({"TMPDIR": str(folder)}):
            yield folder
    finally:
        _OUTER.pop()
        tempfile.tempdir = before


# ---------------------------------------------------------------------------------------------- stores
def read_below(root: str | Path, path: str | Path, limit: int, what: str = "cache entry") -> bytes | None:
    """The bytes of a regular file below `root` (a cache), reached without following any link, at most
    `limit`; None when it is absent. A link, FIFO, device or oversized file is ValueError (corrupt)."""
    path, root = Path(path), Path(root)
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC | os.O_NOFOLLOW
    try:
        with _folder(path.parent, root, create=False) as dfd:
            fd = os.open(path.name, flags, dir_fd=dfd)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OptimizeError as e:  # a symlinked folder inside the store
        raise ValueError(e.problem) from None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise ValueError(f"{path.name} is a symlink, not a {what}") from None
        raise
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{path.name} is {_kind(st.st_mode)}, not a {what}")
        if st.st_size > limit:
            raise ValueError(f"{path.name} is larger than any entry ({limit:,} bytes)")
        os.set_blocking(fd, True)
        data = f.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"{path.name} is larger than any entry ({limit:,} bytes)")
    return data


def create_new(path: str | Path, data: bytes, root: str | Path, tmp_dir: str | Path) -> bool:
    """Publish `data` at `path` below `root` only if nothing is there, atomically (a hard link of a
    temporary written in `tmp_dir`; a rename where links are not supported), never through a link.
    True when this call created it."""
    path, root = Path(path), Path(root)
    try:
        with _folder(Path(tmp_dir), root) as tfd, _folder(path.parent, root) as dfd:
            return _link_new(tfd, dfd, _write_tmp(tfd, path.name, [data]), path.name)
    except OptimizeError as e:  # a symlinked folder planted in the store: corrupt, never followed
        raise ValueError(e.problem) from None


def _link_new(tfd: int, dfd: int, tmp: str, name: str) -> bool:
    """`tmp` (in folder `tfd`) made `name` (in folder `dfd`) if nothing has that name; `tmp` removed."""
    try:
        try:
            os.link(tmp, name, src_dir_fd=tfd, dst_dir_fd=dfd, follow_symlinks=False)
            return True
        except FileExistsError:
            return False
        except OSError as e:  # a filesystem without hard links
            if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV):
                raise
        try:
            os.stat(name, dir_fd=dfd, follow_symlinks=False)
            return False
        except FileNotFoundError:
            os.replace(tmp, name, src_dir_fd=tfd, dst_dir_fd=dfd)
            return True
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=tfd)


def remove_below(root: str | Path, path: str | Path) -> None:
    """Remove a file below `root` without following a link on the way (a link itself is removed)."""
    path = Path(path)
    with contextlib.suppress(FileNotFoundError, NotADirectoryError, OptimizeError):
        with _folder(path.parent, Path(root), create=False) as dfd:
            os.unlink(path.name, dir_fd=dfd)


def is_url(location: str) -> bool:
    """`s3://...`, `file://...` (a Windows drive letter or a plain path is not)."""
    scheme = urlparse(str(location)).scheme
    return len(scheme) > 1


def local_path(location: str | os.PathLike) -> Path | None:
    """The local folder a location names (a path or a file:// URL), or None for a remote URL."""
    text = str(location)
    if not is_url(text):
        return Path(text).expanduser()
    parsed = urlparse(text)
    if parsed.scheme == "file":
        return Path(parsed.netloc + parsed.path if parsed.netloc not in ("", "localhost") else parsed.path)
    return None


def default_root() -> str:
    """`$OPTIMIZE_CACHE` (a folder or URL), else ~/.cache/optimize (or $XDG_CACHE_HOME/optimize)."""
    return os.environ.get("OPTIMIZE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "optimize"
    )

"""Where shared files live: a local folder or any fsspec URL (`s3://bucket/prefix`, `gs://...`, `file://...`).

A `Store` holds immutable objects under keys relative to its root, with four operations the result
cache needs: `read` (bounded: at most `limit` bytes, None when absent), `create` (atomic and conditional:
the object appears whole or not at all, and only if no object has that key, so two machines writing the
same key at once leave one complete object), `delete`, and `clean` (temporaries left by a crash).

Local folders (plain paths and `file://` URLs) need nothing beyond the standard library: the object is
written to a temporary file in the store, then published with a hard link (which fails if the key
exists) or, where links are not supported, a rename. Other URLs go through fsspec (`pip install -e
".[distributed]"` brings s3fs): S3 publishes with a conditional put (`If-None-Match: *`), so no
temporary key is needed; other backends write a temporary key, then move it into place when the key is
free. S3 endpoints and credentials come from the standard AWS environment (`AWS_ENDPOINT_URL`,
`AWS_ACCESS_KEY_ID`, ...), so MinIO, moto's server and AWS all work.
"""

from __future__ import annotations

import errno
import os
import time
import uuid
from pathlib import Path

from optimize.core.errors import OptimizeError
from optimize.core.paths import create_new, is_url, local_path, read_below, remove_below

STALE_SECONDS = 3600  # temporaries older than this are left over from a crash: removed
TMP = "tmp"
CHECK_TIMEOUT_S = 30.0  # a store must take (and give back) a probe object within this, before any work
PROBE = f"{TMP}/writable"  # the one object a check writes to a remote store


class StorageError(OptimizeError):
    """A cache URL that cannot be used (unknown scheme, missing package)."""


class ReadOnlyStore(StorageError):
    """A local cache that can be read but not written (its disk full, a quota reached, a read-only
    filesystem): a run serves what it holds and keeps nothing new."""


#: Why a local folder that reads fine takes no new object: these leave it a read-only cache.
READ_ONLY_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS})


class LocalStore:
    """Objects as files under a folder; published by link (or rename), never half-written."""

    def __init__(self, root: Path):
        self.root = root
        self.url = str(root)

    def _path(self, key: str) -> Path:
        return self.root / key

    def read(self, key: str, limit: int) -> bytes | None:
        """Bounded, regular files only, no link followed (paths.read_below): ValueError when corrupt."""
        return read_below(self.root, self._path(key), limit)

    def create(self, key: str, data: bytes) -> bool:
        """Atomic and conditional, never through a link planted in the store (paths.create_new)."""
        return create_new(self._path(key), data, self.root, self.root / TMP)

    def delete(self, key: str) -> None:
        remove_below(self.root, self._path(key))

    def check(self) -> None:
        """The folder can hold objects (made if missing): a probe written and removed, or StorageError."""
        key = f"{TMP}/probe-{uuid.uuid4().hex}"
        try:
            self.create(key, b"probe")
            self.delete(key)
        except (OSError, ValueError) as e:
            why = getattr(e, "strerror", None) or str(e).splitlines()[0][:120]
            readable = self.root.is_dir() and os.access(self.root, os.R_OK | os.X_OK)
            if getattr(e, "errno", None) in READ_ONLY_ERRNOS and readable:
                raise ReadOnlyStore(
                    f"The cache {self.url} cannot be written ({why}).",
                    "Free space on its disk, or pass another --cache.",
                ) from None
            raise StorageError(f"Cannot write the cache {self.url} ({why}).", _LOCAL_FIX) from None

    def clean(self) -> None:
        now = time.time()
        for tmp in (self.root / TMP).glob("*"):
            try:
                if now - tmp.stat().st_mtime > STALE_SECONDS:
                    tmp.unlink()
            except OSError:
                continue


class FsspecStore:
    """Objects under an fsspec URL (S3: conditional puts; others: temporary key, then move)."""

    def __init__(self, url: str):
        try:
            import fsspec
        except ImportError:
            raise StorageError(
                f"The cache {url} needs fsspec.", 'Install the distributed extra: pip install -e ".[distributed]".'
            ) from None
        try:
            # a filesystem of its own, made from the environment as it is now: fsspec's instance cache would hand
            # back one made earlier in this process, with that time's endpoint and credentials
            self.fs, self.root = fsspec.core.url_to_fs(url, skip_instance_cache=True)
        except (ImportError, ValueError) as e:
            raise StorageError(
                f"Cannot use the cache {url}: {str(e).splitlines()[0][:160]}",
                "Use a folder, file://, or s3:// (pip install s3fs); gs:// needs gcsfs.",
            ) from None
        self.url = url
        protocol = self.fs.protocol
        self.conditional = "s3" in (protocol if isinstance(protocol, tuple) else (protocol,))

    def _path(self, key: str) -> str:
        return f"{self.root.rstrip('/')}/{key}"

    def read(self, key: str, limit: int) -> bytes | None:
        try:
            with self.fs.open(self._path(key), "rb") as f:
                data = f.read(limit + 1)
        except FileNotFoundError:
            return None
        if len(data) > limit:
            raise ValueError(f"{key} is larger than any entry ({limit:,} bytes)")
        return data

    def create(self, key: str, data: bytes) -> bool:
        path = self._path(key)
        if self.conditional:
            try:
                self.fs.pipe_file(path, data, mode="create")
                return True
            except FileExistsError:
                return False
        if self.fs.exists(path):
            return False
        tmp = self._path(f"{TMP}/{uuid.uuid4().hex}")
        self.fs.pipe_file(tmp, data)
        try:
            if self.fs.exists(path):
                return False
            self.fs.mv(tmp, path)
            return True
        finally:
            if self.fs.exists(tmp):
                self.fs.rm(tmp)

    def delete(self, key: str) -> None:
        try:
            self.fs.rm(self._path(key))
        except FileNotFoundError:
            pass

    def clean(self) -> None:
        pass  # conditional puts leave no temporaries; a failed move removes its own

    def check(self) -> None:
        """The bucket (or folder) exists and takes a probe object, within CHECK_TIMEOUT_S; else StorageError.
        The probe is one fixed object, overwritten by every check: a run killed meanwhile leaves nothing new."""

        def probe() -> None:
            self.fs.pipe_file(self._path(PROBE), b"optimize can write here")

        error = _bounded(probe, CHECK_TIMEOUT_S)
        if error is not None:
            raise StorageError(f"Cannot use the cache {self.url}: {error}.", _FIX)


_LOCAL_FIX = "Pass a folder you can write with --cache, or --no-cache."
_FIX = (
    "Create the bucket or folder and check its permissions and credentials (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, "
    "...), pass another --cache, or --no-cache."
)


def _bounded(fn, seconds: float) -> str | None:
    """Run `fn` in a helper thread for at most `seconds`: None when it worked, else why not (in words)."""
    import threading

    out: list[BaseException | None] = []

    def run() -> None:
        try:
            fn()
            out.append(None)
        except BaseException as e:  # noqa: BLE001 - reported to the caller
            out.append(e)

    t = threading.Thread(target=run, daemon=True, name="optimize-store-check")
    t.start()
    t.join(seconds)
    if not out:
        return f"no answer within {seconds:g} s"
    e = out[0]
    if e is None:
        return None
    if isinstance(e, FileNotFoundError):
        return "the bucket or folder does not exist"
    if isinstance(e, PermissionError):
        return "permission denied"
    return " ".join(str(e).split())[:160] or type(e).__name__


def open_store(location: str | os.PathLike) -> LocalStore | FsspecStore:
    """The store for a folder or URL."""
    path = local_path(location)
    return LocalStore(path) if path is not None else FsspecStore(str(location))


def join(root: str, *parts: str) -> str:
    """A sub-location of a folder or URL."""
    return "/".join([str(root).rstrip("/"), *parts]) if is_url(str(root)) else str(Path(root, *parts))

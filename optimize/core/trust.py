"""What a cache is trusted with: a folder no other user can write, and entries bound to a key only the writer holds.

A cache hands back files this tool ships (a `.tflite` beside its figures) and records it acts on, so whoever can
write it decides what a run ships. Two boundaries, each cheap:

- **The folder** (`folder_problem`): a local cache folder, and every folder above it, must be owned by this user
  (or root) and writable by no one else, as ssh asks of `~/.ssh` and pip of its cache. A folder above it may be
  writable by all when it is sticky (`/tmp`): there only an entry's owner can move it. A folder that fails is
  ignored with one warning naming why (`trusted`); the run goes on without that cache.
- **The key** (`cache_key`): every entry the result cache writes carries an HMAC-SHA256 of its contents under a
  secret key, checked before any of it is used; an entry that fails is rebuilt, never served. The key is
  `$OPTIMIZE_CACHE_KEY` when set (a team sharing an `s3://` bucket gives every member, and its CI, the same
  secret), else a random key kept in `~/.config/optimize/cache-key` (or `$XDG_CONFIG_HOME`), made with mode 0600
  on first use, in a folder only its owner can write. A key file others can read or write is refused as ssh
  refuses such a private key.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
import stat
from pathlib import Path

from optimize.core.errors import OptimizeError

KEY_ENV = "OPTIMIZE_CACHE_KEY"
MIN_KEY_CHARS = 16
KEY_FILE = "cache-key"
log = logging.getLogger(__name__)


class Untrusted(OptimizeError):
    """A cache, or the key that signs it, that another user could have written (or read)."""


def _owner_ok(st: os.stat_result) -> bool:
    return st.st_uid in (os.geteuid(), 0)


def folder_problem(folder: str | os.PathLike) -> str | None:
    """Why a local folder cannot be trusted with what a run reads back from it, or None. The folder (or,
    before it exists, the nearest folder above it) and every folder above: owned by this user or root, and
    writable by no one else unless sticky (only an ancestor may be: the folder itself never)."""
    path = Path(os.path.realpath(folder))
    for q in (path, *path.parents):
        try:
            st = os.stat(q)
        except OSError:  # not there yet (or not a folder, or not ours to look into): using it fails on its own
            continue
        if not _owner_ok(st):
            return f"{q} is owned by another user (uid {st.st_uid})"
        writable = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
        if writable and (q == path or not st.st_mode & stat.S_ISVTX):
            who = "everyone" if st.st_mode & stat.S_IWOTH else "its group"
            return f"{q} is writable by {who} (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


_WARNED: set[str] = set()


def trusted(folder: str | os.PathLike, what: str = "The cache") -> bool:
    """Whether a local folder passes `folder_problem`; when it does not, one warning (once per folder and
    process) says why and that it is ignored."""
    why = folder_problem(folder)
    if why is None:
        return True
    if str(folder) not in _WARNED:
        _WARNED.add(str(folder))
        log.warning(
            "%s %s is not used: %s, so another user could plant what a run reads back from it. "
            "Use a folder you own that only you can write (chmod go-w), or pass another --cache.",
            what, folder, why,
        )  # fmt: skip
    return False


_STANDINS: dict[str, Path] = {}


def or_private(folder: Path, what: str) -> Path:
    """`folder` when it is `trusted`, else a temporary folder of this process's own in its place (made once,
    removed when the process ends): a cache that cannot be trusted is simply not kept between runs."""
    if trusted(folder, what):
        return folder
    if str(folder) not in _STANDINS:
        import atexit
        import shutil
        import tempfile

        _STANDINS[str(folder)] = stand_in = Path(tempfile.mkdtemp(prefix="optimize-private-"))
        atexit.register(shutil.rmtree, stand_in, True)
    return _STANDINS[str(folder)]


def config_dir() -> Path:
    """`$XDG_CONFIG_HOME/optimize`, else ~/.config/optimize."""
    return Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "optimize"


_KEYS: dict[tuple, bytes] = {}


def cache_key() -> bytes:
    """The secret the result cache's entries are signed with (`$OPTIMIZE_CACHE_KEY`, else the key file, made on
    first use). Untrusted when it cannot be had safely (a short key, a key file others can read or write)."""
    env = os.environ.get(KEY_ENV)
    where = (env, str(config_dir())) if env is not None else (None, str(config_dir()))
    if where not in _KEYS:
        _KEYS[where] = _from_env(env) if env is not None else _from_file(config_dir())
    return _KEYS[where]


def _from_env(value: str) -> bytes:
    if len(value.strip()) < MIN_KEY_CHARS:
        raise Untrusted(
            f"${KEY_ENV} is set but holds {len(value.strip())} characters, too short to be a secret.",
            f"Set it to at least {MIN_KEY_CHARS} random characters (e.g. `openssl rand -hex 32`), or unset it.",
        )
    return value.strip().encode()


def _from_file(folder: Path) -> bytes:
    path = folder / KEY_FILE
    if not path.exists():
        _make_key(folder, path)
    why = folder_problem(folder) or _key_file_problem(path)
    if why:
        raise Untrusted(
            f"The cache key {path} cannot be trusted: {why}.",
            f"chmod 600 {path} and chmod go-w its folders, or set ${KEY_ENV}.",
        )
    try:
        data = path.read_bytes().strip()
    except OSError as e:
        raise Untrusted(f"Cannot read the cache key {path} ({e.strerror or e}).", f"Set ${KEY_ENV}.") from None
    if len(data) < MIN_KEY_CHARS:
        raise Untrusted(f"The cache key {path} is too short to be a secret.", "Remove it: a new one is made.")
    return data


def _key_file_problem(path: Path) -> str | None:
    st = os.lstat(path)
    if not stat.S_ISREG(st.st_mode):
        return "it is not a regular file"
    if not _owner_ok(st):
        return f"it is owned by another user (uid {st.st_uid})"
    if st.st_mode & 0o077:
        return f"others can read or write it (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def _make_key(folder: Path, path: Path) -> None:
    """A new random key, mode 0600, in a folder made 0700: written beside it, then linked into place (two
    processes making one at once keep the first)."""
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = folder / f".{KEY_FILE}.{secrets.token_hex(8)}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
        try:
            os.write(fd, (secrets.token_hex(32) + "\n").encode())
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
    except OSError as e:
        raise Untrusted(
            f"Cannot make the cache key {path} ({e.strerror or e}).", f"Set ${KEY_ENV}, or pass --no-cache."
        ) from None


def key_id(key: bytes) -> str:
    """A name for the key that says nothing of it: entries written under different keys live apart."""
    return hmac.new(key, b"optimize cache key id", hashlib.sha256).hexdigest()[:16]


def seal(key: bytes, payload: bytes) -> str:
    """The HMAC-SHA256 of `payload` under `key`, hex."""
    return hmac.new(key, payload, hashlib.sha256).hexdigest()


def sealed(key: bytes, payload: bytes, mac: str) -> bool:
    """Whether `mac` is `payload`'s under `key` (compared in constant time)."""
    return hmac.compare_digest(seal(key, payload), mac)

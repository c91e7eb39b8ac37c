"""A content-addressed cache of measured candidates: an unchanged sweep re-run reuses artifacts and figures.

The key covers everything a result depends on: the model's fingerprint, the resolved steps, the data's
fingerprint, the library versions, the measurement settings and the baseline it is compared with.
Different inputs can never share a key. Each entry stores the artifact and the record, with the sha256
of both beside them: an entry whose artifact or record does not match its digest (a half-written entry,
a hand-edited figure) is deleted and rebuilt, never served.

What is cached: candidates that worked, and failures that would happen again on the same inputs (a
technique's own failure, a worker killed by SIGSEGV in a technique). Never failures the environment
caused: a full disk, memory, a worker killed by SIGKILL, a timeout. A cache that cannot be written is a
warning, never a failed sweep.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import tempfile
import time
from pathlib import Path

from pydantic import ValidationError

from .results import Candidate, write_atomic

CACHE_FORMAT = 3  # 3: candidates carry the robustness probe; every deterministic failure is kept
STALE_SECONDS = 3600  # temp folders older than this are left over from a crash: removed
log = logging.getLogger(__name__)

#: Failure classes the environment causes, not the inputs: never remembered. Every other failure is the
#: technique's (or the runtime's) answer to these inputs and code, and comes back the same on a re-run: a
#: converter error, a tfmot ValueError, a candidate failing verification or the robustness probe.
ENVIRONMENT = frozenset(
    {
        "OSError", "IOError", "EnvironmentError", "PermissionError", "FileNotFoundError", "FileExistsError",
        "IsADirectoryError", "NotADirectoryError", "BlockingIOError", "BrokenPipeError", "ConnectionError",
        "ConnectionResetError", "ConnectionAbortedError", "ConnectionRefusedError", "InterruptedError",
        "TimeoutError", "ChildProcessError", "ProcessLookupError", "MemoryError", "KeyboardInterrupt", "SystemExit",
        "ResourceExhaustedError", "DeadlineExceededError", "UnavailableError", "CancelledError", "AbortedError",
    }
)  # fmt: skip


def key_for(**parts) -> str:
    """A stable hash of JSON-able parts (sorted keys)."""
    blob = json.dumps({"format": CACHE_FORMAT, **parts}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def cacheable(c: Candidate) -> bool:
    """Worked, or failed in a way the same inputs would fail again."""
    if c.error is None:
        return c.ok
    if c.error_kind == "WorkerCrashed":
        from .executors import CRASH_SIGNALS

        return (c.error_detail or "") in CRASH_SIGNALS
    return c.error_kind is not None and c.error_kind not in ENVIRONMENT


class ResultCache:
    """Entries are folders `root/<key[:2]>/<key>/` holding `model.tflite`, `candidate.json` and `digest.json`."""

    def __init__(self, root: Path | None):
        self.root = root
        self.warned = False
        if root is not None:
            self._clean_stale()

    @property
    def enabled(self) -> bool:
        return self.root is not None

    def _dir(self, key: str) -> Path:
        return self.root / key[:2] / key

    def _clean_stale(self) -> None:
        now = time.time()
        for tmp in self.root.glob("*/*.tmp*"):
            try:
                if now - tmp.stat().st_mtime > STALE_SECONDS:
                    shutil.rmtree(tmp, ignore_errors=True)
            except OSError:
                continue

    def get(self, key: str, name: str, out_dir: Path) -> Candidate | None:
        """The cached candidate renamed to `name`, its artifact copied to out_dir; None on a miss."""
        if not self.enabled:
            return None
        folder = self._dir(key)
        if not (folder / "candidate.json").is_file():
            return None
        try:
            cand = self._read(folder)
            if cand.artifact is not None:
                dest = out_dir / f"{name}.tflite"
                tmp = dest.with_name(f".{dest.name}.tmp")
                shutil.copyfile(folder / "model.tflite", tmp)
                tmp.replace(dest)
                cand = cand.model_copy(update={"artifact": dest.name})
        except (ValueError, KeyError, TypeError, OSError, ValidationError) as e:
            log.warning("  cache entry for %s is corrupt (%s); rebuilding it", name, str(e).splitlines()[0][:80])
            shutil.rmtree(folder, ignore_errors=True)
            return None
        return cand.model_copy(update={"name": name, "cached": True})

    @staticmethod
    def _read(folder: Path) -> Candidate:
        digest = json.loads((folder / "digest.json").read_text())
        record = folder / "candidate.json"
        if _sha256(record) != digest["record"]:
            raise ValueError("the record does not match its digest (edited or half-written)")
        cand = Candidate.model_validate_json(record.read_bytes())
        if cand.artifact is not None and _sha256(folder / "model.tflite") != digest["artifact"]:
            raise ValueError("the artifact does not match its digest")
        return cand

    def put(self, key: str, cand: Candidate, out_dir: Path) -> None:
        """Store a candidate if it is worth remembering. A failure to write is a warning, never an error."""
        if not self.enabled or not cacheable(cand):
            return
        folder = self._dir(key)
        tmp = None
        try:
            folder.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f"{folder.name}.tmp"))
            digest = {"record": None, "artifact": None}
            if cand.artifact:
                shutil.copyfile(out_dir / cand.artifact, tmp / "model.tflite")
                digest["artifact"] = _sha256(tmp / "model.tflite")
            write_atomic(tmp / "candidate.json", cand.model_dump_json().encode())
            digest["record"] = _sha256(tmp / "candidate.json")
            write_atomic(tmp / "digest.json", json.dumps(digest).encode())
            shutil.rmtree(folder, ignore_errors=True)
            tmp.replace(folder)
        except OSError as e:
            if not self.warned:
                log.warning("Could not write the result cache (%s); carrying on without it.", e.strerror or e)
                self.warned = True
        finally:
            if tmp is not None and tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)

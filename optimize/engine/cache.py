"""A content-addressed cache of measured candidates: an unchanged sweep re-run reuses artifacts and figures.

The key covers everything a result depends on: the model's fingerprint, the resolved steps, the data's
fingerprint, the library versions, the measurement settings and the baseline it is compared with.
Different inputs can never share a key. The cache lives in a folder or at any fsspec URL
(`optimize.engine.storage`: `s3://bucket/prefix` shares it between machines), as two kinds of object:

    results/v3/artifacts/<sha[:2]>/<sha>.tflite   the artifact, named by its own sha256
    results/v3/entries/<key[:2]>/<key>.json       the record, its sha256 and the artifact's

Both are published atomically and only if absent, so two machines writing the same key at once leave
one complete entry. An entry is verified on read: a record or artifact that does not match its digest
(half-written, hand-edited) is deleted and rebuilt, never served. Every entry is validated by a schema
(`Entry`: the format, the key it was written for, the record and both digests, each of its JSON type) before
any field is used: anything that does not validate (`{"format": 6, "record": 5}`, an entry written for
another key, a record that is not a candidate) is a miss that is rebuilt, never a traceback. A store that
cannot be read (an S3 endpoint gone, a permission) is a miss with one warning; the entry is kept.

What is cached: candidates that worked, and failures that would happen again on the same inputs (a
technique's own failure, a worker killed by SIGSEGV in a technique). Never failures the environment
caused: a full disk, memory, a worker killed by SIGKILL, a lost node, a timeout. A cache that cannot be
written is a warning, never a failed sweep; a local one that cannot be written when the run starts for a
reason that leaves it readable (a full disk, a quota, a read-only filesystem: `storage.ReadOnlyStore`) still
serves what it holds, with one warning naming that reason.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from optimize.core.paths import default_root
from optimize.core.results import Candidate, write_atomic
from optimize.engine.storage import ReadOnlyStore, StorageError, join, open_store

# 3: candidates carry the robustness probe; every deterministic failure is kept.
# 4: entries and artifacts as separate objects in a store (a folder or any fsspec URL).
# 5: candidates carry their accuracy-rescue steps (results.RescueStep).
# 6: latency timed round-robin across a study's candidates, with its rounds and p50 interval.
# 7: sigmoid outputs carry their decision agreement; a regression baseline its error ratio; the selective search
#    judges on samples its calibration never saw.
# 8: fidelity per output slice, detections kept, and the figures in the GPU's arithmetic (metrics.on_target).
# 9: artifacts carry TFLite metadata and candidates their I/O contract, read from the file (engine.ship).
CACHE_FORMAT = 9
MAX_RECORD_BYTES = 64 * 2**20  # a record with its debug tables is a few MiB at most
MAX_ARTIFACT_BYTES = 2**31  # a flatbuffer cannot be larger
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
        "NodeLost",  # a Ray node went away (optimize.engine.ray_executor), retried until it gave up
        "RecordUnreadable",  # a worker's record did not validate in the parent (work.received): ours, retried
    }
)  # fmt: skip


SHA256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]


class Entry(BaseModel):
    """A cache entry as stored: checked field by field, in strict JSON types, before any of it is used."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    format: Literal[CACHE_FORMAT]
    key: str = Field(pattern=r"^\w{1,128}$")
    record: str = Field(max_length=MAX_RECORD_BYTES)
    record_sha256: SHA256
    artifact_sha256: SHA256 | None
    artifact_bytes: int | None = Field(ge=1, le=MAX_ARTIFACT_BYTES)

    @model_validator(mode="after")
    def _artifact_both_or_neither(self):
        if (self.artifact_sha256 is None) != (self.artifact_bytes is None):
            raise ValueError("artifact_sha256 and artifact_bytes go together")
        return self


class Corrupt(ValueError):
    """A cache object that is not what was stored: deleted and rebuilt."""


def key_for(**parts) -> str:
    """A stable hash of JSON-able parts (sorted keys)."""
    blob = json.dumps({"format": CACHE_FORMAT, **parts}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def cacheable(c: Candidate) -> bool:
    """Worked, or failed in a way the same inputs would fail again."""
    if c.error is None:
        return c.ok
    if c.error_kind == "WorkerCrashed":
        from optimize.engine.work import CRASH_SIGNALS

        return (c.error_detail or "") in CRASH_SIGNALS
    return c.error_kind is not None and c.error_kind not in ENVIRONMENT


class ResultCache:
    """Candidates by key in a store (`optimize.engine.storage`), or nothing when `store` is None."""

    def __init__(self, store=None, writable: bool = True):
        self.store = store
        self.writable = writable  # False: a cache on a full (or read-only) disk serves what it holds
        self.warned = False
        if store is not None and writable:
            store.clean()

    @property
    def enabled(self) -> bool:
        return self.store is not None

    @property
    def url(self) -> str | None:
        return self.store.url if self.store is not None else None

    def known(self, trusted: bool = False) -> Known | None:
        """What the cache knows about model files (`Known`), or None when there is no cache."""
        return Known(self, trusted) if self.enabled else None

    @staticmethod
    def _entry(key: str) -> str:
        return f"v{CACHE_FORMAT}/entries/{key[:2]}/{key}.json"

    @staticmethod
    def _artifact(sha: str) -> str:
        return f"v{CACHE_FORMAT}/artifacts/{sha[:2]}/{sha}.tflite"

    def get(self, key: str, name: str, out_dir: Path) -> Candidate | None:
        """The cached candidate renamed to `name`, its artifact copied to out_dir; None on a miss."""
        if not self.enabled:
            return None
        try:
            raw = self.store.read(self._entry(key), MAX_RECORD_BYTES)
            if raw is None:
                return None
            cand, artifact = self._verified(raw, key)
        except (ValueError, ValidationError) as e:  # Corrupt, a store's ValueError (a link, a FIFO): rebuilt
            log.warning("  cache entry for %s is corrupt (%s); rebuilding it", name, _first(e))
            self._forget(key)
            return None
        except Exception as e:  # noqa: BLE001 - the store could not be read (network, permission): a miss
            self._unreadable(e)
            return None
        if artifact is not None:
            dest = write_atomic(out_dir / f"{name}.tflite", artifact)
            cand = cand.model_copy(update={"artifact": dest.name})
        return cand.model_copy(update={"name": name, "cached": True})

    def _verified(self, raw: bytes, key: str) -> tuple[Candidate, bytes | None]:
        """The entry's candidate and artifact bytes, each checked against the schema and its digest; Corrupt
        (or ValidationError) for anything else."""
        doc = Entry.model_validate_json(raw)  # types, ranges, digests' form; bounded nesting (pydantic-core)
        if doc.key != key:
            raise Corrupt("the entry was written for another key")
        record = doc.record.encode("utf-8", "surrogatepass")
        if _sha256(record) != doc.record_sha256:
            raise Corrupt("the record does not match its digest (edited or half-written)")
        cand = Candidate.model_validate_json(record)
        if (cand.artifact is None) != (doc.artifact_sha256 is None):
            raise Corrupt("the record and the entry disagree on the artifact")
        if cand.artifact is None:
            return cand, None
        sha, size = doc.artifact_sha256, doc.artifact_bytes
        artifact = self.store.read(self._artifact(sha), size)
        if artifact is None or len(artifact) != size or _sha256(artifact) != sha:
            self.store.delete(self._artifact(sha))
            raise Corrupt("the artifact does not match its digest")
        return cand, artifact

    def _unreadable(self, e: Exception) -> None:
        if not self.warned:
            log.warning("Could not read the result cache (%s); carrying on without it.", _first(e))
            self.warned = True

    def _forget(self, key: str) -> None:
        try:
            self.store.delete(self._entry(key))
        except Exception:  # noqa: BLE001 - the store is unreachable: the entry is rebuilt over it, or read again
            pass

    def put(self, key: str, cand: Candidate, out_dir: Path) -> None:
        """Store a candidate if it is worth remembering. A failure to write is a warning, never an error."""
        if not self.enabled or not self.writable or not cacheable(cand):
            return
        try:
            doc = {"format": CACHE_FORMAT, "key": key, "artifact_sha256": None, "artifact_bytes": None}
            if cand.artifact:
                data = (out_dir / cand.artifact).read_bytes()
                doc["artifact_sha256"], doc["artifact_bytes"] = _sha256(data), len(data)
                self._put_artifact(doc["artifact_sha256"], data)
            record = cand.model_copy(update={"cached": False}).model_dump_json()
            doc["record"], doc["record_sha256"] = record, _sha256(record.encode())
            entry = Entry.model_validate(doc).model_dump_json().encode()  # what get() will accept, or nothing
            self.store.create(self._entry(key), entry)  # False: another writer was first
        except Exception as e:  # noqa: BLE001 - a full disk, a corrupt object in the way, the store unreachable
            if not self.warned:
                why = getattr(e, "strerror", None) or _first(e)
                log.warning("Could not write the result cache (%s); carrying on without it.", why)
                self.warned = True

    def _put_artifact(self, sha: str, data: bytes) -> None:
        """Content-addressed: an artifact already there is the same bytes, unless it is corrupt (replaced)."""
        key = self._artifact(sha)
        if self.store.create(key, data):
            return
        try:
            there = self.store.read(key, len(data))
        except ValueError:  # longer than the artifact it should be (or a link, a FIFO): corrupt
            there = None
        if there is None or _sha256(there) != sha:
            self.store.delete(key)
            self.store.create(key, data)


class Known:
    """What the TensorFlow-bound checks found about a model file (`optimize.models.known`), kept in the cache
    beside the candidates, keyed by the file's fingerprint, the library versions and whether its code is
    trusted (a Keras 3 rebuild: by the data's fingerprint too). Records are validated on read; anything else
    is a miss (and removed), so the checks simply run again."""

    def __init__(self, cache: ResultCache, trusted: bool):
        from optimize.models import _tf

        self.cache, self.trusted, self.versions = cache, trusted, _tf.versions()

    def _key(self, what: str, **parts) -> str:
        key = key_for(known=what, versions=self.versions, trusted=self.trusted, **parts)
        return f"v{CACHE_FORMAT}/known/{key[:2]}/{key}.json"

    def _get(self, key: str, model, fingerprint: str):
        store = self.cache.store
        try:
            raw = store.read(key, MAX_KNOWN_BYTES)
            if raw is None:
                return None
            record = model.model_validate_json(raw)
            if record.fingerprint != fingerprint:
                raise Corrupt("the record names another model")
            return record
        except (ValueError, ValidationError):
            log.info("  what was known about the model is unreadable; checking it again")
            with contextlib.suppress(Exception):
                store.delete(key)
        except Exception as e:  # noqa: BLE001 - the store could not be read: check again
            self.cache._unreadable(e)
        return None

    def _put(self, key: str, record) -> None:
        if not self.cache.writable:
            return
        try:
            self.cache.store.create(key, record.model_dump_json().encode())
        except Exception as e:  # noqa: BLE001 - a cache that cannot be written is never an error
            log.info("  could not keep what was learnt about the model (%s)", _first(e))

    def model(self, fingerprint: str):
        from optimize.models.known import KnownModel

        return self._get(self._key("model", fingerprint=fingerprint), KnownModel, fingerprint)

    def put_model(self, record) -> None:
        self._put(self._key("model", fingerprint=record.fingerprint), record)

    def rebuild(self, fingerprint: str, data: str | None):
        from optimize.models.known import KnownRebuild

        key = self._key("rebuild", fingerprint=fingerprint, data=data)
        record = self._get(key, KnownRebuild, fingerprint)
        return record if record is not None and record.data == data else None

    def put_rebuild(self, record) -> None:
        self._put(self._key("rebuild", fingerprint=record.fingerprint, data=record.data), record)


MAX_KNOWN_BYTES = 1 << 20


def _first(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:120]


def result_cache(option: bool | str | None = True) -> ResultCache:
    """The cache a run uses: True for `$OPTIMIZE_CACHE` (a folder or URL) or ~/.cache/optimize, a folder
    or URL of its own, or False/None for none. Results live under `<root>/results/`."""
    if option is False or option is None:
        return ResultCache(None)
    explicit = option is not True or bool(os.environ.get("OPTIMIZE_CACHE"))
    root = default_root() if option is True else str(option)
    store = open_store(join(root, "results"))
    if store.url not in _CHECKED:
        try:
            store.check()  # before any work: a bucket that does not exist or cannot be written is one line
        except ReadOnlyStore as e:  # a full disk: what the cache holds still serves this run
            log.warning("%s Reading what it holds; keeping nothing new this run.", e.problem)
            return ResultCache(store, writable=False)
        except StorageError as e:
            if explicit:
                raise
            log.warning("%s Carrying on without the result cache.", e.problem)
            return ResultCache(None)
        _CHECKED.add(store.url)
    return ResultCache(store)


_CHECKED: set[str] = set()  # stores checked in this process

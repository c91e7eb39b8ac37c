"""A content-addressed cache of measured candidates: an unchanged sweep re-run reuses artifacts and figures.

The key covers everything a result depends on: the model's fingerprint, the resolved steps, the data's
fingerprint, the library versions, the measurement settings and the baseline it is compared with.
Different inputs can never share a key. An entry whose artifact does not match its recorded hash, or
whose record does not parse, is deleted and rebuilt, never served.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from pydantic import ValidationError

from .results import Candidate, write_atomic

CACHE_FORMAT = 1


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


class ResultCache:
    """Entries are folders `root/<key[:2]>/<key>/` holding `candidate.json` and `model.tflite`."""

    def __init__(self, root: Path | None, log=lambda msg: None):
        self.root = root
        self.log = log

    @property
    def enabled(self) -> bool:
        return self.root is not None

    def _dir(self, key: str) -> Path:
        return self.root / key[:2] / key

    def get(self, key: str, name: str, out_dir: Path) -> Candidate | None:
        """The cached candidate renamed to `name`, its artifact copied to out_dir; None on a miss."""
        if not self.enabled:
            return None
        folder = self._dir(key)
        record = folder / "candidate.json"
        if not record.is_file():
            return None
        try:
            raw = json.loads(record.read_text())
            cand = Candidate.model_validate(raw["candidate"])
            artifact = folder / "model.tflite"
            if cand.artifact is not None:
                if not artifact.is_file() or _sha256(artifact) != raw["artifact_sha256"]:
                    raise ValueError("artifact does not match its recorded hash")
                dest = out_dir / f"{name}.tflite"
                tmp = dest.with_suffix(".tflite.tmp")
                shutil.copyfile(artifact, tmp)
                tmp.replace(dest)
                cand = cand.model_copy(update={"artifact": dest.name})
        except (ValueError, KeyError, TypeError, OSError, ValidationError) as e:
            self.log(f"  cache entry for {name} is corrupt ({str(e).splitlines()[0][:80]}); rebuilding it")
            shutil.rmtree(folder, ignore_errors=True)
            return None
        return cand.model_copy(update={"name": name, "cached": True})

    def put(self, key: str, cand: Candidate, out_dir: Path) -> None:
        if not self.enabled:
            return
        folder = self._dir(key)
        tmp = folder.with_name(folder.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        digest = None
        if cand.artifact:
            shutil.copyfile(out_dir / cand.artifact, tmp / "model.tflite")
            digest = _sha256(tmp / "model.tflite")
        write_atomic(
            tmp / "candidate.json",
            json.dumps({"candidate": cand.model_dump(mode="json"), "artifact_sha256": digest}).encode(),
        )
        shutil.rmtree(folder, ignore_errors=True)
        tmp.replace(folder)

"""Outputs that never overwrite another study's files (issue 43): what a study.json in an output folder
describes, and the one-line refusal, before any work, of a command that would write over it.

A study lists the `.tflite` files it measured. `optimize quantize mine.keras -c mine.npz` into the folder of
the demo's sweep would write `int8.tflite` over the demo's own, and the study would then describe bytes that
are gone; a sweep of another model into that folder would replace the whole study. Both are refused (exit
2, nothing written), with the way out: another `-o`, a file name the study does not list, or, for a sweep,
`--replace`. A sweep of the same model (by its bytes, or by the path it was named by: a retrained file) into
its own folder replaces its own study, as a re-run should.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from optimize.core.errors import OptimizeError


@dataclass(frozen=True)
class Described:
    """The study in an output folder: the model it measured (as named, and its fingerprint), when it was made,
    and the `.tflite` files it lists (plain names inside the folder)."""

    model: str
    fingerprint: str
    created: str
    files: tuple[str, ...]


def described(folder: str | Path) -> Described | None:
    """The study in `folder` (its study.json), or None when there is none. A study this version cannot
    validate still names its files: its JSON is read plainly, so an older or hand-edited study is protected
    too; a file that is not JSON at all describes nothing."""
    path = Path(folder) / "study.json"
    if not path.is_file():
        return None
    try:
        raw = json.loads(path.read_bytes()[: 256 * 2**20])
    except (OSError, ValueError):
        return None
    if not isinstance(raw, dict) or not isinstance(raw.get("candidates"), list):
        return None
    files = []
    for c in raw["candidates"]:
        art = c.get("artifact") if isinstance(c, dict) else None
        if isinstance(art, str) and art.endswith(".tflite") and "/" not in art and "\\" not in art:
            files.append(art)
    return Described(
        str(raw.get("model", "?")), str(raw.get("model_fingerprint", "")), str(raw.get("created", "")), tuple(files)
    )


def _when(study: Described) -> str:
    return f", {study.created[:16].replace('T', ' ')}" if study.created else ""


def refuse_overwrite(folder: str | Path, names: list[str], way_out: str) -> None:
    """Refuse (OptimizeError, exit 2) to write any of `names` into `folder` when the study there lists it."""
    study = described(folder)
    if study is None:
        return
    taken = [n for n in names if n in study.files]
    if not taken:
        return
    where = Path(folder) / taken[0]
    raise OptimizeError(
        f"{where} belongs to the study in {folder} (of {study.model}{_when(study)}): writing it would change a "
        "file that study describes.",
        way_out,
    )


def single_way_out(folder: str | Path, name: str) -> str:
    """The way out for one recipe's run (quantize, prune, cluster, qat, run): another folder or file name."""
    stem = Path(name).stem
    return f"Write elsewhere: -o {stem}-out, or -o {Path(folder) / (stem + '-mine.tflite')}."


def _same_path(a: str, b: str) -> bool:
    try:
        return a == b or Path(a).resolve() == Path(b).resolve()
    except (OSError, ValueError):
        return False


def refuse_another_model(folder: str | Path, model: str, fingerprint: str | None, replace: bool) -> Described | None:
    """Before a sweep: the study in `folder`, refused (exit 2) when it is another model's (neither the same
    path as named nor, once the model is opened, the same bytes: `fingerprint`) unless `replace` says to replace
    it. Checked before the model is opened (`fingerprint` None: the path decides), and again after for a model
    given as an object. Returns the study found, if any."""
    study = described(folder)
    if study is None or replace or not study.files:
        return study
    if _same_path(study.model, model) or (fingerprint is not None and study.fingerprint == fingerprint):
        return study
    raise OptimizeError(
        f"{folder} holds the study of another model ({study.model}{_when(study)}, {len(study.files)} .tflite "
        "file(s)): this sweep would replace it.",
        f"Sweep into another folder (-o {Path(str(model)).stem or 'model'}-out), or pass --replace to replace it.",
    )

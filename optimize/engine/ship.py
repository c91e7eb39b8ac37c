"""A candidate's file as it is shipped: its I/O contract read from it, its TFLite metadata written into it.

This is where an artifact is placed in the output folder (`pipeline.make_candidate`), so every file a sweep,
`quantize`, `prune` or `run` writes says how to feed it: the contract (dtype, shape, scale, zero point, the
range each input expects) is read from the artifact's own bytes (`optimize.models.contract`), never from what
the recipe meant to make, and the same contract, with the class names when the data gives them (`labels`), is
written into the file as TFLite metadata (`optimize.models.metadata`), which Android's Task Library, MediaPipe
Tasks and tflite-support read. The metadata does not change what the file computes (the interpreter skips it);
the sizes measured afterwards are those of the file shipped. A file that already carries metadata someone else
wrote (a `.tflite` given with its own, inherited by its candidates) keeps it, with the files it packed.
"""

from __future__ import annotations

import logging
from pathlib import Path

from optimize.core import paths
from optimize.core.results import IOContract
from optimize.models import metadata
from optimize.models.contract import data_ranges, read_contract

log = logging.getLogger(__name__)


def _ranges(data) -> dict[str, tuple[float, float]]:
    """The float inputs' ranges over the calibration and test samples (what the model was measured on)."""
    if data is None:
        return {}
    cal, test = data_ranges(data.x_cal), data_ranges(data.x_test)
    return {k: (min(v[0], test.get(k, v)[0]), max(v[1], test.get(k, v)[1])) for k, v in cal.items()}


def _about(src, data, name: str, scheme: str) -> metadata.About:
    from optimize import __version__

    labels = tuple(data.class_names) if data is not None else ()
    what = f"{name} ({scheme}) of {src.name}, made and measured by optimize {__version__}"
    return metadata.About(name=src.name, description=what, labels=labels)


def _theirs(src) -> tuple[bytes, dict[str, bytes]] | None:
    """The TFLite metadata a .tflite source carries from its own author (not optimize), with the files it packed
    (its labels): what every candidate of it ships with, since a quantizer may drop it. None: it has none. Read
    from the source's bytes in memory (normalising keeps the metadata) and the archive at the end of its file."""
    if src.kind != "tflite" or src.content is None:
        return None
    meta = metadata.read(src.content)
    if meta is None or metadata._text(meta.author) == metadata.AUTHOR:
        return None
    return metadata._metadata_buffer(src.content), metadata.packed_file(Path(src.path))


def with_metadata(content: bytes, ws, name: str, scheme: str, notes: list[str]) -> tuple[bytes, IOContract]:
    """The file's bytes with TFLite metadata in them, and its contract. Writing the metadata failing (a model
    over 2 GB, say) leaves the file as it was, with a note: the candidate stands."""
    contract = read_contract(content, _ranges(ws.data))
    try:
        theirs = _theirs(ws.src)
        if theirs is not None:
            shipped = metadata.embed(content, *theirs)
        else:
            about = _about(ws.src, ws.data, name, scheme)
            shipped = metadata.embed(content, metadata.build(contract, about), metadata.files_for(contract, about))
    except Exception as e:  # the metadata is an addition; the model is what was measured
        notes.append(f"no TFLite metadata written: {type(e).__name__}: {str(e)[:120]}")
        shipped = content
    return shipped, contract.model_copy(update={"metadata": metadata.summary(shipped)})


def ship_out(ws, src_path: Path, artifact: Path, name: str, scheme: str, notes: list[str]) -> IOContract:
    """The artifact written into the output folder through the one writer, with its metadata; its contract."""
    content = paths.read_bounded(Path(src_path), "model")
    shipped, contract = with_metadata(content, ws, name, scheme, notes)
    paths.write_atomic(artifact, shipped, root=artifact.parent)
    return contract


def contract_of(path: Path, data=None) -> IOContract:
    """A .tflite file's contract and the TFLite metadata it carries, read from it (`optimize evaluate`)."""
    content = paths.read_bounded(Path(path), "model")
    return read_contract(content, _ranges(data), metadata.summary(content))

"""What converting a PyTorch or ONNX model to its float .tflite cost, on the user's data: the .tflite against
the source runtime (ONNX Runtime on the original file, or PyTorch), output by output, the same figures a
candidate's fidelity to float32 has. A sweep shows it as a row of its own, apart from quantization error.

The figures are cached beside the conversion (`<cache>/converted/`), by the conversion and the data.
"""

from __future__ import annotations

import contextlib
import hashlib

from optimize.convert import pytorch
from optimize.core.results import Fidelity
from optimize.measure.metrics import fidelity_of
from optimize.models.data import Dataset, count, take
from optimize.models.source import ModelSource


def measure(src: ModelSource, ds: Dataset | None, threads: int = 2, samples: int = pytorch.FIDELITY_SAMPLES):
    """The source with its conversion record's `fidelity` filled in (unchanged without data, or for a source
    that was not converted)."""
    record = src.conversion
    if not src.torch or record is None or ds is None or record.fidelity is not None:
        return src
    from dataclasses import replace

    return replace(src, conversion=record.model_copy(update={"fidelity": fidelity(src, ds, threads, samples)}))


def _cache_file(src: ModelSource, ds: Dataset, n: int):
    key = hashlib.sha256(f"{src.fingerprint}|{ds.fingerprint}|{n}".encode()).hexdigest()[:24]
    root = pytorch.cache_dir()
    return root, root / f"{key}.fidelity.json"


def fidelity(src: ModelSource, ds: Dataset, threads: int = 2, samples: int = pytorch.FIDELITY_SAMPLES) -> Fidelity:
    """The float .tflite against the source runtime on up to `samples` test samples."""
    from optimize.core.paths import read_below, write_atomic

    n = min(samples, count(ds.x_test))
    root, path = _cache_file(src, ds, n)
    with contextlib.suppress(Exception):
        cached = read_below(root, path, 2**24, "conversion fidelity")
        if cached is not None:
            return Fidelity.model_validate_json(cached)
    mine, theirs, names, reference, heads = pytorch.side_by_side(src, take(ds.x_test, slice(0, n)), threads)
    result = fidelity_of(mine, theirs, names, reference, hs=heads or None)
    with contextlib.suppress(OSError):
        root.mkdir(parents=True, exist_ok=True)
        write_atomic(path, result.model_dump_json().encode(), root=root)
    return result

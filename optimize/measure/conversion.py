"""What converting a PyTorch or ONNX model to its float .tflite cost, on the user's data: the .tflite against
the source runtime (ONNX Runtime on the original file, or PyTorch), output by output, the same figures a
candidate's fidelity to float32 has. A sweep shows it as a row of its own, apart from quantization error.

The figures are cached beside the conversion (`<cache>/converted/`), by the conversion and the data.
"""

from __future__ import annotations

import contextlib
import hashlib

import numpy as np

from optimize.core.results import Conversion, Fidelity
from optimize.measure.metrics import fidelity_of
from optimize.models import runtime, torch_source
from optimize.models.data import Dataset, count, take
from optimize.models.source import ModelSource, output_heads


def measure(src: ModelSource, ds: Dataset | None, threads: int = 2, samples: int = torch_source.FIDELITY_SAMPLES):
    """The source with its conversion record's `fidelity` filled in (unchanged without data, or for a source
    that was not converted)."""
    record = src.conversion
    if not src.torch or record is None or ds is None or record.fidelity is not None:
        return src
    from dataclasses import replace

    return replace(src, conversion=record.model_copy(update={"fidelity": fidelity(src, ds, threads, samples)}))


def _cache_file(src: ModelSource, ds: Dataset, n: int):
    key = hashlib.sha256(f"{src.fingerprint}|{ds.fingerprint}|{n}".encode()).hexdigest()[:24]
    root = torch_source.cache_dir()
    return root, root / f"{key}.fidelity.json"


def fidelity(src: ModelSource, ds: Dataset, threads: int = 2, samples: int = torch_source.FIDELITY_SAMPLES) -> Fidelity:
    """The float .tflite against the source runtime on up to `samples` test samples."""
    from optimize.core.paths import read_below, write_atomic

    n = min(samples, count(ds.x_test))
    root, path = _cache_file(src, ds, n)
    with contextlib.suppress(Exception):
        cached = read_below(root, path, 2**24, "conversion fidelity")
        if cached is not None:
            return Fidelity.model_validate_json(cached)
    result = _measured(src, take(ds.x_test, slice(0, n)), threads)
    with contextlib.suppress(OSError):
        root.mkdir(parents=True, exist_ok=True)
        write_atomic(path, result.model_dump_json().encode(), root=root)
    return result


def _measured(src: ModelSource, xs, threads: int) -> Fidelity:
    record: Conversion = src.conversion
    loaded = runtime.load(src.content, threads=threads, like=take(xs, slice(0, 1)))
    runner = runtime.Runner(loaded)
    mine = runner.predict(xs)
    names = runner.output_names()
    feeds = [torch_source.source_feeds(record, take(xs, slice(i, i + 1))) for i in range(count(xs))]
    with torch_source.quiet():
        reference, per_sample = torch_source.source_outputs(src, feeds)
    ref = _stacked(per_sample, record)
    theirs = [ref[record.outputs.index(n)] if n in record.outputs else np.zeros_like(m) for n, m in zip(names, mine)]
    heads = [h for _, h in output_heads(src)]
    return fidelity_of(mine, theirs, names, reference, hs=heads or None)


def _stacked(per_sample: list[list[np.ndarray]], record: Conversion) -> list[np.ndarray]:
    """The source's outputs as the .tflite runner stacks its own: per sample, without the batch axis of 1 (a
    whole output keeps all of itself), NHWC where the conversion made that output so."""
    out = []
    for j, name in enumerate(record.outputs):
        rows = [np.asarray(s[j]) for s in per_sample]
        if name not in record.whole_outputs:
            rows = [r[0] for r in rows]
        a = np.stack(rows).astype(np.float32, copy=False)
        if name in record.channel_last_outputs:
            a = np.moveaxis(a, 1, -1)
        out.append(a)
    return out

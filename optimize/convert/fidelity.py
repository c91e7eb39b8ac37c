"""What converting a PyTorch or ONNX model to its float .tflite cost, on the user's data: the .tflite against
the source runtime (ONNX Runtime on the original file, or PyTorch), output by output, the same figures a
candidate's fidelity to float32 has. A sweep shows it as a row of its own, apart from quantization error.

The figures are cached beside the conversion (`<cache>/converted/`), by the conversion and the data.
"""

from __future__ import annotations

import contextlib
import hashlib

from optimize.convert.conversions import cache_dir
from optimize.convert.formats import source_of
from optimize.convert.plan import source_feeds, stacked
from optimize.convert.torch_export import quiet
from optimize.convert.torch_route import FIDELITY_SAMPLES
from optimize.core.results import Conversion, Fidelity
from optimize.measure.metrics import fidelity_of
from optimize.models.data import Dataset, count, take
from optimize.models.source import ModelSource


def measure(src: ModelSource, ds: Dataset | None, threads: int = 2, samples: int = FIDELITY_SAMPLES):
    """The source with its conversion record's `fidelity` filled in (unchanged without data, or for a source
    that was not converted)."""
    record = src.conversion
    if not src.torch or record is None or ds is None or record.fidelity is not None:
        return src
    from dataclasses import replace

    return replace(src, conversion=record.model_copy(update={"fidelity": fidelity(src, ds, threads, samples)}))


def _cache_file(src: ModelSource, ds: Dataset, n: int):
    key = hashlib.sha256(f"{src.fingerprint}|{ds.fingerprint}|{n}".encode()).hexdigest()[:24]
    root = cache_dir()
    return root, root / f"{key}.fidelity.json"


def fidelity(src: ModelSource, ds: Dataset, threads: int = 2, samples: int = FIDELITY_SAMPLES) -> Fidelity:
    """The float .tflite against the source runtime on up to `samples` test samples."""
    from optimize.core.paths import read_below, write_atomic

    n = min(samples, count(ds.x_test))
    root, path = _cache_file(src, ds, n)
    with contextlib.suppress(Exception):
        cached = read_below(root, path, 2**24, "conversion fidelity")
        if cached is not None:
            return Fidelity.model_validate_json(cached)
    mine, theirs, names, reference, heads = side_by_side(src, take(ds.x_test, slice(0, n)), threads)
    result = fidelity_of(mine, theirs, names, reference, hs=heads or None)
    with contextlib.suppress(OSError):
        root.mkdir(parents=True, exist_ok=True)
        write_atomic(path, result.model_dump_json().encode(), root=root)
    return result


def side_by_side(src: ModelSource, xs, threads: int = 2) -> tuple[list, list, list[str], str, list]:
    """The converted .tflite and the source runtime on the same samples `xs`: (the .tflite's outputs, the
    source's stacked alike and in the same order, the output names, the reference runtime's name, each
    output's head)."""
    import numpy as np

    from optimize.models import runtime
    from optimize.models.spec import tflite_heads

    record: Conversion = src.conversion
    runner = runtime.Runner(runtime.load(src.content, threads=threads, like=take(xs, slice(0, 1))))
    mine = runner.predict(xs)
    names = runner.output_names()
    feeds = [source_feeds(record, take(xs, slice(i, i + 1))) for i in range(count(xs))]
    with quiet():
        reference, per_sample = source_of(src).reference(record, feeds)
    ref = stacked(per_sample, record)
    theirs = [ref[record.outputs.index(n)] if n in record.outputs else np.zeros_like(m) for n, m in zip(names, mine)]
    return mine, theirs, names, reference, [h for _, h in tflite_heads(src.content)]

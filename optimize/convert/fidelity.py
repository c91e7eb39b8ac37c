"""What converting a PyTorch or ONNX model to its float .tflite cost, on the user's data: the .tflite against
the source runtime (ONNX Runtime on the original file, or PyTorch), output by output, the same figures a
candidate's fidelity to float32 has. A sweep shows it as a row of its own, apart from quantization error.

The figures are cached beside the conversion (`<cache>/converted/`), by the conversion and the data.
"""

from __future__ import annotations

import contextlib
import hashlib

import numpy as np

from optimize.convert.conversions import cache_dir
from optimize.convert.formats import source_of
from optimize.convert.route import FIDELITY_SAMPLES
from optimize.convert.torch_export import quiet
from optimize.core.results import Fidelity
from optimize.measure.metrics import fidelity_of
from optimize.models.data import Dataset, count, take
from optimize.models.source import ModelSource


def measure(src: ModelSource, ds: Dataset | None, threads: int = 2, samples: int = FIDELITY_SAMPLES):
    """The source with its conversion record's `fidelity` filled in (unchanged without data, or for a source
    that was not converted)."""
    record = src.conversion
    if not src.converted or record is None or ds is None or record.fidelity is not None:
        return src
    from dataclasses import replace

    return replace(src, conversion=record.model_copy(update={"fidelity": fidelity(src, ds, threads, samples)}))


def fidelity(src: ModelSource, ds: Dataset, threads: int = 2, samples: int = FIDELITY_SAMPLES) -> Fidelity:
    """The float .tflite against the source runtime on up to `samples` test samples: the source's outputs (its
    own runtime, `TorchSource.outputs`), then the .tflite's, compared output by output as a candidate's are.
    Kept beside the conversion, by the converted source and the data."""
    from optimize.core.paths import read_below, write_atomic
    from optimize.models import runtime

    source = source_of(src)
    xs = take(ds.x_test, slice(0, samples))
    root = cache_dir()
    path = (
        root
        / f"{hashlib.sha256(f'{src.fingerprint}|{ds.fingerprint}|{count(xs)}'.encode()).hexdigest()[:24]}.fidelity.json"
    )
    with contextlib.suppress(Exception):
        cached = read_below(root, path, 2**24, "conversion fidelity")
        if cached is not None:
            return Fidelity.model_validate_json(cached)
    with quiet():
        reference, theirs = source.outputs(src.conversion, xs)
    runner = runtime.Runner(runtime.load(src.content, threads=threads, like=take(xs, slice(0, 1))))
    mine, names = runner.predict(xs), runner.output_names()
    theirs = [theirs.get(name, np.zeros_like(m)) for name, m in zip(names, mine)]
    heads = dict(src.heads)  # each output's head, read from the .tflite when it was opened
    result = fidelity_of(mine, theirs, names, reference, hs=[heads.get(n) for n in names] if heads else None)
    with contextlib.suppress(OSError):
        root.mkdir(parents=True, exist_ok=True)
        write_atomic(path, result.model_dump_json().encode(), root=root)
    return result

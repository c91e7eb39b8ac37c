"""The float model's intermediate tensors, streamed one sample at a time from the LiteRT interpreter
(preserve-all-tensors mode): what equalization, bias correction, learned rounding and range selection read."""

from __future__ import annotations

import warnings

import numpy as np


def stream(content: bytes, samples: list, tensors, threads: int = 2):
    """The float model's values of `tensors`, one sample at a time (a dict each, from a clean state), so
    layers' inputs are reduced as they come, never all held at once. `tensors`: indices (the dicts are keyed
    by index), or a set of names (keyed by name, in the model's tensor order; names it lacks are skipped)."""
    from optimize.models import runtime

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        runner = runtime.Runner(runtime.load(content, threads=threads, keep_tensors=True))
    if isinstance(tensors, set | frozenset):
        index = {d["name"]: d["index"] for d in runner.it.get_tensor_details() if d["name"] in tensors}
    else:
        index = {t: t for t in tensors}
    for sample in samples:
        runner.run_fresh(sample)
        yield {key: np.array(runner.it.get_tensor(i)) for key, i in index.items()}


def channel_extremes(content: bytes, samples: list, tensors: list[int], threads: int = 2) -> dict[int, tuple]:
    """(min, max) per channel (last axis) of each tensor over the samples."""
    out: dict[int, tuple] = {}
    for values in stream(content, samples, tensors, threads):
        for t, v in values.items():
            v = v.reshape(-1, v.shape[-1])
            lo, hi = v.min(axis=0), v.max(axis=0)
            out[t] = (np.minimum(out[t][0], lo), np.maximum(out[t][1], hi)) if t in out else (lo, hi)
    return out

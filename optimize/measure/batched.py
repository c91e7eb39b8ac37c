"""A model's outputs on many test samples in batches, where the interpreter allows it and nothing changes.

Accuracy and fidelity are measured on the whole test split (issue 43), every candidate, on the CPU and in the
GPU's arithmetic. One invoke a sample costs a small model far more in Python than in arithmetic (a 17 kB CNN:
about 0.25 ms a sample through `runtime.Runner`, 0.01 ms of it the model), so the samples go through in
batches wherever the model takes one: every input with a free batch axis (-1 first in its shape signature), no
state kept between invokes (variables, recurrent ops), every output batched along the same axis. The batched
outputs of the first samples are checked against the one-sample path before anything is kept; a model whose
figures a batch would move (per-tensor dynamic quantization over the batch, say) goes one sample at a time,
as before, and so does a model this process already ran on half the samples or more (`runtime.seen_share`: the
quantizer's failure check runs a slow int16x8 on test samples, and a batch would run them again, 0.3 s an invoke on
MobileNetV2). Either way the caller gets exactly what `Runner.predict` gives.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from optimize.core.errors import ModelError
from optimize.models import runtime
from optimize.models.data import count, take

log = logging.getLogger(__name__)

#: At most this many samples an invoke, and at most BATCH_BYTES of outputs held by one batch.
BATCH = 64
BATCH_BYTES = 32 * 2**20
#: Ops that keep state between invokes: a batch would mix what `Runner.run_fresh` resets between samples.
STATEFUL = {
    "VAR_HANDLE",
    "READ_VARIABLE",
    "ASSIGN_VARIABLE",
    "CALL_ONCE",
    "LSTM",
    "RNN",
    "SVDF",
    "UNIDIRECTIONAL_SEQUENCE_LSTM",
    "UNIDIRECTIONAL_SEQUENCE_RNN",
    "BIDIRECTIONAL_SEQUENCE_LSTM",
    "BIDIRECTIONAL_SEQUENCE_RNN",
}
CHECKED = 2  # samples compared with the one-sample path before a batched result is kept


def _size(runner: runtime.Runner, xs) -> int:
    """Samples per invoke: up to BATCH, fewer where the outputs of a batch would outgrow BATCH_BYTES."""
    per = sum(int(np.prod(d["shape"])) * 4 for d in runner.outputs) or 1
    return max(1, min(BATCH, count(xs), BATCH_BYTES // per))


def batchable(runner: runtime.Runner) -> bool:
    """Whether the model takes a batch: a free batch axis on every input, and no state between invokes."""
    sigs = [[int(v) for v in d.get("shape_signature", d["shape"])] for d in runner.inputs]
    if not sigs or any(not s or s[0] != -1 for s in sigs):
        return False
    ops = {name for name, _ in runtime.nodes(runner.it)}
    return not ops & STATEFUL


def _invoke(runner: runtime.Runner, chunk, n: int) -> list[np.ndarray]:
    """One batch of `n` samples: each output, dequantized, with the batch on its first axis."""
    from optimize.models.runtime import _from_output

    runner.set_input(chunk)
    runner.invoke()
    outs = [_from_output(runner.it.get_tensor(d["index"]), d) for d in runner.outputs]
    if any(o.shape[:1] != (n,) for o in outs):
        raise ValueError("an output is not batched along its first axis")
    return outs


def _same(batched: list[np.ndarray], single: list[np.ndarray]) -> bool:
    for b, s in zip(batched, single, strict=True):
        scale = max(1.0, float(np.abs(s).max())) if s.size else 1.0
        if b.shape != s.shape or not np.allclose(b, s, rtol=0, atol=1e-5 * scale, equal_nan=True):
            return False
    return True


def _batched(model, runner: runtime.Runner, xs, threads: int) -> list[np.ndarray] | None:
    size = _size(runner, xs)
    n = count(xs)
    if n < 2 or size < 2 or not batchable(runner) or runtime.seen_share(runner.digest, xs) >= 0.5:
        return None
    first = take(xs, slice(0, size))
    batch = runtime.Runner(runtime.load(model, threads=threads, like=first))
    parts = []
    for start in range(0, n, size):
        m = min(size, n - start)
        parts.append(_invoke(batch, take(xs, slice(start, start + m)), m))
        if start == 0:
            k = min(CHECKED, m)
            single = runner.predict(take(xs, slice(0, k)))
            if not _same([o[:k] for o in parts[0]], single):
                log.debug("%s: batched outputs differ from one sample at a time; measured one at a time", model)
                return None
    return [np.concatenate([p[j] for p in parts]) for j in range(len(runner.outputs))]


def predict(model: str | Path | bytes, runner: runtime.Runner, xs, threads: int = 2) -> list[np.ndarray]:
    """Every sample's outputs, stacked per output, as `runner.predict(xs)` gives them: in batches on a second
    interpreter of `model` (the same bytes as `runner`'s) where the model takes a batch and gives the same
    outputs on the first samples, else one sample at a time through `runner`."""
    try:
        out = _batched(model, runner, xs, threads)
    except (ModelError, ValueError, RuntimeError) as e:  # a batch it cannot take: one at a time says which sample
        log.debug("%s: not batched (%s)", model if not isinstance(model, bytes) else "model", e)
        out = None
    return out if out is not None else runner.predict(xs)

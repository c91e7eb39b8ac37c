"""Measure a .tflite in the LiteRT runtime: size (raw, gzip), accuracy, fidelity to a float reference,
latency and peak memory. Honest figures: host CPU, thread count and XNNPACK recorded with each."""

from __future__ import annotations

import gzip
import hashlib
from pathlib import Path

import numpy as np

from . import runtime
from .data import Dataset, load_data
from .errors import ModelError
from .models import is_tflite
from .results import Accuracy, Fidelity, Latency, Memory, Metrics, OutputFidelity, Size

DEFAULT_SAMPLES = 500


def size_of(path: str | Path) -> Size:
    data = Path(path).read_bytes()
    return Size(bytes=len(data), gzip_bytes=len(gzip.compress(data, compresslevel=9, mtime=0)))


def accuracy_of(logits: np.ndarray, y: np.ndarray, k: int = 5) -> Accuracy:
    """top-1/top-k for class labels (integers, one per sample); mean absolute error for regression."""
    n = len(y)
    logits = logits[:n]
    if np.issubdtype(y.dtype, np.integer) and y.ndim == 1 and logits.ndim == 2 and logits.shape[1] > 1:
        top1 = float((logits.argmax(1) == y).mean())
        k = min(k, logits.shape[1])
        topk = float((np.argsort(-logits, axis=1)[:, :k] == y[:, None]).any(1).mean())
        return Accuracy(samples=n, top1=top1, topk=topk, k=k)
    return Accuracy(samples=n, mae=float(np.abs(logits.reshape(len(y), -1) - y.reshape(len(y), -1)).mean()))


def fidelity_of(outs: list[np.ndarray], ref: list[np.ndarray], names: list[str], reference: str) -> Fidelity:
    """Per output: mean/std/max absolute difference from the reference, and argmax agreement."""
    per = []
    for name, a, b in zip(names, outs, ref):
        d = np.abs(a.astype(np.float64) - b.astype(np.float64))
        per.append(
            OutputFidelity(
                name=name, mean_abs_diff=float(d.mean()), std_abs_diff=float(d.std()), max_abs_diff=float(d.max())
            )
        )
    agree = None
    if outs and outs[0].ndim == 2 and outs[0].shape[1] > 1:
        agree = float((outs[0].argmax(1) == ref[0].argmax(1)).mean())
    return Fidelity(reference=reference, samples=len(outs[0]) if outs else 0, outputs=per, top1_agreement=agree)


def _check_tflite(path: Path) -> None:
    if not path.is_file():
        raise ModelError(f"No model at {path}.", "Pass a .tflite file.")
    with open(path, "rb") as f:
        if not is_tflite(f.read(8)):
            raise ModelError(f"{path} is not a TFLite flatbuffer.", "Pass a .tflite written by a converter.")


_REFERENCE_MEMO: dict[tuple, list[np.ndarray]] = {}


def _reference_outputs(reference: Path, xs: np.ndarray, threads: int) -> list[np.ndarray]:
    """The float reference's outputs on xs, computed once per sweep (every candidate compares with them)."""
    st = reference.stat()
    key = (str(reference.resolve()), st.st_mtime_ns, st.st_size, xs.shape, hashlib.sha1(xs.tobytes()).hexdigest())
    if key not in _REFERENCE_MEMO:
        _REFERENCE_MEMO.clear()
        _REFERENCE_MEMO[key] = runtime.Runner(runtime.load(reference, threads=threads)).predict(xs)
    return _REFERENCE_MEMO[key]


def _dataset(data) -> Dataset | None:
    if data is None or isinstance(data, Dataset):
        return data
    return load_data(data)


def evaluate(
    model: str | Path,
    data: str | Path | Dataset | None = None,
    reference: str | Path | None = None,
    threads: int = 2,
    runs: int = 50,
    warmup: int = 5,
    samples: int | None = DEFAULT_SAMPLES,
    memory: bool = True,
    baseline_accuracy: Accuracy | None = None,
    timing: bool = True,
) -> Metrics:
    """Every measurement of one .tflite. Without data, latency and memory use a zero input.

    `reference` is the float model to compare outputs with (inference_diff-style fidelity).
    `baseline_accuracy` fills `accuracy_delta` (the float model's accuracy on the same data).
    `timing=False` leaves latency and memory to `add_timing`, so a sweep can time every candidate
    on a quiet machine after the parallel work is done.
    """
    path = Path(model)
    _check_tflite(path)
    ds = _dataset(data)
    runner = runtime.Runner(runtime.load(path, threads=threads))
    xs = None
    if ds is not None:
        ds.check_input(runner.input_shape, name=runner.inputs[0]["name"])
        xs = ds.x_test[:samples] if samples else ds.x_test
    acc = fid = None
    if xs is not None:
        outs = runner.predict(xs)
        if ds.y_test is not None:
            acc = accuracy_of(outs[0], ds.y_test[: len(xs)])
        if reference is not None:
            fid = fidelity_of(
                outs, _reference_outputs(Path(reference), xs, threads), runner.output_names(), Path(reference).name
            )
    delta = None
    if acc is not None and baseline_accuracy is not None:
        if acc.top1 is not None and baseline_accuracy.top1 is not None:
            delta = acc.top1 - baseline_accuracy.top1
        elif acc.mae is not None and baseline_accuracy.mae is not None:
            delta = baseline_accuracy.mae - acc.mae
    metrics = Metrics(size=size_of(path), accuracy=acc, accuracy_delta=delta, fidelity=fid)
    if timing:
        sample = xs[:1] if xs is not None else None
        metrics = add_timing(metrics, path, sample, threads=threads, runs=runs, warmup=warmup, memory=memory)
    return metrics


def add_timing(
    metrics: Metrics,
    model: str | Path,
    sample: np.ndarray | None = None,
    threads: int = 2,
    runs: int = 50,
    warmup: int = 5,
    memory: bool = True,
) -> Metrics:
    """Latency (benchmark_model style) and peak memory of one .tflite, added to its metrics."""
    loaded = runtime.load(model, threads=threads)
    runner = runtime.Runner(loaded)
    if sample is None:
        sample = np.zeros(runner.input_shape, np.float32)
    t = runtime.time_invoke(runner, sample, warmup=warmup, runs=runs)
    latency = Latency(
        runtime=runtime.runtime_label(), threads=threads, xnnpack=loaded.xnnpack, init_ms=loaded.init_ms, **t
    )
    mem = None
    if memory:
        peak = runtime.peak_memory_bytes(model, threads)
        mem = Memory(peak_rss_bytes=peak) if peak is not None else None
    return metrics.model_copy(update={"latency": latency, "memory": mem})

"""Measure a .tflite in the LiteRT runtime: size (raw, gzip), accuracy, fidelity to a float reference,
latency and peak memory. Honest figures: host CPU, thread count and XNNPACK recorded with each."""

from __future__ import annotations

import dataclasses
import functools
import gzip
import hashlib
import re
from pathlib import Path

import numpy as np

from optimize.core.errors import DataError, ModelError
from optimize.core.results import (
    Accuracy,
    Fidelity,
    Latency,
    Memory,
    Metrics,
    OnTarget,
    OutputContract,
    OutputFidelity,
    Size,
    TestSample,
)
from optimize.measure import batched, detection, slices, timing
from optimize.measure.memory import peak_memory_bytes
from optimize.measure.on_target import emulated
from optimize.measure.timing import time_invoke
from optimize.models import runtime, tasks
from optimize.models.data import Dataset, check_inputs, count, load_data, take, test_sample
from optimize.models.source import is_tflite
from optimize.models.tasks import Head, heads

#: Test samples accuracy and fidelity are measured on by default: None, the whole test split (issue 43: the first
#: 500 were a head slice, a split sorted by class lost a class). A cap (`--test-samples`) takes a stratified sample.
DEFAULT_SAMPLES: int | None = None
#: The outputs kept for one model on the measured samples stay under this: a split whose outputs would hold more
#: (a segmenter's masks on thousands of samples) is measured on a stratified sample of what fits, said so.
OUTPUT_BUDGET = 256 * 2**20


def size_of(path: str | Path) -> Size:
    data = Path(path).read_bytes()
    return Size(bytes=len(data), gzip_bytes=len(gzip.compress(data, compresslevel=9, mtime=0)))


def _check_tflite(path: Path) -> None:
    if not path.is_file():
        raise ModelError(f"No model at {path}.", "Pass a .tflite file.")
    with open(path, "rb") as f:
        if not is_tflite(f.read(8)):
            raise ModelError(f"{path} is not a TFLite flatbuffer.", "Pass a .tflite written by a converter.")


_REFERENCE_MEMO: dict[tuple, list[np.ndarray]] = {}


def _digest(xs) -> str:
    h = hashlib.sha1()
    for name, a in sorted(xs.items()) if isinstance(xs, dict) else [("", xs)]:
        h.update(name.encode() + str(a.shape).encode() + np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def _reference_outputs(reference: Path, xs, threads: int) -> list[np.ndarray]:
    """The float reference's outputs on xs, computed once per sweep (every candidate compares with them)."""
    st = reference.stat()
    key = (str(reference.resolve()), st.st_mtime_ns, st.st_size, _digest(xs))
    if key not in _REFERENCE_MEMO:
        _REFERENCE_MEMO.clear()
        loaded = runtime.load(reference, threads=threads, like=take(xs, slice(0, 1)))
        _REFERENCE_MEMO[key] = batched.predict(reference, runtime.Runner(loaded), xs, threads)
    return _REFERENCE_MEMO[key]


def measured_split(ds: Dataset, samples: int | None, runner: runtime.Runner) -> tuple[Dataset, TestSample]:
    """The data cut to the test samples every figure is measured on (`models.data.test_sample`): the whole
    split, or `samples` of it, or fewer where the model's outputs on them would hold more than OUTPUT_BUDGET."""
    total = count(ds.x_test)
    per = sum(int(np.prod(d["shape"])) * 4 for d in runner.outputs) or 1  # float32 outputs of one sample
    fits = max(1, OUTPUT_BUDGET // per)
    n = total if samples is None else min(samples, total)
    if n <= fits:
        return test_sample(ds, n if n < total else None, f"--test-samples {n}" if n < total else "")
    why = f"the outputs of {n:,} would hold {n * per / 2**20:,.0f} MiB; {fits:,} keep them under {OUTPUT_BUDGET >> 20} MiB"
    return test_sample(ds, fits, why)


def _dataset(data) -> Dataset | None:
    if data is None or isinstance(data, Dataset):
        return data
    return load_data(data)


def source_names(ds: Dataset, runner: runtime.Runner) -> list[str]:
    """Each of the runner's outputs by the source model's name for it: a converted Keras model calls its
    outputs output_0, output_1, ... (by the Keras model's output order), which a user never named."""
    names = runner.output_names()
    if ds.outputs and len(ds.outputs) == len(names) and all(re.fullmatch(r"output_\d+", n) for n in names):
        at = [int(n.rsplit("_", 1)[1]) for n in names]
        if sorted(at) == list(range(len(names))):
            return [ds.outputs[i] for i in at]
    return names


def label_index(ds: Dataset, runner: runtime.Runner) -> int:
    """Which of the runner's outputs the labels belong to: --label-output by name (the model's output name
    or the converted model's signature key); else, with labels keyed per output (y:<output>), the first
    output (in the model's order) that has some; else the first."""
    name = ds.label_output
    names, keys = source_names(ds, runner), runner.output_names()
    if name is None:
        keyed = ds.y_test if isinstance(ds.y_test, dict) else {}
        for n in ds.outputs or names:
            if n in keyed and n in names:
                return names.index(n)
        for i, n in enumerate(keys):
            if n in keyed:
                return i
        return names.index(ds.outputs[0]) if ds.outputs and ds.outputs[0] in names else 0
    if name in keys:
        return keys.index(name)
    if name in names:
        return names.index(name)
    raise DataError(
        f"--label-output {name!r} is not an output of the model ({', '.join(ds.outputs or keys)}).",
        "Name one of its outputs.",
    )


def accuracy_on(ds: Dataset, outs: list[np.ndarray], hs: list[Head], runner: runtime.Runner, n: int) -> Accuracy | None:
    """The task's figures on the labelled output, or None without labels."""
    i = label_index(ds, runner)
    name = source_names(ds, runner)[i]
    y = ds.labels("test", name if isinstance(ds.y_test, dict) else None)
    if y is None and isinstance(ds.y_test, dict) and ds.y_test:
        names = runner.output_names()
        if not set(ds.y_test) & {*names, *ds.outputs}:
            raise DataError(
                f"{ds.source}: labels {', '.join(f'y:{k}' for k in ds.y_test)} name none of the model's outputs "
                f"({', '.join(names)}).",
                "Key labels by the model's output names (y:<output>), or give plain y for the first output.",
            )
    if y is None:
        return None
    y = np.asarray(y)[:n]
    task = tasks.detect(hs[i], y, ds.task)
    if task in (tasks.Task.DETECT, tasks.Task.SEGMENT):
        raise DataError(
            f"{ds.source}: --task {task} compares the model's {task} outputs with float32's; it does not score labels.",
            "Leave the labels out of the data (x only), or pick the task the labels are for.",
        )
    y = tasks.check_labels(task, hs[i], y, "y_test")
    return Accuracy(samples=len(y), task=task, output=name, **tasks.scores(task, outs[i], y, hs[i]))


def fidelity_of(
    outs: list[np.ndarray],
    ref: list[np.ndarray],
    names: list[str],
    reference: str,
    hs: list[Head] | None = None,
    task: str | None = None,
    label_at: int = 0,
    scored: bool = False,
    detector: str | None = None,
    score_threshold: float = detection.DEFAULT_SCORE,
) -> Fidelity:
    """Every output against the reference: mean/std/max |diff|, relative error (per slice where its channels
    carry quantities of different scales: the worst slice's), IoU for masks, argmax agreement where an output is
    classes (a softmax head) and decision agreement at 0.5 where it is yes/no decisions (a sigmoid head that is
    not a mask); for the output the labels or --task describe, `label_at`, the task decides
    (tasks.output_kind). `scored`: that output is scored against labels (marked `labelled`). A detector head
    (recognised from the shapes and the reference's values, or `detector`: the layout named, "" to recognise it
    under --task detect) adds the detections kept against the reference's, at `score_threshold`, on the
    outputs that hold its boxes and scores."""
    layout, found = _detections(outs, ref, names, hs, task, detector, score_threshold)
    named = layout.slices([tuple(b.shape) for b in ref]) if layout else {}
    per = []
    for j, (name, a, b) in enumerate(zip(names, outs, ref)):
        head = hs[j] if hs else None
        o = _one_output(name, a, b, head, tasks.output_kind(head, task if j == label_at else None), named.get(j))
        mine = found if found is not None and j in layout.outputs else None
        if mine is not None:  # a detector's output: judged by its detections, not agreement
            o = o.model_copy(update={"top1_agreement": None, "decision_agreement": None, "exact_agreement": None})
            if layout.entry.selected:  # rows the model selected: a row moved is no error (slot by slot is none)
                o = o.model_copy(update={"relative_error": None, "slices": [], "tensor_relative_error": None})
        per.append(o.model_copy(update={"labelled": scored and j == label_at, "detection": mine}))
    agreements = [o.top1_agreement for o in per if o.top1_agreement is not None]
    return Fidelity(
        reference=reference,
        samples=len(outs[0]) if outs else 0,
        outputs=per,
        top1_agreement=min(agreements) if agreements else None,
    )


def _detections(outs, ref, names, hs, task, detector, threshold):
    """(the detector head among the outputs or None, its detections kept against the reference's or None)."""
    if task == tasks.Task.DETECT and detector is None:
        detector = ""
    roles = [h.role for h in hs] if hs else None
    usable = ref and all(len(b) for b in ref)
    layout = detection.recognise(detection.shapes_of(ref), ref, detector, roles) if usable else None
    if layout is None:
        return None, None
    both = np.logical_and.reduce([_finite_rows(a) & _finite_rows(b) for a, b in zip(outs, ref)])
    return layout, detection.compare([a[both] for a in outs], [b[both] for b in ref], names, layout, threshold)


def _one_output(name: str, a, b, head: Head | None, kind, cut: list | None) -> OutputFidelity:
    """One output against the reference, with the figures of its kind: agreement for classes, decisions at 0.5
    for sigmoid outputs, mask IoU for a segmentation map; cut by scale unless it is one quantity (`cut`: named
    slices)."""
    segment = kind is tasks.Task.SEGMENT
    whole = head is not None and (head.activation == "softmax" or head.is_mask) or segment
    o = _output_fidelity(
        name, a, b, head is not None and head.is_mask, cut if cut is not None else (None if not whole else [])
    )
    update = {
        "top1_agreement": _agreement(a, b) if kind is tasks.Task.CLASSIFICATION else None,
        "decision_agreement": _decisions(a, b, head) if kind in (tasks.Task.BINARY, tasks.Task.MULTILABEL) else None,
    }
    if head is not None and head.index:  # class ids, counts: equal or not, never a mean |difference|
        update = {"exact_agreement": _exact(a, b), "relative_error": None, "slices": [], "tensor_relative_error": None}
    if segment:
        update["iou"] = tasks.segmentation_iou(a, b, head)
        update["sample_iou"] = _sample_iou(a, b, lambda x, y: tasks.segmentation_iou(x, y, head))
    if head is not None and head.is_mask and not segment:
        update["sample_iou"] = _sample_iou(a, b, tasks.mask_iou)
    return o.model_copy(update=update)


def _sample_iou(a: np.ndarray, b: np.ndarray, iou) -> float | None:
    """The worst samples' mask IoU: the 5th percentile of the per-sample IoUs (samples where both are finite and
    either mask has anything), beside the IoU pooled over every pixel of every sample."""
    both = _finite_rows(a) & _finite_rows(b)
    per = [v for x, y in zip(a[both], b[both]) if (v := iou(x[None], y[None])) is not None]
    return float(np.percentile(per, detection.PERCENTILE, method="lower")) if per else None


def _agreement(a: np.ndarray, b: np.ndarray) -> float | None:
    """Top-1 agreement of a class output with the reference's, over the samples where both are finite. A
    sequence of class scores (samples, positions, classes: a CTC recogniser's softmax) agrees position by
    position, as its decoded symbols do."""
    if a.ndim < 2 or a.shape[-1] < 2:
        return None
    both = _finite_rows(a) & _finite_rows(b)
    return float((a[both].argmax(-1) == b[both].argmax(-1)).mean()) if both.any() else None


def _exact(a: np.ndarray, b: np.ndarray) -> float | None:
    """The share of an index output's values (class ids, counts) equal to the reference's, over the samples where
    both are finite."""
    both = _finite_rows(a) & _finite_rows(b)
    return float((np.rint(a[both]) == np.rint(b[both])).mean()) if both.any() and a.size else None


def _decisions(a: np.ndarray, b: np.ndarray, head: Head | None) -> float | None:
    """Decision agreement of a sigmoid output with the reference's: the share of its yes/no decisions at 0.5
    (every unit of every sample where both are finite) that match, as top-1 agreement is for classes."""
    both = _finite_rows(a) & _finite_rows(b)
    if not both.any():
        return None
    head = head or Head(a.shape)
    pa, pb = tasks.probabilities(a[both], head), tasks.probabilities(b[both], head)
    return float(((pa > 0.5) == (pb > 0.5)).mean())


def _finite_rows(a: np.ndarray) -> np.ndarray:
    return np.isfinite(a.reshape(len(a), -1)).all(axis=1) if a.size else np.ones(len(a), bool)


def _output_fidelity(name: str, a: np.ndarray, b: np.ndarray, is_mask: bool, cut: list | None = None) -> OutputFidelity:
    """One output against the reference, over the samples where both are finite; the samples where only
    the reference is finite are counted (a quantized model going NaN where float32 does not). `cut`: the
    output's named slices ([]: measure it whole; None: cut it by scale, `slices.scale_slices`)."""
    mine, theirs = _finite_rows(a), _finite_rows(b)
    both = mine & theirs
    a, b = a[both], b[both]
    d = np.abs(a.astype(np.float64) - b.astype(np.float64))
    whole = tasks.relative_error(a, b) if d.size else None
    parts = slices.slice_errors(a, b, slices.scale_slices(b) if cut is None else cut) if d.size else []
    return OutputFidelity(
        name=name,
        mean_abs_diff=float(d.mean()) if d.size else 0.0,
        std_abs_diff=float(d.std()) if d.size else 0.0,
        max_abs_diff=float(d.max()) if d.size else 0.0,
        relative_error=max([whole, *(p.relative_error for p in parts)]) if parts else whole,
        slices=parts,
        tensor_relative_error=whole if parts else None,
        iou=tasks.mask_iou(a, b) if is_mask and d.size else None,
        nonfinite_samples=int((~mine & theirs).sum()),
    )


def compare(acc: Accuracy | None, base: Accuracy | None) -> dict:
    """The change against the float baseline: points for classes, an error ratio for regression."""
    if acc is None or base is None:
        return {}
    if acc.top1 is not None and base.top1 is not None:
        return {"accuracy_delta": acc.top1 - base.top1}
    if acc.mae is not None and base.mae:
        return {"error_ratio": acc.mae / base.mae}
    return {}


@dataclasses.dataclass(frozen=True)
class Scorer:
    """Outputs of one candidate on the samples `xs` -> (its Fidelity to the reference outputs `ref`, its
    Accuracy with labels, the change against the baseline's): the one measure the CPU's figures and those in
    another arithmetic (the GPU's, emulated or observed) share."""

    ds: Dataset
    xs: object
    ref: list[np.ndarray]
    names: list[str]
    reference: str
    hs: list[Head]
    task: str | None
    label_at: int
    baseline: Accuracy | None
    contract: OutputContract | None = None  # undone on outputs computed elsewhere (the GPU's arithmetic)

    def fidelity(self, outs: list[np.ndarray], acc: Accuracy | None) -> Fidelity:
        return fidelity_of(
            outs, self.ref, self.names, self.reference, self.hs, self.task, self.label_at, acc is not None
        )

    def __call__(self, outs: list[np.ndarray], runner: runtime.Runner):
        outs = self.contract.restore(outs) if self.contract is not None else outs
        a = accuracy_on(self.ds, outs, self.hs, runner, count(self.xs))
        return self.fidelity(outs, a), a, compare(a, self.baseline)


def _scorer_of(ds, xs, outs, hs, runner, acc, reference, path, threads, baseline) -> Scorer:
    """The Scorer of a candidate being evaluated (its reference's outputs; its own without one: the baseline)."""
    ref = _reference_outputs(Path(reference), xs, threads) if reference is not None else outs
    task = acc.task if acc else ds.task
    name = Path(reference or path).name
    return Scorer(ds, xs, ref, source_names(ds, runner), name, hs, task, label_index(ds, runner), baseline or acc)


def scorer(
    model: str | Path, ds: Dataset, reference: str | Path, threads: int = 2, samples: int | None = DEFAULT_SAMPLES,
    baseline_accuracy: Accuracy | None = None,
) -> tuple[Scorer, runtime.Runner]:  # fmt: skip
    """The Scorer a sweep measured `model` with (the same samples, reference outputs, names and task), and the
    model's CPU runner (its inputs' and outputs' types and order)."""
    runner = runtime.Runner(runtime.load(model, threads=threads, like=take(ds.x_test, slice(0, 1))))
    ds, _ = measured_split(ds, samples, runner)
    xs = ds.x_test
    ref = _reference_outputs(Path(reference), xs, threads)
    hs = heads(Path(model), runner)
    acc = accuracy_on(ds, ref, hs, runner, count(xs))
    task = acc.task if acc else ds.task
    names = source_names(ds, runner)
    score = Scorer(ds, xs, ref, names, Path(reference).name, hs, task, label_index(ds, runner), baseline_accuracy)
    return score, runner


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
    loaded: runtime.Loaded | None = None,
    on_target: bool | str = True,
    digest: str | None = None,
    contract: OutputContract | None = None,
) -> Metrics:
    """Every measurement of one .tflite. Without data, latency and memory use a zero input.

    `reference` is the float model to compare outputs with (inference_diff-style fidelity), on the data's
    test inputs (every one, or `samples` of them: a stratified sample, `measured_split`; `metrics.test` says
    which): without data there is no fidelity (`optimize evaluate` refuses --reference without --data).
    `baseline_accuracy` (the float model's on the same data) fills `accuracy_delta` or `error_ratio`.
    `timing=False` leaves latency and memory to `add_timing`, so a sweep can time every candidate
    on a quiet machine after the parallel work is done. `loaded`: the model's interpreter, when the
    caller has one (`runtime.load(model, threads=threads)`), so it is built once. `digest`: the file's sha256,
    when this process ran these bytes on some of the samples already (`runtime.Runner`). `on_target`: with a
    reference, also the figures in the GPU's arithmetic (`metrics.on_target.gpu`, emulated on the CPU); "self":
    the model is the reference (the float32 baseline), its GPU figures against its own CPU outputs. `contract`:
    how the model's outputs differ from the reference's by design (a YOLO head's boxes normalised), undone
    before anything is compared.
    """
    path = Path(model)
    _check_tflite(path)
    ds = _dataset(data)
    like = take(ds.x_test, slice(0, 1)) if ds is not None else None
    runner = runtime.Runner(loaded or runtime.load(path, threads=threads, like=like), digest=digest)
    acc = fid = xs = gpu = test = None
    if ds is not None:
        check_inputs(ds, runner_specs(runner))
        ds, test = measured_split(ds, samples, runner)
        xs = ds.x_test
        outs = _predict(runner, xs, path, ds.source)
        outs = contract.restore(outs) if contract is not None else outs
        hs = heads(path, runner)
        acc = accuracy_on(ds, outs, hs, runner, count(xs))
        if reference is not None or on_target == "self":
            score = _scorer_of(ds, xs, outs, hs, runner, acc, reference, path, threads, baseline_accuracy)
            score = dataclasses.replace(score, contract=contract)
            fid = score.fidelity(outs, acc)
            if on_target:
                gpu = emulated(path, xs, score, threads, cpu=(fid, acc, compare(acc, score.baseline)))
            fid = fid if reference is not None else None
    metrics = Metrics(
        size=size_of(path),
        accuracy=acc,
        fidelity=fid,
        on_target=OnTarget(gpu=gpu) if gpu is not None else None,
        test=test,
        **compare(acc, baseline_accuracy),
    )
    if timing:
        sample = take(xs, slice(0, 1)) if xs is not None else None
        metrics = add_timing(metrics, path, sample, threads=threads, runs=runs, warmup=warmup, memory=memory)
    return metrics


INVOKE_FIX = "If its float model runs on the same input, the quantization broke it: try `optimize debug`."


def _predict(runner: runtime.Runner, xs, path: Path, source: str) -> list[np.ndarray]:
    """runner.predict, with a failure to invoke told in one line: the model, the sample, the node and op."""
    try:
        return batched.predict(path, runner, xs, runner.loaded.threads)
    except runtime.InvokeError as e:
        where = f"test sample {e.sample} of {Path(source).name}" if e.sample is not None else Path(source).name
        raise runtime.InvokeError(
            e.failure, f"{path.name} fails to invoke on {where}: {e.failure}.", INVOKE_FIX, e.sample
        ) from None


def runner_specs(runner: runtime.Runner) -> list:
    """The runner's inputs as model InputSpecs (name, shape, dtype), to check data against. A quantized
    integer input takes float data (the runner quantizes it with the input's scale, 0..255 pixels into an
    int8 input included), so float is what the data is checked against there."""
    from optimize.models.source import InputSpec

    def dtype(d: dict) -> str:
        quantized = np.issubdtype(d["dtype"], np.integer) and bool(d.get("quantization", (0.0, 0))[0])
        return "float32" if quantized else np.dtype(d["dtype"]).name

    return [
        InputSpec(n, tuple(int(x) for x in d.get("shape_signature", d["shape"])), dtype(d))
        for n, d in zip(runner.input_names, runner.inputs)
    ]


def _latency(loaded: tuple[float, bool], threads: int, t: dict) -> Latency:
    """A latency record from timing figures and the first load's (init_ms, XNNPACK applied)."""
    init_ms, xnnpack = loaded
    return Latency(runtime=runtime.runtime_label(), threads=threads, xnnpack=xnnpack, init_ms=init_ms, **t)


def _invoke_problem(model: str | Path, sample, e: runtime.InvokeError) -> runtime.InvokeError:
    what = "an all-zero input (no data given)" if sample is None else "the sample timed"
    return runtime.InvokeError(e.failure, f"{Path(model).name} fails to invoke on {what}: {e.failure}.", INVOKE_FIX)


def _runner(model: str | Path, threads: int, sample) -> runtime.Runner:
    return runtime.Runner(runtime.load(model, threads=threads, like=sample))


def time_many(
    models: list[str | Path],
    sample: np.ndarray | None = None,
    threads: int = 2,
    runs: int = 50,
    warmup: int = 5,
    rounds: int = timing.ROUNDS,
    settle: bool = True,
) -> list[Latency | ModelError]:
    """Latency of several .tflite files timed round-robin (optimize.measure.timing), so machine drift hits all
    alike, each block on a fresh interpreter; a model the runtime cannot load or run gives its ModelError
    instead (the others are timed). `settle`: stop once more rounds could not change a comparison (a sweep);
    otherwise every round and all `runs` (a model measured on its own, as asked)."""
    out: list[Latency | ModelError | None] = [None] * len(models)
    first: dict[int, tuple[tuple[float, bool], object]] = {}  # the first load's (init_ms, XNNPACK), the sample
    for i, model in enumerate(models):
        try:
            runner = _runner(model, threads, sample)
        except ModelError as e:
            out[i] = e
            continue
        first[i] = ((runner.loaded.init_ms, runner.loaded.xnnpack), runner.zeros() if sample is None else sample)
        del runner  # the interpreter goes; timing builds its own
    idx = list(first)
    loaders = [functools.partial(_runner, models[i], threads, sample) for i in idx]
    samples = [first[i][1] for i in idx]
    stats = timing.time_rounds(loaders, samples, warmup=warmup, runs=runs, rounds=rounds, settle=settle)
    for i, t in zip(idx, stats):
        if isinstance(t, runtime.InvokeError):
            out[i] = _invoke_problem(models[i], sample, t)
        elif isinstance(t, ModelError):
            out[i] = t
        elif isinstance(t, Exception):
            raise t
        else:
            out[i] = _latency(first[i][0], threads, t)
    return out


def add_timing(
    metrics: Metrics,
    model: str | Path,
    sample: np.ndarray | None = None,
    threads: int = 2,
    runs: int = 50,
    warmup: int = 5,
    memory: bool = True,
    sequential: bool = False,
) -> Metrics:
    """Latency and peak memory of one .tflite, added to its metrics. `sequential`: the older timing, one
    block of runs (`time_invoke`), without rounds or an interval (kept for comparison)."""
    if sequential:
        runner = runtime.Runner(runtime.load(model, threads=threads, like=sample))
        try:
            t = time_invoke(runner, runner.zeros() if sample is None else sample, warmup=warmup, runs=runs)
        except runtime.InvokeError as e:
            raise _invoke_problem(model, sample, e) from None
        latency = _latency((runner.loaded.init_ms, runner.loaded.xnnpack), threads, t)
    else:
        latency = time_many([model], sample, threads, runs, warmup, settle=False)[0]
        if isinstance(latency, ModelError):
            raise latency
    metrics = metrics.model_copy(update={"latency": latency, "memory": None})
    return add_memory(metrics, model, threads, sample) if memory else metrics


def add_memory(metrics: Metrics, model: str | Path, threads: int = 2, sample=None) -> Metrics:
    """Peak memory of one .tflite (optimize.measure.memory), added to its metrics, or why it was not measured."""
    peak = peak_memory_bytes(model, threads, sample)
    return metrics.model_copy(
        update={
            "memory": Memory(peak_rss_bytes=peak) if isinstance(peak, int) else None,
            "memory_error": peak if isinstance(peak, str) else None,
        }
    )

"""The memory a sweep works within, and what each of its tasks is estimated to need before it starts.

A worker process is admitted to a task only while the process tree's memory, what the running tasks may still
add, and the new task's estimate fit the budget (`optimize.engine.executors.ProcessExecutor`); a model whose
single largest task cannot fit is refused in one line before any work (`refuse_if_too_big`). The budget is
`--max-memory` when stated, else what the machine has free when the run starts (`footprint.available_bytes`).

A task's estimate grows with the model's weights (the bytes of its file: `weights_bytes`) by what the task does
(`work_of`): it converts the source with TensorFlow (the float32 baseline of a Keras model or SavedModel, a scheme
the TFLite converter makes), fine-tunes it (prune, cluster, QAT), or quantizes and measures a float .tflite with
LiteRT, plus the data every worker holds and what a fresh worker costs. The factors are the peaks measured on
seeded Keras attention encoders and CNNs (benchmarks/bench_scale.py; FACTORS below says which), rounded up.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path

from optimize.core.errors import OptimizeError
from optimize.measure import footprint

#: A fresh worker process (Python, numpy, the LiteRT runtime, LiteRT Quantizer, the pipeline) before any task.
WORKER_BYTES = 600 * 10**6
#: What importing TensorFlow and Keras adds to a process.
TF_BYTES = 700 * 10**6
#: A task's peak above an idle worker, per byte of the model's weights, by what it does (measured on encoders of
#: 45-434 MB and ResNet-50: see the module's docstring). "open" is the opener process's peak above TensorFlow's
#: import (Keras load, the checks on test samples, the SavedModel export) and "convert" the float32 conversion
#: of that SavedModel in a process that never loaded the Keras model, both measured with /proc's VmHWM per step
#: (issue 44, one fresh process per step): the 8x512 encoder (165 MB) opened at 5.5x, converted at 8.2x; the
#: 12x768 one (437 MB) at 4.4x and 7.5x. The direct route (converting in the opener, on top of the
#: loaded model) took 18-19x: a model above DIRECT_BYTES never takes it (`runs.Run.export`). "train" was not measured
#: again: a fine-tuning ends with the same conversion in its worker, so it is put above "convert".
FACTORS = {"open": 6.0, "convert": 9.0, "train": 10.0, "quantize": 5.0, "time": 4.0}
#: A Keras model of at most this is converted straight from the model its checks loaded (`convert.keras.
#: float32_direct`: about 2x less work than the SavedModel round trip); a bigger one is exported as a SavedModel
#: and converted by the baseline's worker after the opener left, so loading and converting never stack.
DIRECT_BYTES = 64 * 10**6
#: A worker holding more than this when it goes idle leaves (its memory goes back to the system); another starts
#: for the next task. Below it a worker is kept: starting one costs seconds.
RETIRE_BYTES = 1_500 * 10**6
#: A model this small is opened in the sweep's own process when that process imported TensorFlow already (an API
#: caller): an opener process would import it again (seconds) to spare less memory than that.
OPEN_HERE_BYTES = 64 * 10**6


class TooBig(OptimizeError):
    """A model whose work cannot fit the memory budget."""


@dataclass(frozen=True)
class Budget:
    """The bytes a run's process tree may hold, and where the figure comes from."""

    bytes: int
    stated: bool = False  # --max-memory, else what the machine had free when the run started

    def describe(self) -> str:
        return f"{footprint.gb(self.bytes)} ({'--max-memory' if self.stated else 'free when the run started'})"


def budget(max_memory: int | None = None) -> Budget:
    """The run's budget: `max_memory` bytes when stated, else what the machine has free now."""
    if max_memory is not None:
        return Budget(int(max_memory), stated=True)
    return Budget(footprint.available_bytes())


def weights_bytes(model) -> int:
    """Bytes of a model's weights, as its file holds them: a file's size, a SavedModel folder's files together,
    an opened source's normalised .tflite (0 when there is no file to read: the built-in demo, an nn.Module)."""
    content = getattr(model, "content", None)
    if content is not None:
        return len(content)
    path = getattr(model, "path", model)
    if path is None or not isinstance(path, (str, os.PathLike)):
        return 0
    p = Path(path)
    if p.is_file():
        return p.stat().st_size
    if p.is_dir():
        return sum(f.stat().st_size for f in p.rglob("*") if f.is_file() and not f.is_symlink())
    return 0


def converts_directly(weights: int, folder: bool = False) -> bool:
    """Whether a Keras model with `weights` bytes of weights has its float32 baseline converted straight from the
    model its checks loaded (at most DIRECT_BYTES), not from its SavedModel in the baseline's worker: the one rule
    the opener (`runs.Run.export`), the baseline's worker (`pipeline.Workspace`) and the warm spare
    (`executors.spare`) follow. A SavedModel (`folder`) is never converted directly."""
    return not folder and weights <= DIRECT_BYTES


def data_bytes(ds) -> int:
    """Bytes of a dataset's arrays (every worker holds its own copy)."""
    if ds is None:
        return 0
    seen: dict[int, int] = {}  # splits can share arrays (x_cal is x_test when there is no other split)
    for value in vars(ds).values():
        for a in value.values() if isinstance(value, dict) else [value]:
            seen[id(a)] = int(getattr(a, "nbytes", 0) or 0)
    return sum(seen.values())


def work_of(task) -> str:
    """What a production task does that decides its memory: "train" (a Keras step fine-tunes the model),
    "convert" (TensorFlow converts the source: a Keras model or SavedModel not exported already, a scheme the
    TFLite converter makes, or one LiteRT Quantizer makes from such a source, which falls back to the converter
    when LiteRT's result fails its checks) or "quantize" (LiteRT works on a float .tflite)."""
    src = task.src
    seeded = tuple(task.start[0]) if task.start else ()
    for r in task.recipes:
        if r.trains:
            return "train"
        if src.flat:
            continue
        if seeded and tuple(r.steps[: len(seeded)]) == seeded:
            if r.made_by == "litert" and not r.uses("selective"):
                return "convert"  # the converter's route is tried when LiteRT Quantizer's result fails
            continue
        first = r.steps[0]
        plain = first.technique == "convert" and getattr(first.params, "scheme", "float32") == "float32"
        if not (plain and task.exported is not None and Path(task.exported).suffix == ".tflite"):
            return "convert"
    return "quantize"


def need(work: str, weights: int, data: int = 0) -> int:
    """A task's estimated peak above an idle worker (bytes): its work's factor times the weights, the data, and
    TensorFlow's import (every kind may import it: int8's calibrator route does)."""
    return int(FACTORS[work] * weights) + data + TF_BYTES


def task_need(task) -> int:
    """`need` for a production task (`work.Task`), from the model and data it carries; a fine-tuning's also counts
    its batch's activations (`training_activations`)."""
    work = work_of(task)
    extra = training_activations(task) if work == "train" else 0
    return need(work, task.weights, data_bytes(task.data)) + extra


#: A fine-tuning holds about this many times its batch's forward activations (the activations kept for the
#: backward pass, their gradients, fake-quant copies under QAT): ResNet-50's QAT at batch 32 (70 MB of
#: activations a sample) held 7.1 GB in its worker, where its weights alone (95 MB x FACTORS["train"]) said 2.3 GB.
TRAIN_ACTIVATIONS = 3.0
#: The batch a fine-tuning step uses when its parameters say none (tfmot steps' default).
TRAIN_BATCH = 32


def training_activations(task) -> int:
    """What a fine-tuning task's batches add beyond its weights: TRAIN_ACTIVATIONS x the largest batch its steps use
    x one sample's activations (`activation_bytes` of its float32 baseline, the `reference` the task carries; 0
    before there is one)."""
    ref = getattr(task, "reference", None)
    if ref is None or not Path(ref).is_file():
        return 0
    from optimize.core.recipe import Stage

    steps = [s for r in task.recipes for s in r.steps if s.stage is Stage.KERAS]
    batch = max((getattr(s.params, "batch_size", 0) or TRAIN_BATCH for s in steps), default=TRAIN_BATCH)
    return int(TRAIN_ACTIVATIONS * batch * activation_bytes(Path(ref)))


def cannot_train(task, limit: Budget | None) -> str | None:
    """Why a fine-tuning task cannot fit the budget even alone (its weights and its batches' activations, known once
    the baseline is made), or None: such a task is never started (its candidates fail with this reason), since
    admission starts the first task whatever its size when nothing else runs."""
    if limit is None or work_of(task) != "train":
        return None
    total = WORKER_BYTES + task_need(task)
    if total <= limit.bytes:
        return None
    return (
        f"fine-tuning needs about {footprint.gb(total)} (its batches' activations "
        f"{footprint.gb(training_activations(task))} of it), more than the memory budget of {limit.describe()}: "
        "give it more (--max-memory) or a smaller batch_size"
    )


def activation_bytes(tflite: Path) -> int:
    """One sample's activations in a float .tflite: the bytes of its main graph's non-constant tensors at batch 1
    (a free dimension counted as 1), read from the file's structure (no interpreter)."""
    st = tflite.stat()
    return _activation_bytes(str(tflite), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _activation_bytes(path: str, size: int, mtime: int) -> int:
    from optimize.models.tflite import read_model

    total = 0
    for t in read_model(path).main.tensors:
        if t.is_const:
            continue
        n = 1
        for d in t.shape or ():
            n *= max(1, int(d))
        total += n * _ITEM_BYTES.get(str(t.dtype), 4)
    return total


_ITEM_BYTES = {"float64": 8, "int64": 8, "float16": 2, "int16": 2, "int8": 1, "uint8": 1, "bool": 1}


def opening_need(weights: int, data: int = 0) -> int:
    """The opener process's estimated peak (`executors.Opener`: a worker's imports, TensorFlow, the Keras model
    loaded, checked and exported) with the warm spare worker that starts beside it."""
    return 2 * WORKER_BYTES + need("open", weights, data)


def refuse_if_too_big(model, weights: int, work: str, limit: Budget, data: int = 0) -> None:
    """One line, before any work, when the model's largest task (`work`: what its first task does) cannot fit the
    budget with the process that runs it: naming the model's size, the estimate and the budget. A conversion
    counts its opening too (`opening_need`: the opener has left before the conversion starts, so the larger)."""
    total = WORKER_BYTES + need(work, weights, data)
    if work == "convert":
        total = max(total, opening_need(weights, data))
    if total <= limit.bytes:
        return
    doing = {"convert": "open and convert", "train": "fine-tune", "quantize": "quantize and measure"}[work]
    name = Path(str(getattr(model, "path", model))).name
    raise TooBig(
        f"{name} ({footprint.gb(weights)} of weights) needs about {footprint.gb(total)} to {doing}, more than the "
        f"memory budget of {limit.describe()}.",
        "Free memory, or run it where more is free (--max-memory states the budget).",
    )


class Admission:
    """Which queued task may start now. With a budget, the first in the queue whose estimate fits: what the process
    tree holds now (`footprint.tree_memory`'s PSS: a page a quantizer's fork shares with its worker counted once),
    plus what each running task may still add (its estimate less what its worker has grown by since it took it),
    plus the task's own estimate (and a fresh worker's, when one must be started) must not pass the budget. When nothing runs the first task always starts (a model whose largest task
    cannot fit was refused before any work: `refuse_if_too_big`). Without a budget, the first task."""

    def __init__(self, limit: Budget | None) -> None:
        self.limit = limit

    def first_fitting(self, queue: list, running: list[tuple[int, int, int]], spawn: bool) -> int | None:
        """The index in `queue` of the task to start, or None to wait for a running one to end. `running`: (pid,
        estimate, its RSS when it took the task) per busy worker; `spawn`: no idle worker, a new one would start."""
        if not queue:
            return None
        if self.limit is None or not running:
            return 0
        room = self.limit.bytes - self._taken(running) - (WORKER_BYTES if spawn else 0)
        return next((i for i, task in enumerate(queue) if task_need(task) <= room), None)

    def room_for_worker(self, queue: list, running: list[tuple[int, int, int]], warm: str = "") -> bool:
        """Whether a worker started ahead of its task (`ProcessExecutor.expect`) fits beside what runs and what is
        queued (each task's estimate counted in full): idle, it holds its imports (TensorFlow's too when `warm` is
        "tf"). A BERT-base-sized baseline's conversion leaves no room for one under a 5.75 GB budget: the tree held
        an idle 1.2 GB worker beside the converting one."""
        if self.limit is None:
            return True
        idle = WORKER_BYTES + (TF_BYTES if warm == "tf" else 0)
        return self._taken(running) + sum(task_need(t) for t in queue) + idle <= self.limit.bytes

    @staticmethod
    def _taken(running: list[tuple[int, int, int]]) -> int:
        """What the tree holds now (PSS) plus what each running task may still add (its estimate less what its
        worker has grown by since it took it)."""
        still = sum(max(0, est - max(0, footprint.rss(pid) - base)) for pid, est, base in running)
        return footprint.tree_memory(os.getpid())[1] + still


def recipe_work(recipe, src, baseline=None) -> str:
    """What producing one recipe of a run does, before it is a task (`work_of` without its seeds): fine-tunes,
    converts the source with TensorFlow, or quantizes a float .tflite (the source's, or the baseline's)."""
    from optimize.engine.plan import from_baseline

    if recipe.trains:
        return "train"
    if src.flat or (recipe.made_by != "litert" and baseline is not None and from_baseline(recipe, baseline)):
        return "quantize"
    return "convert"  # LiteRT Quantizer's recipes on such a source fall back to the converter (`work_of`)


def too_big(run, limit: Budget | None) -> list:
    """The recipes of a run whose work cannot fit the budget (a fine-tuning of a model whose conversion fits), each
    with why: left out of the run, said once, never admitted past the budget. The run keeps the rest."""
    if limit is None:
        return []
    data = data_bytes(run.ds)
    out = []
    for r in run.recipes:
        work = recipe_work(r, run.src, run.baseline)
        total = WORKER_BYTES + need(work, run.footprint, data)
        if total > limit.bytes:
            doing = {"convert": "convert", "train": "fine-tune", "quantize": "quantize and measure"}[work]
            out.append(
                (r, f"needs about {footprint.gb(total)} to {doing}, more than the memory budget of {limit.describe()}")
            )
    return out

"""The only place that builds a LiteRT interpreter: load, feed (quantizing I/O), invoke, time, measure memory.

Uses `ai_edge_litert.interpreter` (no TensorFlow import, ~0.1 s). XNNPACK is applied by default, as in
the shipped runtime; every figure records the thread count and whether XNNPACK was on.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import numpy as np

from .errors import ModelError


def runtime_label() -> str:
    try:
        return f"ai-edge-litert {metadata.version('ai-edge-litert')} (host CPU)"
    except metadata.PackageNotFoundError:
        return "ai-edge-litert (host CPU)"


@contextlib.contextmanager
def captured_stderr():
    """Capture what the C++ runtime writes to fd 2 (delegate logs, errors) into a list of lines."""
    lines: list[str] = []
    sys.stderr.flush()
    with tempfile.TemporaryFile() as tmp:
        saved = os.dup(2)
        os.dup2(tmp.fileno(), 2)
        try:
            yield lines
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            lines.extend(tmp.read().decode(errors="replace").splitlines())


def _interpreter_class():
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    return Interpreter, OpResolverType


@dataclass
class Loaded:
    interpreter: object
    init_ms: float
    log: list[str]
    xnnpack: bool
    threads: int


def describe(model: bytes):
    """An interpreter that is built but not allocated: enough to read ops, tensors and signatures, even of a
    model whose custom ops this runtime lacks (allocation is where those fail)."""
    Interpreter, OpResolverType = _interpreter_class()
    with captured_stderr():
        try:
            return Interpreter(
                model_content=model, experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES
            )
        except (ValueError, RuntimeError) as e:
            reason = str(e).strip().splitlines()[-1] if str(e).strip() else e.__class__.__name__
            raise ModelError(f"This is not a readable .tflite ({reason}).", "Pass a float32 .tflite model.") from None


def signature_key(it) -> str | None:
    """The signature optimize reads a model through: serving_default, else the first by name (None: none)."""
    sigs = it.get_signature_list()
    if not sigs:
        return None
    return "serving_default" if "serving_default" in sigs else sorted(sigs)[0]


def loads(model: str | Path | bytes) -> bool:
    """Whether this runtime can prepare the model (False for custom ops it lacks, for one)."""
    try:
        load(model, threads=1, xnnpack=False)
    except ModelError:
        return False
    return True


def load(model: str | Path | bytes, threads: int = 2, xnnpack: bool = True, keep_tensors: bool = False) -> Loaded:
    """Build and allocate an interpreter. A model the runtime rejects is a ModelError with its reason.

    `keep_tensors` keeps every intermediate tensor readable after invoke (the runtime's
    preserve-all-tensors mode, for per-layer debugging; it costs memory, and XNNPACK is then off).
    """
    Interpreter, OpResolverType = _interpreter_class()
    kwargs: dict = {"num_threads": threads}
    if keep_tensors:
        kwargs["experimental_preserve_all_tensors"] = True
        xnnpack = False
    if isinstance(model, bytes):
        kwargs["model_content"] = model
    else:
        kwargs["model_path"] = str(model)
    if not xnnpack:
        kwargs["experimental_op_resolver_type"] = OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES
    t0 = time.perf_counter()
    with captured_stderr() as log:
        try:
            it = Interpreter(**kwargs)
            it.allocate_tensors()
        except (ValueError, RuntimeError) as e:
            err = None
            errs = [ln for ln in log if "ERROR" in ln or "failed" in ln.lower()]
            err = errs[-1].strip() if errs else str(e).strip().splitlines()[-1]
            raise ModelError(f"The LiteRT runtime cannot load this model: {err}") from None
    init_ms = (time.perf_counter() - t0) * 1000
    used_xnn = xnnpack and any(d["op_name"] == "DELEGATE" for d in it._get_ops_details())
    return Loaded(it, init_ms, log, used_xnn, threads)


def _to_input(x: np.ndarray, detail: dict) -> np.ndarray:
    """Cast or quantize one float sample to what the input tensor wants (integer-only I/O models)."""
    dtype = detail["dtype"]
    x = np.asarray(x)
    if np.issubdtype(dtype, np.integer) and not np.issubdtype(x.dtype, np.integer):
        scale, zero = detail["quantization"]
        if scale:
            info = np.iinfo(dtype)
            x = np.clip(np.round(x / scale + zero), info.min, info.max)
    return x.astype(dtype).reshape(detail["shape"])


def _from_output(y: np.ndarray, detail: dict) -> np.ndarray:
    """Dequantize an integer output back to float, so accuracy and fidelity compare like with like."""
    scale, zero = detail["quantization"]
    if np.issubdtype(y.dtype, np.integer) and scale:
        return (y.astype(np.float32) - zero) * scale
    return y.astype(np.float32)


class Runner:
    """Feeds float samples one at a time and returns float outputs, whatever the model's I/O types.

    Inputs and outputs are addressed through the model's signature when it has one: inputs by their
    signature keys (a Keras model's input names), outputs in signature order (output_0, output_1, ...:
    the Keras model's output order). The interpreter's own tensor order is neither.
    """

    def __init__(self, loaded: Loaded):
        self.loaded = loaded
        it = loaded.interpreter
        self.it = it
        key = signature_key(it)
        if key is not None:
            sigs = it.get_signature_list()
            sig = it.get_signature_runner(key)
            ins, outs = sig.get_input_details(), sig.get_output_details()
            self.input_names = list(sigs[key]["inputs"])
            self.inputs = [ins[n] for n in self.input_names]
            self.keys = list(sigs[key]["outputs"])
            self.outputs = [outs[n] for n in self.keys]
        else:
            self.inputs, self.outputs = it.get_input_details(), it.get_output_details()
            self.input_names = [d["name"] for d in self.inputs]
            self.keys = [d["name"] for d in self.outputs]

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(int(d) for d in self.inputs[0]["shape"])

    def output_names(self) -> list[str]:
        """The outputs' names, in signature order (the keys when the model has a signature)."""
        return list(self.keys)

    def zeros(self) -> list[np.ndarray]:
        """An all-zero sample for every input (for timing without data)."""
        return [np.zeros(d["shape"], np.float32) for d in self.inputs]

    def _ordered(self, sample) -> list:
        if isinstance(sample, dict):
            missing = [n for n in self.input_names if n not in sample]
            if missing:
                raise ModelError(
                    f"No data for the model's input {missing[0]!r} (it takes {', '.join(self.input_names)})."
                )
            return [sample[n] for n in self.input_names]
        return list(sample) if isinstance(sample, (list, tuple)) else [sample]

    def set_input(self, sample) -> None:
        """One sample (batch of 1): an array, a list in input order, or a dict keyed by input name."""
        samples = self._ordered(sample)
        if len(samples) != len(self.inputs):
            raise ModelError(f"The model has {len(self.inputs)} inputs; got {len(samples)}.")
        for x, d in zip(samples, self.inputs):
            expected = int(np.prod(d["shape"]))
            if np.asarray(x).size != expected:
                raise ModelError(
                    f"A sample of shape {np.asarray(x).shape} does not fit input {d['name']} {list(d['shape'])}."
                )
            self.it.set_tensor(d["index"], _to_input(x, d))

    def run(self, sample) -> list[np.ndarray]:
        self.set_input(sample)
        self.it.invoke()
        return [_from_output(self.it.get_tensor(d["index"]), d)[0] for d in self.outputs]

    def run_fresh(self, sample) -> list[np.ndarray]:
        """`run` from a clean state: variable tensors (an RNN's state) reset first, so samples do not leak."""
        self.it.reset_all_variables()
        return self.run(sample)

    def predict(self, xs, limit: int | None = None) -> list[np.ndarray]:
        """Outputs for each sample of xs (an array, or a dict of arrays keyed by input name; first axis:
        samples), each from a clean state, stacked per output."""
        from .data import count, take

        n = count(xs) if limit is None else min(limit, count(xs))
        outs = [self.run_fresh(take(xs, slice(i, i + 1))) for i in range(n)]
        return [np.stack([o[j] for o in outs]) for j in range(len(self.outputs))]


def time_invoke(runner: Runner, sample: np.ndarray, warmup: int = 5, runs: int = 50, budget_s: float = 1.0) -> dict:
    """Latency the way benchmark_model reports it: first inference, warm-up, then steady-state stats.

    Timed runs stop at `runs` or once `budget_s` is spent (at least 5), so slow reference kernels
    (int16x8) do not stall a sweep; the count actually run is recorded.
    """
    runner.set_input(sample)
    t0 = time.perf_counter()
    runner.it.invoke()
    first_ms = (time.perf_counter() - t0) * 1000
    warmup = warmup if first_ms < 100 else min(warmup, 1)
    for _ in range(warmup):
        runner.it.invoke()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < runs and (len(times) < 5 or time.perf_counter() - start < budget_s):
        t0 = time.perf_counter()
        runner.it.invoke()
        times.append((time.perf_counter() - t0) * 1000)
    times.sort()
    return {
        "first_ms": first_ms,
        "warmup_runs": warmup,
        "runs": len(times),
        "mean_ms": statistics.fmean(times),
        "std_ms": statistics.pstdev(times),
        "p25_ms": times[len(times) // 4],
        "p50_ms": times[len(times) // 2],
        "p75_ms": times[min(len(times) - 1, (3 * len(times)) // 4)],
        "p90_ms": times[min(len(times) - 1, int(len(times) * 0.9))],
        "min_ms": times[0],
    }


def peak_memory_bytes(model: str | Path, threads: int = 2) -> int | None:
    """Peak RSS growth of loading, allocating and running one model once, in a fresh process."""
    return peak_memory_many([model], threads)[0]


def peak_memory_many(models: list[str | Path], threads: int = 2) -> list[int | None]:
    """Peak RSS growth per model, from one child process that forks a fresh grandchild per model.

    A separate process is the only honest way to get a peak (ru_maxrss never goes down in ours);
    forking per model from one runtime-importing process costs milliseconds instead of a Python start.
    """
    try:
        out = subprocess.run(
            [sys.executable, "-m", "optimize.runtime", str(threads), *map(str, models)],
            capture_output=True,
            text=True,
            timeout=300 + 60 * len(models),
        )
        peaks = json.loads(out.stdout.strip().splitlines()[-1])
        return [int(p) if p is not None else None for p in peaks]
    except (subprocess.SubprocessError, ValueError, IndexError, TypeError):
        return [None] * len(models)


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def _probe_one(path: str, threads: int) -> int:
    """In a fresh fork: reset the high-water mark, then load, allocate and run once; the growth in KiB."""
    Interpreter, _ = _interpreter_class()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS
    except OSError:
        pass
    base = _status_kb("VmRSS")
    with captured_stderr():
        it = Interpreter(model_path=path, num_threads=threads)
        it.allocate_tensors()
        for d in it.get_input_details():
            it.set_tensor(d["index"], np.zeros(d["shape"], d["dtype"]))
        it.invoke()
    return max(0, _status_kb("VmHWM") - base)


def _probe(threads: int, paths: list[str]) -> None:
    """Child-process body: one forked grandchild per model, each reporting its peak through a pipe."""
    _interpreter_class()  # import the runtime once, before forking
    peaks: list[int | None] = []
    for path in paths:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            try:
                kib = _probe_one(path, threads)
                os.write(w, str(kib * 1024).encode())
            finally:
                os._exit(0)
        os.close(w)
        with os.fdopen(r) as f:
            text = f.read()
        os.waitpid(pid, 0)
        peaks.append(int(text) if text.strip() else None)
    print(json.dumps(peaks))


if __name__ == "__main__":
    _probe(int(sys.argv[1]), sys.argv[2:])

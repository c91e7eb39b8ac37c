"""Peak memory of a model, measured honestly: load, allocate and run it once in a fresh process.

A separate process is the only honest way to get a peak (ru_maxrss never goes down in ours): one child
process imports the runtime once, then forks a grandchild per model (`python -m optimize.measure.memory`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from optimize.core.errors import ModelError
from optimize.models.runtime import Loaded, Runner, _interpreter_class, captured_stderr, resize_to


def peak_memory_bytes(model: str | Path, threads: int = 2, sample=None) -> int | str:
    """Peak RSS growth of loading, allocating and running one model once, in a fresh process (or why
    it could not be measured, in one line)."""
    return peak_memory_many([model], threads, sample)[0]


def peak_memory_many(models: list[str | Path], threads: int = 2, sample=None) -> list[int | str]:
    """Peak RSS growth per model (`peak_memory_timed` without the time it took)."""
    return peak_memory_timed(models, threads, sample)[0]


def peak_memory_timed(models: list[str | Path], threads: int = 2, sample=None) -> tuple[list[int | str], float]:
    """Peak RSS growth per model, from one child process that forks a fresh grandchild per model, and the
    wall seconds the probe took in all.

    A separate process is the only honest way to get a peak (ru_maxrss never goes down in ours);
    forking per model from one runtime-importing process costs milliseconds instead of a Python start.
    Each model runs once on `sample` (the sample latency is timed on; zeros without one). A model that
    cannot be measured gets the reason as a string in place of its peak: never silently nothing.
    """
    t0 = time.perf_counter()
    peaks = _peaks(models, threads, sample)
    return peaks, time.perf_counter() - t0


def _peaks(models: list[str | Path], threads: int, sample) -> list[int | str]:
    with tempfile.TemporaryDirectory(prefix="optimize-mem-") as tmp:
        args = [sys.executable, "-m", "optimize.measure.memory", str(threads)]
        if sample is not None:
            from optimize.models.data import as_float

            x = as_float(sample)
            arrays = x if isinstance(x, dict) else {"": x}
            np.savez(Path(tmp) / "sample.npz", **{f"x:{k}" if k else "x": v for k, v in arrays.items()})
            args += ["--sample", str(Path(tmp) / "sample.npz")]
        try:
            out = subprocess.run(
                [*args, *map(str, models)], capture_output=True, text=True, timeout=300 + 60 * len(models)
            )
        except subprocess.SubprocessError as e:
            return [f"the memory probe did not finish ({e.__class__.__name__})"] * len(models)
    try:
        peaks = json.loads(out.stdout.strip().splitlines()[-1])
        if not isinstance(peaks, list) or len(peaks) != len(models):
            raise ValueError
    except (ValueError, IndexError):
        why = (out.stderr.strip().splitlines() or [f"exit code {out.returncode}"])[-1][:200]
        return [f"the memory probe failed: {why}"] * len(models)
    return [int(p) if isinstance(p, int) else str(p) for p in peaks]


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def _load_sample(path: str | None):
    """The sample the memory probe feeds: an .npz with x, or x:<input> per input (None: zeros)."""
    if path is None:
        return None
    with np.load(path) as z:
        arrays = {k.removeprefix("x:"): z[k] for k in z.files}
    return arrays.get("x", arrays) if set(arrays) == {"x"} else arrays


def _probe_one(path: str, threads: int, sample) -> int:
    """In a fresh fork: reset the high-water mark, then load, allocate and run once; the growth in KiB."""
    Interpreter, _ = _interpreter_class()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS
    except OSError:
        pass
    base = _status_kb("VmRSS")
    with captured_stderr():
        try:
            it = Interpreter(model_path=path, num_threads=threads)
            if sample is not None:
                resize_to(it, sample)
            it.allocate_tensors()
        except (ValueError, RuntimeError) as e:
            raise ModelError(f"the runtime cannot load it: {str(e).strip().splitlines()[-1][:200]}") from None
        runner = Runner(Loaded(it, 0.0, [], True, threads))
        runner.set_input(sample if sample is not None else runner.zeros())
        runner.invoke()
    return max(0, _status_kb("VmHWM") - base)


def _probe(threads: int, paths: list[str], sample_path: str | None = None) -> None:
    """Child-process body: one forked grandchild per model, each reporting its peak (or its error) through a
    pipe."""
    _interpreter_class()  # import the runtime once, before forking
    sample = _load_sample(sample_path)
    peaks: list[int | str] = []
    for path in paths:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            try:
                kib = _probe_one(path, threads, sample)
                os.write(w, str(kib * 1024).encode())
            except Exception as e:  # noqa: BLE001 - reported to the parent, never swallowed
                msg = e.problem if isinstance(e, ModelError) else f"{e.__class__.__name__}: {e}"
                os.write(w, ("E" + msg.strip().splitlines()[0][:300]).encode())
            finally:
                os._exit(0)
        os.close(w)
        with os.fdopen(r) as f:
            text = f.read()
        _, status = os.waitpid(pid, 0)
        if text.startswith("E"):
            peaks.append(text[1:])
        elif text.strip():
            peaks.append(int(text))
        else:
            peaks.append(f"the memory probe's process died ({_exit_reason(status)})")
    print(json.dumps(peaks))


def _exit_reason(status: int) -> str:
    if os.WIFSIGNALED(status):
        import signal

        try:
            return f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
        except ValueError:
            return f"killed by signal {os.WTERMSIG(status)}"
    return f"exit code {os.WEXITSTATUS(status)}"


if __name__ == "__main__":
    _args = sys.argv[2:]
    _sample = None
    if _args[:1] == ["--sample"]:
        _sample, _args = _args[1], _args[2:]
    _probe(int(sys.argv[1]), _args, _sample)

"""The GPU's own numbers, where this machine has a device the GPU accelerator accepts (`--observe gpu`): every
candidate run there on the test samples and measured against the float32 reference as the CPU's figures are
(`metrics.on_target.gpu`, method `observed`), in place of the emulation, which stays the yardstick a candidate
the device computes badly is flagged against. Without a device the emulated figures stand."""

from __future__ import annotations

import logging
from pathlib import Path

from optimize.core.results import Latency, OnTarget, Study
from optimize.delegates import observe
from optimize.measure import on_target, timing
from optimize.measure.metrics import scorer
from optimize.models import runtime
from optimize.models.data import Dataset, count, take

log = logging.getLogger(__name__)


def _feeds(runner: runtime.Runner, xs) -> list[list]:
    """Each sample's inputs as the model takes them (signature order, its dtypes; integer inputs quantized)."""
    from optimize.models.runtime import _ordered_samples, _to_input

    out = []
    for k in range(count(xs)):
        samples = _ordered_samples(take(xs, slice(k, k + 1)), runner.input_names)
        out.append([_to_input(x, d) for x, d in zip(samples, runner.inputs)])
    return out


def _floats(outs: list[list], runner: runtime.Runner) -> list:
    """Per-sample outputs (the model's dtypes) stacked per output and dequantized, as the CPU runner gives them."""
    import numpy as np

    from optimize.models.runtime import _from_output

    return [np.concatenate([_from_output(o[j], d) for o in outs]) for j, d in enumerate(runner.outputs)]


def gpu_latency(run_ms: list[float], device: str, threads: int) -> Latency | None:
    """The GPU accelerator's latency from its timed runs (the first, which compiles and warms up, left out of
    the figures): what the gpu target ranks by where it was observed (`decide.on_target`)."""
    if len(run_ms) < 2:
        return None
    first, runs = run_ms[0], run_ms[1:]
    where = device.removeprefix("observed: ")
    return Latency(
        runtime=f"{where} (observed)", threads=threads, xnnpack=False, init_ms=0.0, **timing.of_runs(runs, first)
    )


def observe_arithmetic(
    study: Study, folder: Path, ds: Dataset | None, threads: int = 2, samples: int | None = None
) -> Study:
    """The study with each measured candidate's GPU figures observed on this machine's GPU device; unchanged
    without one, or without data (nothing to compare)."""
    base = next((c for c in study.candidates if c.name == study.baseline and c.ok and c.artifact), None)
    if ds is None or base is None or observe.gpu_device() is None:
        return study
    reference = Path(folder) / base.artifact
    cands = [
        _observed(c, Path(folder), reference, ds, threads, samples, base.metrics.accuracy) for c in study.candidates
    ]
    return study.model_copy(update={"candidates": cands})


def _observed(c, folder: Path, reference: Path, ds: Dataset, threads: int, samples: int | None, baseline):
    """One candidate with its GPU figures observed (as it was when it cannot be: said in the log)."""
    path = folder / c.artifact if c.ok and c.artifact else None
    if path is None or not path.is_file() or c.metrics is None:
        return c
    try:
        score, runner = scorer(path, ds, reference, threads, samples, baseline)
        outs, device, run_ms = observe.gpu_outputs(path, _feeds(runner, score.xs))
        fid, acc, delta = score(_floats(outs, runner), runner)
    except (ValueError, runtime.ModelError) as e:
        log.warning("%s: not observed on the GPU (%s); its GPU figures stay emulated.", c.name, e)
        return c
    emulated = c.metrics.on_target.gpu if c.metrics.on_target else None
    gpu = on_target.observed(fid, device, acc, expected=emulated or c.metrics.fidelity, **delta)
    gpu = gpu.model_copy(update={"latency": gpu_latency(run_ms, device, threads)})
    return c.model_copy(update={"metrics": c.metrics.model_copy(update={"on_target": OnTarget(gpu=gpu)})})

"""Issue 40: what counting detections adds to measuring a candidate, as a ratio over the plain measurement.

    python benchmarks/bench_detect_cost.py                 # the tiny raw-pair SSD (the worst case) and the SSD
    python benchmarks/bench_detect_cost.py --rounds 7 --samples 96

A candidate's measurement (`optimize.measure.metrics.evaluate` against float32: its outputs on the test split,
the fidelity of every output, the GPU's arithmetic emulated) is timed twice in this process, alternating
rounds: as the tool runs it (the detector head recognised, its detections counted against float32's, on the
CPU's and the GPU's outputs) and plain (no head recognised: the same measurement with the outputs judged
tensor by tensor only). Twice: as a sweep measures a candidate (latency over `RUNS` runs and memory too), and
its outputs only (`timing=False`, the harshest: nothing but running the model on the split and comparing).
The smallest detector is the worst case: its model runs in microseconds, so the count is the largest share of
the measurement. Timed as this process's CPU seconds (the interpreter's threads included), not wall time: on a
shared machine wall time mostly measures the other users. Printed: each one's median CPU seconds and full /
plain; the issue's bound is 1.10.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).parent.parent / "tests")]

BOUND = 1.10
#: Latency runs of the measurement with timing: a sweep's own (`optimize.sweep(runs=...)` default).
RUNS = 50


def _candidate(folder: Path, post: bool, samples: int) -> tuple[Path, Path, Path]:
    """(float32, its int8, data) for the seeded SSD: a raw pair, or with the post-processing op."""
    import bench_detect
    import detector_fixtures as fixtures

    from optimize.core.registry import Context
    from optimize.models.data import load_data
    from optimize.transforms.tflite.quantize import QuantizeParams, quantize

    f32 = fixtures.ssd_postprocessed(folder, postprocess=post)
    data = folder / "d.npz"
    np.savez(data, x_cal=bench_detect.crops(samples, 64, 0), x_test=bench_detect.crops(samples, 64, 1))
    ctx = Context(workdir=folder, data=load_data(data), threads=2)
    int8 = quantize(f32, QuantizeParams(scheme="int8", samples=samples), ctx)
    return f32, int8, data


def _timed(model: Path, data: Path, reference: Path, plain: bool, timing: bool) -> tuple[float, object]:
    from optimize.measure import detection, metrics

    real = detection.recognise
    if plain:
        detection.recognise = lambda *a, **k: None
    try:
        t = time.process_time()
        m = metrics.evaluate(model, data, reference=reference, timing=timing, runs=RUNS, memory=timing)
        return time.process_time() - t, m
    finally:
        detection.recognise = real


def bench(name: str, post: bool, rounds: int, samples: int) -> list[str]:
    with tempfile.TemporaryDirectory(prefix="bench-detect-cost-") as tmp:
        f32, int8, data = _candidate(Path(tmp), post, samples)
        _timed(int8, data, f32, False, False)  # warm: imports, the float model's outputs
        lines = []
        for timing, what in ((True, "as a sweep measures it (latency, memory)"), (False, "outputs only")):
            full, plain = [], []
            for _ in range(rounds):
                s, m = _timed(int8, data, f32, False, timing)
                full.append(s)
                plain.append(_timed(int8, data, f32, True, timing)[0])
            det = next(o.detection for o in m.fidelity.outputs if o.detection is not None)
            a, b = statistics.median(full), statistics.median(plain)
            lines.append(
                f"{name:<5} {what}: {samples} samples, {det.reference_detections} float32 detections "
                f"({det.layout}): with the count {a:.3f} CPU s, plain {b:.3f} s, ratio {a / b:.3f} "
                f"({'within' if a / b <= BOUND else 'OVER'} {BOUND})"
            )
        return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5, help="timed rounds of each (5)")
    ap.add_argument("--samples", type=int, default=48, help="calibration and test samples (48)")
    args = ap.parse_args()
    for name, post in (("pair", False), ("ssd", True)):
        print("\n".join(bench(name, post, args.rounds, args.samples)), flush=True)


if __name__ == "__main__":
    main()

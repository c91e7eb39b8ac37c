"""Checking all five delegates vs loading the model in the interpreter, side by side.

Target (issue 12): checking GPU, NNAPI, Hexagon, Core ML and XNNPACK costs at most 1.2x the interpreter's
load + allocate_tensors of the same model. XNNPACK is observed in a loaded interpreter, so a check always
involves one load; in a sweep that load is the one measuring the candidate, and the parsed flatbuffer is
the one the measurement already read. Three ways are timed, interleaved with the load, after a warm-up,
and the medians compared:

  standalone   check_delegates(path): reads the file and loads its own interpreter (the CLI's `compat`)
  shared load  load + check_delegates(path, loaded=...): the candidate's one load serves both
  shared both  load + check_delegates(path, loaded=..., parsed=...): the parse is shared too

    python benchmarks/bench_compat.py                  # builds MobileNetV2 (weights=None), float32 and int8
    python benchmarks/bench_compat.py model.tflite --runs 30
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np


def build_mobilenet_v2(folder: Path) -> list[Path]:
    """MobileNetV2 at 224x224 with random weights: float32, and int8 calibrated on seeded noise."""
    from optimize import _tf

    tf, keras = _tf.tf(), _tf.keras()
    model = keras.applications.MobileNetV2(weights=None, input_shape=(224, 224, 3))
    f32 = folder / "mobilenet_v2_float32.tflite"
    f32.write_bytes(tf.lite.TFLiteConverter.from_keras_model(model).convert())
    c = tf.lite.TFLiteConverter.from_keras_model(model)
    rng = np.random.default_rng(0)
    c.optimizations = [tf.lite.Optimize.DEFAULT]
    c.representative_dataset = lambda: ([rng.random((1, 224, 224, 3), dtype=np.float32)] for _ in range(4))
    int8 = folder / "mobilenet_v2_int8.tflite"
    int8.write_bytes(c.convert())
    return [f32, int8]


def _ms(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1000


def measure(path: Path, runs: int, threads: int) -> dict[str, float]:
    """Median milliseconds of the load and of each way to check, interleaved run by run."""
    from optimize import runtime
    from optimize.delegates import check_delegates
    from optimize.delegates.flatbuffer import read_model

    for _ in range(2):  # warm-up: imports, file cache, schema tables
        check_delegates(path, threads=threads)
    times: dict[str, list[float]] = {"load": [], "standalone": [], "shared load": [], "shared both": []}
    for _ in range(runs):
        box: dict = {}
        times["load"].append(_ms(lambda b=box: b.setdefault("l", runtime.load(path, threads=threads))))
        times["standalone"].append(_ms(lambda: check_delegates(path, threads=threads)))
        loaded, parsed = box["l"], read_model(path)
        times["shared load"].append(_ms(lambda ld=loaded: check_delegates(path, threads=threads, loaded=ld)))
        times["shared both"].append(
            _ms(lambda ld=loaded, pm=parsed: check_delegates(path, threads=threads, loaded=ld, parsed=pm))
        )
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", nargs="*", help=".tflite files to measure (default: build MobileNetV2 float32 and int8)")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        paths = [Path(m) for m in args.model] or build_mobilenet_v2(Path(tmp))
        print(f"threads={args.threads}, runs={args.runs}, medians in ms; (ratio) = the check's cost / one load")
        print("standalone: check_delegates(path) parses and loads by itself; shared load: it is given the")
        print("interpreter measuring built (as a sweep candidate does); shared both: also a parsed flatbuffer")
        print(f"{'model':32} {'load':>7} {'standalone':>18} {'shared load':>18} {'shared both':>18}")
        for path in paths:
            t = measure(path, args.runs, args.threads)
            load = t["load"]
            cells = [f"{t[k]:.1f} ({t[k] / load:.2f}x)" for k in ("standalone", "shared load", "shared both")]
            print(f"{path.name:32} {load:7.1f} " + " ".join(f"{c:>18}" for c in cells))
        print(
            "target: checking all five delegates <= 1.20x one interpreter load + allocate (shared load, as in a sweep)"
        )


if __name__ == "__main__":
    main()

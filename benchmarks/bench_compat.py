"""Checking all five delegates vs loading the model in the interpreter, side by side.

Target (issue 3): check_delegates on a MobileNetV2-sized model costs no more than 2x the interpreter's
load + allocate_tensors of the same model. Both are measured in this process, interleaved, after one
warm-up each; the median of N runs is compared. The check includes one interpreter load of its own (the
XNNPACK column is observed in the runtime), so the rules part must cost less than one load.

    python benchmarks/bench_compat.py                 # builds MobileNetV2 float32 (weights=None), 224x224
    python benchmarks/bench_compat.py model.tflite --runs 30
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path


def build_mobilenet_v2(folder: Path) -> Path:
    from optimize import _tf

    tf, keras = _tf.tf(), _tf.keras()
    model = keras.applications.MobileNetV2(weights=None, input_shape=(224, 224, 3))
    path = folder / "mobilenet_v2_float32.tflite"
    path.write_bytes(tf.lite.TFLiteConverter.from_keras_model(model).convert())
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", nargs="?", help=".tflite to measure (default: build MobileNetV2 float32)")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    from optimize import runtime
    from optimize.delegates import check_delegates

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(args.model) if args.model else build_mobilenet_v2(Path(tmp))
        runtime.load(path, threads=args.threads)
        check_delegates(path, threads=args.threads)
        load_ms, check_ms = [], []
        for _ in range(args.runs):
            t0 = time.perf_counter()
            runtime.load(path, threads=args.threads)
            load_ms.append((time.perf_counter() - t0) * 1000)
            t0 = time.perf_counter()
            check_delegates(path, threads=args.threads)
            check_ms.append((time.perf_counter() - t0) * 1000)
        load, check = statistics.median(load_ms), statistics.median(check_ms)
        print(f"model: {path.name} ({path.stat().st_size / 1e6:.1f} MB), threads={args.threads}, runs={args.runs}")
        print(f"interpreter load + allocate_tensors: median {load:.1f} ms")
        print(f"check_delegates (gpu, nnapi, hexagon, coreml, xnnpack): median {check:.1f} ms")
        print(f"ratio: {check / load:.2f} (target <= 2.00)")


if __name__ == "__main__":
    main()

"""Issue 2's performance targets, measured side by side in one run; prints ratios (not absolute claims).

    python benchmarks/bench_pipeline.py            # demo targets + MobileNetV2 (several minutes)
    python benchmarks/bench_pipeline.py --demo     # demo targets only

Demo model: int8 size <= 0.30x float32; float16 <= 0.55x; prune(50%)->cluster(16)->int8 gzip <= 0.15x
float32 gzip; accuracy drop <= 1 point for every post-training scheme.
MobileNetV2 (224x224, weights=None): int8 vs float32 latency at 2 threads; sweep wall time vs the bare
TensorFlow calls that produce the same artifacts (overhead <= 1.15x).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from optimize.core.recipe import build
from optimize.engine import sweeps
from optimize.models import _tf

PTQ = ("float32", "float16", "dynamic", "int8", "int16x8")


def check(label: str, value: float, limit: float, fmt: str = "{:.3f}", higher_is_worse: bool = True) -> bool:
    ok = value <= limit if higher_is_worse else value >= limit
    print(
        f"  {label:58} {fmt.format(value):>9}   target {'<=' if higher_is_worse else '>='} {limit}   "
        f"{'PASS' if ok else 'FAIL'}"
    )
    return ok


def demo(out: Path) -> bool:
    print("Demo model (digits CNN), full sweep:")
    t0 = time.perf_counter()
    study = sweeps.sweep(None, None, out / "demo", delegates=False)
    print(f"  sweep of {len(study.candidates)} candidates: {time.perf_counter() - t0:.1f} s")
    c = {x.name: x for x in study.candidates}
    for x in study.candidates:
        if x.error:
            print(f"  {x.name} FAILED: {x.error}")
    base = c["float32"].metrics.size
    ok = check("int8 size / float32 size", c["int8"].metrics.size.bytes / base.bytes, 0.30)
    ok &= check("float16 size / float32 size", c["float16"].metrics.size.bytes / base.bytes, 0.55)
    ok &= check(
        "prune->cluster->int8 gzip / float32 gzip",
        c["prune-cluster-int8"].metrics.size.gzip_bytes / base.gzip_bytes,
        0.15,
    )
    for name in ("float16", "dynamic", "int8", "int8-int8io", "int16x8"):
        ok &= check(f"{name} accuracy drop (points)", -100 * c[name].metrics.accuracy_delta, 1.0, "{:.2f}")
    return ok


def bare_ptq(keras_path: Path, xs: np.ndarray, out: Path) -> float:
    """What a hand-written script does: load the model, one TFLiteConverter conversion per scheme."""
    tf = _tf.tf()
    keras = _tf.keras()
    t0 = time.perf_counter()
    model = keras.models.load_model(keras_path, compile=False)

    def rep():
        for i in range(len(xs)):
            yield [xs[i : i + 1]]

    out.mkdir(parents=True, exist_ok=True)
    for scheme in PTQ:
        conv = tf.lite.TFLiteConverter.from_keras_model(model)
        if scheme != "float32":
            conv.optimizations = [tf.lite.Optimize.DEFAULT]
        if scheme == "float16":
            conv.target_spec.supported_types = [tf.float16]
        if scheme == "int8":
            conv.representative_dataset = rep
            conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        if scheme == "int16x8":
            conv.representative_dataset = rep
            conv.target_spec.supported_ops = [
                tf.lite.OpsSet.EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8
            ]
        (out / f"{scheme}.tflite").write_bytes(conv.convert())
    return time.perf_counter() - t0


def mobilenet(out: Path, backend: str | None) -> bool:
    print("MobileNetV2 (224x224x3, weights=None), post-training sweep:")
    keras = _tf.keras()
    keras.utils.set_random_seed(0)
    model = keras.applications.MobileNetV2(weights=None, input_shape=(224, 224, 3))
    path = out / "mobilenetv2.keras"
    model.save(path)
    rng = np.random.default_rng(0)
    xs = rng.uniform(-1, 1, (16, 224, 224, 3)).astype(np.float32)
    data = out / "calib.npz"
    np.savez(data, x_cal=xs, x_test=xs[:8])
    bare_s = bare_ptq(path, xs, out / "bare")
    recipes = [build(s, [{"technique": "convert", "scheme": s, "samples": 16}]) for s in PTQ]
    t0 = time.perf_counter()
    study = sweeps.sweep(path, data, out / "mnv2", recipes=recipes, backend=backend, delegates=True, eval_samples=8)
    sweep_s = time.perf_counter() - t0
    c = {x.name: x for x in study.candidates}
    for x in study.candidates:
        lat = x.metrics.latency if x.ok else None
        print(
            f"  {x.name:9} {'FAILED: ' + x.error if x.error else f'{x.metrics.size.bytes / 1e6:.2f} MB, p50 {lat.p50_ms:.2f} ms ({lat.runs} runs, {lat.threads} threads)'}"
        )
    print(
        f"  bare TFLiteConverter calls (5 schemes): {bare_s:.1f} s; optimize sweep (same artifacts, plus "
        f"measurement and delegate checks): {sweep_s:.1f} s"
    )
    ok = check("sweep wall time / bare converter calls", sweep_s / bare_s, 1.15)
    if c["int8"].ok and c["float32"].ok:
        r = c["int8"].metrics.latency.p50_ms / c["float32"].metrics.latency.p50_ms
        print(f"  int8 p50 / float32 p50 latency at 2 threads (reported, no target): {r:.2f}")
    return ok


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--demo", action="store_true", help="demo targets only")
    ap.add_argument("--backend", choices=["converter", "litert"], default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        ok = demo(out)
        if not args.demo:
            ok &= mobilenet(out, args.backend)
    print("ALL TARGETS MET" if ok else "SOME TARGETS MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

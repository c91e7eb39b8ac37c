"""int4 on Dense-heavy models (issue 21): size, accuracy and output error against int8 and float32, p50 against int8.

    python benchmarks/bench_int4.py                 # both cases (a few minutes on 2 cores)
    python benchmarks/bench_int4.py --case mlp

Two models trained here, seeded, on scikit-learn's digits (real data that ships offline): an MLP (64 -> 512 ->
512 -> 10, 99% of its weights in Dense matrices) and a small transformer (8 tokens of 8 pixels, attention and a
feed-forward block). Side by side in one sweep per model: float32, dynamic (int8 weights), int8 (calibrated),
int4 (channel-wise) and int4 in blocks of 32, every one verified, measured in the interpreter (host CPU,
XNNPACK on) and checked against the delegates. Targets: int4 weights <= 0.16x their float32 equivalent; the
accuracy and the output error are reported next to int8's and float32's, and p50 next to int8's.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

import optimize
from optimize.core.recipe import build
from optimize.models import _tf

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_accuracy_rescue import _fit, digits  # noqa: E402  (the same data and training loop)

MAX_INT4_WEIGHTS = 0.16


def mlp(keras):
    data = digits(seq=True)
    data = {k: v.reshape(len(v), -1) if k.startswith("x") else v for k, v in data.items()}
    m = keras.Sequential([keras.layers.Input((64,)), keras.layers.Dense(512, activation="relu")])
    m.add(keras.layers.Dense(512, activation="relu"))
    m.add(keras.layers.Dense(10))
    return _fit(m, data, 20, keras.losses.SparseCategoricalCrossentropy(True)), data


def transformer(keras):
    data = digits(seq=True)  # 8 rows of 8 pixels: a sequence of 8 tokens
    inp = keras.Input((8, 8))
    h = keras.layers.Dense(128)(inp)
    a = keras.layers.MultiHeadAttention(num_heads=4, key_dim=32)(h, h)
    h = keras.layers.LayerNormalization()(keras.layers.Add()([h, a]))
    f = keras.layers.Dense(128)(keras.layers.Dense(512, activation="relu")(h))
    h = keras.layers.LayerNormalization()(keras.layers.Add()([h, f]))
    h = keras.layers.GlobalAveragePooling1D()(h)
    m = keras.Model(inp, keras.layers.Dense(10)(h))
    return _fit(m, data, 30, keras.losses.SparseCategoricalCrossentropy(True)), data


CASES = {"mlp": mlp, "transformer": transformer}
RECIPES = (
    ("float32", [{"technique": "convert"}]),
    ("dynamic", [{"technique": "convert", "scheme": "dynamic"}]),
    ("int8", [{"technique": "convert", "scheme": "int8"}]),
    ("int4", [{"technique": "quantize", "scheme": "int4"}]),
    ("int4-b32", [{"technique": "quantize", "scheme": "int4", "block_size": 32}]),
)


def run_case(name: str, out: Path, runs: int):
    keras = _tf.keras()
    keras.utils.set_random_seed(0)
    model, data = CASES[name](keras)
    folder = out / name
    folder.mkdir(parents=True)
    model.save(folder / "model.keras")
    np.savez(folder / "data.npz", **data)
    from optimize.models import source as models
    from optimize.models import weights

    share = weights.dense_share(models.open_model(folder / "model.keras"))
    recipes = [build(n, steps) for n, steps in RECIPES]
    study = optimize.sweep(
        folder / "model.keras", folder / "data.npz", folder / "out", recipes=recipes, cache=False, jobs=0, runs=runs
    )
    return study, share


def _row(c, base, int8) -> str:
    m = c.metrics
    comp = c.composition
    acc = m.accuracy.top1 if m.accuracy else None
    err = m.fidelity.relative_error if m.fidelity else None
    p50 = m.latency.p50_ms if m.latency else None
    x = c.delegates.get("xnnpack")
    cells = [
        f"{c.name:9}",
        f"{comp.shrink:6.3f}" if comp else "     -",
        f"{m.size.bytes / base.metrics.size.bytes:6.3f}",
        f"{acc * 100:6.2f}%" if acc is not None else "      -",
        f"{(acc - base.metrics.accuracy.top1) * 100:+6.2f}" if acc is not None else "     -",
        f"{err:8.4f}" if err is not None else "       -",
        f"{p50:7.3f}" if p50 is not None else "      -",
        f"{p50 / int8.metrics.latency.p50_ms:5.2f}x" if p50 and int8.ok else "     -",
        f"{x.nodes_delegated}/{x.nodes_total}" if x else "-",
        "  ".join(f"{d}: {_verdict(c.delegates.get(d))}" for d in ("gpu", "nnapi")),
    ]
    return " ".join(cells)


def _verdict(r) -> str:
    if r is None:
        return "-"
    return "build fails" if r.veto_code == "build-failure" else r.verdict


def report(name: str, study, share) -> bool:
    c = {x.name: x for x in study.candidates}
    print(f"\n{name}: {share:.1%} of the weight elements in Dense/MatMul matrices int4 makes 4-bit")
    for x in study.candidates:
        if not x.ok:
            print(f"  {x.name:9} FAILED: {x.error}")
    base, int8 = c["float32"], c["int8"]
    print(
        "  candidate  weights  file    top-1   Δ pt  out-err  p50 ms  /int8 XNNPACK  delegates (predicted)\n"
        "             /f32     /f32                  (rel)"
    )
    for x in study.candidates:
        if x.ok:
            print("  " + _row(x, base, int8))
    ok = True
    for n in ("int4", "int4-b32"):
        got = c[n].composition.shrink if c[n].ok and c[n].composition else None
        good = got is not None and got <= MAX_INT4_WEIGHTS
        ok &= good
        print(f"  target {n} weights <= {MAX_INT4_WEIGHTS}x float32: {'met' if good else 'NOT met'} ({got})")
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--case", choices=sorted(CASES), action="append")
    ap.add_argument("--runs", type=int, default=50, help="timed runs per candidate")
    args = ap.parse_args()
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.case or list(CASES):
            study, share = run_case(name, Path(tmp), args.runs)
            ok &= report(name, study, share)
    print("\nweights /f32: weight bytes over their float32 equivalent (verify.compose); file /f32: .tflite bytes;")
    print("out-err: worst output's mean |diff| over the float32 output's range; p50: host CPU, XNNPACK, 2 threads.")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

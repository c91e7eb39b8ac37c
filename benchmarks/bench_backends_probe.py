"""Probe: LiteRT Quantizer (the `quantize` technique) vs the TFLite converter, per scheme.

For each model: export a SavedModel, convert once to float32, then time every scheme with both
backends (converter from the SavedModel; quantizer on the float .tflite) and measure fidelity: mean
absolute difference of outputs vs float32 over seeded random inputs (digits: held-out images),
top-1 agreement, size, whether the result loads, and a short host-CPU latency.

    python benchmarks/bench_backends_probe.py [small digits mobilenetv2] [--samples 100] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from optimize.core.errors import OptimizeError, TechniqueFailed
from optimize.core.registry import Context, get
from optimize.measure import timing
from optimize.models import _tf, runtime
from optimize.models.data import from_arrays

SCHEMES = ("float16", "dynamic", "int8", "int16x8")


def small_cnn():
    k = _tf.keras()
    k.utils.set_random_seed(0)
    m = k.Sequential(
        [
            k.layers.Input((32, 32, 3)),
            k.layers.Conv2D(16, 3, activation="relu"),
            k.layers.BatchNormalization(),
            k.layers.MaxPooling2D(),
            k.layers.Conv2D(32, 3, activation="relu"),
            k.layers.DepthwiseConv2D(3, activation="relu6"),
            k.layers.GlobalAveragePooling2D(),
            k.layers.Dense(64, activation="relu"),
            k.layers.Dense(10, activation="softmax"),
        ]
    )
    rng = np.random.default_rng(1)
    return (
        m,
        rng.uniform(0, 1, (100, 32, 32, 3)).astype(np.float32),
        rng.uniform(0, 1, (20, 32, 32, 3)).astype(np.float32),
    )


def digits_cnn():
    from sklearn.datasets import load_digits

    k = _tf.keras()
    k.utils.set_random_seed(0)
    d = load_digits()
    x = (d.images / 16.0).astype(np.float32)[..., None]
    y = d.target
    idx = np.random.default_rng(0).permutation(len(x))
    x, y = x[idx], y[idx]
    m = k.Sequential(
        [
            k.layers.Input((8, 8, 1)),
            k.layers.Conv2D(16, 3, padding="same", activation="relu"),
            k.layers.Conv2D(32, 3, padding="same", activation="relu"),
            k.layers.MaxPooling2D(),
            k.layers.Flatten(),
            k.layers.Dense(64, activation="relu"),
            k.layers.Dense(10, activation="softmax"),
        ]
    )
    m.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
    m.fit(x[:1400], y[:1400], epochs=15, batch_size=32, verbose=0)
    return m, x[:1400], x[1400:], y[1400:]


def mobilenetv2(reestimate_bn: bool = True, logits: bool = False):
    """Random-weight MobileNetV2; by default batch-norm statistics are re-estimated on the calibration set.

    With untrained statistics (mean 0, variance 1) activations collapse and the softmax is constant.
    """
    k = _tf.keras()
    k.utils.set_random_seed(0)
    m = k.applications.MobileNetV2(
        weights=None, input_shape=(224, 224, 3), classifier_activation=None if logits else "softmax"
    )
    rng = np.random.default_rng(1)
    cal = rng.uniform(-1, 1, (100, 224, 224, 3)).astype(np.float32)
    if reestimate_bn:
        bns = [layer for layer in m.layers if isinstance(layer, k.layers.BatchNormalization)]
        for bn in bns:
            bn.momentum = 0.0
        m(cal[:32], training=True)
        for bn in bns:
            bn.momentum = 0.99
    return m, cal, rng.uniform(-1, 1, (20, 224, 224, 3)).astype(np.float32)


def convert(saved: str, scheme: str | None, cal: np.ndarray) -> bytes:
    tf = _tf.tf()
    c = tf.lite.TFLiteConverter.from_saved_model(saved)
    if scheme == "float16":
        c.optimizations = [tf.lite.Optimize.DEFAULT]
        c.target_spec.supported_types = [tf.float16]
    elif scheme == "dynamic":
        c.optimizations = [tf.lite.Optimize.DEFAULT]
    elif scheme in ("int8", "int16x8"):
        c.optimizations = [tf.lite.Optimize.DEFAULT]
        c.representative_dataset = lambda: ([cal[i : i + 1]] for i in range(len(cal)))
        if scheme == "int16x8":
            c.target_spec.supported_ops = [tf.lite.OpsSet.EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8]
    return c.convert()


def measure(path: Path, ref: np.ndarray, xs: np.ndarray, labels=None) -> dict:
    out: dict = {"bytes": path.stat().st_size}
    try:
        loaded = runtime.load(path, threads=2)
    except OptimizeError as e:
        return {**out, "load_error": str(e)}
    r = runtime.Runner(loaded)
    y = r.predict(xs)[0]
    out["io"] = f"{np.dtype(r.inputs[0]['dtype']).name}->{np.dtype(r.outputs[0]['dtype']).name}"
    out["xnnpack"] = loaded.xnnpack
    out["mad"] = float(np.abs(y - ref).mean())
    out["rel_mad"] = float(np.abs(y - ref).mean() / (np.abs(ref).mean() + 1e-12))
    out["top1_agree"] = float((y.argmax(-1) == ref.argmax(-1)).mean())
    if labels is not None:
        out["accuracy"] = float((y.argmax(-1) == labels).mean())
    out["p50_ms"] = timing.time_invoke(r, xs[:1], warmup=2, runs=10)["p50_ms"]
    return out


def probe(name: str, samples: int) -> dict:
    builders = {
        "small": small_cnn,
        "digits": digits_cnn,
        "mobilenetv2": mobilenetv2,
        "mobilenetv2_raw": lambda: mobilenetv2(reestimate_bn=False),
        "mobilenetv2_logits": lambda: mobilenetv2(logits=True),
    }
    built = builders[name]()
    model, cal, xs = built[:3]
    labels = built[3] if len(built) > 3 else None
    tmp = Path(tempfile.mkdtemp(prefix=f"probe-{name}-"))
    saved = str(tmp / "saved")
    model.export(saved)
    t0 = time.perf_counter()
    f32 = tmp / "float32.tflite"
    f32.write_bytes(convert(saved, None, cal))
    res: dict = {
        "model": name,
        "params": int(model.count_params()),
        "samples": samples,
        "float32_convert_s": time.perf_counter() - t0,
    }
    ref = runtime.Runner(runtime.load(f32)).predict(xs)[0]
    res["float32"] = measure(f32, ref, xs, labels)
    tech = get("quantize")
    ctx = Context(workdir=tmp / "lq", data=from_arrays(x_cal=cal[:samples], x_test=xs), threads=2)
    for scheme in SCHEMES:
        row = {}
        t0 = time.perf_counter()
        try:
            data = convert(saved, scheme, cal[:samples])
            row["converter_s"] = time.perf_counter() - t0
            p = tmp / f"conv-{scheme}.tflite"
            p.write_bytes(data)
            row["converter"] = measure(p, ref, xs, labels)
        except Exception as e:  # noqa: BLE001 - a probe records every failure
            row["converter_error"] = f"{e.__class__.__name__}: {str(e).strip().splitlines()[-1][:200]}"
        t0 = time.perf_counter()
        try:
            p = tech.fn(f32, tech.parse({"scheme": scheme, "samples": samples}), ctx)
            row["litert_s"] = time.perf_counter() - t0
            row["litert"] = measure(p, ref, xs, labels)
        except (TechniqueFailed, OptimizeError) as e:
            row["litert_s"] = time.perf_counter() - t0
            row["litert_error"] = str(e)
        res[scheme] = row
        print(name, scheme, json.dumps(row), file=sys.stderr, flush=True)
    # Integer I/O from the quantizer, and its own time without the load check.
    for raw in (
        {"scheme": "int8", "io": "int8"},
        {"scheme": "int8", "io": "uint8"},
        {"scheme": "int16x8", "io": "int16"},
    ):
        t0 = time.perf_counter()
        try:
            p = tech.fn(f32, tech.parse({**raw, "samples": samples}), ctx)
            res[f"{raw['scheme']}-io-{raw['io']}"] = {
                "litert_s": time.perf_counter() - t0,
                "litert": measure(p, ref, xs, labels),
            }
        except (TechniqueFailed, OptimizeError) as e:
            res[f"{raw['scheme']}-io-{raw['io']}"] = {"litert_error": str(e)}
    res["notes"] = ctx.notes
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="*", default=["small", "digits", "mobilenetv2"])
    ap.add_argument("--samples", type=int, default=100)
    ap.add_argument("--json")
    a = ap.parse_args()
    results = [probe(m, a.samples) for m in a.models]
    text = json.dumps(results, indent=1)
    if a.json:
        Path(a.json).write_text(text)
    print(text)


if __name__ == "__main__":
    main()

"""Issue 10's targets: when full int8 breaks the accuracy goal, does the selective search rescue it?

    python benchmarks/bench_accuracy_rescue.py            # every case (several minutes)
    python benchmarks/bench_accuracy_rescue.py --case lstm-co2

Cases (trained here, seeded; real data that ships offline: statsmodels' co2 and sunspots series,
scikit-learn's digits): an LSTM and a GRU forecaster, a CNN whose activations have one huge channel,
a MobileNetV3-style hard-swish CNN, and a small transformer block (attention + layer norm).

Per case, side by side in one run: float32, plain int8 and the selective candidate (mixed-int8), each
measured on the test split. Targets where int8 breaks the goal: the selective candidate meets it
(classification drop <= 0.5 pt, regression error <= 1.10x float32), at <= 0.40x the float32 size, with
p50 latency no worse than float32 (host CPU, 2 threads); at most 25 model evaluations; under 3x the
time of a plain int8 candidate. Also: the debug table of a ~100-op model in under 2x the time of one
int8 calibration. Every figure is printed; nothing is asserted on wall-clock time elsewhere.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import optimize
from optimize import _tf
from optimize.recipe import build

DROP, INCREASE = 0.005, 0.10


def _windows(series: np.ndarray, t: int):
    z = (series - series.mean()) / series.std()
    x = np.stack([z[i : i + t] for i in range(len(z) - t)])[..., None].astype(np.float32)
    return x, z[t:].astype(np.float32)[:, None]


def _split(x, y, test=0.2):
    n = int(len(x) * (1 - test))
    return {"x_train": x[:n], "y_train": y[:n], "x_test": x[n:], "y_test": y[n:]}


def co2():
    import statsmodels.api as sm

    return _split(*_windows(sm.datasets.co2.load_pandas().data["co2"].interpolate().to_numpy(np.float32), 52))


def sunspots():
    import statsmodels.api as sm

    return _split(*_windows(sm.datasets.sunspots.load_pandas().data["SUNACTIVITY"].to_numpy(np.float32), 24))


def digits(seq: bool = False):
    from sklearn.datasets import load_digits

    d = load_digits()
    x = (d.images / 16.0).astype(np.float32)
    x = x if seq else x[..., None]
    order = np.random.default_rng(0).permutation(len(x))
    return _split(x[order], d.target.astype(np.int64)[order])


def _fit(model, data, epochs, loss, batch=32):
    keras = _tf.keras()
    model.compile(keras.optimizers.Adam(1e-3), loss)
    model.fit(data["x_train"], data["y_train"], epochs=epochs, batch_size=batch, verbose=0)
    return model


def lstm_co2(keras):
    data = co2()
    m = keras.Sequential([keras.layers.Input((52, 1)), keras.layers.LSTM(48), keras.layers.Dense(1)])
    return _fit(m, data, 8, "mse", 64), data


def gru_sunspots(keras):
    data = sunspots()
    m = keras.Sequential([keras.layers.Input((24, 1)), keras.layers.GRU(32), keras.layers.Dense(1)])
    return _fit(m, data, 30, "mse", 16), data


def outlier_cnn(keras):
    data = digits()
    inp = keras.Input((8, 8, 1))
    h = keras.layers.Conv2D(16, 3, padding="same", activation="relu")(inp)
    h = keras.layers.Conv2D(16, 3, padding="same", activation="relu", name="big")(h)
    h = keras.layers.Flatten()(h)
    h = keras.layers.Dense(32, activation="relu", name="hidden")(h)
    m = _fit(keras.Model(inp, keras.layers.Dense(10)(h)), data, 15, keras.losses.SparseCategoricalCrossentropy(True))
    w, b = m.get_layer("big").get_weights()
    w[..., 0] *= 100
    b[0] *= 100
    m.get_layer("big").set_weights([w, b])
    dw, db = m.get_layer("hidden").get_weights()
    dw = dw.reshape(64, 16, 32)
    dw[:, 0, :] /= 100
    m.get_layer("hidden").set_weights([dw.reshape(-1, 32), db])
    return m, data


def _hard_swish(keras, x):
    """x * relu6(x + 3) / 6, from plain layers (the converter fuses it into HARD_SWISH)."""
    gate = keras.layers.ReLU(6.0)(keras.layers.Rescaling(1.0, offset=3.0)(x))
    return keras.layers.Multiply()([x, keras.layers.Rescaling(1 / 6)(gate)])


def hardswish_cnn(keras):
    data = digits()
    inp = keras.Input((8, 8, 1))
    h = _hard_swish(keras, keras.layers.Conv2D(16, 3, padding="same")(inp))
    h = _hard_swish(keras, keras.layers.DepthwiseConv2D(3, padding="same")(h))
    h = _hard_swish(keras, keras.layers.Conv2D(32, 1)(h))
    h = keras.layers.GlobalAveragePooling2D()(h)
    m = keras.Model(inp, keras.layers.Dense(10)(h))
    return _fit(m, data, 25, keras.losses.SparseCategoricalCrossentropy(True)), data


def transformer(keras):
    data = digits(seq=True)  # 8 rows of 8 pixels: a sequence of 8 tokens
    inp = keras.Input((8, 8))
    h = keras.layers.Dense(32)(inp)
    a = keras.layers.MultiHeadAttention(num_heads=2, key_dim=16)(h, h)
    h = keras.layers.LayerNormalization()(keras.layers.Add()([h, a]))
    f = keras.layers.Dense(32)(keras.layers.Dense(64, activation="relu")(h))
    h = keras.layers.LayerNormalization()(keras.layers.Add()([h, f]))
    h = keras.layers.GlobalAveragePooling1D()(h)
    m = keras.Model(inp, keras.layers.Dense(10)(h))
    return _fit(m, data, 30, keras.losses.SparseCategoricalCrossentropy(True)), data


CASES = {
    "lstm-co2": lstm_co2,
    "gru-sunspots": gru_sunspots,
    "outlier-cnn": outlier_cnn,
    "hardswish-cnn": hardswish_cnn,
    "transformer": transformer,
}


def _change(c) -> tuple[str, float | None, bool]:
    """(text, value, meets the goal) of a candidate's accuracy change against float32."""
    m = c.metrics
    if m.error_ratio is not None:
        return f"error x{m.error_ratio:.2f}", m.error_ratio, m.error_ratio <= 1 + INCREASE + 1e-9
    d = m.accuracy_delta
    return f"{d * 100:+.2f} pt", d, -d <= DROP + 1e-9


def run_case(name: str, out: Path) -> dict:
    keras = _tf.keras()
    keras.utils.set_random_seed(0)
    model, data = CASES[name](keras)
    folder = out / name
    folder.mkdir(parents=True)
    model.save(folder / "model.keras")
    np.savez(folder / "data.npz", **data)
    regression = data["y_train"].dtype.kind == "f"
    budget = {"max_error_increase": INCREASE} if regression else {"max_accuracy_drop": DROP}
    recipes = [
        build("float32", [{"technique": "convert"}]),
        build("int8", [{"technique": "convert", "scheme": "int8"}]),
        build("mixed-int8", [{"technique": "convert"}, {"technique": "selective", **budget}]),
    ]
    t0 = time.perf_counter()
    study = optimize.sweep(
        folder / "model.keras",
        folder / "data.npz",
        folder / "out",
        recipes=recipes,
        delegates=False,
        cache=False,
        jobs=0,
    )
    wall = time.perf_counter() - t0
    return {"name": name, "study": study, "wall": wall}


def report(result: dict) -> bool:
    study = result["study"]
    c = {x.name: x for x in study.candidates}
    print(f"\n{result['name']} ({study.task}), sweep {result['wall']:.1f} s")
    for x in study.candidates:
        if not x.ok:
            print(f"  {x.name:11} FAILED: {x.error}")
    if not (c["float32"].ok and c["int8"].ok):
        print("  int8 could not be made: nothing to rescue (see the error above)")
        return True
    base = c["float32"].metrics
    text, _, int8_ok = _change(c["int8"])
    print(f"  int8        {text:14} {c['int8'].metrics.size.bytes / base.size.bytes:.2f}x size")
    if int8_ok:
        print("  int8 meets the goal here: no rescue needed")
        return True
    sel = c["mixed-int8"]
    if not sel.ok:
        print(f"  mixed-int8 FAILED: {sel.error}")
        return False
    text, _, meets = _change(sel)
    size = sel.metrics.size.bytes / base.size.bytes
    lat = sel.metrics.latency.p50_ms / base.latency.p50_ms
    evals = next((int(n.split(" after ")[1].split(" ")[0]) for n in sel.notes if " after " in n), None)
    ratio = sel.seconds / max(c["int8"].seconds, 1e-9)
    print(
        f"  mixed-int8  {text:14} {size:.2f}x size, p50 {lat:.2f}x float32, {evals} evaluations, "
        f"{ratio:.1f}x the time of plain int8"
    )
    ok = True
    for label, good in (
        ("meets the accuracy goal", meets),
        ("size <= 0.40x float32", size <= 0.40),
        ("latency <= float32", lat <= 1.0),
        ("<= 25 evaluations", evals is not None and evals <= 25),
        ("time < 3x plain int8", ratio < 3),
    ):
        print(f"    {label:28} {'PASS' if good else 'FAIL'}")
        ok &= good
    return ok


def debug_timing(out: Path) -> bool:
    """The debug table for a model of ~100 ops vs the time of one int8 calibration of the same model."""
    from optimize import litert
    from optimize.data import load_data
    from optimize.registry import Context, get
    from optimize.techniques.litert_quantize import _calibration_data, _inspect

    keras = _tf.keras()
    keras.utils.set_random_seed(0)
    data = digits()
    for k in ("x_train", "x_test"):  # 32x32 RGB: enough pixels that running the model is real work
        data[k] = np.repeat(np.kron(data[k], np.ones((1, 4, 4, 1), np.float32)), 3, axis=-1)
    inp = keras.Input((32, 32, 3))
    h = keras.layers.Conv2D(16, 3, padding="same", activation="relu")(inp)
    for _ in range(24):  # residual blocks: ~100 ops once converted
        r = keras.layers.Conv2D(16, 3, padding="same", activation="relu")(h)
        h = keras.layers.Add()([h, keras.layers.Conv2D(16, 1)(r)])
    base = keras.Model(inp, keras.layers.Dense(10)(keras.layers.GlobalAveragePooling2D()(h)))
    base = _fit(base, data, 3, keras.losses.SparseCategoricalCrossentropy(True))
    folder = out / "debug"
    folder.mkdir()
    base.export(str(folder / "sm"))
    flat = _tf.tf().lite.TFLiteConverter.from_saved_model(str(folder / "sm")).convert()
    (folder / "m.tflite").write_bytes(flat)
    from optimize.delegates.flatbuffer import read_model

    print(f"\nDebug table timing: a residual CNN of {len(read_model(flat).main.ops)} ops")
    np.savez(folder / "d.npz", x=data["x_train"])
    ds = load_data(folder / "d.npz")
    params = get("quantize").parse({"scheme": "int8"})  # the default: 200 calibration samples
    ctx = Context(workdir=folder, data=ds)
    sig, inputs = _inspect(flat, folder / "m.tflite")
    t0 = time.perf_counter()
    session = litert.Session(flat, params, ctx, _calibration_data(params, ctx, sig, inputs, folder / "m.tflite"))
    calib = time.perf_counter() - t0
    t0 = time.perf_counter()
    session.quantize({})
    int8 = calib + time.perf_counter() - t0  # one plain int8 model: calibration plus the quantization pass
    t0 = time.perf_counter()
    rep = optimize.debug_model(folder / "m.tflite", folder / "d.npz", leave_out=0)
    dbg = time.perf_counter() - t0
    t0 = time.perf_counter()
    optimize.debug_model(folder / "m.tflite", folder / "d.npz", leave_out=3)
    extra = time.perf_counter() - t0 - dbg
    del session
    print(
        f"  {len(rep.layers)} quantized ops compared; the table {dbg:.2f} s (it makes its own int8 model) vs one "
        f"int8 calibration + quantization {int8:.2f} s: {dbg / int8:.2f}x (vs the calibration pass alone, "
        f"{calib:.2f} s: {dbg / calib:.2f}x); leave-one-out for the worst 3 adds {extra:.2f} s"
    )
    ok = dbg / int8 < 2
    print(f"    {'debug table < 2x one int8 calibration + quantization':28} {'PASS' if ok else 'FAIL'}")
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", choices=sorted(CASES), action="append", help="Run only these cases.")
    ap.add_argument("--no-debug-timing", action="store_true")
    args = ap.parse_args()
    ok = True
    with tempfile.TemporaryDirectory(prefix="bench-rescue-") as tmp:
        out = Path(tmp)
        for name in args.case or list(CASES):
            ok &= report(run_case(name, out))
        if not args.no_debug_timing:
            ok &= debug_timing(out)
    print("\nALL TARGETS MET" if ok else "\nSOME TARGETS MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

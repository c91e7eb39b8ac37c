"""Issue 4's targets, measured side by side in one run; prints ratios.

    python benchmarks/bench_backends.py

MobileNetV2 (224x224, weights=None; batch-norm statistics re-estimated on the calibration images so
int8 has a signal to keep): the post-training sweep (float32 baseline + float16, dynamic, int8,
int16x8) with the default backends (convert once, quantize the flatbuffer with LiteRT Quantizer) vs
the naive sweep with one TFLiteConverter conversion per scheme. Both produce, measure (accuracy-free
fidelity, latency, memory) and delegate-check the same candidates: target >= 5x faster end to end
(round 5: >= 7x; the compass target is 10x), int8 fidelity at least as good, and where each one's time goes,
phase by phase, side by side, with the float32 baseline's two routes (SavedModel round trip, direct) timed. Then a warm re-run of the unchanged sweep: target <= 0.1x the cold run;
then the default sweep with 1 and with 2 worker processes (how production scales when cores are idle).
Issue 44: target >= 10x end to end, and the sweep at most 1.5x its conversions alone (the same candidates made by a
script that only converts and quantizes, in a fresh process: `conversions_alone`).
Demo model: both backends' int8 side by side (size, accuracy, fidelity, latency).

    python benchmarks/bench_backends.py
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from optimize.core.recipe import build
from optimize.engine import sweeps
from optimize.models import _tf

SCHEMES = ("float32", "float16", "dynamic", "int8", "int16x8")
SAMPLES = 100


def mobilenet(folder: Path) -> tuple[Path, Path]:
    keras = _tf.keras()
    keras.utils.set_random_seed(0)
    model = keras.applications.MobileNetV2(weights=None, input_shape=(224, 224, 3), classifier_activation=None)
    rng = np.random.default_rng(0)
    xs = rng.uniform(-1, 1, (SAMPLES, 224, 224, 3)).astype(np.float32)
    for layer in model.layers:  # one pass in training mode with momentum 0: moving stats = batch stats
        if isinstance(layer, keras.layers.BatchNormalization):
            layer.momentum = 0.0
    model(xs[:32], training=True)
    path = folder / "mobilenetv2.keras"
    model.save(path)
    data = folder / "images.npz"
    np.savez(data, x_cal=xs, x_test=xs[:8])
    return path, data


def int8_fidelity(folder: Path, data: Path) -> float:
    """Mean |diff| of int8 logits from float32 logits on 64 seeded inputs (more than the sweep's 8)."""
    from optimize.measure.metrics import evaluate
    from optimize.models.data import from_arrays

    xs = np.random.default_rng(1).uniform(-1, 1, (64, 224, 224, 3)).astype(np.float32)
    m = evaluate(
        folder / "int8.tflite",
        from_arrays(x_cal=xs, x_test=xs),
        reference=folder / "float32.tflite",
        timing=False,
        samples=64,
    )
    return m.fidelity.outputs[0].mean_abs_diff


def script_sweep(model_path: Path, data: Path, out: Path) -> tuple[float, dict[str, float]]:
    """The naive sweep as users write it: one TFLiteConverter.from_keras_model conversion per scheme
    (bench_pipeline.bare_ptq), then the same measurement and delegate checks as optimize's sweep. Returns
    the wall time and where it went (convert, measure: accuracy, fidelity, latency and memory, delegates)."""
    from bench_pipeline import bare_ptq

    from optimize.delegates import check_delegates
    from optimize.measure.metrics import evaluate
    from optimize.models.data import load_data

    ds = load_data(data)
    phases = {"convert": 0.0, "measure": 0.0, "delegates": 0.0}
    t0 = time.perf_counter()
    bare_ptq(model_path, ds.calibration(SAMPLES), out)
    phases["convert"] = time.perf_counter() - t0
    for scheme in SCHEMES:
        ref = None if scheme == "float32" else out / "float32.tflite"
        t1 = time.perf_counter()
        evaluate(out / f"{scheme}.tflite", ds, reference=ref, samples=8)
        t2 = time.perf_counter()
        check_delegates(out / f"{scheme}.tflite")
        phases["measure"] += t2 - t1
        phases["delegates"] += time.perf_counter() - t2
    return time.perf_counter() - t0, phases


def _alone(model_path: str, data: str, out: str) -> None:
    """The conversions alone (`conversions_alone`), in this fresh process: what a script that only makes the
    candidates does. Prints the seconds of each step as JSON."""
    t0 = time.perf_counter()
    tf, keras = _tf.tf(), _tf.keras()
    from litert_quantizer import quantizer, recipe
    from litert_quantizer.algorithm_manager import AlgorithmName
    from litert_quantizer.qtyping import QuantGranularity, TFLOperationName

    steps = {"import": time.perf_counter() - t0}
    t = time.perf_counter()
    model = keras.models.load_model(model_path, compile=False)
    float32 = tf.lite.TFLiteConverter.from_keras_model(model).convert()
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "float32.tflite").write_bytes(float32)
    steps["float32"] = time.perf_counter() - t
    with np.load(data) as z:
        xs = z["x_cal"][:SAMPLES]
    fp16 = recipe.recipe_manager.RecipeManager()
    fp16.add_weight_only_config(".*", TFLOperationName.ALL_SUPPORTED, 16, QuantGranularity.CHANNELWISE,
                                AlgorithmName.FLOAT_CASTING)  # fmt: skip
    recipes = {"float16": fp16.get_quantization_recipe(), "dynamic": recipe.dynamic_wi8_afp32(),
               "int8": recipe.static_wi8_ai8(), "int16x8": recipe.static_wi8_ai16()}  # fmt: skip
    for scheme, rp in recipes.items():
        t = time.perf_counter()
        q = quantizer.Quantizer(float32, rp)
        calibration = None
        if scheme in ("int8", "int16x8"):
            name = _input_name(float32)
            calibration = q.calibrate({"serving_default": [{name: x[None]} for x in xs]})
        made = q.quantize(calibration, enable_progress_bar=False, enable_progress_report=False).quantized_model
        (folder / f"{scheme}.tflite").write_bytes(bytes(made))
        steps[scheme] = time.perf_counter() - t
    print(json.dumps(steps))


def _input_name(content: bytes) -> str:
    from ai_edge_litert.interpreter import Interpreter

    it = Interpreter(model_content=content)
    runner = it.get_signature_runner()
    return next(iter(runner.get_input_details()))


def conversions_alone(model_path: Path, data: Path, out: Path) -> tuple[float, dict[str, float]]:
    """The sweep's candidates made by a script that only converts and quantizes, with no measurement (issue 44): in
    a fresh process (it imports TensorFlow, as the sweep's opener does), the Keras model loaded, its float32
    converted once (TFLiteConverter.from_keras_model), then float16, dynamic, int8 and int16x8 by LiteRT Quantizer
    (the two calibrated on the same samples as the sweep), each written. (wall seconds, seconds per step.)"""
    import subprocess

    t0 = time.perf_counter()
    r = subprocess.run(
        [sys.executable, __file__, "--conversions-alone", str(model_path), str(data), str(out)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return time.perf_counter() - t0, json.loads(r.stdout.strip().splitlines()[-1])


def baseline_routes(model_path: Path, data: Path) -> list[str]:
    """The float32 baseline's two routes from the loaded Keras model, side by side: the SavedModel round trip
    (export, then TFLiteConverter.from_saved_model) and the direct route the sweep takes (one concrete
    function, frozen and converted, checked against the Keras model), with how far their outputs differ."""
    import tempfile

    from optimize.convert.keras import export_saved_model, float32_direct
    from optimize.models import runtime
    from optimize.models.data import load_data

    tf, keras = _tf.tf(), _tf.keras()
    model = keras.models.load_model(model_path, compile=False)
    ds = load_data(data)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        sm = export_saved_model(model, Path(tmp) / "sm")
        t1 = time.perf_counter()
        before = tf.lite.TFLiteConverter.from_saved_model(str(sm)).convert()
        t2 = time.perf_counter()
    made = float32_direct(model, ds)
    t3 = time.perf_counter()
    x = ds.x_test[:4]
    a = runtime.Runner(runtime.load(before)).predict(x)[0]
    b = runtime.Runner(runtime.load(made.content)).predict(x)[0] if made else a
    return [
        "  the float32 baseline from the loaded Keras model (seconds):",
        f"    SavedModel route: export {t1 - t0:5.1f} + convert {t2 - t1:5.1f} = {t2 - t0:5.1f}",
        f"    direct route (concrete function, outputs checked): {t3 - t2:5.1f}"
        + ("" if made else "  (NOT TAKEN: the sweep used the SavedModel route)"),
        f"    direct / SavedModel route: {(t3 - t2) / (t2 - t0):.2f}x; max |diff| of their outputs {np.abs(a - b).max():.2e}",
    ]


def phase_rows(script: dict[str, float], study) -> list[str]:
    """The naive script's phases beside the sweep's (summed over its candidates; the sweep's own opening too)."""
    from optimize.core.results import PHASES

    sweep = {p: sum(c.phases.get(p, 0.0) for c in study.candidates) for p in PHASES}
    sweep = {"open": study.open_seconds or 0.0, **{p: s for p, s in sweep.items() if s > 0}}
    rows = ["  where the time goes (seconds): naive script | default sweep (summed over candidates)"]
    for k, v in script.items():
        rows.append(f"    script  {k:10} {v:7.1f}")
    for k, v in sweep.items():
        rows.append(f"    sweep   {k:10} {v:7.1f}")
    rows.append(f"    sweep wall time {study.seconds:.1f} s (candidates produced in parallel overlap)")
    return rows


def main() -> int:
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        os.environ["OPTIMIZE_CACHE"] = str(tmp / "cache")
        model, data = mobilenet(tmp)
        recipes = [build(s, [{"technique": "convert", "scheme": s, "samples": SAMPLES}]) for s in SCHEMES]
        # the same candidates the naive script makes: no fit-* round (issue 45; bench_compat.py --fit measures it)
        common = dict(recipes=recipes, eval_samples=8, fit=False)
        print(f"load average before: {_load()}")
        c0 = _cpu()
        script_s, script_phases = script_sweep(model, data, tmp / "script")
        script_cpu = _cpu() - c0
        t0 = time.perf_counter()
        naive = sweeps.sweep(model, data, tmp / "naive", backend="converter", cache=False, **common)
        naive_s = time.perf_counter() - t0
        t0, c0 = time.perf_counter(), _cpu()
        cold = sweeps.sweep(model, data, tmp / "cold", backend="auto", **common)
        cold_s, cold_cpu = time.perf_counter() - t0, _cpu() - c0
        t0 = time.perf_counter()
        warm = sweeps.sweep(model, data, tmp / "warm", backend="auto", **common)
        warm_s = time.perf_counter() - t0
        print("MobileNetV2 224x224, post-training sweep (baseline + 4 schemes, measured and delegate-checked):")
        for label, st in (("naive (converter per scheme)", naive), ("default (LiteRT Quantizer)", cold)):
            print(f"  {label}:")
            for c in st.candidates:
                info = (
                    f"FAILED {c.error}"
                    if c.error
                    else (
                        f"{c.metrics.size.bytes / 1e6:5.2f} MB  |diff| {c.metrics.fidelity.outputs[0].mean_abs_diff:.4f}  "
                        f"p50 {c.metrics.latency.p50_ms:7.2f} ms  by {c.backend}, {c.seconds:.1f} s"
                        if c.metrics.fidelity
                        else f"{c.metrics.size.bytes / 1e6:5.2f} MB (baseline)"
                    )
                )
                print(f"    {c.name:8} {info}")
        print(
            f"  naive script (from_keras_model per scheme, same measurement) {script_s:.1f} s; optimize with "
            f"--backend converter {naive_s:.1f} s; default sweep {cold_s:.1f} s; warm re-run {warm_s:.1f} s"
        )
        ok &= _report("naive script / default sweep, end to end", script_s / cold_s, 10.0, higher_is_better=True)
        c0 = _cpu()
        alone_s, alone = conversions_alone(model, data, tmp / "alone")
        alone_cpu = _cpu() - c0
        steps = ", ".join(f"{k} {v:.1f}" for k, v in alone.items())
        print(f"  conversions alone (a fresh process; seconds: {steps}): {alone_s:.1f} s")
        ok &= _report("default sweep / its conversions alone", cold_s / alone_s, 1.5)
        print(
            f"  CPU seconds (this process and its children; what other work on the machine changes least): naive "
            f"script {script_cpu:.1f}, default sweep {cold_cpu:.1f} ({script_cpu / cold_cpu:.2f}x), conversions "
            f"alone {alone_cpu:.1f} (sweep / alone {cold_cpu / alone_cpu:.2f}x); load average now {_load()}"
        )
        for row in phase_rows(script_phases, cold):
            print(row)
        print(
            f"  (--backend converter sweep / default sweep: {naive_s / cold_s:.2f}x; per-scheme quantization "
            f"alone: {sum(c.seconds for c in naive.candidates[1:]) / sum(c.seconds for c in cold.candidates[1:]):.1f}x)"
        )
        for row in baseline_routes(model, data):
            print(row)
        fn, fd = int8_fidelity(tmp / "naive", data), int8_fidelity(tmp / "cold", data)
        print(f"  int8 fidelity (mean |diff| from float32 logits, 64 inputs): converter {fn:.5f}, LiteRT {fd:.5f}")
        ok &= _report("int8 |diff| default / naive (<= 1 is as good or better)", fd / fn, 1.0001)
        ok &= _report("warm re-run / cold run", warm_s / cold_s, 0.1)
        print(f"  warm re-run reused {sum(c.cached for c in warm.candidates)}/{len(warm.candidates)} candidates")
        walls = {}
        for jobs in (1, 2):
            t0 = time.perf_counter()
            sweeps.sweep(model, data, tmp / f"jobs{jobs}", backend="auto", cache=False, jobs=jobs, **common)
            walls[jobs] = time.perf_counter() - t0
        print(
            f"  scaling: default sweep with 1 worker {walls[1]:.1f} s, with 2 workers {walls[2]:.1f} s "
            f"({walls[1] / walls[2]:.2f}x; timing always runs alone)"
        )

        print("Demo model (digits CNN), int8 by each backend:")
        demo = [
            build(f"int8-{b}", [{"technique": "convert", "scheme": "int8"}]).with_backend(b)
            for b in ("converter", "litert")
        ]
        demo_study = sweeps.sweep(
            None, None, tmp / "demo", recipes=[build("float32", [{"technique": "convert"}]), *demo], fit=False
        )
        for c in demo_study.candidates[1:]:
            m = c.metrics
            print(
                f"  {c.name:15} {m.size.bytes:,} B (gzip {m.size.gzip_bytes:,})  top-1 {m.accuracy.top1 * 100:.2f}% "
                f"(Δ {m.accuracy_delta * 100:+.2f})  |diff| {m.fidelity.outputs[0].mean_abs_diff:.5f}  "
                f"agree {m.fidelity.top1_agreement * 100:.1f}%  p50 {m.latency.p50_ms:.4f} ms ({m.latency.threads} thr)"
            )
    print("ALL TARGETS MET" if ok else "SOME TARGETS MISSED")
    return 0 if ok else 1


def _cpu() -> float:
    """CPU seconds (user and system) of this process and of its children that ended."""
    import resource

    me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _report(label: str, value: float, limit: float, higher_is_better: bool = False) -> bool:
    good = value >= limit if higher_is_better else value <= limit
    print(
        f"  {label:58} {value:8.3f}   target {'>=' if higher_is_better else '<='} {limit:g}   "
        f"{'PASS' if good else 'FAIL'}"
    )
    return good


if __name__ == "__main__":
    if sys.argv[1:2] == ["--conversions-alone"]:
        _alone(*sys.argv[2:5])
        sys.exit(0)
    sys.exit(main())

"""Checking all five delegates vs loading the model in the interpreter, side by side; and the GPU column the
rules predict against the one observed in the runtime (issue 21).

Target (issue 12): checking GPU, NNAPI, Hexagon, Core ML and XNNPACK costs at most 1.2x the interpreter's
load + allocate_tensors of the same model. XNNPACK is observed in a loaded interpreter, so a check always
involves one load; in a sweep that load is the one measuring the candidate, and the parsed flatbuffer is
the one verification already read (pipeline.produce_verified). Three ways are timed, interleaved with the load, after a warm-up,
and the medians compared:

  standalone   check_delegates(path): reads the file and loads its own interpreter (the CLI's `compat`)
  shared load  load + check_delegates(path, loaded=...): the candidate's one load serves both
  shared both  load + check_delegates(path, loaded=..., parsed=...): the parse is shared too

Rules vs observed (where this machine has a Vulkan device LiteRT's GPU accelerator accepts, e.g. Mesa 25's
lavapipe, docs/platform-notes.md): per model, the nodes and the verdict the GPU rules predict (the classic
TfLiteGpuDelegateV2) beside what the accelerator (ML Drift) took, over the 14 models of the mediapipe 0.10.21
wheel as shipped and our own (MobileNetV2, and the trained demo CNN in every scheme including int4), with
every disagreement spelled out from both sides' reasons; and what one observation costs next to a load.

    python benchmarks/bench_compat.py                  # builds MobileNetV2 (weights=None), float32 and int8
    python benchmarks/bench_compat.py model.tflite --runs 30
    python benchmarks/bench_compat.py --skip-agreement  # the check's cost only

With --fit (issue 45): per model of the benchmark set (our Keras CNNs and MobileNetV2, a Whisper-style encoder,
a transformers ViT and BertModel and a masked encoder as .pt2 and .onnx, and the float models of the mediapipe
wheel), the targets fully delegated before and after fitting the float graph (`optimize.transforms.tflite.fit`),
and each rewrite with its output difference on the model's samples.

    python benchmarks/bench_compat.py --fit [--skip-mediapipe] [--fit-option float-mask]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))


def build_mobilenet_v2(folder: Path) -> list[Path]:
    """MobileNetV2 at 224x224 with random weights: float32, and int8 calibrated on seeded noise."""
    from optimize.models import _tf

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
    from optimize.delegates import check_delegates
    from optimize.models import runtime
    from optimize.models.tflite import read_model

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


def own_models(folder: Path) -> list[Path]:
    """The trained demo digits CNN as float32, float16, dynamic, int8 and int4, quantized by optimize."""
    from optimize.core import registry
    from optimize.core.registry import Context
    from optimize.models import _tf, demo
    from optimize.models.data import load_data

    model, data = demo.demo()
    f32 = folder / "demo_cnn_float32.tflite"
    keras_model = _tf.keras().models.load_model(model, compile=False)
    f32.write_bytes(_tf.tf().lite.TFLiteConverter.from_keras_model(keras_model).convert())
    ctx = Context(workdir=folder, data=load_data(data))
    quantize = registry.get("quantize")
    out = [f32]
    for scheme in ("float16", "dynamic", "int8", "int4"):
        made = quantize.fn(f32, quantize.parse({"scheme": scheme}), ctx)
        out.append(made.rename(folder / f"demo_cnn_{scheme}.tflite"))
    return out


def _ops(report) -> dict[str, str]:
    return {v.op: v.reason for v in report.cpu_nodes}


def explain(rules, seen) -> list[str]:
    """Every difference between the two columns, from both sides' own reasons."""
    if seen.veto_code == "build-failure" or rules.veto_code == "build-failure":
        out = []
        if rules.veto_code == "build-failure" and seen.veto_code != "build-failure":
            out.append(f"rules: build fails ({rules.vetoed[:160]}); ML Drift built it")
        if seen.veto_code == "build-failure" and rules.veto_code != "build-failure":
            out.append(f"ML Drift: {seen.vetoed}; the rules predict {rules.verdict}")
        return out
    mine, theirs = _ops(rules), _ops(seen)
    out = [f"ML Drift takes {op} (rules: {why[:110]})" for op, why in mine.items() if op not in theirs]
    out += [f"ML Drift refuses {op} ({why[:110]}); the rules take it" for op, why in theirs.items() if op not in mine]
    if not out and rules.nodes_delegated != seen.nodes_delegated:
        out.append("same ops refused; the partitions kept differ")
    return out


def _load_s(path: Path, threads: int) -> float | None:
    """One interpreter load + allocate with XNNPACK, as measuring does; None when this runtime cannot."""
    from optimize.core.errors import ModelError
    from optimize.models import runtime

    try:
        return _ms(lambda: runtime.load(path, threads=threads)) / 1000
    except ModelError:
        return None


def agreement(paths: list[Path], threads: int) -> None:
    """Rules vs observed per model, and the totals."""
    from optimize.delegates import check_delegates
    from optimize.delegates.observe import OBSERVED, gpu_device

    icd = gpu_device()
    if icd is None:
        print("\nrules vs observed: no Vulkan device the accelerator accepts here (docs/platform-notes.md)")
        return
    print(f"\nGPU: rules (classic delegate) vs observed (ML Drift on {icd.name}); nodes on the GPU / total")
    print(f"{'model':44} {'rules':>16} {'observed':>16}  nodes verdict  observing (/ a load)")
    same_nodes = same_verdict = 0
    for path in paths:
        t0 = time.perf_counter()
        r = check_delegates(path, ["gpu"], threads=threads, observe=["gpu"])
        seen_s = time.perf_counter() - t0
        load_s = _load_s(path, threads)
        rules, seen = r["gpu"], r[OBSERVED["gpu"]]
        nodes, verdict = rules.nodes_delegated == seen.nodes_delegated, rules.verdict == seen.verdict
        same_nodes, same_verdict = same_nodes + nodes, same_verdict + verdict
        cells = [
            f"{rules.verdict} {rules.nodes_delegated}/{rules.nodes_total}",
            f"{seen.verdict} {seen.nodes_delegated}",
        ]
        cells[1] += f"/{seen.nodes_total}"
        mark = f"{'=' if nodes else 'x':>5} {'=' if verdict else 'x':>7}"
        ratio = f"{seen_s / load_s:6.0f}x" if load_s else "  (no load: custom ops)"
        print(f"{path.name[:44]:44} {cells[0]:>16} {cells[1]:>16} {mark}  {seen_s:5.1f} s {ratio}")
        for why in explain(rules, seen):
            print(f"    {why}")
    n = len(paths)
    print(f"agreement: nodes {same_nodes}/{n} models, verdicts {same_verdict}/{n} models")


def _full(verdicts: dict) -> str:
    return ",".join(t for t, v in verdicts.items() if v == "full") or "-"


def fit_one(name: str, content: bytes, samples: list, non_negative: frozenset, options: frozenset) -> list[str]:
    """One model: targets run fully before and after the fit, then each rewrite and how far the outputs moved."""
    from optimize.delegates.blocking import words
    from optimize.transforms.tflite.fit import TARGETS, OutputCheck, fit_graph, reports
    from optimize.transforms.tflite.fit_rewrites import Facts

    t0 = time.perf_counter()
    fitted = fit_graph(content, TARGETS, Facts(non_negative, options), OutputCheck(content, samples, 2))
    seconds = time.perf_counter() - t0
    bought = ",".join(fitted.bought) or "-"
    print(f"{name[:30]:30} {_full(fitted.before):>17} {_full(fitted.after):>17} {bought:>12} {seconds:6.1f} s")
    for s in fitted.kept:
        exact = "bit for bit" if s.max_abs == 0 else f"max |diff| {s.max_abs:.1e} ({s.relative:.1e} of range)"
        print(f"    {s.rewrite} at {s.node} for {','.join(s.targets)}: {exact}")
    dropped = {(s.rewrite, s.why) for s in fitted.steps if s.why}
    for rewrite, why in sorted(dropped):
        print(f"    (dropped) {rewrite}: {why}")
    for t, r in reports(fitted.content, TARGETS).items():
        if r.verdict != "full":
            print(f"    {t} still: {words(r)[:110]}")
    return list(fitted.bought)


def fit_table(models: list, options: frozenset) -> None:
    print(f"\nThe fit (issue 45): targets run fully (gpu, coreml, nnapi) before and after, on {len(models)} models")
    print(f"{'model':30} {'before':>17} {'after':>17} {'bought':>12} {'time':>8}")
    gained = []
    for name, content, samples, non_negative in models:
        try:
            gained += [f"{name}:{t}" for t in fit_one(name, content, samples, non_negative, options)]
        except Exception as e:  # noqa: BLE001 - a model this runtime cannot run: said, the table goes on
            print(f"{name[:30]:30} could not be fitted here: {e.__class__.__name__}: {str(e)[:80]}")
    print(f"targets bought by the fit: {len(gained)} ({', '.join(gained) or 'none'})")


def _mediapipe_float(skip: bool) -> list:
    """The mediapipe wheel's models normalised to float32, with photos at their input size (those this runtime
    runs)."""
    if skip:
        return []
    from bench_real_models import input_shape, mediapipe_models, photos

    from optimize.models.normalize import normalize

    out = []
    for path in mediapipe_models(None):
        shape = input_shape(path)
        if shape is None:
            continue
        x = photos(*shape, 0.0, 1.0)
        out.append((path.stem, normalize(path.read_bytes()).content, [x[i : i + 1] for i in range(8)], frozenset()))
    return out


def fit_main(args) -> None:
    from fit_models import keras_models, torch_models

    with tempfile.TemporaryDirectory() as tmp:
        models = keras_models() + torch_models(Path(tmp)) + _mediapipe_float(args.skip_mediapipe)
        fit_table(models, frozenset(args.fit_option or ()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", nargs="*", help=".tflite files to measure (default: build MobileNetV2 float32 and int8)")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--skip-agreement", action="store_true", help="only the check's cost")
    ap.add_argument("--skip-mediapipe", action="store_true", help="rules vs observed on our own models only")
    ap.add_argument("--fit", action="store_true", help="targets fully delegated before and after the fit, per model")
    ap.add_argument("--fit-option", action="append", choices=["float-mask", "non-negative-ids"], help="with --fit")
    args = ap.parse_args()
    if args.fit:
        fit_main(args)
        return

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
        print("target: all five delegates checked <= 1.00x one load + allocate (shared both, as in a sweep)")
        if not args.skip_agreement:
            from bench_real_models import mediapipe_models

            mp = [] if args.skip_mediapipe else mediapipe_models(None)
            agreement(mp + paths + own_models(Path(tmp)), args.threads)


if __name__ == "__main__":
    main()

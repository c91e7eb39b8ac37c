"""Latency noise: the older one-after-another timing against round-robin rounds, side by side in one run.

On the demo CNN and on MobileNetV2 (tf_keras, weights=None, no download; random calibration data), the
candidates of one sweep (float32, float16, dynamic, int8, plus `int8-copy`, a byte-identical copy of the
int8 file) are re-timed five times each way, the two ways alternating so drift over the run hits both:

    before  timing.time_invoke, each candidate timed alone in turn (work.TimingTask(interleave=False));
            picks and Pareto front on the bare p50 (the older ranking); "slower" when the quartiles of
            single runs separate (the older test)
    after   optimize.measure.timing.time_rounds, all candidates in rotating rounds (the sweep's timing now);
            decisions by interval (optimize.measure.noise), as optimize.decide.choose makes them

It prints, per model: the spread of each candidate's p50 across the five re-timings ((max - min) /
median, the mean over candidates), the same for latency relative to float32's (what a comparison reads:
p50 over p50 before, the median of the per-round ratios after),
how often the int8 copy is called slower or faster than int8 (identical bytes: it never should be), and
how many of the five re-timings pick a candidate (latency objective, cpu) or draw a Pareto front other
than the most common one (target: 0 of 5).

    python benchmarks/bench_latency_noise.py [--repeats 5] [--only demo|mobilenet_v2] [--verbose]

The sweeps go through the result cache ($OPTIMIZE_CACHE): a second run of the script only re-times.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

RECIPES = ("float16", "dynamic", "int8")


def sweep(model, data, out: Path):
    import optimize
    from optimize.engine.plan import default_recipes

    recipes = [r for r in default_recipes(include_training=False) if r.name in RECIPES]
    study = optimize.sweep(model, data, out, recipes=recipes, delegates=False, eval_samples=64)
    int8 = study.candidate("int8")
    shutil.copy(out / int8.artifact, out / "int8-copy.tflite")
    copy = int8.model_copy(update={"name": "int8-copy", "artifact": "int8-copy.tflite"})
    return study.model_copy(update={"candidates": [*study.candidates, copy]})


def mobilenet_v2(folder: Path) -> tuple[Path, Path]:
    from optimize.models import _tf

    keras = _tf.keras()
    keras.utils.set_random_seed(0)
    model = folder / "mobilenet_v2.keras"
    keras.applications.MobileNetV2(weights=None, input_shape=(224, 224, 3)).save(model)
    data = folder / "random224.npz"
    np.savez(data, x=np.random.default_rng(0).uniform(-1, 1, (64, 224, 224, 3)).astype(np.float32))
    return model, data


def retime(study, out: Path, sample, interleave: bool):
    from optimize.engine.work import TimingTask, time_task

    cands = time_task(TimingTask(tuple(study.candidates), out, sample, threads=2, runs=50, interleave=interleave))
    return study.model_copy(update={"candidates": cands})


def _bare_front(cands) -> tuple[str, ...]:
    """The older Pareto front: size, bare p50 and accuracy, strictly."""
    pts = {c.name: (c.metrics.size.bytes, c.p50_ms, -(c.accuracy_score or 0)) for c in cands if c.ok}

    def dom(a, b):
        return all(x <= y for x, y in zip(a, b)) and any(x < y for x, y in zip(a, b))

    return tuple(n for n in pts if not any(dom(pts[o], pts[n]) for o in pts if o != n))


def decide(study, interleaved: bool) -> tuple[str, tuple[str, ...]]:
    """(latency pick for cpu, Pareto front): by interval after, by the bare p50 before."""
    from optimize.decide.choose import make_goals, recommend

    rec = recommend(study, "cpu", make_goals(objective="latency", max_output_error=1.0))
    if interleaved:
        return rec.chosen, tuple(rec.pareto)
    eligible = [study.candidate(n) for n in rec.ranked]
    pick = min(eligible, key=lambda c: (c.p50_ms, c.metrics.size.bytes)).name if eligible else None
    return pick, _bare_front(study.candidates)


def ratio(c, base) -> float:
    """c's latency over base's: round by round when timed in the same rounds (what a comparison reads)."""
    from optimize.measure.noise import paired, ratio_interval

    a, b = c.metrics.latency, base.metrics.latency
    return ratio_interval(a, b)[0] if paired(a, b) else a.p50_ms / b.p50_ms


def spread(values: list[float]) -> float:
    return (max(values) - min(values)) / statistics.median(values)


def summary(runs: list, interleaved: bool) -> dict:
    from optimize.measure.noise import speed

    names = [c.name for c in runs[0].candidates if c.ok and c.p50_ms is not None]
    p50 = {n: [s.candidate(n).p50_ms for s in runs] for n in names}
    rel = {n: [ratio(s.candidate(n), s.candidate("float32")) for s in runs] for n in names if n != "float32"}
    decisions = [decide(s, interleaved) for s in runs]
    picks, fronts = [d[0] for d in decisions], [d[1] for d in decisions]
    apart = sum(speed(s.candidate("int8-copy"), s.candidate("int8")) != "same" for s in runs)
    return {
        "p50": statistics.fmean(spread(v) for v in p50.values()),
        "rel": statistics.fmean(spread(v) for v in rel.values()),
        "copy": apart,
        "picks": len(picks) - Counter(picks).most_common(1)[0][1],
        "fronts": len(fronts) - Counter(fronts).most_common(1)[0][1],
        "seen": sorted(set(picks)),
        "ms": {n: statistics.median(v) for n, v in p50.items()},
    }


def bench(name: str, study, out: Path, sample, repeats: int, verbose: bool = False) -> None:
    runs = {False: [], True: []}
    spent = {False: 0.0, True: 0.0}
    t0 = time.perf_counter()
    for _ in range(repeats):
        for interleaved in (False, True):
            t1 = time.perf_counter()
            runs[interleaved].append(retime(study, out, sample, interleaved))
            spent[interleaved] += time.perf_counter() - t1
    before, after = summary(runs[False], False), summary(runs[True], True)
    n = repeats
    print(f"\n{name}: {len(study.candidates)} candidates, {n} re-timings each way ({time.perf_counter() - t0:.0f} s)")
    print("  p50 (median of re-timings, ms): " + ", ".join(f"{k} {v:.3g}" for k, v in after["ms"].items()))
    rows = (
        ("p50 spread across re-timings (mean)", f"{before['p50']:.3f}", f"{after['p50']:.3f}"),
        ("p50 / float32 spread (mean)", f"{before['rel']:.3f}", f"{after['rel']:.3f}"),
        ("int8-copy called different from int8", f"{before['copy']} of {n}", f"{after['copy']} of {n}"),
        ("latency pick differs from the usual", f"{before['picks']} of {n}", f"{after['picks']} of {n}"),
        ("Pareto front differs from the usual", f"{before['fronts']} of {n}", f"{after['fronts']} of {n}"),
    )
    print(f"  {'':38s} {'before':>9s} {'after':>9s} {'after/before':>13s}")
    for label, b, a in rows:
        ratio = f"{float(a) / float(b):.2f}" if " of " not in a and float(b) else ""
        print(f"  {label:38s} {b:>9s} {a:>9s} {ratio:>13s}")
    print(f"  picks seen: before {', '.join(before['seen'])}; after {', '.join(after['seen'])}")
    b, a = spent[False] / n, spent[True] / n
    print(f"  seconds per re-timing (with the peak-memory probe): before {b:.1f}, after {a:.1f} ({a / b:.2f}x)")
    if verbose:
        from optimize.measure.noise import paired, ratio_interval

        for k, s in enumerate(runs[True]):
            base = s.candidate("float32").metrics.latency
            cells = []
            for c in s.candidates:
                lat = c.metrics.latency
                if c.name != "float32" and lat is not None and paired(lat, base):
                    mid, lo, hi = ratio_interval(lat, base)
                    cells.append(f"{c.name} {mid:.2f} ({lo:.2f}-{hi:.2f})")
            print(f"  after #{k + 1}: p50 float32 {base.p50_ms:.3g} ms; x float32: " + ", ".join(cells))
            print(f"    pick {decide(s, True)[0]}, front {', '.join(decide(s, True)[1])}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--only", choices=("demo", "mobilenet_v2"))
    ap.add_argument("--verbose", action="store_true", help="Each re-timing's ratios to float32, round by round.")
    args = ap.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="bench-noise-"))
    try:
        if args.only in (None, "demo"):
            from optimize.convert.demo import demo_data_arrays

            study = sweep(None, None, folder / "demo")
            bench("demo CNN", study, folder / "demo", demo_data_arrays()["x_test"][:1], args.repeats, args.verbose)
        if args.only in (None, "mobilenet_v2"):
            model, data = mobilenet_v2(folder)
            study = sweep(model, data, folder / "mnv2")
            bench("MobileNetV2", study, folder / "mnv2", np.load(data)["x"][:1], args.repeats, args.verbose)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()

"""An unchanged sweep re-run, as a user runs it: each run a fresh `optimize sweep` process (issue 26).

A warm re-run must decide "every candidate is cached" without importing TensorFlow (~3 s, more than the
rest of a warm run together): what loading the model found is kept in the cache beside the candidates
(optimize.models.known). For each model: a cold run (a fresh result cache and output folder), then warm
re-runs into fresh output folders with the same cache; printed: the wall times, warm / cold (target <= 0.05
for the demo sweep), every candidate reused, and whether the warm process imported TensorFlow.

    python benchmarks/bench_warm.py                   # the demo sweep (the built-in digits CNN)
    python benchmarks/bench_warm.py --all             # also a SavedModel and a .tflite of it
    python benchmarks/bench_warm.py --repeat 3        # warm runs per model (the median is the figure)

Wall times on a shared machine drift; the ratio is of two runs of the same process, side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET = 0.05


def _run(args: list[str], cwd: Path, env: dict) -> tuple[float, bool, subprocess.CompletedProcess]:
    """Wall time of one CLI process, and whether it imported TensorFlow (python -X importtime)."""
    cmd = [sys.executable, "-X", "importtime", "-c", "from optimize.cli import main; main()", *args]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - t0
    if r.returncode != 0:
        sys.exit(f"{' '.join(args)} failed ({r.returncode}):\n{r.stderr[-3000:]}")
    imported = any(line.rstrip().endswith("| tensorflow") for line in r.stderr.splitlines())
    return elapsed, imported, r


def _models(tmp: Path, everything: bool) -> list[tuple[str, list[str]]]:
    """(label, sweep arguments) per model: the demo; with --all, a SavedModel and a float .tflite of it."""
    out = [("demo sweep (Keras 2 CNN)", [])]
    if not everything:
        return out
    from optimize.convert import demo
    from optimize.convert.keras import export_saved_model
    from optimize.models import source

    model, data = demo.demo()
    sm = export_saved_model(source.load_keras2(source.open_model(model)), tmp / "demo_savedmodel")
    from optimize.core.registry import Context, get

    tech = get("convert")
    tfl = tech.fn(sm, tech.params(scheme="float32"), Context(workdir=tmp / "conv"))
    out.append(("SavedModel of it", [str(sm), "--data", str(data)]))
    out.append((".tflite of it", [str(tfl), "--data", str(data)]))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--all", action="store_true", help="also a SavedModel and a .tflite of the demo model")
    ap.add_argument("--repeat", type=int, default=3, help="warm runs per model (median)")
    args = ap.parse_args()
    env = {**os.environ, "NO_COLOR": "1"}
    ok = True
    with tempfile.TemporaryDirectory(prefix="bench-warm-") as t:
        tmp = Path(t)
        from optimize.convert import demo

        demo.demo()  # trained once beforehand (~/.cache/optimize): not part of any timed run
        for i, (label, model_args) in enumerate(_models(tmp, args.all)):
            cache = tmp / f"cache{i}"
            base = ["sweep", *model_args, "--cache", str(cache), "--jobs", "2"]
            cold_s, _, _ = _run([*base, "-o", str(tmp / f"cold{i}")], tmp, env)
            warm = []
            for k in range(args.repeat):
                out = tmp / f"warm{i}-{k}"
                s, imported, _ = _run([*base, "-o", str(out)], tmp, env)
                study = json.loads((out / "study.json").read_text())
                reused = sum(c["cached"] for c in study["candidates"])
                warm.append((s, imported, reused, len(study["candidates"])))
            median = statistics.median(s for s, *_ in warm)
            ratio = median / cold_s
            passed = ratio <= TARGET and not any(imp for _, imp, *_ in warm)
            ok &= passed or i > 0  # the target is the demo sweep's; the others (seconds cold) are reported
            print(f"{label}:")
            print(f"  cold {cold_s:.1f} s; warm {', '.join(f'{s:.2f}' for s, *_ in warm)} s (median {median:.2f})")
            print(f"  reused {warm[0][2]}/{warm[0][3]} candidates; TensorFlow imported in a warm run: "
                  f"{'yes' if any(imp for _, imp, *_ in warm) else 'no'}")  # fmt: skip
            verdict = f"target <= {TARGET}   {'PASS' if passed else 'FAIL'}" if i == 0 else "reported"
            print(f"  warm / cold {ratio:.3f}   {verdict}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())

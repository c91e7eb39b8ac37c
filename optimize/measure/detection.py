"""Detection as a task: recognise a detector's head and count the detections a candidate keeps of float32's.

A detector's outputs are not judged well by a tensor-wide error: YOLOv8's one head holds pixel boxes beside 0..1
class scores, and an int8 scale for the whole tensor turns every score into 0 or one step (measured: 0 of 23
detections kept) while the tensor's relative error reads 0.15%. What the user ships is the detections, so that
is what is compared: float32's detections on the samples (score at least a stated threshold, per-class
non-maximum suppression), each kept when the candidate has one of the same class at IoU >= 0.5 (scoring at
least the threshold less `MARGIN`: a borderline score that crosses the threshold by a rounding is not a loss).

Heads recognised (from the output shapes and float32's values on the data, or named with `--task detect`):
- `yolo`: one output [1, 4+C, N] or [1, N, 4+C]: cx, cy, w, h then C class scores in 0..1 (YOLOv8, v11).
- `yolov5`: one output [1, N, 5+C]: boxes, an objectness, C class scores (score = objectness x class). Named only.
- `ssd`: a boxes output [1, N, 4] (corners) beside a scores output [1, N, C] or [1, C, N] (SSD, decoded PicoDet).
- `anchors`: raw anchor regressions [1, N, 4+2K] (keypoints after the box) beside scores [1, N, C], as
  MediaPipe's face and pose detectors give them before decoding. Compared anchor by anchor: both models share
  the anchors, and a box offset from its anchor's centre, scaled alike, has the decoded box's IoU.
Scores outside 0..1 are logits (a sigmoid is applied). Pure numpy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from optimize.core.errors import DataError
from optimize.core.results import DetectionFidelity
from optimize.measure.slices import Slice

LAYOUTS = ("yolo", "yolov5", "ssd", "anchors")
DEFAULT_SCORE = 0.25
IOU = 0.5
NMS_IOU = 0.5
#: A detection whose score lies at most this far below the threshold on the other side still counts as made
#: there: a score that crosses the threshold by less is rounding (a borderline anchor), not a detection lost.
MARGIN = 0.05
#: Detections per sample considered before suppression (the highest scores): a model whose scores all read
#: one step above the threshold (a broken int8 head) does not make suppression quadratic in its anchors.
TOP_K = 1000


@dataclass(frozen=True)
class Layout:
    """Where a detector's boxes and scores are: `outputs` (one for yolo, boxes then scores for a pair), the
    feature axis of a yolo head, and whether the scores are logits."""

    kind: str
    outputs: tuple[int, ...]
    axis: int = 2
    logits: bool = False
    scores_axis: int = 2  # a pair's scores: [1, N, C] (2) or [1, C, N] (1)

    def slices(self, shapes: list[tuple[int, ...]]) -> dict[int, list[Slice]]:
        """The named slices of a one-output head (boxes, objectness, scores), by output index."""
        if self.kind not in ("yolo", "yolov5"):
            return {}
        i = self.outputs[0]
        f = shapes[i][self.axis]
        first = 5 if self.kind == "yolov5" else 4
        return {i: [Slice("boxes", self.axis, (0, 1, 2, 3)), Slice("scores", self.axis, tuple(range(first, f)))]}


def _unit(a: np.ndarray) -> bool:
    return bool(a.size) and float(a.min()) >= -1e-6 and float(a.max()) <= 1 + 1e-6


def _yolo(i: int, shape: tuple[int, ...], ref: np.ndarray, declared: bool) -> Layout | None:
    if len(shape) != 3:
        return None
    axis = 1 if shape[1] < shape[2] else 2
    f, n = shape[axis], shape[3 - axis]
    if f < 5 or (not declared and (n < 8 * f or f > 1024)):
        return None
    scores = np.take(ref, range(4, f), axis=axis)
    if not declared and not _unit(scores):
        return None
    return Layout("yolo", (i,), axis=axis, logits=not _unit(scores))


def _boxes_output(shape: tuple[int, ...]) -> bool:
    """[1, N, 4+2K]: boxes (and K keypoints) per anchor, N at least 16."""
    return len(shape) == 3 and 4 <= shape[2] <= 44 and shape[2] % 2 == 0 and shape[1] >= 16


def _scores_axis(boxes: tuple[int, ...], scores: tuple[int, ...]) -> int:
    """Where a scores output keeps the boxes' N anchors: axis 2 of [1, N, C] or 1 of [1, C, N] (0: neither)."""
    if len(scores) != 3:
        return 0
    return 2 if scores[1] == boxes[1] else (1 if scores[2] == boxes[1] else 0)


def _pair(shapes: list[tuple[int, ...]], ref: list[np.ndarray]) -> Layout | None:
    """A boxes output [1, N, 4+2K] and a scores output sharing its N (on axis 1 or 2)."""
    for b, sb in enumerate(shapes):
        if not _boxes_output(sb):
            continue
        for s, ss in enumerate(shapes):
            axis = _scores_axis(sb, ss) if s != b else 0
            if not axis or (axis == 2 and ss[2] == sb[2] and s < b):  # two of a kind: the first holds the boxes
                continue
            kind = "ssd" if sb[2] == 4 and _corners(ref[b]) else "anchors"
            return Layout(kind, (b, s), logits=not _unit(ref[s]), scores_axis=axis)
    return None


def _corners(boxes: np.ndarray) -> bool:
    """Whether boxes read as corners (x2 >= x1 and y2 >= y1 on every anchor): decoded boxes, not offsets."""
    return bool((boxes[..., 2] >= boxes[..., 0]).all() and (boxes[..., 3] >= boxes[..., 1]).all())


def _first_yolo(shapes: list[tuple[int, ...]], ref: list[np.ndarray], declared: bool) -> Layout | None:
    return next((lay for i, sh in enumerate(shapes) if (lay := _yolo(i, sh, ref[i], declared))), None)


def _named(shapes: list[tuple[int, ...]], ref: list[np.ndarray], declared: str) -> Layout | None:
    """The head of the layout the user named."""
    if declared in ("ssd", "anchors"):
        found = _pair(shapes, ref)
        return found and Layout(declared, found.outputs, found.axis, found.logits, found.scores_axis)
    found = _first_yolo(shapes, ref, True)
    if found and declared == "yolov5":
        return Layout("yolov5", found.outputs, 2, not _unit(np.take(ref[found.outputs[0]], range(4, 5), 2)))
    return found


def recognise(shapes: list[tuple[int, ...]], ref: list[np.ndarray], declared: str | None = None) -> Layout | None:
    """The detector head among the outputs (`shapes` batch first, `ref` float32's outputs on the data), or
    None. `declared`: the layout the user named (`--task detect`, `yolo`, ... or "" to recognise one): a head
    that does not fit it is one clear error."""
    if declared:
        found = _named(shapes, ref, declared)
    else:
        found = _first_yolo(shapes, ref, False) or _pair(shapes, ref)
        if found is None and declared is not None:  # --task detect: a yolo head whose scores are logits
            found = _first_yolo(shapes, ref, True)
    if found is None and declared is not None:
        raise DataError(
            f"--task detect: no {declared or 'detector'} head among the outputs "
            f"({', '.join(str(list(s)) for s in shapes)}).",
            "A yolo head is [1, 4+C, N] or [1, N, 4+C]; ssd and anchors heads are boxes [1, N, 4+2K] beside "
            "scores [1, N, C].",
        )
    return found


# ------------------------------------------------------------------------------------------------ detections
def _sigmoid(a: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-np.clip(a.astype(np.float64), -60, 60)))


def _boxes_scores(outs: list[np.ndarray], lay: Layout, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Sample k's boxes [N, 4] (corners, or raw cx, cy, w, h for anchors) and class scores [N, C] (0..1)."""
    if lay.kind in ("yolo", "yolov5"):
        head = outs[lay.outputs[0]][k]
        rows = head.T if lay.axis == 1 else head  # [N, F]
        rows = rows.astype(np.float64)
        first = 5 if lay.kind == "yolov5" else 4
        scores = _sigmoid(rows[:, first:]) if lay.logits else rows[:, first:]
        if lay.kind == "yolov5":
            obj = rows[:, 4:5]
            scores = scores * (_sigmoid(obj) if lay.logits else obj)
        return _corners_of(rows[:, :4]), scores
    boxes = outs[lay.outputs[0]][k][:, :4].astype(np.float64)
    scores = outs[lay.outputs[1]][k].astype(np.float64)
    scores = scores.T if lay.scores_axis == 1 else scores
    scores = _sigmoid(scores) if lay.logits else scores
    return (boxes if lay.kind == "ssd" else _corners_of(boxes)), scores


def _corners_of(cxcywh: np.ndarray) -> np.ndarray:
    cx, cy, w, h = cxcywh.T
    w, h = np.abs(w), np.abs(h)  # a raw regression's size can come out negative; its extent is the same
    return np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=1)


def iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of every box in a [n, 4] with every box in b [m, 4] (corners; either axis order)."""
    x1 = np.maximum(a[:, None, 0], b[None, :, 0])
    y1 = np.maximum(a[:, None, 1], b[None, :, 1])
    x2 = np.minimum(a[:, None, 2], b[None, :, 2])
    y2 = np.minimum(a[:, None, 3], b[None, :, 3])
    inter = np.clip(x2 - x1, 0, None) * np.clip(y2 - y1, 0, None)
    area = lambda c: np.clip(c[:, 2] - c[:, 0], 0, None) * np.clip(c[:, 3] - c[:, 1], 0, None)  # noqa: E731
    union = area(a)[:, None] + area(b)[None, :] - inter
    same = np.all(a[:, None, :] == b[None, :, :], axis=-1)  # two empty boxes that are one box overlap fully
    return np.where(union > 0, inter / np.where(union > 0, union, 1), same.astype(np.float64))


def _nms(boxes: np.ndarray, scores: np.ndarray, classes: np.ndarray) -> np.ndarray:
    """Indices kept by per-class greedy non-maximum suppression at `NMS_IOU`, highest score first."""
    order = np.argsort(-scores, kind="stable")[:TOP_K]
    keep: list[int] = []
    for c in np.unique(classes[order]):
        idx = order[classes[order] == c]
        over = iou(boxes[idx], boxes[idx]) > NMS_IOU
        alive = np.ones(len(idx), bool)
        for j in range(len(idx)):
            if alive[j]:
                keep.append(int(idx[j]))
                alive &= ~over[j]
    return np.array(sorted(keep, key=lambda i: -scores[i]), dtype=np.int64)


@dataclass
class _Dets:
    boxes: np.ndarray
    classes: np.ndarray
    scores: np.ndarray
    anchors: np.ndarray


def detections(outs: list[np.ndarray], lay: Layout, k: int, threshold: float) -> _Dets:
    """Sample k's detections: the best class per anchor at or above the threshold, suppressed per class for
    decoded heads (an anchor head keeps every anchor: they are compared anchor by anchor)."""
    boxes, scores = _boxes_scores(outs, lay, k)
    classes = scores.argmax(axis=1) if scores.shape[1] else np.zeros(len(scores), np.int64)
    best = scores.max(axis=1) if scores.shape[1] else np.zeros(len(scores))
    finite = np.isfinite(best) & np.isfinite(boxes).all(axis=1)
    at = np.flatnonzero((best >= threshold) & finite)
    if lay.kind != "anchors" and len(at):
        at = at[_nms(boxes[at], best[at], classes[at])]
    return _Dets(boxes[at], classes[at], best[at], at)


def _match(ref: _Dets, mine: _Dets, per_anchor: bool) -> tuple[int, list[float], int]:
    """(float32's detections kept, their IoUs, the candidate's detections float32 does not make)."""
    if not len(ref.anchors):
        return 0, [], len(mine.anchors)
    if not len(mine.anchors):
        return 0, [], 0
    overlap = iou(ref.boxes, mine.boxes)
    same = ref.classes[:, None] == mine.classes[None, :]
    if per_anchor:
        same &= ref.anchors[:, None] == mine.anchors[None, :]
    overlap = np.where(same, overlap, -1.0)
    used = np.zeros(len(mine.anchors), bool)
    ious: list[float] = []
    for r in range(len(ref.anchors)):  # in float32's score order
        row = np.where(used, -1.0, overlap[r])
        j = int(row.argmax())
        if row[j] >= IOU:
            used[j] = True
            ious.append(float(row[j]))
    return len(ious), ious, int((~used).sum())


def compare(
    outs: list[np.ndarray], ref: list[np.ndarray], names: list[str], lay: Layout, threshold: float = DEFAULT_SCORE
) -> DetectionFidelity:
    """The candidate's detections against float32's, over the samples where both outputs are finite."""
    total = kept = extra = 0
    ious: list[float] = []
    low = max(0.0, threshold - MARGIN)
    anchors = lay.kind == "anchors"
    for k in range(len(ref[lay.outputs[0]])):
        r, m = detections(ref, lay, k, threshold), detections(outs, lay, k, threshold)
        n, got, _ = _match(r, detections(outs, lay, k, low), anchors)
        made, _, _ = _match(m, detections(ref, lay, k, low), anchors)  # the candidate's that float32 makes too
        total, kept, extra = total + len(r.anchors), kept + n, extra + len(m.anchors) - made
        ious += got
    return DetectionFidelity(
        layout=lay.kind,
        outputs=[names[i] for i in lay.outputs],
        score_threshold=threshold,
        iou_threshold=IOU,
        reference_detections=total,
        kept=kept,
        extra=extra,
        mean_iou=float(np.mean(ious)) if ious else None,
    )

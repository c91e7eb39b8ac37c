"""Detection as a task: recognise a detector's head and count the detections a candidate keeps of float32's.

A detector's outputs are not judged well by a tensor-wide error: YOLOv8's one head holds pixel boxes beside 0..1
class scores, and an int8 scale for the whole tensor turns every score into 0 or one step (measured: 0 of 23
detections kept) while the tensor's relative error reads 0.15%; a post-processed head's classes compared slot by
slot read as large error when one detection moves a slot. What the user ships is the detections, so that is what
is compared: float32's detections on the samples (score at least a stated threshold; rows of a raw head
suppressed per class, rows a model selected itself taken as they are, its count respected), each kept when the
candidate has one of the same class at IoU >= 0.5 (scoring at least the threshold less `MARGIN`: a borderline
score that crosses the threshold by a rounding is not a loss).

The layouts recognised (raw heads, box/score pairs, anchors, post-processed, end-to-end) are one table,
`optimize.measure.layouts`. This is the one count of detections: the guard's figure, the selective search's
held-out judge and `optimize debug` all call `compare`; a split where float32 makes fewer than `FEW_DETECTIONS`
detections gives a rough figure, said so (`DetectionFidelity.few`), and one where it makes none gives no share,
never "everything kept". Beside the pooled share, the share kept on the worst samples (`PERCENTILE`). Pure numpy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from optimize.core import results
from optimize.core.errors import DataError
from optimize.core.results import DetectionFidelity
from optimize.measure import layouts

LAYOUTS = layouts.LAYOUTS
Layout = layouts.Layout
DEFAULT_SCORE = 0.25
IOU = 0.5
NMS_IOU = 0.5
#: A detection whose score lies at most this far below the threshold on the other side still counts as made
#: there: a score that crosses the threshold by less is rounding (a borderline anchor), not a detection lost.
MARGIN = 0.05
#: Detections per sample considered before suppression (the highest scores): a model whose scores all read
#: one step above the threshold (a broken int8 head) does not make suppression quadratic in its anchors.
TOP_K = 1000
#: Fewer of float32's detections than this on a split make its share kept a rough figure (starred; the
#: selective search draws more samples to judge on).
FEW_DETECTIONS = results.FEW_DETECTIONS
#: The per-sample figure: this percentile of the samples' shares kept (the worst samples beside the pooled share).
PERCENTILE = 5


def recognise(
    shapes: list[tuple[int, ...]],
    ref: list[np.ndarray],
    declared: str | None = None,
    roles: list[str | None] | None = None,
) -> Layout | None:
    """The detector head among the outputs (`shapes` batch first, `ref` float32's outputs on the data, `roles`
    what a post-processing op says each output holds), or None. `declared`: the layout the user named
    (`--task detect`, `yolo`, ... or "" to recognise one): a head that does not fit it is one clear error that
    lists the known layouts beside the model's real output shapes."""
    found = layouts.find(layouts.Outputs(list(shapes), ref, list(roles or [None] * len(shapes))), declared)
    if found is None and declared is not None:
        raise DataError(
            f"--task detect: no {declared or 'detector'} head among the outputs "
            f"({', '.join(str(list(s)) for s in shapes)}).",
            f"Known layouts: {layouts.known()}.",
        )
    return found


def head_of(ref: list[np.ndarray], task=None, roles: list[str | None] | None = None) -> Layout | None:
    """The detector head the sweep's guard, the selective search and `optimize debug` all recognise, from
    float32's outputs on the samples (`--task detect` recognising harder, as the guard does; a head that does
    not fit is None here, the guard's candidate says why)."""
    try:
        return recognise(shapes_of(ref), ref, "" if task == "detect" else None, roles)
    except DataError:
        return None


def shapes_of(ref: list[np.ndarray]) -> list[tuple[int, ...]]:
    """The outputs' real shapes, batch of 1, from float32's outputs on the samples (stacked, samples first): a
    post-processing op's outputs have no shape in the flatbuffer until the runtime runs them."""
    return [(1, *r.shape[1:]) for r in ref]


# ------------------------------------------------------------------------------------------------ detections
def iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of every box in a [n, 4] with every box in b [m, 4] (corners; either axis order)."""
    x1 = np.maximum(a[:, None, 0], b[None, :, 0])
    y1 = np.maximum(a[:, None, 1], b[None, :, 1])
    x2 = np.minimum(a[:, None, 2], b[None, :, 2])
    y2 = np.minimum(a[:, None, 3], b[None, :, 3])
    inter = np.clip(x2 - x1, 0, None) * np.clip(y2 - y1, 0, None)
    area = lambda c: np.clip(c[:, 2] - c[:, 0], 0, None) * np.clip(c[:, 3] - c[:, 1], 0, None)  # noqa: E731
    union = area(a)[:, None] + area(b)[None, :] - inter
    out = inter / np.where(union > 0, union, 1)
    empty = union <= 0
    if empty.any():  # two empty boxes that are one box overlap fully
        out[empty] = np.all(a[:, None, :] == b[None, :, :], axis=-1)[empty]
    return out


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
    """Sample k's detections: the rows its layout reads at or above the threshold, suppressed per class where
    they are a raw head's anchors (an anchor head keeps every anchor: they are compared anchor by anchor; rows a
    model selected itself are taken as they are)."""
    entry = lay.entry
    rows = entry.read(outs, lay, k)
    finite = np.isfinite(rows.scores) & np.isfinite(rows.boxes).all(axis=1)
    at = np.flatnonzero((rows.scores >= threshold) & finite)
    if not (entry.selected or entry.per_anchor) and len(at):
        at = at[_nms(rows.boxes[at], rows.scores[at], rows.classes[at])]
    return _Dets(rows.boxes[at], rows.classes[at], rows.scores[at], at)


def _above(d: _Dets, threshold: float) -> _Dets:
    """The detections scoring at least `threshold` among those read at a lower one. Exactly what reading at
    `threshold` gives: suppression keeps the highest scores first, so a detection's fate depends only on those
    scoring more than it, all of which are above the threshold too."""
    at = d.scores >= threshold
    return _Dets(d.boxes[at], d.classes[at], d.scores[at], d.anchors[at])


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
    best = overlap.argmax(axis=1)
    took = overlap[np.arange(len(best)), best]
    ok = took >= IOU
    if len(np.unique(best[ok])) == int(ok.sum()):  # no two of float32's want one detection: greedy is this
        return int(ok.sum()), [float(v) for v in took[ok]], len(mine.anchors) - int(ok.sum())
    used = np.zeros(len(mine.anchors), bool)
    ious: list[float] = []
    for r in range(len(ref.anchors)):  # in float32's score order
        row = np.where(used, -1.0, overlap[r])
        j = int(row.argmax())
        if row[j] >= IOU:
            used[j] = True
            ious.append(float(row[j]))
    return len(ious), ious, int((~used).sum())


#: float32's detections, by (its output arrays, layout, threshold): every candidate of a sweep is compared with
#: the same reference arrays, twice (the CPU's figures and the GPU's), so they are read once. The arrays are held
#: with the entry, so an identity never points at another array.
_REFERENCE: dict[tuple, tuple[list, list[_Dets]]] = {}
REFERENCE_ENTRIES = 4


def _reference(ref: list[np.ndarray], lay: Layout, threshold: float) -> list[_Dets]:
    key = (tuple(id(ref[i]) for i in lay.outputs), lay, threshold)
    hit = _REFERENCE.get(key)
    if hit is None:
        n = len(ref[lay.outputs[0]])
        hit = ([ref[i] for i in lay.outputs], [detections(ref, lay, k, threshold) for k in range(n)])
        while len(_REFERENCE) >= REFERENCE_ENTRIES:
            _REFERENCE.pop(next(iter(_REFERENCE)))
        _REFERENCE[key] = hit
    return hit[1]


def compare(
    outs: list[np.ndarray], ref: list[np.ndarray], names: list[str], lay: Layout, threshold: float = DEFAULT_SCORE
) -> DetectionFidelity:
    """The candidate's detections against float32's, over the samples where both outputs are finite, pooled
    and on the worst samples (the `PERCENTILE` of the shares kept on samples where float32 detects any)."""
    total = kept = extra = 0
    ious: list[float] = []
    shares: list[float] = []
    low = max(0.0, threshold - MARGIN)
    per_anchor = lay.entry.per_anchor
    ref_low = _reference(ref, lay, low)
    for k in range(len(ref[lay.outputs[0]])):
        mine_low = detections(outs, lay, k, low)
        r, m = _above(ref_low[k], threshold), _above(mine_low, threshold)
        n, got, _ = _match(r, mine_low, per_anchor)
        made, _, _ = _match(m, ref_low[k], per_anchor)  # the candidate's that float32 makes too
        total, kept, extra = total + len(r.anchors), kept + n, extra + len(m.anchors) - made
        ious += got
        if len(r.anchors):
            shares.append(n / len(r.anchors))
    return DetectionFidelity(
        layout=lay.kind,
        outputs=[names[i] for i in lay.outputs],
        score_threshold=threshold,
        iou_threshold=IOU,
        reference_detections=total,
        kept=kept,
        extra=extra,
        mean_iou=float(np.mean(ious)) if ious else None,
        samples_with_detections=len(shares),
        sample_kept=float(np.percentile(shares, PERCENTILE, method="lower")) if shares else None,
    )

"""Where a detector's boxes, classes and scores are: one table of layouts, each an entry and its reader.

Each `Entry` says what its outputs look like (the words a user reads when none fits), how to find them among a
model's outputs (`find`: from the output shapes, float32's values on the data and, where the file says it, the
role the post-processing op gives each output) and how to read one sample's rows (`read`: boxes [N, 4] as
corners, a class per row and its score). Raw heads give a row per anchor, which the counting code suppresses
per class (`selected` False); post-processed and end-to-end heads give rows the model already selected, read as
they are, the count respected. Adding a layout is one entry in `TABLE` and its reader. Pure numpy.

- `postprocessed`: boxes [1, M, 4] + classes [1, M] + scores [1, M] (+ count [1]), as `TFLite_Detection_PostProcess`
  writes them (SSD, EfficientDet-Lite) and as split end-to-end exports (boxes, scores, labels) give them.
- `scored`: boxes [1, M, 4] + scores [1, M] (+ count [1]), no classes output: a one-class post-processed head
  (a face or person detector), its rows sorted by score as selected rows are (raw anchors are not), or named by
  the op's roles.
- `end2end`: one [1, K, 6] (x1, y1, x2, y2, score, class id): YOLOv10, YOLO11 end2end, RT-DETR-style exports.
- `yolo`: one raw head [1, 4+C, N] or [1, N, 4+C]: cx, cy, w, h then C class scores (YOLOv8, v11).
- `yolov5`: one raw head [1, N, 5+C]: boxes, an objectness, C class scores. Named only (`--task detect` with it).
- `ssd`: raw boxes [1, N, 4] (corners) beside scores [1, N, C] or [1, C, N] (SSD before post-processing, PicoDet).
- `anchors`: raw anchor regressions [1, N, 4+2K] beside scores [1, N, C] (MediaPipe's face and pose detectors),
  compared anchor by anchor: both models share the anchors.
Scores outside 0..1 are logits (a sigmoid is applied).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from optimize.measure.slices import Slice

Shape = tuple[int, ...]


@dataclass(frozen=True)
class Layout:
    """A detector's head found among the outputs: its `kind` (a `TABLE` entry), the outputs it reads (boxes
    first; a post-processed head: boxes, classes, scores and the count when there is one), the feature axis of
    a raw yolo head, whether scores are logits, and where a raw pair's scores keep their anchors."""

    kind: str
    outputs: tuple[int, ...]
    axis: int = 2
    logits: bool = False
    scores_axis: int = 2  # a raw pair's scores: [1, N, C] (2) or [1, C, N] (1)

    @property
    def entry(self) -> Entry:
        return TABLE[self.kind]

    def slices(self, shapes: list[Shape]) -> dict[int, list[Slice]]:
        """The named slices of a one-output raw head (boxes, scores), by output index."""
        if self.kind not in ("yolo", "yolov5"):
            return {}
        i = self.outputs[0]
        f = shapes[i][self.axis]
        first = 5 if self.kind == "yolov5" else 4
        return {i: [Slice("boxes", self.axis, (0, 1, 2, 3)), Slice("scores", self.axis, tuple(range(first, f)))]}


@dataclass(frozen=True)
class Outputs:
    """What a layout is found from: each output's shape (batch first), float32's values on the samples, the
    role a post-processing op gives it (None: none), and whether the user named the layout (values then need
    not look like probabilities: scores may be logits)."""

    shapes: list[Shape]
    ref: list[np.ndarray]
    roles: list[str | None] = field(default_factory=list)
    named: bool = False


@dataclass
class Rows:
    """One sample's candidate detections: boxes [N, 4] (corners, either axis first), class ids [N], scores [N]."""

    boxes: np.ndarray
    classes: np.ndarray
    scores: np.ndarray


@dataclass(frozen=True)
class Entry:
    """One layout: its name, what its outputs look like, how it is found and how a sample's rows are read;
    `selected`: the model selected its rows itself (no suppression); `per_anchor`: rows are compared anchor by
    anchor; `auto`: recognised without being named."""

    name: str
    words: str
    find: Callable[[Outputs], Layout | None]
    read: Callable[[list[np.ndarray], Layout, int], Rows]
    selected: bool = False
    per_anchor: bool = False
    auto: bool = True


# ------------------------------------------------------------------------------------------------ helpers
def unit(a: np.ndarray) -> bool:
    """Every value in 0..1 (probabilities, not logits)."""
    return bool(a.size) and float(a.min()) >= -1e-6 and float(a.max()) <= 1 + 1e-6


def integral(a: np.ndarray) -> bool:
    """Every finite value a whole number (class ids, counts)."""
    a = a[np.isfinite(a)]
    return bool(a.size) and bool(np.all(np.mod(a, 1) == 0))


def sigmoid(a: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-np.clip(a.astype(np.float64), -60, 60)))


def corners_of(cxcywh: np.ndarray) -> np.ndarray:
    cx, cy, w, h = cxcywh.T
    w, h = np.abs(w), np.abs(h)  # a raw regression's size can come out negative; its extent is the same
    return np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=1)


def _corners(boxes: np.ndarray) -> bool:
    """Whether boxes read as corners (x2 >= x1 and y2 >= y1 on every row): decoded boxes, not offsets."""
    return bool((boxes[..., 2] >= boxes[..., 0]).all() and (boxes[..., 3] >= boxes[..., 1]).all())


def _best(boxes: np.ndarray, scores: np.ndarray) -> Rows:
    """A raw head's rows: every anchor, its best class and that class's score."""
    if not scores.shape[1]:
        return Rows(boxes, np.zeros(len(scores), np.int64), np.zeros(len(scores)))
    return Rows(boxes, scores.argmax(axis=1), scores.max(axis=1))


# ------------------------------------------------------------------------------------------------ post-processed
def _count_output(shape: Shape) -> bool:
    return len(shape) in (1, 2) and all(d == 1 for d in shape)


def _find_postprocessed(o: Outputs) -> Layout | None:
    """Boxes [1, M, 4], classes and scores [1, M], a count [1] when there is one: by the op's roles, else by
    shapes and values (classes whole numbers, scores in 0..1 unless the layout was named)."""
    by_role = {r: i for i, r in enumerate(o.roles) if r}
    if {"boxes", "classes", "scores"} <= by_role.keys():
        count = (by_role["count"],) if "count" in by_role else ()
        return Layout("postprocessed", (by_role["boxes"], by_role["classes"], by_role["scores"], *count))
    for b, sb in enumerate(o.shapes):
        if len(sb) != 3 or sb[2] != 4 or sb[1] < 1:
            continue
        rows = [i for i, s in enumerate(o.shapes) if tuple(s) == (sb[0], sb[1])]
        found = _classes_scores(rows, o)
        if found is not None:
            counts = [i for i, s in enumerate(o.shapes) if _count_output(s) and integral(o.ref[i])]
            return Layout("postprocessed", (b, *found, *counts[:1]))
    return None


def _classes_scores(rows: list[int], o: Outputs) -> tuple[int, int] | None:
    """(classes, scores) among the [1, M] outputs: the whole-numbered one holds the classes (the first when
    both are: the op's order), the other the scores."""
    if len(rows) != 2:
        return None
    a, b = rows
    if integral(o.ref[a]) and (o.named or unit(o.ref[b])):
        return a, b
    if integral(o.ref[b]) and (o.named or unit(o.ref[a])):
        return b, a
    return None


def _count(outs: list[np.ndarray], lay: Layout, k: int, rows: int, at: int = 3) -> int:
    """The rows sample k holds: its count output (position `at` in the layout's outputs) where there is one."""
    if len(lay.outputs) <= at:
        return rows
    c = np.asarray(outs[lay.outputs[at]][k]).reshape(-1)
    return int(np.clip(np.rint(c[0]), 0, rows)) if c.size and np.isfinite(c[0]) else 0


def _ids(values: np.ndarray) -> np.ndarray:
    """Class ids as integers, rounded: a quantized file's class column reads 1.9996 for class 2 (truncating it
    would miscount every detection of that file)."""
    return np.rint(np.nan_to_num(np.asarray(values, dtype=np.float64))).astype(np.int64)


def _read_postprocessed(outs: list[np.ndarray], lay: Layout, k: int) -> Rows:
    boxes = outs[lay.outputs[0]][k].astype(np.float64)
    n = _count(outs, lay, k, len(boxes))
    classes = outs[lay.outputs[1]][k].reshape(-1)[:n]
    scores = outs[lay.outputs[2]][k].reshape(-1)[:n].astype(np.float64)
    return Rows(boxes[:n], _ids(classes), scores)


def _find_scored(o: Outputs) -> Layout | None:
    """Boxes [1, M, 4] and one scores [1, M] (in 0..1), no classes: by the op's roles, or by shapes when a count
    says the rows were selected or every sample's scores come sorted, highest first, as selected rows do."""
    by_role = {r: i for i, r in enumerate(o.roles) if r}
    if {"boxes", "scores"} <= by_role.keys() and "classes" not in by_role:
        count = (by_role["count"],) if "count" in by_role else ()
        return Layout("scored", (by_role["boxes"], by_role["scores"], *count))
    for b, sb in enumerate(o.shapes):
        if len(sb) == 3 and sb[2] == 4 and sb[1] >= 1:
            found = _scores_beside(o, b, sb)
            if found is not None:
                return found
    return None


def _scores_beside(o: Outputs, b: int, sb: Shape) -> Layout | None:
    """The `scored` layout of boxes output b: its one [1, M] scores output, selected (a count, or sorted)."""
    rows = [i for i, s in enumerate(o.shapes) if tuple(s) == (sb[0], sb[1])]
    if len(rows) != 1 or not unit(o.ref[rows[0]]) or integral(o.ref[rows[0]]):
        return None
    counts = [i for i, s in enumerate(o.shapes) if _count_output(s) and integral(o.ref[i])]
    scores = o.ref[rows[0]].reshape(len(o.ref[rows[0]]), -1)
    if counts or bool(np.all(np.diff(scores, axis=1) <= 1e-6)):
        return Layout("scored", (b, rows[0], *counts[:1]))
    return None


def _read_scored(outs: list[np.ndarray], lay: Layout, k: int) -> Rows:
    boxes = outs[lay.outputs[0]][k].astype(np.float64)
    n = _count(outs, lay, k, len(boxes), at=2)
    scores = outs[lay.outputs[1]][k].reshape(-1)[:n].astype(np.float64)
    return Rows(boxes[:n], np.zeros(n, np.int64), scores)


# ------------------------------------------------------------------------------------------------ end-to-end
def _find_end2end(o: Outputs) -> Layout | None:
    """One [1, K, 6] output: corners, a score in 0..1 (any value when named) and a whole class id."""
    for i, (s, r) in enumerate(zip(o.shapes, o.ref)):
        if len(s) != 3 or s[2] != 6 or not integral(r[..., 5]):
            continue
        live = r[r[..., 4] > 0]
        if (o.named or unit(r[..., 4])) and _corners(live[:, :4]):
            return Layout("end2end", (i,))
    return None


def _read_end2end(outs: list[np.ndarray], lay: Layout, k: int) -> Rows:
    rows = outs[lay.outputs[0]][k].astype(np.float64)
    return Rows(rows[:, :4], _ids(rows[:, 5]), rows[:, 4])


# ------------------------------------------------------------------------------------------------ raw heads
def _yolo_one(i: int, shape: Shape, ref: np.ndarray, named: bool) -> Layout | None:
    if len(shape) != 3:
        return None
    axis = 1 if shape[1] < shape[2] else 2
    f, n = shape[axis], shape[3 - axis]
    if f < 5 or (not named and (n < 8 * f or f > 1024)):
        return None
    scores = np.take(ref, range(4, f), axis=axis)
    if not named and not unit(scores):
        return None
    return Layout("yolo", (i,), axis=axis, logits=not unit(scores))


def _find_yolo(o: Outputs) -> Layout | None:
    return next((lay for i, s in enumerate(o.shapes) if (lay := _yolo_one(i, s, o.ref[i], o.named))), None)


def _find_yolov5(o: Outputs) -> Layout | None:
    found = _find_yolo(o)
    if found is None:
        return None
    obj = np.take(o.ref[found.outputs[0]], range(4, 5), 2)
    return Layout("yolov5", found.outputs, 2, not unit(obj))


def _read_yolo(outs: list[np.ndarray], lay: Layout, k: int) -> Rows:
    head = outs[lay.outputs[0]][k]
    rows = (head.T if lay.axis == 1 else head).astype(np.float64)  # [N, F]
    first = 5 if lay.kind == "yolov5" else 4
    scores = sigmoid(rows[:, first:]) if lay.logits else rows[:, first:]
    if lay.kind == "yolov5":
        obj = rows[:, 4:5]
        scores = scores * (sigmoid(obj) if lay.logits else obj)
    return _best(corners_of(rows[:, :4]), scores)


def _boxes_output(shape: Shape) -> bool:
    """[1, N, 4+2K]: boxes (and K keypoints) per anchor, N at least 16."""
    return len(shape) == 3 and 4 <= shape[2] <= 44 and shape[2] % 2 == 0 and shape[1] >= 16


def _scores_axis(boxes: Shape, scores: Shape) -> int:
    """Where a scores output keeps the boxes' N anchors: axis 2 of [1, N, C] or 1 of [1, C, N] (0: neither)."""
    if len(scores) != 3:
        return 0
    return 2 if scores[1] == boxes[1] else (1 if scores[2] == boxes[1] else 0)


def _pair(o: Outputs) -> Layout | None:
    """A boxes output [1, N, 4+2K] and a scores output sharing its N (on axis 1 or 2): ssd when the boxes are
    decoded corners, else anchors."""
    for b, sb in enumerate(o.shapes):
        if not _boxes_output(sb):
            continue
        for s, ss in enumerate(o.shapes):
            axis = _scores_axis(sb, ss) if s != b else 0
            if not axis or (axis == 2 and ss[2] == sb[2] and s < b):  # two of a kind: the first holds the boxes
                continue
            kind = "ssd" if sb[2] == 4 and _corners(o.ref[b]) else "anchors"
            return Layout(kind, (b, s), logits=not unit(o.ref[s]), scores_axis=axis)
    return None


def _pair_as(kind: str) -> Callable[[Outputs], Layout | None]:
    """A raw pair found as `kind`: recognised, it is the kind its boxes say; named, the kind the user named."""

    def find(o: Outputs) -> Layout | None:
        found = _pair(o)
        if found is None or (not o.named and found.kind != kind):
            return None
        return Layout(kind, found.outputs, found.axis, found.logits, found.scores_axis)

    return find


def _read_pair(outs: list[np.ndarray], lay: Layout, k: int) -> Rows:
    boxes = outs[lay.outputs[0]][k][:, :4].astype(np.float64)
    scores = outs[lay.outputs[1]][k].astype(np.float64)
    scores = scores.T if lay.scores_axis == 1 else scores
    scores = sigmoid(scores) if lay.logits else scores
    return _best(boxes if lay.kind == "ssd" else corners_of(boxes), scores)


# ------------------------------------------------------------------------------------------------ the table
#: Every layout, in the order they are tried: the most specific shapes first.
TABLE: dict[str, Entry] = {
    e.name: e
    for e in (
        Entry(
            "postprocessed",
            "boxes [1, M, 4] + classes [1, M] + scores [1, M] (+ count [1])",
            _find_postprocessed,
            _read_postprocessed,
            selected=True,
        ),
        Entry(
            "scored",
            "boxes [1, M, 4] + scores [1, M] (+ count [1]), no classes",
            _find_scored,
            _read_scored,
            selected=True,
        ),
        Entry("end2end", "one [1, K, 6]: x1, y1, x2, y2, score, class", _find_end2end, _read_end2end, selected=True),
        Entry("yolo", "one [1, 4+C, N] or [1, N, 4+C]", _find_yolo, _read_yolo),
        Entry("yolov5", "one [1, N, 5+C]", _find_yolov5, _read_yolo, auto=False),
        Entry("ssd", "boxes [1, N, 4] + scores [1, N, C]", _pair_as("ssd"), _read_pair),
        Entry("anchors", "[1, N, 4+2K] + scores [1, N, C]", _pair_as("anchors"), _read_pair, per_anchor=True),
    )
}
LAYOUTS = tuple(TABLE)


def find(o: Outputs, declared: str | None) -> Layout | None:
    """The layout the user named (`declared`), or the first the outputs fit (`declared` "" or None: recognise
    one; "" is `--task detect`, which also tries each layout as if named, so scores may be logits)."""
    if declared:
        return TABLE[declared].find(Outputs(o.shapes, o.ref, o.roles, named=True))
    found = next((lay for e in TABLE.values() if e.auto and (lay := e.find(o))), None)
    if found is None and declared is not None:
        named = Outputs(o.shapes, o.ref, o.roles, named=True)
        found = next((lay for e in TABLE.values() if e.auto and (lay := e.find(named))), None)
    return found


def known() -> str:
    """The known layouts in words, for a line that says none fits."""
    return "; ".join(f"{e.name}: {e.words}" for e in TABLE.values())

"""Kinds of output, and the yardstick for each: the figure it is judged by, the goal that bounds it, the default
guard's bound, the option that states it, and the words the screen uses for it.

One table drives the default guard (optimize.decide.guard), the checks that reject a candidate
(optimize.decide.choose) and the remedies printed for a rejection, so the name on screen is always what was
checked. An output scored against labels is judged by its labels' figure (`Kind.labelled`): top-1 points for
classes, accuracy at 0.5 for yes/no decisions, the MAE's increase for values. Every other output is judged
against float32 (`Kind.against_float`): the relative error (mean |diff| over the reference's range) for all,
and agreement where the output makes decisions: top-1 for classes, each decision at 0.5 for sigmoid outputs.

A detector's outputs are judged by the detections kept against float32's, a mask's by its IoU with float32's:
those figures, not the output error, say whether the boxes, scores and masks still work.

Adding a kind: one `Kind` in `KINDS`, ahead of VALUES (the catch-all), whose `has` knows its outputs by the figure the measurement stored on them; and, when its figure has a goal of its own, one `Check` in
`CHECKS` reading that figure, bounded by a new `Goals` field. Pure: no TensorFlow, no numpy.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from optimize.core.results import Accuracy, Fidelity, OutputFidelity
from optimize.core.vocab import Task

#: The default guard's bounds (a goal the user did not state): see KINDS for which output each applies to.
DEFAULT_MAX_DROP = 0.02
DEFAULT_MAX_ERROR_INCREASE = 0.05
DEFAULT_MAX_OUTPUT_ERROR = 0.05
DEFAULT_MIN_AGREEMENT = 1 - DEFAULT_MAX_DROP
DEFAULT_MIN_DETECTIONS_KEPT = 0.95
DEFAULT_MIN_MASK_IOU = 0.9


@dataclass(frozen=True)
class Bound:
    """One goal a kind of output is held to: the `Goals` field, the default guard's value, the option that
    states it, and how it reads (`text` with `{v}`, the value in `unit`: points or percent of 0..1)."""

    goal: str
    default: float
    option: str
    text: str

    @property
    def lower(self) -> bool:
        """A lower bound (agreement): the figure must reach it; otherwise it must stay under it."""
        return self.goal.startswith("min_")

    def words(self, value: float | None = None) -> str:
        """`at most 2 points of top-1 lost`, `98% of decisions at 0.5 agreeing` (the default, or `value`)."""
        return self.text.format(v=f"{(self.default if value is None else value) * 100:g}")

    def accepting(self, figure: float) -> float:
        """The goal's value, at two decimals, that accepts a measured figure: rounded up for an upper bound,
        down for a lower one (never 0 for an output error: the goal must be positive)."""
        if self.lower:
            return max(0.0, math.floor(figure * 100 + 1e-6) / 100)
        value = math.ceil(figure * 100 - 1e-6) / 100
        return min(1.0, max(0.01, value)) if self.goal == "max_output_error" else max(0.0, value)


OUTPUT_ERROR = Bound(
    "max_output_error", DEFAULT_MAX_OUTPUT_ERROR, "--max-output-error", "within {v}% of float32's range"
)
TOP1_AGREEMENT = Bound("min_agreement", DEFAULT_MIN_AGREEMENT, "--min-agreement", "{v}% top-1 agreement")
DECISION_AGREEMENT = Bound(
    "min_agreement", DEFAULT_MIN_AGREEMENT, "--min-agreement", "{v}% of decisions at 0.5 agreeing"
)


DETECTIONS_KEPT = Bound(
    "min_detections_kept",
    DEFAULT_MIN_DETECTIONS_KEPT,
    "--min-detections-kept",
    "at least {v}% of float32's detections kept",
)
MASK_IOU = Bound("min_mask_iou", DEFAULT_MIN_MASK_IOU, "--min-mask-iou", "mask IoU of at least {v}% with float32's")
#: Per sample (opt-in: no default guard): the worst 5% of samples' detections kept or mask IoU.
SAMPLE_KEPT = Bound(
    "min_sample_kept", 0.5, "--min-sample-kept", "the worst samples keeping at least {v}% (detections, mask IoU)"
)


@dataclass(frozen=True)
class Kind:
    """One kind of output. `name` is what the screen calls it; `has` tells an output compared with float32
    is of this kind (by the figures measured on it); `labelled` is the goal its labels are judged by (None:
    labels do not apply); `against_float` the goals it is judged by when no labels score it; `agreement` names
    its agreement figure (None: it has none)."""

    name: str
    has: Callable[[OutputFidelity], bool]
    labelled: Bound | None
    against_float: tuple[Bound, ...]
    agreement: str | None = None
    measure: str = "top-1"  # what its labels' figure is called: top-1, accuracy at 0.5, MAE


CLASSES = Kind(
    "classes",
    lambda o: o.top1_agreement is not None,
    Bound("max_accuracy_drop", DEFAULT_MAX_DROP, "--max-accuracy-drop", "at most {v} points of top-1 lost"),
    (OUTPUT_ERROR, TOP1_AGREEMENT),
    agreement="top-1 agreement",
)
DECISIONS = Kind(
    "sigmoid",
    lambda o: o.decision_agreement is not None,
    Bound("max_accuracy_drop", DEFAULT_MAX_DROP, "--max-accuracy-drop", "at most {v} points of accuracy at 0.5 lost"),
    (OUTPUT_ERROR, DECISION_AGREEMENT),
    agreement="decision agreement at 0.5",
    measure="accuracy at 0.5",
)
VALUES = Kind(
    "regression",
    lambda o: True,
    Bound("max_error_increase", DEFAULT_MAX_ERROR_INCREASE, "--max-error-increase", "MAE at most {v}% above float32's"),
    (OUTPUT_ERROR,),
    measure="MAE",
)
DETECTIONS = Kind("detections", lambda o: o.detection is not None, None, (DETECTIONS_KEPT,), measure="detections kept")
MASKS = Kind("masks", lambda o: o.iou is not None, None, (MASK_IOU,), measure="mask IoU")
EXACT_AGREEMENT = Bound("min_agreement", DEFAULT_MIN_AGREEMENT, "--min-agreement", "{v}% of ids and counts equal")
#: Class ids and counts (an ArgMax, an integer output): equal to float32's or not, never a mean |difference|.
INDICES = Kind(
    "indices",
    lambda o: o.exact_agreement is not None,
    None,
    (EXACT_AGREEMENT,),
    agreement="exact agreement",
    measure="exact agreement",
)
#: Every kind, most specific first; VALUES takes whatever no other kind claims.
KINDS: tuple[Kind, ...] = (DETECTIONS, MASKS, INDICES, CLASSES, DECISIONS, VALUES)


def of_output(o: OutputFidelity) -> Kind:
    """The kind of one output compared with float32 (by the figures measured on it)."""
    return next(k for k in KINDS if k.has(o))


def of_accuracy(a: Accuracy) -> Kind:
    """The kind of the labelled output, by its task (a study's figures when the task is not told)."""
    if a.task is Task.REGRESSION or (a.top1 is None and a.mae is not None):
        return VALUES
    if a.task in (Task.BINARY, Task.MULTILABEL):
        return DECISIONS
    return CLASSES


def judged(f: Fidelity, unlabelled_only: bool = False) -> list[OutputFidelity]:
    """The outputs judged against float32 (every one, or those the labels do not score), each with its own
    figures; a study written before agreement was measured per output has it only on the fidelity record,
    which belongs to its first output."""
    outs = f.judged(unlabelled_only)
    if f.top1_agreement is not None and outs and not any(o.agreement is not None for o in f.outputs):
        if not any(o.labelled for o in f.outputs) and outs[0] is f.outputs[0]:
            outs = [outs[0].model_copy(update={"top1_agreement": f.top1_agreement}), *outs[1:]]
    return outs


def agreement_name(o: OutputFidelity) -> str:
    """What an output's agreement is called: `top-1 agreement`, `decision agreement at 0.5`."""
    return of_output(o).agreement or "agreement"


@dataclass(frozen=True)
class Check:
    """A goal judged on the outputs against float32: which figure it reads, and which output it names when
    broken (the worst of those judged)."""

    bound: Bound
    read: Callable[[OutputFidelity], float | None]

    def worst(self, outputs: list[OutputFidelity]) -> OutputFidelity | None:
        have = [o for o in outputs if self.read(o) is not None]
        if not have:
            return None
        pick = min if self.bound.lower else max
        return pick(have, key=self.read)

    def broken(self, value: float, goal: float) -> bool:
        eps = 1e-9
        return value < goal - eps if self.bound.lower else value > goal + eps


#: The goals judged on outputs against float32, in the order they are checked.
CHECKS: tuple[Check, ...] = (
    Check(OUTPUT_ERROR, lambda o: o.relative_error if OUTPUT_ERROR in of_output(o).against_float else None),
    Check(TOP1_AGREEMENT, lambda o: o.agreement),
    Check(DETECTIONS_KEPT, lambda o: o.detection.kept_fraction if o.detection is not None else None),
    Check(MASK_IOU, lambda o: o.iou),
    Check(SAMPLE_KEPT, lambda o: o.detection.sample_kept if o.detection is not None else o.sample_iou),
)
#: The goals of kinds judged by a task figure of their own (not the output error): a detector's, a mask's.
OWN_FIGURE = (DETECTIONS, MASKS)

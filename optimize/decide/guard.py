"""Quality without labels, and the default guard: what the recommender may pick when no goal is given.

Quality is the labelled accuracy when the study has labels. Without labels it is fidelity to the float32
reference, already measured for every candidate: agreement for outputs that decide (top-1 for classes, each
decision at 0.5 for sigmoid outputs), then the worst output's relative error (mean |diff| over the reference
output's range). Errors under `FIDELITY_RESOLUTION` of the range count as none, so float16's rounding ties with
float32 the way a zero accuracy delta does.

The default guard applies when the user gave no accuracy or fidelity goal, and holds each output to the
yardstick of its kind (optimize.decide.kinds): a labelled output by its labels (at most 2 points of top-1, or
of accuracy at 0.5 for yes/no outputs, lost; MAE at most 5% above float32's for values); every other output by
its fidelity to float32 (within 5% of its range, and 98% agreement where it decides: top-1 for classes,
decisions at 0.5 for sigmoid outputs). A mixed study (a rating and a click) guards each head by its own kind,
and an output nobody labelled is still what the user ships. It is a goal the user did not state, so every
rejection it causes says so, naming the output it breaks and the figure that broke it; the remedy printed for
it names every option that accepts it. Pure: no TensorFlow, no numpy.
"""

from __future__ import annotations

import math

from optimize.core.results import Candidate, Goals, OutputFidelity, Record, Study
from optimize.core.vocab import Objective
from optimize.decide import kinds
from optimize.decide.kinds import (
    DEFAULT_MAX_DROP,
    DEFAULT_MAX_ERROR_INCREASE,
    DEFAULT_MAX_OUTPUT_ERROR,
    DEFAULT_MIN_AGREEMENT,
    Bound,
    Kind,
)
from optimize.measure.noise import compare_latency

__all__ = ["DEFAULT_MAX_DROP", "DEFAULT_MAX_ERROR_INCREASE", "DEFAULT_MAX_OUTPUT_ERROR", "DEFAULT_MIN_AGREEMENT"]
FIDELITY_RESOLUTION = 0.001
#: (min_sample_kept is not one: it bounds the worst samples beside the pooled figure, and leaves the guard in force.)
OUTPUT_GOALS = ("max_output_error", "min_agreement", "min_detections_kept", "min_mask_iou")
QUALITY_GOALS = ("max_accuracy_drop", "max_error_increase", *OUTPUT_GOALS)


class Guard(Record):
    """The default guard in force: the goals it adds and what they mean, in words."""

    goals: Goals
    words: str
    override: str = ""  # the option that states a goal instead (--max-accuracy-drop ...)
    unstated: str = "no accuracy goal was given"  # what the user left unsaid, so the guard stands in
    outputs: list[str] = []  # the outputs it judges by fidelity while the labels score another (by name)
    labelled_goal: str | None = None  # the Goals field the guard set for the labelled output (None: the user's)

    @property
    def unlabelled_only(self) -> bool:
        """Its fidelity goal judges the outputs the labels do not score (the labelled one has its own)."""
        return bool(self.outputs)


def has_quality_goal(goals: Goals) -> bool:
    return any(getattr(goals, k) is not None for k in QUALITY_GOALS)


def has_labelled_goal(goals: Goals) -> bool:
    return goals.max_accuracy_drop is not None or goals.max_error_increase is not None


def has_output_goal(goals: Goals) -> bool:
    return any(getattr(goals, k) is not None for k in OUTPUT_GOALS)


def labelled_kind(cands: list[Candidate]) -> Kind | None:
    """The kind of the output the labels score (classes, yes/no, values), or None without labels. Read from
    the accuracy record, never from which delta happens to be set (a study written before the baseline of a
    regression model recorded its error ratio has a zero top-1 delta there)."""
    acc = next((c.metrics.accuracy for c in cands if c.ok and c.metrics.accuracy is not None), None)
    return None if acc is None else kinds.of_accuracy(acc)


def _fidelity_key(c: Candidate, baseline: str | None) -> tuple[float, float] | None:
    """(agreement, -error bucket): higher is better; the baseline is the reference itself."""
    if baseline is not None and c.name == baseline:
        return (1.0, 0.0)
    f = c.metrics.fidelity if c.metrics else None
    if f is None or f.relative_error is None and f.least_agreeing() is None:
        return None
    err = f.relative_error
    bucket = -math.inf if err is None else -math.floor(err / FIDELITY_RESOLUTION + 1e-9) * FIDELITY_RESOLUTION
    least = f.least_agreeing()
    first = 1.0 if least is None else least.agreement
    det = f.detection
    if det is not None and det.kept_fraction is not None:  # a detector: the detections it keeps come first
        first = min(first, det.kept_fraction)
    return (first, bucket)


def quality(c: Candidate, by_labels: bool, baseline: str | None = None) -> tuple[float, float] | None:
    """How good a candidate is, higher is better, comparable within one study: the accuracy score with
    labels, else fidelity to float32; None when it was not measured."""
    if by_labels:
        score = c.accuracy_score
        return None if score is None else (score, 0.0)
    return _fidelity_key(c, baseline)


def _agreement_words(o: OutputFidelity, named: bool) -> str:
    which = f"output {o.name} " if named else ""
    return f"{which}{kinds.agreement_name(o)} {o.agreement * 100:.1f}%"


def fidelity_words(c: Candidate, baseline: str | None = None, unlabelled_only: bool = False) -> str:
    """`output error 4.70% of the range, top-1 agreement 99.0%, 40 samples (fewer than 32: rough)`; with
    several outputs, the worst one is named (`output box off by 25.50% of its range`), and a sigmoid output's
    agreement is its decisions' (`output click decision agreement at 0.5 97.8%`)."""
    if baseline is not None and c.name == baseline:
        return "the float32 reference itself"
    f = c.metrics.fidelity if c.metrics else None
    if f is None:
        return "fidelity not measured"
    parts = []
    worst, least = f.worst(unlabelled_only), f.least_agreeing(unlabelled_only)
    several = len(f.judged(unlabelled_only)) > 1 or unlabelled_only
    if worst is not None and several:
        parts.append(f"output {worst.name} off by {worst.relative_error * 100:.2f}% of its range")
    elif worst is not None:
        parts.append(f"output error {worst.relative_error * 100:.2f}% of the range")
    if least is not None:
        parts.append(_agreement_words(least, several))
    parts = _task_words(f, several) + parts
    few = " (fewer than 32: a rough figure)" if f.few_samples else ""
    return ", ".join(parts + [f"{f.samples} samples{few}"])


def _task_words(f, several: bool) -> list[str]:
    """The figures that judge a detector and a mask, said first: the detections kept, the lowest mask IoU
    (each beside an output error that reads small)."""
    words = []
    det = f.detection
    if det is not None and det.kept_fraction is not None:
        words.append(f"keeps {det.kept} of float32's {det.reference_detections} detections")
    masks = [o for o in f.outputs if o.iou is not None]
    if masks:
        o = min(masks, key=lambda o: o.iou)
        words.append(f"mask IoU {o.iou * 100:.1f}% with float32's" + (f" (output {o.name})" if several else ""))
    return words


#: Quality of a candidate that was not measured: below every measured one.
WORST = (-math.inf, -math.inf)


def axes(a: Candidate, b: Candidate, by_labels: bool, baseline: str | None) -> dict[Objective, int]:
    """-1/0/1 per axis (a better, the same, worse than b): size in bytes, latency by interval, quality. The
    one comparison the ranking, the Pareto front and the explanations all use."""
    qa, qb = quality(a, by_labels, baseline) or WORST, quality(b, by_labels, baseline) or WORST
    sa, sb = a.metrics.size.bytes, b.metrics.size.bytes
    return {
        Objective.SIZE: (sa > sb) - (sa < sb),
        Objective.LATENCY: compare_latency(a, b),
        Objective.ACCURACY: (qa < qb) - (qa > qb),
    }


def loss_words(c: Candidate, guard: Guard | None = None) -> str:
    """What a candidate loses against float32, in words: `loses 75.0 points of top-1`, `has 7.2% more MAE
    than float32`, or without labels `differs from float32 (output error 12.80% of the range, 40 samples)`;
    where the guard judges outputs without labels and one of them is what breaks it, that output: `keeps
    top-1, but differs from float32 (output box off by 25.50% of its range, 120 samples)`."""
    m = c.metrics
    if m is None:
        return "not measured"
    if guard is not None and guard.unlabelled_only and _outputs_broken(guard, c):
        kept = _labelled_words(c) or "keeps its labelled output"
        joint = "but" if _labelled_ok(guard, c) else "and"
        return f"{kept}, {joint} differs from float32 ({fidelity_words(c, unlabelled_only=True)})"
    words = _labelled_words(c)
    return words or f"differs from float32 ({fidelity_words(c)})"


def _labelled_words(c: Candidate) -> str | None:
    m = c.metrics
    kind = kinds.of_accuracy(m.accuracy) if m.accuracy is not None else kinds.CLASSES
    if m.error_ratio is not None and kind is kinds.VALUES:
        more = m.error_ratio - 1
        return f"has {more * 100:.1f}% more MAE than float32" if more > 0 else "keeps float32's MAE"
    if m.accuracy_delta is not None and kind is not kinds.VALUES:
        what = kind.measure
        if m.accuracy_delta >= 0:
            return f"gains {m.accuracy_delta * 100:.1f} points of {what}" if m.accuracy_delta else f"keeps {what}"
        return f"loses {-m.accuracy_delta * 100:.1f} points of {what}"
    if m.error_ratio is not None:
        return f"has {max(0.0, m.error_ratio - 1) * 100:.1f}% more error than float32"
    return None


def _labelled_figure(c: Candidate, goal: str) -> float | None:
    """What the labelled goal reads: points lost (max_accuracy_drop), the MAE's increase (max_error_increase)."""
    m = c.metrics
    if goal == "max_accuracy_drop":
        return None if m.accuracy_delta is None else -m.accuracy_delta
    if goal == "max_error_increase":
        return None if m.error_ratio is None else m.error_ratio - 1
    return None


def _labelled_ok(guard: Guard, c: Candidate) -> bool:
    """Whether the labelled output is within the guard's (or the user's) goal for it."""
    g = guard.goals
    for goal in ("max_accuracy_drop", "max_error_increase"):
        bound, figure = getattr(g, goal), _labelled_figure(c, goal)
        if bound is not None and figure is not None:
            return figure <= bound + 1e-9
    return True


def _outputs_broken(guard: Guard, c: Candidate) -> bool:
    f = c.metrics.fidelity
    return f is not None and bool(_broken_checks(guard.goals, kinds.judged(f, guard.unlabelled_only)))


def _broken_checks(goals: Goals, outputs: list[OutputFidelity]) -> list[tuple[kinds.Check, OutputFidelity]]:
    """Each fidelity check the goals set that an output breaks, with the output that breaks it most."""
    out = []
    for check in kinds.CHECKS:
        bound = getattr(goals, check.bound.goal)
        worst = check.worst(outputs) if bound is not None else None
        if worst is not None and check.broken(check.read(worst), bound):
            out.append((check, worst))
    return out


def _names(outputs: list[str]) -> str:
    return ", ".join(outputs[:3]) + (f" and {len(outputs) - 3} more" if len(outputs) > 3 else "")


def _output_kinds(cands: list[Candidate], unlabelled_only: bool) -> dict[str, Kind]:
    """Each output judged against float32 (all, or those the labels do not score), with its kind."""
    found: dict[str, Kind] = {}
    for c in cands:
        f = c.metrics.fidelity if c.ok else None
        if f is None or (unlabelled_only and (c.metrics.accuracy is None or not any(o.labelled for o in f.outputs))):
            continue
        for o in kinds.judged(f, unlabelled_only):
            kind = kinds.of_output(o)
            if found.get(o.name) in (None, kinds.VALUES):
                found[o.name] = kind
    return found


def _fidelity_part(found: dict[str, Kind], bounds: dict[str, float]) -> str:
    """`within 5% of float32's range, 98% of decisions at 0.5 agreeing`: the fidelity bounds for these
    outputs, each agreement naming its outputs when they are of several kinds."""
    error = any(kinds.OUTPUT_ERROR in k.against_float for k in found.values())
    words = [kinds.OUTPUT_ERROR.words(bounds.get("max_output_error"))] if error else []
    words += _own_figure_words(found, bounds)
    deciding = [k for k in kinds.KINDS if k.agreement and k in found.values()]
    for k in deciding:
        agree = next(b for b in k.against_float if b.goal == "min_agreement")
        which = [n for n, kk in found.items() if kk is k]
        named = f" ({_names(which)})" if len(set(found.values())) > 1 else ""
        words.append(agree.words(bounds.get("min_agreement")) + named)
    return ", ".join(words)


def _own_figure_words(found: dict[str, Kind], bounds: dict[str, float]) -> list[str]:
    """`at least 95% of float32's detections kept`: the bounds of the outputs judged by a figure of their own,
    naming those outputs when the study has outputs of several kinds."""
    words = []
    for k in kinds.OWN_FIGURE:
        which = [n for n, kk in found.items() if kk is k]
        named = f" ({_names(which)})" if which and len(set(found.values())) > 1 else ""
        words += [b.words(bounds.get(b.goal)) + named for b in k.against_float] if which else []
    return words


def default_guard(goals: Goals, study: Study) -> Guard | None:
    """The guard for a study, standing in for the quality goals the user did not state; None when every
    one it would set was stated, or when nothing about quality was measured (no labels, no fidelity).

    With labels, the labelled output is guarded by its kind's figure (2 points of top-1 or of accuracy at 0.5,
    or 5% more MAE), and every other output by its fidelity to float32 (within 5% of its range, 98% agreement
    for outputs that decide): a candidate that keeps the labelled output but breaks another is kept out, by
    name.
    """
    ok = [c for c in study.candidates if c.ok]
    kind = labelled_kind(ok)
    if kind is not None:
        return _labelled_guard(goals, ok, kind)
    if has_quality_goal(goals):
        return None
    found = _output_kinds(ok, unlabelled_only=False)
    if not found:
        return None
    update = _fidelity_bounds(found)
    words = f"no labels: outputs {_fidelity_part(found, update)}"
    override = next(b.option for k in found.values() for b in k.against_float)
    return Guard(goals=goals.model_copy(update=update), words=words, override=override)


def _fidelity_bounds(found: dict[str, Kind]) -> dict[str, float]:
    """The default bounds of the goals that judge these outputs against float32 (each kind's own)."""
    return {b.goal: b.default for k in found.values() for b in k.against_float}


def unlabelled_outputs(cands: list[Candidate]) -> tuple[list[str], bool]:
    """The outputs a labelled study scores by fidelity only (the labels belong to another), and whether any
    of them decides (classes, sigmoid: agreement applies); none for a study that does not mark its labelled
    output (written before it did)."""
    found = _output_kinds(cands, unlabelled_only=True)
    return list(found), any(k.agreement for k in found.values())


def _labelled_words_for(kind: Kind, name: str | None, several: bool) -> str:
    """The guard's words for the labelled output: `at most 2 points of top-1 lost` (one class output, as
    ever), `regression: MAE at most 5% above float32's`, `rating (regression): ...` among several outputs."""
    words = kind.labelled.words()
    if several and name:
        return f"{name} ({kind.name}): {words}"
    return words if kind is kinds.CLASSES else f"{kind.name}: {words}"


def _labelled_guard(goals: Goals, ok: list[Candidate], kind: Kind) -> Guard | None:
    """The labelled output's part (unless a goal for it was stated), and the other outputs' part (unless a
    fidelity goal was stated)."""
    update: dict = {}
    words, unstated, override, labelled_goal = [], [], "", None
    others = _output_kinds(ok, unlabelled_only=True)
    if not has_labelled_goal(goals):
        bound = kind.labelled
        update[bound.goal] = bound.default
        labelled_goal, override = bound.goal, bound.option
        name = next((c.metrics.accuracy.output for c in ok if c.metrics.accuracy is not None), None)
        words.append(_labelled_words_for(kind, name, bool(others)))
        unstated.append("no accuracy goal was given")
    if others and not has_output_goal(goals):
        update.update(_fidelity_bounds(others))
        words.append(f"the outputs without labels ({_names(list(others))}) {_fidelity_part(others, update)}")
        if not unstated:
            unstated.append("no goal for the outputs without labels was given")
    else:
        others = {}
    if not update:
        return None
    return Guard(
        goals=goals.model_copy(update=update),
        words=", and ".join(words),
        override=override or "--max-output-error",
        unstated=unstated[0],
        outputs=list(others),
        labelled_goal=labelled_goal,
    )


def measured(guard: Guard, c: Candidate) -> bool:
    """Whether the candidate has every figure the guard judges (else the guard cannot clear it)."""
    m = c.metrics
    g = guard.goals
    for goal in ("max_accuracy_drop", "max_error_increase"):
        if getattr(g, goal) is not None and _labelled_figure(c, goal) is None:
            return False
    if has_output_goal(g):
        f = m.fidelity
        return f is not None and any(c.read(o) is not None for c in kinds.CHECKS for o in kinds.judged(f))
    return True


def kept_out_words(guard: Guard, c: Candidate, problem: str) -> str:
    """Why the guard keeps a candidate out: what it loses, or that the figure is missing."""
    what = loss_words(c, guard) if measured(guard, c) else problem
    return f"{what}: beyond the default guard ({guard.words}; {guard.unstated})"


def remedy(guard: Guard, c: Candidate) -> list[tuple[Bound, float]]:
    """The goals that accept a candidate the guard keeps out, one for each of the guard's bounds it breaks
    (never a stricter one than the guard's): its labelled output's figure, and each fidelity figure, read
    over every output (a fidelity goal of the user's judges them all)."""
    out: list[tuple[Bound, float]] = []
    g = guard.goals
    if guard.labelled_goal is not None:
        bound = next(k.labelled for k in kinds.KINDS if k.labelled and k.labelled.goal == guard.labelled_goal)
        figure = _labelled_figure(c, guard.labelled_goal)
        if figure is not None and figure > getattr(g, guard.labelled_goal) + 1e-9:
            out.append((bound, bound.accepting(figure)))
    f = c.metrics.fidelity if c.metrics else None
    if f is None:
        return out
    for check, _ in _broken_checks(g, kinds.judged(f, guard.unlabelled_only)):
        worst = check.worst(kinds.judged(f))
        out.append((check.bound, check.bound.accepting(check.read(worst))))
    return out


def accept_hint(guard: Guard, c: Candidate) -> str:
    """The options that would accept this candidate's loss: `--max-accuracy-drop 0.76`, `--max-error-increase
    0.08`, or for an output without labels `--max-output-error 0.26`, `--min-agreement 0.34`."""
    parts = remedy(guard, c)
    return " ".join(f"{b.option} {v:g}" for b, v in parts) if parts else "a goal of your own"

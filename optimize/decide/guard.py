"""Quality without labels, and the default guard: what the recommender may pick when no goal is given.

Quality is the labelled accuracy when the study has labels. Without labels it is fidelity to the float32
reference, already measured for every candidate: top-1 agreement for class outputs (then the worst output's
relative error), else the worst output's relative error (mean |diff| over the reference output's range).
Errors under `FIDELITY_RESOLUTION` of the range count as none, so float16's rounding ties with float32 the
way a zero accuracy delta does.

The default guard applies when the user gave no accuracy or fidelity goal: at most `DEFAULT_MAX_DROP`
(2 points of top-1) lost, or `DEFAULT_MAX_ERROR_INCREASE` (5%) more regression error, or, without labels,
outputs within `DEFAULT_MAX_OUTPUT_ERROR` (5%) of the reference's range (and top-1 agreement of at least
`1 - DEFAULT_MAX_DROP` for class outputs, which bounds the same 2 points). Every output counts: with labels
on one output, the others are held to the same fidelity bounds (an output nobody labelled is still what the
user ships), unless a fidelity goal was stated. It is a goal the user did not state, so every rejection it
causes says so, naming the output it breaks. Pure: no TensorFlow, no numpy.
"""

from __future__ import annotations

import math

from optimize.core.results import Candidate, Goals, Record, Study
from optimize.core.vocab import Objective
from optimize.measure.noise import compare_latency

DEFAULT_MAX_DROP = 0.02
DEFAULT_MAX_ERROR_INCREASE = 0.05
DEFAULT_MAX_OUTPUT_ERROR = 0.05
FIDELITY_RESOLUTION = 0.001
QUALITY_GOALS = ("max_accuracy_drop", "max_error_increase", "max_output_error", "min_agreement")


class Guard(Record):
    """The default guard in force: the goals it adds and what they mean, in words."""

    goals: Goals
    words: str
    override: str = ""  # the option that states a goal instead (--max-accuracy-drop ...)
    unstated: str = "no accuracy goal was given"  # what the user left unsaid, so the guard stands in
    outputs: list[str] = []  # the outputs it judges by fidelity while the labels score another (by name)

    @property
    def unlabelled_only(self) -> bool:
        """Its fidelity goal judges the outputs the labels do not score (the labelled one has its own)."""
        return bool(self.outputs)


def has_quality_goal(goals: Goals) -> bool:
    return any(getattr(goals, k) is not None for k in QUALITY_GOALS)


def has_labelled_goal(goals: Goals) -> bool:
    return goals.max_accuracy_drop is not None or goals.max_error_increase is not None


def has_output_goal(goals: Goals) -> bool:
    return goals.max_output_error is not None or goals.min_agreement is not None


def _fidelity_key(c: Candidate, baseline: str | None) -> tuple[float, float] | None:
    """(agreement, -error bucket): higher is better; the baseline is the reference itself."""
    if baseline is not None and c.name == baseline:
        return (1.0, 0.0)
    f = c.metrics.fidelity if c.metrics else None
    if f is None or f.relative_error is None and f.top1_agreement is None:
        return None
    err = f.relative_error
    bucket = -math.inf if err is None else -math.floor(err / FIDELITY_RESOLUTION + 1e-9) * FIDELITY_RESOLUTION
    return (1.0 if f.top1_agreement is None else f.top1_agreement, bucket)


def quality(c: Candidate, by_labels: bool, baseline: str | None = None) -> tuple[float, float] | None:
    """How good a candidate is, higher is better, comparable within one study: the accuracy score with
    labels, else fidelity to float32; None when it was not measured."""
    if by_labels:
        score = c.accuracy_score
        return None if score is None else (score, 0.0)
    return _fidelity_key(c, baseline)


def fidelity_words(c: Candidate, baseline: str | None = None, unlabelled_only: bool = False) -> str:
    """`output error 4.70% of the range, top-1 agreement 99.0%, 40 samples (fewer than 32: rough)`; with
    several outputs, the worst one is named (`output box off by 25.50% of its range`)."""
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
    if least is not None and several:
        parts.append(f"output {least.name} top-1 agreement {least.top1_agreement * 100:.1f}%")
    elif least is not None:
        parts.append(f"top-1 agreement {least.top1_agreement * 100:.1f}%")
    few = " (fewer than 32: a rough figure)" if f.few_samples else ""
    return ", ".join(parts + [f"{f.samples} samples{few}"])


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
    """What a candidate loses against float32, in words: `loses 75.0 points of top-1`, or without labels
    `differs from float32 (output error 12.80% of the range, 40 samples)`; where the guard judges outputs
    without labels and one of them is what breaks it, that output: `keeps top-1, but differs from float32
    (output box off by 25.50% of its range, 120 samples)`."""
    m = c.metrics
    if m is None:
        return "not measured"
    if guard is not None and guard.unlabelled_only and _labelled_ok(guard, c) and _outputs_broken(guard, c):
        kept = _labelled_words(c) or "keeps its labelled output"
        return f"{kept}, but differs from float32 ({fidelity_words(c, unlabelled_only=True)})"
    words = _labelled_words(c)
    return words or f"differs from float32 ({fidelity_words(c)})"


def _labelled_words(c: Candidate) -> str | None:
    m = c.metrics
    if m.accuracy_delta is not None:
        if m.accuracy_delta >= 0:
            return f"gains {m.accuracy_delta * 100:.1f} points of top-1" if m.accuracy_delta else "keeps top-1"
        return f"loses {-m.accuracy_delta * 100:.1f} points of top-1"
    if m.error_ratio is not None:
        return f"has {max(0.0, m.error_ratio - 1) * 100:.1f}% more error than float32"
    return None


def _labelled_ok(guard: Guard, c: Candidate) -> bool:
    """Whether the labelled output is within the guard's (or the user's) goal for it."""
    m, g = c.metrics, guard.goals
    if g.max_accuracy_drop is not None and m.accuracy_delta is not None:
        return -m.accuracy_delta <= g.max_accuracy_drop + 1e-9
    if g.max_error_increase is not None and m.error_ratio is not None:
        return m.error_ratio - 1 <= g.max_error_increase + 1e-9
    return True


def _outputs_broken(guard: Guard, c: Candidate) -> bool:
    f, g = c.metrics.fidelity, guard.goals
    if f is None:
        return False
    worst, least = f.worst(guard.unlabelled_only), f.least_agreeing(guard.unlabelled_only)
    far = g.max_output_error is not None and worst is not None and worst.relative_error > g.max_output_error + 1e-9
    apart = g.min_agreement is not None and least is not None and least.top1_agreement < g.min_agreement - 1e-9
    return far or apart


def _names(outputs: list[str]) -> str:
    return ", ".join(outputs[:3]) + (f" and {len(outputs) - 3} more" if len(outputs) > 3 else "")


def default_guard(goals: Goals, study: Study) -> Guard | None:
    """The guard for a study, standing in for the quality goals the user did not state; None when every
    one it would set was stated, or when nothing about quality was measured (no labels, no fidelity).

    With labels, the labelled output is guarded by its own figure (2 points of top-1, or 5% more error), and
    every other output by its fidelity to float32 (within 5% of its range, 98% top-1 agreement for class
    outputs): a fine-tuned candidate that keeps the labelled output but breaks another is kept out, by name.
    """
    ok = [c for c in study.candidates if c.ok]
    accuracy = any(c.metrics.accuracy_delta is not None for c in ok)
    errors = any(c.metrics.error_ratio is not None for c in ok)
    if accuracy or errors:
        return _labelled_guard(goals, ok, accuracy)
    if has_quality_goal(goals):
        return None
    fids = [c.metrics.fidelity for c in ok if c.metrics.fidelity is not None]
    if not fids:
        return None
    update: dict = {"max_output_error": DEFAULT_MAX_OUTPUT_ERROR}
    words = f"no labels: outputs within {DEFAULT_MAX_OUTPUT_ERROR * 100:g}% of float32's range"
    if any(f.top1_agreement is not None for f in fids):
        update["min_agreement"] = 1 - DEFAULT_MAX_DROP
        words += f" and top-1 agreement of at least {(1 - DEFAULT_MAX_DROP) * 100:g}%"
    return Guard(goals=goals.model_copy(update=update), words=words, override="--max-output-error")


def unlabelled_outputs(cands: list[Candidate]) -> tuple[list[str], bool]:
    """The outputs a labelled study scores by fidelity only (the labels belong to another), and whether any
    of them is classes; none for a study that does not mark its labelled output (written before it did)."""
    names: dict[str, None] = {}
    classes = False
    for c in cands:
        f = c.metrics.fidelity if c.ok and c.metrics.accuracy is not None else None
        if f is None or not any(o.labelled for o in f.outputs):
            continue
        for o in f.outputs:
            if not o.labelled:
                names[o.name] = None
                classes = classes or o.top1_agreement is not None
    return list(names), classes


def _labelled_guard(goals: Goals, ok: list[Candidate], accuracy: bool) -> Guard | None:
    """The labelled output's part (unless a goal for it was stated), and the other outputs' part (unless a
    fidelity goal was stated)."""
    update: dict = {}
    words, unstated, override = [], [], ""
    if not has_labelled_goal(goals):
        if accuracy:
            update["max_accuracy_drop"] = DEFAULT_MAX_DROP
            words.append(f"at most {DEFAULT_MAX_DROP * 100:g} points of top-1 lost")
            override = "--max-accuracy-drop"
        else:
            update["max_error_increase"] = DEFAULT_MAX_ERROR_INCREASE
            words.append(f"at most {DEFAULT_MAX_ERROR_INCREASE * 100:g}% more error than float32")
        unstated.append("no accuracy goal was given")
    others, classes = unlabelled_outputs(ok)
    if others and not has_output_goal(goals):
        update["max_output_error"] = DEFAULT_MAX_OUTPUT_ERROR
        part = f"the outputs without labels ({_names(others)}) within {DEFAULT_MAX_OUTPUT_ERROR * 100:g}% of float32's range"
        if classes:
            update["min_agreement"] = 1 - DEFAULT_MAX_DROP
            part += f", {(1 - DEFAULT_MAX_DROP) * 100:g}% top-1 agreement"
        words.append(part)
        if not unstated:
            unstated.append("no goal for the outputs without labels was given")
    else:
        others = []
    if not update:
        return None
    return Guard(
        goals=goals.model_copy(update=update),
        words=", and ".join(words),
        override=override or "--max-output-error",
        unstated=unstated[0],
        outputs=others,
    )


def measured(guard: Guard, c: Candidate) -> bool:
    """Whether the candidate has every figure the guard judges (else the guard cannot clear it)."""
    m = c.metrics
    g = guard.goals
    if g.max_accuracy_drop is not None and m.accuracy_delta is None:
        return False
    if g.max_error_increase is not None and m.error_ratio is None:
        return False
    if g.max_output_error is not None or g.min_agreement is not None:
        return m.fidelity is not None and m.fidelity.worst(guard.unlabelled_only) is not None
    return True


def kept_out_words(guard: Guard, c: Candidate, problem: str) -> str:
    """Why the guard keeps a candidate out: what it loses, or that the figure is missing."""
    what = loss_words(c, guard) if measured(guard, c) else problem
    return f"{what}: beyond the default guard ({guard.words}; {guard.unstated})"


def accept_hint(guard: Guard, c: Candidate) -> str:
    """The option that would accept this candidate's loss: `--max-accuracy-drop 0.76`, or for an output
    without labels `--max-output-error 0.26`."""
    m = c.metrics
    f = m.fidelity
    if guard.unlabelled_only and _labelled_ok(guard, c) and _outputs_broken(guard, c):
        worst = f.worst(True)
        if worst is not None:
            return f"--max-output-error {min(1.0, max(0.01, math.ceil(worst.relative_error * 100 - 1e-6) / 100)):g}"
    if guard.override == "--max-accuracy-drop" and m.accuracy_delta is not None:
        return f"--max-accuracy-drop {math.ceil(-m.accuracy_delta * 100 - 1e-6) / 100:g}"
    if guard.override == "--max-output-error" and f and f.relative_error is not None:
        return f"--max-output-error {min(1.0, max(0.01, math.ceil(f.relative_error * 100 - 1e-6) / 100)):g}"
    return "a goal of your own"

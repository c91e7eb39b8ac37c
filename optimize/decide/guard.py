"""Quality without labels, and the default guard: what the recommender may pick when no goal is given.

Quality is the labelled accuracy when the study has labels. Without labels it is fidelity to the float32
reference, already measured for every candidate: top-1 agreement for class outputs (then the worst output's
relative error), else the worst output's relative error (mean |diff| over the reference output's range).
Errors under `FIDELITY_RESOLUTION` of the range count as none, so float16's rounding ties with float32 the
way a zero accuracy delta does.

The default guard applies when the user gave no accuracy or fidelity goal: at most `DEFAULT_MAX_DROP`
(2 points of top-1) lost, or `DEFAULT_MAX_ERROR_INCREASE` (5%) more regression error, or, without labels,
outputs within `DEFAULT_MAX_OUTPUT_ERROR` (5%) of the reference's range (and top-1 agreement of at least
`1 - DEFAULT_MAX_DROP` for class outputs, which bounds the same 2 points). It is a goal the user did not
state, so every rejection it causes says so. Pure: no TensorFlow, no numpy.
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


def has_quality_goal(goals: Goals) -> bool:
    return any(getattr(goals, k) is not None for k in QUALITY_GOALS)


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


def fidelity_words(c: Candidate, baseline: str | None = None) -> str:
    """`output error 4.70% of the range, top-1 agreement 99.0%, 40 samples (fewer than 32: rough)`."""
    if baseline is not None and c.name == baseline:
        return "the float32 reference itself"
    f = c.metrics.fidelity if c.metrics else None
    if f is None:
        return "fidelity not measured"
    parts = []
    if f.relative_error is not None:
        parts.append(f"output error {f.relative_error * 100:.2f}% of the range")
    if f.top1_agreement is not None:
        parts.append(f"top-1 agreement {f.top1_agreement * 100:.1f}%")
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


def loss_words(c: Candidate) -> str:
    """What a candidate loses against float32, in words: `loses 75.0 points of top-1`, or without labels
    `differs from float32 (output error 12.80% of the range, 40 samples)`."""
    m = c.metrics
    if m is None:
        return "not measured"
    if m.accuracy_delta is not None:
        return f"loses {max(0.0, -m.accuracy_delta) * 100:.1f} points of top-1"
    if m.error_ratio is not None:
        return f"has {max(0.0, m.error_ratio - 1) * 100:.1f}% more error than float32"
    return f"differs from float32 ({fidelity_words(c)})"


def default_guard(goals: Goals, study: Study) -> Guard | None:
    """The guard for a study when no accuracy or fidelity goal was given; None when one was, or when
    nothing about quality was measured (no labels, no fidelity)."""
    if has_quality_goal(goals):
        return None
    ok = [c for c in study.candidates if c.ok]
    if any(c.metrics.accuracy_delta is not None for c in ok):
        pts = f"{DEFAULT_MAX_DROP * 100:g}"
        return Guard(
            goals=goals.model_copy(update={"max_accuracy_drop": DEFAULT_MAX_DROP}),
            words=f"at most {pts} points of top-1 lost",
            override="--max-accuracy-drop",
        )
    if any(c.metrics.error_ratio is not None for c in ok):
        return Guard(
            goals=goals.model_copy(update={"max_error_increase": DEFAULT_MAX_ERROR_INCREASE}),
            words=f"at most {DEFAULT_MAX_ERROR_INCREASE * 100:g}% more error than float32",
        )
    fids = [c.metrics.fidelity for c in ok if c.metrics.fidelity is not None]
    if not fids:
        return None
    update: dict = {"max_output_error": DEFAULT_MAX_OUTPUT_ERROR}
    words = f"no labels: outputs within {DEFAULT_MAX_OUTPUT_ERROR * 100:g}% of float32's range"
    if any(f.top1_agreement is not None for f in fids):
        update["min_agreement"] = 1 - DEFAULT_MAX_DROP
        words += f" and top-1 agreement of at least {(1 - DEFAULT_MAX_DROP) * 100:g}%"
    return Guard(goals=goals.model_copy(update=update), words=words, override="--max-output-error")


def measured(guard: Guard, c: Candidate) -> bool:
    """Whether the candidate has the figure the guard judges (else the guard cannot clear it)."""
    m = c.metrics
    g = guard.goals
    if g.max_accuracy_drop is not None:
        return m.accuracy_delta is not None
    if g.max_error_increase is not None:
        return m.error_ratio is not None
    return m.fidelity is not None and m.fidelity.relative_error is not None


def kept_out_words(guard: Guard, c: Candidate, problem: str) -> str:
    """Why the guard keeps a candidate out: what it loses, or that the figure is missing."""
    what = loss_words(c) if measured(guard, c) else problem
    return f"{what}: beyond the default guard ({guard.words}; no accuracy goal was given)"


def accept_hint(guard: Guard, c: Candidate) -> str:
    """The option that would accept this candidate's loss: `--max-accuracy-drop 0.76`."""
    m = c.metrics
    if guard.override == "--max-accuracy-drop" and m.accuracy_delta is not None:
        return f"--max-accuracy-drop {math.ceil(-m.accuracy_delta * 100 - 1e-6) / 100:g}"
    if guard.override == "--max-output-error" and m.fidelity and m.fidelity.relative_error is not None:
        return f"--max-output-error {min(1.0, math.ceil(m.fidelity.relative_error * 100 - 1e-6) / 100):g}"
    return "a goal of your own"

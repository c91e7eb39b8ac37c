"""Why the measured choice is what it is: against the rule of thumb, against the default guard, and what to try.

The recommender (optimize.decide.choose) ranks what was measured; this module puts its answer into words: the
line saying why the measured choice differs from the decision tree's pipeline (or that they agree), the
warnings for candidates the default guard kept out (said in words, so they read without colour), what to
try when nothing passes, and the rule of thumb's alternatives matched against the study (a failed
candidate is never offered). No line points at the command that printed it. Pure: no TensorFlow, no numpy.
"""

from __future__ import annotations

from optimize.core.results import Candidate, Study
from optimize.core.vocab import Objective, Scheme, Target
from optimize.decide.guard import Guard, accept_hint, axes, fidelity_words, loss_words, measured
from optimize.measure.noise import versus

#: Techniques that only choose the number format; every other technique changes what a pipeline is.
FORMAT_STEPS = ("convert", "quantize")
INTEGER_ONLY = (Target.MCU, Target.EDGETPU, Target.HEXAGON)


def shape_of_steps(steps: list[dict]) -> tuple[str, str, frozenset[str]]:
    """(final scheme, I/O type, the other techniques) of a pipeline given as flat steps."""
    scheme, io, techs = str(Scheme.FLOAT32), "float", set()
    for s in steps:
        if s["technique"] in FORMAT_STEPS:
            scheme = str(s.get("scheme", scheme))
            io = str(s.get("io") or io)
        else:
            techs.add(s["technique"])
    return scheme, io, frozenset(techs)


def shape_of(c: Candidate) -> tuple[str, str, frozenset[str]]:
    return str(c.scheme), c.io, frozenset(s.technique for s in c.steps if s.technique not in FORMAT_STEPS)


def matching(study: Study, steps: list[dict]) -> list[Candidate]:
    """The study's candidates made the way a pipeline says (same scheme, I/O and techniques)."""
    want = shape_of_steps(steps)
    return [c for c in study.candidates if shape_of(c) == want]


def alternatives(
    study: Study, labelled: list[tuple[str, list[dict]]], chosen: Candidate | None, rejected: dict | None = None
) -> list[str]:
    """The rule of thumb's alternatives against the study: measured ones named with the candidate that
    worked (one the choice rejected says so, so the rule of thumb's promise is not left standing beside the
    measurement that broke it), ones the study never tried marked so; ones that only failed, and the choice
    itself, left out."""
    from optimize.decide.advice import describe

    rejected = rejected or {}
    out = []
    for label, steps in labelled:
        found = matching(study, steps)
        worked = [c for c in found if c.ok]
        if (found and not worked) or (chosen is not None and chosen in found):
            continue
        kept = [c for c in worked if c.name not in rejected]
        if kept:
            where = f"measured as {kept[0].name}"
        elif worked:
            where = f"measured as {worked[0].name}, rejected above"
        else:
            where = "not measured in this study"
        out.append(f"{label}: {describe(steps)} ({where})")
    return out


def _size(c: Candidate) -> int:
    return c.metrics.size.bytes


def _quality_words(c: Candidate, by_labels: bool, baseline: str) -> str:
    return loss_words(c) if by_labels else fidelity_words(c, baseline)


def _beats(chosen: Candidate, other: Candidate, objective: Objective, by_labels: bool, baseline: str) -> str:
    """Why `chosen` ranked above `other`, on the first axis that told them apart."""
    ax = axes(chosen, other, by_labels, baseline)
    if objective is Objective.LATENCY and ax[Objective.LATENCY] < 0:
        return f"it measured faster: {versus(chosen, other)}"
    if objective is Objective.ACCURACY and ax[Objective.ACCURACY] < 0:
        a, b = _quality_words(chosen, by_labels, baseline), _quality_words(other, by_labels, baseline)
        return f"it is closer to float32 ({a}; {other.name}: {b})"
    if ax[Objective.SIZE] < 0:
        tie = {
            Objective.SIZE: "",
            Objective.LATENCY: "it is as fast within the timing noise, and ",
            Objective.ACCURACY: "it is as accurate (fidelity within 0.1% of the range counts as equal), and ",
        }[objective]
        return f"{tie}it is smaller ({_size(chosen):,} vs {_size(other):,} bytes)"
    if ax[Objective.LATENCY] < 0:
        return f"as small, and it measured faster: {versus(chosen, other)}"
    return "the two measure the same here; it comes first in the study"


def why_lines(
    study: Study,
    pipeline: list[dict],
    chosen: Candidate | None,
    reasons: dict[str, str],
    objective: Objective,
    by_labels: bool,
) -> list[str]:
    """One line on the measured choice against the rule of thumb's pipeline (`reasons`: rejected
    candidates and why), plus a line when the figures behind it come from few samples."""
    from optimize.decide.advice import describe

    if chosen is None:
        return []
    rule = describe(pipeline)
    if shape_of(chosen) == shape_of_steps(pipeline):
        lines = [f"The measurements agree with the rule of thumb ({rule})."]
    else:
        found = matching(study, pipeline)
        eligible = [c for c in found if c.name not in reasons]
        if eligible:
            other = eligible[0]
            why = _beats(chosen, other, objective, by_labels, study.baseline)
            lines = [f"The rule of thumb says {rule}; measured, {chosen.name} ranks above {other.name}: {why}."]
        elif found:
            other = found[0]
            lines = [f"The rule of thumb says {rule}; measured, {other.name} was rejected: {reasons[other.name]}."]
        else:
            lines = [f"The rule of thumb says {rule}, which this study did not measure; {chosen.name} is the best "
                     "measured candidate."]  # fmt: skip
    fid = chosen.metrics.fidelity if chosen.metrics else None
    if fid is not None and fid.few_samples and not (by_labels and chosen.metrics.accuracy is not None):
        lines.append(
            f"{chosen.name}'s fidelity comes from {fid.samples} samples, fewer than 32: a rough figure (more data "
            "with --data firms it up)."
        )
    return lines


def guard_warnings(guard: Guard, kept_out: list[Candidate]) -> list[str]:
    """Words for each candidate the default guard kept out that would otherwise have ranked above the choice
    (the same words whatever the target, so a summary over targets says each once)."""
    lines = []
    for c in kept_out[:3]:
        if measured(guard, c):
            lines.append(
                f"{c.name} not picked: it {loss_words(c)}, beyond the default guard ({guard.words}; no accuracy "
                f"goal was given). To accept it: {accept_hint(guard, c)}."
            )
        else:
            lines.append(
                f"{c.name} not picked: the default guard ({guard.words}) cannot check it, its loss was not "
                "measured. State a goal of your own to judge it otherwise."
            )
    return lines


def nothing_passes(best: Candidate, target: Target, guard: Guard) -> str:
    """When nothing passes the guard: what the best candidate loses."""
    return f"Nothing {target} runs passes the default guard ({guard.words}): the best, {best.name}, {loss_words(best)}."


def what_to_try(best: Candidate, target: Target, guard: Guard) -> list[str]:
    """When nothing passes the guard: what to try next (never the command just run)."""
    lines = []
    if best.scheme in (Scheme.INT8, Scheme.INT16X8, Scheme.DYNAMIC, Scheme.INT4):
        scheme = Scheme.INT16X8 if best.scheme == Scheme.INT16X8 else Scheme.INT8
        lines.append(f"Find the ops that break it: optimize debug MODEL --data D.npz --scheme {scheme}")
        lines.append("Quantization-aware training recovers most of it: optimize qat MODEL --data D.npz")
        if target not in INTEGER_ONLY:
            lines.append("Or keep the breaking ops at higher precision: mixed int8, or int16x8 (slower kernels).")
        else:
            lines.append("More, and more representative, calibration samples: --calibration-samples 500")
    lines.append(f"Or accept the loss: {accept_hint(guard, best)}.")
    return lines


def command_for(steps: list[dict]) -> str:
    """The command that makes a pipeline: `optimize quantize MODEL --scheme int8 --calibration D.npz`, or
    `optimize run RECIPE MODEL` for a pipeline no shortcut spells."""
    scheme, io, techs = shape_of_steps(steps)
    plain = sum(s["technique"] in FORMAT_STEPS for s in steps) == 1
    io_opt = f" --io {io}" if io != "float" else ""
    if not techs and plain:
        cal = " --calibration D.npz" if scheme in (Scheme.INT8, Scheme.INT16X8) else ""
        return f"optimize quantize MODEL --scheme {scheme}{io_opt}{cal}"
    if techs == {"qat"} and plain and not io_opt:
        return "optimize qat MODEL --data D.npz" + ("" if scheme == Scheme.INT8 else f" --then {scheme}")
    if techs == {"prune"} and plain and not io_opt:
        return f"optimize prune MODEL --data D.npz --then {scheme}"
    return "optimize run RECIPE MODEL, RECIPE holding the recipe the decision tree prints with --json"


def describe_pipeline(advice) -> str:
    """The rule of thumb's pipeline and the command that makes it."""
    from optimize.decide.advice import describe

    return f"{describe(advice.pipeline)} ({command_for(advice.pipeline)})."

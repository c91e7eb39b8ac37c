"""Why the measured choice is what it is: against the rule of thumb, against the default guard, and what to try.

The recommender (optimize.decide.choose) ranks what was measured; this module puts its answer into words: the
line saying why the measured choice differs from the decision tree's pipeline (or that they agree), the
warnings for candidates the default guard kept out (said in words, so they read without colour), what to
try when nothing passes, and the rule of thumb's alternatives matched against the study (a failed
candidate is never offered). No line points at the command that printed it. Pure: no TensorFlow, no numpy.
"""

from __future__ import annotations

from collections.abc import Callable

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
    worked and is eligible, ones the study never tried marked so; ones that only failed or were rejected
    for this target (the rule of thumb's promise is never left standing beside the measurement that broke
    it), and the choice itself, left out."""
    from optimize.decide.advice import describe

    rejected = rejected or {}
    out = []
    for label, steps in labelled:
        found = matching(study, steps)
        worked = [c for c in found if c.ok]
        if (found and not worked) or (chosen is not None and chosen in found):
            continue
        kept = [c for c in worked if c.name not in rejected]
        if worked and not kept:
            continue  # measured and rejected for this target: offering it would contradict the measurement
        where = f"measured as {kept[0].name}" if kept else _variant(study, steps) or "not measured in this study"
        out.append(f"{label}: {describe(steps)} ({where})")
    return out


def _variant(study: Study, steps: list[dict]) -> str | None:
    """How the study measured a pipeline it did not measure as such: the same techniques at another number
    format or I/O type (`qat-int8`, with float I/O, for QAT then int8 with int8 I/O), in words, or None."""
    scheme, io, techs = shape_of_steps(steps)
    if not techs:
        return None
    for c in study.candidates:
        c_scheme, c_io, c_techs = shape_of(c)
        if c.ok and c_techs == techs:
            return f"not as such: measured with {c_scheme}, {c_io} I/O as {c.name}"
    return None


def measured_on(cands: list[Candidate]) -> str:
    """`Accuracy and fidelity on all 600 test samples.`, or on a sample of the split, with how and why: the `n`
    every quality figure of the table stands on (issue 43: it was the first 500, silently). Empty without data."""
    ok = [c for c in cands if c.ok]
    tests = [c.metrics.test for c in ok if c.metrics.test is not None]
    if tests:
        t = min(tests, key=lambda t: t.samples)
        return f"Accuracy and fidelity on {t.words()}."
    counts = sorted({c.metrics.accuracy.samples for c in ok if c.metrics.accuracy is not None})
    counts = counts or sorted({c.metrics.fidelity.samples for c in ok if c.metrics.fidelity is not None})
    if not counts:
        return ""
    n = f"{counts[0]:,}" if len(counts) == 1 else f"{counts[0]:,}-{counts[-1]:,}"
    return f"Accuracy and fidelity on {n} test samples."


def facts_once(facts: list[str], study: Study) -> list[str]:
    """Each fact said once. A candidate measured slower than float32 whose XNNPACK coverage is partial gets one
    line for both, and where that candidate is its scheme's (int16x8), the rule of thumb's word on the scheme
    leads that line instead of standing beside it: three lines on int16x8's reference kernels become one."""
    out = list(dict.fromkeys(facts))
    for c in study.candidates:
        if c.ok:
            out = _one_line_on(c, out)
    return out


def _one_line_on(c: Candidate, facts: list[str]) -> list[str]:
    """`facts` with what they say of `c`'s reference kernels in one line (facts_once)."""
    label = c.name if c.name == c.scheme else f"{c.name} ({c.scheme})"
    xnn = next((f for f in facts if f.startswith(f"{c.name}: XNNPACK takes ")), None)
    slow = next((f for f in facts if f.startswith(f"{label} measured slower than float32 here: ")), None)
    if not (xnn and slow):
        return facts
    general = next((f for f in facts if c.name == c.scheme and f.startswith(f"{c.scheme} ")), None)
    where = xnn.removeprefix(f"{c.name}: XNNPACK takes ").split(";")[0]
    measured = slow.removeprefix(f"{label} measured slower than float32 here: ").rstrip(".")
    lead = general.rstrip(".") if general else f"{label} runs on the CPU's reference kernels"
    one = f"{lead}: here XNNPACK takes {where}, and it measured {measured}."
    return [one if f == slow else f for f in facts if f not in (xnn, general)]


def _size(c: Candidate) -> int:
    return c.metrics.size.bytes


def _quality_words(c: Candidate, by_labels: bool, baseline: str) -> str:
    return loss_words(c) if by_labels else fidelity_words(c, baseline)


def beats(chosen: Candidate, other: Candidate, objective: Objective, by_labels: bool, baseline: str) -> str:
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
            why = beats(chosen, other, objective, by_labels, study.baseline)
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


Hint = Callable[[Candidate], str]


def path_update(study: Study, pipeline: list[dict], chosen: Candidate | None, reasons: dict[str, str], target) -> str:
    """One line under the decision path when the measured pick is another scheme than the path's, so the path
    and the pick never contradict each other: the path updated to what was measured (the delegate's rules took
    the pick whole, and it ranked above; or the path's own scheme was rejected, failed or not measured). Empty
    when they agree."""
    scheme = shape_of_steps(pipeline)[0]
    if chosen is None or str(chosen.scheme) == scheme:
        return ""
    found = matching(study, pipeline)
    eligible = [c for c in found if c.name not in reasons and c.ok]
    if eligible:
        why = f"{target} runs it fully and it ranks above {eligible[0].name} on the measurements"
    elif found:
        which = scheme if found[0].name == scheme else f"{scheme} ({found[0].name})"
        why = f"the path's {which} {'was rejected' if found[0].ok else 'failed'} here"
    else:
        why = f"the path's {scheme} was not measured here"
    label = chosen.name if chosen.name == chosen.scheme else f"{chosen.name} ({chosen.scheme})"
    return f"Updated by measurement: {label}, not {scheme}: {why} (see Why)."


def guard_warnings(guard: Guard, kept_out: list[Candidate], hint: Hint | None = None) -> list[str]:
    """Words for each candidate the default guard kept out that would otherwise have ranked above the choice
    (the same words whatever the target, so a summary over targets says each once). `hint`: the options that
    accept a candidate (the recommender checks they do), else the guard's own remedy."""
    hint = hint or (lambda c: accept_hint(guard, c))
    lines = []
    for c in kept_out[:3]:
        if measured(guard, c):
            lines.append(
                f"{c.name} not picked: it {loss_words(c, guard)}, beyond the default guard ({guard.words}; "
                f"{guard.unstated}). To accept it: {hint(c)}."
            )
        else:
            lines.append(
                f"{c.name} not picked: the default guard ({guard.words}) cannot check it, its loss was not "
                "measured. State a goal of your own to judge it otherwise."
            )
    return lines


def nothing_passes(best: Candidate, target: Target, guard: Guard) -> str:
    """When nothing passes the guard: what the best candidate loses."""
    return (
        f"Nothing {target} runs passes the default guard ({guard.words}): the best, {best.name}, "
        f"{loss_words(best, guard)}."
    )


def _tried(study: Study | None, reasons: dict[str, str], test) -> bool:
    """Whether the study measured something of this kind and none of it is eligible (all failed or rejected)."""
    found = [c for c in study.candidates if test(c)] if study is not None else []
    return bool(found) and all(c.name in reasons or not c.ok for c in found)


def what_to_try(
    best: Candidate,
    target: Target,
    guard: Guard,
    study: Study | None = None,
    reasons: dict[str, str] | None = None,
    hint: Hint | None = None,
) -> list[str]:
    """When nothing passes the guard: what to try next (never the command just run, never what the study
    measured and rejected for this target)."""
    reasons = reasons or {}
    hint = hint or (lambda c: accept_hint(guard, c))
    lines = []
    if best.scheme in (Scheme.INT8, Scheme.INT16X8, Scheme.DYNAMIC, Scheme.INT4):
        scheme = Scheme.INT16X8 if best.scheme == Scheme.INT16X8 else Scheme.INT8
        lines.append(f"Find the ops that break it: optimize debug MODEL --data D.npz --scheme {scheme}")
        if not _tried(study, reasons, lambda c: c.uses("qat")):
            lines.append("Quantization-aware training recovers most of it: optimize qat MODEL --data D.npz")
        if target not in INTEGER_ONLY:
            ways = [
                way
                for way, test in (
                    ("mixed int8", lambda c: c.uses("selective")),
                    ("int16x8 (slower kernels)", lambda c: c.scheme == Scheme.INT16X8 and not c.uses("selective")),
                )
                if not _tried(study, reasons, test)
            ]
            if ways:
                lines.append(f"Or keep the breaking ops at higher precision: {', or '.join(ways)}.")
        else:
            lines.append("More, and more representative, calibration samples: --calibration-samples 500")
    lines.append(f"Or accept the loss: {hint(best)}.")
    return lines


def what_to_make(study: Study, advice, reasons: dict[str, str]) -> tuple[str | None, list[str]]:
    """When nothing measured fits: the first of the rule of thumb's pipelines (its own, then its
    alternatives) that this study did not measure, with the command that makes it; and those it measured
    and rejected, each with why (offered again, they would contradict the measurements)."""
    from optimize.decide.advice import describe

    tried: list[str] = []
    for steps in [advice.pipeline, *(a.steps for a in advice.alternative_pipelines)]:
        found = matching(study, steps)
        if not found:
            return f"{describe(steps)} ({command_for(steps)}).", tried
        c = found[0]
        why = reasons.get(c.name) or (f"failed: {c.error}" if c.error else "rejected")
        line = f"{c.name}: {why.rstrip('.')}"
        if line not in tried:
            tried.append(line)
    return None, tried


def nothing_known_runs(target: Target) -> str:
    """Nothing the decision tree knows would run on the target, as measured: where to look next (each
    rejection, with the node that blocks it, is listed above the error, so it is not repeated in it)."""
    from optimize.core.vocab import TARGET_DELEGATE

    delegate = TARGET_DELEGATE.get(target)
    if delegate is not None and target is not Target.CPU:
        return f"`optimize compat FILE --delegate {delegate}` lists each node it refuses."
    return "Each candidate's reason is listed under Rejected."


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

"""Retraining told apart from compression (issue 43).

Pruning, clustering and QAT fine-tune the model on the user's data. On an under-trained model that alone gains
points: a small CNN's chains read "+7 to +9 points" while agreeing with the user's float model on 88-90% of its
inputs, and beat plain int8 (99.8% agreement) as if compression had bought the gain. So a retrained candidate
is marked as such, its agreement with float32 is shown, and by default its labelled output (the one whose
accuracy reads as a gain) is held to the figure of its kind that says whether it still answers as the user's
model does (98% top-1 agreement for classes or decisions at 0.5 for sigmoid outputs, 5% of the range for
values): `--min-agreement` (or `--max-output-error`) states another bound. Its other outputs are judged against
float32 by the default guard already. A gain above the noise of the test split is credited to
training, beside the training control's (`float32-finetuned`: the float model fine-tuned the same way) where
the sweep measured one. Pure: no TensorFlow, no numpy.
"""

from __future__ import annotations

import math

from optimize.core.results import Candidate, Goals, OutputFidelity, Study
from optimize.decide import kinds
from optimize.decide.kinds import Bound, Check

#: The mark a retrained candidate's name carries on screen and in the report.
MARK = "†"


def _bound(kind: kinds.Kind) -> Bound:
    """The figure that says whether an output of this kind still answers as float32's: its agreement where it
    decides, else its one figure against float32 (output error, detections kept, mask IoU)."""
    return next((b for b in kind.against_float if b.goal == "min_agreement"), kind.against_float[-1])


def _check(bound: Bound) -> Check:
    return next(ch for ch in kinds.CHECKS if ch.bound.goal == bound.goal)


def broken(c: Candidate, goals: Goals) -> tuple[Bound, OutputFidelity, float] | None:
    """The first default bound a retrained candidate breaks on its labelled output, with the output and its
    figure; None when it keeps them, is not retrained, is the control, or the user stated that goal (theirs
    then judges every candidate). The labelled output is the one its labels' figure judges (where retraining
    reads as a gain); every other output is judged against float32 already (`guard`)."""
    if not c.retrained or c.control or not c.ok or c.metrics.fidelity is None:
        return None
    for o in c.metrics.fidelity.outputs:
        if not o.labelled:
            continue
        bound = _bound(kinds.of_output(o))
        if getattr(goals, bound.goal) is not None:
            continue
        check = _check(bound)
        value = check.read(o)
        if value is not None and check.broken(value, bound.default):
            return bound, o, value
    return None


def _figure(bound: Bound, o: OutputFidelity, value: float, n: int, named: bool) -> str:
    which = f"output {o.name} " if named else ""
    if bound.goal == "max_output_error":
        return f"{which}{value * 100:.2f}% of its range off float32 on {n:,} test samples"
    if bound.goal == "min_agreement":
        return f"{which}{kinds.agreement_name(o)} with float32 {value * 100:.1f}% on {n:,} test samples"
    return f"{which}{bound.words(value)} on {n:,} test samples"


def problem(c: Candidate, goals: Goals) -> str | None:
    """Why the default keeps a retrained candidate out, with the option that accepts it, or None."""
    found = broken(c, goals)
    if found is None:
        return None
    bound, o, value = found
    f = c.metrics.fidelity
    figure = _figure(bound, o, value, f.samples, len(f.outputs) > 1)
    return (
        f"retrained (fine-tuned on your data), and its answers moved from your model's: {figure} (the default for "
        f"retrained candidates: {bound.words()}; to accept it: {bound.option} {bound.accepting(value):g})"
    )


def hint(c: Candidate, goals: Goals) -> str:
    """`--min-agreement 0.88`: the option that accepts a retrained candidate the default keeps out."""
    found = broken(c, goals)
    return f"{found[0].option} {found[0].accepting(found[2]):g}" if found else ""


def rule_words(study: Study, goals: Goals) -> str:
    """The default in force for the study's retrained candidates, in words (empty when none is retrained or
    every bound that would judge them was stated)."""
    retrained = [c for c in study.candidates if c.ok and c.retrained and not c.control and c.metrics.fidelity]
    bounds = {_bound(kinds.of_output(o)) for c in retrained for o in c.metrics.fidelity.outputs if o.labelled}
    said = [b.words() for b in sorted(bounds, key=lambda b: b.goal) if getattr(goals, b.goal) is None]
    if not said:
        return ""
    options = sorted({b.option for b in bounds})
    return (
        f"Retrained candidates (fine-tuned on your data: prune, cluster, QAT) must still answer as your model does: "
        f"{', '.join(said)} ({', '.join(options)} to state another bound)."
    )


def agreement(c: Candidate) -> OutputFidelity | None:
    """The output whose agreement with float32 is lowest, labelled or not (None: no output decides)."""
    f = c.metrics.fidelity if c.ok else None
    return f.least_agreeing() if f is not None else None


def noise(c: Candidate) -> float | None:
    """About two standard errors of the candidate's accuracy change on its test samples: the change of two
    models on the same samples can only come from the samples where their answers differ, so its spread is at
    most sqrt(share differing / n) (McNemar's). None without labels."""
    m = c.metrics
    if m is None or m.accuracy is None or m.accuracy_delta is None:
        return None
    n = max(1, m.accuracy.samples)
    least = agreement(c)
    differ = 1 - least.agreement if least is not None else 1.0
    return 2 * math.sqrt(max(differ, 1 / n) / n)


def credit(c: Candidate, study: Study) -> str:
    """A retrained candidate's accuracy change, credited where it belongs: beyond the noise, to training (and,
    with the control measured, split between training and compression); else within the noise."""
    m = c.metrics
    spread = noise(c)
    if not c.retrained or spread is None:
        return ""
    delta, n = m.accuracy_delta, m.accuracy.samples
    if abs(delta) <= spread:
        return (
            f"{c.name}: {delta * 100:+.1f} points against your model, within the noise (±{spread * 100:.1f} on {n:,})"
        )
    control = next((x for x in study.candidates if x.control and x.ok and x.metrics.accuracy_delta is not None), None)
    if control is None or c.control:
        return f"{c.name}: {delta * 100:+.1f} points against your model (noise ±{spread * 100:.1f} on {n:,}): training's, not compression's"
    trained = control.metrics.accuracy_delta
    rest = delta - trained
    return (
        f"{c.name}: {delta * 100:+.1f} points against your model (noise ±{spread * 100:.1f} on {n:,}): the float "
        f"model fine-tuned the same way gains {trained * 100:+.1f} ({control.name}), so training bought it and "
        f"compression {'cost' if rest < 0 else 'added'} {abs(rest) * 100:.1f}"
    )


def summary(study: Study) -> str:
    """One line on what the study's retrained candidates gained against your model, beyond the noise of the test
    split, credited to training (beside the control's gain where it was measured); empty when none gained so."""
    gained = [c for c in study.candidates if c.ok and c.retrained and not c.control and (n := noise(c)) is not None
              and abs(c.metrics.accuracy_delta) > n]  # fmt: skip
    if not gained:
        return ""
    each = ", ".join(f"{c.name} {c.metrics.accuracy_delta * 100:+.1f}" for c in gained)
    widest = max(noise(c) for c in gained)
    n = gained[0].metrics.accuracy.samples
    line = f"Retraining, not compression: {each} points against your model, beyond the noise (±{widest * 100:.1f} at most, on {n:,} test samples)"
    control = next((x for x in study.candidates if x.control and x.ok and x.metrics.accuracy_delta is not None), None)
    if control is None:
        return line + ": fine-tuning on your data bought them, not compression."
    return (
        f"{line}; your float model fine-tuned the same way ({control.name}) gains "
        f"{control.metrics.accuracy_delta * 100:+.1f} by itself: the gains are training's."
    )


def legend(cands: list[Candidate]) -> str:
    """The line under a table that says which candidates are retrained, how far each moved from your model
    (its agreement with float32), and what the control is."""
    retrained = [c for c in cands if c.ok and c.retrained]
    if not retrained:
        return ""
    parts = []
    for c in retrained:
        least = agreement(c)
        parts.append(f"{c.name} {least.agreement * 100:.1f}%" if least is not None else c.name)
    control = next((c for c in retrained if c.control), None)
    what = (
        f" {control.name} is the control: your float model fine-tuned the same way, nothing compressed (never a pick)."
        if control is not None
        else ""
    )
    return (
        f"{MARK} retrained: fine-tuned on your data (prune, cluster, QAT), so acc and Δ are a retrained model's, not "
        f"yours compressed; agreement with float32: {', '.join(parts)}.{what}"
    )

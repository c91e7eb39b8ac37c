"""The measured choice: from a study, the candidates a target can run that meet every goal, ranked.

`recommend(study, target, goals)` keeps candidates that ran, that the target runs fully (the delegate's
report says 'full'; Edge TPU and MCU are judged from scheme and I/O; on the CPU, XNNPACK coverage is
informative only since the CPU runs every op) and that meet every goal; ranks them by the objective,
then the other two axes, then study order; draws the Pareto front over size, latency and accuracy; and
says, for every rejected candidate, the first check it failed. Pure: no TensorFlow, no numpy.

Conventions: accuracy drop is `-metrics.accuracy_delta` (a fraction; 0.01 is one point). Without labels,
quality is fidelity to float32 (optimize.decide.guard). With no accuracy goal given, the default guard
(optimize.decide.guard) keeps out candidates that lose more than 2 points (5% output error without labels), and
says so. Latency is the host-CPU `p50_ms`; two latencies differ only when their intervals separate
(optimize.measure.noise), so re-timing an unchanged study gives the same pick and front. The size objective ranks
by the raw `.tflite` size: what a delegate loads and flash holds (pruning and clustering shrink only the
gzip size: a fact says so).
"""

from __future__ import annotations

import functools
import math
from pathlib import Path

from pydantic import Field

from optimize.core.errors import GoalsNotMet, OptimizeError
from optimize.core.results import Candidate, Goals, Record, Study, labelled
from optimize.core.vocab import IO, TARGET_DELEGATE, Objective, Scheme, Target
from optimize.decide import explain, kinds, retrained
from optimize.decide.advice import EPS, PASSED_OVER, PRUNE_FACT, Advice, advise, check_target, recipe_toml
from optimize.decide.guard import WORST, Guard, axes, default_guard, has_quality_goal, quality, remedy
from optimize.decide.on_target import as_computed_on, timed_on
from optimize.decide.speed import SLOWER, cached_fact, cost_line, slowdown_problem
from optimize.delegates import blocking
from optimize.measure.noise import speed, versus


class Rejection(Record):
    """A measured candidate that was not eligible, with the first check it failed."""

    candidate: str
    reason: str


class Recommendation(Record):
    """The choice over a study. `chosen` is None when nothing meets the goals (the CLI exits 1)."""

    target: Target
    goals: Goals
    advice: Advice
    chosen: str | None
    chosen_recipe_toml: str | None = None
    ranked: list[str]
    pareto: list[str] = Field(description="The Pareto front (size, latency, accuracy) of what runs on the target.")
    rejected: list[Rejection]
    facts: list[str]
    headline: str = Field("", description="The answer in one line: the choice, or why there is none.")
    keep_float32: str | None = Field(
        None, description="The float32 file to keep, when nothing made from it beats it (no recipe to run)."
    )
    guard: str | None = Field(None, description="The default guard in force (no accuracy goal given), in words.")
    warnings: list[str] = Field(default_factory=list, description="What the default guard kept out, in words.")
    to_try: list[str] = Field(default_factory=list, description="When nothing passes the guard: what to try.")
    why: list[str] = Field(
        default_factory=list, description="Why the measured choice is or is not the rule of thumb's."
    )
    alternatives: list[str] = Field(default_factory=list, description="The rule of thumb's alternatives, measured.")
    quality_by: str = Field("labels", description="What accuracy is ranked by: 'labels', or 'fidelity' to float32.")
    make: str | None = Field(
        None,
        description="When nothing measured fits: the rule of thumb's pipeline (or alternative) this study has not "
        "measured, with the command that makes it; None when every one it knows was measured and rejected.",
    )
    made_and_rejected: list[str] = Field(
        default_factory=list, description="The rule of thumb's pipelines measured here and rejected, with why."
    )
    path_update: str = Field(
        "", description="When the measured pick is another scheme than the decision path's: the path, updated."
    )
    measured_on: str = Field("", description="The test samples every quality figure stands on, in words.")
    retrained: str = Field(
        "", description="The default in force for retrained (fine-tuned) candidates, in words; empty when none is."
    )


def make_goals(
    max_accuracy_drop: float | None = None,
    max_size_bytes: int | None = None,
    max_latency_ms: float | None = None,
    objective: str = Objective.SIZE,
    max_output_error: float | None = None,
    max_error_increase: float | None = None,
    min_agreement: float | None = None,
    min_detections_kept: float | None = None,
    min_mask_iou: float | None = None,
    max_slowdown: float | None = None,
    min_sample_kept: float | None = None,
) -> Goals:
    """Goals from CLI options; an impossible goal or an unknown objective is one clear line."""
    from pydantic import ValidationError

    from optimize.core.errors import from_validation

    try:
        return Goals(
            max_accuracy_drop=max_accuracy_drop,
            max_size_bytes=max_size_bytes,
            max_latency_ms=max_latency_ms,
            objective=objective,
            max_output_error=max_output_error,
            max_error_increase=max_error_increase,
            min_agreement=min_agreement,
            min_detections_kept=min_detections_kept,
            min_mask_iou=min_mask_iou,
            max_slowdown=max_slowdown,
            min_sample_kept=min_sample_kept,
        )
    except ValidationError as e:
        raise from_validation(
            e,
            Goals,
            where="Goal ",
            fix="Accuracy drop, output error and agreement are fractions 0..1 (0.01 = one point), error increase "
            "a fraction of float32's error (0.05 = 5% more), sizes and latencies are positive, a slowdown is at "
            "least 1 (times float32's p50), objective is size, latency or accuracy.",
        ) from None


def _baseline_of(candidates: list[Candidate], baseline: str | None) -> str | None:
    """The float32 reference's name: given, else the sweep's own ('float32') when present."""
    if baseline is not None:
        return baseline
    return "float32" if any(c.name == "float32" for c in candidates) else None


def pareto_front(candidates: list[Candidate], baseline: str | None = None) -> list[str]:
    """Names of ok candidates that no other ok candidate beats on size, latency and accuracy at once.

    Latencies whose intervals overlap count as equal (optimize.measure.noise), so timing noise does not move the
    front; accuracy is fidelity to float32 (`baseline`) when no candidate has labels. Candidates with
    identical measurements do not dominate each other: both stay on the front.
    """
    ok = [c for c in candidates if c.ok]
    by_labels, base = labelled(ok), _baseline_of(candidates, baseline)

    def dominates(a: Candidate, b: Candidate) -> bool:
        told = axes(a, b, by_labels, base).values()
        return all(x <= 0 for x in told) and any(x < 0 for x in told)

    return [c.name for c in ok if not any(dominates(o, c) for o in ok if o.name != c.name)]


def _check_study(study: Study) -> None:
    from optimize.core.errors import StudyError

    seen: set[str] = set()
    for c in study.candidates:
        if c.name in seen:
            raise StudyError(
                f"The study has two candidates named {c.name!r}.", "Re-run `optimize sweep`; do not hand-edit names."
            )
        seen.add(c.name)
        m = c.metrics
        if m and (m.size.bytes < 0 or m.size.gzip_bytes < 0 or (m.latency and m.latency.p50_ms < 0)):
            raise StudyError(
                f"Candidate {c.name!r} has a negative size or latency.", "Re-run `optimize sweep`; the file was edited."
            )


def _integer_problem(c: Candidate, target: Target) -> str | None:
    """Edge TPU and microcontrollers have no delegate report: full int8 with integer I/O, or not."""
    allowed = (IO.INT8, IO.UINT8) if target is Target.EDGETPU else (IO.INT8,)
    if c.scheme != Scheme.INT8 or c.io not in allowed:
        need = "int8/uint8" if target is Target.EDGETPU else "int8"
        return f"{target} needs full int8 with {need} I/O; this is {c.scheme} with {c.io} I/O"
    return None


#: Targets that run integer ops only; NNAPI joins them for a quantized model (its int path).
INTEGER_ONLY_TARGETS = (Target.MCU, Target.EDGETPU, Target.HEXAGON)


def _float_compute_problem(c: Candidate, target: Target) -> str | None:
    """An integer-only target never gets a candidate that still computes in float (verify.float_compute), but
    for the CPU tail its delegate leaves (a detector's post-processing: `DelegateReport.cpu_tail`)."""
    ops = c.composition.float_compute_ops if c.composition else []
    report = c.delegates.get(TARGET_DELEGATE.get(target, ""))
    tail = set(report.cpu_tail) if report is not None else set()
    ops = [op for op in ops if op not in tail]
    nnapi_int = target is Target.NNAPI and c.scheme in (Scheme.INT8, Scheme.INT16X8)
    if ops and (target in INTEGER_ONLY_TARGETS or nnapi_int):
        where = (
            "nnapi runs a quantized model on its integer path (NPU/DSP drivers), where float ops fall to the CPU"
            if nnapi_int
            else f"{target} runs integer ops only"
        )
        return f"still computes {', '.join(ops[:3])} in float; {where}"
    return None


def fitted_elsewhere(c: Candidate, target: Target) -> str | None:
    """Why a candidate made from a graph fitted to other targets (issue 45) is not one for `target`: the fit's
    candidates are made for the targets it bought, and the unfitted ones serve the rest (a fit option that
    changes the model's inputs must not reach a target that did not need it)."""
    if c.fit is None or not c.fit.bought or TARGET_DELEGATE.get(target) in c.fit.bought:
        return None
    return f"made from the graph fitted to {', '.join(c.fit.bought)}: the unfitted candidates serve {target}"


def _target_problem(c: Candidate, target: Target, facts: set[str]) -> str | None:
    """Why the target cannot run this candidate fully, or None."""
    why = fitted_elsewhere(c, target) or _float_compute_problem(c, target)
    if why:
        return why
    if target in (Target.EDGETPU, Target.MCU):
        return _integer_problem(c, target)
    delegate = TARGET_DELEGATE[target]
    report = c.delegates.get(delegate)
    if report is None:
        facts.add(
            f"No {delegate} report for some candidates (older run?): their {target} compatibility was not checked."
        )
        return None
    where = f"{report.nodes_delegated}/{report.nodes_total} nodes, {report.partitions} partition(s), {report.source}"
    if target is Target.CPU:
        if report.verdict != "full":
            facts.add(f"{c.name}: XNNPACK takes {where}; the rest runs on the CPU's reference kernels (slower).")
        return None  # the CPU runs every op; XNNPACK coverage shows up in the measured latency
    if report.verdict == "full":
        return None
    if report.runs_with_tail:  # the body on the delegate, the post-processing on the CPU: as detectors ship
        facts.add(tail_fact(target, report))
        return None
    how = "runs it only partly" if report.verdict == "partial" else "does not run it"
    return f"{delegate} delegate {how} ({where}): {blocking.words(report)}"


def tail_fact(target: Target, report) -> str:
    """The one line that names the CPU tail a target runs a pick with."""
    tail = ", ".join(dict.fromkeys(report.cpu_tail))
    return (
        f"{target}: the {report.delegate} delegate runs every node but the post-processing tail ({tail}), which "
        "runs on the CPU after it, as shipped detectors run."
    )


def _without_labels(study: Study, goals: Goals) -> tuple[Goals, list[str]]:
    """With no labelled accuracy in the study, judge an accuracy goal on agreement with float32 instead:
    accuracy can only differ on samples whose top-1 differs, so agreement >= 1 - drop bounds the drop."""
    labelled = any(c.ok and c.metrics.accuracy is not None for c in study.candidates)
    if labelled or goals.max_accuracy_drop is None:
        return goals, []
    agreement = any(
        c.ok and c.metrics.fidelity and c.metrics.fidelity.least_agreeing() is not None for c in study.candidates
    )
    if not agreement:
        fact = (
            "No labels, and the outputs are not classes: max_accuracy_drop cannot be judged. "
            "Use max_output_error (relative output error vs float32) instead."
        )
        return goals, [fact]
    bound = 1 - goals.max_accuracy_drop
    update = {"max_accuracy_drop": None, "min_agreement": max(goals.min_agreement or 0, bound)}
    fact = (
        f"No labels: max_accuracy_drop {goals.max_accuracy_drop * 100:g} point(s) is judged as agreement (top-1, "
        f"or decisions at 0.5) >= {bound * 100:g}% with float32 (accuracy can only change where they change)."
    )
    return goals.model_copy(update=update), [fact]


def _untimed(study: Study, target: Target, goals: Goals) -> tuple[Goals, list[str]]:
    """A target whose latency was not measured (every target but the cpu, unless observed) cannot be ranked by
    it: `--objective latency` falls back to size, then quality, and says so; `--max-latency-ms` cannot be
    judged (each candidate says so)."""
    if target is Target.CPU or any(c.ok and c.p50_ms is not None for c in study.candidates):
        return goals, []
    facts = []
    if goals.objective is Objective.LATENCY:
        goals = goals.model_copy(update={"objective": Objective.SIZE})
        facts.append(f"--objective latency: the {target}'s latency was not measured, so size (then quality) ranks.")
    if goals.max_latency_ms is not None:
        facts.append(f"--max-latency-ms: the {target}'s latency was not measured, so it cannot be judged here.")
    return goals, facts


def _accuracy_problem(m, goals: Goals, is_base: bool = False) -> str | None:
    if is_base:
        return None  # the float32 reference is what the others are compared with
    if goals.max_accuracy_drop is not None:
        if m.accuracy_delta is None:
            if m.error_ratio is not None:
                return (
                    "max_accuracy_drop is for classes; this model's labels are values: use max_error_increase "
                    "(--max-error-increase)"
                )
            return "accuracy not measured (no labelled data), so max_accuracy_drop cannot be checked"
        if -m.accuracy_delta > goals.max_accuracy_drop + EPS:
            return f"accuracy drop {-m.accuracy_delta * 100:.3g} points > {goals.max_accuracy_drop * 100:g}"
    if goals.max_error_increase is not None:
        if m.error_ratio is None:
            return "error not measured against regression labels, so max_error_increase cannot be checked"
        if m.error_ratio - 1 > goals.max_error_increase + EPS:
            return (
                f"MAE x{m.error_ratio:.3f} of float32's ({(m.error_ratio - 1) * 100:+.1f}%) > "
                f"x{1 + goals.max_error_increase:.3f}"
            )
    return None


def _fidelity_problem(m, goals: Goals, is_base: bool, unlabelled_only: bool = False) -> str | None:
    """The first output the fidelity goals find too far from float32, by name when there are several
    (`unlabelled_only`: the outputs the labels do not score, as the default guard judges them); each goal
    reads its figure (optimize.decide.kinds.CHECKS)."""
    if is_base:
        return None  # the float32 reference agrees with itself
    f = m.fidelity
    if f is not None and unlabelled_only and not f.judged(True):
        return None  # every output is scored by labels
    named = f is not None and (len(f.outputs) > 1 or unlabelled_only)
    outputs = kinds.judged(f, unlabelled_only) if f is not None else []
    for check in kinds.CHECKS:
        goal = getattr(goals, check.bound.goal)
        if goal is None:
            continue
        worst = check.worst(outputs)
        if worst is None:
            if _not_applicable(check, outputs, f is not None and unlabelled_only):
                continue
            return _unmeasured(check)
        if check.broken(check.read(worst), goal):
            return _broken(check, worst, goal, named)
    return None


def _not_applicable(check: kinds.Check, outputs: list, others_only: bool) -> bool:
    """Whether a goal no output has a figure for does not apply to them: agreement where none of the outputs
    the labels leave decides, the output error where every output is judged by a figure of its own (a
    detector's detections, a mask's IoU)."""
    if check.bound.lower and others_only:
        return True
    own = bool(outputs) and all(kinds.of_output(o) in kinds.OWN_FIGURE for o in outputs)
    return own and check.bound is kinds.OUTPUT_ERROR


def _unmeasured(check: kinds.Check) -> str:
    if check.bound.goal == "max_output_error":
        return "not compared with float32, so max_output_error cannot be checked"
    if check.bound is kinds.DETECTIONS_KEPT:
        return "no detector head whose detections were counted, so min_detections_kept cannot be checked"
    if check.bound is kinds.MASK_IOU:
        return "no mask output whose IoU was measured, so min_mask_iou cannot be checked"
    if check.bound is kinds.SAMPLE_KEPT:
        return "no detections or mask IoU measured per sample, so min_sample_kept cannot be checked"
    return "agreement not measured (no output decides: classes or yes/no), so min_agreement cannot be checked"


def _broken(check: kinds.Check, o, goal: float, named: bool) -> str:
    """`output box off by 26% of its range > 5%`, `output click decision agreement at 0.5 97.20% < 98%`."""
    if check.bound.goal == "max_output_error":
        if named:
            return f"output {o.name} off by {o.relative_error * 100:.3g}% of its range > {goal * 100:g}%"
        return f"output error {o.relative_error:.3g} of the output range > {goal:g}"
    which = f"output {o.name} " if named else ""
    if check.bound is kinds.DETECTIONS_KEPT:
        d = o.detection
        return f"keeps {d.kept} of float32's {d.reference_detections} detections ({check.read(o) * 100:.1f}% < {goal * 100:g}%)"
    if check.bound is kinds.MASK_IOU:
        return f"{which}mask IoU {check.read(o) * 100:.1f}% with float32's < {goal * 100:g}%"
    if check.bound is kinds.SAMPLE_KEPT:
        what = "detections kept" if o.detection is not None else "mask IoU"
        return f"{which}{what} on the worst samples {check.read(o) * 100:.1f}% < {goal * 100:g}%"
    return f"{which}{kinds.agreement_name(o)} {check.read(o) * 100:.2f}% < {goal * 100:g}%"


def _goal_problem(c: Candidate, goals: Goals, is_base: bool = False, unlabelled_only: bool = False) -> str | None:
    """The first accuracy, fidelity or size goal this measured candidate breaks."""
    m = c.metrics
    problem = _accuracy_problem(m, goals, is_base) or _fidelity_problem(m, goals, is_base, unlabelled_only)
    if problem:
        return problem
    if goals.max_size_bytes is not None and m.size.bytes > goals.max_size_bytes:
        return f"size {m.size.bytes:,} bytes > {goals.max_size_bytes:,}"
    return None


def _latency_problem(c: Candidate, goals: Goals, base: Candidate | None) -> str | None:
    lat = c.p50_ms
    if goals.max_latency_ms is not None:
        if lat is None:
            return "latency not measured, so max_latency_ms cannot be checked"
        if lat > goals.max_latency_ms + EPS:
            return f"p50 latency {lat:.3g} ms > {goals.max_latency_ms:g} ms"
    if goals.objective is Objective.LATENCY:
        if lat is None:
            return "latency not measured, and the objective is latency"
        if c.scheme != Scheme.FLOAT32 and base is not None and speed(c, base) == "slower":
            return f"{c.scheme} measured slower than float32 ({versus(c, base)})"
    return None


def _first_problem(
    c: Candidate,
    target: Target,
    goals: Goals,
    base: Candidate | None,
    facts: set[str],
    baseline: str | None = None,
    unlabelled_only: bool = False,
    retrain: Goals | None = None,
) -> str | None:
    """The first check this candidate fails, in a fixed order: failed, the training control (never shipped),
    target, accuracy, a retrained candidate's agreement with float32 (`retrain`: the user's goals, when the
    recommender applies that default: `retrained.problem`), size, latency, slower than float32 on the cpu target
    (`speed.slowdown_problem`)."""
    if c.error is not None:
        return f"failed: {c.error}"
    if c.metrics is None:
        return "not measured"
    if retrain is not None and c.control:
        return CONTROL_REASON
    is_base = c.name == baseline or (base is not None and c.name == base.name)
    goal = _goal_problem(c, goals, is_base, unlabelled_only)
    goal = goal or (retrained.problem(c, retrain) if retrain is not None else None)
    slow = slowdown_problem(c, target, goals, base)
    return _target_problem(c, target, facts) or goal or _latency_problem(c, goals, base) or slow


#: Why the training control is never a pick.
CONTROL_REASON = (
    "the training control: your float model fine-tuned as the retrained candidates were, nothing compressed, "
    "measured to tell training's gain from compression's (not a file to ship)"
)


def judge(c: Candidate, target: str | None, goals: Goals) -> str | None:
    """The first requirement one candidate breaks for a target and goals, or None when it meets them all."""
    return _first_problem(c, check_target(target or Target.CPU), goals, None, set())


def judge_recipe(c: Candidate, recipe) -> list[tuple[str, str | None]]:
    """A recipe's result judged against each of its own targets (cpu when it names none) and its goals."""
    return [(str(t), judge(c, t, recipe.goals)) for t in (recipe.targets or (Target.CPU,))]


#: The objective's axis, then the others: quality breaks a tie first (issue 43: three candidates tied at 72,744
#: bytes and the gpu got the least accurate), then the other axis.
ORDER = {
    Objective.SIZE: (Objective.SIZE, Objective.ACCURACY, Objective.LATENCY),
    Objective.LATENCY: (Objective.LATENCY, Objective.ACCURACY, Objective.SIZE),
    Objective.ACCURACY: (Objective.ACCURACY, Objective.SIZE, Objective.LATENCY),
}


def _ranked(cands: list[Candidate], objective: Objective, by_labels: bool, baseline: str | None) -> list[Candidate]:
    """Objective first, then the other two axes, then study order. On the objective's axis candidates
    are taken in groups: the best left (by its measured figure) with every one the same as it within
    the noise, ordered by the other axes. Grouping around the best, not comparing neighbours, keeps a
    slow candidate from riding on a chain of "the same within the noise": the order does not flip."""
    index = {c.name: i for i, c in enumerate(cands)}

    def cmp(a: Candidate, b: Candidate) -> int:
        told = axes(a, b, by_labels, baseline)
        for axis in ORDER[objective][1:]:
            if told[axis]:
                return told[axis]
        return index[a.name] - index[b.name]

    def figure(c: Candidate) -> tuple:
        size, lat = c.metrics.size.bytes, c.p50_ms if c.p50_ms is not None else math.inf
        best = quality(c, by_labels, baseline) or WORST
        return {Objective.SIZE: (size,), Objective.LATENCY: (lat,), Objective.ACCURACY: (-best[0], -best[1])}[objective]

    out, left = [], list(cands)
    while left:
        leader = min(left, key=lambda c: (figure(c), index[c.name]))
        group = [c for c in left if axes(c, leader, by_labels, baseline)[objective] == 0]
        out += sorted(group, key=functools.cmp_to_key(cmp))
        left = [c for c in left if c not in group]
    return out


def _slower_facts(study: Study, float_ms: float | None) -> list[str]:
    out = []
    base = study.float_reference
    for c in study.candidates:
        if c.ok and c.scheme != Scheme.FLOAT32 and base is not None and speed(c, base) == "slower":
            label = c.name if c.name == c.scheme else f"{c.name} ({c.scheme})"
            out.append(f"{label} measured slower than float32 here: {versus(c, base)}.")
    return out


def _change(c: Candidate) -> str | None:
    m = c.metrics
    if m.accuracy_delta is not None:
        return f"{abs(m.accuracy_delta) * 100:.1f} pt {'lost' if m.accuracy_delta < 0 else 'gained'}"
    if m.error_ratio is not None:
        return f"error x{m.error_ratio:.2f}"
    return None


def _plain_int8(study: Study) -> Candidate | None:
    """The study's plain post-training int8 candidate (float I/O, no other technique), if any."""
    for c in study.candidates:
        plain = not c.uses("prune", "cluster", "qat", "selective") and not c.search
        if c.ok and plain and c.scheme == Scheme.INT8 and c.io == "float":
            return c
    return None


def _rescue_fact(c: Candidate, int8: Candidate | None, base: Candidate) -> str:
    kept = [s for s in c.search if s.kept and s.precision != "int8"]
    ways = " or ".join(sorted({str(s.precision) for s in kept}))
    before = f"int8 {_change(int8)}; " if int8 is not None and _change(int8) else ""
    moved = f"keeping {len(kept)} op(s) in {ways}" if kept else "no op needed moving"
    ratio = c.metrics.size.bytes / base.metrics.size.bytes
    fid = c.metrics.fidelity
    after = _change(c) or (
        f"{fid.relative_error * 100:.2f}% off float32" if fid and fid.relative_error is not None else None
    )
    return (
        f"{c.name}: {before}{moved}"
        + (f" brings it to {after}" if after else "")
        + f", at {ratio:.2f}x float32's size."
    )


def _rescue_facts(study: Study) -> list[str]:
    """What a selective search bought: `int8 lost 3.1 pts; keeping 2 ops in float recovers to 0.4 pt at 0.29x`."""
    base = next((c for c in study.candidates if c.name == study.baseline and c.ok), None)
    if base is None:
        return []
    int8 = _plain_int8(study)
    return [_rescue_fact(c, int8, base) for c in study.candidates if c.ok and c.uses("selective")]


def _study_facts(study: Study, target: Target, goals: Goals, float_ms: float | None) -> list[str]:
    facts = _rescue_facts(study)
    if not study.candidates:
        facts.append("The study has no candidates: run `optimize sweep` to measure some.")
    elif not any(c.name == study.baseline for c in study.candidates):
        facts.append(f"The study has no baseline candidate {study.baseline!r}: accuracy deltas cannot be trusted.")
    facts += _slower_facts(study, float_ms)
    pruned = [c for c in study.candidates if c.ok and c.uses("prune", "cluster")]
    if pruned:
        sizes = "; ".join(
            f"{c.name}: {c.metrics.size.bytes:,} bytes raw, {c.metrics.size.gzip_bytes:,} gzip" for c in pruned
        )
        facts.append(f"{PRUNE_FACT[:-1]} ({sizes}).")
    return facts


def _sort(
    study: Study,
    target: Target,
    goals: Goals,
    base: Candidate | None,
    by_labels: bool,
    unlabelled_only: bool = False,
    retrain: Goals | None = None,
):
    """(eligible candidates ranked, rejections with their first failed check, facts found on the way)."""
    facts: set[str] = set()
    eligible: list[Candidate] = []
    rejected: list[Rejection] = []
    for c in study.candidates:
        problem = _first_problem(c, target, goals, base, facts, study.baseline, unlabelled_only, retrain)
        if problem:
            rejected.append(Rejection(candidate=c.name, reason=problem))
        else:
            eligible.append(c)
    return _ranked(eligible, goals.objective, by_labels, study.baseline), rejected, facts


def _goals_given(goals: Goals) -> bool:
    return has_quality_goal(goals) or goals.max_size_bytes is not None or goals.max_latency_ms is not None


class _Choice:
    """One pass of the recommender over a study: the ranking under the goals (and the default guard when no
    accuracy goal was given), and everything said about it."""

    def __init__(self, study: Study, target: Target, goals: Goals):
        self.study, self.target, self.goals = study, target, goals
        self.path_rule: str | None = None
        self.by_labels = labelled(study.candidates)
        self.base = study.float_reference
        self.guard: Guard | None = default_guard(goals, study)
        judged = self.guard.goals if self.guard else goals
        scope = self.guard.unlabelled_only if self.guard else False
        sort = _sort(study, target, judged, self.base, self.by_labels, scope, retrain=goals)
        self.ranked, self.rejected, self.facts = sort
        self.kept_out: list[Candidate] = []
        self.pull_apart: str | None = None
        self._honour_path()
        self._speed_over_size()
        if self.guard is not None:
            self._guarded()
        loose = _sort(study, target, judged, self.base, self.by_labels, scope)[0]
        self.retrained_out = self._above_choice(loose, lambda c: retrained.problem(c, goals) is not None)

    def _above_choice(self, ranked: list[Candidate], test) -> list[Candidate]:
        """The candidates of another ranking that `test` picks out, ranked above the choice (all of them with
        no choice)."""
        first = self.ranked[0].name if self.ranked else None
        out = []
        for c in ranked:
            if c.name == first:
                break
            if test(c) and not c.control:
                out.append(c)
        return out

    def _honour_path(self) -> None:
        """Where the decision path rules out a scheme the delegate still takes (NNAPI: dynamic range runs as
        float), candidates of that scheme rank after every other eligible one, and one line says which one the
        pick passed over, and why."""
        rule = PASSED_OVER.get(self.target)
        if rule is None or not self.ranked or self.ranked[0].scheme not in rule[0]:
            return
        out = [c for c in self.ranked if c.scheme in rule[0]]
        kept = [c for c in self.ranked if c.scheme not in rule[0]]
        if not kept:
            return
        top, pick = self.ranked[0], kept[0]
        why = explain.beats(top, pick, self.goals.objective, self.by_labels, self.study.baseline)
        self.path_rule = (
            f"{top.name} ranks above {pick.name} on the measurements: {why}; but {rule[1].format(scheme=top.scheme)}: "
            f"{pick.name}, as the decision path says."
        )
        self.ranked = kept + out

    def _speed_over_size(self) -> None:
        """The cpu target: one line when size cost speed (a smaller candidate kept out for being slower than
        float32, or the pick slower within --max-slowdown; `speed.cost_line`)."""
        if self.target is not Target.CPU:
            return
        slow = [self.study.candidate(r.candidate) for r in self.rejected if r.reason.startswith(SLOWER)]
        self.pull_apart = cost_line(self.chosen, slow, self.base, self.goals) or None

    def _guarded(self) -> None:
        """Say which rejections are the guard's, and which of those would have ranked above the choice."""
        from optimize.decide.guard import kept_out_words

        plain, _, _ = _sort(self.study, self.target, self.goals, self.base, self.by_labels, retrain=self.goals)
        ranked = {c.name for c in self.ranked}
        out = {c.name for c in plain if c.name not in ranked}
        self.rejected = [
            Rejection(
                candidate=r.candidate, reason=kept_out_words(self.guard, self.study.candidate(r.candidate), r.reason)
            )
            if r.candidate in out
            else r
            for r in self.rejected
        ]
        self.kept_out = self._above_choice(plain, lambda c: c.name in out)

    @property
    def chosen(self) -> Candidate | None:
        return self.ranked[0] if self.ranked else None

    def keep_float32(self, folder: str | Path | None) -> str | None:
        """The float32 file's path when the choice is float32 made by conversion alone (or the input itself)."""
        c = self.chosen
        if c is None or c.scheme != Scheme.FLOAT32 or any(s.technique != "convert" for s in c.steps):
            return None
        where = c.artifact or f"{c.name}.tflite"
        return str(Path(folder) / where) if folder is not None else where

    def warnings(self) -> list[str]:
        said = [f"{c.name} not picked: it is {retrained.problem(c, self.goals)}." for c in self.retrained_out[:3]]
        if self.guard is None:
            return said
        if self.chosen is None and self.kept_out:
            return [explain.nothing_passes(self.kept_out[0], self.target, self.guard), *said]
        return explain.guard_warnings(self.guard, self.kept_out, self.hint) + said

    def to_try(self, reasons: dict[str, str]) -> list[str]:
        if self.guard is None or self.chosen is not None or not self.kept_out:
            return []
        return explain.what_to_try(self.kept_out[0], self.target, self.guard, self.study, reasons, self.hint)

    def hint(self, c: Candidate) -> str:
        """The options that accept a candidate the guard kept out (`--max-error-increase 0.08`), checked: with
        them stated, the goals and whatever guard is left judge it again and find nothing wrong with its
        quality; "a goal of your own" when no such options exist."""
        parts = remedy(self.guard, c)
        stated = self.goals.model_copy(update={b.goal: v for b, v in parts})
        guard = default_guard(stated, self.study)
        judged, scope = (guard.goals, guard.unlabelled_only) if guard else (stated, False)
        is_base = c.name == self.study.baseline
        if parts and _accuracy_problem(c.metrics, judged, is_base) is None:
            if _fidelity_problem(c.metrics, judged, is_base, scope) is None:
                return " ".join(f"{b.option} {v:g}" for b, v in parts)
        return "a goal of your own"

    def headline(self, keep: str | None) -> str:
        c = self.chosen
        if c is not None and keep is not None:
            return f"Chosen from measurements: {c.name}: keep the float32 file ({keep}); no conversion beats it here."
        if c is not None and c.output_contract is not None:  # the file's outputs read differently: said up front
            return f"Chosen from measurements: {c.name} (NOTE: {c.output_contract.words})"
        if c is not None:
            return f"Chosen from measurements: {c.name}" + (
                " (retrained: fine-tuned on your data)" if c.retrained else ""
            )
        if not self.study.candidates:
            return "No measured candidate to choose from: the study is empty."
        if self.kept_out and not _goals_given(self.goals):
            return f"No measured candidate for {self.target} passes the default guard."
        if _goals_given(self.goals):
            return "No measured candidate meets the goals."
        return f"No measured candidate runs on {self.target}: see why each was rejected."


def _facts(study: Study, target: Target, goals: Goals, advice: Advice, choice: _Choice, extra: list[str]) -> list[str]:
    study_facts = _study_facts(study, target, goals, study.float_ms)
    measured_prune = any(x.startswith(PRUNE_FACT[:-1] + " (") for x in study_facts)
    generic = [
        f
        for f in advice.facts
        if not (f == PRUNE_FACT and measured_prune) and not (study.candidates and "run `optimize sweep`" in f)
    ]
    if choice.chosen is None and target in TARGET_DELEGATE and target is not Target.CPU:
        extra = [*extra, *_delegate_fixes(study, TARGET_DELEGATE[target])]
    extra = [*extra, *_fitted_fact(choice.chosen)]
    if goals.objective is Objective.ACCURACY and not choice.by_labels:
        extra = [*extra, "No labels: accuracy is ranked by fidelity to float32 (top-1 agreement for class outputs, "
                 "else the worst output's relative error; under 0.1% of the range counts as none)."]  # fmt: skip
    said = [x for x in (retrained.summary(study), cached_fact(study.candidates) if target is Target.CPU else "") if x]
    return explain.facts_once(generic + sorted(choice.facts | set(extra)) + study_facts + said, study)


def _fitted_fact(c: Candidate | None) -> list[str]:
    """What the chosen candidate's fitted graph is, when it was made from one (issue 45)."""
    if c is None or c.fit is None or not c.fit.kept:
        return []
    steps = ", ".join(f"{s.rewrite} at {s.node}" for s in c.fit.kept)
    worst = max((s.max_abs_diff or 0.0 for s in c.fit.kept), default=0.0)
    moved = "bit for bit" if worst == 0 else f"max |diff| {worst:.1e}"
    return [
        f"{c.name} is made from the float graph rewritten for {', '.join(c.fit.bought) or 'its targets'} "
        f"({steps}); the rewrites keep the outputs ({moved} on {c.fit.samples} samples)."
    ]


def _delegate_fixes(study: Study, delegate: str) -> list[str]:
    """The delegate's own hints on the float32 model (what blocks it and what to change), when no candidate
    runs on it: the fix, not only the verdict."""
    base = next((c for c in study.candidates if c.name == study.baseline), None) or study.float_reference
    report = base.delegates.get(delegate) if base is not None else None
    return list(report.hints) if report is not None and report.verdict != "full" else []


def _advice(study: Study, target: Target, goals: Goals, have_cal: bool | None, have_train: bool | None) -> Advice:
    """The decision tree's answer, with what the study says about the data where the caller did not."""
    if have_cal is None:
        have_cal = study.data is not None
    if have_train is None:
        have_train = any(c.uses("prune", "cluster", "qat") for c in study.candidates)
    return advise(
        target,
        have_calibration_data=have_cal,
        have_training_data=have_train,
        goals=goals,
        dense_weights=any(c.scheme == Scheme.INT4 for c in study.candidates),  # the sweep tried int4: Dense-heavy
    )


def _on_target(study: Study, target: Target) -> tuple[Study, list[str]]:
    """The study as the target sees it: its arithmetic (the gpu's quality), its own latency (never the host
    CPU's for another target), and the facts that say so."""
    study, computed = as_computed_on(study, target)
    study, timed = timed_on(study, target)
    return study, [*computed, *timed]


def recommend(
    study: Study,
    target: str = Target.CPU,
    goals: Goals | None = None,
    *,
    have_calibration_data: bool | None = None,
    have_training_data: bool | None = None,
    folder: str | Path | None = None,
) -> Recommendation:
    """Choose from what was measured. `chosen` is None when nothing meets the goals.

    Data availability for the decision tree is inferred from the study unless given: calibration data
    when the study names data, training data when it holds a prune/cluster/QAT candidate. `folder`: where
    the study lives, so a float32 file to keep is named by its path.
    """
    target = check_target(target)
    goals = goals or Goals()
    _check_study(study)
    study, target_facts = _on_target(study, target)
    advice = _advice(study, target, goals, have_calibration_data, have_training_data)
    goals, label_facts = _without_labels(study, goals)
    goals, untimed = _untimed(study, target, goals)
    label_facts = [*label_facts, *target_facts, *untimed]
    choice = _Choice(study, target, goals)
    chosen = choice.chosen
    keep = choice.keep_float32(folder)
    reasons = {r.candidate: r.reason for r in choice.rejected}
    why = _why(study, advice, choice, reasons, goals)
    make, tried = (None, []) if chosen else explain.what_to_make(study, advice, reasons)
    return Recommendation(
        target=target,
        goals=goals,
        advice=advice,
        chosen=chosen.name if chosen else None,
        chosen_recipe_toml=recipe_toml(chosen.name, [s.flat() for s in chosen.steps], target, goals)
        if chosen and chosen.steps
        else None,
        ranked=[c.name for c in choice.ranked],
        pareto=pareto_front(choice.ranked, study.baseline),
        rejected=choice.rejected,
        facts=_facts(study, target, goals, advice, choice, label_facts),
        headline=choice.headline(keep),
        keep_float32=keep,
        guard=choice.guard.words if choice.guard else None,
        warnings=choice.warnings(),
        to_try=choice.to_try(reasons),
        why=why,
        alternatives=explain.alternatives(
            study, [(a.label, a.steps) for a in advice.alternative_pipelines], chosen, reasons
        ),
        quality_by="labels" if choice.by_labels else "fidelity",
        make=make,
        made_and_rejected=tried,
        path_update=explain.path_update(study, advice.pipeline, chosen, reasons, target),
        measured_on=explain.measured_on(study.candidates),
        retrained=retrained.rule_words(study, goals),
    )


def _why(study: Study, advice: Advice, choice: _Choice, reasons: dict[str, str], goals: Goals) -> list[str]:
    """The Why lines: against the rule of thumb, a retrained pick's agreement and gain, what size cost in speed
    (cpu), the decision path honoured."""
    chosen = choice.chosen
    why = explain.why_lines(study, advice.pipeline, chosen, reasons, goals.objective, choice.by_labels)
    why += [_retrained_why(chosen, study)] if chosen is not None and chosen.retrained else []
    return why + [line for line in (choice.pull_apart, choice.path_rule) if line]


def _retrained_why(c: Candidate, study: Study) -> str:
    """The chosen candidate is retrained: how far it moved from your model, and where its gain came from."""
    least = retrained.agreement(c)
    agree = f": it agrees with your float model on {least.agreement * 100:.1f}% of the test samples" if least else ""
    credit = retrained.credit(c, study)
    return f"{c.name} is retrained (fine-tuned on your data){agree}" + (
        f"; {credit.split(': ', 1)[1]}." if credit else "."
    )


def raise_if_unmet(rec: Recommendation) -> None:
    """Raise GoalsNotMet (exit code 1) when no candidate meets the goals (or, with none given, the default
    guard), naming the closest miss and what to do; never the command that was just run."""
    if rec.chosen is not None:
        return
    if not rec.rejected:
        raise GoalsNotMet(
            f"No candidate to choose from for {rec.target}: the study is empty.", "Run `optimize sweep` first."
        )
    first = rec.rejected[0]
    if rec.guard is not None and rec.warnings:
        raise GoalsNotMet(
            f"Nothing {rec.target} runs passes the default guard.",
            "See what it lost and what to try above, or state a goal.",
        )
    goals = _goals_given(rec.goals)
    if rec.make is not None:
        problem = f"({len(rec.rejected)} rejected; e.g. {first.candidate}: {first.reason})"
        make = f"make what the rule of thumb suggests, not measured here: {rec.make}"
        fix = f"Relax a goal, or {make}" if goals else make[0].upper() + make[1:]
    else:  # never a pipeline the study measured and rejected for this target; the rejections are listed above
        problem = f"({len(rec.rejected)} rejected, why above)"
        known = explain.nothing_known_runs(rec.target)
        fix = f"Relax a goal. {known}" if goals else known
    if goals:
        raise GoalsNotMet(f"No candidate meets the goals for {rec.target} {problem}.", fix)
    raise GoalsNotMet(f"No measured candidate runs on {rec.target} {problem}.", fix)


__all__ = ["OptimizeError", "Recommendation", "Rejection", "judge", "make_goals", "pareto_front", "recommend"]

"""Advice for a target judged on that target's terms: the study as the target computes and times each candidate.

A sweep measures every candidate on the CPU, and beside it as the GPU computes it (`metrics.on_target.gpu`:
weights dequantized and float math, float16 for a float16 model; emulated on the CPU, or observed on a device).
The `gpu` target's advice reads the latter: the same ranking, guard and goals, on the GPU's figures.

Latency is the host CPU's: it ranks the cpu target only. The CPU's hybrid kernels (dynamic), reference kernels
(int16x8) and XNNPACK say nothing of a GPU, an NPU, a DSP or a microcontroller (issue 43: the gpu pick rejected
`dynamic` as "26.5x slower than float32", a host-CPU hybrid-kernel figure). Every other target is ranked on size
and quality, said so in one line, unless the target itself was timed: the gpu where `--observe gpu` ran each
candidate on a GPU device (`metrics.on_target.gpu.latency`). Pure: no TensorFlow, no numpy.
"""

from __future__ import annotations

from optimize.core.results import Accuracy, Candidate, Fidelity, Latency, Study, TargetFidelity
from optimize.core.vocab import Target

#: The targets whose arithmetic a sweep records (`metrics.on_target.<name>`).
ON_TARGET = {Target.GPU: "gpu"}


def figures(c: Candidate, target: Target) -> TargetFidelity | None:
    """The candidate's figures as `target` computes it, when measured."""
    name = ON_TARGET.get(target)
    on = c.metrics.on_target if c.ok and c.metrics is not None else None
    return getattr(on, name, None) if on is not None and name else None


def _delta(g: TargetFidelity, base: Accuracy | None) -> dict:
    """The target's accuracy against the float32 baseline's on the CPU: top-1 points, or the MAE's ratio. Read
    from the two records, not from the deltas a sweep stored: a candidate produced before its baseline was
    measured compared its GPU figures with themselves (every gpu delta 0, so ties went to the least accurate)."""
    a = g.accuracy
    if a is None or base is None:
        return {"accuracy_delta": g.accuracy_delta, "error_ratio": g.error_ratio}
    if a.top1 is not None and base.top1 is not None:
        return {"accuracy_delta": a.top1 - base.top1, "error_ratio": None}
    if a.mae is not None and base.mae:
        return {"accuracy_delta": None, "error_ratio": a.mae / base.mae}
    return {"accuracy_delta": g.accuracy_delta, "error_ratio": g.error_ratio}


def _as_computed(c: Candidate, g: TargetFidelity, base: Accuracy | None = None) -> Candidate:
    fid = Fidelity(**{k: getattr(g, k) for k in Fidelity.model_fields})
    update: dict = {"fidelity": fid if c.metrics.fidelity is not None else None}
    if g.accuracy is not None:
        update.update(accuracy=g.accuracy, **_delta(g, base))
    return c.model_copy(update={"metrics": c.metrics.model_copy(update=update)})


def as_computed_on(study: Study, target: Target) -> tuple[Study, list[str]]:
    """The study with each candidate's fidelity (and accuracy, with labels) as `target` computes it, and the
    facts that say so (how it was measured, the candidates the observed device computes badly); the study
    unchanged for a target whose arithmetic is the CPU's, or when nothing was measured for it."""
    found = {c.name: g for c in study.candidates if (g := figures(c, target)) is not None}
    if not found:
        return study, []
    base = next((c for c in study.candidates if c.name == study.baseline and c.ok), None)
    acc = base.metrics.accuracy if base is not None else None
    cands = [_as_computed(c, found[c.name], acc) if c.name in found else c for c in study.candidates]
    methods = sorted({g.method for g in found.values()})
    facts = [
        f"Quality as the {target} computes each candidate ({' and '.join(methods)} for {len(found)} of them: "
        "weights dequantized and float math, float16 for a float16 model), not the CPU's figures."
    ]
    facts += [f"{name}: {g.flagged}." for name, g in found.items() if g.flagged]
    return study.model_copy(update={"candidates": cands}), facts


#: How each target that is not the host CPU could be timed, said where its pick is ranked without latency.
TIMED_BY = {
    Target.GPU: "--observe gpu times each candidate on a GPU device where this machine has one",
    Target.NNAPI: "time it on the phone (benchmark_model with --use_nnapi=true)",
    Target.COREML: "time it on the device (benchmark_model with --use_coreml=true)",
    Target.HEXAGON: "time it on the device (benchmark_model with --use_hexagon=true)",
}


def _timed(c: Candidate, latency: Latency | None) -> Candidate:
    return c.model_copy(update={"metrics": c.metrics.model_copy(update={"latency": latency})}) if c.ok else c


def timed_on(study: Study, target: Target) -> tuple[Study, list[str]]:
    """The study with each candidate's latency as `target` runs it: the host CPU's for the cpu target (as
    measured); the observed device's for the gpu where every working candidate was timed there; none for any
    other target (host-CPU latency does not predict it): ranked on size and quality, and the fact that says so."""
    if target is Target.CPU:
        return study, []
    ok = [c for c in study.candidates if c.ok]
    observed = {c.name: g.latency for c in ok if (g := figures(c, target)) is not None and g.latency is not None}
    if ok and len(observed) == len(ok):
        cands = [_timed(c, observed.get(c.name)) for c in study.candidates]
        device = next(iter(observed.values())).runtime
        fact = f"Latency as the {target} runs each candidate: {device}, not the host CPU's."
        return study.model_copy(update={"candidates": cands}), [fact]
    cands = [_timed(c, None) for c in study.candidates]
    how = TIMED_BY.get(target, "time it on the device")
    fact = (
        f"Ranked on size and quality, not speed: host-CPU latency does not predict the {target} (the CPU's "
        f"hybrid and reference kernels are not the {target}'s); {how}."
    )
    return study.model_copy(update={"candidates": cands}), [fact]

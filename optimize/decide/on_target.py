"""Advice for a target judged on that target's arithmetic: the study as the GPU computes each candidate.

A sweep measures every candidate on the CPU, and beside it as the GPU computes it (`metrics.on_target.gpu`:
weights dequantized and float math, float16 for a float16 model; emulated on the CPU, or observed on a device).
The `gpu` target's advice reads the latter: the same ranking, guard and goals, on the GPU's figures. Pure: no
TensorFlow, no numpy.
"""

from __future__ import annotations

from optimize.core.results import Candidate, Fidelity, Study, TargetFidelity
from optimize.core.vocab import Target

#: The targets whose arithmetic a sweep records (`metrics.on_target.<name>`).
ON_TARGET = {Target.GPU: "gpu"}


def figures(c: Candidate, target: Target) -> TargetFidelity | None:
    """The candidate's figures as `target` computes it, when measured."""
    name = ON_TARGET.get(target)
    on = c.metrics.on_target if c.ok and c.metrics is not None else None
    return getattr(on, name, None) if on is not None and name else None


def _as_computed(c: Candidate, g: TargetFidelity) -> Candidate:
    fid = Fidelity(**{k: getattr(g, k) for k in Fidelity.model_fields})
    update: dict = {"fidelity": fid if c.metrics.fidelity is not None else None}
    if g.accuracy is not None:
        update.update(accuracy=g.accuracy, accuracy_delta=g.accuracy_delta, error_ratio=g.error_ratio)
    return c.model_copy(update={"metrics": c.metrics.model_copy(update=update)})


def as_computed_on(study: Study, target: Target) -> tuple[Study, list[str]]:
    """The study with each candidate's fidelity (and accuracy, with labels) as `target` computes it, and the
    facts that say so (how it was measured, the candidates the observed device computes badly); the study
    unchanged for a target whose arithmetic is the CPU's, or when nothing was measured for it."""
    found = {c.name: g for c in study.candidates if (g := figures(c, target)) is not None}
    if not found:
        return study, []
    cands = [_as_computed(c, found[c.name]) if c.name in found else c for c in study.candidates]
    methods = sorted({g.method for g in found.values()})
    facts = [
        f"Quality as the {target} computes each candidate ({' and '.join(methods)} for {len(found)} of them: "
        "weights dequantized and float math, float16 for a float16 model), not the CPU's figures."
    ]
    facts += [f"{name}: {g.flagged}." for name, g in found.items() if g.flagged]
    return study.model_copy(update={"candidates": cands}), facts

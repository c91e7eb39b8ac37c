"""Fitting a float graph to its targets: the `fit` technique, and the loop that removes what a delegate refuses.

Rules read, rewrites write. The delegates package says which node blocks each target (`delegates.blocking`);
the rewrites of `fit_rewrites` remove such a node where their precondition holds. One rewrite at a time:

    1. check the targets' rules on the graph as it is; for each target not run fully, the nodes it refuses
    2. the first (node, rewrite) pair not tried yet whose precondition holds at that node
    3. apply it; keep it when the delegate it was aimed at now refuses less (no target it ran fully lost) and,
       with data, the model's outputs stayed the same (bit for bit, or within float rounding: `TOLERANCE` of
       each output's range); else drop it, with why
    4. until nothing is left to try

A rewrite never moves the model's inputs or outputs (names, shapes, dtypes); one that changes what the model
takes (an integer mask read as float32) runs only when named as an option. The fitted graph is a float .tflite
like the one it came from, so every scheme quantizes it as it would the original (`fit-float16`, `fit-int8`...).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from pydantic import Field, field_validator

from optimize.core.registry import Context, Params, Stage, technique
from optimize.core.results import FitRecord, FitStep, write_atomic
from optimize.core.vocab import Delegate, FitOption
from optimize.transforms.tflite.fit_edit import Edit
from optimize.transforms.tflite.fit_rewrites import Facts, Rewrite, offered

#: The delegates a float graph is fitted to: those that run float models (Hexagon runs 8-bit ones only).
TARGETS: tuple[str, ...] = (Delegate.GPU, Delegate.COREML, Delegate.NNAPI)
#: How far an output may move, of its range over the samples: float32 rounding, as `masks.TOLERANCE`.
TOLERANCE = 1e-5
#: Rewrites tried at most (each is one parse and one rules pass per target).
MAX_STEPS = 64


@dataclass
class Step:
    """One rewrite applied (or dropped) at one node."""

    rewrite: str
    node: str  # "#7 RESHAPE", as the node was numbered when the rewrite ran
    detail: str
    targets: list[str]  # the delegates whose blocker it was aimed at
    max_abs: float | None = None  # the outputs' largest change on the samples (None: not checked)
    relative: float | None = None  # the same, of each output's range
    why: str | None = None  # why it was dropped (None: kept)


@dataclass
class Fitted:
    """What fitting did: the graph, the rewrites kept and dropped, and the targets it bought."""

    content: bytes
    steps: list[Step] = field(default_factory=list)
    before: dict[str, str] = field(default_factory=dict)  # target -> verdict on the graph as given
    after: dict[str, str] = field(default_factory=dict)
    samples: int = 0

    @property
    def kept(self) -> list[Step]:
        return [s for s in self.steps if s.why is None]

    @property
    def bought(self) -> list[str]:
        """The targets that run the fitted graph fully and did not run the original fully."""
        return [t for t, v in self.after.items() if v == "full" and self.before.get(t) != "full"]

    def touched(self) -> set[str]:
        """The kinds of node the kept rewrites removed as blockers (RESHAPE, MEAN, ...)."""
        return {s.node.split(" ", 1)[1] for s in self.kept}


class Verdicts(dict):
    """Each target's delegate report on a graph (rules only: no interpreter), and, per target, how many nodes
    keep it from running all of it: those it refuses, and the build failures a partial delegation hides."""

    def __init__(self, content: bytes, targets):
        from optimize.delegates import rules_for
        from optimize.delegates.apply_rules import ModelFacts, latent_build_failures, run_rules
        from optimize.delegates.blocking import causes
        from optimize.delegates.target import TargetParams
        from optimize.models.tflite import read_model

        facts = ModelFacts(read_model(content))
        super().__init__({t: run_rules(facts, rules_for(t), TargetParams()) for t in targets})
        self.blocking: dict[str, int] = {}
        for t, r in self.items():
            refused = {(v.subgraph, v.index) for v in causes(r)}
            latent = {(f.subgraph, f.index) for f in latent_build_failures(facts, rules_for(t), TargetParams())}
            self.blocking[t] = 0 if r.verdict == "full" else len(refused | latent)


def reports(content: bytes, targets) -> Verdicts:
    """Each target's delegate report on the graph (`Verdicts`)."""
    return Verdicts(content, targets)


def _refused(report) -> list[int]:
    """The main-graph nodes a target refuses for a reason of their own (its build failure included)."""
    from optimize.delegates.blocking import causes

    return [v.index for v in causes(report) if v.subgraph == 0]


def _progress(before: Verdicts, after: Verdicts, aimed: list[str]) -> bool:
    """An aimed target runs fully or is kept off by fewer nodes (hidden build failures counted: removing a
    refused node that hid one is a step), and no target that ran fully stopped."""
    if any(before[t].verdict == "full" and after[t].verdict != "full" for t in before):
        return False
    return any(after[t].verdict == "full" or after.blocking[t] < before.blocking[t] for t in aimed)


@dataclass
class _Site:
    rewrite: Rewrite
    node: int
    key: tuple  # (rewrite, the node's output tensor, the targets refusing it): stable while ops come and go
    aimed: list[str]


def _sites(content: bytes, found: dict, facts: Facts, tried: set) -> list[_Site]:
    """The first node a target refuses that a rewrite not yet tried there applies to, and every later refused
    node the same rewrite applies to (they are tried together first: one check for fifty PRELUs)."""
    e = Edit(content)
    refused: dict[int, list[str]] = {}
    for t, r in found.items():
        if r.verdict != "full":
            for k in _refused(r):
                refused.setdefault(k, []).append(t)
    nodes = [k for k in sorted(refused) if k < e.count]
    for i, k in enumerate(nodes):
        for rw in offered(facts):
            site = _site(e, rw, k, refused[k], facts, tried)
            if site is not None:
                more = (_site(e, rw, j, refused[j], facts, tried) for j in nodes[i + 1 :])
                return [site, *(m for m in more if m is not None)]
    return []


def _site(e: Edit, rw: Rewrite, k: int, aimed: list[str], facts: Facts, tried: set) -> _Site | None:
    key = (rw.name, e.out(k), tuple(sorted(aimed)))
    if e.name(k) in rw.ops and key not in tried and _holds(rw, e, k, facts):
        return _Site(rw, k, key, aimed)
    return None


def _holds(rw: Rewrite, e: Edit, k: int, facts: Facts) -> bool:
    try:
        return bool(rw.when(e, k, facts))
    except (IndexError, ValueError, TypeError, AttributeError):  # a graph unlike the pattern's
        return False


def _apply(content: bytes, sites: list[_Site], facts: Facts) -> tuple[bytes, list[str]]:
    """The rewrites applied in one pass, last node first, each found again by its output tensor (ops come and
    go) and its precondition asked again on the graph as it then is."""
    e = Edit(content)
    details = {}
    for site in sorted(sites, key=lambda x: -x.node):
        k = e.producer(site.key[1])
        if k is not None and _holds(site.rewrite, e, k, facts):
            details[id(site)] = site.rewrite.apply(e, k, facts)
    if not details:
        raise ValueError("the precondition no longer holds")
    return e.save(), [details.get(id(s), "") for s in sites]


class OutputCheck:
    """The model's outputs on the samples, kept, and how far a rewritten graph's move from the last kept."""

    def __init__(self, content: bytes, samples: list, threads: int = 2):
        self.samples, self.threads = samples, threads
        self.last = self._run(content)

    def _run(self, content: bytes) -> list[list[np.ndarray]]:
        from optimize.models import runtime

        runner = runtime.Runner(runtime.load(content, threads=self.threads, like=self.samples[0]))
        return [[np.asarray(o, np.float64) for o in runner.run_fresh(s)] for s in self.samples]

    def moved(self, content: bytes) -> tuple[float, float, list]:
        """(largest |change|, largest change of an output's range, the new outputs)."""
        outs = self._run(content)
        worst_abs = worst_rel = 0.0
        for before, after in zip(self.last, outs):
            for x, y in zip(before, after):
                if x.shape != y.shape or not np.all(np.isfinite(y) == np.isfinite(x)):
                    return math.inf, math.inf, outs
                ok = np.isfinite(x)
                if not ok.any():
                    continue
                diff = float(np.abs(x[ok] - y[ok]).max())
                span = max(float(np.ptp(x[ok])), float(np.abs(x[ok]).max()), 1e-12)
                worst_abs, worst_rel = max(worst_abs, diff), max(worst_rel, diff / span)
        return worst_abs, worst_rel, outs


def fit_graph(content: bytes, targets=TARGETS, facts: Facts | None = None, check: OutputCheck | None = None) -> Fitted:
    """The graph with every rewrite kept that brings a target closer to running it fully (see the module)."""
    facts = facts or Facts()
    found = reports(content, targets)
    fitted = Fitted(content, before={t: r.verdict for t, r in found.items()})
    tried: set = set()
    for _ in range(MAX_STEPS):
        sites = _sites(fitted.content, found, facts, tried)
        if not sites:
            break
        now = _try(fitted, sites, found, facts, check, targets) if len(sites) > 1 else found
        if now is found:  # one at a time, when the batch did not hold
            sites = sites[:1]
            now = _try(fitted, sites, found, facts, check, targets)
        tried |= {s.key for s in sites}
        if now is not found:  # kept: what failed before may hold on the graph as it is now
            tried = {s.key for s in sites}
        found = now
    fitted.after = {t: r.verdict for t, r in found.items()}
    fitted.samples = len(check.samples) if check is not None else 0
    return fitted


def _try(fitted: Fitted, sites: list[_Site], found: dict, facts: Facts, check, targets) -> dict:
    """Rewrites at their nodes: kept (the new reports returned), or dropped (steps saying why; a batch of
    several that does not hold is dropped without a word, and the first is tried alone)."""
    e = Edit(fitted.content)
    steps = [Step(s.rewrite.name, f"#{s.node} {e.name(s.node)}", "", s.aimed) for s in sites]
    why, now = _checked(fitted, sites, steps, found, facts, check, targets)
    if why is not None:
        if len(sites) == 1:
            steps[0].why = why
            fitted.steps.append(steps[0])
        return found
    fitted.steps += [s for s in steps if s.detail]  # a site an earlier one of the batch rewrote already: none
    return now


def _checked(fitted: Fitted, sites, steps: list[Step], found, facts, check, targets) -> tuple[str | None, object]:
    """(why the rewrites do not hold, or None; the reports after them), the graph kept when they hold."""
    try:
        changed, details = _apply(fitted.content, sites, facts)
        now = reports(changed, targets)
    except Exception as e:  # noqa: BLE001 - a graph the rewrite did not expect: dropped, the fit goes on
        return f"could not be applied ({e.__class__.__name__}: {str(e)[:80]})", None
    for step, detail in zip(steps, details):
        step.detail = detail
    if not _progress(found, now, sorted({t for s in sites for t in s.aimed})):
        return "the delegate refuses as much after it", None
    if check is not None:
        moved_abs, moved_rel, outs = check.moved(changed)
        for step in steps:
            step.max_abs, step.relative = moved_abs, moved_rel
        if not moved_rel <= TOLERANCE:
            return f"the outputs moved {moved_rel:.1e} of their range", None
        check.last = outs
    fitted.content = changed
    return None, now


# ------------------------------------------------------------------------------------------ the technique


class FitParams(Params):
    targets: tuple[Delegate, ...] = Field(
        TARGETS, min_length=1, description="The delegates the float graph is fitted to (those that run float)."
    )
    options: tuple[FitOption, ...] = Field(
        (),
        description="Rewrites beyond the model's contract, applied only when named: non-negative-ids (drop the "
        "negative-index wrap of ids the model does not declare non-negative), float-mask (an integer mask input "
        "taken as float32).",
    )
    samples: int = Field(32, ge=1, le=1024, description="Samples the outputs are compared on after each rewrite.")

    @field_validator("targets")
    @classmethod
    def _runs_float(cls, targets: tuple[Delegate, ...]) -> tuple[Delegate, ...]:
        other = [str(t) for t in targets if t not in TARGETS]
        if other:
            raise ValueError(f"{', '.join(other)} cannot be fitted: the fit takes {', '.join(TARGETS)}")
        return targets


@technique("fit", stage=Stage.TFLITE, params=FitParams)
def fit(model: Path, params: FitParams, ctx: Context) -> Path:
    """Rewrite the float graph so the target delegates take what they refuse (MEAN as pooling, a flatten folded
    into the dense layer, a broadcast given its batch axis, ...), each rewrite kept only where the outputs stay
    the same on the data. Run before quantize: every scheme then quantizes the fitted graph."""
    from optimize.transforms.tflite.rescue_steps import _float_model

    content = _float_model(model)
    facts = Facts(frozenset(declared_non_negative(ctx.source)), frozenset(params.options))
    samples = check_samples(ctx, content, params.samples)
    fitted = fit_graph(content, params.targets, facts, OutputCheck(content, samples, ctx.threads))
    ctx.records["fit"] = record(fitted, params.options)
    if not fitted.kept:  # the graph as it was: every target takes it already, or nothing applies
        ctx.notes.append(f"fit: the graph is unchanged for {', '.join(params.targets)} ({_why_not(fitted)})")
        return Path(model)
    ctx.notes.append(f"fit: {note(fitted)}")
    return write_atomic(ctx.workdir / "fitted.tflite", fitted.content)


def record(fitted: Fitted, options=()) -> FitRecord:
    steps = [
        FitStep(
            rewrite=s.rewrite, node=s.node, detail=s.detail, targets=list(s.targets), max_abs_diff=s.max_abs,
            relative_diff=s.relative, kept=s.why is None, why=s.why,
        )
        for s in fitted.steps
    ]  # fmt: skip
    return FitRecord(steps=steps, bought=fitted.bought, samples=fitted.samples, options=list(options))


def note(fitted: Fitted) -> str:
    """One line: the rewrites kept, what they bought, and the outputs' largest change."""
    kept = ", ".join(f"{s.rewrite} at {s.node}" for s in fitted.kept)
    worst = max((s.max_abs or 0.0 for s in fitted.kept), default=0.0)
    moved = "unchanged (bit for bit)" if worst == 0 else f"within float rounding (max |diff| {worst:.1e})"
    bought = f"; runs fully on {', '.join(fitted.bought)}" if fitted.bought else ""
    return f"{kept}{bought}; outputs {moved} on {fitted.samples} samples"


def _why_not(fitted: Fitted) -> str:
    if all(v == "full" for v in fitted.before.values()):
        return "each takes all of it already"
    dropped = [f"{s.rewrite} at {s.node}: {s.why}" for s in fitted.steps if s.why]
    return "; ".join(dropped[:3]) if dropped else "no rewrite applies to the nodes they refuse"


def declared_non_negative(src) -> list[str]:
    """The inputs whose ids the model declares non-negative (its id bounds), by name."""
    bounds = getattr(src, "id_bounds", ()) or ()
    return [b.input for b in bounds if not getattr(b, "negative", False)]


def check_samples(ctx: Context, content: bytes, n: int) -> list:
    """Samples the outputs are compared on: the data's calibration samples (n), else seeded noise for a model
    whose inputs are all float."""
    from optimize.models.data import count, take

    if ctx.data is not None:
        xs = ctx.data.calibration(n)
        return [take(xs, slice(i, i + 1)) for i in range(count(xs))]
    return _noise(content, min(n, 8))


def _noise(content: bytes, n: int) -> list:
    from optimize.core.errors import DataError
    from optimize.models import runtime

    details = runtime.Runner(runtime.load(content, threads=1)).inputs
    if any(np.dtype(d["dtype"]).kind != "f" for d in details):
        raise DataError("fit needs data to check a model with integer inputs.", "Pass --data (an .npz with x).")
    rng = np.random.default_rng(0)
    samples = [[rng.random(d["shape"], dtype=np.float32) for d in details] for _ in range(n)]
    return [s[0] if len(s) == 1 else s for s in samples]

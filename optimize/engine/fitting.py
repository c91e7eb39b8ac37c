"""A sweep's fit round: when rewriting the float graph would let a target's delegate take all of it, the schemes
that target was missing are made again from the fitted graph, beside the others (`fit-float32`, `fit-float16`,
...), each from the baseline's float .tflite: fit, then quantize.

Why a parallel set and not a new base: the float32 baseline stays the model as given (every candidate is
compared with it, and the fitted ones show they compute what it computes), a target the original runs fully
keeps its candidates as they were, and a fitted candidate is made only where it buys something: for each
target the fit buys, the schemes whose every blocker on it is a node the fit rewrites (a float16 kept off
Core ML by a flatten, not an int8 that Core ML refuses whatever its graph). Planned after the first round,
from the baseline and what the rules said about each candidate, as the accuracy rescue is.
"""

from __future__ import annotations

import logging

from optimize.core.recipe import Recipe, build
from optimize.core.results import Candidate

log = logging.getLogger(__name__)

#: The steps a candidate's recipe may hold to be made again from the fitted graph: one plain scheme.
PLAIN = ("convert", "quantize")


def fitted_recipes(run, options: tuple[str, ...] = ()) -> list[Recipe]:
    """The `fit-*` recipes worth adding to a run whose first round is done (none when the fit buys nothing)."""
    from optimize.engine.plan import resolve

    content = _baseline_bytes(run)
    fitted = _fit(run, content, options) if content is not None else None
    if fitted is None or not fitted.bought:
        return []
    touched = fitted.touched()
    fit_step = {"technique": "fit", "targets": [str(t) for t in fitted.bought], "options": list(options)}
    out = [build("fit-float32", [fit_step])]
    for r in run.recipes:
        c = run.done.get(r.name)
        if _remade(r, c, run.baseline) and any(_missed_for(c, t, touched) for t in fitted.bought):
            out.append(build(f"fit-{r.name}", [fit_step, _quantize_step(r)]))
    names = ", ".join(o.name for o in out)
    log.warning("The float graph fits %s with %s: adding %s.", ", ".join(fitted.bought), _kinds(fitted), names)
    return [resolve(o, run.src) for o in out]


def _baseline_bytes(run) -> bytes | None:
    """The float32 baseline's .tflite, when it was made and no fit is planned yet."""
    base = run.baseline
    made = run.done.get(base.name) if base is not None else None
    if made is None or not made.ok or not made.artifact or any(r.uses("fit") for r in run.recipes):
        return None
    path = run.out_dir / made.artifact
    return path.read_bytes() if path.is_file() else None


def _fit(run, content: bytes, options: tuple[str, ...]):
    """What the fit would buy on the baseline, by the rules alone (the fit-* tasks check the outputs)."""
    from optimize.transforms.tflite.fit import TARGETS, declared_non_negative, fit_graph
    from optimize.transforms.tflite.fit_rewrites import Facts

    facts = Facts(frozenset(declared_non_negative(run.src)), frozenset(options))
    try:
        return fit_graph(content, TARGETS, facts)
    except Exception as e:  # noqa: BLE001 - a graph the fit cannot read: no fit round, the sweep stands
        log.warning("The fit round was left out: %s: %s", e.__class__.__name__, str(e)[:200])
        return None


def _remade(r: Recipe, c: Candidate | None, base: Recipe | None) -> bool:
    """A candidate of one plain post-training scheme (not the baseline) that was made: one to make again."""
    plain = bool(r.steps) and all(s.technique in PLAIN for s in r.steps) and r.scheme != "float32"
    return plain and r is not base and c is not None and c.ok


def _missed_for(c: Candidate, target: str, touched: set[str]) -> bool:
    """The candidate's delegate for `target` is kept off only by nodes of the kinds the fit rewrites."""
    from optimize.delegates.blocking import causes

    report = c.delegates.get(target)
    if report is None or report.verdict == "full":
        return False
    refused = {v.op for v in causes(report)}
    return bool(refused) and refused <= touched


def _quantize_step(r: Recipe) -> dict:
    """The recipe's scheme as a LiteRT Quantizer step on the fitted float .tflite."""
    last = r.steps[-1].flat()
    if last["technique"] == "quantize":
        return last
    return {
        "technique": "quantize",
        "scheme": last["scheme"],
        "io": last.get("io", "float"),
        "samples": last.get("samples", 200),
    }


def _kinds(fitted) -> str:
    return ", ".join(dict.fromkeys(s.rewrite for s in fitted.kept))


def compat_lines(model, delegates) -> list[str]:
    """What `optimize compat` adds for a float .tflite: the targets an exact rewrite of its graph would buy, and
    with which rewrites (by the rules alone; a sweep checks the outputs on the data)."""
    from optimize.delegates.apply_rules import scheme_of
    from optimize.models.tflite import read_model
    from optimize.transforms.tflite.fit import TARGETS, fit_graph

    content = model.read_bytes()
    targets = [t for t in TARGETS if t in delegates]
    if not targets or scheme_of(read_model(content)) != "float32":
        return []
    fitted = fit_graph(content, targets)
    if not fitted.bought:
        return []
    per = [
        f"{t} ({', '.join(f'{s.rewrite} at {s.node}' for s in fitted.kept if t in s.targets)})" for t in fitted.bought
    ]
    return [
        f"fit: {'; '.join(per)} would take all of it once the graph is rewritten so: `optimize sweep` makes "
        "fit-* candidates that way, each rewrite checked to keep the outputs on the data"
    ]

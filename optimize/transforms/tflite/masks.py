"""Attention masks with finite fills, so a calibrated scheme can give the masked scores a range.

An attention mask hides positions from a softmax by filling their scores with a value whose exponential is
zero: PyTorch's attention and `masked_fill` use -inf, Hugging Face the dtype's lowest value (-3.4e38), Keras
-1e9, older BERTs -10000. In the float model that is exact. A calibrated scheme (int8, int16x8) gives each
tensor a range from what it sees, and a tensor holding -inf has none ("calibration gives N tensor(s) a
non-finite range"), while one holding -1e9 has a range so wide that every real score rounds to the same
integer: the softmax turns uniform and accuracy goes.

So before calibration each such fill constant (a float constant at or below -`LARGE`, or -inf, that reaches
a SOFTMAX through the ops masks are built with) is given a finite value just low enough that the softmax is
unchanged: below the lowest score the float model computes on the calibration samples by the score range
plus `MARGIN` (exp(-20) is 2e-9: under float32's resolution of a softmax's sum). The float model with the new
fill is then run against the original on the calibration and held-out test samples; its outputs must match
(`TOLERANCE` of each output's range), else the margin is widened and, failing that, the model is left as it
was (the calibrated schemes then fail as before, with the reason).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

#: A constant value at or below -LARGE (or -inf) on a path to a softmax is a mask fill.
LARGE = 1e4
#: Nats below the lowest score the fill is put at (softmax weights of exp(-MARGIN) relative: below float32).
MARGIN = 20.0
#: How far the outputs may move, of each output's range over the samples (float32 rounding).
TOLERANCE = 1e-5
#: The ops a mask travels through on its way to the scores (built, broadcast, added or selected).
PATH_OPS = {
    "ADD", "SUB", "MUL", "DIV", "SELECT", "SELECT_V2", "MINIMUM", "MAXIMUM", "RESHAPE", "EXPAND_DIMS", "SQUEEZE",
    "BROADCAST_TO", "TRANSPOSE", "TILE", "CONCATENATION", "PACK", "GATHER", "GATHER_ND", "SLICE", "STRIDED_SLICE",
    "CAST",
}  # fmt: skip
SOFTMAX_OPS = ("SOFTMAX", "LOG_SOFTMAX")
MAX_DEPTH = 16


@dataclass(frozen=True)
class Fills:
    """The mask fills found: constant tensor indices, the softmax input tensors they reach, and their value."""

    constants: tuple[int, ...]
    scores: tuple[int, ...]  # the softmax inputs (tensor indices)
    beta: float  # the largest softmax beta among them (the fill's margin is in the softmax's own units)
    fill: float  # the most negative fill value (-inf, -3.4e38, -1e9, ...)


def find(content: bytes) -> Fills | None:
    """The mask fill constants of a float model's main graph, or None when it has none."""
    from optimize.models.tflite import read_model

    sg = read_model(content).main
    constants, scores, betas, fills = [], set(), [], []
    for t in sg.tensors:
        if not t.is_const or t.dtype != "float32" or t.index not in sg.consumers:
            continue
        v = t.values()
        if v is None or not v.size or not np.any((v <= -LARGE) | np.isneginf(v)):
            continue
        reached = _softmax_inputs(sg, t.index)
        if reached:
            constants.append(t.index)
            scores |= {s for s, _ in reached}
            betas += [b for _, b in reached]
            fills.append(float(v.min()))
    if not constants:
        return None
    return Fills(tuple(constants), tuple(sorted(scores)), max(betas), min(fills))


def _softmax_inputs(sg, start: int) -> list[tuple[int, float]]:
    """(softmax input tensor, softmax beta) for every softmax `start` reaches through mask-building ops."""
    found, seen, frontier = [], {start}, [(start, 0)]
    while frontier:
        t, depth = frontier.pop()
        for k in sg.consumers.get(t, []):
            op = sg.ops[k]
            if op.name in SOFTMAX_OPS:
                found.append((t, float(op.options.get("beta", 1.0) or 1.0)))
            elif op.name in PATH_OPS and depth < MAX_DEPTH:
                for out in op.outputs:
                    if out >= 0 and out not in seen:
                        seen.add(out)
                        frontier.append((out, depth + 1))
    return found


def score_range(content: bytes, fills: Fills, samples: list, threads: int = 2) -> tuple[float, float] | None:
    """(lowest, highest) unmasked score the softmaxes see on the samples: values above -LARGE/2 (a masked score
    is the fill, or the fill plus a score; the runtime's ADD clamps -inf to float32's lowest value)."""
    from optimize.measure.tensors import stream

    cut = -LARGE / 2
    lo, hi = math.inf, -math.inf
    for values in stream(content, samples, list(fills.scores), threads):
        for v in values.values():
            v = v[np.isfinite(v) & (v > cut)]
            if v.size:
                lo, hi = min(lo, float(v.min())), max(hi, float(v.max()))
    return (lo, hi) if lo <= hi else None


def rewrite(content: bytes, fills: Fills, value: float) -> bytes:
    """The model with every mask fill (values at or below -LARGE, or -inf) of the fill constants set to `value`."""
    from optimize.transforms.tflite.flatedit import Graph

    g = Graph.load(content)
    for i in fills.constants:
        v = g.const(i)
        if v is None:
            continue
        g.set_const(i, np.where((v <= -LARGE) | np.isneginf(v), np.float32(value), v))
    return g.save()


def _max_change(original: bytes, changed: bytes, samples: list, threads: int) -> float:
    """The largest output change over the samples, as a fraction of each output's range (inf: not finite)."""
    from optimize.models import runtime

    like = samples[0]
    a = runtime.Runner(runtime.load(original, threads=threads, like=like))
    b = runtime.Runner(runtime.load(changed, threads=threads, like=like))
    worst = 0.0
    for s in samples:
        for x, y in zip(a.run_fresh(s), b.run_fresh(s)):
            x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
            if not np.all(np.isfinite(y)):
                return math.inf
            ok = np.isfinite(x)
            if not ok.any():
                continue
            span = max(float(np.ptp(x[ok])) if x[ok].size > 1 else 0.0, float(np.abs(x[ok]).max()), 1e-12)
            worst = max(worst, float(np.abs(x[ok] - y[ok]).max()) / span)
    return worst


@dataclass(frozen=True)
class Finite:
    """What making the fills finite did: the model to calibrate, and the line that says so (None: nothing)."""

    content: bytes
    note: str | None


def make_finite(content: bytes, calibration: list, held_out: list, threads: int = 2) -> Finite:
    """The float model with finite mask fills, checked to compute what it computed (see the module docstring)."""
    fills = find(content)
    if fills is None:
        return Finite(content, None)
    span = score_range(content, fills, calibration, threads)
    if span is None:
        return Finite(content, None)
    lo, hi = span
    check = calibration + held_out
    for margin in (MARGIN, 2 * MARGIN, 4 * MARGIN):
        value = float(math.floor(min(lo - hi, lo) - margin / fills.beta))
        changed = rewrite(content, fills, value)
        moved = _max_change(content, changed, check, threads)
        if moved <= TOLERANCE:
            was = "-inf" if math.isinf(fills.fill) else f"{fills.fill:.3g}"
            return Finite(
                changed,
                f"{len(fills.constants)} attention mask fill(s) of {was} set to {value:g} before calibration "
                f"(scores seen: {lo:.3g}..{hi:.3g}); the float model's outputs move by {moved:.1e} of their range "
                f"on {len(check)} samples ({len(held_out)} held out).",
            )
    return Finite(
        content,
        f"{len(fills.constants)} attention mask fill(s) found, but no finite fill keeps the float model's outputs "
        f"(moved {moved:.1e} of their range): left as they are.",
    )

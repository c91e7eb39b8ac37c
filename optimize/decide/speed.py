"""The cpu pick is not slower than the file it replaces (issue 40): speed as the cpu target judges it.

On MediaPipe's selfie segmenter the smallest file, `dynamic`, ran at 15.6 ms against float32's 8.7 ms on the
CPU (hybrid kernels quantize activations on every invoke): a pick by size made the app slower. By default the
cpu target keeps the smallest file whose latency is within the noise of float32's or better (two latencies
differ only when their intervals separate and the ratio clears 15%: `optimize.measure.noise`); `--max-slowdown
X` states another bound (at most X times float32's p50, beyond the noise). What size would have cost in speed
is said in one line. Only the cpu target is judged so: every other target is ranked without host-CPU latency
(`optimize.decide.on_target.timed_on`). Pure: no TensorFlow, no numpy.
"""

from __future__ import annotations

import math

from optimize.core.results import Candidate, Goals
from optimize.core.vocab import Target
from optimize.measure.noise import ratio, slower_than, versus

#: The words that start a rejection for speed (what `cost_line` finds among the rejections).
SLOWER = "measured slower than float32 on this CPU"


def _accepting(c: Candidate, base: Candidate) -> str:
    """`--max-slowdown 1.9`: the bound that accepts the candidate's measured ratio (its interval's low end)."""
    r = ratio(c, base)
    return f"--max-slowdown {max(1.1, math.ceil(r[1] * 10) / 10):g}" if r is not None else "--max-slowdown"


def slowdown_problem(c: Candidate, target: Target, goals: Goals, base: Candidate | None) -> str | None:
    """Why the cpu target keeps a candidate out for speed: slower than float32 beyond the noise (or beyond
    `goals.max_slowdown` times float32's p50), or None. Other targets, the baseline itself, and candidates or
    baselines without a measured latency are never judged here."""
    if target is not Target.CPU or base is None or c.name == base.name or not c.ok or c.p50_ms is None:
        return None
    if base.p50_ms is None:
        return None
    bound = goals.max_slowdown or 1.0
    if not slower_than(c, base, bound):
        return None
    limit = "not slower than the file it replaces" if bound <= 1.0 else f"at most {bound:g}x float32's p50"
    return f"{SLOWER} ({versus(c, base)}): the cpu pick is {limit} (to accept it: {_accepting(c, base)})"


def cost_line(chosen: Candidate | None, kept_out: list[Candidate], base: Candidate | None, goals: Goals) -> str:
    """One line when size cost speed on the cpu target: the smaller candidates kept out for being slower than
    float32 (the smallest named), or the pick itself slower than float32 within a bound the user allowed."""
    if base is None or chosen is None:
        return ""
    smaller = [c for c in kept_out if c.metrics.size.bytes < chosen.metrics.size.bytes]
    if smaller:
        c = min(smaller, key=lambda c: c.metrics.size.bytes)
        pick = "keep the float32 file" if chosen.name == base.name else f"{chosen.name}, not slower, is picked"
        return (
            f"Size would cost speed: {c.name} is smaller ({c.metrics.size.bytes:,} vs {chosen.metrics.size.bytes:,} "
            f"bytes) but measured slower than float32 ({versus(c, base)}); {pick} ({_accepting(c, base)} takes it)."
        )
    if chosen.name != base.name and goals.max_slowdown and slower_than(chosen, base, 1.0):
        return (
            f"Size costs speed: {chosen.name} measured slower than float32 ({versus(chosen, base)}), within "
            f"--max-slowdown {goals.max_slowdown:g}."
        )
    return ""


def cached_fact(study_candidates: list[Candidate]) -> str:
    """A line when latencies the cpu target judges come from the result cache: they are the run that made
    them, never presented as timed now."""
    cached = [c for c in study_candidates if c.ok and c.cached and c.metrics.latency is not None]
    if not cached:
        return ""
    when = sorted({c.metrics.latency.timed[:16].replace("T", " ") for c in cached if c.metrics.latency.timed})
    at = f", timed {when[0]}{' to ' + when[-1] if len(when) > 1 else ''} UTC" if when else ""
    return (
        f"The latency of {len(cached)} candidate(s) comes from the result cache (the run that made them{at}), "
        "not timed again: --no-cache re-times them."
    )

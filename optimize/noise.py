"""Latency comparisons that respect measurement noise: two candidates differ only when their intervals separate.

A sweep times its candidates round-robin (optimize.runtime.time_rounds), so machine drift hits all alike,
and keeps an interval for each p50 over the rounds (`Latency.interval`; older records fall back to the
quartiles of their single runs). `speed` calls a candidate slower or faster than another only when the two
intervals do not overlap; `compare_latency` is the same as a sort comparison, so rankings and the Pareto
front do not flip between re-timings of an unchanged study. Pure: no TensorFlow, no numpy.
"""

from __future__ import annotations

from .results import Candidate, Latency

EPS = 1e-9


def _latency(c: Candidate) -> Latency | None:
    return c.metrics.latency if c.metrics else None


def compare_latency(a: Candidate, b: Candidate) -> int:
    """-1 when `a` is measurably faster than `b`, 1 when slower, 0 when the intervals overlap (the same
    within the noise). Unmeasured latency counts as slowest; two unmeasured are the same."""
    la, lb = _latency(a), _latency(b)
    if la is None or lb is None:
        return (la is None) - (lb is None)
    a_lo, a_hi = la.interval
    b_lo, b_hi = lb.interval
    if a_hi < b_lo - EPS:
        return -1
    if a_lo > b_hi + EPS:
        return 1
    return 0


def speed(c: Candidate, base: Candidate) -> str:
    """'slower', 'faster' or 'same' than `base`, called only when the two measured intervals separate."""
    if _latency(c) is None or _latency(base) is None:
        return "same"
    return {-1: "faster", 0: "same", 1: "slower"}[compare_latency(c, base)]


def interval_words(c: Candidate) -> str:
    """`0.412 ms (0.401-0.430)`: p50 with the interval a comparison must clear."""
    lat = _latency(c)
    if lat is None:
        return "not timed"
    lo, hi = lat.interval
    return f"{lat.p50_ms:.3g} ms ({lo:.3g}-{hi:.3g})" if hi > lo else f"{lat.p50_ms:.3g} ms"

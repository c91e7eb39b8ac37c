"""Latency comparisons that respect measurement noise: two candidates differ only when their intervals separate.

A sweep times its candidates round-robin (optimize.measure.timing.time_rounds), so machine drift hits all alike,
and keeps an interval for each p50 over the rounds (`Latency.interval`; older records fall back to the
quartiles of their single runs). Two candidates timed in the same rounds are compared round by round:
the interval of the median ratio of their round medians must lie wholly beyond `MARGIN` (15%), which
cancels whatever drift moved a whole round. Others (one cached from an earlier run, say) are different
only when their p50 intervals do not overlap. `speed` says slower or faster only then; `compare_latency` is the same as a sort comparison, so rankings and the Pareto
front do not flip between re-timings of an unchanged study. Pure: no TensorFlow, no numpy.
"""

from __future__ import annotations

import math

from optimize.core.results import Candidate, Latency

EPS = 1e-9
#: Two candidates differ only when one is slower by more than this (and measurably so): on a shared host
#: the ratio of two models' speeds itself moves about that much with the load (MobileNetV2's int8 over float32: 0.75 on a quiet machine, 1.04-1.16 on a busy one).
MARGIN = 0.15


def median_interval(values: list[float], level: float = 0.95) -> tuple[float, float]:
    """A distribution-free interval for the median of `values` (order statistics, binomial coverage of
    at least `level`); min and max when there are too few values for that coverage."""
    xs = sorted(values)
    n = len(xs)
    if n == 0:
        raise ValueError("no values")
    tail = (1 - level) / 2
    k, below = 0, 0.0  # the largest k with P(Binomial(n, 1/2) < k) <= tail
    for j in range(n):
        below += math.comb(n, j) / 2**n
        if below > tail:
            break
        k = j + 1
    if k == 0:
        return xs[0], xs[-1]
    return xs[k - 1], xs[n - k]


def paired(a: Latency, b: Latency) -> bool:
    """Timed in the same rounds (one session, two rounds or more in common): comparable round by round. A
    model whose comparisons were decided leaves the rounds early (optimize.measure.timing), so two records of
    one session are compared over the rounds both have."""
    return a.session is not None and a.session == b.session and min(len(a.round_p50s_ms), len(b.round_p50s_ms)) > 1


def ratio_interval(a: Latency, b: Latency) -> tuple[float, float, float]:
    """(median, low, high) of a's round medians over b's, round by round over the rounds both have, the
    interval the median's (about 95%, as `median_interval`); `paired` records only."""
    common = min(len(a.round_p50s_ms), len(b.round_p50s_ms))
    pairs = zip(a.round_p50s_ms[:common], b.round_p50s_ms[:common], strict=True)
    ratios = sorted(x / y for x, y in pairs if y > 0)
    if not ratios:
        return 1.0, 0.0, math.inf
    lo, hi = median_interval(ratios)
    return ratios[len(ratios) // 2], lo, hi


def _latency(c: Candidate) -> Latency | None:
    return c.metrics.latency if c.metrics else None


def compare_latency(a: Candidate, b: Candidate) -> int:
    """-1 when `a` is measurably faster than `b`, 1 when slower, 0 when the same within the noise: timed
    in the same rounds, the interval of the median of their per-round ratios must lie wholly beyond
    `MARGIN` (slower by more than 15%, with about 95% confidence); otherwise their p50 intervals must
    separate and the p50s differ by more than `MARGIN`. Symmetric. Unmeasured latency counts as slowest;
    two unmeasured are the same."""
    la, lb = _latency(a), _latency(b)
    if la is None or lb is None:
        return (la is None) - (lb is None)
    if paired(la, lb):  # round by round: the whole interval of the median ratio beyond the margin
        _, lo, hi = ratio_interval(la, lb)
        return -1 if hi < 1 / (1 + MARGIN) else 1 if lo > 1 + MARGIN else 0
    (a_lo, a_hi), (b_lo, b_hi) = la.interval, lb.interval
    if a_hi < b_lo - EPS and la.p50_ms * (1 + MARGIN) < lb.p50_ms:
        return -1
    if a_lo > b_hi + EPS and la.p50_ms > lb.p50_ms * (1 + MARGIN):
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


def versus(a: Candidate, b: Candidate) -> str:
    """How a's latency compares with b's, as measured: `1.78x round by round (1.70-1.85)` when timed in the
    same rounds, else `0.412 ms (0.401-0.430) vs 0.250 ms (0.240-0.262)`."""
    la, lb = _latency(a), _latency(b)
    if la is not None and lb is not None and paired(la, lb):
        mid, lo, hi = ratio_interval(la, lb)
        return f"{mid:.2f}x {b.name}'s p50 round by round ({lo:.2f}-{hi:.2f} over {len(la.round_p50s_ms)} rounds)"
    return f"{interval_words(a)} vs {interval_words(b)}"


def ratio(a: Candidate, b: Candidate) -> tuple[float, float, float] | None:
    """(median, low, high) of a's latency over b's: round by round when timed together, else the p50s over
    each other's intervals (low: a's fastest over b's slowest). None when either is not timed."""
    la, lb = _latency(a), _latency(b)
    if la is None or lb is None or lb.p50_ms <= 0:
        return None
    if paired(la, lb):
        return ratio_interval(la, lb)
    (a_lo, a_hi), (b_lo, b_hi) = la.interval, lb.interval
    return la.p50_ms / lb.p50_ms, a_lo / b_hi if b_hi > 0 else 0.0, a_hi / b_lo if b_lo > 0 else math.inf


def slower_than(a: Candidate, b: Candidate, factor: float) -> bool:
    """Whether `a` measured slower than `factor` times `b`, beyond the noise: its whole ratio interval lies above
    `factor` (and, for factor 1, beyond the margin too: `speed`)."""
    if factor <= 1.0:
        return speed(a, b) == "slower"
    r = ratio(a, b)
    return r is not None and r[1] > factor + EPS

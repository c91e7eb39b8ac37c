"""Latency that machine drift cannot rank: models timed round-robin, with an interval for each p50.

Timing candidates one after another lets whatever the machine does meanwhile (another process, a
frequency change, a thermal step) land on some candidates and not others: identical int8 files measured
0.040 and 0.077 ms in one sweep. `time_rounds` loads every model first, then runs `ROUNDS` rounds; each
round times a short block of every model in turn (the order rotated each round), so drift hits all
alike. Each model's p50 is the median of its round medians, with a distribution-free interval for it
(order statistics of the round medians, about 95%); `optimize.noise` calls two models different only
when their intervals separate.

`runtime.time_invoke` is the older one-after-another timing of one model, kept for comparison
(benchmarks/bench_latency_noise.py).
"""

from __future__ import annotations

import math
import statistics
import time

ROUNDS = 9
#: Below this many milliseconds a model's block is preceded by one untimed invoke: the others ran in
#: between, and a small model's first run after them pays for the cache.
REWARM_MS = 5.0


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


def _first_and_warm(runner, sample, warmup: int) -> tuple[float, int]:
    runner.set_input(sample)
    t0 = time.perf_counter()
    runner.invoke()
    first_ms = (time.perf_counter() - t0) * 1000
    warmup = warmup if first_ms < 100 else min(warmup, 1)
    for _ in range(warmup):
        runner.it.invoke()
    return first_ms, warmup


def _block(runner, n: int, rewarm: bool) -> list[float]:
    if rewarm:
        runner.it.invoke()
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        runner.it.invoke()
        out.append((time.perf_counter() - t0) * 1000)
    return out


def _stats(times: list[float], medians: list[float], first_ms: float, warmup: int) -> dict:
    xs = sorted(times)
    lo, hi = median_interval(medians)
    return {
        "first_ms": first_ms,
        "warmup_runs": warmup,
        "runs": len(xs),
        "mean_ms": statistics.fmean(xs),
        "std_ms": statistics.pstdev(xs),
        "p50_ms": statistics.median(medians),
        "p25_ms": xs[len(xs) // 4],
        "p75_ms": xs[min(len(xs) - 1, (3 * len(xs)) // 4)],
        "p90_ms": xs[min(len(xs) - 1, int(len(xs) * 0.9))],
        "min_ms": xs[0],
        "rounds": len(medians),
        "round_p50s_ms": medians,
        "p50_low_ms": lo,
        "p50_high_ms": hi,
    }


def time_rounds(
    runners: list, samples: list, warmup: int = 5, runs: int = 50, rounds: int = ROUNDS, budget_s: float = 1.0
) -> list[dict | Exception]:
    """Latency of several loaded models (`runtime.Runner`s, each with its sample), timed round-robin.

    Every model gets a first invoke and its warm-up, then `rounds` rounds; in round k the models are
    timed in turn starting from model k (mod n), each for a block of `runs / rounds` invokes (`runs` in all).
    A slow model's block shrinks so that its timed runs stay within about `budget_s` (one run per
    round at least), so slow reference kernels (int16x8) do not stall a sweep. Returns, per model, the
    fields of `results.Latency` that timing yields (p50 = the median of the round medians), or the
    exception a model raised on its first invoke (it is left out of the rounds).
    """
    starts: list = []
    for r, s in zip(runners, samples):
        try:
            starts.append(_first_and_warm(r, s, warmup))
        except Exception as e:  # noqa: BLE001 - the runtime's own error (InvokeError, ModelError), handed back
            starts.append(e)
    live = [i for i, st in enumerate(starts) if not isinstance(st, Exception)]
    rounds = max(1, min(rounds, runs))
    fits, rewarm = {}, {}
    for i in live:
        t0 = time.perf_counter()
        runners[i].it.invoke()  # one more run to estimate the cost of a block
        est = max((time.perf_counter() - t0) * 1000, 1e-6)
        fits[i] = max(1, int(budget_s * 1000 / rounds / est))
        rewarm[i] = est < REWARM_MS and len(live) > 1
    times: dict[int, list[float]] = {i: [] for i in live}
    medians: dict[int, list[float]] = {i: [] for i in live}
    for k in range(rounds):
        size = runs // rounds + (k < runs % rounds)  # `runs` in all, spread over the rounds
        for j in range(len(live)):
            i = live[(k + j) % len(live)]
            block = _block(runners[i], min(size, fits[i]), rewarm[i])
            times[i] += block
            medians[i].append(statistics.median(block))
    return [_stats(times[i], medians[i], *starts[i]) if i in times else starts[i] for i in range(len(runners))]

"""Latency that machine drift cannot rank: models timed round-robin, with an interval for each p50.

Timing candidates one after another lets whatever the machine does meanwhile (another process, a
frequency change, a thermal step) land on some candidates and not others: identical int8 files measured
0.040 and 0.077 ms in one sweep. `time_rounds` runs `ROUNDS` rounds; each round times a short block of
every model in turn (the order rotated each round), so drift hits all alike, on a fresh interpreter per
block, so an interpreter's own luck (where its arena lands, how its thread pool settles) is sampled too:
byte-identical files then time alike (benchmarks/bench_latency_noise.py). Each model's p50 is the median of its round medians, with a distribution-free interval for it
(order statistics of the round medians, about 95%); `optimize.measure.noise` calls two models different only
when their intervals separate.

`time_invoke` is the older one-after-another timing of one model, kept for comparison
(benchmarks/bench_latency_noise.py).
"""

from __future__ import annotations

import datetime
import statistics
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from optimize.measure.noise import median_interval
from optimize.models.runtime import Runner

ROUNDS = 15
#: Rounds before timing may stop early: with 6 round medians the ~95% interval is their whole range.
MIN_ROUNDS = 6
#: A p50 interval this narrow (relative to p50) needs no more rounds.
TIGHT = 0.05
#: A pair whose every round so far puts one this many times slower than the other is decided from
#: `OVERWHELM_ROUNDS` rounds on (int16x8 on reference kernels against XNNPACK's kernels: 50-200x): machine
#: noise moves a p50 by tens of percent, not several-fold three rounds running.
OVERWHELM = 3.0
OVERWHELM_ROUNDS = 3
#: A model whose first invoke takes this long (reference kernels: int16x8) keeps one interpreter across its
#: rounds: where its arena lands is noise far below its run time, and rebuilding and warming it up again
#: each round would cost seconds.
SLOW_MS = 100.0
#: Untimed runs before each later block (the first block warms up `warmup` times, as recorded).
REWARM = 2


def _block(
    runner, sample, warmup: int, n: int, fresh: bool = True, cap_ms: float | None = None
) -> tuple[float, int, list[float]]:
    """A fresh interpreter's first invoke (ms), its warm-up (fewer after a first invoke of 100 ms or more;
    the count run is returned) and `n` timed invokes; `fresh=False`: an interpreter timed before, `n` timed
    invokes only. `cap_ms`: after a slow first invoke (SLOW_MS), only the timed invokes that fit in it (one at
    least), as every later block of that model is sized."""
    first_ms, warmup = warm_start(runner, sample, warmup) if fresh else (0.0, 0)
    if cap_ms is not None and first_ms >= SLOW_MS:
        n = min(n, max(1, int(cap_ms // first_ms)))
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        runner.it.invoke()
        out.append((time.perf_counter() - t0) * 1000)
    return first_ms, warmup, out


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


def of_runs(times: list[float], first_ms: float) -> dict:
    """Latency figures from single timed runs made elsewhere (the GPU accelerator's, in its own process): p50 and
    its interval over the runs (`median_interval`), the quartiles, p90; no rounds, no session."""
    stats = _stats(times, list(times), first_ms, 1)
    return {**stats, "rounds": None, "round_p50s_ms": []}


def time_rounds(
    loaders: list[Callable[[], object]],
    samples: list,
    warmup: int = 5,
    runs: int = 50,
    rounds: int = ROUNDS,
    budget_s: float = 1.0,
    settle: bool = True,
) -> list[dict | Exception]:
    """Latency of several models, timed round-robin: `loaders` build a fresh `runtime.Runner` per model.

    With `settle`, a model leaves the rounds (from `MIN_ROUNDS` on) once more rounds could not change a
    decision (`model_settled`): its comparison with every other model is decided (the interval of their
    round-by-round ratio wholly beyond the noise margin, or wholly within it), or, timed alone, its p50
    interval is within `TIGHT` of its p50; the others go on. A pair near the margin keeps timing to the cap,
    as before, however tight each model's own interval is: it is the ratio that decides. Comparisons use
    the rounds both models have (`noise.paired`).

    In round k the models are timed in turn starting from model k (mod n). Each block builds a fresh
    interpreter (so where its memory lands and how its thread pool starts are sampled too, not fixed for
    the whole run), invokes it once, warms it up and times `runs / rounds` invokes (`runs` in all). A
    slow model's blocks shrink so its timed runs stay within about `budget_s` (one run per round at
    least; its warm-up is then the first invoke alone), so slow reference kernels (int16x8) do not stall
    a sweep. Returns, per model, the fields of `results.Latency` that timing yields (p50 = the median of
    the round medians), or the exception a model raised (it is left out of the later rounds).
    """
    rounds = max(1, min(rounds, runs))
    models = [_Timed(load, sample, warmup, runs) for load, sample in zip(loaders, samples, strict=True)]
    n = len(models)
    for k in range(rounds):
        size = runs // rounds + (k < runs % rounds)  # `runs` in all, spread over the rounds
        for i in ((k + j) % n for j in range(n)):
            models[i].time_block(k, size, rounds, budget_s)
        if settle and k + 1 >= OVERWHELM_ROUNDS and _settle(models):
            break
    session, when = uuid.uuid4().hex[:12], datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    return [m.error if m.error is not None else {**m.stats(), "session": session, "timed": when} for m in models]


@dataclass
class _Timed:
    """One model's timing in progress: its blocks so far, and whether it is done (settled) or failed."""

    load: Callable[[], object]
    sample: object
    warmup: int
    fits: int  # timed runs per block that fit the budget, known after round 0
    times: list[float] = field(default_factory=list)
    medians: list[float] = field(default_factory=list)
    first: tuple[float, int] = (0.0, 0)
    spent: float = 0.0  # wall seconds in its blocks
    kept: object = None  # a slow model's interpreter, timed again each round (SLOW_MS)
    done: bool = False  # timed enough: its comparisons with every other model are decided
    error: Exception | None = None

    def time_block(self, k: int, size: int, rounds: int, budget_s: float) -> None:
        if self.error is not None or self.done:
            return
        warm = self.warmup if k == 0 else min(self.warmup, REWARM) if self.fits > 1 else 0  # slow: first invoke
        t0 = time.perf_counter()
        try:
            runner = self.kept or self.load()
            cap = budget_s * 1000 / rounds if k == 0 else None  # a slow model's first block sized as the rest
            first_ms, warm, block = _block(
                runner, self.sample, warm, min(size, self.fits), fresh=self.kept is None, cap_ms=cap
            )
        except Exception as e:  # noqa: BLE001 - the runtime's own error (InvokeError, ModelError), handed back
            self.error = e
            return
        finally:
            self.spent += time.perf_counter() - t0
        if k == 0:
            self.first = (first_ms, warm)
            self.fits = max(1, int(budget_s * 1000 / rounds / max(statistics.median(block), 1e-6)))
            self.kept = runner if first_ms >= SLOW_MS else None
        self.times += block
        self.medians.append(statistics.median(block))

    def stats(self) -> dict:
        return {**_stats(self.times, self.medians, *self.first), "seconds": self.spent}


def _settle(models: list[_Timed]) -> bool:
    """Mark each model still timing whose comparisons are decided; whether every one is."""
    running = [m for m in models if m.error is None]
    for m in running:
        if not m.done:
            m.done = model_settled(m.medians, [o.medians for o in running if o is not m])
    return all(m.done for m in running)


def settled(medians: list[list[float]]) -> bool:
    """Whether more rounds could change what the round medians say about any model (`model_settled`)."""
    return all(model_settled(m, medians[:i] + medians[i + 1 :]) for i, m in enumerate(medians))


def model_settled(mine: list[float], others: list[list[float]]) -> bool:
    """Whether more rounds of one model could change a comparison: each pair with another model is decided
    round by round over the rounds both have, slower or faster beyond `noise.MARGIN`, or the same within it
    (the decision `noise.compare_latency` makes on the finished records); a model timed alone, once its own
    interval is within `TIGHT` of its p50."""
    from optimize.measure.noise import MARGIN

    if not others:
        lo, hi = median_interval(mine)
        return len(mine) >= MIN_ROUNDS and hi - lo <= TIGHT * statistics.median(mine)

    def decided(a: list[float], b: list[float]) -> bool:
        common = min(len(a), len(b))
        ratios = [x / y for x, y in zip(a[:common], b[:common]) if y > 0]
        if len(ratios) < common:
            return False
        if common >= OVERWHELM_ROUNDS and (min(ratios) > OVERWHELM or max(ratios) < 1 / OVERWHELM):
            return True
        if common < MIN_ROUNDS:
            return False
        lo, hi = median_interval(ratios)
        return hi < 1 / (1 + MARGIN) or lo > 1 + MARGIN or (lo >= 1 / (1 + MARGIN) and hi <= 1 + MARGIN)

    return all(decided(mine, b) for b in others)


def warm_start(runner: Runner, sample: np.ndarray, warmup: int) -> tuple[float, int]:
    """The first invoke on `sample` (ms) and the warm-up after it: `warmup` runs, none after a first invoke
    of SLOW_MS or more (slow reference kernels: that invoke made the allocations a warm-up is for, and each
    more costs its whole run time); returns (first_ms, warm-up runs made)."""
    runner.set_input(sample)
    t0 = time.perf_counter()
    runner.invoke()
    first_ms = (time.perf_counter() - t0) * 1000
    warmup = warmup if first_ms < SLOW_MS else 0
    for _ in range(warmup):
        runner.it.invoke()
    return first_ms, warmup


def time_invoke(runner: Runner, sample: np.ndarray, warmup: int = 5, runs: int = 50, budget_s: float = 1.0) -> dict:
    """Latency the way benchmark_model reports it: first inference, warm-up, then steady-state stats.

    Timed runs stop at `runs` or once `budget_s` is spent (at least 5), so slow reference kernels
    (int16x8) do not stall a sweep; the count actually run is recorded.
    """
    first_ms, warmup = warm_start(runner, sample, warmup)
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < runs and (len(times) < 5 or time.perf_counter() - start < budget_s):
        t0 = time.perf_counter()
        runner.it.invoke()
        times.append((time.perf_counter() - t0) * 1000)
    times.sort()
    return {
        "first_ms": first_ms,
        "warmup_runs": warmup,
        "runs": len(times),
        "mean_ms": statistics.fmean(times),
        "std_ms": statistics.pstdev(times),
        "p25_ms": times[len(times) // 4],
        "p50_ms": times[len(times) // 2],
        "p75_ms": times[min(len(times) - 1, (3 * len(times)) // 4)],
        "p90_ms": times[min(len(times) - 1, int(len(times) * 0.9))],
        "min_ms": times[0],
    }

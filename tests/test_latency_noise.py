"""Noise-proof latency (issue 17): round-robin timing with a p50 interval, and comparisons that call two
candidates different only when their intervals separate, so re-timing an unchanged study never moves the
pick or the Pareto front. Noise is injected into hand-built records; no wall-clock time is asserted."""

from __future__ import annotations

import random
import shutil
import statistics

from study_fixtures import candidate, study

from optimize.core.results import Latency
from optimize.decide.choose import make_goals, pareto_front, recommend
from optimize.measure import noise, timing
from optimize.measure.noise import compare_latency, speed


def timed(c, medians: list[float], session: str | None = None):
    """The candidate as a round-robin timing would record it, from its round medians."""
    lo, hi = noise.median_interval(medians)
    lat = c.metrics.latency.model_copy(
        update={
            "p50_ms": statistics.median(medians),
            "rounds": len(medians),
            "round_p50s_ms": medians,
            "p50_low_ms": lo,
            "p50_high_ms": hi,
            "session": session,
        }
    )
    return c.model_copy(update={"metrics": c.metrics.model_copy(update={"latency": lat})})


#: (name, scheme, size, accuracy delta, true p50 in ms): float32 and int8 as fast as each other within
#: noise; dynamic clearly slower; a pruned float32 the same size as float32.
TRUE = [
    ("float32", "float32", 152_000, 0.0, 1.00),
    ("float16", "float16", 78_000, 0.0, 1.02),
    ("dynamic", "dynamic", 41_000, -0.003, 1.90),
    ("int8", "int8", 42_000, -0.008, 0.98),
    ("int8-b", "int8", 42_000, -0.008, 0.98),  # identical bytes, made by another chain
]


def retimed(seed: int, paired: bool = True):
    """One re-timing of an unchanged study: a drift per round common to every candidate (round-robin times
    them all within the round; here up to +-40%, a busy shared machine) plus noise per round and candidate
    (+-7%). `paired=False` drops the session: the records are then compared by their p50 intervals only."""
    rng = random.Random(seed)
    drift = [rng.uniform(0.6, 1.4) if paired else rng.uniform(0.9, 1.1) for _ in range(timing.ROUNDS)]
    cands = []
    for name, scheme, size, delta, p50 in TRUE:
        medians = [p50 * d * rng.uniform(0.93, 1.07) for d in drift]
        c = candidate(name, scheme, size=size, delta=delta, p50=p50)
        cands.append(timed(c, medians, f"s{seed}" if paired else None))
    return study(cands)


def test_two_candidates_differ_only_when_their_intervals_separate():
    base = candidate("a")
    slower = timed(candidate("b"), [1.5, 1.6, 1.55, 1.52, 1.58, 1.6, 1.51, 1.57, 1.54])
    close = timed(candidate("c"), [0.9, 1.2, 1.0, 1.1, 0.95, 1.05, 1.15, 0.98, 1.02])
    base = timed(base, [1.0, 1.02, 0.98, 1.01, 0.99, 1.03, 0.97, 1.0, 1.01])
    assert speed(slower, base) == "slower" and speed(base, slower) == "faster"
    assert speed(close, base) == "same" and compare_latency(close, base) == 0


def test_older_records_fall_back_to_the_quartiles_of_single_runs():
    lat = candidate("a", p50=1.0).metrics.latency.model_copy(update={"p25_ms": 0.9, "p75_ms": 1.2})
    assert lat.rounds is None and lat.interval == (0.9, 1.2)
    assert Latency.model_validate(lat.model_dump()).interval == (0.9, 1.2)


def test_candidates_timed_in_the_same_rounds_are_compared_round_by_round():
    drift = [1.0, 1.6, 0.7, 1.3, 0.9, 1.5, 0.8, 1.2, 1.1]  # the whole machine, round by round
    a = timed(candidate("a"), [d * 1.00 for d in drift], "s1")
    b = timed(candidate("b"), [d * 1.20 for d in drift], "s1")
    copy = timed(candidate("copy"), [d * 1.01 for d in drift], "s1")
    assert a.metrics.latency.interval[1] > b.metrics.latency.interval[0]  # the p50 intervals overlap...
    assert speed(b, a) == "slower" and speed(a, b) == "faster"  # ...but b is 1.2x a in every round
    assert speed(copy, a) == "same"  # 1% is within the margin
    for x in (a, b, copy):
        for y in (a, b, copy):
            assert compare_latency(x, y) == -compare_latency(y, x)  # the same answer either way round
    unpaired = timed(candidate("b"), [d * 1.20 for d in drift], "s2")  # another session: intervals only
    assert speed(unpaired, a) == "same"


def test_pick_and_front_are_stable_under_injected_noise():
    picks = {obj: set() for obj in ("size", "latency", "accuracy")}
    fronts, raw_fastest = set(), set()
    for seed in range(12):
        s = retimed(seed, paired=seed % 2 == 0)
        for obj in picks:
            picks[obj].add(recommend(s, "cpu", make_goals(objective=obj)).chosen)
        fronts.add(tuple(pareto_front(s.candidates)))
        raw_fastest.add(min(s.candidates, key=lambda c: c.p50_ms).name)
    assert all(len(p) == 1 for p in picks.values()), picks
    assert len(fronts) == 1, fronts
    assert len(raw_fastest) > 1  # ranking by the bare p50 would have flipped: the noise is real


def test_slower_facts_need_separated_intervals():
    s = retimed(0)
    rec = recommend(s, "cpu")
    slow = [f for f in rec.facts if "measured slower than float32" in f]
    assert len(slow) == 1 and slow[0].startswith("dynamic") and "(" in slow[0]  # p50 with its interval


def test_median_interval_order_statistics():
    xs = [5, 1, 9, 3, 7, 2, 8, 4, 6]
    assert noise.median_interval(xs) == (2, 8)  # 2nd and 8th of 9: 96% coverage
    assert noise.median_interval([3, 1, 2, 5, 4]) == (1, 5)  # too few for 95%: the range
    assert noise.median_interval([2.0]) == (2.0, 2.0)


class FakeRunner:
    """Records each invoke in a shared log; `fails` makes its first invoke raise, as a kernel check would."""

    def __init__(self, name: str, log: list[str], fails: bool = False):
        self.name, self.log, self.fails = name, log, fails
        self.it = self

    def set_input(self, sample) -> None:
        pass

    def invoke(self) -> None:
        if self.fails:
            raise RuntimeError("DIV node 3")
        self.log.append(self.name)


def loaders(names: str, log: list[str], loads: list[str], fails: str = ""):
    """A fresh fake runner per call, each load logged: what time_rounds asks of every block."""

    def load(name):
        loads.append(name)
        return FakeRunner(name, log, fails=name in fails)

    return [lambda n=n: load(n) for n in names]


def test_time_rounds_is_round_robin_rotates_and_loads_fresh_per_block():
    log: list[str] = []
    loads: list[str] = []
    out = timing.time_rounds(loaders("abc", log, loads), [None] * 3, warmup=0, runs=9, rounds=3)
    assert loads == list("abc" + "bca" + "cab")  # every block a fresh interpreter, the order rotated
    for r in out:
        assert r["rounds"] == 3 and r["runs"] == 9 and len(r["round_p50s_ms"]) == 3
        assert r["p50_low_ms"] <= r["p50_ms"] <= r["p50_high_ms"]


def test_time_rounds_leaves_out_a_model_that_fails_to_run():
    log: list[str] = []
    loads: list[str] = []
    out = timing.time_rounds(loaders("ab", log, loads, fails="b"), [None, None], runs=4)
    assert isinstance(out[1], RuntimeError) and out[0]["runs"] == 4 and "b" not in log
    assert loads.count("b") == 1  # not loaded again after it failed


def test_time_task_records_rounds_and_intervals(float_tflite, tmp_path):
    """The real seam: every candidate of a timing task timed together, each with its interval."""
    from optimize.engine.work import TimingTask, time_task

    for name in ("a", "b"):
        shutil.copy(float_tflite, tmp_path / f"{name}.tflite")
    cands = tuple(candidate(n, p50=None).model_copy(update={"artifact": f"{n}.tflite"}) for n in ("a", "b"))
    new = time_task(TimingTask(cands, tmp_path, None, threads=1, runs=18))
    for c in new:
        lat = c.metrics.latency
        assert timing.MIN_ROUNDS <= lat.rounds <= timing.ROUNDS and len(lat.round_p50s_ms) == lat.rounds
        assert lat.runs == sum(18 // timing.ROUNDS + (k < 18 % timing.ROUNDS) for k in range(lat.rounds))
        assert lat.p50_low_ms <= lat.p50_ms <= lat.p50_high_ms
        assert c.node is not None
        assert new[0].metrics.latency.rounds == lat.rounds and new[0].metrics.latency.session == lat.session
    old = time_task(TimingTask(cands, tmp_path, None, threads=1, runs=18, interleave=False))
    assert all(c.metrics.latency.rounds is None and c.metrics.latency.runs == 18 for c in old)


def test_a_slow_candidate_never_rides_a_chain_of_same_within_the_noise():
    """b is a within the margin, c is b within it, but c is measurably slower than a: c is not picked for
    latency, however small it is."""
    s = study(
        [
            candidate("a", size=150_000, p50=1.00),
            candidate("b", size=80_000, p50=1.12),
            candidate("c", size=40_000, p50=1.25),
        ]
    )
    rec = recommend(s, "cpu", make_goals(objective="latency"))
    assert rec.ranked == ["b", "a"]  # c, slower than a beyond the noise, is never the cpu's pick (issue 40)
    assert next(r.reason for r in rec.rejected if r.candidate == "c").startswith("measured slower than float32")
    assert speed(s.candidate("c"), s.candidate("b")) == "same" and speed(s.candidate("c"), s.candidate("a")) == "slower"


def test_timing_stops_once_more_rounds_could_not_change_a_decision():
    """Issue 27: rounds stop early when every comparison is decided or every interval is tight, never
    before MIN_ROUNDS; a pair sitting on the noise margin keeps timing to the cap (ROUNDS)."""
    rng = random.Random(0)

    def rounds(p50s: list[float], noise_frac: float, n: int) -> list[list[float]]:
        return [[p * (1 + rng.uniform(-noise_frac, noise_frac)) for _ in range(n)] for p in p50s]

    n = timing.MIN_ROUNDS
    assert timing.settled(rounds([1.0, 2.0, 0.5], 0.04, n))  # clearly apart: decided
    assert timing.settled(rounds([1.0, 1.01], 0.01, n))  # the same within the margin, round after round
    assert timing.settled(rounds([1.0], 0.01, n))  # alone, and tight
    assert not timing.settled([[1.0 + 0.3 * (k % 2) for k in range(n)]])  # alone, and not tight
    # each model's interval is tight, but their ratio straddles the 15% margin: keep timing
    assert not timing.settled([[1.0] * n, [1.0 + (0.16 if k % 2 else 0.13) for k in range(n)]])
    # one round's ratio beyond the margin among ratios within it: not decided yet
    assert not timing.settled([[1.0] * n, [1.05] * (n - 1) + [1.30]])
    assert not timing.settled([[1.0] * (n - 1) + [0.0], [1.0] * n])  # a zero median: no ratio, undecided


def test_time_rounds_stops_when_settled_and_not_before_min_rounds(monkeypatch):
    log: list[str] = []
    loads: list[str] = []
    monkeypatch.setattr(timing, "model_settled", lambda mine, others: True)
    out = timing.time_rounds(loaders("ab", log, loads), [None, None], warmup=0, runs=30, rounds=15)
    assert all(r["rounds"] == timing.OVERWHELM_ROUNDS for r in out)  # asked from then on (model_settled decides)
    monkeypatch.setattr(timing, "model_settled", lambda mine, others: False)
    out = timing.time_rounds(loaders("ab", log, loads), [None, None], warmup=0, runs=30, rounds=15)
    assert all(r["rounds"] == 15 and r["runs"] == 30 for r in out)
    out = timing.time_rounds(loaders("ab", log, loads), [None, None], warmup=0, runs=30, rounds=15, settle=False)
    assert all(r["rounds"] == 15 for r in out)


def test_a_settled_model_leaves_the_rounds_and_the_others_go_on(monkeypatch):
    """A model whose comparisons are decided is not timed again; the rest keep their rounds, and the two
    records are still compared round by round, over the rounds both have."""
    asked: list[int] = []

    def first_only(mine, others):
        asked.append(len(mine))
        return len(asked) == 1  # the first model asked (at OVERWHELM_ROUNDS) settles, no other ever does

    monkeypatch.setattr(timing, "model_settled", first_only)
    log: list[str] = []
    loads: list[str] = []
    a, b = timing.time_rounds(loaders("ab", log, loads), [None, None], warmup=0, runs=30, rounds=15)
    assert a["rounds"] == timing.OVERWHELM_ROUNDS and b["rounds"] == 15
    assert loads.count("a") == timing.OVERWHELM_ROUNDS and loads.count("b") == 15
    la = Latency(runtime="x", threads=1, xnnpack=True, init_ms=0, **a)
    lb = Latency(runtime="x", threads=1, xnnpack=True, init_ms=0, **b)
    assert noise.paired(la, lb)
    _, lo, hi = noise.ratio_interval(la, lb)
    assert lo <= hi


def test_a_slow_model_keeps_its_interpreter_across_rounds(monkeypatch):
    """A model slow enough to be timed on reference kernels (first invoke >= SLOW_MS) is loaded once."""
    monkeypatch.setattr(timing, "SLOW_MS", 0.0)  # every fake model counts as slow
    log: list[str] = []
    loads: list[str] = []
    out = timing.time_rounds(loaders("ab", log, loads), [None, None], warmup=0, runs=6, rounds=3, settle=False)
    assert loads == ["a", "b"] and all(r["rounds"] == 3 for r in out)


def test_an_overwhelming_pair_is_decided_early_and_a_close_one_not():
    """A model several times slower than another in every round (int16x8 on reference kernels) is decided from
    OVERWHELM_ROUNDS rounds on; a pair near the margin, or a model timed alone, still needs MIN_ROUNDS."""
    n = timing.OVERWHELM_ROUNDS
    slow, fast = [200.0, 210.0, 190.0][:n], [4.0, 4.1, 3.9][:n]
    assert timing.model_settled(slow, [fast]) and timing.model_settled(fast, [slow])
    assert not timing.model_settled([4.0, 4.2, 3.8][:n], [fast])  # the same within noise: more rounds
    assert not timing.model_settled([200.0, 3.0, 190.0][:n], [fast])  # one round against it: more rounds
    assert not timing.model_settled(slow, [])  # alone: its own interval, from MIN_ROUNDS on
    assert timing.OVERWHELM_ROUNDS < timing.MIN_ROUNDS

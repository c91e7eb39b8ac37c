"""Each target judged on its own terms (issue 43) and a cpu pick never slower than float32 (issue 40): host-CPU
latency ranks the cpu only; the gpu by its observed latency where it was timed; latency shown with its spread,
and a cached one said to be so."""

from __future__ import annotations

from study_fixtures import candidate, latency, study

from optimize.core.results import OnTarget, TargetFidelity
from optimize.decide.choose import make_goals, recommend
from optimize.present.report_text import candidates_table, legend, next_steps


def slow_dynamic_study():
    """The selfie segmenter's shape of figures: dynamic the smallest but 1.8x float32's p50 on the host CPU
    (hybrid kernels), int8 a little larger and faster, float16 half of float32."""
    return study(
        [
            candidate("float32", size=460_000, p50=8.7),
            candidate("float16", "float16", size=240_000, p50=8.9),
            candidate("dynamic", "dynamic", size=140_000, p50=15.6),
            candidate("int8", "int8", size=150_000, delta=-0.001, p50=6.0),
        ]
    )


def test_the_gpu_pick_is_decided_on_size_and_quality_and_says_so():
    s = slow_dynamic_study()
    for target in ("gpu", "coreml", "nnapi", "hexagon"):
        rec = recommend(s, target)
        assert not any("slower" in r.reason for r in rec.rejected), (target, rec.rejected)
        assert not any("speed" in w for w in rec.why), rec.why
        said = [f for f in rec.facts if f.startswith("Ranked on size and quality, not speed")]
        assert said and f"host-CPU latency does not predict the {target}" in said[0], rec.facts
    assert recommend(s, "gpu").chosen == "dynamic"  # the smallest the GPU runs whole, as accurate
    assert "dynamic" in recommend(s, "gpu").pareto and "float32" not in recommend(s, "gpu").pareto
    cpu = recommend(s, "cpu")  # the host CPU's own latency: dynamic is slower than the file it replaces
    assert cpu.chosen == "int8" and cpu.rejected[0].reason.startswith("measured slower than float32 on this CPU")


def test_a_latency_goal_on_an_untimed_target_is_not_judged_by_the_host():
    s = slow_dynamic_study()
    rec = recommend(s, "gpu", make_goals(max_latency_ms=10))
    assert rec.chosen is None and all("latency not measured" in r.reason for r in rec.rejected)
    assert any(f.startswith("--max-latency-ms: the gpu's latency was not measured") for f in rec.facts)


def _observed(c, p50: float):
    gpu = TargetFidelity(reference="float32.tflite", samples=10, outputs=[], method="observed", how="device",
                         latency=latency(p50).model_copy(update={"runtime": "ML Drift on a test GPU (observed)"}))  # fmt: skip
    return c.model_copy(update={"metrics": c.metrics.model_copy(update={"on_target": OnTarget(gpu=gpu)})})


def test_the_gpu_ranks_by_its_observed_latency_where_every_candidate_was_timed_there():
    s = slow_dynamic_study()
    gpu_ms = {"float32": 2.0, "float16": 1.0, "dynamic": 2.1, "int8": 2.0}
    timed = s.model_copy(update={"candidates": [_observed(c, gpu_ms[c.name]) for c in s.candidates]})
    rec = recommend(timed, "gpu", make_goals(objective="latency"))
    assert rec.chosen == "float16" and rec.goals.objective == "latency"
    assert any("Latency as the gpu runs each candidate: ML Drift on a test GPU" in f for f in rec.facts)
    # one candidate not observed: no partial ranking by the device, none by the host either
    partial = timed.model_copy(update={"candidates": [*timed.candidates[:3], s.candidates[3]]})
    assert any(f.startswith("Ranked on size and quality") for f in recommend(partial, "gpu").facts)


def test_the_gpu_accelerators_own_runs_become_a_latency_record():
    from optimize.engine.on_gpu import gpu_latency

    lat = gpu_latency([40.0, 1.0, 1.2, 0.9, 1.1, 1.0], "observed: LiteRT's GPU accelerator (ML Drift) on X", 2)
    assert lat.first_ms == 40.0 and lat.runs == 5 and lat.p50_ms == 1.0 and lat.p50_low_ms <= 1.0 <= lat.p50_high_ms
    assert lat.runtime.endswith("on X (observed)") and lat.rounds is None
    assert gpu_latency([40.0], "observed: x", 2) is None


def test_a_stated_slowdown_bound_is_judged_beyond_the_noise():
    s = slow_dynamic_study()
    assert recommend(s, "cpu", make_goals(max_slowdown=1.5)).chosen == "int8"  # 1.79x is beyond 1.5
    rec = recommend(s, "cpu", make_goals(max_slowdown=2))
    assert rec.chosen == "dynamic"
    assert any(w.startswith("Size costs speed: dynamic measured slower than float32") for w in rec.why), rec.why


def test_the_summary_says_when_size_cost_speed():
    lines = "\n".join(next_steps(slow_dynamic_study(), None))
    assert (
        "int8.tflite (int8: 0.33x float32's size, Δ -0.10 on 360); dynamic is smaller but 1.79x float32's p50" in lines
    )
    assert "the cpu's no slower than float32, the others on size and quality" in lines


def test_latency_is_shown_with_its_spread_and_a_cached_one_says_so():
    s = slow_dynamic_study()
    cands = []
    for c in s.candidates:
        lat = c.metrics.latency.model_copy(
            update={"p50_low_ms": c.p50_ms * 0.95, "p50_high_ms": c.p50_ms * 1.1, "timed": "2026-11-28T12:59:07+00:00"}
        )
        cands.append(c.model_copy(update={"cached": True, "metrics": c.metrics.model_copy(update={"latency": lat})}))
    table = candidates_table(cands, cands[0], width=120)
    spread = next(col for col in table.columns if col.header == "±")
    assert list(spread._cells) == ["10%"] * 4
    said = " ".join(legend(cands, cands[0]))
    assert "± = the half-width of each p50's ~95% interval: 10%." in said
    assert "The p50 of every candidate comes from the cache: the run that made it (timed 2026-11-28 12:59 UTC)" in said
    fresh = " ".join(legend(s.candidates, s.candidates[0]))
    assert "from the cache" not in fresh
    facts = recommend(s.model_copy(update={"candidates": cands}), "cpu").facts
    assert any(f.startswith("The latency of 4 candidate(s) comes from the result cache") for f in facts), facts
    assert not any("result cache" in f for f in recommend(s, "cpu").facts)


def test_the_gpus_accuracy_is_compared_with_the_cpu_baseline_not_with_itself():
    """A candidate measured before its baseline stored a GPU accuracy change of 0 (compared with itself): ties
    on size then went to the least accurate. The gpu target reads the change from the two accuracies."""
    s = study(
        [
            candidate("float32", size=300_000, delta=0.0),
            candidate("a", "int8", size=72_744, delta=-0.03),
            candidate("b", "int8", size=72_744, delta=0.0),
            candidate("c", "int8", size=72_744, delta=-0.01),
        ]
    )
    cands = []
    for c in s.candidates:
        gpu = TargetFidelity(
            **dict(c.metrics.fidelity), method="emulated", accuracy=c.metrics.accuracy, accuracy_delta=0.0
        )
        cands.append(c.model_copy(update={"metrics": c.metrics.model_copy(update={"on_target": OnTarget(gpu=gpu)})}))
    rec = recommend(s.model_copy(update={"candidates": cands}), "gpu", make_goals(max_accuracy_drop=0.05))
    assert rec.ranked[:3] == ["b", "c", "a"], rec.ranked

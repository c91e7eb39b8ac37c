"""Sweeps: the float32 baseline plus many recipes on one model, written as one study.json.

    plan -> cache lookup -> produce (executor) -> time -> store -> Study

`open_run` plans one model's sweep (a `Run`); `optimize.schedule` drives one or many runs (a zoo) through
one executor (worker processes, this process, or Ray): the float32 baseline first because every other
candidate is compared with it, then timed together in rounds per node, then cached by content. A sweep where
nothing worked exits 1 with the causes.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from . import _tf, measure, models, paths, registry, weights
from .cache import ResultCache, key_for, result_cache
from .data import Dataset, take
from .errors import ModelError, NothingWorked, RecipeError
from .pipeline import MeasureOptions, _key, check_data, environment, open_inputs, resolve
from .progress import Progress
from .recipe import Recipe, as_given, build, load_recipe
from .registry import Stage
from .results import Candidate, Dropped, Study
from .vocab import PTQ_SCHEMES, Backend, Scheme, Target
from .work import Settings

log = logging.getLogger(__name__)
COVERAGE_WARNING = 0.05  # warn when more of the test values than this lie outside the calibrated range

#: The default sweep: the float baseline, every post-training scheme and the useful chains.
DEFAULT_SWEEP: tuple[tuple[str, list[dict]], ...] = (
    ("float32", [{"technique": "convert", "scheme": "float32"}]),
    ("float16", [{"technique": "convert", "scheme": "float16"}]),
    ("dynamic", [{"technique": "convert", "scheme": "dynamic"}]),
    ("int8", [{"technique": "convert", "scheme": "int8"}]),
    ("int8-int8io", [{"technique": "convert", "scheme": "int8", "io": "int8"}]),
    ("int16x8", [{"technique": "convert", "scheme": "int16x8"}]),
    ("prune-int8", [{"technique": "prune"}, {"technique": "convert", "scheme": "int8"}]),
    ("cluster-int8", [{"technique": "cluster"}, {"technique": "convert", "scheme": "int8"}]),
    (
        "prune-cluster-int8",
        [
            {"technique": "prune"},
            {"technique": "cluster", "preserve_sparsity": True},
            {"technique": "convert", "scheme": "int8"},
        ],
    ),
    ("qat-int8", [{"technique": "qat"}, {"technique": "convert", "scheme": "int8"}]),
)

#: The shipped recipe made for each target: a targeted sweep always tries it.
TARGET_RECIPE: dict[Target, str] = {
    Target.CPU: "fastest-cpu",
    Target.GPU: "mobile-gpu",
    Target.NNAPI: "android-npu",
    Target.HEXAGON: "hexagon-dsp",
    Target.COREML: "coreml",
    Target.EDGETPU: "edgetpu-mcu",
    Target.MCU: "edgetpu-mcu",
}


def default_recipes(include_training: bool = True, backend: str | None = None) -> list[Recipe]:
    out = []
    for name, steps in DEFAULT_SWEEP:
        if not include_training and any(s["technique"] in ("prune", "cluster", "qat") for s in steps):
            continue
        out.append(build(name, steps).with_backend(backend))
    return out


TRAINING = ("prune", "cluster", "qat")


def training_blocker(src: models.ModelSource, ds: Dataset | None) -> str | None:
    """Why pruning, clustering and QAT cannot run on this model and data, or None when they can."""
    if src.kind == "tflite":
        return "the model is a .tflite: pruning, clustering and QAT need the Keras model it was made from"
    if src.kind == "savedmodel":
        return "the model is a SavedModel: pruning, clustering and QAT need a Keras model (tfmot)"
    if ds is None or ds.y_train is None:
        return "no labelled training data (y or y_train) to fine-tune on"
    if src.kind == "keras3":
        from . import rebuild

        try:
            rebuild.keras2_path(src, ds)
        except ModelError as e:
            return e.problem
    return None


def _defaults(src: models.ModelSource, ds: Dataset | None, backend, dropped: list[Dropped]) -> list[Recipe]:
    """The default sweep; int4 (4-bit Dense/MatMul weights) only where those hold most of the weights."""
    int4 = [build("int4", [{"technique": "quantize", "scheme": "int4"}])] if weights.mostly_dense(src) else []
    if src.kind == "tflite":
        schemes = [s for s in PTQ_SCHEMES if s != Scheme.INT4]
        return [as_given("float32")] + [build(s, [{"technique": "quantize", "scheme": s}]) for s in schemes] + int4
    why = training_blocker(src, ds)
    if why:
        names = [n for n, steps in DEFAULT_SWEEP if any(s["technique"] in TRAINING for s in steps)]
        dropped.append(Dropped(recipes=names, reason=why))
    return default_recipes(why is None, backend) + [r.with_backend(backend) for r in int4]


def _is_baseline(r: Recipe) -> bool:
    return r.scheme == "float32" and len(r.steps) <= 1


def _with_baseline(recipes: list[Recipe], src: models.ModelSource) -> list[Recipe]:
    """Given recipes, plus the float32 baseline first when none of them is one: every candidate is
    compared with it (fidelity, accuracy delta, latency ratio)."""
    if any(_is_baseline(r) for r in recipes):
        return recipes
    name = "float32" if all(r.name != "float32" for r in recipes) else "float32-baseline"
    if src.kind == "tflite":
        return [as_given(name), *recipes]
    return [build(name, [{"technique": "convert", "scheme": "float32"}]), *recipes]


def _with_target_recipe(
    recipes: list[Recipe], target: Target, src: models.ModelSource, backend, dropped: list[Dropped]
) -> list[Recipe]:
    """The target's own shipped recipe added, unless a recipe with the same resolved steps is there already
    (or it needs a technique this model cannot take: then it is dropped, with the reason)."""
    extra = load_recipe(TARGET_RECIPE[target]).with_backend(backend)
    try:
        extra = resolve(extra, src) if extra.steps else extra
    except ModelError as e:
        dropped.append(Dropped(recipes=[extra.name], reason=e.problem))
        return recipes
    if any(r.steps and resolve(r, src).hash == extra.hash for r in recipes):
        return recipes
    return [*recipes, extra.model_copy(update={"targets": (target,)})]


def plan(
    src: models.ModelSource,
    ds: Dataset | None,
    recipes: list[Recipe] | None,
    backend: str | None,
    target: Target | None = None,
    dropped: list[Dropped] | None = None,
) -> list[Recipe]:
    """The resolved recipes a sweep will run: the defaults for this kind of model, or the given ones, plus
    the target's own recipe when a target is named. Default recipes left out are added to `dropped`, with
    the reason, and logged."""
    dropped = [] if dropped is None else dropped
    if recipes is None:
        recipes = _defaults(src, ds, backend, dropped)
    else:
        recipes = _with_baseline([r.with_backend(backend) for r in recipes], src)
    if target is not None and src.kind != "tflite":
        recipes = _with_target_recipe(recipes, Target(target), src, backend, dropped)
    if ds is None:
        recipes = _without_data(recipes, dropped)
    for d in dropped:
        log.warning("Dropped %s: %s", ", ".join(d.recipes), d.reason)
    names = [r.name for r in recipes]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup:
        raise RecipeError(f"Two recipes are named {dup!r}.", "Give every recipe in a sweep its own name.")
    return [resolve(r, src) if r.steps else r for r in recipes]


def _without_data(recipes: list[Recipe], dropped: list[Dropped]) -> list[Recipe]:
    left = [r.name for r in recipes if r.scheme in ("int8", "int16x8")]
    if left:
        dropped.append(Dropped(recipes=left, reason="no data: int8 and int16x8 need calibration samples"))
    return [r for r in recipes if r.scheme not in ("int8", "int16x8")]


def with_samples(recipe: Recipe, n: int) -> Recipe:
    """The recipe with `n` calibration samples on every calibrated step."""
    if not recipe.steps:
        return recipe
    flat = [{**s.flat(), "samples": n} if "samples" in type(s.params).model_fields else s.flat() for s in recipe.steps]
    return recipe.model_copy(update={"steps": build(recipe.name, flat).steps})


def _groups(recipes: list[Recipe]) -> list[list[Recipe]]:
    """Recipes that start with the same Keras step run together, so shared prefixes run once
    (prune -> int8 and prune -> cluster -> int8 prune once)."""
    groups: dict[str, list[Recipe]] = {}
    for r in recipes:
        groups.setdefault(group_key(r.steps), []).append(r)
    return list(groups.values())


def group_key(steps) -> str:
    """Which task a recipe (or candidate) joins: the recipes sharing their first Keras step run together."""
    keras = [s.model_dump(mode="json") for s in steps if registry.get(s.technique).stage is Stage.KERAS]
    return _key(keras[:1])


def default_jobs(n_groups: int) -> int:
    """Workers: one per core, at most one per 4 GiB of memory (converting a large model takes ~3.6 GB)."""
    try:
        mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        mem_gib = 8
    return max(1, min(os.cpu_count() or 1, int(mem_gib // 4), n_groups))


def _as_baseline(c: Candidate) -> Candidate:
    """The baseline's accuracy delta is zero by definition (it is what the others are compared with)."""
    if c.ok and c.metrics.accuracy is not None and c.metrics.accuracy_delta is None:
        return c.model_copy(update={"metrics": c.metrics.model_copy(update={"accuracy_delta": 0.0})})
    return c


@dataclass
class Run:
    """One model's sweep: its inputs, plan and bookkeeping (`optimize.schedule` drives it)."""

    src: models.ModelSource
    ds: Dataset | None
    out_dir: Path
    recipes: list[Recipe]
    settings: dict
    cache: ResultCache
    model: str = "demo"  # as the user named it (study.json's `model`)
    tag: str = ""  # the run's name among others (a zoo's model name)
    done: dict[str, Candidate] = field(default_factory=dict)
    dropped: list[Dropped] = field(default_factory=list)
    observe: tuple[str, ...] = ()  # delegates observed on this machine's devices, after timing
    final: Path | None = None  # while it runs, `out_dir` is a staging folder inside this one (schedule)

    @property
    def baseline(self) -> Recipe | None:
        return next((r for r in self.recipes if _is_baseline(r)), None)

    @property
    def task_settings(self) -> Settings:
        s = self.settings
        return Settings(s["threads"], s["eval_samples"], s["delegates"])

    def keys(self) -> dict[str, str]:
        common = {"model": self.src.fingerprint, "data": self.ds.fingerprint if self.ds else None}
        common["settings"] = self.settings
        base = self.baseline

        def steps(r: Recipe) -> list:
            return [s.model_dump(mode="json") for s in r.steps]

        base_key = key_for(steps=steps(base), **common) if base else None
        return {
            r.name: key_for(steps=steps(r), baseline=None if r is base else base_key, **common) for r in self.recipes
        }

    def reuse(self, progress: Progress, on_candidate=None) -> None:
        """Every recipe not done yet that the cache holds, taken from it."""
        keys = self.keys()
        for r in self.recipes:
            if r.name in self.done:
                continue
            hit = self.cache.get(keys[r.name], r.name, self.out_dir)
            if hit is not None:
                log.info("  %s: reused from the cache", self.label(r.name))
                self.done[r.name] = hit
                progress.advance(self.label(r.name), hit.ok)
                if on_candidate:
                    on_candidate(hit)

    def misses(self) -> list[Recipe]:
        return [r for r in self.recipes if r.name not in self.done]

    def label(self, name: str) -> str:
        return f"{self.tag}/{name}" if self.tag else name

    @property
    def sample(self):
        """One test input, for timing."""
        return take(self.ds.x_test, slice(0, 1)) if self.ds is not None else None

    def store(self, cands: list[Candidate], on_candidate=None) -> None:
        """Finished (timed) candidates: cached by content and kept."""
        keys = self.keys()
        for c in cands:
            self.cache.put(keys[c.name], c, self.out_dir)
            self.done[c.name] = c
            if on_candidate:
                on_candidate(c)

    def rescue(self) -> bool:
        """Add the accuracy-rescue candidate when full int8 breaks accuracy (see `_rescue`)."""
        extra = _rescue(self)
        if extra is not None:
            self.recipes.append(extra)
        return extra is not None

    def study(self, executor: str = "local") -> Study:
        """The finished study, saved as out_dir/study.json."""
        study = _study(self, self.model, self.settings["threads"], executor)
        if self.observe:  # after timing, so the accelerator's threads never disturb a measurement
            from .delegates.observe import observe_study

            study = observe_study(study, self.out_dir, Progress())
        study.save(self.out_dir / "study.json")
        return study


def open_run(
    model: str | Path | None = None,
    data: str | Path | Dataset | None = None,
    output: str | Path = "optimize-out",
    recipes: list[Recipe] | None = None,
    threads: int = 2,
    backend: Backend | str | None = None,
    delegates: bool = True,
    runs: int = 50,
    eval_samples: int = measure.DEFAULT_SAMPLES,
    cache: bool | str = True,
    target: Target | str | None = None,
    measuring: MeasureOptions | None = None,
    calibration_samples: int | None = None,
    trust_model_code: bool = False,
    tag: str = "",
    observe: tuple[str, ...] = (),
) -> Run:
    """One model's sweep, planned and checked (one clear line for bad inputs, before anything is written)."""
    src, ds = open_inputs(model, data, measuring=measuring, trust=trust_model_code)
    dropped: list[Dropped] = []
    planned = plan(src, ds, recipes, backend, target, dropped)
    if calibration_samples is not None:
        planned = [with_samples(r, calibration_samples) for r in planned]
    check_data(src, ds)  # before anything is written
    store = result_cache(cache)
    out_dir = paths.output_dir(output)
    settings = {"threads": threads, "runs": runs, "eval_samples": eval_samples, "delegates": delegates}
    settings["versions"] = _tf.versions()
    label = "demo" if model is None else str(model)
    return Run(src, ds, out_dir, planned, settings, store, model=label, tag=tag, dropped=dropped, observe=observe)


def sweep(
    model: str | Path | None = None,
    data: str | Path | Dataset | None = None,
    output: str | Path = "optimize-out",
    recipes: list[Recipe] | None = None,
    threads: int = 2,
    backend: Backend | str | None = None,
    delegates: bool = True,
    runs: int = 50,
    on_candidate: Callable[[Candidate], None] | None = None,
    eval_samples: int = measure.DEFAULT_SAMPLES,
    jobs: int | None = None,
    cache: bool | str = True,
    target: Target | str | None = None,
    progress: Progress | None = None,
    measuring: MeasureOptions | None = None,
    calibration_samples: int | None = None,
    trust_model_code: bool = False,
    observe: tuple[str, ...] = (),
    executor: str = "local",
    ray_address: str | None = None,
) -> Study:
    """The float32 baseline plus every recipe, each measured against it; written to output/study.json.

    Unchanged candidates come from the result cache (`cache=False` forces work; a URL such as
    `s3://bucket/prefix` or `file:///path` puts it there). The rest run in `jobs` worker processes (0: in
    this process) or, with `executor="ray"`, as Ray tasks (`ray_address`; default a local Ray started for
    the run), then are timed together in rotating rounds. `target` adds the target's own shipped recipe.
    `observe=("gpu",)` adds the GPU accelerator's observed report to every candidate where this machine
    has a device it accepts. `refuse_if_nothing_worked(study)` turns a study where nothing worked into exit 1.
    """
    from .delegates.observe import check as observable
    from .schedule import run_all

    observable(observe)  # only what can be observed here: one line, before any work
    run = open_run(
        model,
        data,
        output,
        recipes,
        threads,
        backend,
        delegates,
        runs,
        eval_samples,
        cache,
        target,
        measuring,
        calibration_samples,
        trust_model_code,
        observe=observe,
    )
    (study,) = run_all([run], jobs, progress, executor, ray_address, on_candidate)
    return study


def _study(run: Run, model, threads: int, executor: str = "local") -> Study:
    base = run.baseline
    if base is not None and base.name in run.done:
        run.done[base.name] = _as_baseline(run.done[base.name])
    labelled = next((c.metrics.accuracy for c in run.done.values() if c.ok and c.metrics.accuracy), None)
    outside = _coverage(run)
    return Study(
        created=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        model=model,
        model_fingerprint=run.src.fingerprint,
        data=run.ds.source if run.ds else None,
        task=labelled.task if labelled else None,
        calibration_outside=outside,
        baseline=base.name if base else "float32",
        environment=environment(threads),
        executor=executor,
        candidates=[run.done[r.name] for r in run.recipes],
        dropped=run.dropped,
    )


#: When plain int8 loses more than this, a sweep adds the selective (mixed int8) candidate.
RESCUE_DROP = 0.01  # classification: one point of top-1
RESCUE_INCREASE = 0.05  # regression: 5% more error


def _plain_int8(run: Run) -> Candidate | None:
    """The sweep's post-training int8 candidate made by LiteRT Quantizer with no Keras step, if it ran."""
    for r in run.recipes:
        keras = any(registry.get(s.technique).stage is Stage.KERAS for s in r.steps)
        made = run.done.get(r.name)
        if made is not None and r.scheme == "int8" and r.made_by == "litert" and not keras:
            # the calibrator stood in for LiteRT Quantizer (an LSTM it leaves float): no per-op search there
            return None if made.backend == Backend.CALIBRATOR else made
    return None


def _rescue(run: Run) -> Recipe | None:
    """The selective-quantization candidate, when full int8 breaks accuracy and none was planned: it tries
    the rescue that keeps 8 bits (optimize.rescue) before raising any op."""
    int8 = _plain_int8(run)
    if int8 is None or not int8.ok or any(s.technique == "selective" for r in run.recipes for s in r.steps):
        return None
    m = int8.metrics
    drop = m.accuracy_delta is not None and m.accuracy_delta < -RESCUE_DROP
    worse = m.error_ratio is not None and m.error_ratio > 1 + RESCUE_INCREASE
    if not (drop or worse):
        return None
    lost = f"lost {-m.accuracy_delta * 100:.1f} points" if drop else f"made the error x{m.error_ratio:.2f}"
    log.warning("%s %s: adding mixed-int8 (8-bit rescue first, then ops raised if needed).", int8.name, lost)
    budget = {"max_accuracy_drop": 0.005} if drop else {"max_error_increase": 0.10}
    return resolve(build("mixed-int8", [{"technique": "convert"}, {"technique": "selective", **budget}]), run.src)


def _coverage(run: Run) -> dict[str, float]:
    """How much of the test data lies outside the calibrated range, per input; a warning when it is a lot."""
    from .data import coverage

    if run.ds is None or not any(r.needs_calibration for r in run.recipes):
        return {}
    samples = max((getattr(s.params, "samples", 0) for r in run.recipes for s in r.steps), default=200) or 200
    outside = coverage(run.ds, samples)
    for name, share in outside.items():
        if share > COVERAGE_WARNING:
            log.warning(
                "%.0f%% of the test values of input %s lie outside the calibration samples' range: int8 will clip "
                "them. Calibrate on data that covers what the model will see (--calibration).",
                share * 100,
                name,
            )
    return outside


def refuse_if_nothing_worked(study: Study) -> None:
    """Raise NothingWorked (exit 1) with the causes when no candidate of a study worked."""
    if not study.candidates or any(c.ok for c in study.candidates):
        return
    causes = Counter((c.error or "not measured")[:100] for c in study.candidates)
    summary = "; ".join(f"{n} x {why}" for why, n in causes.most_common(3))
    raise NothingWorked(
        f"All {len(study.candidates)} candidates failed: {summary}.",
        "See study.json for each candidate's error; fix the first cause and run again.",
    )

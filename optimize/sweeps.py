"""Sweeps: the float32 baseline plus many recipes on one model, produced in worker processes, timed
one at a time, cached by content, and written as one study.json.

The default sweep covers every post-training scheme and the useful Keras chains; a float .tflite
input gets its post-training schemes through LiteRT Quantizer.
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from . import _tf, measure, models, registry, runtime
from .data import Dataset
from .errors import RecipeError
from .pipeline import (
    Log,
    Workspace,
    _key,
    check_data,
    environment,
    make_candidate,
    open_inputs,
    resolve,
)
from .recipe import Recipe, as_given, build
from .registry import Stage
from .results import Candidate, Study
from .vocab import PTQ_SCHEMES

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


def default_recipes(include_training: bool = True, backend: str | None = None) -> list[Recipe]:
    out = []
    for name, steps in DEFAULT_SWEEP:
        if not include_training and any(s["technique"] in ("prune", "cluster", "qat") for s in steps):
            continue
        out.append(build(name, steps).with_backend(backend))
    return out


def _time_all(cands: list[Candidate], out_dir: Path, sample, threads: int, runs: int, log: Log) -> list[Candidate]:
    """Latency of each candidate one at a time, then every peak memory from one probe process."""
    from .results import Memory

    ok = [c for c in cands if c.ok]
    log(f"Timing {len(ok)} candidate(s), one at a time ({threads} threads)...")
    timed = {
        c.name: measure.add_timing(c.metrics, out_dir / c.artifact, sample, threads=threads, runs=runs, memory=False)
        for c in ok
    }
    peaks = runtime.peak_memory_many([out_dir / c.artifact for c in ok], threads)
    for c, peak in zip(ok, peaks):
        if peak is not None:
            timed[c.name] = timed[c.name].model_copy(update={"memory": Memory(peak_rss_bytes=peak)})
    return [c.model_copy(update={"metrics": timed[c.name]}) if c.name in timed else c for c in cands]


def _as_baseline(c: Candidate) -> Candidate:
    """The baseline's accuracy delta is zero by definition (it is what the others are compared with)."""
    if c.ok and c.metrics.accuracy is not None and c.metrics.accuracy_delta is None:
        return c.model_copy(update={"metrics": c.metrics.model_copy(update={"accuracy_delta": 0.0})})
    return c


def plan(
    src: models.ModelSource, ds: Dataset | None, recipes: list[Recipe] | None, backend: str | None, log: Log = print
) -> list[Recipe]:
    """The resolved recipes a sweep will run: the defaults for this kind of model, or the given ones."""
    if recipes is None:
        include_training = src.kind == "keras2" and ds is not None and ds.y_train is not None
        recipes = default_recipes(include_training, backend)
        if src.kind == "tflite":
            recipes = [as_given("float32")] + [build(s, [{"technique": "quantize", "scheme": s}]) for s in PTQ_SCHEMES]
        if ds is None:
            recipes = [r for r in recipes if r.scheme not in ("int8", "int16x8")]
            log("No data given: skipping int8 and int16x8 (they need calibration data) and accuracy.")
    else:
        recipes = [r.with_backend(backend) for r in recipes]
    names = [r.name for r in recipes]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup:
        raise RecipeError(f"Two recipes are named {dup!r}.", "Give every recipe in a sweep its own name.")
    return [resolve(r, src) if r.steps else r for r in recipes]


def _groups(recipes: list[Recipe]) -> list[list[Recipe]]:
    """Recipes that start with the same Keras step run together, so shared prefixes run once
    (prune -> int8 and prune -> cluster -> int8 prune once)."""
    groups: dict[str, list[Recipe]] = {}
    for r in recipes:
        keras = [s.model_dump() for s in r.steps if registry.get(s.technique).stage is Stage.KERAS]
        groups.setdefault(_key(keras[:1]), []).append(r)
    return list(groups.values())


def default_jobs(n_groups: int) -> int:
    """Workers: one per core, at most one per 4 GiB of memory (converting a large model takes ~3.6 GB)."""
    try:
        mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        mem_gib = 8
    return max(1, min(os.cpu_count() or 1, int(mem_gib // 4), n_groups))


def sweep(
    model: str | Path | None = None,
    data: str | Path | Dataset | None = None,
    output: str | Path = "optimize-out",
    recipes: list[Recipe] | None = None,
    threads: int = 2,
    backend: str | None = None,
    delegates: bool = True,
    runs: int = 50,
    log: Log = print,
    on_candidate: Callable[[Candidate], None] | None = None,
    eval_samples: int = measure.DEFAULT_SAMPLES,
    jobs: int | None = None,
    cache: bool = True,
) -> Study:
    """The float32 baseline plus every recipe, each measured against it; written to output/study.json.

    Unchanged candidates come from the result cache (`cache=False` forces work). The rest run in
    `jobs` worker processes (0: in this process), then are timed one at a time on a quiet machine.
    """
    from .cache import ResultCache, key_for
    from .demo import cache_dir

    src, ds = open_inputs(model, data, log)
    recipes = plan(src, ds, recipes, backend, log)
    out_dir = Path(output)
    out_dir.mkdir(parents=True, exist_ok=True)
    baseline_recipe = next((r for r in recipes if r.scheme == "float32" and len(r.steps) <= 1), None)
    settings = {
        "threads": threads,
        "runs": runs,
        "eval_samples": eval_samples,
        "delegates": delegates,
        "versions": _tf.versions(),
    }
    common = {"model": src.fingerprint, "data": ds.fingerprint if ds else None, "settings": settings}
    base_key = key_for(steps=[s.model_dump() for s in baseline_recipe.steps], **common) if baseline_recipe else None
    keys = {
        r.name: key_for(
            steps=[s.model_dump() for s in r.steps], baseline=None if r is baseline_recipe else base_key, **common
        )
        for r in recipes
    }
    store = ResultCache(cache_dir() / "results" if cache else None, log)
    done: dict[str, Candidate] = {}
    for r in recipes:
        hit = store.get(keys[r.name], r.name, out_dir)
        if hit is not None:
            log(f"  {r.name}: reused from the cache")
            done[r.name] = hit
            if on_candidate:
                on_candidate(hit)
    misses = [r for r in recipes if r.name not in done]
    if misses:
        check_data(src, ds)
        ref = baseline = None
        if baseline_recipe and baseline_recipe.name in done and done[baseline_recipe.name].ok:
            ref, baseline = out_dir / done[baseline_recipe.name].artifact, done[baseline_recipe.name].metrics
        fresh: list[Candidate] = []
        groups = _groups(misses)
        n_jobs = default_jobs(len(groups)) if jobs is None else jobs
        base_name = baseline_recipe.name if baseline_recipe else None
        log(f"Producing {len(misses)} candidate(s) in {n_jobs or 'this'} process(es)...")
        if n_jobs == 0:
            ws = Workspace(src, ds, out_dir / ".work", threads, log)
            for group in sorted(groups, key=lambda g: not any(r.name == base_name for r in g)):
                for r in group:
                    log(f"  {r.name}")
                    c = make_candidate(
                        ws,
                        r,
                        out_dir,
                        reference=ref,
                        baseline=baseline,
                        delegates=delegates,
                        timing=False,
                        eval_samples=eval_samples,
                    )
                    if r.name == base_name and c.ok:
                        ref, baseline = out_dir / c.artifact, c.metrics
                    fresh.append(c)
        else:
            from .workers import Settings, run_groups

            run_groups(
                Settings(src, ds, out_dir, threads, eval_samples, delegates),
                groups,
                n_jobs,
                base_name,
                ref,
                baseline,
                log,
                fresh.append,
            )
        fresh = _time_all(fresh, out_dir, ds.x_test[:1] if ds is not None else None, threads, runs, log)
        for c in fresh:
            if not (c.error or "").startswith("worker process"):
                store.put(keys[c.name], c, out_dir)
            done[c.name] = c
            if on_candidate:
                on_candidate(c)
    if baseline_recipe is not None:
        done[baseline_recipe.name] = _as_baseline(done[baseline_recipe.name])
    study = Study(
        created=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        model="demo" if model is None else str(model),
        model_fingerprint=src.fingerprint,
        data=ds.source if ds else None,
        baseline=baseline_recipe.name if baseline_recipe else "float32",
        environment=environment(threads),
        candidates=[done[r.name] for r in recipes],
    )
    study.save(out_dir / "study.json")
    shutil.rmtree(out_dir / ".work", ignore_errors=True)
    return study

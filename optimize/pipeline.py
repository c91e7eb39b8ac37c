"""Run recipes on a model: steps -> artifact -> measured candidate; many recipes -> one study.

Data flows one way: keras steps (prune, cluster, QAT) -> one convert step -> tflite steps (quantize).
Within a run, every step prefix is produced once and shared (prune -> int8 and prune -> cluster -> int8
prune once), and every Keras step starts from a fresh load from disk (tfmot mutates what it wraps).
A candidate that fails records its reason; the rest of the study carries on.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import platform
import shutil
import socket
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from . import _tf, measure, models, registry, runtime
from .data import Dataset, load_data
from .errors import DataError, ModelError, OptimizeError, RecipeError, TechniqueFailed
from .recipe import Recipe, build
from .registry import Context, Stage
from .results import Candidate, Environment, Metrics, Step, Study

Log = Callable[[str], None]

PTQ_SCHEMES = ("float16", "dynamic", "int8", "int16x8")

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
        out.append(with_backend(build(name, steps), backend or "auto"))
    return out


#: Which backend quantizes each scheme when the user does not say (benchmarks/bench_backends.py):
#: LiteRT Quantizer matches the converter's fidelity on every scheme (dynamic range too, once it also
#: leaves weights under 1,024 elements in float) and is several times faster, so it wins on speed.
DEFAULT_BACKEND = {"float16": "litert", "dynamic": "litert", "int8": "litert", "int16x8": "litert"}


def with_backend(recipe: Recipe, backend: str | None) -> Recipe:
    """Express a recipe's post-training scheme with the chosen backend.

    'converter': the TFLite converter quantizes while converting. 'litert': convert to float32 once and
    quantize the flatbuffer with LiteRT Quantizer (the `quantize` step). 'auto': per scheme, as
    DEFAULT_BACKEND says. None keeps the recipe as written. After QAT, or with float fallback, the
    converter is always used (LiteRT Quantizer does not read fake-quant ranges or fall back per op).
    """
    if backend not in ("converter", "litert", "auto"):
        return recipe
    steps = [s.model_dump() for s in recipe.steps]
    qat = any(x["technique"] == "qat" for x in steps)
    raw = []
    for s in steps:
        p = dict(s["params"])
        scheme = p.get("scheme")
        wanted = DEFAULT_BACKEND.get(scheme, "converter") if backend == "auto" else backend
        if wanted == "litert" and s["technique"] == "convert" and scheme in PTQ_SCHEMES:
            if not qat and not p.get("float_fallback"):
                raw.append({"technique": "convert", "scheme": "float32"})
                raw.append(
                    {
                        "technique": "quantize",
                        "scheme": scheme,
                        "io": p.get("io", "float"),
                        "samples": p.get("samples", 200),
                    }
                )
                continue
        converted = any(r["technique"] == "convert" and r.get("scheme") == "float32" for r in raw)
        if wanted == "converter" and s["technique"] == "quantize" and converted:  # (a .tflite input keeps it)
            raw = [r for r in raw if not (r["technique"] == "convert" and r.get("scheme") == "float32")]
            raw.append(
                {"technique": "convert", "scheme": scheme, "io": p.get("io", "float"), "samples": p.get("samples", 200)}
            )
            continue
        raw.append({"technique": s["technique"], **p})
    return recipe.model_copy(update={"steps": build(recipe.name, raw).steps})


def _key(*parts) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


@dataclass
class _State:
    kind: str  # "source" | "keras" | "tflite"
    path: Path
    saved_model: Path | None = None
    notes: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


class Workspace:
    """Produces artifacts for step lists, sharing every step prefix within one run."""

    def __init__(
        self, src: models.ModelSource, data: Dataset | None, workdir: Path, threads: int = 2, log: Log = print
    ):
        self.src, self.data, self.workdir, self.threads, self.log = src, data, workdir, threads, log
        self.memo: dict[str, _State] = {}
        self.root = _key(src.fingerprint, data.fingerprint if data else None)

    def _context(self, key: str, state: _State) -> Context:
        folder = self.workdir / key
        folder.mkdir(parents=True, exist_ok=True)
        return Context(
            workdir=folder,
            data=self.data,
            threads=self.threads,
            log=self.log,
            notes=list(state.notes),
            skipped_layers=list(state.skipped),
        )

    def _keras_model(self, state: _State):
        if state.kind == "source":
            return models.load_keras2(self.src)
        if state.kind == "keras":
            return models.load_keras2(models.ModelSource(state.path, "keras2", ""))
        raise RecipeError("A Keras step cannot follow a .tflite step.", "Put prune/cluster/qat before convert.")

    def _saved_model(self, state: _State, key: str) -> Path:
        if state.saved_model is not None:
            return state.saved_model
        if state.kind == "source" and self.src.kind == "savedmodel":
            state.saved_model = self.src.path
        elif state.kind == "source" and self.src.kind == "keras3":
            state.saved_model = models.export_saved_model(
                models.load_keras3(self.src), self.workdir / key / "saved_model"
            )
        elif state.kind in ("source", "keras"):
            state.saved_model = models.export_saved_model(self._keras_model(state), self.workdir / key / "saved_model")
        else:
            raise RecipeError(
                "This model is already a .tflite: it cannot be converted again.",
                "Use the quantize step (--backend litert) on a float .tflite.",
            )
        return state.saved_model

    def produce(self, steps: Iterable[Step]) -> _State:
        state = _State("source", self.src.path)
        prefix: list = []
        for step in steps:
            prefix.append(step.model_dump())
            key = _key(self.root, prefix)
            if key in self.memo:
                state = self.memo[key]
                continue
            tech = registry.get(step.technique)
            params = tech.params.model_validate(step.params)
            self.log(f"  {tech.name} {_brief(step.params)}")
            if tech.stage is Stage.KERAS:
                ctx = self._context(key, state)
                model = tech.fn(self._keras_model(state), params, ctx)
                path = self.workdir / key / "model.keras"
                model.save(path)
                sm = models.export_saved_model(model, self.workdir / key / "saved_model")
                state = _State("keras", path, sm, ctx.notes, ctx.skipped_layers)
            elif tech.stage is Stage.CONVERT:
                sm = self._saved_model(state, _key(self.root, prefix[:-1]))
                ctx = self._context(key, state)
                state = _State("tflite", tech.fn(sm, params, ctx), None, ctx.notes, ctx.skipped_layers)
            else:
                if state.kind == "source" and self.src.kind != "tflite":
                    raise RecipeError(
                        f"{tech.name} quantizes a .tflite; this recipe has no convert step before it.",
                        "Add a convert step with scheme float32 first.",
                    )
                if state.kind == "keras":
                    raise RecipeError(f"{tech.name} needs a .tflite; add a convert step before it.")
                ctx = self._context(key, state)
                state = _State("tflite", tech.fn(state.path, params, ctx), None, ctx.notes, ctx.skipped_layers)
            self.memo[key] = state
        if state.kind != "tflite":
            if state.kind == "source" and self.src.kind == "tflite":
                return state
            raise RecipeError("The recipe never converts to .tflite.", "Add a convert step.")
        return state


def _brief(params: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in params.items() if v not in (None, False))


def resolve(recipe: Recipe, src: models.ModelSource) -> Recipe:
    """Fill in what a recipe leaves implicit: a float32 conversion when it has no convert step."""
    has_convert = any(registry.get(s.technique).stage is Stage.CONVERT for s in recipe.steps)
    keras_steps = [s.technique for s in recipe.steps if registry.get(s.technique).stage is Stage.KERAS]
    if keras_steps and src.kind in ("keras3", "savedmodel"):
        models.load_keras2(src)  # raises the one-line "needs a Keras 2 (tf_keras) model" error
    if has_convert or src.kind == "tflite":
        if src.kind == "tflite" and any(registry.get(s.technique).stage is not Stage.TFLITE for s in recipe.steps):
            raise ModelError(
                f"{src.path.name} is already a .tflite: only .tflite steps (quantize) apply to it.",
                "Pass the Keras or SavedModel model for prune/cluster/qat/convert, or use --backend litert.",
            )
        return recipe
    raw = [s.model_dump() for s in recipe.steps]
    first_tflite = next(
        (i for i, s in enumerate(recipe.steps) if registry.get(s.technique).stage is Stage.TFLITE), len(raw)
    )
    raw.insert(first_tflite, {"technique": "convert", "params": {"scheme": "float32"}})
    flat = [{"technique": s["technique"], **s["params"]} for s in raw]
    return recipe.model_copy(update={"steps": build(recipe.name, flat).steps})


def check_data(src: models.ModelSource, data: Dataset | None) -> None:
    """Check data against the model's input before any work starts (one clear line if it does not fit)."""
    if data is None:
        return
    keras_model = None
    if src.kind == "keras2":
        keras_model = models.load_keras2(src)
    elif src.kind == "keras3":
        keras_model = models.load_keras3(src)
    data.check_input(models.input_shape(src, keras_model))


def environment(threads: int) -> Environment:
    return Environment(
        python=platform.python_version(),
        platform=platform.platform(),
        host=socket.gethostname(),
        cpu_count=os.cpu_count() or 1,
        versions=_tf.versions(),
        threads=threads,
    )


def _error_text(e: BaseException) -> str:
    if isinstance(e, (TechniqueFailed, OptimizeError)):
        return str(e)
    last = traceback.extract_tb(e.__traceback__)[-1] if e.__traceback__ else None
    where = f" (at {Path(last.filename).name}:{last.lineno})" if last else ""
    msg = str(e).strip().splitlines()[0][:300] if str(e).strip() else ""
    return f"{e.__class__.__name__}: {msg}{where}"


def make_candidate(
    ws: Workspace,
    recipe: Recipe,
    out_dir: Path,
    *,
    measure_it: bool = True,
    reference: Path | None = None,
    baseline: Metrics | None = None,
    delegates: bool = True,
    runs: int = 50,
    memory: bool = True,
    eval_samples: int = measure.DEFAULT_SAMPLES,
    timing: bool = True,
) -> Candidate:
    """Produce, copy out, measure and check one candidate. Failures become the candidate's error."""
    t0 = time.perf_counter()
    base = dict(
        name=recipe.name,
        steps=list(recipe.steps),
        recipe_hash=recipe.hash,
        scheme=recipe.scheme,
        backend=recipe.backend,
    )
    try:
        state = ws.produce(recipe.steps)
        artifact = out_dir / f"{recipe.name}.tflite"
        if state.path.resolve() != artifact.resolve():
            tmp = artifact.with_suffix(".tflite.tmp")
            shutil.copyfile(state.path, tmp)
            os.replace(tmp, artifact)
        metrics = None
        if measure_it:
            metrics = measure.evaluate(
                artifact,
                ws.data,
                reference=reference,
                threads=ws.threads,
                runs=runs,
                baseline_accuracy=baseline.accuracy if baseline else None,
                memory=memory,
                samples=eval_samples,
                timing=timing,
            )
        reports = check_all_delegates(artifact, ws.threads) if delegates else {}
        return Candidate(
            **base,
            artifact=artifact.name,
            metrics=metrics,
            delegates=reports,
            skipped_layers=state.skipped,
            notes=state.notes,
            seconds=time.perf_counter() - t0,
        )
    except (DataError, RecipeError):
        raise
    except Exception as e:  # a technique failing on this model is a failed candidate, not a crashed run
        ws.log(f"  failed: {_error_text(e)}")
        return Candidate(**base, error=_error_text(e), seconds=time.perf_counter() - t0)


def check_all_delegates(artifact: Path, threads: int) -> dict:
    """Delegate reports for one artifact; an internal checker failure is noted, never fatal."""
    try:
        from .delegates import check_delegates
    except ImportError:
        return {}
    try:
        return check_delegates(artifact, threads=threads)
    except OptimizeError:
        return {}


def open_inputs(model: str | Path | None, data: str | Path | Dataset | None, log: Log = print):
    """The model source and dataset; the built-in demo (and its data) when no model is given."""
    if model is None or str(model) == "demo":
        from .demo import demo

        model_path, data_path = demo(log=log)
        model = model_path
        data = data if data is not None else data_path
    src = models.open_model(model)
    ds = data if isinstance(data, Dataset) or data is None else load_data(data)
    return src, ds


def run(
    recipe: Recipe,
    model: str | Path | None = None,
    data: str | Path | Dataset | None = None,
    output: str | Path | None = None,
    threads: int = 2,
    reference: str | Path | None = None,
    measure_it: bool = True,
    delegates: bool = True,
    log: Log = print,
) -> Candidate:
    """Run one recipe on a model and measure the result. `reference` defaults to a float32 conversion."""
    src, ds = open_inputs(model or recipe.model, data or recipe.data, log)
    recipe = resolve(recipe, src)
    check_data(src, ds)
    out_dir = Path(output or recipe.output or "optimize-out")
    out_dir.mkdir(parents=True, exist_ok=True)
    ws = Workspace(src, ds, out_dir / ".work", threads, log)
    ref = Path(reference) if reference else None
    baseline = None
    if measure_it and ref is None and ds is not None and recipe.scheme != "float32":
        float_recipe = (
            resolve(build("float32", [{"technique": "convert", "scheme": "float32"}]), src)
            if src.kind != "tflite"
            else None
        )
        if float_recipe is not None:
            base = make_candidate(ws, float_recipe, ws.workdir, delegates=False, runs=5, memory=False)
            if base.ok:
                ref, baseline = ws.workdir / base.artifact, base.metrics
        elif src.kind == "tflite":
            ref = src.path
    if ref is not None and baseline is None and ds is not None and measure_it:
        baseline = measure.evaluate(ref, ds, threads=threads, runs=5, memory=False)
    try:
        return make_candidate(
            ws, recipe, out_dir, measure_it=measure_it, reference=ref, baseline=baseline, delegates=delegates
        )
    finally:
        shutil.rmtree(ws.workdir, ignore_errors=True)


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
            recipes = [build("float32", [])] + [build(s, [{"technique": "quantize", "scheme": s}]) for s in PTQ_SCHEMES]
        if ds is None:
            recipes = [r for r in recipes if r.scheme not in ("int8", "int16x8")]
            log("No data given: skipping int8 and int16x8 (they need calibration data) and accuracy.")
    else:
        recipes = [with_backend(r, backend) for r in recipes]
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
        created=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
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

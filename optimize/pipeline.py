"""Run one recipe on a model: steps -> artifact -> measured candidate (`sweeps.py` runs many into a study).

Data flows one way: keras steps (prune, cluster, QAT) -> one convert step -> tflite steps (quantize).
Within a run, every step prefix is produced once and shared (prune -> int8 and prune -> cluster -> int8
prune once), and every Keras step starts from a fresh load from disk (tfmot mutates what it wraps).
A candidate that fails records its reason; the rest of the study carries on.
"""

from __future__ import annotations

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

from . import _tf, measure, models, registry
from .data import Dataset, load_data
from .errors import DataError, ModelError, OptimizeError, RecipeError, TechniqueFailed
from .recipe import Recipe, build
from .registry import Context, Stage
from .results import Candidate, Environment, Metrics, Step

Log = Callable[[str], None]

PTQ_SCHEMES = ("float16", "dynamic", "int8", "int16x8")

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
    data.check_input(models.input_shape(src))


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
    plain_float = [s.technique for s in recipe.steps] == ["convert"] and recipe.scheme == "float32"
    if measure_it and ds is not None and ref is None and not plain_float:
        if src.kind == "tflite":
            ref = src.path
        else:  # the float32 conversion of the same model: what accuracy and fidelity are compared with
            float32 = resolve(build("float32", [{"technique": "convert"}]), src)
            base = make_candidate(ws, float32, ws.workdir, delegates=False, timing=False)
            if base.ok:
                ref, baseline = ws.workdir / base.artifact, base.metrics
    if measure_it and ds is not None and ref is not None and baseline is None:
        baseline = measure.evaluate(ref, ds, threads=threads, timing=False)
    try:
        return make_candidate(
            ws, recipe, out_dir, measure_it=measure_it, reference=ref, baseline=baseline, delegates=delegates
        )
    finally:
        shutil.rmtree(ws.workdir, ignore_errors=True)

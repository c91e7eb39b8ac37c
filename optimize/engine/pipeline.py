"""Run one recipe on a model: steps -> artifact -> measured candidate (`sweeps.py` runs many into a study).

Data flows one way: keras steps (prune, cluster, QAT) -> one convert step -> tflite steps (quantize).
Within a run, every step prefix is produced once and shared (prune -> int8 and prune -> cluster -> int8
prune once), and every Keras step starts from a fresh load from disk (tfmot mutates what it wraps).
A candidate that fails records its reason; the rest of the study carries on.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from optimize.convert import keras as exporting
from optimize.core import paths, registry
from optimize.core.errors import DataError, ModelError, OptimizeError, RecipeError, TechniqueFailed
from optimize.core.recipe import Recipe, build
from optimize.core.registry import Context, Stage
from optimize.core.results import PHASES, Candidate, Composition, Metrics, Probe, Step, write_atomic
from optimize.core.vocab import CALIBRATED_SCHEMES, Backend
from optimize.engine.budget import converts_directly, weights_bytes
from optimize.engine.plan import _key, checked, resolve
from optimize.engine.ship import ship_out
from optimize.measure import footprint, probe, verify
from optimize.measure import metrics as measure
from optimize.models import rebuild
from optimize.models import source as models
from optimize.models.data import Dataset, take
from optimize.models.inputs import check_data
from optimize.present.progress import Progress
from optimize.transforms.tflite import calibrator

log = logging.getLogger(__name__)


@contextlib.contextmanager
def timed(phases: dict[str, float] | None, name: str) -> Iterator[None]:
    """Add the time the block takes to `phases[name]` (results.PHASES), whether it ends well or not; its peak memory
    is kept too, by the candidate collecting them here (`footprint.phase_peak`)."""
    t0 = time.perf_counter()
    try:
        with footprint.phase_peak(name):
            yield
    finally:
        if phases is not None:
            phases[name] = phases.get(name, 0.0) + time.perf_counter() - t0


def _phase(tech) -> str:
    """The phase a technique's step counts in: fine-tuning, conversion, quantization, or a rescue."""
    if tech.stage is Stage.KERAS:
        return "train"
    if tech.stage is Stage.CONVERT:
        return "convert"
    return "quantize" if tech.name == "quantize" else "rescue"


@dataclass
class _State:
    kind: str  # "source" | "keras" | "tflite"
    path: Path
    saved_model: Path | None = None
    notes: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    records: dict = field(default_factory=dict)
    batch1: Path | None = None  # the same model exported with a batch of 1 (recurrent models)
    seeded: bool = False  # made elsewhere (`Workspace.seed`), not by a step here


KERAS3_ROUTE = (
    "convert: Keras 3 model exported with a fixed batch of 1 (with a free batch, Keras 3 reads the batch size "
    "at run time: Flatten and Reshape become SHAPE -> STRIDED_SLICE -> PACK -> RESHAPE, which the GPU, NNAPI, "
    "Hexagon and Core ML delegates refuse)"
)


def direct_notes(kind: str, made: Iterable[str]) -> list[str]:
    """The notes of a float32 made straight from a Keras model (`convert.keras.float32_direct`): what the
    conversion changed, and for Keras 3 the fixed batch it was traced with."""
    return [*made, *([KERAS3_ROUTE] if kind == "keras3" else [])]


class Workspace:
    """Produces artifacts for step lists, sharing every step prefix within one run."""

    def __init__(
        self, src: models.ModelSource, data: Dataset | None, workdir: Path, threads: int = 2, shared: Path | None = None
    ):
        self.src, self.data, self.workdir, self.threads = src, data, workdir, threads
        self.shared = shared  # shared by the run's workspaces on this machine (calibrations: one per model and data)
        self.memo: dict[str, _State] = {}
        self._source: _State | None = None
        self.phases: dict[str, float] | None = None  # where produce's time goes (set by make_candidate)
        self._teacher: list | None = None
        self.root = _key(src.fingerprint, data.fingerprint if data else None)
        self._exported: Path | None = None  # the source's SavedModel, exported already (seed_export)
        self._export_seconds = 0.0  # what exporting it took where it was done, not yet counted on a candidate
        self.carried = 0.0  # seconds of the candidate being made that were spent elsewhere (that export)
        self._unused: list = []  # the source Keras model, loaded for a route that did not take it (exported next)

    def seed(self, steps: Iterable[Step], path: Path, notes: Iterable[str] = ()) -> None:
        """What `steps` make is at `path` already (another worker made it: the sweep's float32 baseline; or the
        sweep's process, with the `notes` its convert step carries), so a recipe that starts with them goes on
        from there instead of converting again."""
        key = _key(self.root, [s.model_dump() for s in steps])
        if key not in self.memo:
            self.memo[key] = _State("tflite", Path(path), notes=list(notes), seeded=True)

    def seed_export(self, path: Path, seconds: float = 0.0) -> None:
        """The source Keras model's float32 .tflite (or, where that route did not take it, its SavedModel) is at
        `path` already: the sweep's own process made it from the model it loaded to check it (`runs.Run.export`,
        in `seconds`), so converting it loads and exports nothing here; the candidate that converts it counts
        those seconds in its convert phase and total."""
        self._exported, self._export_seconds = Path(path), seconds

    def _context(self, key: str, state: _State) -> Context:
        folder = self.workdir / key
        folder.mkdir(parents=True, exist_ok=True)
        return Context(
            workdir=folder,
            data=self.data,
            source_kind=self.src.kind,
            source=self.src,
            threads=self.threads,
            notes=list(state.notes),
            skipped_layers=list(state.skipped),
            records=dict(state.records),
            teacher=self.teacher,
            shared=self.shared,
        )

    def teacher(self) -> list:
        """The float source model's outputs on the training inputs, computed once per run: what fine-tuning
        trains an output without labels toward (every step of a chain keeps to the same float model)."""
        if self._teacher is None:
            from optimize.transforms.keras.common import predict

            self._teacher = predict(self._keras_model(self.source()), self.data.x_train)
        return self._teacher

    def _keras_model(self, state: _State, notes: list[str] | None = None):
        if state.kind == "source" and self.src.kind == "keras3":  # tfmot needs tf_keras: an exact rebuild
            path, note = rebuild.keras2_path(self.src, self.data, self.workdir / "keras2")
            if notes is not None:
                notes.append(note)
            return models.load_keras2(models.ModelSource(path, "keras2", self.src.fingerprint))
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
        elif state.kind == "source" and self._exported is not None and self._exported.is_dir():
            state.saved_model = self._exported
            self._carry_export()
            if self.src.kind == "keras3":
                state.notes.append(KERAS3_ROUTE)
        elif state.kind == "source" and self.src.kind == "keras3":
            state.saved_model = exporting.export_saved_model(
                self._unused.pop() if self._unused else models.load_keras3(self.src),
                self.workdir / key / "saved_model",
                batch=1,
            )
            state.notes.append(KERAS3_ROUTE)
        elif state.kind in ("source", "keras"):
            model = self._unused.pop() if state.kind == "source" and self._unused else self._keras_model(state)
            state.saved_model = exporting.export_saved_model(model, self.workdir / key / "saved_model")
        else:
            raise RecipeError(
                "This model is already a .tflite: it cannot be converted again.",
                "Use the quantize step (--backend litert) on a float .tflite.",
            )
        return state.saved_model

    def _carry_export(self) -> None:
        """The seconds the sweep's process spent exporting or converting the source for this candidate, counted
        once, on it (its convert phase and total)."""
        moved, self._export_seconds = self._export_seconds, 0.0
        self.carried += moved
        if self.phases is not None:
            self.phases["convert"] = self.phases.get("convert", 0.0) + moved

    def _direct(self, tech, params, state: _State, key: str) -> _State | None:
        """The source Keras model's float32 .tflite converted straight from the loaded model (no SavedModel):
        what the sweep's process made (`runs.Run.export`), or made here (`convert.keras.float32_direct`), taken
        as this convert step's result. None for any other step, or where that route does not take the model."""
        plain = tech.name == "convert" and params.scheme == "float32" and not params.select_tf_ops
        if not (plain and state.kind == "source" and self.src.kind in ("keras2", "keras3")):
            return None
        made = self._direct_made(state)
        if made is None:
            return None
        ctx = self._context(key, state)
        path = write_atomic(ctx.workdir / "convert-float32.tflite", made[0])
        notes = [*ctx.notes, *(n for n in made[1] if n not in ctx.notes)]
        return _State("tflite", path, None, notes, ctx.skipped_layers, ctx.records)

    def _direct_made(self, state: _State) -> tuple[bytes, list[str]] | None:
        """(the float32 .tflite, its notes) from the sweep's process, or converted here when it made nothing
        (a warm worker, Ray, a single run); None when it exported a SavedModel, the route gives way, or the model
        is above budget.DIRECT_BYTES (loaded and converted at once, it peaked at 19x its bytes: `runs.Run.export`)."""
        exported = self._exported
        if exported is not None:
            if exported.suffix != ".tflite" or not exported.is_file():
                return None
            self._carry_export()
            return exported.read_bytes(), direct_notes(self.src.kind, exporting.export_notes(exported.parent))
        if not converts_directly(
            weights_bytes(self.src)
        ):  # a big model: its SavedModel converted, not beside it (issue 44)
            return None
        keras3 = self.src.kind == "keras3"
        model = models.load_keras3(self.src) if keras3 else self._keras_model(state)
        made = exporting.float32_direct(model, self.data, batch=1 if keras3 else None)
        if made is None:
            self._unused = [model]  # the SavedModel route exports this one, not a second load
            return None
        return made.content, direct_notes(self.src.kind, made.notes)

    def source(self) -> _State:
        """Where every recipe starts: the model as given, or for a .tflite its plain float32 equivalent
        (optimize.models.normalize: old op codes, no signature, float16 or sparse weights), made once."""
        if self._source is None:
            self._source = _State("source", self.src.path)
            if self.src.converted:  # a PyTorch, ONNX or TF1 graph model: the float .tflite it was converted to
                self._source.path = write_atomic(self.workdir / "source.tflite", self.src.content)
            elif self.src.kind == "tflite":
                src = models.opened(self.src)  # normalised when it was opened: not read again
                if src.facts:
                    self._source.path = write_atomic(self.workdir / "source.tflite", src.content)
                    self._source.notes = [f"input normalised: {'; '.join(src.facts)}"]
        return self._source

    def _fixed_batch_export(self, state: _State, key: str):
        """A way to export the Keras model at this state with a batch of 1 (None for a plain SavedModel)."""
        if state.batch1 is not None:
            return lambda: state.batch1
        if state.kind == "source" and self.src.kind in ("keras2", "keras3"):
            load = (
                (lambda: models.load_keras2(self.src))
                if self.src.kind == "keras2"
                else (lambda: models.load_keras3(self.src))
            )
        elif state.kind == "keras":
            load = lambda: self._keras_model(state)  # noqa: E731
        else:
            return None
        return lambda: exporting.export_saved_model(load(), self.workdir / key / "saved_model_batch1", batch=1)

    def produce(self, steps: Iterable[Step], name: str) -> _State:
        """The state after `steps`, each made once per workspace. Each step made is one log line that names
        the candidate (`name`), so the lines of two workers read apart when they interleave in a pipe."""
        state = self.source()
        prefix: list = []
        for step in steps:
            prefix.append(step.model_dump())
            key = _key(self.root, prefix)
            if key in self.memo:
                state = self.memo[key]
                if state.seeded and self._export_seconds:  # the sweep's process made it: its seconds count here
                    self._carry_export()
                continue
            tech = registry.get(step.technique)
            # `step` travels with the record: a worker that dies in this step is reported with it (engine.work)
            log.info("%s: %s %s", name, tech.name, _brief(step), extra={"step": _step_name(tech.name, step)})
            with timed(self.phases, _phase(tech)):
                state = self._step(tech, step.params, state, key, prefix)
            self.memo[key] = state
        if state.kind != "tflite":
            if state.kind == "source" and self.src.flat:
                return state
            raise RecipeError("The recipe never converts to .tflite.", "Add a convert step.")
        return state

    def _step(self, tech, params, state: _State, key: str, prefix: list) -> _State:
        """One step that no earlier recipe of this workspace made: its technique run on `state`."""
        if tech.stage is Stage.KERAS:
            ctx = self._context(key, state)
            model = tech.fn(self._keras_model(state, ctx.notes), params, ctx)
            path = self.workdir / key / "model.keras"
            model.save(path)
            # a Keras 3 model rebuilt in tf_keras keeps Keras 3's run-time batch in Flatten/Reshape: exported
            # with a free batch, its trained candidates lose every delegate as the plain conversion would
            batch = 1 if self.src.kind == "keras3" else None
            sm = exporting.export_saved_model(model, self.workdir / key / "saved_model", batch=batch)
            if batch and KERAS3_ROUTE not in ctx.notes:
                ctx.notes.append(KERAS3_ROUTE)
            state = _State("keras", path, sm, ctx.notes, ctx.skipped_layers, ctx.records)
            if models.has_recurrent(model):  # the batch-1 route needs the model, and a reload may not restore it
                state.batch1 = exporting.export_saved_model(model, self.workdir / key / "saved_model_batch1", batch=1)
        elif tech.stage is Stage.CONVERT and (direct := self._direct(tech, params, state, key)) is not None:
            state = direct
        elif tech.stage is Stage.CONVERT:
            sm = self._saved_model(state, _key(self.root, prefix[:-1]))
            ctx = self._context(key, state)
            ctx.fixed_batch_export = self._fixed_batch_export(state, key)
            state = _State("tflite", tech.fn(sm, params, ctx), None, ctx.notes, ctx.skipped_layers, ctx.records)
        else:
            if state.kind == "source" and not self.src.flat:
                raise RecipeError(
                    f"{tech.name} quantizes a .tflite; this recipe has no convert step before it.",
                    "Add a convert step with scheme float32 first.",
                )
            if state.kind == "keras":
                raise RecipeError(f"{tech.name} needs a .tflite; add a convert step before it.")
            ctx = self._context(key, state)
            state = _State("tflite", tech.fn(state.path, params, ctx), None, ctx.notes, ctx.skipped_layers, ctx.records)
        return state


def _step_name(technique: str, step: Step) -> str:
    """`convert scheme=int8`: a step as a failure names it (its technique and scheme)."""
    scheme = getattr(step.params, "scheme", None)
    return f"{technique} scheme={scheme}" if scheme is not None else technique


def _brief(step: Step) -> str:
    return " ".join(f"{k}={v}" for k, v in step.params.model_dump(mode="json").items() if v not in (None, False))


def artifact_path(out_dir: Path, name: str) -> Path:
    """`<out_dir>/<name>.tflite`, refused if it would land outside the output folder."""
    return paths.inside(out_dir, f"{name}.tflite")


class NotWhatItSays(TechniqueFailed):
    """The artifact does not hold what its scheme or technique promises (optimize.measure.verify)."""


class MadeInvalid(TechniqueFailed):
    """A file optimize made (not the user's) does not validate: the step that wrote it is at fault."""


def _read_back(path: Path, recipe: Recipe | None = None):
    """The artifact parsed (validated) once, and what it holds: the delegate checks reuse the parse. An
    artifact that does not validate is the fault of the step that wrote it, never of the user's model."""
    from optimize.models.tflite import read_model

    try:
        parsed = read_model(path.read_bytes())
    except ModelError as e:
        step = recipe.steps[-1].technique if recipe is not None and recipe.steps else "the last step"
        who = f" ({recipe.made_by})" if recipe is not None and recipe.steps else ""
        raise MadeInvalid(f"the model {step}{who} wrote does not validate: {e.problem}") from None
    return parsed, verify.compose(parsed)


def produce_verified(ws: Workspace, recipe: Recipe) -> tuple[Recipe, _State, Composition, object]:
    """The recipe's artifact, read back and checked, and its parsed flatbuffer. When LiteRT Quantizer leaves
    weights float that the converter quantizes (an LSTM), or float compute in an integer-only model (PRELU,
    LEAKY_RELU), the same scheme is made by the converter instead, and said so."""
    try:
        state = ws.produce(recipe.steps, recipe.name)
        with timed(ws.phases, "verify"):
            parsed, composition = _read_back(state.path, recipe)
            problem = verify.check(recipe, composition) if recipe.steps else None
    except TechniqueFailed as e:
        if not _other_route(ws, recipe) or not _failed_after_conversion(ws, recipe):
            raise
        state, parsed, composition, problem = None, None, None, f"{e}"
    blocked = _no_calibrator(ws, recipe) if problem and _other_route(ws, recipe) else None
    if blocked:  # the converter's calibrator would crash the worker: not tried, and said so
        raise (NotWhatItSays if state is not None else TechniqueFailed)(
            f"{problem.rstrip('.')}; not made by the TFLite converter: {blocked}"
        )
    if problem and _other_route(ws, recipe):
        other = recipe.with_backend(Backend.CONVERTER)
        state = ws.produce(other.steps, other.name)
        with timed(ws.phases, "verify"):
            parsed, composition = _read_back(state.path, other)
            other_problem = verify.check(other, composition)
        if other_problem is None:
            how = "TFLITE_BUILTINS_INT8" if verify.integer_only(other) else "its own quantizer"
            note = f"made by the TFLite converter ({how}): LiteRT Quantizer's result failed: {problem}"
            state.notes = [*state.notes, note]
            return other, state, composition, parsed
        problem = f"{problem}; the converter leaves them float too"
    if problem:
        raise NotWhatItSays(problem)
    return recipe, state, composition, parsed


def _no_calibrator(ws: Workspace, recipe: Recipe) -> str | None:
    """Why the TFLite converter cannot make the recipe's calibrated scheme from its float model: control flow
    (a GRU or SimpleRNN lowered to a WHILE loop) that the converter's calibrator does not go through (it
    crashes with SIGSEGV there: a Keras 2.0 bidirectional GRU did, in four candidates)."""
    if str(recipe.scheme) not in CALIBRATED_SCHEMES:
        return None
    prefix: list = []
    for step in recipe.steps:
        prefix.append(step.model_dump())
        if step.technique == "convert":
            state = ws.memo.get(_key(ws.root, prefix))
            if state is None or state.kind != "tflite" or not state.path.is_file():
                return None
            flow = calibrator.control_flow(state.path.read_bytes())
            if not flow:
                return None
            return f"its {recipe.scheme} calibration does not go through {calibrator.describe_flow(flow)} (it crashes)"
    return None


def _failed_after_conversion(ws: Workspace, recipe: Recipe) -> bool:
    """Whether every step before the recipe's first .tflite step was made (so a failure was a quantizer's)."""
    prefix: list = []
    for step in recipe.steps:
        if registry.get(step.technique).stage is Stage.TFLITE:
            return not prefix or _key(ws.root, prefix) in ws.memo
        prefix.append(step.model_dump())
    return False


def _other_route(ws: Workspace, recipe: Recipe) -> bool:
    """Whether the TFLite converter can make the same scheme (a Keras or SavedModel source, a LiteRT recipe
    with a different converter form): the route tried when LiteRT Quantizer's fails or fails verification."""
    if recipe.made_by != Backend.LITERT or ws.src.flat or recipe.uses("selective"):
        return False
    return recipe.with_backend(Backend.CONVERTER).steps != recipe.steps


def _load(artifact: Path, threads: int, data: Dataset | None):
    """The artifact's interpreter, built once for measuring and the XNNPACK column (None: not loadable);
    inputs with free dimensions take the data's shape before it is allocated."""
    from optimize.models import runtime
    from optimize.models.data import take

    try:
        return runtime.load(artifact, threads=threads, like=take(data.x_test, slice(0, 1)) if data else None)
    except ModelError:
        return None  # measuring says why, in its own words


def _measure(ws: Workspace, artifact: Path, state: _State, phases: dict, timing: tuple | None, **kw) -> Metrics:
    """Every measurement, each in its phase (`timing`: (runs, memory) to time it here too, as single runs
    do; sweeps time candidates together afterwards). A model this runtime cannot run (custom ops it
    lacks) keeps its size only."""
    try:
        with timed(phases, "accuracy"):  # and fidelity
            metrics = measure.evaluate(artifact, ws.data, threads=ws.threads, timing=False, **kw)
        if timing is not None:
            runs, memory = timing
            sample = take(ws.data.x_test, slice(0, 1)) if ws.data is not None else None
            with timed(phases, "latency"):
                metrics = measure.add_timing(metrics, artifact, sample, threads=ws.threads, runs=runs, memory=False)
            if memory:
                with timed(phases, "memory"):
                    metrics = measure.add_memory(metrics, artifact, ws.threads, sample)
        return metrics
    except ModelError as e:
        if "custom op" not in e.problem.lower() and "ops_custom" not in e.problem:
            raise
        state.notes = [*state.notes, f"not run: this runtime lacks the model's custom ops ({e.problem[:160]})"]
        return Metrics(size=measure.size_of(artifact))


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
    eval_samples: int | None = measure.DEFAULT_SAMPLES,
    timing: bool = True,
    progress: Progress | None = None,
    data_errors_fatal: bool = True,
) -> Candidate:
    """Produce, verify, copy out, measure and check one candidate. Failures become the candidate's error,
    and leave no artifact behind. A DataError ends the run (one `error:` line) unless `data_errors_fatal` is
    False: in a sweep, whose data was checked up front, it fails only this candidate."""
    progress = progress or Progress()
    t0 = time.perf_counter()
    artifact = artifact_path(out_dir, recipe.name)
    phases: dict[str, float] = {}
    ws.phases, ws.carried = phases, 0.0
    try:
        made, state, composition, parsed = produce_verified(ws, recipe)
        t0 -= ws.carried  # its source's export, done in the sweep's own process, is part of its time
        with timed(phases, "verify"):  # placed in the output folder with its TFLite metadata (engine.ship)
            said: list[str] = []
            contract = ship_out(ws, state.path, artifact, recipe.name, str(made.scheme), said)
            state.notes = [*state.notes, *said]
        metrics = None
        with timed(phases, "load"):
            loaded = _load(artifact, ws.threads, ws.data) if measure_it or delegates else None
        checked = _checked_already(state, reference)  # the quantizer's check ran these bytes (their sha256) or None
        with timed(phases, "probe"):
            probed = _probe_loaded(ws, loaded, state, reference, made, progress, checked is not None)
        if measure_it:
            progress.phase(f"{recipe.name}: measuring")
            metrics = _measure(
                ws,
                artifact,
                state,
                phases,
                (runs, memory) if timing else None,
                reference=reference,
                samples=eval_samples,
                baseline_accuracy=baseline.accuracy if baseline else None,
                loaded=loaded,
                on_target=True if reference is not None else "self",
                digest=checked,
                contract=state.records.get("contract"),
            )
        _refuse_nonfinite(metrics)
        notes = list(state.notes)
        if delegates:
            progress.phase(f"{recipe.name}: checking delegates")
        with timed(phases, "delegates"):
            reports = (
                check_all_delegates(artifact, ws.threads, notes, loaded=loaded, parsed=parsed) if delegates else {}
            )
        return Candidate(
            name=recipe.name,
            steps=list(made.steps),
            recipe_hash=made.hash,
            scheme=made.scheme,
            backend=state.records.get("backend", made.made_by),
            artifact=artifact.name,
            metrics=metrics,
            delegates=reports,
            composition=composition,
            skipped_layers=state.skipped,
            notes=notes,
            search=state.records.get("search", []),
            rescue=state.records.get("rescue", []),
            debug=state.records.get("debug"),
            probe=probed,
            islands=state.records.get("islands", []),
            repair=state.records.get("repair"),
            contract=contract,
            output_contract=state.records.get("contract"),
            fit=state.records.get("fit"),
            seconds=time.perf_counter() - t0,
            phases=_ordered(phases),
        )
    except DataError as e:
        if data_errors_fatal:
            raise
        artifact.unlink(missing_ok=True)
        return _failed(recipe, e, t0)
    except RecipeError:
        raise
    except OSError as e:
        artifact.unlink(missing_ok=True)
        _raise_if_no_room(e, artifact)
        return _failed(recipe, e, t0, phases)
    except Exception as e:  # a technique failing on this model is a failed candidate, not a crashed run
        artifact.unlink(missing_ok=True)
        return _failed(recipe, e, t0, phases)


_NO_ROOM = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)


def _raise_if_no_room(e: OSError, artifact: Path) -> None:
    """A full or read-only disk is the disk's fault, not the technique's: the run cannot go on."""
    if e.errno in _NO_ROOM:
        where = e.filename or artifact
        raise OptimizeError(
            f"Cannot write {where}: {e.strerror}.", "Free disk space, or write elsewhere with -o."
        ) from None


def _ordered(phases: dict[str, float]) -> dict[str, float]:
    """Phases in the order they run (results.PHASES), rounded to the millisecond."""
    return {p: round(phases[p], 3) for p in PHASES if p in phases}


def _failed(recipe: Recipe, e: BaseException, t0: float, phases: dict[str, float] | None = None) -> Candidate:
    failed = Candidate.failed(recipe, e, seconds=time.perf_counter() - t0, detail=getattr(e, "detail", None))
    if phases:
        failed = failed.model_copy(update={"phases": _ordered(phases)})
    if isinstance(e, probe.ProbeFailed):
        failed = failed.model_copy(update={"probe": e.probe})
    log.warning("  %s failed: %s", recipe.name, failed.error)
    return failed


def _probe_loaded(ws: Workspace, loaded, state: _State, reference, recipe: Recipe, progress: Progress, checked: bool):
    """The robustness probe on the candidate's interpreter (None when it does not load here); without
    data, a note on the free input dimensions it ran at."""
    if loaded is None:
        return None
    if ws.data is None:
        state.notes = [*state.notes, *_free_note(loaded)]
    if checked:
        from optimize.models import runtime

        # these bytes ran on every probe input (and more) in the quantizer's own check, against this same
        # float model: the probe's verdict, without running them again
        failures = state.records["checked"]["reference_failures"]
        return probe.passed(runtime.Runner(loaded), ws.data, reference, failures)
    progress.phase(f"{recipe.name}: probing edge inputs")
    return robustness(ws, loaded, reference, recipe)


def _checked_already(state: _State, reference: Path | None) -> str | None:
    """The artifact's sha256 when the quantizer's failure check ran this very artifact on every probe input,
    compared with the very float model that is the probe's reference (transforms.tflite.repair.Check); else None."""
    checked = state.records.get("checked")
    if not checked or reference is None:
        return None

    def digest(path: Path) -> str:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()

    same = checked["sha256"] == digest(state.path) and checked["float_sha256"] == digest(reference)
    return checked["sha256"] if same else None


def _refuse_nonfinite(metrics: Metrics | None) -> None:
    """A candidate that answers NaN/inf on test samples where its float reference does not has failed, as
    one failing the probe has: said with the output and the count."""
    fid = metrics.fidelity if metrics else None
    bad = [o for o in (fid.outputs if fid else []) if o.nonfinite_samples]
    if bad:
        o = bad[0]
        raise TechniqueFailed(
            f"gives non-finite outputs (NaN/inf) on {o.nonfinite_samples} of {fid.samples} test samples where "
            f"{fid.reference} does not (output {o.name})"
        )


def _free_note(loaded) -> list[str]:
    """Without data, a model with free input dimensions runs at 1 along each: say so."""
    from optimize.models import runtime

    free = runtime.free_dims(loaded.interpreter)
    return [f"measured without data: {free}; pass --data to measure it at the data's shape"] if free else []


def robustness(ws: Workspace, loaded, reference: Path | None, recipe: Recipe) -> Probe:
    """The robustness probe on the candidate's own interpreter (optimize.measure.probe). Failing it fails the
    candidate: compared with the float reference, or, with none, whenever the candidate is not the float
    model itself (the float baseline's own failures are recorded, never held against it)."""
    from optimize.models import runtime

    report = probe.run(runtime.Runner(loaded), ws.data, reference, ws.threads)
    if report.failures and (reference is not None or recipe.scheme != "float32"):
        raise probe.ProbeFailed(report)
    return report


def check_all_delegates(artifact: Path, threads: int, notes: list[str], loaded=None, parsed=None) -> dict:
    """Delegate reports for one artifact (`loaded`: its interpreter, when measuring built one; `parsed`: its
    flatbuffer as verification read it). A checker
    that cannot read the artifact is noted on the candidate (in `notes`), never fatal: the candidate
    stands without its delegate columns."""
    from optimize.delegates import check_delegates

    try:
        return check_delegates(artifact, threads=threads, loaded=loaded, parsed=parsed)
    except OptimizeError as e:
        notes.append(f"delegates: not checked ({e.problem})")
        return {}


def prepare(
    recipe: Recipe, src: models.ModelSource, ds: Dataset | None, backend: Backend | str | None = None
) -> Recipe:
    """The recipe as it will run on this model and data: implicit steps filled in, post-training schemes
    expressed with the backend (`None`: the recipe's own, by default auto), data checked up front."""
    recipe = checked(recipe, src, ds).with_backend(backend)
    if recipe.uses("pt2e") and not src.torch:
        raise RecipeError(
            f"{recipe.name}: pt2e quantizes a PyTorch or ONNX model's torch graph; {src.path.name} is {src.kind}.",
            "Use --backend litert (LiteRT Quantizer) for this model.",
        )
    if recipe.needs_calibration and ds is None:
        raise DataError(
            f"{recipe.name}: {recipe.scheme} needs calibration data.",
            "Pass --calibration DATA.npz (an .npz with x) or --data DATA.npz.",
        )
    check_data(src, ds)
    return recipe


def own_reference(
    ws: Workspace, recipe: Recipe, samples: int | None = measure.DEFAULT_SAMPLES
) -> tuple[Path | None, Metrics | None]:
    """What a single run is compared with: the float .tflite it started from, or the float32 conversion
    of the same model (made in the workspace, not the output folder); and that reference's metrics, on the
    same test samples as the run's (`samples`)."""
    if [s.technique for s in recipe.steps] == ["convert"] and recipe.scheme == "float32":
        return None, None  # the float32 model is its own reference
    if ws.src.flat:
        source = ws.source().path
        return source, measure.evaluate(source, ws.data, threads=ws.threads, timing=False, samples=samples)
    float32 = resolve(build("float32", [{"technique": "convert"}]), ws.src)
    base = make_candidate(ws, float32, ws.workdir, delegates=False, timing=False, eval_samples=samples)
    return (ws.workdir / base.artifact, base.metrics) if base.ok else (None, None)

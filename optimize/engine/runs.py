"""One model's sweep as a `Run`: the recipes planned (the default sweep, a target's recipe, what is dropped
and why), the inputs checked, results cached by content, and the study assembled (accuracy rescue included).

`schedule.py` drives runs through an executor; `sweeps.py` is the entry that opens one and runs it.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from optimize.convert import keras as exporting
from optimize.convert.front import open_inputs
from optimize.core import paths
from optimize.core.recipe import Recipe, build
from optimize.core.results import Candidate, Dropped, MemoryUse, Study
from optimize.core.vocab import Backend, Target
from optimize.engine import outputs
from optimize.engine.budget import converts_directly, weights_bytes
from optimize.engine.cache import ResultCache, key_for, result_cache
from optimize.engine.plan import _is_baseline, asks_training, plan_from, resolve, tasks, with_samples
from optimize.engine.work import Settings
from optimize.measure import metrics as measure
from optimize.models import _tf, facts
from optimize.models import source as models
from optimize.models.data import Dataset, take
from optimize.models.inputs import MeasureOptions
from optimize.models.known import KnownModel, KnownRebuild
from optimize.present.progress import Progress

log = logging.getLogger(__name__)
COVERAGE_WARNING = 0.05  # warn when more of the test values than this lie outside the calibrated range


def _as_baseline(c: Candidate) -> Candidate:
    """The baseline is what the others are compared with, in its labelled output's own measure: a top-1
    (classes, yes/no) delta of zero, or an error ratio of one (regression). Never a delta for values: a zero
    accuracy delta on a regression baseline read as classes, and the guard judged MAE by points of top-1."""
    m = c.metrics if c.ok else None
    if m is None or m.accuracy is None or m.accuracy_delta is not None or m.error_ratio is not None:
        return c
    if m.accuracy.top1 is not None:
        return c.model_copy(update={"metrics": m.model_copy(update={"accuracy_delta": 0.0})})
    if m.accuracy.mae is not None:
        return c.model_copy(update={"metrics": m.model_copy(update={"error_ratio": 1.0})})
    return c


@dataclass
class Run:
    """One model's sweep: its inputs, plan and bookkeeping (`optimize.engine.schedule` drives it)."""

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
    groups: int = 1  # tasks its planned recipes can keep busy at once (plan.tasks)
    started: float = field(default_factory=time.perf_counter)  # when it was opened (perf_counter)
    open_seconds: float = 0.0  # opening and checking the model and data, planning
    created: list[Path] = field(default_factory=list)  # folders `-o` made that did not exist (deepest first)
    keras: object = field(default=None, repr=False)  # the Keras model the checks loaded (this process only)
    exporter: object = field(default=None, repr=False)  # or: (folder, direct) -> export, by the opener process
    footprint: int = 0  # bytes of the model's weights (its file): what memory estimates scale with (budget)
    memory: MemoryUse | None = None  # what the run's process tree held at its peak (set when the run ends)
    rescued: str | None = None  # the accuracy-rescue recipe the run added itself (mixed-int8), by name
    replaces: list[str] = field(default_factory=list)  # the .tflite files the study already in -o lists (schedule)
    fit: bool = True  # a fit round: the schemes a target misses made again from the fitted float graph
    fit_options: tuple[str, ...] = ()  # the fit's rewrites beyond the model's contract, as named (--fit-option)

    def export(self, direct: bool = True) -> tuple[Path, float] | None:
        """The source Keras model made ready for the float32 baseline (into the run's work folder), from the model
        the checks loaded, so the worker that takes the baseline neither loads nor exports it again: with `direct`,
        its float32 .tflite converted straight from the loaded model (`convert.keras.float32_direct`, checked
        equal to it on test samples); else, or where that route does not take the model, its SavedModel
        (`export_keras`). Made by the process that opened the model: this one, or the opener process whose
        checks loaded it (`exporter`; the sweep's process then never holds the model). None when there is
        nothing to export (a warm re-run, a .tflite, a SavedModel) or the export fails there (the worker then
        exports it itself, as before). With the seconds it took (the baseline's convert phase counts them).

        A model `budget.converts_directly` refuses (more than DIRECT_BYTES) is exported as a SavedModel, never
        converted where it was loaded: the baseline's worker converts that after the opener left, so loading and
        converting never stack (issue 44: the direct route held the loaded model beside the converter's copies, 19x
        the model's bytes on an 8x512 encoder, against 5.5x to open it and 8x to convert its SavedModel in a fresh
        process)."""
        model, self.keras = self.keras, None  # exported once; the model is not kept past it
        exporter, self.exporter = self.exporter, None
        if self.src.kind not in ("keras2", "keras3"):
            if exporter is not None:
                exporter(None)  # nothing to export (a SavedModel): the opener leaves now, not at the run's end
            return None
        direct = direct and converts_directly(self.footprint)
        folder = self.out_dir / ".work" / "export" / self.src.fingerprint
        if model is not None:
            return export_keras(model, self.src, self.ds, folder, direct)
        return exporter(folder, direct) if exporter is not None else None

    @property
    def baseline(self) -> Recipe | None:
        return next((r for r in self.recipes if _is_baseline(r)), None)

    @property
    def task_settings(self) -> Settings:
        s = self.settings
        return Settings(s["threads"], s["eval_samples"], s["delegates"], data_errors_fatal=False)

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
        """Add the accuracy-rescue candidate when full int8 breaks accuracy (see `_rescue`), and the integer
        files with a normalised YOLO head when int8 loses a raw head's detections (`_integer_head`)."""
        extra = _rescue(self)
        if extra is not None:
            self.recipes.append(extra)
            self.rescued = extra.name
        heads = _integer_head(self)
        self.recipes += heads
        return extra is not None or bool(heads)

    def fit_round(self) -> bool:
        """Add the `fit-*` candidates when fitting the float graph buys a target (`engine.fitting`)."""
        from optimize.engine.fitting import fitted_recipes

        extra = fitted_recipes(self, self.fit_options) if self.fit and self.settings.get("delegates", True) else []
        self.recipes += extra
        return bool(extra)

    def study(self, executor: str = "local") -> Study:
        """The finished study, saved as out_dir/study.json."""
        study = _study(self, self.model, self.settings["threads"], executor)
        if self.observe:  # after timing, so the accelerator's threads never disturb a measurement
            from optimize.delegates.observe import observe_study
            from optimize.engine.on_gpu import observe_arithmetic

            study = observe_study(study, self.out_dir, Progress())
            study = observe_arithmetic(
                study, self.out_dir, self.ds, self.settings["threads"], self.settings["eval_samples"]
            )
        study.save(self.out_dir / "study.json")
        return study


def export_keras(model, src: models.ModelSource, ds: Dataset | None, folder: Path, direct: bool = True):
    """`Run.export`'s work on a loaded Keras model: (the float32 .tflite, or the SavedModel where the direct route
    does not take the model, the seconds it took), or None when it fails (the baseline's worker meets the failure
    again, as a failed candidate)."""
    batch = 1 if src.kind == "keras3" else None
    t0 = time.perf_counter()
    try:
        made = exporting.float32_direct(model, ds, batch) if direct else None
        if made is not None:
            if made.notes:
                paths.write_atomic(folder / exporting.EXPORT_NOTES, json.dumps(list(made.notes)).encode())
            path = paths.write_atomic(folder / "float32.tflite", made.content)
        else:
            path = exporting.export_saved_model(model, folder / "saved_model", batch=batch)
    except Exception as e:  # noqa: BLE001 - the worker's own export meets it again, as a failed candidate
        log.debug("exporting %s failed (%s); the worker exports it", src.name, e)
        return None
    return path, time.perf_counter() - t0


@dataclass(frozen=True)
class OpenRequest:
    """What opening one model asks (`open_run`'s inputs), sent to the opener process that loads it in the sweep's
    place (`opened_elsewhere`)."""

    model: str | Path
    data: str | Path | Dataset | None
    measuring: MeasureOptions | None
    trust: bool
    layout: str
    threads: int
    trains: bool


class Found:
    """A `Memo` that knows what another process's checks found about the model, in front of the result cache's own
    (`behind`, None without a cache). `elsewhere`, asked at the first question the cache cannot answer, opens and
    checks the model in another process (`opened_elsewhere`, in an opener process) and gives its records: the
    sweep's process then opens and plans the model as a warm re-run does, without loading it. What is found is
    kept in the cache too."""

    def __init__(self, behind=None, elsewhere=None) -> None:
        self.models: dict = {}
        self.rebuilds: dict = {}
        self.behind = behind
        self.elsewhere = elsewhere

    def _ask_elsewhere(self) -> bool:
        ask, self.elsewhere = self.elsewhere, None
        for r in ask() if ask is not None else []:
            (self.put_model if isinstance(r, KnownModel) else self.put_rebuild)(r)
        return ask is not None

    def model(self, fingerprint: str):
        hit = self.models.get(fingerprint) or (self.behind.model(fingerprint) if self.behind else None)
        return hit if hit is not None or not self._ask_elsewhere() else self.models.get(fingerprint)

    def rebuild(self, fingerprint: str, data: str | None):
        hit = self.rebuilds.get((fingerprint, data)) or (
            self.behind.rebuild(fingerprint, data) if self.behind else None
        )
        return hit if hit is not None or not self._ask_elsewhere() else self.rebuilds.get((fingerprint, data))

    def put_model(self, record) -> None:
        self.models[record.fingerprint] = record
        if self.behind is not None:
            self.behind.put_model(record)

    def put_rebuild(self, record) -> None:
        self.rebuilds[(record.fingerprint, record.data)] = record
        if self.behind is not None:
            self.behind.put_rebuild(record)


def opened_elsewhere(request: OpenRequest):
    """In the opener process: the model opened and checked as `open_run` does, with the planning facts a Keras 3
    model's rebuild decides; (what was found, as `known` records; the Keras model the checks loaded, or None).
    A bad model or data raises the same one-line error the sweep's process would have."""
    found = Found()
    loaded: list = []
    src, ds = open_inputs(
        request.model, request.data, measuring=request.measuring, trust=request.trust, check=True, known=found,
        layout=request.layout, on_loaded=loaded.append, threads=request.threads,
    )  # fmt: skip
    _planning_facts(found, src, ds, request.trains)
    return [*found.models.values(), *found.rebuilds.values()], (src, ds, loaded[0] if loaded else None)


def open_run(
    model: str | Path | None = None,
    data: str | Path | Dataset | None = None,
    output: str | Path = "optimize-out",
    recipes: list[Recipe] | None = None,
    threads: int = 2,
    backend: Backend | str | None = None,
    delegates: bool = True,
    runs: int = 50,
    eval_samples: int | None = measure.DEFAULT_SAMPLES,
    cache: bool | str = True,
    target: Target | str | None = None,
    measuring: MeasureOptions | None = None,
    calibration_samples: int | None = None,
    trust_model_code: bool = False,
    tag: str = "",
    observe: tuple[str, ...] = (),
    layout: str = "source",
    keep_keras: bool = False,
    elsewhere=None,
    replace: bool = True,
    fit: bool = True,
    fit_options: tuple[str, ...] = (),
    graph=None,
) -> Run:
    """One model's sweep, planned and checked (one clear line for bad inputs, before anything is written).
    A PyTorch or ONNX model is converted here (`layout`: its image I/O), and the conversion's own error
    against the source runtime measured on the data. `keep_keras`: the Keras model the checks load is kept on the
    run for its baseline (`Run.export`; a one-model sweep keeps it, a zoo of many does not hold them all). `elsewhere`:
    opens and checks the model in another process when the cache does not know it (`Found`): it is then opened
    here as a warm re-run opens it, without loading it. `replace=False`: an output folder holding another model's
    study is refused before any work (`outputs`). `graph`: a TF1 frozen graph's input and output nodes
    (`convert.graph_def.GraphIO`), when named."""
    started = time.perf_counter()
    if model is None or isinstance(model, (str, Path)):  # another model's study: one line before anything is opened
        outputs.refuse_another_model(output, "demo" if model is None else str(model), None, replace)
    store = result_cache(cache)  # a cache that cannot be used: one line, before any work
    known = store.known(trust_model_code)  # what earlier runs' checks found: a warm re-run needs no TensorFlow
    if elsewhere is not None:
        known = Found(known, elsewhere)
    trains = asks_training(recipes, target)
    loaded: list = []  # the Keras model the checks load, exported for the baseline (Run.export)
    src, ds = open_inputs(
        model, data, measuring=measuring, trust=trust_model_code, check=True, known=known, layout=layout,
        on_loaded=loaded.append if keep_keras else None, threads=threads, graph=graph,
    )  # fmt: skip
    label = "demo" if model is None else (str(model) if not src.kind == "module" else src.name)
    outputs.refuse_another_model(output, label, src.fingerprint, replace)
    dropped: list[Dropped] = []
    can = _planning_facts(known, src, ds, trains)
    planned = plan_from(src, ds, can, recipes, backend, target, dropped)
    if calibration_samples is not None:
        planned = [with_samples(r, calibration_samples) for r in planned]
    _judged_on_calibration(ds, planned)
    created = paths.absent_folders(output)
    out_dir = paths.output_dir(output)
    settings = {"threads": threads, "runs": runs, "eval_samples": eval_samples, "delegates": delegates}
    settings["versions"] = _tf.versions()
    return Run(
        src, ds, out_dir, planned, settings, store, model=label, tag=tag, dropped=dropped, observe=observe,
        groups=tasks(planned), started=started, open_seconds=time.perf_counter() - started, created=created,
        keras=loaded[0] if loaded else None, footprint=weights_bytes(src), fit=fit, fit_options=tuple(fit_options),
    )  # fmt: skip


def _planning_facts(known, src: models.ModelSource, ds: Dataset | None, trains: bool) -> facts.PlanFacts:
    """What planning asks of the model, in one visit (`facts.for_planning`). Whether a Keras 3 model rebuilds in
    tf_keras (TensorFlow) is taken from `known` when an earlier run found it for these bytes and data, and a
    new answer is handed to it: a warm re-run plans without TensorFlow."""
    data = ds.fingerprint if ds is not None else None
    record = known.rebuild(src.fingerprint, data) if known is not None and src.kind == "keras3" else None
    can = facts.for_planning(src, ds, trains, record)
    if known is not None and record is None and can.rebuild is not None:
        why, note = can.rebuild
        known.put_rebuild(KnownRebuild(fingerprint=src.fingerprint, data=data, why=why, note=note))
    return can


def _study(run: Run, model, threads: int, executor: str = "local") -> Study:
    base = run.baseline
    if base is not None and base.name in run.done:
        run.done[base.name] = _as_baseline(run.done[base.name])
    labelled = next((c.metrics.accuracy for c in run.done.values() if c.ok and c.metrics.accuracy), None)
    outside = _coverage(run)
    duplicates = _duplicate_rescue(run)
    return Study(
        created=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        model=model,
        model_fingerprint=run.src.fingerprint,
        data=run.ds.source if run.ds else None,
        task=labelled.task if labelled else None,
        calibration_outside=outside,
        baseline=base.name if base else "float32",
        environment=_tf.environment(threads),
        executor=executor,
        candidates=[run.done[r.name] for r in run.recipes if r.name not in duplicates],
        dropped=run.dropped + [Dropped(recipes=[name], reason=why) for name, why in duplicates.items()],
        open_seconds=round(run.open_seconds, 3),
        seconds=round(time.perf_counter() - run.started, 3),
        split=run.ds.split if run.ds else None,
        conversion=run.src.conversion,
        memory=run.memory,
    )


#: When plain int8 loses more than this, a sweep adds the selective (mixed int8) candidate.
RESCUE_DROP = 0.01  # classification: one point of top-1
RESCUE_INCREASE = 0.05  # regression: 5% more error


def _plain_int8(run: Run) -> Candidate | None:
    """The sweep's post-training int8 candidate with float I/O and no Keras step, if it ran."""
    from optimize.transforms.tflite.calibrator import CALIBRATOR_OPS

    for r in run.recipes:
        made = run.done.get(r.name)
        if made is not None and r.scheme == "int8" and r.made_by == "litert" and not r.trains and r.io == "float":
            # LiteRT Quantizer cannot quantize the fused LSTM ops at all: no per-op search through it there
            lstm = made.backend == Backend.CALIBRATOR and any(op in n for n in made.notes for op in CALIBRATOR_OPS)
            return None if lstm else made
    return None


#: Without labels, plain int8 worse than the default guard (optimize.decide.guard) gets the rescue too.
RESCUE_OUTPUT_ERROR = 0.05  # the worst output's mean |diff| over its range
RESCUE_AGREEMENT = 0.98  # top-1 agreement with float32, for class outputs
RESCUE_DETECTIONS = 0.95  # a detector: the share of float32's detections int8 must keep (the default guard's)
RESCUE_DETECTIONS_BUDGET = 0.98  # what the search aims at on its few held-out samples, so the guard's holds


def _rescue(run: Run) -> Recipe | None:
    """The selective-quantization candidate, when full int8 breaks accuracy (or, without labels, fidelity)
    and none was planned: it tries the rescue that keeps 8 bits (optimize.transforms.tflite.rescue) before
    raising any op."""
    int8 = _plain_int8(run)
    if int8 is None or not int8.ok or any(s.technique == "selective" for r in run.recipes for s in r.steps):
        return None
    lost = _lost(int8)
    if lost is None:
        return None
    log.warning("%s %s: adding mixed-int8 (8-bit rescue first, then ops raised if needed).", int8.name, lost[0])
    return resolve(build("mixed-int8", [{"technique": "convert"}, {"technique": "selective", **lost[1]}]), run.src)


def _lost(int8: Candidate) -> tuple[str, dict] | None:
    """(what plain int8 lost, the search budget that wins it back), or None when it lost too little."""
    m = int8.metrics
    if m.accuracy_delta is not None and m.accuracy_delta < -RESCUE_DROP:
        return f"lost {-m.accuracy_delta * 100:.1f} points", {"max_accuracy_drop": 0.005}
    if m.error_ratio is not None and m.error_ratio > 1 + RESCUE_INCREASE:
        return f"made the error x{m.error_ratio:.2f}", {"max_error_increase": 0.10}
    lost = _lost_detections(m) or _lost_masks(m)
    if lost is not None:
        return lost
    fid = m.fidelity if m.accuracy is None else None
    if fid is None:
        return None
    least = fid.least_agreeing()
    err, agree = fid.relative_error or 0.0, least.agreement if least is not None else None
    if err > RESCUE_OUTPUT_ERROR or (agree is not None and agree < RESCUE_AGREEMENT):
        return f"is {err:.1%} off float32", {"max_output_error": 0.01}
    return None


#: The integer files made from the float model with its raw YOLO head's boxes normalised (int8 I/O or float I/O).
INTEGER_HEAD = {"int8-boxes": "float", "int8-int8io-boxes": "int8"}
HEAD_RANGES = {"calibration": "percentile"}


def _integer_head(run: Run) -> list[Recipe]:
    """int8 (float and int8 I/O) of the float model with its raw YOLO head's boxes normalised by the input's
    size (optimize.transforms.tflite.yolo_head), when plain int8 keeps too few of a yolo head's detections: one
    int8 output then holds boxes and scores, and integer targets (Hexagon, microcontrollers) get a file. Their
    output contract changes (boxes 0..1), and each candidate says so. Ranges by percentile: min/max lets a few
    outlying activations widen the steps where class scores cross the threshold (YOLOv8s from a wheel, the same
    48 calibration crops, 56 detections on 96 held-out: min/max kept 87.5%, percentile 94.6%)."""
    int8 = _plain_int8(run)
    if int8 is None or not int8.ok or any(r.name in INTEGER_HEAD for r in run.recipes):
        return []
    det = int8.metrics.fidelity.detection if int8.metrics and int8.metrics.fidelity else None
    if det is None or det.layout != "yolo" or det.kept_fraction is None or det.kept_fraction >= RESCUE_DETECTIONS:
        return []
    log.warning("%s keeps %.0f%% of float32's detections: adding %s.", int8.name, det.kept_fraction * 100,
                " and ".join(INTEGER_HEAD))  # fmt: skip
    steps = [{"technique": "convert"}, {"technique": "yolo_head"}]
    return [
        resolve(build(name, [*steps, {"technique": "quantize", "scheme": "int8", "io": io, **HEAD_RANGES}]), run.src)
        for name, io in INTEGER_HEAD.items()
    ]


def _duplicate_rescue(run: Run) -> dict[str, str]:
    """The mixed-int8 candidate the run added itself, when its search raised no op and its rescue kept no step:
    it is plain int8 again (judged on held-out samples, int8 met the budget there), so it is left out, with why,
    rather than shown beside int8 as if it were something else."""
    c = run.done.get(run.rescued) if run.rescued else None
    if c is None or not c.ok:
        return {}
    if any(s.kept and s.precision != "int8" for s in c.search) or any(r.kept for r in c.rescue):
        return {}
    judged = next((n.split(" (not the test split", 1)[0] for n in c.notes if n.startswith("selective: on ")), "")
    where = judged.removeprefix("selective: on ") or "its validation samples"
    why = (
        f"int8 met the selective search's budget on {where}, so it raised no op and kept no rescue step: it "
        "would duplicate int8 (whose table figures are on the test split)"
    )
    log.warning("Dropped %s: %s", c.name, why)
    return {c.name: why}


def _judged_on_calibration(ds: Dataset | None, recipes: list[Recipe]) -> None:
    """Say so when the data has no split apart from its test samples (only x_test, or only x_cal): calibration
    then draws from the samples every figure is measured on, and no decision is held out of it."""
    if ds is None or ds.x_train is not None or ds.x_cal is not ds.x_test:
        return
    if any(r.needs_calibration for r in recipes):
        log.warning(
            "%s has no training split: int8 is calibrated on the same samples its accuracy and fidelity are "
            "measured on. Give x/y (split 80/20) or x_train/x_test, or calibration samples of their own (x_cal).",
            Path(ds.source).name,
        )


RESCUE_MASK_IOU = 0.9  # a segmenter: the mask IoU with float32's int8 must keep (the default guard's)
RESCUE_MASK_BUDGET = 0.95  # what the search aims at on its held-out samples, so the guard's holds


def _lost_masks(m) -> tuple[str, dict] | None:
    """A segmenter's int8 whose masks (pooled, or on its worst samples) fall under the guard's IoU: the search's
    budget is the masks' IoU (round 5's next step: a rescue for segmenters driven by mask IoU)."""
    ious = [o.iou for o in m.fidelity.outputs if o.iou is not None] if m.fidelity is not None else []
    if not ious or min(ious) >= RESCUE_MASK_IOU:
        return None
    return f"keeps a mask IoU of {min(ious):.1%} with float32's", {"min_mask_iou": RESCUE_MASK_BUDGET}


def _lost_detections(m) -> tuple[str, dict] | None:
    """A detector's int8 that keeps too few of float32's detections: the search's budget is the detections."""
    det = m.fidelity.detection if m.fidelity is not None else None
    if det is None or det.kept_fraction is None or det.kept_fraction >= RESCUE_DETECTIONS:
        return None
    return f"keeps {det.kept_fraction:.0%} of float32's detections", {"min_detections_kept": RESCUE_DETECTIONS_BUDGET}


def _coverage(run: Run) -> dict[str, float]:
    """How much of the test data lies outside the calibrated range, per input; a warning when it is a lot."""
    from optimize.models.data import coverage

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

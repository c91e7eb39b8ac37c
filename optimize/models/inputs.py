"""The data read, and checked against the opened model before any work starts: one clear line when they do not
fit. (`optimize.convert.front.open_inputs` is the front door every command goes through: it opens the model,
converts a PyTorch or ONNX one, and calls these.)"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from optimize.core.errors import ModelError
from optimize.core.vocab import Task
from optimize.models import source as models
from optimize.models.data import Dataset, check_inputs, combine, fitted, load_data, warn_split
from optimize.models.known import Memo, heads_of, record_model, specs_of
from optimize.models.tasks import check_label_names, check_labels_fit
from optimize.models.tflite import not_float


def checked(
    src: models.ModelSource,
    ds: Dataset | None,
    measuring: MeasureOptions | None = None,
    check: bool = False,
    known: Memo | None = None,
    on_loaded=None,
) -> Dataset | None:
    """The data told what it measures (`measured`), the model checked with `check` (it loads, it is float, the
    labels fit its outputs: `check_data`), the data made to fit the model's integer inputs (`data.fitted`) and,
    with `check`, against its inputs; a thin split said once. What is asked of the model was read when it was
    opened (its inputs, outputs, id bounds)."""
    ds = measured(src, ds, measuring)
    specs = _checked_model(src, ds, known, on_loaded) if check else None
    if ds is not None and src.inputs is not None:
        ds = fitted(ds, {s.name: s.dtype for s in src.inputs}, list(src.id_bounds), len(src.inputs))
    if ds is not None and specs is not None:
        check_inputs(ds, specs())
    warn_split(ds)
    return ds


def check_data(src: models.ModelSource, data: Dataset | None, known: Memo | None = None, on_loaded=None) -> None:
    """Check the model and data before any work starts (one clear line if they do not fit): a .tflite must
    be a float model once normalised, the labels must fit the model's outputs and the data its inputs.

    A Keras model is loaded to check it (TensorFlow), unless `known` holds what loading these exact bytes
    found (`optimize.models.known`); what a load finds is handed to `known` for the next run, and the loaded
    model to `on_loaded` (a sweep exports it for its float32 baseline instead of loading it again)."""
    specs = _checked_model(src, data, known, on_loaded)
    if data is not None:
        check_inputs(data, specs())


def _checked_model(src: models.ModelSource, data: Dataset | None, known: Memo | None, on_loaded):
    """The model's own checks (it loads; a .tflite is a float model once normalised) and the labels against its
    outputs; its input specs, as a function computing them once."""
    heads, specs = _model_facts(src, known, on_loaded)
    why = not_float(src.content) if src.flat and src.content is not None else None
    if why:
        raise ModelError(
            f"{src.path.name} cannot be optimized: {why}.",
            "Pass the float32 model it was made from; `optimize evaluate` and `optimize compat` measure it as it is.",
        )
    if data is not None:
        check_label_names(data)
        check_labels_fit(data, heads())
    return specs


def _model_facts(src: models.ModelSource, known: Memo | None, on_loaded):
    """(its output heads, its input specs), each a function computing it once: from what an earlier run found
    for these bytes (`known`), else from the model (a Keras file loaded: one line now if it does not load, not
    a failed candidate later), then kept for the next run."""
    record = known.model(src.fingerprint) if known is not None and src.kind in KNOWABLE else None
    if record is not None and record.kind == src.kind:
        specs = specs_of(record)
        return (lambda: heads_of(record)), (lambda: list(specs) if specs is not None else models.input_specs(src))
    loaded = models.check_loads(src)
    if loaded is not None and on_loaded is not None:
        on_loaded(loaded)
    specs = _once(lambda: models.input_specs(src, loaded))
    heads = _once(lambda: models.output_heads(src, loaded))
    if known is not None and src.kind in KNOWABLE:
        inputs = specs()
        fresh = record_model(src, heads(), inputs)
        if fresh is not None:
            known.put_model(fresh)
    return heads, specs


KNOWABLE = models.TF_KINDS  # the kinds whose checks need TensorFlow


def _once(fn):
    memo: list = []

    def call():
        if not memo:
            memo.append(fn())
        return memo[0]

    return call


def read_data(data, calibration=None) -> Dataset | None:
    """The dataset: `calibration` supplies the calibration samples (its x), `data` the rest; either alone
    serves both (a path is loaded and checked; a Dataset is taken as it is)."""
    return combine(_dataset(data), _dataset(calibration))


def measured(src: models.ModelSource, ds: Dataset | None, measuring: MeasureOptions | None) -> Dataset | None:
    """The dataset told what it measures: the model's outputs, what the labels are and which output they
    belong to, how calibration samples are drawn (`measuring`; a Dataset passed in keeps its own settings)."""
    if ds is None:
        return None
    kept = {"task": ds.task, "label_output": ds.label_output, "calibration_seed": ds.calibration_seed}
    m = measuring or MeasureOptions(**kept)
    ds = replace(ds, outputs=src.outputs or (), **m.model_dump())
    if ds.task == Task.REGRESSION and ds.split is not None and ds.split.test_classes:  # values, not classes
        ds = replace(ds, split=ds.split.model_copy(update={"test_classes": {}, "warnings": []}))
    return ds


class MeasureOptions(BaseModel):
    """How a run reads its data: what the labels are, which output they belong to, calibration sampling."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    task: Task | None = Field(None, description="classification, binary, multilabel, regression or other.")
    label_output: str | None = Field(None, description="The output the labels belong to (default: the first).")
    calibration_seed: int = Field(0, description="Seeds the random choice of calibration samples.")


def _dataset(data: str | Path | Dataset | None) -> Dataset | None:
    return data if isinstance(data, Dataset) or data is None else load_data(data)

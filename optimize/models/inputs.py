"""The data read, and checked against the opened model before any work starts: one clear line when they do not
fit. (`optimize.convert.front.open_inputs` is the front door every command goes through: it opens the model,
converts a PyTorch or ONNX one, and calls these.)"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from optimize.core.errors import DataError, ModelError
from optimize.core.vocab import Task
from optimize.models import source as models
from optimize.models.data import Dataset, check_ids, check_inputs, combine, integer_ids, load_data, say_once, warn_split
from optimize.models.known import Memo, heads_of, record_model, specs_of
from optimize.models.normalize import not_float


def checked(
    src: models.ModelSource,
    ds: Dataset | None,
    measuring: MeasureOptions | None = None,
    check: bool = False,
    known: Memo | None = None,
    on_loaded=None,
) -> Dataset | None:
    """The data told what it measures (`measured`) and made to fit the opened model's integer inputs
    (`fit_data`), and, with `check`, the model and the data checked against each other (`check_data`); a thin
    split said once. What is asked of the model was read when it was opened (its inputs, outputs, id bounds)."""
    ds = fit_data(src, measured(src, ds, measuring))
    if check:
        check_data(src, ds, known, on_loaded)
    warn_split(ds)
    return ds


def check_data(src: models.ModelSource, data: Dataset | None, known: Memo | None = None, on_loaded=None) -> None:
    """Check the model and data before any work starts (one clear line if they do not fit): a .tflite must
    be a float model once normalised, and the data must fit the model's inputs.

    A Keras model is loaded to check it (TensorFlow), unless `known` holds what loading these exact bytes
    found (`optimize.models.known`); what a load finds is handed to `known` for the next run, and the loaded
    model to `on_loaded` (a sweep exports it for its float32 baseline instead of loading it again)."""
    heads, specs = _model_facts(src, known, on_loaded)
    why = not_float(src.content) if src.flat and src.content is not None else None
    if why:
        raise ModelError(
            f"{src.path.name} cannot be optimized: {why}.",
            "Pass the float32 model it was made from; `optimize evaluate` and `optimize compat` measure it as it is.",
        )
    if data is None:
        return
    check_inputs(data, specs())
    _check_label_names(data)
    _check_labels_fit(data, heads())


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
    heads = _once(lambda: models.output_heads(src, loaded))
    specs = _once(lambda: models.input_specs(src))
    if known is not None and src.kind in KNOWABLE:
        fresh = record_model(src, heads(), specs())
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


def _check_labels_fit(data: Dataset, named: list) -> None:
    """Every split's labels fit the output they belong to and its task (class ids in range, 0/1, as many
    values per sample as the output has), checked before any work: one line, nothing written."""
    from optimize.models import tasks

    if not named:
        return
    by_name = dict(named)
    by_name.update({f"output_{i}": head for i, (_, head) in enumerate(named)})  # a converted model's keys
    plain = data.label_output if data.label_output in by_name else named[0][0]
    for split, y in (("train", data.y_train), ("test", data.y_test)):
        for label, ys in (y.items() if isinstance(y, dict) else [(None, y)]) if y is not None else []:
            head = by_name.get(label or plain)
            if head is not None:
                where = f"y_{split}" + (f":{label}" if label else "")
                tasks.check_some_class(ys, head, where, data.task)
                tasks.check_labels(tasks.detect(head, ys, data.task), head, ys, where)


def _check_label_names(data: Dataset) -> None:
    """Labels keyed per output (y:<output>) and --label-output must name the model's outputs."""
    outputs = list(data.outputs)
    keyed = [k for y in (data.y_train, data.y_test) if isinstance(y, dict) for k in y]
    wrong = [k for k in dict.fromkeys(keyed) if outputs and k not in outputs]
    signature_keys = [f"output_{i}" for i in range(len(outputs))]  # what a converted model calls them
    if data.label_output is not None and outputs and data.label_output not in outputs + signature_keys:
        wrong.insert(0, data.label_output)
    if wrong:
        raise DataError(
            f"{wrong[0]!r} is not an output of the model (it has {', '.join(outputs)}).",
            "Key labels as y:<output name> and pass --label-output with one of those names.",
        )


def fit_data(src: models.ModelSource, ds: Dataset | None) -> Dataset | None:
    """The data made to fit the model's integer inputs before any work, from what the model says without
    loading it (its stored config, its .tflite): ids stored as floats cast when they are whole numbers (said
    on screen once) or refused in one line, and ids beyond the vocabulary of the embedding they index refused
    in one line naming the input and the bound. A model whose inputs are not known yet is left to `check_data`."""
    if ds is None or src.inputs is None:
        return ds
    ds, notes = integer_ids(ds, {s.name: s.dtype for s in src.inputs})
    say_once(notes)
    check_ids(ds, list(src.id_bounds), len(src.inputs))
    return ds


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

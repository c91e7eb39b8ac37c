"""How a PyTorch or ONNX model's data becomes its converted .tflite's inputs: the input plan, one sample taken
for tracing, and the data moved to the .tflite's names and layout (`route.source_feeds` moves a sample
back, for the source's own runtime).

Inputs keep the source model's names (the data's `x:<name>` keys; a name that is not a Python identifier
gets one, "227" -> "in_227"). A data array's rows are one sample each: for an input whose batch axis
comes first, a row is the input without it (`x` of shape (N, 3, 224, 224) for a [1, 3, 224, 224] input);
for one whose batch axis is not first (silero-vad's state [2, 1, 128]) a row is the whole input ((N, 2,
1, 128)), which the `.tflite` takes with a leading axis of 1 (the same bytes). A scalar integer input that
is one value in every sample (a sample rate) is frozen into the graph. With `layout="channels-last"`,
image inputs and outputs become NHWC, and the data, given in the source model's NCHW layout, is transposed
to fit. `Plan.key` is part of the converted source's fingerprint (and so of every cache key over it).
"""

from __future__ import annotations

import json
import keyword
import re
from dataclasses import dataclass, field, replace

import numpy as np

from optimize.convert import vocabulary
from optimize.core.errors import DataError
from optimize.core.results import Conversion, ConvertedInput
from optimize.core.shown import named
from optimize.core.vocab import Layout
from optimize.models.data import Dataset


def signature_name(name: str) -> str:
    """The .tflite signature's name for an input: the source's own where it is a Python identifier (the
    keyword torch.export traces), else a cleaned one ("227" -> "in_227", "x.1" -> "x_1")."""
    if name.isidentifier() and not keyword.iskeyword(name):
        return name
    clean = re.sub(r"\W", "_", name)
    return clean if clean.isidentifier() and not keyword.iskeyword(clean) else "in_" + clean


@dataclass(frozen=True)
class Declared:
    """One source input as the model declares it: name, dims (None: free), dtype."""

    name: str
    dims: tuple[int | None, ...] | None  # None: unknown rank (an nn.Module without sample inputs)
    dtype: str = "float32"


@dataclass
class Plan:
    """How the data's rows become the model's inputs, and what the conversion does to the interface."""

    inputs: list[ConvertedInput]
    frozen: dict[str, float | int] = field(default_factory=dict)
    layout: str = Layout.SOURCE
    facts: list[str] = field(default_factory=list)
    rows: dict[str, np.ndarray] = field(default_factory=dict, repr=False)  # one sample as the .tflite takes it
    source_rows: dict[str, np.ndarray] = field(default_factory=dict, repr=False)  # the same in the source's layout

    def key(self) -> str:
        shape = [(i.name, i.source_shape, i.sample_axis, i.dtype, i.layout) for i in self.inputs]
        return json.dumps([shape, sorted(self.frozen.items()), str(self.layout)], default=str)

    @classmethod
    def of(cls, record: Conversion) -> Plan:
        """The plan a conversion was made with (its record), to rebuild what it made."""
        return cls(list(record.inputs), dict(record.frozen), Layout(record.layout))


def _rows(ds: Dataset | None, name: str, single: bool) -> np.ndarray | None:
    """The calibration rows for one input (the unnamed `x` when the model has a single input)."""
    if ds is None:
        return None
    x = ds.x_cal
    if isinstance(x, dict):
        return x.get(name, x.get(signature_name(name)))
    return x if single else None


def _constant_scalar(rows: np.ndarray | None, d: Declared):
    """The value of a scalar integer input that is the same in every sample (configuration: frozen); stored
    as a float, a whole number counts, as it does once the ids are fitted (`vocabulary.fit`)."""
    if rows is None or rows.ndim != 1 or d.dims not in ((), None) or not rows.size:
        return None
    whole = np.issubdtype(rows.dtype, np.floating) and _integer(d.dtype) and np.all(rows == np.round(rows))
    if not (np.issubdtype(rows.dtype, np.integer) or whole):
        return None
    return int(rows[0]) if np.all(rows == rows[0]) else None


def _integer(dtype: str) -> bool:
    try:
        return np.issubdtype(np.dtype(dtype), np.integer)
    except TypeError:
        return False


def _sample_axis(d: Declared, row: tuple[int, ...], where: str) -> tuple[tuple[int, ...], str]:
    """(the input's shape for one sample, "batch" or "whole") from its declared dims and a data row."""
    if d.dims is None or len(row) == len(d.dims) - 1:
        return (1, *row), "batch"
    if len(row) == len(d.dims):
        return tuple(row), "whole"
    raise DataError(
        f"{where}: the data's rows for input {named(d.name)} have shape {list(row)}, the model takes rank {len(d.dims)} "
        f"({_dims(d.dims)}).",
        "Give one sample per row: the input without its batch axis, or the whole input where the batch axis is not first.",
    )


def _dims(dims) -> str:
    return "[" + ", ".join("?" if v is None else str(v) for v in dims) + "]"


def _fits(d: Declared, shape: tuple[int, ...], where: str) -> None:
    if d.dims is not None and any(a is not None and a != b for a, b in zip(d.dims, shape)):
        raise DataError(
            f"{where}: input {named(d.name)} takes {_dims(d.dims)}; the data gives {list(shape)} per sample.",
            "Give one sample per row, in the model's own layout (NCHW for images).",
        )


def _static(d: Declared, where: str) -> tuple[tuple[int, ...], str]:
    """The shape of an input the data does not cover: its declared dims, which must all be fixed."""
    if d.dims is None or any(v is None for v in d.dims):
        raise DataError(
            f"{where}: input {named(d.name)} has free dimensions {_dims(d.dims or ())} and no data fixes them.",
            f"Pass --data with x:{named(d.name)} (one sample per row).",
        )
    return tuple(d.dims), "batch" if d.dims and d.dims[0] == 1 else "whole"


def _fixed(d: Declared, shape: tuple[int, ...]) -> list[str]:
    """The fact that a dynamic dimension of a program's input was fixed to the data's shape (or none)."""
    if d.dims is None or all(v is not None for v in d.dims):
        return []
    return [
        f"input {d.name} {_dims(d.dims)} fixed to {list(shape)} (dynamic in the program: converted at the data's "
        "shape, which the .tflite then takes)"
    ]


def _check_keys(declared: list[Declared], ds: Dataset | None, where: str) -> None:
    """Every `x:<name>` of the data names one of the model's inputs (a key naming none is one line)."""
    keys = ds.x_cal if ds is not None and isinstance(ds.x_cal, dict) else {}
    extra = [k for k in keys if k not in {n for d in declared for n in (d.name, signature_name(d.name))}]
    if extra:
        raise DataError(
            f"{where}: the data has x:{named(extra[0])}, but the model's inputs are "
            f"{', '.join(named(d.name) for d in declared)}.",
            "Name each x:<input> after the model's input.",
        )


def planned(
    declared: list[Declared],
    bounds: list,
    ds: Dataset | None,
    layout: str,
    where: str,
    say_fixed: bool = True,
    images: str = "NCHW",
) -> tuple[Plan, Dataset | None, list[str]]:
    """(the plan, the data as the converted .tflite takes it, what fitting the ids to the model said): every
    input planned and one sample taken (`sampled`), the data moved to the .tflite's names and layout, and its
    ids fitted to the declared inputs and their vocabularies (`vocabulary.fit`, `bounds`), before anything runs
    the model. `images`: the layout of the source's image inputs (`route.DoorSource.images`)."""
    plan = sampled(declared, ds, layout, where, say_fixed, images=images)
    data = convert_data(ds, plan.inputs) if ds is not None else None
    data, said = vocabulary.fit(declared, bounds, data, signature_name)  # ids as the model takes them
    return plan, data, said


def sampled(
    declared: list[Declared],
    ds: Dataset | None,
    layout: str,
    where: str,
    say_fixed: bool = True,
    sample=None,
    images: str = "NCHW",
) -> Plan:
    """Every input planned (`plan_inputs`) and one sample taken (`sample`: the sample inputs an nn.Module came
    with, else the data's first row, else zeros) as the .tflite and as the source take it."""
    plan = plan_inputs(declared, ds, layout, where, say_fixed, images)
    plan.rows = first_sample(plan, ds, sample)
    plan.source_rows = first_sample(
        replace(plan, inputs=[i.model_copy(update={"layout": ""}) for i in plan.inputs]), ds, sample
    )
    return plan


def plan_inputs(
    declared: list[Declared], ds: Dataset | None, layout: str, where: str, say_fixed: bool = True, images: str = "NCHW"
) -> Plan:
    """Every input's sample shape and role (see the module docstring), what is frozen, what goes NHWC.
    `say_fixed`: a dynamic dimension the data fixes is one of the plan's facts (an ONNX graph's normaliser
    says so itself, naming the dimension). `images`: "NCHW" (PyTorch, ONNX: channels-last moves them), or ""
    for a model whose images are NHWC already (nothing to move)."""
    plan = Plan([], layout=Layout(layout))
    single = len(declared) == 1
    _check_keys(declared, ds, where)
    for d in declared:
        rows = _rows(ds, d.name, single)
        value = _constant_scalar(rows, d)
        if value is not None:
            plan.frozen[d.name] = value
            plan.facts.append(f"input {named(d.name)} is {value} in every sample: frozen into the graph")
            continue
        shape, axis = _sample_axis(d, tuple(rows.shape[1:]), where) if rows is not None else _static(d, where)
        _fits(d, shape, where)
        plan.facts += _fixed(d, shape) if say_fixed else []
        image = images if axis == "batch" and len(shape) == 4 else ""
        dtype = str(rows.dtype) if rows is not None and not np.issubdtype(rows.dtype, np.floating) else d.dtype
        plan.inputs.append(
            ConvertedInput(
                name=d.name, key=signature_name(d.name), source_shape=list(shape), shape=[], sample_axis=axis,
                dtype=dtype, layout="NHWC" if image and Layout(layout) is Layout.CHANNELS_LAST else image,
            )
        )  # fmt: skip
    if Layout(layout) is Layout.CHANNELS_LAST and not any(i.layout == "NHWC" for i in plan.inputs):
        plan.facts.append(
            "channels-last asked: the model takes its images NHWC already"
            if not images
            else "channels-last asked, but no input is an image (rank 4): the layout is unchanged"
        )
    return plan


def first_sample(plan: Plan, ds: Dataset | None, sample=None) -> dict[str, np.ndarray]:
    """One sample per input, as the .tflite takes it: the data's first row (transformed as planned), or the
    given sample inputs, or zeros."""
    out = {}
    for k, i in enumerate(plan.inputs):
        if sample is not None:
            x = sample[k].detach().cpu().numpy()
            x = x[None] if i.sample_axis == "whole" else x
        elif ds is not None and _rows(ds, i.name, len(plan.inputs) == 1) is not None:
            x = _rows(ds, i.name, len(plan.inputs) == 1)[:1]
        else:  # no data, or none for this input (its declared shape is static: `_static`)
            x = np.zeros([1, *i.source_shape] if i.sample_axis == "whole" else i.source_shape, np.float32)
        x = transform(x, i)
        out[i.key] = np.ascontiguousarray(x).astype(np.dtype(i.dtype))
    return out


def transform(rows: np.ndarray, i: ConvertedInput) -> np.ndarray:
    """The data's rows for one input as the .tflite takes them (NCHW -> NHWC where planned)."""
    return np.ascontiguousarray(np.moveaxis(rows, 1, -1)) if i.layout == "NHWC" else rows


# ------------------------------------------------------------------------------------------- the data


def convert_data(ds: Dataset, inputs: list[ConvertedInput]) -> Dataset:
    """The data as the converted .tflite takes it (`inputs`: the plan's): keyed by its input names, frozen
    inputs left out, image inputs moved to NHWC where the conversion made them so."""

    def one(x):
        if x is None:
            return None
        if not isinstance(x, dict):
            return transform(x, inputs[0]) if len(inputs) == 1 else x
        return {
            i.key: transform(x[i.name] if i.name in x else x[i.key], i) for i in inputs if i.name in x or i.key in x
        }

    return replace(ds, x_train=one(ds.x_train), x_cal=one(ds.x_cal), x_test=one(ds.x_test))

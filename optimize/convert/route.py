"""The route every model converted at the door takes to one float `.tflite` (PyTorch, ONNX, a TF1 frozen graph);
from there every scheme, the probe, the delegates, the recommender and the report work as for a `.tflite`.

Each format is one object, a `DoorSource`, that says what only it knows: its inputs as it declares them, the id
bounds of its embeddings, how it becomes a `.tflite` for a plan, and its own runtime for the conversion's error
(`torch_route.TorchSource` for `onnx_file.OnnxFile`, `pt2_file.Pt2File` and `torch_module.TorchModule`, through
litert-torch; `graph_def.FrozenGraph` through the TF1 converter). The route is the same for all:

    prepare(source, ds, layout)   the source made ready (an nn.Module exported), its inputs declared, the input
                                  plan and the data as the .tflite takes it (`plan.planned`: ids fitted), the
                                  conversion from the cache (`conversions`) or made (`DoorSource.converted`),
                                  described as any .tflite: a ModelSource the pipeline sees as flat

`source_feeds` and `stacked` move samples back to the source's terms for its own runtime (`fidelity`).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from optimize.convert import conversions, torch_export
from optimize.convert.plan import Declared, Plan, planned
from optimize.core.errors import ModelError, OptimizeError
from optimize.core.results import Conversion
from optimize.core.vocab import Layout
from optimize.models.data import Dataset, count, say_once, take
from optimize.models.spec import ModelSource, fingerprint_of, opened_content

#: Rows of test data the conversion's own error is measured on (the source runtime runs them one by one).
FIDELITY_SAMPLES = 64


class DoorSource:
    """One model converted at the door, opened: what the route asks of its format. `src` is its ModelSource
    (path, kind, fingerprint); a subclass reads the file once and keeps what it read."""

    #: Whether a dynamic dimension the data fixes is one of the plan's facts (ONNX's normaliser says so itself).
    say_fixed = True
    #: The layout of a rank-4 input with a batch axis in the source model: NCHW for PyTorch and ONNX (which the
    #: plan can move to NHWC), "" where there is nothing to move (a TensorFlow graph takes NHWC already).
    images = "NCHW"

    def __init__(self, src: ModelSource):
        self.src = src

    @property
    def name(self) -> str:
        return self.src.path.name

    def ready(self, ds: Dataset | None) -> DoorSource:
        """The source as it is converted (an nn.Module is exported to a .pt2 first: that needs the data)."""
        return self

    def declared(self) -> list[Declared]:
        """The inputs as the model declares them (name, dims, dtype), in the order it takes them."""
        raise NotImplementedError

    def bounds(self) -> list:
        """Each id input's vocabulary (`vocabulary.IdBound`), read from the source graph."""
        return []

    def converted(self, plan: Plan, key: str) -> tuple[bytes, Conversion]:
        """The float .tflite for `plan` and the record of how it was made, kept in the conversion cache under
        `key` (served again only if it validates, `conversions.cached`)."""
        raise NotImplementedError

    def reference(self, record: Conversion, feeds: list[dict]) -> tuple[str, list[list]]:
        """(the source runtime's name, its outputs per sample in the .tflite's output order) for samples in the
        source model's terms (`source_feeds`)."""
        raise NotImplementedError

    def outputs(self, record: Conversion, xs) -> tuple[str, dict[str, np.ndarray]]:
        """(the source runtime's name, its outputs on the converted data's samples `xs`, by output name, stacked
        as the .tflite runner stacks its own): each sample moved back to the source model's terms and run by
        the source's own runtime (`reference`)."""
        feeds = [source_feeds(record, take(xs, slice(i, i + 1))) for i in range(count(xs))]
        reference, per_sample = self.reference(record, feeds)
        return reference, dict(zip(record.outputs, stacked(per_sample, record)))


def source_feeds(record: Conversion, x: dict | np.ndarray) -> dict[str, np.ndarray]:
    """One batch of the converted data back in the source model's terms: its names and layout, frozen inputs
    added, whole inputs without the sample axis (for the source runtime)."""
    out = {}
    for i in record.inputs:
        v = x[i.key] if isinstance(x, dict) else x
        v = np.moveaxis(v, -1, 1) if i.layout == "NHWC" else v
        out[i.name] = np.ascontiguousarray(v[0] if i.sample_axis == "whole" else v)
    for name, value in record.frozen.items():
        out[name] = np.asarray(value)
    return out


def stacked(per_sample: list[list[np.ndarray]], record: Conversion) -> list[np.ndarray]:
    """The source's outputs as the .tflite runner stacks its own: per sample, without the batch axis of 1 (a
    whole output keeps all of itself), NHWC where the conversion made that output so."""
    out = []
    for j, name in enumerate(record.outputs):
        rows = [np.asarray(s[j]) for s in per_sample]
        if name not in record.whole_outputs:
            rows = [r[0] for r in rows]
        a = np.stack(rows).astype(np.float32, copy=False)
        if name in record.channel_last_outputs:
            a = np.moveaxis(a, 1, -1)
        out.append(a)
    return out


def prepare(source: DoorSource, ds: Dataset | None, layout: str = Layout.SOURCE):
    """The source converted to its float .tflite (from the cache when made before), and the data as that
    .tflite takes it: a ModelSource the rest of the pipeline treats as a float .tflite. Whatever a file makes
    fail on the way (a graph that passed every check and still does not run: onnx2torch, the eager run on the
    first sample) is one line naming the step's error, never a traceback."""
    try:
        return _prepare(source, ds, layout)
    except OptimizeError:
        raise
    except Exception as e:  # noqa: BLE001 - anything a crafted graph makes a library raise: one line
        first = (str(e).strip().splitlines() or [""])[0][:200]
        raise ModelError(
            f"{source.name} could not be converted ({e.__class__.__name__}{': ' + first if first else ''}).",
            "Export the model again with standard ops, and check it runs in its own runtime.",
        ) from None


def _prepare(source: DoorSource, ds: Dataset | None, layout: str):
    with torch_export.quiet():  # the converters and their libraries talk on import and while converting
        source = source.ready(ds)
        declared, bounds = source.declared(), source.bounds()
        plan, data, said = planned(declared, bounds, ds, layout, source.name, source.say_fixed, source.images)
        key = conversions.key(source.src.fingerprint, plan.key())
        hit = conversions.cached(key)
        content, record = hit if hit is not None else source.converted(plan, key)
    say_once(said)
    converted = opened_content(
        replace(source.src, fingerprint=fingerprint_of(source.src.fingerprint, plan.key())), content
    )
    record = record.model_copy(update={"cached": True}) if hit is not None else record
    return replace(converted, conversion=record, facts=tuple(record.facts), module=None), data

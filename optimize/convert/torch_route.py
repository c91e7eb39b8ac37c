"""The route every PyTorch and ONNX model takes to one float `.tflite`, converted once by litert-torch; from
there every scheme, the probe, the delegates, the recommender and the report work as for a `.tflite`.

Each format is one object, a `TorchSource`, that says what only it knows: its inputs as it declares them,
the id bounds of its embeddings, the positional nn.Module it becomes for a plan, and its own runtime for the
conversion's error. `onnx_file.OnnxFile` (the graph normalised by `onnx_graph`, our `onnx_ops` converters,
ONNX Runtime), `pt2_file.Pt2File` (a torch.export program read without running code from the file, PyTorch)
and `torch_module.TorchModule` (an nn.Module from Python, exported once to a `.pt2` of ours). The route is the
same for all:

    prepare(source, ds, layout)   the source's inputs declared, the ids fitted (`vocabulary`), the input plan
                                  (`plan`), the conversion from the cache (`conversions`) or made (`convert`),
                                  and the data as the .tflite takes it: a ModelSource the pipeline sees as flat
    convert(source, plan, ds)     NamedIO around the source's module, torch.export, litert-torch (`torch_export`)

torch, onnx and onnx2torch are imported inside functions: this module imports without the torch extra, and
`require` says which extra to install when a model needs it.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import replace

import numpy as np

from optimize.convert import conversions, torch_export
from optimize.convert.plan import Declared, Plan, planned
from optimize.core.errors import ModelError, OptimizeError
from optimize.core.results import Conversion
from optimize.core.vocab import Layout
from optimize.models.data import Dataset, count, say_once, take
from optimize.models.spec import ModelSource, fingerprint_of, opened_content

INSTALL = 'pip install -e ".[torch]" (or pip install "optimize[torch]"; a CPU build of torch: see the README)'
#: What each kind of source needs installed (import names).
NEEDS = {
    "onnx": ("torch", "litert_torch", "onnx", "onnx2torch", "onnxruntime"),
    "pt2": ("torch", "litert_torch"),
    "module": ("torch", "litert_torch"),
}
#: Rows of test data the conversion's own error is measured on (the source runtime runs them one by one).
FIDELITY_SAMPLES = 64


def require(kind: str, name: str) -> None:
    """One line naming the extra to install when what a PyTorch or ONNX model needs is missing."""
    missing = [m for m in NEEDS[kind] if not installed(m)]
    if missing:
        what = "an ONNX model" if kind == "onnx" else "a PyTorch model"
        raise ModelError(
            f"{name} is {what}; reading it needs {', '.join(missing)}, "
            f"{'which is' if len(missing) == 1 else 'which are'} not installed.",
            f"Install the torch extra: {INSTALL}.",
        )


def installed(module: str) -> bool:
    """Whether a package can be imported here (without importing it)."""
    return importlib.util.find_spec(module) is not None


class TorchSource:
    """One PyTorch or ONNX model, opened: what the route asks of its format. `src` is its ModelSource (path,
    kind, fingerprint); a subclass reads the file once and keeps what it read."""

    #: What the conversion record names before torch.export and litert-torch.
    route = ""
    #: Whether a dynamic dimension the data fixes is one of the plan's facts (ONNX's normaliser says so itself).
    say_fixed = True

    def __init__(self, src: ModelSource):
        self.src = src

    @property
    def name(self) -> str:
        return self.src.path.name

    def ready(self, ds: Dataset | None) -> TorchSource:
        """The source as it is converted (an nn.Module is exported to a .pt2 first: that needs the data)."""
        return self

    def declared(self) -> list[Declared]:
        """The inputs as the model declares them (name, dims, dtype), in the order it takes them."""
        raise NotImplementedError

    def bounds(self) -> list:
        """Each id input's vocabulary (`vocabulary.IdBound`), read from the source graph."""
        return []

    def inner(self, plan: Plan) -> tuple[object, list[str], list[str], dict]:
        """(the source as a positional nn.Module for `plan`, its output names ([]: found by an eager run),
        what making it did (facts), the seconds its steps took)."""
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


def prepare(source: TorchSource, ds: Dataset | None, layout: str = Layout.SOURCE):
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
            "Export the model again with standard ops (or as a .pt2), and check it runs in its own runtime.",
        ) from None


def _prepare(source: TorchSource, ds: Dataset | None, layout: str):
    inductor = conversions.library_folder("torchinductor")  # torch's cache, not the temp folder
    if inductor is not None:
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(inductor))
    with torch_export.quiet():  # torch, torchao and litert-torch talk on import and while converting
        source = source.ready(ds)
        plan, data, said = planned(source.declared(), source.bounds(), ds, layout, source.name, source.say_fixed)
        key = conversions.key(source.src.fingerprint, plan.key())
        hit = conversions.cached(key)
        content, record = hit if hit is not None else convert(source, plan, key)
    say_once(said)
    converted = opened_content(
        replace(source.src, fingerprint=fingerprint_of(source.src.fingerprint, plan.key())), content
    )
    record = record.model_copy(update={"cached": True}) if hit is not None else record
    return replace(converted, conversion=record, facts=tuple(record.facts), module=None), data


def convert(source: TorchSource, plan: Plan, key: str) -> tuple[bytes, Conversion]:
    """The float .tflite (NHWC where planned) and the record of how it was made, kept in the conversion cache
    under `key` (served again only if it validates, `conversions.cached`)."""
    inner, outputs, facts, seconds = source.inner(plan)
    made = torch_export.converted(inner, plan, outputs, source.name)
    record = made.conversion(source.src.kind, source.name, source.route, plan, facts, seconds)
    conversions.store(key, made.content, record)
    return made.content, record


def named_module(source: TorchSource, record: Conversion):
    """The converted source's named module again, as the conversion made it (read from its file: in a worker
    too), for routes that work on the torch graph (PT2E)."""
    from optimize.convert.onnx_ops import NamedIO

    with torch_export.quiet():
        inner, _, _, _ = source.inner(Plan.of(record))
        at = {n: k for k, n in enumerate(record.outputs)}
        named = NamedIO(
            inner, [(i.key, i.sample_axis == "whole") for i in record.inputs], record.outputs,
            [k for k, i in enumerate(record.inputs) if i.layout == "NHWC"],
            [at[n] for n in record.channel_last_outputs], [at[n] for n in record.whole_outputs],
        )  # fmt: skip
    return named.eval()

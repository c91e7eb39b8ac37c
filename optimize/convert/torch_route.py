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
import time
from dataclasses import replace

from optimize.convert import conversions, steps, torch_export, vocabulary
from optimize.convert.plan import Declared, Plan, convert_data, first_sample, plan_inputs, sample_kwargs
from optimize.core.errors import ModelError, OptimizeError
from optimize.core.results import Conversion
from optimize.core.vocab import Layout
from optimize.models.data import Dataset, say_once
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
        source model's terms (`plan.source_feeds`)."""
        raise NotImplementedError


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
        declared = source.declared()
        ds, said = vocabulary.fit(declared, source.bounds(), ds)  # ids as the model takes them
        plan = plan_inputs(declared, ds, layout, source.name, say_fixed=source.say_fixed)
        key = conversions.key(source.src.fingerprint, plan.key())
        hit = conversions.cached(key)
        content, record = hit if hit is not None else convert(source, plan, ds)
    say_once(said)
    if hit is None:
        conversions.store(key, content, record)  # served again only if it validates (`conversions.cached`)
    else:
        record = record.model_copy(update={"cached": True})
    data = convert_data(ds, record) if ds is not None else None
    src = replace(source.src, fingerprint=fingerprint_of(source.src.fingerprint, plan.key()), module=None)
    converted = opened_content(src, content)
    return replace(converted, conversion=record, facts=tuple(record.facts)), data


def convert(source: TorchSource, plan: Plan, ds: Dataset | None) -> tuple[bytes, Conversion]:
    """The float .tflite (NHWC where planned) and the record of how it was made."""
    inner, outputs, facts, seconds = source.inner(plan)
    named, outputs, last_out, whole_out = _named(inner, plan, outputs, ds)
    kw = sample_kwargs(plan, first_sample(plan, ds))
    t0 = time.perf_counter()
    with steps.step("torch.export"):
        torch_export.export(named, kw, source.name)  # fails fast, naming where, before the converter's own export
    t1 = time.perf_counter()
    with steps.step("litert-torch"):
        content = torch_export.to_tflite(named, kw, source.name)
    seconds.update({"export": t1 - t0, "convert": time.perf_counter() - t1})
    return content, _record(source, plan, content, outputs, facts, seconds).model_copy(
        update={
            "channel_last_outputs": [outputs[k] for k in last_out],
            "whole_outputs": [outputs[k] for k in whole_out],
        }
    )


def _named(inner, plan: Plan, outputs: list[str], ds: Dataset | None):
    """(the module with inputs and outputs by name, NHWC where planned; its output names; which outputs go
    NHWC; which are whole), from one eager run on the first sample in the source's own layout."""
    from optimize.convert.onnx_ops import NamedIO

    source_plan = replace(plan, inputs=[i.model_copy(update={"layout": ""}) for i in plan.inputs])
    names, shapes = torch_export.eager_outputs(inner, plan, first_sample(source_plan, ds))
    outputs = outputs or names
    last_in = [k for k, i in enumerate(plan.inputs) if i.layout == "NHWC"]
    images = [k for k, s in enumerate(shapes) if plan.layout == Layout.CHANNELS_LAST and len(s) == 4]
    last_out = images if last_in else []
    whole_out = [k for k, s in enumerate(shapes) if not s or s[0] != 1]
    inputs = [(i.key, i.sample_axis == "whole") for i in plan.inputs]
    return NamedIO(inner, inputs, outputs, last_in, last_out, whole_out).eval(), outputs, last_out, whole_out


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


def _record(source: TorchSource, plan: Plan, content: bytes, outputs, facts, seconds) -> Conversion:
    from importlib import metadata

    from optimize.models.spec import tflite_io

    specs, _ = tflite_io(content)
    by_key = {s.name: s for s in specs}
    inputs = [i.model_copy(update={"shape": list(by_key[i.key].shape) if i.key in by_key else []}) for i in plan.inputs]
    versions = {
        d: metadata.version(d) for d in ("torch", "litert-torch") if importlib.util.find_spec(d.replace("-", "_"))
    }
    return Conversion(
        source=source.src.kind, file=source.name, route=f"{source.route}torch.export + litert-torch {versions.get('litert-torch', '')}".strip(),
        layout=str(plan.layout), inputs=inputs, outputs=list(outputs), frozen=dict(plan.frozen),
        facts=[*plan.facts, *facts], transposes=count_op(content, "TRANSPOSE"), seconds={k: round(v, 3) for k, v in seconds.items()},
    )  # fmt: skip


def count_op(content: bytes, op: str) -> int:
    """How many `op` nodes the model holds, in every subgraph."""
    from optimize.models.tflite import read_model

    return sum(1 for g in read_model(content).subgraphs for o in g.ops if o.name == op)

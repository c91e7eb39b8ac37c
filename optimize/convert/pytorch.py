"""The PyTorch and ONNX front door: a `.pt2` (torch.export program), an `.onnx` file or, from Python, an
`nn.Module` becomes one float `.tflite`, converted once by litert-torch; from there every scheme, the probe,
the delegates, the recommender and the report work as for a `.tflite`.

Routes (one way out):

* `.onnx`: the graph normalised (`onnx_graph`: weights in Constant nodes, free dimensions fixed from the
  data, constants folded, If with a constant condition inlined), converted to an nn.Module by onnx2torch
  with our export-friendly converters (`onnx_ops`), then litert-torch;
* `.pt2`: read without running code from the file (`torch_files`), its program's module, then litert-torch;
* an nn.Module (Python API): exported once to a `.pt2` of ours, then as above.

Inputs keep the source model's names (the data's `x:<name>` keys; a name that is not a Python identifier
gets one, "227" -> "in_227"). A data array's rows are one sample each: for an input whose batch axis
comes first, a row is the input without it (`x` of shape (N, 3, 224, 224) for a [1, 3, 224, 224] input);
for one whose batch axis is not first (silero-vad's state [2, 1, 128]) a row is the whole input ((N, 2,
1, 128)), which the `.tflite` takes with a leading axis of 1 (the same bytes). A scalar integer input that
is one value in every sample (a sample rate) is frozen into the graph. With `layout="channels-last"`,
image inputs and outputs become NHWC (litert-torch's `to_channel_last_io`), and the data, given in the
source model's NCHW layout, is transposed to fit.

The conversion is cached by the source's fingerprint, the input plan and the converter versions, in
`<cache>/converted/`. Its own error against the source runtime (ONNX Runtime, or PyTorch) is measured by
`optimize.convert.fidelity`. torch, onnx and onnx2torch are imported inside functions: this module
imports without the torch extra, and says which extra to install when a model needs it.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import importlib.util
import inspect
import io
import json
import keyword
import logging
import os
import re
import shutil
import time
import traceback
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from optimize.convert import vocabulary
from optimize.core.errors import DataError, ModelError, OptimizeError
from optimize.core.results import Conversion, ConvertedInput
from optimize.core.shown import named
from optimize.core.vocab import Layout
from optimize.models.data import Dataset, count, say_once, take
from optimize.models.spec import (
    ModelSource,
    fingerprint_of,
    opened_content,
    tflite_heads,
    tflite_io,
)

# litert-torch imports JAX, which then warns at every fork (a quantizer's crash-contained child, a subprocess
# started by Ray or MLflow) that a child using JAX may deadlock: none of those children uses JAX.
warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called", category=RuntimeWarning)

INSTALL = 'pip install -e ".[torch]" (or pip install "optimize[torch]"; a CPU build of torch: see the README)'
#: What each kind of source needs installed (import names).
NEEDS = {
    "onnx": ("torch", "litert_torch", "onnx", "onnx2torch", "onnxruntime"),
    "pt2": ("torch", "litert_torch"),
    "module": ("torch", "litert_torch"),
}
#: torch.save and TorchScript files: refused in one line that says what they are and how to export a .pt2.
TORCH_FILE_SUFFIXES = (".pt", ".pth", ".ptl", ".jit", ".ckpt", ".torchscript")
#: Rows of test data the conversion's own error is measured on (the source runtime runs them one by one).
FIDELITY_SAMPLES = 64
ROUTE_VERSION = "1"  # bump when the route changes what it makes (also keyed by our converter modules' text)


def recognise(p: Path, head: bytes) -> str | None:
    """ "onnx", "pt2" or "torch-file" for a PyTorch or ONNX file (by content, then by name), else None."""
    if head.startswith(b"PK"):
        from optimize.convert.torch_files import describe_zip, is_pt2

        if is_pt2(p):
            return "pt2"
        if p.suffix == ".pt2" or p.suffix in TORCH_FILE_SUFFIXES:
            return "torch-file"
        import zipfile

        with contextlib.suppress(zipfile.BadZipFile, OSError):
            with zipfile.ZipFile(p) as z:
                if "TorchScript" in describe_zip(z.namelist()[:1000]):
                    return "torch-file"
        return None
    if p.suffix == ".onnx":
        return "onnx"
    if p.suffix == ".pt2" or p.suffix in TORCH_FILE_SUFFIXES:
        return "torch-file"
    if head[:1] == b"\x80" and head[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"):  # a pickle (torch.save's old format)
        return "torch-file"
    return None


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


def open_source(model) -> ModelSource | None:
    """A PyTorch or ONNX model recognised and opened (an nn.Module, a .pt2, an .onnx; not converted yet: that
    needs the data's shapes), or None for any other model. A hostile .pt2 is refused here, before anything
    else reads it."""
    from optimize.core.paths import open_regular, regular_file
    from optimize.models.source import file_fingerprint, is_tflite

    if is_module(model):
        return from_module(model)
    p = Path(model)
    if not p.is_file():
        return None
    regular_file(p, "model", ModelError)
    with open_regular(p, "model", ModelError) as f:
        head = f.read(16)
    kind = None if is_tflite(head) else recognise(p, head)
    if kind is None:
        return None
    return open_file(p, kind, file_fingerprint(p) if kind != "torch-file" else "")


def open_file(p: Path, kind: str, fingerprint: str):
    """A PyTorch or ONNX source recognised (not yet converted: that needs the data's shapes). A .pt2 is
    inspected without running anything from it; any other torch file is refused in one line."""

    if kind == "torch-file":
        if not installed("torch"):
            raise ModelError(
                f"{p.name} is a PyTorch file, not a model optimize reads without torch.",
                f"Export a .pt2 with torch.export.save, and install the torch extra: {INSTALL}.",
            )
        from optimize.convert.torch_files import refuse

        raise refuse(p)
    require(kind, p.name)
    if kind == "pt2":
        from optimize.convert.torch_files import inspect_pt2

        inspect_pt2(p)  # refused now (a pickle payload, a foreign constant), before anything else reads it
    else:
        _read_onnx(p)  # a file that does not parse: one line now
    return ModelSource(p, kind, fingerprint)


def _read_onnx(p: Path):
    """The ONNX graph, parsed from the file's bytes and checked (`onnx_checks`) before anything else reads it."""
    from optimize.convert.onnx_checks import read

    return read(p)[0]


# ------------------------------------------------------------------------------------------- modules (Python API)

_MODULES: dict[str, object] = {}  # fingerprint -> the user's nn.Module (this process's eager reference)


def is_module(model) -> bool:
    """An nn.Module, or (nn.Module, sample inputs): without importing torch unless the caller has."""
    import sys

    torch = sys.modules.get("torch")
    if torch is None:
        return False
    if isinstance(model, tuple) and len(model) == 2:
        model = model[0]
    return isinstance(model, torch.nn.Module)


def from_module(model):
    """A ModelSource for an nn.Module (optionally `(module, sample_inputs)`): converted in `prepare`, where
    the data (or the sample inputs) give its shapes."""

    require("module", "the nn.Module")
    module, sample = model if isinstance(model, tuple) else (model, None)
    if sample is not None and not isinstance(sample, (tuple, list)):
        sample = (sample,)
    name = type(module).__name__
    return ModelSource(Path(f"{name}.pt2"), "module", "", module=(module.eval(), tuple(sample) if sample else None))


# ------------------------------------------------------------------------------------------- the input plan


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

    def key(self) -> str:
        shape = [(i.name, i.source_shape, i.sample_axis, i.dtype, i.layout) for i in self.inputs]
        return json.dumps([shape, sorted(self.frozen.items()), str(self.layout)], default=str)


def _rows(ds: Dataset | None, name: str, single: bool) -> np.ndarray | None:
    """The calibration rows for one input (the unnamed `x` when the model has a single input)."""
    if ds is None:
        return None
    x = ds.x_cal
    if isinstance(x, dict):
        return x.get(name, x.get(signature_name(name)))
    return x if single else None


def _constant_scalar(rows: np.ndarray | None, d: Declared):
    """The value of a scalar integer input that is the same in every sample (configuration: frozen)."""
    if rows is None or rows.ndim != 1 or d.dims not in ((), None) or not np.issubdtype(rows.dtype, np.integer):
        return None
    return int(rows[0]) if rows.size and np.all(rows == rows[0]) else None


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


def plan_inputs(declared: list[Declared], ds: Dataset | None, layout: str, where: str, say_fixed: bool = True) -> Plan:
    """Every input's sample shape and role (see the module docstring), what is frozen, what goes NHWC.
    `say_fixed`: a dynamic dimension the data fixes is one of the plan's facts (an ONNX graph's normaliser
    says so itself, naming the dimension)."""
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
        last = Layout(layout) is Layout.CHANNELS_LAST and axis == "batch" and len(shape) == 4
        dtype = str(rows.dtype) if rows is not None and not np.issubdtype(rows.dtype, np.floating) else d.dtype
        plan.inputs.append(
            ConvertedInput(
                name=d.name, key=signature_name(d.name), source_shape=list(shape), shape=[], sample_axis=axis,
                dtype=dtype, layout="NHWC" if last else ("NCHW" if axis == "batch" and len(shape) == 4 else ""),
            )
        )  # fmt: skip
    if Layout(layout) is Layout.CHANNELS_LAST and not any(i.layout == "NHWC" for i in plan.inputs):
        plan.facts.append("channels-last asked, but no input is an image (rank 4): the layout is unchanged")
    return plan


# ------------------------------------------------------------------------------------------- sources as modules


def _onnx_declared(model) -> list[Declared]:
    from onnx import helper

    from optimize.convert.onnx_graph import declared_inputs

    out = []
    for vi in declared_inputs(model):
        t = vi.type.tensor_type
        dims = tuple(d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None for d in t.shape.dim)
        out.append(Declared(vi.name, dims, np.dtype(helper.tensor_dtype_to_np_dtype(t.elem_type)).name))
    return out


def _onnx_module(p: Path, model, plan: Plan) -> tuple[object, list[str], list[str], dict]:
    """The normalised ONNX graph as an nn.Module, its output names, what normalising did, and timings."""
    from optimize.convert import onnx_checks, onnx_ops, steps
    from optimize.convert.onnx_graph import NormalizeError, normalize

    t0 = time.perf_counter()
    shapes = {i.name: tuple(i.source_shape) for i in plan.inputs}
    frozen = {k: np.asarray(v) for k, v in plan.frozen.items()}
    try:
        norm = normalize(model, shapes, frozen)
    except NormalizeError as e:
        raise ModelError(f"{p.name}: {e}.", "Pass data whose samples fix every free dimension.") from None
    onnx_checks.check_normalised(norm.model, p.name)
    bad = onnx_ops.unsupported_ops(norm.model)
    if bad:
        norm = _other_opset(p, model, shapes, frozen, bad)
    t1 = time.perf_counter()
    try:
        with _quiet(), steps.step("onnx2torch"):
            module = onnx_ops.convert(norm.model)
    except NotImplementedError as e:  # our ConversionError, or onnx2torch's own
        raise ModelError(
            f"{p.name}: {str(e).splitlines()[0][:300]}.", "Export the model without that op, or as a .pt2."
        ) from None
    outputs = [o.name for o in norm.model.graph.output]
    return module, outputs, list(norm.facts), {"normalize": t1 - t0, "onnx2torch": time.perf_counter() - t1}


#: The ONNX opsets our converters (onnx2torch's and ours) are written for; a model of another opset is converted
#: into this range by onnx.version_converter first, when it has ops no converter takes at its own opset.
OPSETS = (9, 21)


def _opset(model) -> int:
    return max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=1)


def _other_opset(p: Path, model, shapes: dict, frozen: dict, bad: list[str]):
    """The model converted (onnx.version_converter) to the nearest opset in OPSETS whose converters take every
    op, normalised; a ModelError naming the ops and the supported range when none does."""
    from onnx import version_converter

    from optimize.convert import onnx_ops
    from optimize.convert.onnx_graph import NormalizeError, normalize

    lo, hi = OPSETS
    have = _opset(model)
    tried = []
    if not lo <= have <= hi:
        near = hi if have > hi else lo
        for target in sorted({near, 13 if have < lo else 17, 17 if have > hi else 11}, key=lambda t: abs(t - have)):
            try:
                converted = version_converter.convert_version(model, target)
                norm = normalize(converted, shapes, frozen)
            except (NormalizeError, Exception) as e:  # noqa: BLE001 - an adapter the converter lacks: the next opset
                tried.append(f"to {target}: {str(e).splitlines()[0][:120] if str(e) else e.__class__.__name__}")
                continue
            left = onnx_ops.unsupported_ops(norm.model)
            if not left:
                norm.facts.insert(0, f"opset {have} converted to opset {target} by onnx.version_converter")
                return norm
            tried.append(f"to {target}: {left[0]}")
    converted = f" (converting opset {have} {'; '.join(tried)})" if tried else ""
    raise ModelError(
        f"{p.name}: no converter for {len(bad)} ONNX op(s): {'; '.join(bad[:4])}"
        f"{' ...' if len(bad) > 4 else ''}{converted}. optimize converts ONNX opsets {lo} to {hi}.",
        "Export the model at an opset in that range without those ops (a float model, standard ops), or as a "
        "torch.export program (.pt2).",
    )


def _pt2_declared(ep) -> list[Declared]:
    """A program's user inputs and their example shapes (a symbolic dimension is free)."""
    nodes = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    out = []
    for spec in ep.graph_signature.input_specs:
        if spec.kind.name != "USER_INPUT":
            continue
        val = nodes[spec.arg.name].meta.get("val") if spec.arg.name in nodes else None
        dims = tuple(int(s) if isinstance(s, int) else None for s in val.shape) if val is not None else None
        dtype = str(val.dtype).replace("torch.", "") if val is not None else "float32"
        out.append(Declared(spec.arg.name, dims, dtype))
    return out


def _module_declared(module, sample) -> list[Declared]:
    """An nn.Module's inputs: forward's parameter names, and the sample inputs' shapes when given."""
    params = [
        p.name for p in inspect.signature(module.forward).parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
    ]  # fmt: skip
    if sample is not None:
        names = params[: len(sample)] + [f"input_{k}" for k in range(len(params), len(sample))]
        return [Declared(n, tuple(s.shape), str(s.dtype).replace("torch.", "")) for n, s in zip(names, sample)]
    return [Declared(n, None) for n in params]


# ------------------------------------------------------------------------------------------- export and convert

_GRAPH_FRAME = re.compile(r"# File: (\S+?):(\d+) in (\w+), code: (.+)")  # torch.export's annotated graph dump
_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\w+)\n\s+(.+)')


def _not_users(filename: str) -> bool:
    """Frames of installed packages, the standard library, generated code and optimize itself."""
    import sysconfig

    roots = {sysconfig.get_paths()[k] for k in ("purelib", "platlib", "stdlib")}
    here = str(Path(__file__).resolve().parent.parent)
    return filename.startswith("<") or filename.startswith(here) or any(filename.startswith(r) for r in roots)


def where_export_failed(e: BaseException) -> str:
    """`file:line in function (code)` of the last frame of the user's code that torch.export reached."""
    text = str(e)
    hits = [m for m in (*_GRAPH_FRAME.finditer(text), *_FRAME.finditer(text)) if not _not_users(m.group(1))]
    if hits:
        m = hits[-1]
        return f"{Path(m.group(1)).name}:{m.group(2)} in {m.group(3)} ({m.group(4).strip()[:80]})"
    stack = getattr(e, "real_stack", None) or traceback.extract_tb(e.__traceback__)
    frames = [f for f in stack if not _not_users(f.filename)]
    if frames:
        f = frames[-1]
        return f"{Path(f.filename).name}:{f.lineno} in {f.name} ({(f.line or '').strip()[:80]})"
    m = re.search(r"target=([^\]]+)\]", text)
    return f"graph node {m.group(1)}" if m else "a place torch.export does not name"


@contextlib.contextmanager
def _quiet():
    """litert-torch, torchao and torch talk on stdout and stderr (progress, graph dumps, warnings, torchao's
    "Failed to load ..._C_mxfp8.so", torch's pytree deprecations, absl and the C++ converter's logs on fd 2):
    kept off the user's screen, and written to optimize's log at debug level instead (`optimize.convert`)."""
    from optimize.models.runtime import captured_stderr

    os.environ.setdefault("LITERT_TORCH_SHOW_PROGRESS", "n")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sink = io.StringIO()
    native: list[str] = []
    logging.disable(logging.CRITICAL)
    try:
        with (
            captured_stderr() as native,
            warnings.catch_warnings(),
            contextlib.redirect_stdout(sink),
            contextlib.redirect_stderr(sink),
        ):
            warnings.simplefilter("ignore")
            yield sink
    finally:
        logging.disable(logging.NOTSET)
        said = [ln for ln in (*sink.getvalue().splitlines(), *native) if ln.strip()]
        if said:
            _LOG.debug("torch, litert-torch and their libraries said:\n%s", "\n".join(said[-200:]))


_LOG = logging.getLogger("optimize.convert")


quiet = _quiet


def export(named, kwargs: dict, name: str):
    """torch.export the named module; a model it cannot trace is one line saying where tracing stopped."""
    import torch

    try:
        with _quiet():
            return torch.export.export(named, (), kwargs, strict=False)
    except Exception as e:  # noqa: BLE001 - torch.export raises many types; each is the model's problem
        first = next((ln.strip() for ln in str(e).strip().splitlines() if ln.strip()), e.__class__.__name__)
        raise ModelError(
            f"torch.export cannot trace {name}: {first[:200]} (at {where_export_failed(e)}).",
            "Make that code traceable (no Python branches on tensor values, no .numpy() or .item() in forward).",
        ) from None


def to_tflite(named, kwargs: dict, name: str, quant_config=None) -> bytes:
    """litert-torch's conversion with keyword samples (a named signature), as .tflite bytes."""
    import litert_torch

    litert_torch.config.show_progress = False
    try:
        with _quiet():
            edge = litert_torch.convert(named, sample_kwargs=kwargs, quant_config=quant_config)
            content = bytes(edge.model_content())
    except Exception as e:  # noqa: BLE001 - a model the converter cannot lower: one line, naming where
        from optimize.convert.names import failed_at

        first = next((ln.strip() for ln in str(e).strip().splitlines() if ln.strip()), e.__class__.__name__)
        raise ModelError(
            f"litert-torch could not convert {name}{failed_at(e)}: {first[:240]}.",
            "Export the model with standard ops.",
        ) from None
    from optimize.convert.names import clean

    return clean(content)


def sample_kwargs(plan: Plan, rows: dict[str, np.ndarray]) -> dict:
    """One sample as the keyword tensors the named module takes (data layout: NHWC where planned)."""
    import torch

    return {i.key: torch.from_numpy(np.ascontiguousarray(rows[i.key])) for i in plan.inputs}


def _first_sample(plan: Plan, ds: Dataset | None, sample=None) -> dict[str, np.ndarray]:
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
        x = _transform(x, i)
        out[i.key] = np.ascontiguousarray(x).astype(np.dtype(i.dtype))
    return out


def _transform(rows: np.ndarray, i: ConvertedInput) -> np.ndarray:
    """The data's rows for one input as the .tflite takes them (NCHW -> NHWC where planned)."""
    return np.ascontiguousarray(np.moveaxis(rows, 1, -1)) if i.layout == "NHWC" else rows


# ------------------------------------------------------------------------------------------- the cache


def cache_dir() -> Path:
    """`<cache>/converted`: beside the result cache when that is a folder, else ~/.cache/optimize."""
    from optimize.core.paths import default_root, local_path

    root = local_path(default_root())
    if root is None:
        root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "optimize"
    return root / "converted"


def library_folder(name: str) -> Path | None:
    """A folder of ours in `<cache>/converted` for what a library keeps between runs (torch's inductor cache,
    ONNX Runtime's telemetry session file), which would otherwise land in the temp folder before a run's
    staging folder exists; None when it cannot be made (the library keeps its default)."""
    folder = cache_dir() / name
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return folder


def _import_onnxruntime():
    """onnxruntime, imported (once) with TMPDIR at a folder of ours: its telemetry writes a `.ses` file into the
    temp folder it sees at import, whatever is asked of it later."""
    import sys

    if "onnxruntime" in sys.modules:
        return sys.modules["onnxruntime"]
    from optimize.core.paths import environment

    folder = library_folder("onnxruntime")
    with environment({"TMPDIR": str(folder)} if folder is not None else {}):
        import onnxruntime

        return onnxruntime


def _route_digest() -> str:
    """What makes a conversion: our converter modules' text and the libraries' versions."""
    from importlib import metadata

    h = hashlib.sha256(ROUTE_VERSION.encode())
    for f in (
        "onnx_ops.py",
        "onnx_base.py",
        "onnx_dense.py",
        "onnx_select.py",
        "onnx_graph.py",
        "pytorch.py",
        "names.py",
    ):
        h.update((Path(__file__).parent / f).read_bytes())
    for dist in ("torch", "litert-torch", "onnx", "onnx2torch", "ai-edge-litert"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            h.update(f"{dist}={metadata.version(dist)}".encode())
    return h.hexdigest()


def _key(fingerprint: str, plan: Plan) -> str:
    return hashlib.sha256(f"{fingerprint}|{plan.key()}|{_route_digest()}".encode()).hexdigest()[:24]


def _cached(key: str) -> tuple[bytes, Conversion] | None:
    """A conversion made before (bytes validated as a .tflite, its record), or None."""
    from optimize.core.bounded import loads_json
    from optimize.core.paths import read_below
    from optimize.models.tflite import read_model

    root = cache_dir()
    try:
        content = read_below(root, root / f"{key}.tflite", 2**31, "converted model")
        record = read_below(root, root / f"{key}.json", 2**24, "conversion record")
        if content is None or record is None:
            return None
        read_model(content)
        return content, Conversion.model_validate(loads_json(record, key, ModelError, "", "a conversion record"))
    except Exception:  # noqa: BLE001 - a damaged entry is made again
        return None


def _store(key: str, content: bytes, record: Conversion) -> None:
    from optimize.core.paths import write_atomic

    root = cache_dir()
    with contextlib.suppress(OSError):
        root.mkdir(parents=True, exist_ok=True)
        write_atomic(root / f"{key}.tflite", content, root=root)
        write_atomic(root / f"{key}.json", record.model_dump_json().encode(), root=root)


# ------------------------------------------------------------------------------------------- prepare


def prepare(src, ds: Dataset | None, layout: str = Layout.SOURCE):
    """The source converted to its float .tflite (from the cache when made before), and the data as that
    .tflite takes it: a ModelSource the rest of the pipeline treats as a float .tflite. Whatever a file makes
    fail on the way (a graph that passed every check and still does not run: onnx2torch, the eager run on the
    first sample) is one line naming the step's error, never a traceback."""
    try:
        return _prepare(src, ds, layout)
    except OptimizeError:
        raise
    except Exception as e:  # noqa: BLE001 - anything a crafted graph makes a library raise: one line
        first = (str(e).strip().splitlines() or [""])[0][:200]
        raise ModelError(
            f"{src.path.name} could not be converted ({e.__class__.__name__}{': ' + first if first else ''}).",
            "Export the model again with standard ops (or as a .pt2), and check it runs in its own runtime.",
        ) from None


def _prepare(src, ds: Dataset | None, layout: str):
    inductor = library_folder("torchinductor")  # torch's cache, not the temp folder (a run leaves nothing there)
    if inductor is not None:
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(inductor))
    with _quiet():  # torch, torchao and litert-torch talk on import and while converting
        if src.kind == "module":
            src = _export_module(src, ds)
        declared, model = _declared(src)
        ds, said = vocabulary.fit(src.kind, declared, model, ds, signature_name)  # ids as the model takes them
        plan = plan_inputs(declared, ds, layout, src.path.name, say_fixed=src.kind != "onnx")
        key = _key(src.fingerprint, plan)
        hit = _cached(key)
        if hit is not None:
            content, record = hit
            record = record.model_copy(update={"cached": True})
        else:
            content, record = _convert(src, model, plan, ds)
    say_once(said)
    data = convert_data(ds, record) if ds is not None else None
    fingerprint = fingerprint_of(src.fingerprint, plan.key())
    if hit is None:
        _store(key, content, record)  # served again only if it validates (_cached); one that does not open fails alike
    converted = opened_content(replace(src, fingerprint=fingerprint), content)
    return replace(converted, conversion=record, facts=tuple(record.facts), module=None), data


def _declared(src) -> tuple[list[Declared], object]:
    """The source's inputs as it declares them, and what was read to know (the ONNX graph, the program)."""
    if src.kind == "onnx":
        model = _read_onnx(src.path)
        return _onnx_declared(model), model
    from optimize.convert.torch_files import load_pt2

    ep, facts = load_pt2(src.path)
    return _pt2_declared(ep), (ep, facts)


def _export_module(src, ds: Dataset | None):
    """An nn.Module exported to a .pt2 of ours (torch.export), named after its class, then read back as
    any .pt2 is; the module itself stays in this process as the eager reference."""
    import tempfile

    import torch

    module, sample = src.module
    declared = _module_declared(module, sample)
    if ds is None and sample is None:
        raise DataError(
            f"{src.path.stem}: an nn.Module needs data or sample inputs to be traced.",
            "Pass data=..., or (module, (sample,)).",
        )
    plan = plan_inputs(declared, ds, Layout.SOURCE, src.path.stem)
    rows = _first_sample(plan, ds, sample)
    from optimize.convert.onnx_ops import NamedIO

    inner = module
    named = NamedIO(
        inner, [(i.key, i.sample_axis == "whole") for i in plan.inputs], _output_names(inner, plan, rows)
    ).eval()
    ep = export(named, sample_kwargs(plan, rows), src.path.stem)
    folder = Path(tempfile.mkdtemp(prefix="optimize-module-"))
    atexit.register(shutil.rmtree, folder, True)  # read again by this run's workers: removed when this process ends
    path = folder / src.path.name
    torch.export.save(ep, str(path))
    fp = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    _MODULES[fp] = named
    return replace(src, path=path, kind="pt2", fingerprint=fp, module=None)


def _output_names(module, plan: Plan, rows: dict[str, np.ndarray]) -> list[str]:
    """The outputs' names: a dict's keys, else `output` or `output_0`, `output_1`, ... (one eager run)."""
    import torch

    from optimize.convert.onnx_ops import flatten_outputs

    with torch.no_grad(), _quiet():
        feeds = sample_kwargs(plan, rows)
        out = module(*[feeds[i.key][0] if i.sample_axis == "whole" else feeds[i.key] for i in plan.inputs])
    if isinstance(out, dict):
        return [str(k) for k in out]
    n = len(flatten_outputs(out))
    return ["output"] if n == 1 else [f"output_{k}" for k in range(n)]


def _inner(src, model, plan: Plan) -> tuple[object, list[str], list[str], dict]:
    """The source as a positional nn.Module, its output names, facts and timings."""
    if src.kind == "onnx":
        return _onnx_module(src.path, model, plan)
    ep, facts = model
    refuse_higher_order(ep, src.path.name)
    from optimize.convert import steps

    steps.begin(src.path.name, facts.nodes, "a program")
    notes = [f"written by torch {facts.torch_version}"] if facts.torch_version else []
    notes += facts.notes + ([f"{len(facts.pickled)} pickled member(s) read weights-only"] if facts.pickled else [])
    module = _program_module(ep)
    return module, [], notes, {}


#: torch.export's control-flow operators, which litert-torch has no lowering for ("Lowering not found: cond"),
#: and what to write instead.
HIGHER_ORDER = {
    "cond": "compute both branches and choose with torch.where(condition, a, b)",
    "while_loop": "loop a fixed number of times in Python (torch.export unrolls it)",
    "scan": "loop a fixed number of times in Python (torch.export unrolls it)",
    "map_impl": "loop over the fixed batch in Python (torch.export unrolls it)",
    "associative_scan": "loop a fixed number of times in Python (torch.export unrolls it)",
    "flex_attention": "use torch.nn.functional.scaled_dot_product_attention with a mask tensor",
}


def refuse_higher_order(ep, name: str) -> None:
    """A ModelError for the first control-flow operator (torch.cond, while_loop, ...) in the program: which,
    where in the model's code, and what to write instead (litert-torch has no lowering for them)."""
    import torch

    last_user_frame = ""
    for n in ep.graph.nodes:
        frames = [m for m in _FRAME.finditer(n.meta.get("stack_trace") or "") if not _not_users(m.group(1))]
        if frames:
            m = frames[-1]
            last_user_frame = f" ({Path(m.group(1)).name}:{m.group(2)} in {m.group(3)})"
        if n.op != "call_function" or not isinstance(n.target, torch._ops.HigherOrderOperator):
            continue
        op = getattr(n.target, "__name__", str(n.target))
        if op in HIGHER_ORDER:
            shown = "torch.cond" if op == "cond" else f"torch's {op}"
            raise ModelError(
                f"{name} uses {shown}{last_user_frame}, which litert-torch cannot convert (no LiteRT lowering).",
                f"Re-export it without: {HIGHER_ORDER[op]}.",
            )


def _program_module(ep):
    """An ExportedProgram's module, taking its user inputs positionally."""
    from optimize.convert.onnx_ops import Program

    return Program(ep)


def _convert(src, model, plan: Plan, ds: Dataset | None) -> tuple[bytes, Conversion]:
    """The float .tflite (NHWC where planned) and the record of how it was made."""
    from optimize.convert.onnx_ops import NamedIO

    inner, outputs, facts, seconds = _inner(src, model, plan)
    rows_source = _first_sample(replace(plan, inputs=[i.model_copy(update={"layout": ""}) for i in plan.inputs]), ds)
    outputs = outputs or _output_names(inner, plan, rows_source)
    shapes = _output_shapes(inner, plan, rows_source)
    last_in = [k for k, i in enumerate(plan.inputs) if i.layout == "NHWC"]
    last_out = (
        [k for k, s in enumerate(shapes) if plan.layout == Layout.CHANNELS_LAST and len(s) == 4] if last_in else []
    )
    whole_out = [k for k, s in enumerate(shapes) if not s or s[0] != 1]
    inputs = [(i.key, i.sample_axis == "whole") for i in plan.inputs]
    named = NamedIO(inner, inputs, outputs, last_in, last_out, whole_out).eval()
    rows = _first_sample(plan, ds)
    kw = sample_kwargs(plan, rows)
    from optimize.convert import steps

    t0 = time.perf_counter()
    with steps.step("torch.export"):
        export(named, kw, src.path.name)  # fails fast, naming where, before the converter's own export
    t1 = time.perf_counter()
    with steps.step("litert-torch"):
        content = to_tflite(named, kw, src.path.name)
    from optimize.convert.tflite_fold import fold

    content, folded = fold(content)  # constant subgraphs stored as constants, as the ONNX route's are
    facts = [*facts, f"{folded} op(s) on constants computed once and stored"] if folded else facts
    seconds.update({"export": t1 - t0, "convert": time.perf_counter() - t1})
    record = _record(src, plan, content, outputs, [outputs[k] for k in last_out], facts, seconds)
    return content, record.model_copy(update={"whole_outputs": [outputs[k] for k in whole_out]})


def named_module(src):
    """The converted source's named module again, as the conversion made it (read from its file: in a worker
    too), for routes that work on the torch graph (PT2E)."""
    from optimize.convert.onnx_ops import NamedIO

    record = src.conversion
    plan = Plan(list(record.inputs), dict(record.frozen), Layout(record.layout))
    with _quiet():
        _, model = _declared(src)
        inner, _, _, _ = _inner(src, model, plan)
        at = {n: k for k, n in enumerate(record.outputs)}
        named = NamedIO(
            inner, [(i.key, i.sample_axis == "whole") for i in record.inputs], record.outputs,
            [k for k, i in enumerate(record.inputs) if i.layout == "NHWC"],
            [at[n] for n in record.channel_last_outputs], [at[n] for n in record.whole_outputs],
        )  # fmt: skip
    return named.eval()


def _output_shapes(inner, plan: Plan, rows: dict[str, np.ndarray]) -> list[tuple[int, ...]]:
    import torch

    from optimize.convert.onnx_ops import flatten_outputs

    feeds = sample_kwargs(plan, rows)
    with torch.no_grad(), _quiet():
        out = inner(*[feeds[i.key][0] if i.sample_axis == "whole" else feeds[i.key] for i in plan.inputs])
    return [tuple(o.shape) for o in flatten_outputs(out)]


def _record(src, plan: Plan, content: bytes, outputs, last_out, facts, seconds) -> Conversion:
    from importlib import metadata

    specs, _ = tflite_io(content)
    by_key = {s.name: s for s in specs}
    inputs = [i.model_copy(update={"shape": list(by_key[i.key].shape) if i.key in by_key else []}) for i in plan.inputs]
    versions = {
        d: metadata.version(d) for d in ("torch", "litert-torch") if importlib.util.find_spec(d.replace("-", "_"))
    }
    route = "onnx_graph + onnx2torch + " if src.kind == "onnx" else ""
    return Conversion(
        source=src.kind, file=src.path.name, route=f"{route}torch.export + litert-torch {versions.get('litert-torch', '')}".strip(),
        layout=str(plan.layout), inputs=inputs, outputs=list(outputs), channel_last_outputs=list(last_out),
        frozen=dict(plan.frozen), facts=[*plan.facts, *facts], transposes=count_op(content, "TRANSPOSE"),
        seconds={k: round(v, 3) for k, v in seconds.items()},
    )  # fmt: skip


def count_op(content: bytes, op: str) -> int:
    """How many `op` nodes the model holds, in every subgraph."""
    from optimize.models.tflite import read_model

    return sum(1 for g in read_model(content).subgraphs for o in g.ops if o.name == op)


# ------------------------------------------------------------------------------------------- the data


def convert_data(ds: Dataset, record: Conversion) -> Dataset:
    """The data as the converted .tflite takes it: keyed by its input names, frozen inputs left out, image
    inputs moved to NHWC where the conversion made them so."""

    def one(x):
        if x is None:
            return None
        if not isinstance(x, dict):
            return _transform(x, record.inputs[0]) if len(record.inputs) == 1 else x
        return {
            i.key: _transform(x[i.name] if i.name in x else x[i.key], i)
            for i in record.inputs
            if i.name in x or i.key in x
        }

    return replace(ds, x_train=one(ds.x_train), x_cal=one(ds.x_cal), x_test=one(ds.x_test))


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


def side_by_side(src, xs, threads: int = 2) -> tuple[list, list, list[str], str, list]:
    """The converted .tflite and the source runtime on the same samples `xs`: (the .tflite's outputs, the
    source's stacked alike and in the same order, the output names, the reference runtime's name, each
    output's head) - what `fidelity` turns into the conversion's fidelity."""
    from optimize.models import runtime

    record: Conversion = src.conversion
    loaded = runtime.load(src.content, threads=threads, like=take(xs, slice(0, 1)))
    runner = runtime.Runner(loaded)
    mine = runner.predict(xs)
    names = runner.output_names()
    feeds = [source_feeds(record, take(xs, slice(i, i + 1))) for i in range(count(xs))]
    with quiet():
        reference, per_sample = source_outputs(src, feeds)
    ref = _stacked(per_sample, record)
    theirs = [ref[record.outputs.index(n)] if n in record.outputs else np.zeros_like(m) for n, m in zip(names, mine)]
    return mine, theirs, names, reference, [h for _, h in tflite_heads(src.content)]


def _stacked(per_sample: list[list[np.ndarray]], record: Conversion) -> list[np.ndarray]:
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


def source_outputs(src, xs: list[dict[str, np.ndarray]]) -> tuple[str, list[list[np.ndarray]]]:
    """(the reference runtime's name, its outputs per sample in the .tflite's output order) for samples in
    the source model's terms (`source_feeds`): ONNX Runtime on the original file, or PyTorch."""
    record = src.conversion
    if src.kind != "onnx":
        return _torch_eager(src, xs, record)
    return _onnx_runtime(src.path, xs, record)


def _onnx_runtime(path: Path, xs: list[dict], record: Conversion):
    from optimize.convert.onnx_checks import read

    ort = _import_onnxruntime()

    so = ort.SessionOptions()
    so.log_severity_level = 3
    _, checked = read(path)  # the bytes checked again as they are now: no external data for ORT to resolve
    sess = ort.InferenceSession(checked, so, providers=["CPUExecutionProvider"])
    types = {i.name: i.type for i in sess.get_inputs()}
    names = [o.name for o in sess.get_outputs()]
    out = []
    for feeds in xs:
        typed = {k: np.asarray(v, _ORT_TYPES.get(types.get(k), np.float32)) for k, v in feeds.items() if k in types}
        got = dict(zip(names, sess.run(None, typed)))
        out.append([got[n] for n in record.outputs])
    return f"ONNX Runtime {ort.__version__} on {path.name}", out


_ORT_TYPES = {
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(float)": np.float32,
    "tensor(bool)": np.bool_,
}


def _torch_eager(src, xs: list[dict], record: Conversion):
    import torch

    from optimize.convert.onnx_ops import flatten_outputs
    from optimize.convert.torch_files import load_pt2

    named = _MODULES.get(src.path and _fingerprint_file(src.path))
    what = "the nn.Module in PyTorch (eager)" if named is not None else f"the .pt2 program in PyTorch ({src.path.name})"
    if named is None:
        from optimize.convert.onnx_ops import NamedIO, Program

        ep, _ = load_pt2(src.path)
        named = NamedIO(Program(ep), [(i.key, i.sample_axis == "whole") for i in record.inputs], record.outputs)
    out = []
    with torch.no_grad(), _quiet():
        for feeds in xs:
            kw = {
                i.key: torch.from_numpy(
                    np.ascontiguousarray(feeds[i.name][None] if i.sample_axis == "whole" else feeds[i.name])
                )
                for i in record.inputs
            }
            got = named(**kw)
            values = (
                [got[n] for n in record.outputs]
                if isinstance(got, dict) and all(n in got for n in record.outputs)
                else flatten_outputs(got)
            )
            out.append([v.detach().numpy() for v in values])
    return f"{what}, torch {torch.__version__}", out


def _fingerprint_file(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    except OSError:
        return ""

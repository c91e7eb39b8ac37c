"""torch.export and litert-torch, called for every PyTorch and ONNX route: a named module traced and converted
to .tflite bytes (tensor names made readable, `names`), one eager run for its outputs' names and shapes, and
what they cannot do said in one line naming the place in the user's code (a Python branch on a tensor, a
control-flow operator litert-torch has no lowering for). torch, torchao and litert-torch talk on stdout and
stderr; `quiet` keeps that off the screen, in optimize's log. torch and litert-torch are imported inside
functions: this module imports without the torch extra.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import time
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from optimize.convert import steps
from optimize.convert.plan import Plan
from optimize.core import crash
from optimize.core.errors import ModelError
from optimize.core.results import Conversion
from optimize.core.vocab import Layout

# litert-torch imports JAX, which then warns at every fork (a quantizer's crash-contained child, a subprocess
# started by Ray or MLflow) that a child using JAX may deadlock: none of those children uses JAX.
warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called", category=RuntimeWarning)

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
def quiet():
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


def export(named, kwargs: dict, name: str):
    """torch.export the named module; a model it cannot trace is one line saying where tracing stopped."""
    import torch

    try:
        with quiet():
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
        with quiet(), crash.doing("litert-torch", None, "converting"):
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


@dataclass
class Made:
    """A float .tflite converted from a module, and what the conversion did to its interface."""

    content: bytes
    outputs: list[str]  # by the source's names, in order
    channel_last_outputs: list[str] = field(default_factory=list)  # outputs made NHWC
    whole_outputs: list[str] = field(default_factory=list)  # outputs whose first axis is not a batch of 1
    seconds: dict[str, float] = field(default_factory=dict)  # export, convert
    facts: list[str] = field(default_factory=list)  # what the conversion itself did (constants folded)

    def conversion(self, kind: str, file: str, route: str, plan: Plan, facts: list[str], seconds: dict) -> Conversion:
        """The record of how a `kind` source (its `file`; `route`: what came before torch.export) became this
        .tflite: the plan's inputs with the shapes the .tflite takes, the outputs, the facts, the seconds."""
        from importlib import metadata, util

        from optimize.models.spec import tflite_io
        from optimize.models.tflite import read_model

        specs, _ = tflite_io(self.content)
        by_key = {s.name: s for s in specs}
        inputs = [
            i.model_copy(update={"shape": list(by_key[i.key].shape) if i.key in by_key else []}) for i in plan.inputs
        ]
        versions = {d: metadata.version(d) for d in ("torch", "litert-torch") if util.find_spec(d.replace("-", "_"))}
        transposes = sum(1 for g in read_model(self.content).subgraphs for o in g.ops if o.name == "TRANSPOSE")
        return Conversion(
            source=kind, file=file, route=f"{route}torch.export + litert-torch {versions.get('litert-torch', '')}".strip(),
            layout=str(plan.layout), inputs=inputs, outputs=list(self.outputs), channel_last_outputs=self.channel_last_outputs,
            whole_outputs=self.whole_outputs, frozen=dict(plan.frozen), facts=[*plan.facts, *facts, *self.facts], transposes=transposes,
            seconds={k: round(v, 3) for k, v in {**seconds, **self.seconds}.items()},
        )  # fmt: skip


def converted(inner, plan: Plan, outputs: list[str], name: str) -> Made:
    """The positional module `inner` (its output names; [] for names found by an eager run) named as `plan`
    says (`NamedIO`: inputs and outputs by name, NHWC where planned), traced by torch.export (which fails fast,
    naming where, before the converter's own export) and converted by litert-torch."""
    from optimize.convert.onnx_ops import NamedIO

    names, shapes = eager_outputs(inner, plan, plan.source_rows)
    outputs = outputs or names
    last_in = [k for k, i in enumerate(plan.inputs) if i.layout == "NHWC"]
    images = [k for k, s in enumerate(shapes) if plan.layout == Layout.CHANNELS_LAST and len(s) == 4]
    last_out = images if last_in else []
    whole_out = [k for k, s in enumerate(shapes) if not s or s[0] != 1]
    inputs = [(i.key, i.sample_axis == "whole") for i in plan.inputs]
    named = NamedIO(inner, inputs, outputs, last_in, last_out, whole_out).eval()
    kw = sample_kwargs(plan, plan.rows)
    t0 = time.perf_counter()
    with steps.step("torch.export"):
        export(named, kw, name)
    t1 = time.perf_counter()
    with steps.step("litert-torch"):
        content = to_tflite(named, kw, name)
    from optimize.convert.tflite_fold import fold

    content, facts = fold(content)  # constant subgraphs stored as constants, as the ONNX route's are
    seconds = {"export": t1 - t0, "convert": time.perf_counter() - t1}
    return Made(content, outputs, [outputs[k] for k in last_out], [outputs[k] for k in whole_out], seconds, facts)


def traced(module, plan: Plan, name: str):
    """(the module with inputs and outputs by name, as torch.export traced it) for a plan in the module's own
    layout: what an nn.Module is exported to before it is converted as any .pt2."""
    from optimize.convert.onnx_ops import NamedIO

    outputs, _ = eager_outputs(module, plan, plan.rows)
    named = NamedIO(module, [(i.key, i.sample_axis == "whole") for i in plan.inputs], outputs).eval()
    return named, export(named, sample_kwargs(plan, plan.rows), name)


def sample_kwargs(plan: Plan, rows: dict[str, np.ndarray]) -> dict:
    """One sample as the keyword tensors the named module takes (data layout: NHWC where planned)."""
    import torch

    return {i.key: torch.from_numpy(np.ascontiguousarray(rows[i.key])) for i in plan.inputs}


def eager_outputs(module, plan: Plan, rows: dict[str, np.ndarray]) -> tuple[list[str], list[tuple[int, ...]]]:
    """The outputs' names (a dict's keys, else `output` or `output_0`, `output_1`, ...) and shapes, from one
    eager run of the positional module on one sample (`rows`, in the source model's layout)."""
    import torch

    from optimize.convert.onnx_ops import flatten_outputs

    feeds = sample_kwargs(plan, rows)
    with torch.no_grad(), quiet():
        out = module(*[feeds[i.key][0] if i.sample_axis == "whole" else feeds[i.key] for i in plan.inputs])
    shapes = [tuple(o.shape) for o in flatten_outputs(out)]
    if isinstance(out, dict):
        return [str(k) for k in out], shapes
    return (["output"] if len(shapes) == 1 else [f"output_{k}" for k in range(len(shapes))]), shapes


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

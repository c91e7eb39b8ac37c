"""The PyTorch and ONNX formats' side of the door's route (`route`): litert-torch converts them, each through the
positional nn.Module its format makes (`TorchSource.inner`: `onnx_file.OnnxFile`'s onnx2torch module,
`pt2_file.Pt2File`'s program, `torch_module.TorchModule`'s exported module), named and traced by `torch_export`.

torch, onnx and onnx2torch are imported inside functions: this module imports without the torch extra, and
`require` says which extra to install when a model needs it.
"""

from __future__ import annotations

import importlib.util
import os

from optimize.convert import conversions, torch_export
from optimize.convert.plan import Plan
from optimize.convert.route import DoorSource
from optimize.core.errors import ModelError
from optimize.core.results import Conversion
from optimize.models.spec import ModelSource

INSTALL = 'pip install -e ".[torch]" --extra-index-url https://download.pytorch.org/whl/cpu (CPU builds of torch)'
#: What each kind of source needs installed (import names).
NEEDS = {
    "onnx": ("torch", "litert_torch", "onnx", "onnx2torch", "onnxruntime"),
    "pt2": ("torch", "litert_torch"),
    "module": ("torch", "litert_torch"),
}


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


class TorchSource(DoorSource):
    """One PyTorch or ONNX model, opened: converted through its positional nn.Module (`inner`), torch.export and
    litert-torch."""

    #: What the conversion record names before torch.export and litert-torch.
    route = ""

    def __init__(self, src: ModelSource):
        super().__init__(src)
        inductor = conversions.library_folder("torchinductor")  # torch's cache, not the temp folder
        if inductor is not None:
            os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(inductor))

    def inner(self, plan: Plan) -> tuple[object, list[str], list[str], dict]:
        """(the source as a positional nn.Module for `plan`, its output names ([]: found by an eager run),
        what making it did (facts), the seconds its steps took)."""
        raise NotImplementedError

    def converted(self, plan: Plan, key: str) -> tuple[bytes, Conversion]:
        """The float .tflite (NHWC where planned) and the record of how it was made, kept under `key`."""
        inner, outputs, facts, seconds = self.inner(plan)
        made = torch_export.converted(inner, plan, outputs, self.name)
        record = made.conversion(self.src.kind, self.name, self.route, plan, facts, seconds)
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

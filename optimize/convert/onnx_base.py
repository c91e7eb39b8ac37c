"""What our onnx2torch converters share: onnx2torch imported (with a torchvision stand-in where the real one cannot
be), converters registered over or beside onnx2torch's own, and the graph facts a converter reads.

This is PyTorch code: it imports torch, onnx and onnx2torch when it is imported, which only the PyTorch and
ONNX front door does, with the torch extra installed.

onnx2torch imports torchvision at import time (only its NonMaxSuppression and RoiAlign converters use it).
PyPI's torchvision is a CUDA build, which fails to import beside the CPU build of torch ("operator
torchvision::nms does not exist"); where it cannot be imported, a stand-in serves that one import, and a
model with those ops fails at conversion with the reason.
"""

from __future__ import annotations

import importlib
import sys
import types

import numpy as np
import onnx
from torch import nn

from optimize.core.shown import named

_MISSING = "torchvision cannot be imported here ({why}); the ONNX {op} operator needs it"


def _stand_in(why: str) -> types.ModuleType:
    tv = types.ModuleType("torchvision")
    ops = types.ModuleType("torchvision.ops")

    def missing(op):
        def f(*_a, **_k):
            raise NotImplementedError(_MISSING.format(why=why, op=op))

        return f

    ops.nms = missing("NonMaxSuppression")
    ops.box_convert = missing("NonMaxSuppression")
    ops.roi_align = missing("RoiAlign")
    tv.ops = ops
    return tv


def import_onnx2torch():
    """onnx2torch, imported with a torchvision stand-in when the real one cannot be imported."""
    if "onnx2torch" in sys.modules:
        return sys.modules["onnx2torch"]
    try:
        importlib.import_module("torchvision")
    except Exception as e:  # noqa: BLE001 - RuntimeError (a CUDA build beside CPU torch), ImportError (absent)
        why = f"{e.__class__.__name__}: {str(e).splitlines()[0] if str(e) else ''}".strip()
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]
        tv = _stand_in(why)
        sys.modules["torchvision"], sys.modules["torchvision.ops"] = tv, tv.ops
        try:
            return importlib.import_module("onnx2torch")
        finally:  # the stand-in serves onnx2torch's import only; anyone else asking gets the real error
            del sys.modules["torchvision"], sys.modules["torchvision.ops"]
    return importlib.import_module("onnx2torch")


onnx2torch = import_onnx2torch()
from onnx2torch.node_converters import registry as _registry  # noqa: E402
from onnx2torch.onnx_graph import OnnxGraph  # noqa: E402
from onnx2torch.onnx_node import OnnxNode  # noqa: E402
from onnx2torch.utils.common import OnnxMapping, OnnxToTorchModule, OperationConverterResult  # noqa: E402


class ConversionError(NotImplementedError):
    """One ONNX node cannot be converted; the message names the node and why."""


# ------------------------------------------------------------------------------------------- registration


def since_versions(op_type: str, domain: str = "") -> tuple[int, ...]:
    """Every opset version at which the op's schema changed (what onnx2torch's registry is keyed by)."""
    return tuple(
        sorted(
            {
                s.since_version
                for s in onnx.defs.get_all_schemas_with_history()
                if s.name == op_type and s.domain == domain
            }
        )
    )


def register(op_type: str, domain: str = "", versions: tuple[int, ...] | None = None):
    """Install a converter for every version of `op_type`, replacing onnx2torch's where it has one.

    onnx2torch's public `add_converter` refuses a second converter for the same (domain, op, version); its
    registry is a plain dict, so an existing entry is removed first, then `add_converter` registers ours."""

    def deco(converter):
        for v in versions or since_versions(op_type, domain):
            _registry._CONVERTER_REGISTRY.pop(_registry.OperationDescription(domain, op_type, v), None)
            _registry.add_converter(operation_type=op_type, version=v, domain=domain)(converter)
        return converter

    return deco


def has_converter(op_type: str, version: int, domain: str = "") -> bool:
    try:
        _registry.get_converter(operation_type=op_type, version=version, domain=domain)
        return True
    except NotImplementedError:
        return False


# ------------------------------------------------------------------------------------------- graph facts


def const(graph: OnnxGraph, name: str) -> np.ndarray | None:
    """The value of an initializer input, or None if the input is empty or computed at run time."""
    if not name:
        return None
    t = graph.initializers.get(name)
    return None if t is None else t.to_numpy()


def need_const(node: OnnxNode, graph: OnnxGraph, index: int, what: str) -> np.ndarray | None:
    """An operand that must be constant (None if absent); a ConversionError if it is computed at run time."""
    if index >= len(node.input_values) or not node.input_values[index]:
        return None
    v = const(graph, node.input_values[index])
    if v is None:
        raise ConversionError(
            f"{where(node)}: its {what} is computed at run time; only a constant one converts (fix the input "
            "shapes from data so it folds)"
        )
    return v


def static_shape(graph: OnnxGraph, name: str) -> tuple[int, ...] | None:
    vi = graph.value_info.get(name)
    if vi is None or not vi.type.tensor_type.HasField("shape"):
        t = graph.initializers.get(name)
        return tuple(t.to_numpy().shape) if t is not None else None
    dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None for d in vi.type.tensor_type.shape.dim]
    return None if any(d is None for d in dims) else tuple(dims)


def result(module: nn.Module, node: OnnxNode, *indices: int) -> OperationConverterResult:
    """The module fed only the listed inputs (constants are baked into it)."""
    inputs = tuple(node.input_values[i] for i in indices)
    return OperationConverterResult(
        torch_module=module, onnx_mapping=OnnxMapping(inputs=inputs, outputs=node.output_values)
    )


def where(node: OnnxNode) -> str:
    return f"{named(node.operation_type)} node {named(node.name or node.output_values[0])}"


class Module(nn.Module, OnnxToTorchModule):
    """Base of our modules (the marker class lets onnx2torch's tools recognise them)."""

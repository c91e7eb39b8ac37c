"""Dense layers of an ONNX graph converted as the layers they were: MatMul by a constant matrix (and the bias
Add `onnx_graph` fuses into it, our `optimize.Linear`) as `F.linear`, and `Gelu` as `F.gelu`.

Why it matters: torch.onnx writes a 3-D `nn.Linear` as MatMul + Add and `nn.GELU` as x * 0.5 * (1 + erf(x /
sqrt 2)). onnx2torch turns MatMul into `torch.matmul`, which PT2E's quantizer does not annotate (it quantizes
`linear`): through ONNX, int8-pt2e kept every dense layer float ("no weights were quantized") where the same
module's `.pt2` was int8. The erf lowers to a polynomial between MINIMUM and MAXIMUM, which LiteRT Quantizer
has no integer MINIMUM for, where the `.pt2` has one GELU op. Converted as linear layers and GELU, an ONNX
export gives the FULLY_CONNECTED and GELU ops its `.pt2` gives.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from optimize.convert.onnx_base import (
    Module,
    OnnxGraph,
    OnnxMapping,
    OnnxNode,
    OperationConverterResult,
    const,
    register,
    result,
)


class Linear(Module):
    """x @ W (+ b) with a constant W (K x N): `F.linear` with the weight stored as N x K, as nn.Linear holds it."""

    def __init__(self, weight: np.ndarray, bias: np.ndarray | None):
        super().__init__()
        self.register_buffer("weight", torch.as_tensor(np.ascontiguousarray(weight.T)))
        self.register_buffer("bias", None if bias is None else torch.as_tensor(np.ascontiguousarray(bias)))

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)


def _weight(graph: OnnxGraph, name: str) -> np.ndarray | None:
    w = const(graph, name)
    return w if w is not None and w.ndim == 2 and w.dtype.kind == "f" else None


@register("MatMul")
def _matmul(node: OnnxNode, graph: OnnxGraph):
    """MatMul(x, W) with a constant float matrix W: a linear layer; anything else: onnx2torch's own module."""
    w = _weight(graph, node.input_values[1])
    if w is not None and const(graph, node.input_values[0]) is None:
        return result(Linear(w, None), node, 0)
    from onnx2torch.node_converters.matmul import OnnxMatMul

    mapping = OnnxMapping(inputs=node.input_values, outputs=node.output_values)
    return OperationConverterResult(torch_module=OnnxMatMul(), onnx_mapping=mapping)


@register("Linear", domain="optimize", versions=(1,))
def _linear(node: OnnxNode, graph: OnnxGraph):
    """Our fused MatMul + bias Add (onnx_graph): x @ W + b."""
    w, b = _weight(graph, node.input_values[1]), const(graph, node.input_values[2])
    return result(Linear(w, b.reshape(-1)), node, 0)


class Gelu(Module):
    def __init__(self, approximate: str = "none"):
        super().__init__()
        self.approximate = approximate

    def forward(self, x):
        return F.gelu(x, approximate=self.approximate)


@register("Gelu", domain="optimize", versions=(1,))
def _gelu_own(node: OnnxNode, graph: OnnxGraph):
    return result(Gelu(), node, 0)


@register("Gelu")
def _gelu(node: OnnxNode, graph: OnnxGraph):
    return result(Gelu(node.attributes.get("approximate", "none")), node, 0)

"""The selection ops of end-to-end detector heads (YOLOv10, YOLO11 `end2end`, RT-DETR-style exports): TopK with a
constant K, ArgMax / ArgMin and GatherElements, converted so torch.export and litert-torch take them.

onnx2torch's TopK reads K from a tensor at run time (`int(k)`), which litert-torch's lowering cannot ("Abstract
tracer value encountered where concrete value is expected"): the same head converts from its `.pt2` and failed
from its ONNX export. Here K is read once, when the graph is converted (a constant, as exporters write it; one
computed at run time is refused naming the node), and baked into the module. LiteRT's TOPK_V2 works on the last
axis, so a TopK on another axis is moved there and back; `largest = 0` is the TopK of the negated values.
ArgMax / ArgMin keep ONNX's `keepdims`; `select_last_index = 1` (the last of equal values) is refused naming the
node, as torch's argmax takes the first. GatherElements is `torch.gather` along the axis made non-negative
(indices must be too: ONNX allows negative ones, exporters of these heads write TopK's, which are not).
"""

from __future__ import annotations

import torch

from optimize.convert.onnx_base import ConversionError, Module, OnnxGraph, OnnxNode, need_const, register, result, where


class TopK(Module):
    def __init__(self, k: int, axis: int, largest: bool, ordered: bool):
        super().__init__()
        self.k, self.axis, self.largest, self.ordered = k, axis, largest, ordered

    def forward(self, x):
        last = self.axis in (-1, x.dim() - 1)
        y = x if last else x.movedim(self.axis, -1)
        values, indices = torch.topk(y if self.largest else -y, self.k, dim=-1, largest=True, sorted=self.ordered)
        values = values if self.largest else -values
        if not last:
            values, indices = values.movedim(-1, self.axis), indices.movedim(-1, self.axis)
        return values, indices


@register("TopK")
def _topk(node: OnnxNode, graph: OnnxGraph):
    a = node.attributes
    if len(node.input_values) > 1:
        k = need_const(node, graph, 1, "K")
        k = int(k.reshape(-1)[0])
    else:  # opset 1-9: K is an attribute
        k = int(a["k"])
    if k < 1:
        raise ConversionError(f"{where(node)}: K is {k}; only K >= 1 converts")
    module = TopK(k, int(a.get("axis", -1)), bool(a.get("largest", 1)), bool(a.get("sorted", 1)))
    return result(module, node, 0)


class ArgExtremum(Module):
    def __init__(self, largest: bool, axis: int, keepdims: bool):
        super().__init__()
        self.largest, self.axis, self.keepdims = largest, axis, keepdims

    def forward(self, x):
        fn = torch.argmax if self.largest else torch.argmin
        return fn(x, dim=self.axis, keepdim=self.keepdims)


def _arg(node: OnnxNode, graph: OnnxGraph):
    a = node.attributes
    if int(a.get("select_last_index", 0)):
        raise ConversionError(
            f"{where(node)}: select_last_index = 1 (the last of equal values) does not convert; torch takes the first"
        )
    module = ArgExtremum(node.operation_type == "ArgMax", int(a.get("axis", 0)), bool(a.get("keepdims", 1)))
    return result(module, node, 0)


register("ArgMax")(_arg)
register("ArgMin")(_arg)


class GatherElements(Module):
    def __init__(self, axis: int):
        super().__init__()
        self.axis = axis

    def forward(self, x, index):
        return torch.gather(x, self.axis % x.dim(), index.long())


@register("GatherElements")
def _gather_elements(node: OnnxNode, graph: OnnxGraph):
    return result(GatherElements(int(node.attributes.get("axis", 0))), node, 0, 1)

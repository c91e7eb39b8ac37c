"""Export-friendly onnx2torch converters, registered over (or beside) onnx2torch's own.

This is PyTorch code: it imports torch, onnx and onnx2torch when it is imported, which only the PyTorch and
ONNX route does (`onnx_file`), with the torch extra installed.

onnx2torch turns each ONNX node into a small nn.Module. Many of its modules receive shape-like operands
(Reshape's shape, Slice's starts and ends, Resize's scales, Unsqueeze's axes, Pad's pads, Clip's bounds)
as tensors at run time and call `.tolist()`, `.numpy()` or `torch.any(...)` on them in `forward`: eager
PyTorch runs that, `torch.export` cannot ("Could not guard on data-dependent expression"). On a normalised
graph (`onnx_graph`) those operands are initializers, so each converter here reads them once, when the
graph is converted, and bakes them into the module as Python numbers; the module's forward sees only data.

It also adds what onnx2torch lacks: LSTM and GRU (any direction, initial states, layout 0/1; unrolled over
the static sequence length into matmuls and activations that litert-torch lowers to FULLY_CONNECTED,
LOGISTIC and TANH), BatchNormalization of any rank, HardSwish (also in our own domain for old opsets), and
an `If` converter that says why a branch on run-time data cannot be converted. `unsupported_ops` names the
ops no converter takes, before any conversion work.

What the converters share (onnx2torch imported with a torchvision stand-in, registration, the graph facts a
converter reads) is in `onnx_base`.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
import torch
import torch.nn.functional as F
from torch import nn

from optimize.convert.onnx_base import (
    ConversionError,
    Module,
    OnnxGraph,
    OnnxMapping,
    OnnxNode,
    OperationConverterResult,
    const,
    has_converter,
    need_const,
    onnx2torch,
    register,
    result,
    static_shape,
    where,
)
from optimize.core.shown import named

_INT64_MAX = np.iinfo(np.int64).max


def unsupported_ops(model: onnx.ModelProto) -> list[str]:
    """'Op (opset N, node NAME)' for every distinct op no registered converter takes."""
    opsets = {o.domain or "": o.version for o in model.opset_import}
    missing: dict[tuple[str, str], str] = {}
    for n in model.graph.node:
        dom = "" if n.domain in ("", "ai.onnx") else n.domain
        version = opsets.get(dom, opsets.get("ai.onnx", 1))
        if (dom, n.op_type) not in missing and not has_converter(n.op_type, version, dom):
            missing[(dom, n.op_type)] = (
                f"{named((dom + '.' if dom else '') + n.op_type)} (opset {version}, node {named(n.name or n.output[0])})"
            )
    return list(missing.values())


def convert(model: onnx.ModelProto) -> nn.Module:
    """The normalised graph as an nn.Module in eval mode (onnx2torch returns training mode)."""
    return onnx2torch.convert(model).eval()


# ------------------------------------------------------------------------------------------- shape ops


class Reshape(Module):
    def __init__(self, shape: list[int]):
        super().__init__()
        self.shape = shape

    def forward(self, x):
        return torch.reshape(x, self.shape)


@register("Reshape")
def _reshape(node: OnnxNode, graph: OnnxGraph):
    shape = [int(s) for s in need_const(node, graph, 1, "target shape")]
    if node.attributes.get("allowzero", 0) == 0 and 0 in shape:
        src = static_shape(graph, node.input_values[0])
        if src is None:
            raise ConversionError(f"{where(node)}: a 0 in the target shape needs the input's static shape")
        shape = [src[i] if s == 0 else s for i, s in enumerate(shape)]
    return result(Reshape(shape), node, 0)


class Flatten(Module):
    def __init__(self, axis: int):
        super().__init__()
        self.axis = axis

    def forward(self, x):
        a = self.axis if self.axis >= 0 else x.dim() + self.axis
        lead = 1
        for d in x.shape[:a]:
            lead *= d
        return torch.reshape(x, (lead, -1))


@register("Flatten")
def _flatten(node: OnnxNode, graph: OnnxGraph):
    return result(Flatten(node.attributes.get("axis", 1)), node, 0)


class Squeeze(Module):
    def __init__(self, axes: list[int] | None):
        super().__init__()
        self.axes = axes

    def forward(self, x):
        if self.axes is None:
            return torch.squeeze(x)
        for a in sorted(((a + x.dim()) % x.dim() for a in self.axes), reverse=True):
            x = torch.squeeze(x, a)
        return x


@register("Squeeze")
def _squeeze(node: OnnxNode, graph: OnnxGraph):
    axes = node.attributes.get("axes")
    if axes is None and len(node.input_values) > 1:
        v = need_const(node, graph, 1, "axes")
        axes = None if v is None else [int(a) for a in v.reshape(-1)]
    if axes is None:
        shp = static_shape(graph, node.input_values[0])
        axes = [i for i, d in enumerate(shp) if d == 1] if shp is not None else None
    return result(Squeeze(list(axes) if axes is not None else None), node, 0)


class Unsqueeze(Module):
    def __init__(self, axes: list[int]):
        super().__init__()
        self.axes = axes

    def forward(self, x):
        rank = x.dim() + len(self.axes)
        for a in sorted((a + rank) % rank for a in self.axes):
            x = torch.unsqueeze(x, a)
        return x


@register("Unsqueeze")
def _unsqueeze(node: OnnxNode, graph: OnnxGraph):
    axes = node.attributes.get("axes")
    if axes is None:
        axes = [int(a) for a in need_const(node, graph, 1, "axes").reshape(-1)]
    return result(Unsqueeze(list(axes)), node, 0)


def _slice_bounds(start: int, end: int, step: int, dim: int) -> tuple[int, int]:
    """ONNX Slice's clamping of start and end for a dimension of size `dim`."""
    start, end = start + dim if start < 0 else start, end + dim if end < 0 else end
    if step > 0:
        return min(max(start, 0), dim), min(max(end, 0), dim)
    return min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)


class Slice(Module):
    """Per axis either a python slice (positive step) or a constant index list (negative step)."""

    def __init__(self, parts: list[tuple[int, object]]):
        super().__init__()
        self.parts = parts

    def forward(self, x):
        for axis, part in self.parts:
            if isinstance(part, slice):
                x = x[(slice(None),) * axis + (part,)]
            else:
                x = torch.index_select(x, axis, torch.tensor(part, dtype=torch.long))
        return x


def _slice_operands(node: OnnxNode, graph: OnnxGraph):
    a = node.attributes
    if "starts" in a:  # opset 1-9: attributes
        starts, ends = list(a["starts"]), list(a["ends"])
        return starts, ends, list(a.get("axes", range(len(starts)))), [1] * len(starts)
    starts = need_const(node, graph, 1, "starts").tolist()
    ends = need_const(node, graph, 2, "ends").tolist()
    ax, st = need_const(node, graph, 3, "axes"), need_const(node, graph, 4, "steps")
    axes = ax.tolist() if ax is not None else list(range(len(starts)))
    return starts, ends, axes, st.tolist() if st is not None else [1] * len(starts)


def _slice_part(node: OnnxNode, shp, s: int, e: int, axis: int, step: int):
    """(axis, part) for one sliced axis, or None where the slice keeps the whole axis."""
    if axis < 0:
        if shp is None:
            raise ConversionError(f"{where(node)}: a negative axis needs the input's static shape")
        axis += len(shp)
    if shp is None:
        if step <= 0:
            raise ConversionError(f"{where(node)}: a negative step needs the input's static shape")
        return axis, slice(s, None if e >= _INT64_MAX // 2 else e, step)
    s, e = _slice_bounds(s, e, step, shp[axis])
    if step < 0:
        return axis, list(range(s, e, step))
    return None if (s, e, step) == (0, shp[axis], 1) else (axis, slice(s, e, step))


@register("Slice")
def _slice(node: OnnxNode, graph: OnnxGraph):
    shp = static_shape(graph, node.input_values[0])
    parts = [
        _slice_part(node, shp, int(s), int(e), int(ax), int(st)) for s, e, ax, st in zip(*_slice_operands(node, graph))
    ]
    return result(Slice([p for p in parts if p is not None]), node, 0)


class Pad(Module):
    """ONNX Pad: negative pads crop; constant padding by F.pad; reflect, edge and wrap padding by F.pad where it
    takes them (the padded axes are the last 1-3 and a batch and channel axis precede them: MIRROR_PAD), else
    axis by axis as a gather of precomputed source positions (`gathers`: reflect on the middle axis of an
    [N, T, C] tensor, as tf2onnx writes Keras' NWC audio models; F.pad's unbatched form of that does not
    lower)."""

    def __init__(self, pads: list[int], mode: str, value: float, crop, gathers=()):
        super().__init__()
        self.pads, self.mode, self.value, self.crop = pads, mode, value, crop
        self.gathers = [(axis, list(index)) for axis, index in gathers]

    def forward(self, x):
        for axis, lo, hi in self.crop:  # negative pads crop
            x = x.narrow(axis, lo, x.shape[axis] - lo - hi)
        for axis, index in self.gathers:
            x = torch.index_select(x, axis, torch.tensor(index, dtype=torch.long))
        if not any(self.pads):
            return x
        if self.mode == "constant":
            return F.pad(x, self.pads, mode="constant", value=self.value)
        return F.pad(x, self.pads, mode=self.mode)


def pad_index(n: int, lo: int, hi: int, mode: str) -> list[int]:
    """The source position of each output position along one axis of length n padded by lo and hi."""
    out = []
    for i in range(-lo, n + hi):
        if mode == "replicate":
            j = min(max(i, 0), n - 1)
        elif mode == "circular":
            j = i % n
        else:  # reflect: the edge itself is not repeated
            j = -i if i < 0 else (2 * (n - 1) - i if i >= n else i)
        out.append(j)
    return out


PAD_MODES = {"constant": "constant", "reflect": "reflect", "edge": "replicate", "wrap": "circular"}


def _pad_operands(node: OnnxNode, graph: OnnxGraph):
    a = node.attributes
    if "pads" in a:
        return list(a["pads"]), float(a.get("value", 0.0)), None
    pads = need_const(node, graph, 1, "pads").tolist()
    v = need_const(node, graph, 2, "constant value")
    ax = need_const(node, graph, 3, "axes")
    return pads, float(v.reshape(-1)[0]) if v is not None and v.size else 0.0, ax.tolist() if ax is not None else None


def _pad_gathers(node: OnnxNode, shp, padded: list[int], begin: dict, end: dict, crop, mode: str):
    """(axis, source positions) per padded axis, for reflect/edge/wrap padding F.pad cannot lower."""
    if shp is None:
        raise ConversionError(f"{where(node)}: {mode} padding of axis {padded[0]} needs the input's static shape")
    sizes = [shp[ax] - next((lo + hi for a, lo, hi in crop if a == ax), 0) for ax in range(len(shp))]
    bad = [ax for ax in padded if mode == "reflect" and max(begin.get(ax, 0), end.get(ax, 0)) >= sizes[ax]]
    if bad:
        raise ConversionError(f"{where(node)}: reflect padding of axis {bad[0]} is as long as the axis itself")
    return [(ax, pad_index(sizes[ax], max(begin.get(ax, 0), 0), max(end.get(ax, 0), 0), mode)) for ax in padded]


@register("Pad")
def _pad(node: OnnxNode, graph: OnnxGraph):
    pads, value, axes = _pad_operands(node, graph)
    mode = PAD_MODES.get(node.attributes.get("mode", "constant"))
    if mode is None:
        raise ConversionError(f"{where(node)}: pad mode {node.attributes.get('mode')} has no PyTorch equivalent")
    shp = static_shape(graph, node.input_values[0])
    rank = len(shp) if shp is not None else len(pads) // 2
    axes = [x % rank for x in axes] if axes is not None else list(range(rank))
    begin, end = dict(zip(axes, pads[: len(axes)])), dict(zip(axes, pads[len(axes) :]))
    crop = [
        (ax, -min(begin.get(ax, 0), 0), -min(end.get(ax, 0), 0))
        for ax in range(rank)
        if min(begin.get(ax, 0), end.get(ax, 0)) < 0
    ]
    padded = [ax for ax in range(rank) if begin.get(ax, 0) > 0 or end.get(ax, 0) > 0]
    span = rank - min(padded, default=rank)  # F.pad pads the last `span` axes
    if mode != "constant" and padded and not (span <= 3 and rank - span >= 2):
        return result(Pad([], mode, value, crop, _pad_gathers(node, shp, padded, begin, end, crop, mode)), node, 0)
    torch_pads: list[int] = []
    for ax in range(rank - 1, min(padded, default=rank - 1) - 1, -1):  # F.pad: last dimension first
        torch_pads += [max(begin.get(ax, 0), 0), max(end.get(ax, 0), 0)]
    return result(Pad(torch_pads, mode, value, crop), node, 0)


class Split(Module):
    def __init__(self, sizes: list[int], axis: int):
        super().__init__()
        self.sizes, self.axis = sizes, axis

    def forward(self, x):
        parts = tuple(torch.split(x, self.sizes, dim=self.axis))
        return parts if len(parts) > 1 else parts[0]


@register("Split")
def _split(node: OnnxNode, graph: OnnxGraph):
    axis = node.attributes.get("axis", 0)
    sizes = node.attributes.get("split")
    if sizes is None and len(node.input_values) > 1 and node.input_values[1]:
        sizes = need_const(node, graph, 1, "split sizes").tolist()
    shp = static_shape(graph, node.input_values[0])
    if shp is None:
        raise ConversionError(f"{where(node)}: needs the input's static shape")
    axis = axis % len(shp)
    if sizes is None:
        k = node.attributes.get("num_outputs", len(node.output_values))
        each = math.ceil(shp[axis] / k)
        sizes = [each] * (k - 1) + [shp[axis] - each * (k - 1)]
    return result(Split([int(s) for s in sizes], axis), node, 0)


class Expand(Module):
    def __init__(self, shape: list[int]):
        super().__init__()
        self.shape = shape

    def forward(self, x):
        rank = max(len(self.shape), x.dim())
        shape = [1] * (rank - len(self.shape)) + list(self.shape)
        xs = [1] * (rank - x.dim()) + list(x.shape)
        return x.reshape(xs).expand([max(a, b) for a, b in zip(xs, shape)])  # ONNX Expand broadcasts both ways


@register("Expand")
def _expand(node: OnnxNode, graph: OnnxGraph):
    return result(Expand([int(s) for s in need_const(node, graph, 1, "shape")]), node, 0)


class Tile(Module):
    def __init__(self, repeats: list[int]):
        super().__init__()
        self.repeats = repeats

    def forward(self, x):
        return x.repeat(self.repeats)


@register("Tile")
def _tile(node: OnnxNode, graph: OnnxGraph):
    return result(Tile([int(s) for s in need_const(node, graph, 1, "repeats")]), node, 0)


class Gather(Module):
    def __init__(self, axis: int, index: int | list, shape: tuple[int, ...] | None):
        super().__init__()
        self.axis, self.index, self.shape = axis, index, shape

    def forward(self, x):
        if isinstance(self.index, int):
            return torch.select(x, self.axis, self.index)
        flat = torch.index_select(x, self.axis, torch.tensor(self.index, dtype=torch.long))
        if self.shape is None:
            return flat
        return flat.reshape(list(x.shape[: self.axis]) + list(self.shape) + list(x.shape[self.axis + 1 :]))


class Embedding(Module):
    """Rows of a constant table picked by run-time ids: ONNX's Gather(table, ids, axis=0), as exporters write
    nn.Embedding. `F.embedding` lowers to EMBEDDING_LOOKUP, whose table every weight recipe quantizes (float16,
    dynamic, int4, int8); onnx2torch's general Gather lowers to GATHER_ND, whose table stays float32. Ids are
    0..rows-1, as nn.Embedding takes them (ONNX's negative ids, counted from the end, are not exported from
    an embedding)."""

    def __init__(self, table: np.ndarray):
        super().__init__()
        self.register_buffer("weight", torch.as_tensor(np.ascontiguousarray(table)))

    def forward(self, ids):
        return F.embedding(ids, self.weight)


def _embedding_table(node: OnnxNode, graph: OnnxGraph) -> np.ndarray | None:
    """The table of a Gather that is an embedding lookup: a constant float matrix, gathered on axis 0."""
    table = const(graph, node.input_values[0])
    if table is None or table.ndim != 2 or table.dtype.kind != "f" or node.attributes.get("axis", 0) not in (0, -2):
        return None
    return table


@register("Gather")
def _gather(node: OnnxNode, graph: OnnxGraph):
    idx = const(graph, node.input_values[1])
    table = _embedding_table(node, graph) if idx is None else None
    if table is not None:
        return result(Embedding(table), node, 1)
    if idx is None:  # run-time indices on a computed tensor: onnx2torch's own module is export-friendly
        from onnx2torch.node_converters.gather import OnnxGather

        mapping = OnnxMapping(inputs=node.input_values, outputs=node.output_values)
        return OperationConverterResult(
            torch_module=OnnxGather(axis=node.attributes.get("axis", 0)), onnx_mapping=mapping
        )
    shp = static_shape(graph, node.input_values[0])
    if shp is None:
        raise ConversionError(f"{where(node)}: constant indices need the input's static shape")
    axis = node.attributes.get("axis", 0) % len(shp)
    idx = np.where(idx < 0, idx + shp[axis], idx).astype(np.int64)
    if idx.ndim == 0:
        return result(Gather(axis, int(idx), None), node, 0)
    return result(Gather(axis, idx.reshape(-1).tolist(), tuple(idx.shape) if idx.ndim != 1 else None), node, 0)


# ------------------------------------------------------------------------------------------- elementwise


class Clip(Module):
    def __init__(self, lo: float | None, hi: float | None):
        super().__init__()
        self.lo, self.hi = lo, hi

    def forward(self, x):
        if self.lo == 0.0 and self.hi == 6.0:
            return F.relu6(x)
        if self.lo == 0.0 and self.hi is None:
            return F.relu(x)
        return torch.clamp(x, self.lo, self.hi)


@register("Clip")
def _clip(node: OnnxNode, graph: OnnxGraph):
    a = node.attributes
    if "min" in a or "max" in a:
        return result(Clip(a.get("min"), a.get("max")), node, 0)
    lo, hi = need_const(node, graph, 1, "min"), need_const(node, graph, 2, "max")
    bound = [None if v is None else float(v.reshape(-1)[0]) for v in (lo, hi)]
    return result(Clip(*bound), node, 0)


class BatchNorm(Module):
    """Inference batch norm over axis 1 for an input of any rank >= 2 (F.batch_norm takes (N, C, ...))."""

    def __init__(self, scale, bias, mean, var, eps):
        super().__init__()
        for k, v in {"weight": scale, "bias": bias, "running_mean": mean, "running_var": var}.items():
            self.register_buffer(k, torch.as_tensor(v, dtype=torch.float32))
        self.eps = eps

    def forward(self, x):
        return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, False, 0.0, self.eps)


@register("BatchNormalization")
def _batchnorm(node: OnnxNode, graph: OnnxGraph):
    if len([o for o in node.output_values if o]) > 1 or node.attributes.get("training_mode", 0):
        raise ConversionError(f"{where(node)}: training-mode batch norm")
    vals = [need_const(node, graph, i, w) for i, w in enumerate(["", "scale", "bias", "mean", "variance"]) if i]
    return result(BatchNorm(*vals, float(node.attributes.get("epsilon", 1e-5))), node, 0)


class Reduce(Module):
    FUNCS = {
        "ReduceMean": lambda x, d, k: torch.mean(x, dim=d, keepdim=k),
        "ReduceSum": lambda x, d, k: torch.sum(x, dim=d, keepdim=k),
        "ReduceMax": lambda x, d, k: torch.amax(x, dim=d, keepdim=k),
        "ReduceMin": lambda x, d, k: torch.amin(x, dim=d, keepdim=k),
        "ReduceProd": None,
        "ReduceL2": lambda x, d, k: torch.sqrt(torch.sum(x * x, dim=d, keepdim=k)),
        "ReduceSumSquare": lambda x, d, k: torch.sum(x * x, dim=d, keepdim=k),
    }

    def __init__(self, op: str, axes: list[int] | None, keepdims: bool):
        super().__init__()
        self.op, self.axes, self.keepdims = op, axes, keepdims

    def forward(self, x):
        axes = self.axes if self.axes is not None else list(range(x.dim()))
        if self.op == "ReduceProd":
            for a in sorted(((a + x.dim()) % x.dim() for a in axes), reverse=True):
                x = torch.prod(x, dim=a, keepdim=self.keepdims)
            return x
        return self.FUNCS[self.op](x, axes, self.keepdims)


def _reduce(node: OnnxNode, graph: OnnxGraph):
    axes = node.attributes.get("axes")
    if axes is None and len(node.input_values) > 1 and node.input_values[1]:
        axes = need_const(node, graph, 1, "axes").reshape(-1).tolist()
    axes = None if axes is not None and len(axes) == 0 else axes
    if axes is None and node.attributes.get("noop_with_empty_axes", 0):
        return result(nn.Identity(), node, 0)
    return result(Reduce(node.operation_type, axes, bool(node.attributes.get("keepdims", 1))), node, 0)


for _op in Reduce.FUNCS:
    register(_op)(_reduce)


class HardSwish(Module):
    def forward(self, x):
        return F.hardswish(x)


@register("HardSwish", domain="optimize", versions=(1,))
def _hardswish_own(node: OnnxNode, graph: OnnxGraph):
    return result(HardSwish(), node, 0)


@register("HardSwish")
def _hardswish(node: OnnxNode, graph: OnnxGraph):
    return result(HardSwish(), node, 0)


# ------------------------------------------------------------------------------------------- resize


class Resize(Module):
    """Resize to a static size: F.interpolate where its sampling grid equals ONNX's, else an exact gather."""

    def __init__(self, size: list[int], mode: str, align_corners: bool | None, gathers: list | None):
        super().__init__()
        self.size, self.mode, self.align_corners, self.gathers = size, mode, align_corners, gathers

    def forward(self, x):
        if self.gathers is not None:
            for axis, idx in self.gathers:
                x = torch.index_select(x, axis, torch.tensor(idx, dtype=torch.long))
            return x
        return F.interpolate(x, size=self.size, mode=self.mode, align_corners=self.align_corners)


#: Where ONNX Resize samples output position o along an axis (input size i, output size n, scale s).
_COORDINATE = {
    "half_pixel": lambda o, i, n, s: (o + 0.5) / s - 0.5,
    "pytorch_half_pixel": lambda o, i, n, s: (o + 0.5) / s - 0.5 if n > 1 else 0.0,
    "align_corners": lambda o, i, n, s: o * (i - 1) / (n - 1) if n > 1 else 0.0,
    "asymmetric": lambda o, i, n, s: o / s,
    "half_pixel_symmetric": lambda o, i, n, s: i / 2 * (1 - n / (s * i)) + (o + 0.5) / s - 0.5,
}
_NEAREST = {
    "floor": math.floor,
    "ceil": math.ceil,
    "round_prefer_ceil": lambda x: math.floor(x + 0.5),
    "round_prefer_floor": lambda x: math.ceil(x - 0.5),
}


def _onnx_nearest_index(out: int, inp: int, scale: float, ctm: str, nearest: str) -> list[int]:
    """ONNX Resize's nearest-neighbour source index for each output position of one axis."""
    if ctm not in _COORDINATE or nearest not in _NEAREST:
        raise ConversionError(f"Resize with coordinate_transformation_mode {ctm}, nearest_mode {nearest}")
    pick, where_ = _NEAREST[nearest], _COORDINATE[ctm]
    return [min(max(pick(where_(o, inp, out, scale)), 0), inp - 1) for o in range(out)]


def _torch_nearest_index(out: int, inp: int, mode: str) -> list[int]:
    """The source index F.interpolate picks along one axis when given an output size."""
    scale = inp / out
    shift = 0.0 if mode == "nearest" else 0.5
    return [min(int(math.floor((o + shift) * scale)), inp - 1) for o in range(out)]


def _resize_target(node: OnnxNode, graph: OnnxGraph, shp: tuple[int, ...]) -> tuple[list[int], list[float]]:
    """The output size and per-axis scales, from the constant sizes or scales."""
    if len(node.input_values) == 2:  # opset 10: (X, scales)
        scales, sizes = need_const(node, graph, 1, "scales"), None
    else:
        scales = need_const(node, graph, 2, "scales") if len(node.input_values) > 2 else None
        sizes = need_const(node, graph, 3, "sizes") if len(node.input_values) > 3 else None
    if sizes is not None and sizes.size:
        out = [int(s) for s in sizes]
        return out, [o / i for o, i in zip(out, shp)]
    if scales is not None and scales.size:
        scl = [float(s) for s in scales]
        return [int(math.floor(i * s)) for i, s in zip(shp, scl)], scl
    raise ConversionError(f"{where(node)}: neither scales nor sizes")


def _nearest_resize(node: OnnxNode, shp, out, scl, ctm: str) -> Resize:
    a = node.attributes
    nearest = a.get("nearest_mode", "round_prefer_floor" if len(node.input_values) > 2 else "floor")
    idx = [_onnx_nearest_index(out[k], shp[k], scl[k], ctm, nearest) for k in range(2, len(shp))]
    for torch_mode in ("nearest", "nearest-exact"):
        if idx == [_torch_nearest_index(out[k], shp[k], torch_mode) for k in range(2, len(shp))]:
            return Resize(out[2:], torch_mode, None, None)
    return Resize(out[2:], "gather", None, [(k + 2, ix) for k, ix in enumerate(idx)])


def _interpolating_resize(node: OnnxNode, shp, out, mode: str, ctm: str) -> Resize:
    a = node.attributes
    spatial = len(shp) - 2
    torch_mode = {1: "linear", 2: "bilinear", 3: "trilinear"}.get(spatial) if mode == "linear" else None
    if mode == "cubic" and spatial == 2:
        if a.get("cubic_coeff_a", -0.75) != -0.75 or a.get("exclude_outside", 0):
            raise ConversionError(f"{where(node)}: cubic with coefficient {a.get('cubic_coeff_a')}")
        torch_mode = "bicubic"
    if torch_mode is None:
        raise ConversionError(f"{where(node)}: {mode} resize of a rank-{len(shp)} tensor")
    if ctm not in ("half_pixel", "pytorch_half_pixel", "align_corners"):
        raise ConversionError(f"{where(node)}: {mode} resize with coordinate_transformation_mode {ctm}")
    return Resize(out[2:], torch_mode, ctm == "align_corners", None)


@register("Resize")
def _resize(node: OnnxNode, graph: OnnxGraph):
    shp = static_shape(graph, node.input_values[0])
    if shp is None:
        raise ConversionError(f"{where(node)}: needs the input's static shape")
    out, scl = _resize_target(node, graph, shp)
    if out[:2] != list(shp[:2]):
        raise ConversionError(f"{where(node)}: resizing the batch or channel dimension")
    a = node.attributes
    mode = a.get("mode", "nearest")
    ctm = a.get("coordinate_transformation_mode", "half_pixel" if len(node.input_values) > 2 else "asymmetric")
    if mode == "nearest":
        return result(_nearest_resize(node, shp, out, scl, ctm), node, 0)
    return result(_interpolating_resize(node, shp, out, mode, ctm), node, 0)


# ------------------------------------------------------------------------------------------- recurrent


def _act(name: str, alpha: float | None = None, beta: float | None = None):
    name = name.lower() if isinstance(name, str) else name
    if name == "hardsigmoid":
        a, b = alpha if alpha is not None else 0.2, beta if beta is not None else 0.5
        return lambda x: torch.clamp(a * x + b, 0.0, 1.0)
    fn = {"sigmoid": torch.sigmoid, "tanh": torch.tanh, "relu": torch.relu}.get(name)
    if fn is None:
        raise ConversionError(f"recurrent activation {name}")
    return fn


class Recurrent(Module):
    """ONNX LSTM / GRU, unrolled over the static sequence length.

    Weights stay in ONNX's gate order (LSTM: i, o, f, c; GRU: z, r, h) as buffers; the input projection of
    all time steps is one matmul, each step adds the recurrent projection. Output layouts follow the op's
    `layout`: Y (seq, dirs, batch, hidden) and Y_h / Y_c (dirs, batch, hidden), or batch first."""

    def __init__(self, kind, W, R, B, directions, hidden, layout, linear_before_reset, clip, acts, outputs):
        super().__init__()
        self.outputs = outputs  # how many outputs the node declares (onnx2torch indexes a tuple only if > 1)
        self.kind, self.directions, self.hidden, self.layout = kind, directions, hidden, layout
        self.linear_before_reset, self.clip = linear_before_reset, clip
        self.gates = 4 if kind == "LSTM" else 3
        self.acts = acts  # per direction: (f, g, h) for LSTM, (f, g) for GRU
        B = np.zeros((len(directions), 2 * self.gates * hidden), np.float32) if B is None else B
        # One buffer per direction and role, not one stacked (dirs, ...) buffer indexed in forward:
        # litert-torch 0.10 converts a select from a large constant wrongly (a bidirectional LSTM with
        # hidden 512 came out 0.4 off; forward-only, reverse-only or hidden 64 were exact).
        for d in range(len(directions)):
            self._buffer(f"W{d}", W[d])  # (gates*H, in)
            self._buffer(f"R{d}", R[d])  # (gates*H, H)
            self._buffer(f"Wb{d}", B[d, : self.gates * hidden])
            for k, part in enumerate(np.split(B[d, self.gates * hidden :], self.gates)):
                self._buffer(f"Rb{d}_{k}", part)
            for k, part in enumerate(np.split(R[d], self.gates, axis=0)):
                self._buffer(f"R{d}_{k}", part)

    def _buffer(self, name: str, value: np.ndarray) -> None:
        self.register_buffer(name, torch.as_tensor(np.ascontiguousarray(value), dtype=torch.float32))

    def _clip(self, x):
        return torch.clamp(x, -self.clip, self.clip) if self.clip else x

    def _lstm_step(self, d: int, xw_t, h, c, Rb):
        acts = self.acts[d]
        g = self._clip(xw_t + F.linear(h, getattr(self, f"R{d}"), Rb))
        i, o, f, cc = torch.split(g, self.hidden, dim=-1)
        c = acts[0](f) * c + acts[0](i) * acts[1](cc)
        return acts[0](o) * acts[2](c), c

    def _gru_step(self, d: int, xw_t, h):
        acts = self.acts[d]
        xz, xr, xh = torch.split(xw_t, self.hidden, dim=-1)
        (rz_b, rr_b, rh_b), (rz_w, rr_w, rh_w) = ([getattr(self, f"{p}{d}_{k}") for k in range(3)] for p in ("Rb", "R"))
        z = acts[0](self._clip(xz + F.linear(h, rz_w, rz_b)))
        r = acts[0](self._clip(xr + F.linear(h, rr_w, rr_b)))
        if self.linear_before_reset:
            hh = acts[1](self._clip(xh + r * F.linear(h, rh_w, rh_b)))
        else:
            hh = acts[1](self._clip(xh + F.linear(r * h, rh_w, rh_b)))
        return (1 - z) * hh + z * h

    def _direction(self, d: int, x, h0, c0):
        batch, steps = x.shape[1], x.shape[0]
        xw = F.linear(x, getattr(self, f"W{d}"), getattr(self, f"Wb{d}"))  # (seq, batch, gates*H)
        h = h0[d] if h0 is not None else x.new_zeros(batch, self.hidden)
        c = c0[d] if c0 is not None else x.new_zeros(batch, self.hidden)
        Rb = torch.cat([getattr(self, f"Rb{d}_{k}") for k in range(self.gates)]) if self.kind == "LSTM" else None
        out = [None] * steps
        order = range(steps - 1, -1, -1) if self.directions[d] == "reverse" else range(steps)
        for t in order:
            if self.kind == "LSTM":
                h, c = self._lstm_step(d, xw[t], h, c, Rb)
            else:
                h = self._gru_step(d, xw[t], h)
            out[t] = h
        return torch.stack(out, 0), h, c

    def forward(self, x, h0=None, c0=None):
        if self.layout == 1:  # (batch, seq, in) -> (seq, batch, in)
            x, h0, c0 = (None if t is None else t.transpose(0, 1) for t in (x, h0, c0))
        ys, hs, cs = zip(*(self._direction(d, x, h0, c0) for d in range(len(self.directions))))
        y, yh, yc = torch.stack(ys, 1), torch.stack(hs, 0), torch.stack(cs, 0)  # y: (seq, dirs, batch, H)
        if self.layout == 1:
            y, yh, yc = y.permute(2, 0, 1, 3), yh.transpose(0, 1), yc.transpose(0, 1)
        outs = (y, yh, yc) if self.kind == "LSTM" else (y, yh)
        return outs[: self.outputs] if self.outputs > 1 else outs[0]


def _check_recurrent(node: OnnxNode, graph: OnnxGraph) -> None:
    """What the unrolled cell does not do: coupled gates, peepholes, sequences shorter than the input."""
    a = node.attributes
    if a.get("input_forget", 0):
        raise ConversionError(f"{where(node)}: input_forget=1 (coupled gates)")
    seq_lens = node.input_values[4] if len(node.input_values) > 4 else ""
    if seq_lens:
        v = const(graph, seq_lens)
        shp = static_shape(graph, node.input_values[0])
        full = shp[1 - a.get("layout", 0)] if shp else None
        if v is None or full is None or not np.all(v == full):
            raise ConversionError(f"{where(node)}: per-sequence lengths (sequence_lens) shorter than the input")
    if node.operation_type == "LSTM" and len(node.input_values) > 7 and node.input_values[7]:
        P = const(graph, node.input_values[7])
        if P is None or np.any(P):
            raise ConversionError(f"{where(node)}: peephole weights")


def _activations(node: OnnxNode, directions: int) -> list[tuple]:
    a = node.attributes
    per = 3 if node.operation_type == "LSTM" else 2
    names = a.get("activations")
    alphas, betas = list(a.get("activation_alpha", [])), list(a.get("activation_beta", []))
    default = ["Sigmoid", "Tanh", "Tanh"][:per]
    out = []
    for d in range(directions):
        ns = names[d * per : (d + 1) * per] if names else default
        ks = [d * per + k for k in range(len(ns))]
        out.append(
            tuple(
                _act(n, alphas[k] if k < len(alphas) else None, betas[k] if k < len(betas) else None)
                for n, k in zip(ns, ks)
            )
        )
    return out


def _recurrent(node: OnnxNode, graph: OnnxGraph):
    _check_recurrent(node, graph)
    a = node.attributes
    direction = a.get("direction", "forward")
    directions = ["forward", "reverse"] if direction == "bidirectional" else [direction]
    W = need_const(node, graph, 1, "input weights W")
    R = need_const(node, graph, 2, "recurrence weights R")
    B = need_const(node, graph, 3, "bias B")
    hidden = int(a.get("hidden_size", R.shape[-1]))
    acts = _activations(node, len(directions))
    module = Recurrent(
        node.operation_type, W, R, B, directions, hidden, a.get("layout", 0), a.get("linear_before_reset", 0),
        a.get("clip"), acts, len(node.output_values),
    )  # fmt: skip
    # feeds: X, initial_h (5), initial_c (6, LSTM): forward(x, h0=None, c0=None)
    extra = [
        node.input_values[i] if len(node.input_values) > i else ""
        for i in ((5, 6) if node.operation_type == "LSTM" else (5,))
    ]
    while extra and not extra[-1]:
        extra.pop()
    return OperationConverterResult(
        module, OnnxMapping(inputs=(node.input_values[0], *extra), outputs=node.output_values)
    )


register("LSTM")(_recurrent)
register("GRU")(_recurrent)


# ------------------------------------------------------------------------------------------- control flow


@register("If")
def _if(node: OnnxNode, graph: OnnxGraph):
    raise ConversionError(
        f"{where(node)} branches on a value computed at run time from the input data; only an If whose "
        "condition is constant once the input shapes and frozen inputs are fixed converts"
    )


# ------------------------------------------------------------------------------------------- binary arithmetic

_BINARY = {"Add": torch.add, "Sub": torch.sub, "Mul": torch.mul, "Div": torch.div, "Pow": torch.pow}


class BinaryConst(Module):
    """x (op) c or c (op) x with a constant c: a Python float when c is a single value (exported as the op's
    Scalar form, which litert-torch's layout pass keeps in NHWC next to convolutions; a [1]-shaped tensor
    operand is not 4-D and pins the op to NCHW behind TRANSPOSEs: 37-49 of them on the OCR models), else a
    buffer."""

    def __init__(self, op: str, value, const_first: bool):
        super().__init__()
        self.op, self.const_first = op, const_first
        self.scalar = value if isinstance(value, float) else None
        if self.scalar is None:
            self.register_buffer("const", torch.as_tensor(value))

    def forward(self, x):
        if self.scalar is None:
            c = self.const
            return _BINARY[self.op](c, x) if self.const_first else _BINARY[self.op](x, c)
        c = self.scalar
        if not self.const_first or self.op in ("Add", "Mul"):
            return _BINARY[self.op](x, c)
        if self.op == "Sub":
            return torch.neg(x) + c
        if self.op == "Div":
            return torch.reciprocal(x) * c
        return torch.pow(torch.full_like(x, c), x)  # c ** x


def _float_value(graph: OnnxGraph, name: str) -> bool:
    vi = graph.value_info.get(name)
    floats = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE)
    return vi is not None and vi.type.tensor_type.elem_type in floats


def _binary(node: OnnxNode, graph: OnnxGraph):
    if node.attributes.get("broadcast") is not None or len(node.input_values) != 2:
        return _onnx2torch_binary(node)
    x_name, c_name = node.input_values
    c, const_first = const(graph, c_name), False
    if c is None and const(graph, x_name) is not None:
        x_name, c, const_first = c_name, const(graph, x_name), True
    shp = static_shape(graph, x_name)
    if c is None or c.dtype.kind != "f" or not _float_value(graph, x_name) or shp is None or c.ndim > len(shp):
        return _onnx2torch_binary(node)
    value = float(c.reshape(-1)[0]) if c.size == 1 else c
    mapping = OnnxMapping(inputs=(x_name,), outputs=node.output_values)
    return OperationConverterResult(BinaryConst(node.operation_type, value, const_first), mapping)


def _onnx2torch_binary(node: OnnxNode):
    """onnx2torch's own module for the general case (both operands computed, integers, old broadcast)."""
    a = node.attributes
    if node.operation_type == "Pow":
        from onnx2torch.node_converters.pow import OnnxPow

        module = OnnxPow(broadcast=a.get("broadcast"), axis=a.get("axis"))
    else:
        from onnx2torch.node_converters.binary_math_operations import OnnxBinaryMathOperation

        module = OnnxBinaryMathOperation(node.operation_type, a.get("broadcast"), a.get("axis"))
    return OperationConverterResult(module, OnnxMapping(inputs=node.input_values, outputs=node.output_values))


for _op in _BINARY:
    register(_op)(_binary)


# ------------------------------------------------------------------------------------------- the converted module


class NamedIO(nn.Module):
    """The model with inputs by name (keyword arguments) and outputs by name (a dict), so litert-torch writes
    a signature with the source model's own names and an .npz keyed by them feeds every runtime alike.

    `inputs` is [(key, whole)] in the order the inner module takes them positionally; a `whole` input arrives
    with a leading axis of 1 (the sample axis of the data, whose rows are whole inputs: silero-vad's state
    [2, batch, 128]), dropped before the model sees it. `channel_last_inputs` / `channel_last_outputs` (by
    position) go through litert-torch's `to_channel_last_io`, which puts the permutes at the model's edge,
    where its layout pass cancels them against its own transposes. A `whole_outputs` output (by position),
    one whose first axis is not a batch of 1, gets a leading axis of 1, as whole inputs take it."""

    def __init__(self, inner, inputs, outputs, channel_last_inputs=(), channel_last_outputs=(), whole_outputs=()):
        super().__init__()
        self.whole_outputs = {int(k) for k in whole_outputs}  # outputs whose batch axis is not first: a leading 1
        if channel_last_inputs or channel_last_outputs:
            import litert_torch

            inner = litert_torch.to_channel_last_io(
                inner, args=list(channel_last_inputs), outputs=list(channel_last_outputs)
            )
        self.inner = inner
        self.inputs = [(str(k), bool(w)) for k, w in inputs]
        self.outputs = list(outputs)

    def train(self, mode: bool = True):
        """Set the mode where it can be set: an ExportedProgram.module() refuses train()/eval() ("Calling
        train() is not supported yet"); its graph is already in the mode it was exported in."""
        self.training = mode
        for m in self.modules():
            if m is not self:
                try:
                    m.train(mode)
                except NotImplementedError:
                    pass
        return self

    def forward(self, **feeds):
        out = self.inner(*[feeds[k][0] if whole else feeds[k] for k, whole in self.inputs])
        outs = flatten_outputs(out, self.outputs)
        outs = [o[None] if k in self.whole_outputs else o for k, o in enumerate(outs)]
        return dict(zip(self.outputs, outs))


def flatten_outputs(out, names: list[str] | None = None) -> list:
    """A model's outputs as a list: a tensor, a tuple or list of tensors, or a dict (in `names` order when
    given, else its own)."""
    if isinstance(out, dict):
        return [out[n] for n in names] if names and all(n in out for n in names) else list(out.values())
    if isinstance(out, (list, tuple)):
        return list(out)
    return [out]


class Program(nn.Module):
    """An ExportedProgram's module taking its user inputs positionally, in the program's own order: its
    positional arguments first, then its keyword arguments (what a program exported with keywords takes).

    The program is unflattened (`torch.export.unflatten`) into the module tree it was exported from, so the
    converted .tflite names each tensor after the module that computed it (`enc/0/self_attn;19`); a program
    that does not unflatten runs as one flat graph module."""

    def __init__(self, ep):
        super().__init__()
        try:
            self.m = torch.export.unflatten(ep)
        except Exception:  # noqa: BLE001 - unflatten refuses some programs; the flat module computes the same
            self.m = ep.module()
        spec = ep.call_spec.in_spec
        children = spec.children() if spec is not None else []
        args, kwargs = children if len(children) == 2 else (None, None)
        self.n_args = args.num_children if args is not None else None
        self.keywords = list(kwargs.context) if kwargs is not None and kwargs.context else []

    def train(self, mode: bool = True):
        self.training = mode  # the program is in the mode it was exported in
        return self

    def forward(self, *xs):
        if self.n_args is None:
            return self.m(*xs)
        return self.m(*xs[: self.n_args], **dict(zip(self.keywords, xs[self.n_args :])))


# converters of the dense layers (MatMul by a constant, our fused Linear, Gelu) and of detector heads' selection
# (TopK, ArgMax/ArgMin, GatherElements): registered on import
from optimize.convert import onnx_dense, onnx_select  # noqa: E402, F401

"""Hexagon delegate: IsNodeSupportedByHexagon per node, then up to 4 partitions of at least 2 nodes.

Global checks first (every tensor rank <= 4; op version allowlist), then the op's exact input count and
input types (`InputsWithCorrectTypes` compares node->inputs->size with the list length exactly), then its
option checks. In practice only 8-bit quantized models pass: no float op has a matching type list.
"""

from __future__ import annotations

from ..vocab import Scheme
from .graph import NodeView
from .rules import Policy
from .target import TargetParams

SOURCE = "tflite/delegates/hexagon/utils.cc (IsNodeSupportedByHexagon), hexagon_delegate.cc @ LiteRT f67457790c9c"
NAME = "hexagon"

B8 = frozenset({"uint8", "int8"})
I32 = frozenset({"int32"})
I8 = frozenset({"int8"})
RELU_OR_NONE = frozenset({"NONE", "RELU", "RELU6", "RELU_N1_TO_1"})

_V2 = {
    "ADD",
    "ARG_MAX",
    "ARG_MIN",
    "AVERAGE_POOL_2D",
    "CONCATENATION",
    "L2_NORMALIZATION",
    "LOGISTIC",
    "MAXIMUM",
    "MAX_POOL_2D",
    "MEAN",
    "MINIMUM",
    "MIRROR_PAD",
    "MUL",
    "PACK",
    "PAD",
    "QUANTIZE",
    "RELU6",
    "SLICE",
    "SOFTMAX",
    "SPACE_TO_DEPTH",
    "DEPTH_TO_SPACE",
    "SPLIT",
    "STRIDED_SLICE",
    "SUB",
    "TANH",
    "TRANSPOSE",
}
_EXACT2 = {"SQUARED_DIFFERENCE", "RELU", "RSQRT"}
_V3 = {"CONV_2D", "DEPTHWISE_CONV_2D", "RESIZE_BILINEAR", "RESIZE_NEAREST_NEIGHBOR", "TRANSPOSE_CONV"}


def policy(target: TargetParams) -> Policy:
    mp = 4 if target.hexagon_max_partitions is None else min(target.hexagon_max_partitions, 16)
    mn = 2 if target.hexagon_min_nodes is None else target.hexagon_min_nodes
    return Policy(
        max_partitions=mp if mp > 0 else None,
        min_nodes=mn,
        fp16_helper=False,
        allows_dynamic=False,
        params={"max_partitions": mp, "min_nodes": mn},
    )


def _version_ok(name: str, v: int) -> str | None:
    if name in _V2:
        return None if v <= 2 else f"Op version {v} is not supported (Hexagon takes {name} up to version 2)."
    if name in _EXACT2:
        return None if v == 2 else f"Op version {v} is not supported (Hexagon takes {name} at version 2 only, int8)."
    if name in _V3:
        return None if v <= 3 else f"Op version {v} is not supported (Hexagon takes {name} up to version 3)."
    if name == "FULLY_CONNECTED":
        return None if v <= 4 else f"Op version {v} is not supported (Hexagon takes {name} up to version 4)."
    return None if v == 1 else f"Op version {v} is not supported (Hexagon takes {name} at version 1 only)."


def _types(node: NodeView, *per_input) -> str | None:
    """InputsWithCorrectTypes: exact input count; each present input's type in its set (None: any/absent)."""
    if len(node.op.inputs) != len(per_input):
        return f"Expected exactly {len(per_input)} input(s), got {len(node.op.inputs)}."
    for i, allowed in enumerate(per_input):
        t = node.input(i)
        if t is None or allowed is None:
            continue
        if t.dtype not in allowed:
            return f"Input {i} type {t.dtype} is not supported (needs {'/'.join(sorted(allowed))})."
    return None


def _act(node: NodeView, allowed=RELU_OR_NONE) -> str | None:
    a = node.opts.get("fused_activation_function", "NONE")
    return None if a in allowed else f"Unsupported fused activation {a}."


def _const(node: NodeView, i: int, what: str) -> str | None:
    t = node.input(i)
    return None if t is not None and t.is_const else f"The {what} must be constant."


def _stride_le3(node: NodeView) -> str | None:
    o = node.opts
    return None if o.get("stride_w", 1) <= 3 and o.get("stride_h", 1) <= 3 else "Strides above 3 are not supported."


def _conv(node: NodeView) -> str | None:
    r = _types(node, B8, B8, I32) or _act(node) or _stride_le3(node)
    if r:
        return r
    o = node.opts
    if o.get("dilation_w_factor", 1) != 1 or o.get("dilation_h_factor", 1) != 1:
        return "Dilated convolution is not supported."
    return None


def _dwconv(node: NodeView) -> str | None:
    r = _types(node, B8, B8, I32) or _act(node) or _stride_le3(node)
    if r:
        return r
    o = node.opts
    dilated = o.get("dilation_w_factor", 1) != 1 or o.get("dilation_h_factor", 1) != 1
    if dilated and (o.get("stride_w", 1) != 1 or o.get("stride_h", 1) != 1):
        return "Dilated depthwise convolution needs stride 1."
    x, w = node.input(0), node.input(1)
    if o.get("depth_multiplier", 1) != 1 and (dilated or x is None or x.rank != 4 or x.shape[3] != 1):
        return "depth_multiplier != 1 is supported only for an undilated single-channel input."
    if w is not None and w.rank == 4 and w.shape[1] < 2:
        return "Filter height must be at least 2."
    return None


def _fc(node: NodeView) -> str | None:
    r = _types(node, B8, B8, I32)
    if r:
        return r
    w, b, o = node.input(1), node.input(2), node.opts
    if w is not None and w.quant is not None and (w.quant.per_channel or w.quant.blockwise):
        return "Per-channel or blockwise quantized weights are not supported."
    if b is not None and not b.is_const:
        return "The bias must be constant."
    if o.get("keep_num_dims"):
        return "keep_num_dims is not supported."
    if o.get("weights_format", "DEFAULT") != "DEFAULT":
        return "Only the default weights format is supported."
    return _act(node)


def _all_b8(node: NodeView) -> str | None:
    if not node.op.inputs or not node.op.outputs:
        return "Expected at least 1 input and 1 output."
    for i, t in enumerate(node.inputs):
        if t is not None and t.dtype not in B8:
            return f"Input {i} type {t.dtype} is not supported (needs int8/uint8)."
    return None


def _max_pool(node: NodeView) -> str | None:
    r = _types(node, B8) or _act(node, frozenset({"NONE"}))
    if r:
        return r
    o = node.opts
    if o.get("padding") == "SAME" and (o.get("filter_height", 1) >= 13 or o.get("filter_width", 1) >= 13):
        return "SAME-padded max pooling with a window of 13 or more is not supported."
    return None


def _resize_bilinear(node: NodeView) -> str | None:
    r = _types(node, B8, I32) or _const(node, 1, "size (input 1)")
    if r:
        return r
    return None if node.input(1).numel == 2 else "The size must have 2 elements."


def _quantize(node: NodeView) -> str | None:
    r = _types(node, B8)
    if r:
        return "QUANTIZE takes an 8-bit input only (requantize); a float input is not supported."
    return None


def _transpose_conv(node: NodeView) -> str | None:
    n = len(node.op.inputs)
    r = _types(node, I32, B8, B8) if n == 3 else _types(node, I32, B8, B8, I32)
    if r:
        return r
    if node.opts.get("padding") not in ("SAME", "VALID"):
        return "Padding must be SAME or VALID."
    return _stride_le3(node)


def _reshape(node: NodeView) -> str | None:
    if len(node.op.inputs) > 2:
        return "RESHAPE takes at most 2 inputs."
    t = node.input(0)
    return None if t is not None and t.dtype in B8 else "Input 0 must be int8/uint8."


def _strided_slice(node: NodeView) -> str | None:
    r = _types(node, B8, I32, I32, I32)
    if r:
        return r
    for i, what in ((1, "begin"), (2, "end"), (3, "strides")):
        r = _const(node, i, what)
        if r:
            return r
    o = node.opts
    if o.get("ellipsis_mask", 0) or o.get("new_axis_mask", 0):
        return "ellipsis_mask and new_axis_mask must be 0."
    return None


OPS = {
    **{op: lambda n: _types(n, B8, B8) or _act(n) for op in ("ADD", "SUB", "MUL")},
    "SUM": lambda n: "SUM is not supported by the Hexagon delegate.",
    "MEAN": lambda n: _types(n, B8, I32) or _const(n, 1, "axis (input 1)"),
    "MIRROR_PAD": lambda n: (
        _types(n, B8, I32)
        or _const(n, 1, "paddings (input 1)")
        or (None if n.opts.get("mode") in ("REFLECT", "SYMMETRIC") else "Unknown mirror pad mode.")
    ),
    "PAD": lambda n: _types(n, B8, I32) or _const(n, 1, "paddings (input 1)"),
    "FULLY_CONNECTED": _fc,
    "CONCATENATION": _all_b8,
    "PACK": _all_b8,
    "MAX_POOL_2D": _max_pool,
    "AVERAGE_POOL_2D": lambda n: _types(n, B8) or _act(n, frozenset({"NONE"})),
    "TRANSPOSE_CONV": _transpose_conv,
    "CONV_2D": _conv,
    "DEPTHWISE_CONV_2D": _dwconv,
    "RESHAPE": _reshape,
    **{
        op: lambda n: _types(n, B8)
        for op in (
            "SOFTMAX",
            "HARD_SWISH",
            "RELU",
            "RELU6",
            "TANH",
            "LOGISTIC",
            "NEG",
            "SPACE_TO_DEPTH",
            "DEPTH_TO_SPACE",
        )
    },
    "RESIZE_NEAREST_NEIGHBOR": lambda n: _types(n, B8, I32) or _const(n, 1, "size (input 1)"),
    "RESIZE_BILINEAR": _resize_bilinear,
    "L2_NORMALIZATION": lambda n: _types(n, B8) or _act(n, frozenset({"NONE"})),
    "ARG_MAX": lambda n: _types(n, B8, I32),
    "ARG_MIN": lambda n: _types(n, B8, I32),
    "SPLIT": lambda n: _types(n, I32, B8) or _const(n, 0, "axis (input 0)"),
    "TRANSPOSE": lambda n: _types(n, B8, I32),
    "QUANTIZE": _quantize,
    "MINIMUM": lambda n: _types(n, B8, B8),
    "MAXIMUM": lambda n: _types(n, B8, B8),
    "SLICE": lambda n: (
        _types(n, B8, {"int32", "int64"}, {"int32", "int64"})
        or _const(n, 1, "begin (input 1)")
        or _const(n, 2, "size (input 2)")
    ),
    "STRIDED_SLICE": _strided_slice,
    "SQUARED_DIFFERENCE": lambda n: _types(n, I8, I8),
    "RSQRT": lambda n: _types(n, I8),
}


def check(node: NodeView, target: TargetParams) -> str | None:
    for t in node.inputs + node.outputs:
        if t is not None and t.rank > 4:
            return f"Tensor {t.name or t.index} has rank {t.rank}; Hexagon supports at most 4."
    fn = OPS.get(node.name)
    if fn is None:
        extra = f" (custom op '{node.op.custom_code}')" if node.name == "CUSTOM" else ""
        return f"Operation is not supported by the Hexagon delegate{extra}."
    return _version_ok(node.name, node.version) or fn(node)


def hints(reasons: dict, target: TargetParams, scheme: str) -> list[str]:
    if not reasons:
        return []
    if scheme in (Scheme.FLOAT32, Scheme.FLOAT16, Scheme.DYNAMIC):
        return ["Hexagon needs 8-bit: use int8 (full integer quantization)."]
    if scheme == "int16x8":
        return ["Hexagon does not take int16 activations (int16x8): use int8."]
    return []

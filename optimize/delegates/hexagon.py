"""Hexagon delegate: IsNodeSupportedByHexagon per node, then up to 4 partitions of at least 2 nodes.

Global checks first (every tensor rank <= 4; op version allowlist), then the op's exact input count and
input types (`InputsWithCorrectTypes` compares node->inputs->size with the list length exactly), then its
option checks. In practice only 8-bit quantized models pass: no float op has a matching type list.
docs/delegate-rules-audit.md maps every function here to its lines in hexagon/utils.cc.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from optimize.core.vocab import Delegate, Scheme
from optimize.delegates.graph import NodeView
from optimize.delegates.rules import Boundary, Finding, ModuleRules, Policy, Reason, Verdict, reject
from optimize.delegates.target import TargetParams

SOURCE = "tflite/delegates/hexagon/utils.cc (IsNodeSupportedByHexagon), hexagon_delegate.cc @ LiteRT f67457790c9c"

B8 = frozenset({"uint8", "int8"})
I32 = frozenset({"int32"})
I8 = frozenset({"int8"})
RELU_OR_NONE = frozenset({"NONE", "RELU", "RELU6", "RELU_N1_TO_1"})
NONE_ONLY = frozenset({"NONE"})

# hexagon_delegate.cc:32-34
MAX_GRAPHS, MAX_MAX_GRAPHS, MIN_NODES = 4, 16, 2

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
    """hexagon_delegate.cc:41-52: max <= 0 -> 4, above 16 -> 16; min nodes <= 0 -> 2."""
    mp = target.hexagon_max_partitions
    mp = MAX_GRAPHS if mp is None or mp <= 0 else min(mp, MAX_MAX_GRAPHS)
    mn = target.hexagon_min_nodes
    mn = MIN_NODES if mn is None or mn <= 0 else mn
    return Policy(
        max_partitions=mp,
        min_nodes=mn,
        fp16_helper=False,
        allows_dynamic=False,
        params={"max_partitions": mp, "min_nodes": mn},
    )


def _version(name: str, v: int) -> Verdict | None:
    """CheckOpVersion."""
    if name in _V2:
        cap, exact = 2, False
    elif name in _EXACT2:
        cap, exact = 2, True
    elif name in _V3:
        cap, exact = 3, False
    elif name == "FULLY_CONNECTED":
        cap, exact = 4, False
    else:
        cap, exact = 1, True
    if (v == cap) if exact else (v <= cap):
        return None
    how = "at version" if exact else "up to version"
    return reject(Reason.OP_VERSION, f"Op version {v} is not supported (Hexagon takes {name} {how} {cap}).", limit=cap)


def _types(node: NodeView, *per_input) -> Verdict | None:
    """InputsWithCorrectTypes: exact input count; each present input's type in its set (None: any/absent)."""
    if len(node.op.inputs) != len(per_input):
        return reject(Reason.ARITY, f"Expected exactly {len(per_input)} input(s), got {len(node.op.inputs)}.")
    for i, allowed in enumerate(per_input):
        t = node.input(i)
        if t is None or allowed is None or t.dtype in allowed:
            continue
        return reject(
            Reason.TENSOR_TYPE, f"Input {i} type {t.dtype} is not supported (needs {'/'.join(sorted(allowed))})."
        )
    return None


def _act(node: NodeView, allowed=RELU_OR_NONE) -> Verdict | None:
    a = node.opts.get("fused_activation_function", "NONE")
    return None if a in allowed else reject(Reason.ACTIVATION, f"Unsupported fused activation {a}.")


def _const(node: NodeView, i: int, what: str) -> Verdict | None:
    t = node.input(i)
    return None if t is not None and t.is_const else reject(Reason.CONSTANT, f"The {what} must be constant.")


def _stride_le3(node: NodeView) -> Verdict | None:
    o = node.opts
    if o.get("stride_w", 1) <= 3 and o.get("stride_h", 1) <= 3:
        return None
    return reject(Reason.OPTION, "Strides above 3 are not supported.")


def _dilated(node: NodeView) -> bool:
    o = node.opts
    return o.get("dilation_w_factor", 1) != 1 or o.get("dilation_h_factor", 1) != 1


def _elementwise(node: NodeView) -> Verdict | None:
    """ADD, MUL, SUB: two 8-bit inputs, ReLU-or-none."""
    return _types(node, B8, B8) or _act(node)


def _sum(node: NodeView) -> Verdict | None:
    return reject(Reason.UNSUPPORTED_OP, "SUM is not supported by the Hexagon delegate.")


def _mean(node: NodeView) -> Verdict | None:
    return _types(node, B8, I32) or _const(node, 1, "axis (input 1)")


def _mirror_pad(node: NodeView) -> Verdict | None:
    r = _types(node, B8, I32) or _const(node, 1, "paddings (input 1)")
    if r:
        return r
    return (
        None if node.opts.get("mode") in ("REFLECT", "SYMMETRIC") else reject(Reason.OPTION, "Unknown mirror pad mode.")
    )


def _pad(node: NodeView) -> Verdict | None:
    return _types(node, B8, I32) or _const(node, 1, "paddings (input 1)")


def _conv(node: NodeView) -> Verdict | None:
    r = _types(node, B8, B8, I32) or _act(node) or _stride_le3(node)
    if r:
        return r
    return reject(Reason.OPTION, "Dilated convolution is not supported.") if _dilated(node) else None


def _dwconv_shape(node: NodeView, dilated: bool) -> Verdict | None:
    x, w = node.input(0), node.input(1)
    if node.opts.get("depth_multiplier", 1) != 1 and (dilated or x is None or x.rank != 4 or x.shape[3] != 1):
        return reject(Reason.OPTION, "depth_multiplier != 1 is supported only for an undilated single-channel input.")
    if w is not None and w.rank >= 2 and w.shape[1] < 2:
        return reject(Reason.SHAPE, "Filter height must be at least 2.")
    return None


def _dwconv(node: NodeView) -> Verdict | None:
    r = _types(node, B8, B8, I32)
    if r:
        return r
    o, dilated = node.opts, _dilated(node)
    if dilated and (o.get("stride_w", 1) != 1 or o.get("stride_h", 1) != 1):
        return reject(Reason.OPTION, "Dilated depthwise convolution needs stride 1.")
    return _dwconv_shape(node, dilated) or _act(node) or _stride_le3(node)


def _fc_options(node: NodeView) -> Verdict | None:
    o = node.opts
    if o.get("keep_num_dims"):
        return reject(Reason.OPTION, "keep_num_dims is not supported.")
    if o.get("weights_format", "DEFAULT") != "DEFAULT":
        return reject(Reason.OPTION, "Only the default weights format is supported.")
    return _act(node)


def _fc(node: NodeView) -> Verdict | None:
    r = _types(node, B8, B8, frozenset({"int32"}))
    if r:
        return r
    w, b = node.input(1), node.input(2)
    if w is not None and w.quant is not None and (w.quant.per_channel or w.quant.blockwise):
        return reject(Reason.PER_CHANNEL, "Per-channel or blockwise quantized weights are not supported.")
    if b is not None and not b.is_const:
        return reject(Reason.CONSTANT, "The bias must be constant.")
    return _fc_options(node)


def _all_b8(node: NodeView) -> Verdict | None:
    """CONCATENATION, PACK: at least one input and output, every input 8-bit."""
    if not node.op.inputs or not node.op.outputs:
        return reject(Reason.ARITY, "Expected at least 1 input and 1 output.")
    for i, t in enumerate(node.inputs):
        if t is not None and t.dtype not in B8:
            return reject(Reason.TENSOR_TYPE, f"Input {i} type {t.dtype} is not supported (needs int8/uint8).")
    return None


def _max_pool(node: NodeView) -> Verdict | None:
    r = _types(node, B8)
    if r:
        return r
    o = node.opts
    if o.get("padding") == "SAME" and (o.get("filter_height", 1) >= 13 or o.get("filter_width", 1) >= 13):
        return reject(Reason.OPTION, "SAME-padded max pooling with a window of 13 or more is not supported.")
    return _act(node, NONE_ONLY)


def _avg_pool(node: NodeView) -> Verdict | None:
    return _types(node, B8) or _act(node, NONE_ONLY)


def _resize_bilinear(node: NodeView) -> Verdict | None:
    r = _types(node, B8, I32) or _const(node, 1, "size (input 1)")
    if r:
        return r
    return None if node.input(1).numel == 2 else reject(Reason.SHAPE, "The size must have 2 elements.")


def _resize_nearest(node: NodeView) -> Verdict | None:
    return _types(node, B8, I32) or _const(node, 1, "size (input 1)")


def _quantize(node: NodeView) -> Verdict | None:
    if _types(node, B8):
        return reject(
            Reason.TENSOR_TYPE, "QUANTIZE takes an 8-bit input only (requantize); a float input is not supported."
        )
    return None


def _transpose_conv(node: NodeView) -> Verdict | None:
    n = len(node.op.inputs)
    if n not in (3, 4):
        return reject(Reason.ARITY, f"Expected 3 or 4 inputs, got {n}.")
    r = _types(node, I32, B8, B8) if n == 3 else _types(node, I32, B8, B8, I32)
    if r:
        return r
    if node.opts.get("padding") not in ("SAME", "VALID"):
        return reject(Reason.OPTION, "Padding must be SAME or VALID.")
    return _stride_le3(node)


def _reshape(node: NodeView) -> Verdict | None:
    if len(node.op.inputs) > 2:
        return reject(Reason.ARITY, "RESHAPE takes at most 2 inputs.")
    t = node.input(0)
    return None if t is not None and t.dtype in B8 else reject(Reason.TENSOR_TYPE, "Input 0 must be int8/uint8.")


def _strided_slice(node: NodeView) -> Verdict | None:
    r = _types(node, B8, I32, I32, I32)
    for i, what in ((1, "begin"), (2, "end"), (3, "strides")):
        r = r or _const(node, i, what)
    if r:
        return r
    o = node.opts
    if o.get("ellipsis_mask", 0) or o.get("new_axis_mask", 0):
        return reject(Reason.OPTION, "ellipsis_mask and new_axis_mask must be 0.")
    return None


def _one_b8(node: NodeView) -> Verdict | None:
    """SOFTMAX, HARD_SWISH, RELU, RELU6, TANH, LOGISTIC, NEG, SPACE_TO_DEPTH, DEPTH_TO_SPACE."""
    return _types(node, B8)


def _l2_norm(node: NodeView) -> Verdict | None:
    return _types(node, B8) or _act(node, NONE_ONLY)


def _b8_i32(node: NodeView) -> Verdict | None:
    """ARG_MAX, ARG_MIN, TRANSPOSE: an 8-bit input and an int32 one."""
    return _types(node, B8, I32)


def _split(node: NodeView) -> Verdict | None:
    return _types(node, I32, B8) or _const(node, 0, "axis (input 0)")


def _two_b8(node: NodeView) -> Verdict | None:
    """MINIMUM, MAXIMUM."""
    return _types(node, B8, B8)


_I32_I64 = frozenset({"int32", "int64"})


def _slice(node: NodeView) -> Verdict | None:
    r = _const(node, 1, "begin (input 1)") or _const(node, 2, "size (input 2)")
    return r or _types(node, B8, _I32_I64, _I32_I64)


def _squared_difference(node: NodeView) -> Verdict | None:
    return _types(node, I8, I8)


def _rsqrt(node: NodeView) -> Verdict | None:
    return _types(node, I8)


OPS: dict[str, Callable[[NodeView], Verdict | None]] = {
    **{op: _elementwise for op in ("ADD", "SUB", "MUL")},
    "SUM": _sum,
    "MEAN": _mean,
    "MIRROR_PAD": _mirror_pad,
    "PAD": _pad,
    "FULLY_CONNECTED": _fc,
    "CONCATENATION": _all_b8,
    "PACK": _all_b8,
    "MAX_POOL_2D": _max_pool,
    "AVERAGE_POOL_2D": _avg_pool,
    "TRANSPOSE_CONV": _transpose_conv,
    "CONV_2D": _conv,
    "DEPTHWISE_CONV_2D": _dwconv,
    "RESHAPE": _reshape,
    **{
        op: _one_b8
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
    "RESIZE_NEAREST_NEIGHBOR": _resize_nearest,
    "RESIZE_BILINEAR": _resize_bilinear,
    "L2_NORMALIZATION": _l2_norm,
    "ARG_MAX": _b8_i32,
    "ARG_MIN": _b8_i32,
    "SPLIT": _split,
    "TRANSPOSE": _b8_i32,
    "QUANTIZE": _quantize,
    "MINIMUM": _two_b8,
    "MAXIMUM": _two_b8,
    "SLICE": _slice,
    "STRIDED_SLICE": _strided_slice,
    "SQUARED_DIFFERENCE": _squared_difference,
    "RSQRT": _rsqrt,
}


def _rank_le4(node: NodeView) -> Verdict | None:
    for t in node.inputs + node.outputs:
        if t is not None and t.rank > 4:
            return reject(
                Reason.TENSOR_RANK, f"Tensor {t.name or t.index} has rank {t.rank}; Hexagon supports at most 4.", 4
            )
    return None


def check(node: NodeView, target: TargetParams) -> Verdict | None:
    r = _rank_le4(node)
    if r:
        return r
    fn = OPS.get(node.name)
    if fn is None:
        extra = f" (custom op '{node.op.custom_code}')" if node.name == "CUSTOM" else ""
        return reject(Reason.UNSUPPORTED_OP, f"Operation is not supported by the Hexagon delegate{extra}.")
    return _version(node.name, node.version) or fn(node)


# ---- build time (PopulateSubGraph per node, in HexagonDelegateKernel::BuildGraph) -------------------------

# Inputs IsNodeSupportedByHexagon checks by type only, which the op builder then reads as constant data.
_BUILD_CONST = {
    "CONV_2D": (1, "Weights tensor doesn't have correct allocation type"),
    "DEPTHWISE_CONV_2D": (1, "Weights tensor doesn't have correct allocation type"),
    "ARG_MAX": (1, "Axis tensor doesn't have correct allocation type"),
    "ARG_MIN": (1, "Axis tensor doesn't have correct allocation type"),
}


def build_failure(node: NodeView, target: TargetParams, boundary: Boundary | None = None) -> Verdict | None:
    """A convolution's weights or an ARG_MAX/ARG_MIN axis that is not a constant: accepted by type, then the
    builder fails, and with it the whole Hexagon graph."""
    want = _BUILD_CONST.get(node.name)
    if want is None:
        return None
    x = node.input(want[0])
    if x is not None and not x.is_const:
        return reject(Reason.CONSTANT, f"{node.name}: {want[1]}: {x.name or x.index} (not a constant).")
    return None


def hints(findings: Sequence[Finding], target: TargetParams, scheme: str) -> list[str]:
    if not findings:
        return []
    if scheme in (Scheme.FLOAT32, Scheme.FLOAT16, Scheme.DYNAMIC):
        return ["Hexagon needs 8-bit: use int8 (full integer quantization)."]
    if scheme == Scheme.INT16X8:
        return ["Hexagon does not take int16 activations (int16x8): use int8."]
    if any(f.verdict.code is Reason.PER_CHANNEL for f in findings):
        return ['Hexagon: quantize FULLY_CONNECTED weights per tensor (LiteRT Quantizer granularity = "tensor").']
    return []


RULES = ModuleRules(Delegate.HEXAGON, SOURCE, policy, check, build_failure=build_failure, hints=hints)

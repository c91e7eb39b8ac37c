"""Core ML delegate: IsNodeSupportedByDelegate per node, FP16 helper, unlimited partitions of >= 2 nodes.

Global checks: op version (1, except DEPTHWISE_CONV_2D <= 2 and FULLY_CONNECTED <= 6) and the first
input must be float32 (TRANSPOSE_CONV: input 2), which filters out integer models and float16 activations.
Float16 *weights* behind DEQUANTIZE are folded into their consumers by the FP16 helper.
"""

from __future__ import annotations

from ..vocab import Scheme
from .graph import NodeView
from .rules import Policy
from .target import TargetParams

SOURCE = "tflite/delegates/coreml/coreml_delegate.mm (IsNodeSupportedByDelegate), builders/*.cc @ LiteRT f67457790c9c"
NAME = "coreml"

FLOATS = frozenset({"float32", "float16"})


def policy(target: TargetParams) -> Policy:
    mp = target.coreml_max_partitions or 0
    mn = 2 if target.coreml_min_nodes is None else target.coreml_min_nodes
    return Policy(
        max_partitions=mp if mp > 0 else None,
        min_nodes=mn,
        fp16_helper=True,
        allows_dynamic=False,
        params={"coreml_version": target.coreml_version, "max_partitions": mp, "min_nodes": mn},
    )


def _padded4(shape: tuple[int, ...]) -> tuple[int, ...]:
    return (1,) * (4 - len(shape)) + tuple(shape)


def _add_mul(node: NodeView) -> str | None:
    if not node.opts:
        return "Missing builtin options."
    a, b = node.input(0), node.input(1)
    for t in (a, b):
        if t is None or not (t.dtype == "float32" or (t.dtype == "float16" and t.is_const)):
            return "Both inputs must be float32 (or a float16 constant)."
    if a.rank > 4 or b.rank > 4:
        return "Broadcasting needs both ranks <= 4."
    sa, sb = _padded4(a.shape), _padded4(b.shape)
    if sa[0] != sb[0] and not ((a.is_const and a.numel == 1) or (b.is_const and b.numel == 1)):
        return "Batch broadcasting is supported only against a constant with 1 element."
    if sa[1:3] != sb[1:3] and sa[1:3] != (1, 1) and sb[1:3] != (1, 1):
        return "Height/width broadcasting needs one side to be 1x1."
    if sa[3] != sb[3] and sa[3] != 1 and sb[3] != 1:
        return "Channel broadcasting needs one side to be 1."
    return None


def _act_none(node: NodeView) -> str | None:
    a = node.opts.get("fused_activation_function", "NONE")
    return None if a == "NONE" else f"Fused activation {a} is not supported here."


def _concat(node: NodeView) -> str | None:
    r = _act_none(node)
    if r:
        return r
    if len(node.op.inputs) < 2:
        return "Concatenation needs at least 2 inputs."
    x, axis = node.input(0), node.opts.get("axis", 0)
    if x is not None and ((x.rank == 3 and axis in (2, -1)) or (x.rank == 4 and axis in (3, -1))):
        return None
    return "Only channel concatenation (last axis of a 3-D or 4-D tensor) is supported."


def _conv(node: NodeView) -> str | None:
    if node.opts.get("fused_activation_function") == "SIGN_BIT":
        return "Fused activation SIGN_BIT is not supported."
    w = node.input(1)
    if w is None or not w.is_const:
        return "Weights must be constant."
    if w.rank >= 3 and (w.shape[1] > 16384 or w.shape[2] > 16384):
        return "Weights dimensions above 16384 are not supported."
    if node.name == "TRANSPOSE_CONV":
        out_shape = node.input(0)
        return None if out_shape is not None and out_shape.is_const else "The output shape (input 0) must be constant."
    bias = node.input(2)
    if bias is None:
        return "A convolution without bias is not supported (the delegate checks input 2)."
    return None if bias.is_const else "The bias must be constant."


def _fc(node: NodeView) -> str | None:
    o = node.opts
    if o.get("weights_format", "DEFAULT") != "DEFAULT":
        return "Only the default weights format is supported."
    if o.get("fused_activation_function") == "SIGN_BIT":
        return "Fused activation SIGN_BIT is not supported."
    x, w, b = node.input(0), node.input(1), node.input(2)
    if x is None or x.dtype not in FLOATS:
        return "Input must be float."
    if w is None or w.dtype not in FLOATS or not w.is_const:
        return "Weights must be a float constant."
    if not x.shape or x.shape[-1] != x.numel:
        return "The input must be effectively 1-D (batch 1)."
    if b is not None and (b.dtype not in FLOATS or not b.is_const):
        return "The bias must be a float constant."
    return None


def _pad(node: NodeView) -> str | None:
    p = node.input(1)
    if p is None or not p.is_const or p.shape != (4, 2):
        return "Paddings must be a constant of shape [4,2]."
    v = p.values()
    if v is None:
        return "Paddings must be readable constants."
    v = v.reshape(4, 2)
    if v[0].any() or v[3].any():
        return "Padding on the batch or channel dimension is not supported."
    return None


def _mean(node: NodeView) -> str | None:
    if not node.opts.get("keep_dims"):
        return "MEAN needs keep_dims."
    x, axes = node.input(0), node.input(1)
    if x is None or x.rank != 4:
        return "MEAN input must be 4-D."
    v = axes.values() if axes is not None else None
    if v is None or any(int(a) % 4 not in (1, 2) for a in v):
        return "MEAN is supported over height and width only."
    return None


def _reshape(node: NodeView, target: TargetParams) -> str | None:
    if target.coreml_version >= 3:
        return "RESHAPE is delegated only with Core ML version 2 (coreml_version=3 on iOS 13+)."
    if len(node.op.inputs) == 1:
        return None if len(node.opts.get("new_shape") or ()) in (3, 4) else "New shape must be 3-D or 4-D."
    s = node.input(1)
    if s is None or not s.is_const or s.dtype != "int32" or s.rank != 1 or s.numel not in (3, 4):
        return "The shape must be a constant 1-D int32 tensor with 3 or 4 elements."
    return None


OPS = {
    "ADD": _add_mul,
    "MUL": _add_mul,
    "AVERAGE_POOL_2D": _act_none,
    "MAX_POOL_2D": _act_none,
    "CONCATENATION": _concat,
    "CONV_2D": _conv,
    "DEPTHWISE_CONV_2D": _conv,
    "TRANSPOSE_CONV": _conv,
    "FULLY_CONNECTED": _fc,
    **{op: lambda n: None for op in ("HARD_SWISH", "LOGISTIC", "RELU", "RELU_N1_TO_1", "RELU6", "TANH")},
    "MIRROR_PAD": lambda n: None if n.opts.get("mode") == "REFLECT" else "Only REFLECT mirror padding is supported.",
    "PAD": _pad,
    "PADV2": _pad,
    "MEAN": _mean,
    "RESIZE_BILINEAR": lambda n: (
        None if n.opts and n.input(1) is not None and n.input(1).is_const else "The size (input 1) must be constant."
    ),
    "SOFTMAX": lambda n: None if n.opts.get("beta", 1.0) == 1.0 else "Softmax beta must be 1.",
}
_VMAX = {"DEPTHWISE_CONV_2D": 2, "FULLY_CONNECTED": 6}


def check(node: NodeView, target: TargetParams) -> str | None:
    name = node.name
    if name != "RESHAPE" and name not in OPS:
        extra = f" (custom op '{node.op.custom_code}')" if name == "CUSTOM" else ""
        return f"Operation is not supported by the Core ML delegate{extra}."
    vmax = _VMAX.get(name, 1)
    if node.version > vmax:
        return f"Core ML delegate supports {name} up to version {vmax}; this is version {node.version}."
    first = node.input(2 if name == "TRANSPOSE_CONV" else 0)
    if first is None or first.dtype != "float32":
        return f"The first input must be float32 (got {first.dtype if first else 'none'})."
    if name == "MIRROR_PAD":
        return OPS[name](node) or _pad(node)
    if name == "RESHAPE":
        return _reshape(node, target)
    return OPS[name](node)


def hints(reasons: dict, target: TargetParams, scheme: str) -> list[str]:
    text = " ".join(r for _, _, r in reasons.values())
    out = []
    if reasons and scheme in (Scheme.INT8, Scheme.INT16X8, Scheme.DYNAMIC):
        out.append("Core ML runs float models only: use float16.")
    if "(got float16" in text:
        out.append("Core ML needs float32 activations: keep float16 for weights only (the converter's float16 scheme).")
    if "RESHAPE is delegated only" in text:
        out.append(
            "Core ML: RESHAPE splits the graph on iOS 13+ (coreml_version 3); avoid reshapes between delegated ops."
        )
    return out

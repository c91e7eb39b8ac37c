"""Core ML delegate: IsNodeSupportedByDelegate per node, FP16 helper, unlimited partitions of >= 2 nodes.

Global checks: op version (1, except DEPTHWISE_CONV_2D <= 2 and FULLY_CONNECTED <= 6) and the first
input must be float32 (TRANSPOSE_CONV: input 2), which filters out integer models and float16 activations.
Float16 *weights* behind DEQUANTIZE are folded into their consumers by the FP16 helper.
docs/delegate-rules-audit.md maps every function here to its lines in coreml_delegate.mm and builders/.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from optimize.core.vocab import Delegate, Scheme
from optimize.delegates.graph import NodeView
from optimize.delegates.rules import Boundary, Finding, ModuleRules, Policy, Reason, Verdict, reject
from optimize.delegates.target import TargetParams

SOURCE = "tflite/delegates/coreml/coreml_delegate.mm (IsNodeSupportedByDelegate), builders/*.cc @ LiteRT f67457790c9c"

FLOATS = frozenset({"float32", "float16"})
MIN_NODES = 2  # coreml_delegate.mm:34 kMinNodesPerCoreMlDelegate
MAX_KERNEL = 16384  # convolution_op_builder.cc max_kernel_size


def policy(target: TargetParams) -> Policy:
    """coreml_delegate.mm:172-177: max partitions <= 0 -> unlimited; min nodes <= 0 -> 2."""
    mp = target.coreml_max_partitions or 0
    mn = target.coreml_min_nodes
    mn = MIN_NODES if mn is None or mn <= 0 else mn
    return Policy(
        max_partitions=mp if mp > 0 else None,
        min_nodes=mn,
        fp16_helper=True,
        allows_dynamic=False,
        params={"coreml_version": target.coreml_version, "max_partitions": mp, "min_nodes": mn},
    )


def _padded4(shape: tuple[int, ...]) -> tuple[int, ...]:
    return (1,) * (4 - len(shape)) + tuple(shape)


def _binary_type_ok(t) -> bool:
    """IsBinaryOpSupportedType: float32, or a float16 constant."""
    return t is not None and (t.dtype == "float32" or (t.dtype == "float16" and t.is_const))


def _broadcastable(a, b) -> Verdict | None:
    """IsBroadcastable: both ranks <= 4, padded to [B,H,W,C]; B, (H,W) and C each broadcast in a limited way."""
    if a.rank > 4 or b.rank > 4:
        return reject(Reason.TENSOR_RANK, "Broadcasting needs both ranks <= 4.", limit=4)
    sa, sb = _padded4(a.shape), _padded4(b.shape)
    if sa[0] != sb[0] and not ((a.is_const and a.numel == 1) or (b.is_const and b.numel == 1)):
        return reject(Reason.BROADCAST, "Batch broadcasting is supported only against a constant with 1 element.")
    if sa[1:3] != sb[1:3] and sa[1:3] != (1, 1) and sb[1:3] != (1, 1):
        return reject(Reason.BROADCAST, "Height/width broadcasting needs one side to be 1x1.")
    if sa[3] != sb[3] and sa[3] != 1 and sb[3] != 1:
        return reject(Reason.BROADCAST, "Channel broadcasting needs one side to be 1.")
    return None


def _add_mul(node: NodeView, _t) -> Verdict | None:
    if not node.opts:
        return reject(Reason.OPTION, "Missing builtin options.")
    a, b = node.input(0), node.input(1)
    if not (_binary_type_ok(a) and _binary_type_ok(b)):
        return reject(Reason.TENSOR_TYPE, "Both inputs must be float32 (or a float16 constant).")
    return _broadcastable(a, b)


def _act_none(node: NodeView, _t) -> Verdict | None:
    """AVERAGE_POOL_2D, MAX_POOL_2D: no fused activation."""
    a = node.opts.get("fused_activation_function", "NONE")
    return None if a == "NONE" else reject(Reason.ACTIVATION, f"Fused activation {a} is not supported here.")


def _concat(node: NodeView, t) -> Verdict | None:
    r = _act_none(node, t)
    if r:
        return r
    if len(node.op.inputs) < 2:
        return reject(Reason.ARITY, "Concatenation needs at least 2 inputs.")
    x, axis = node.input(0), node.opts.get("axis", 0)
    if x is not None and ((x.rank == 3 and axis in (2, -1)) or (x.rank == 4 and axis in (3, -1))):
        return None
    return reject(Reason.OPTION, "Only channel concatenation (last axis of a 3-D or 4-D tensor) is supported.")


def _conv_weights(node: NodeView) -> Verdict | None:
    w = node.input(1)
    if w is None or not w.is_const:
        return reject(Reason.CONSTANT, "Weights must be constant.")
    if w.rank >= 3 and (w.shape[1] > MAX_KERNEL or w.shape[2] > MAX_KERNEL):
        return reject(Reason.SHAPE, f"Weights dimensions above {MAX_KERNEL} are not supported.")
    return None


def _conv(node: NodeView, _t) -> Verdict | None:
    """CONV_2D, DEPTHWISE_CONV_2D, TRANSPOSE_CONV (IsConvolutionOpSupported)."""
    if node.opts.get("fused_activation_function") == "SIGN_BIT":
        return reject(Reason.ACTIVATION, "Fused activation SIGN_BIT is not supported.")
    r = _conv_weights(node)
    if r:
        return r
    if node.name == "TRANSPOSE_CONV":
        out_shape = node.input(0)
        if out_shape is not None and out_shape.is_const:
            return None
        return reject(Reason.CONSTANT, "The output shape (input 0) must be constant.")
    bias = node.input(2)
    if bias is None:  # upstream reads the missing bias through a null pointer: treated as unsupported
        return reject(Reason.ARITY, "A convolution without bias is not supported (the delegate checks input 2).")
    return None if bias.is_const else reject(Reason.CONSTANT, "The bias must be constant.")


def _fc(node: NodeView, _t) -> Verdict | None:
    o = node.opts
    if o.get("weights_format", "DEFAULT") != "DEFAULT":
        return reject(Reason.OPTION, "Only the default weights format is supported.")
    x, w, b = node.input(0), node.input(1), node.input(2)
    if x is None or x.dtype not in FLOATS:
        return reject(Reason.TENSOR_TYPE, "Input must be float.")
    if w is None or w.dtype not in FLOATS or not w.is_const:
        return reject(Reason.CONSTANT, "Weights must be a float constant.")
    if not x.shape or x.shape[-1] != x.numel:
        return reject(Reason.SHAPE, "The input must be effectively 1-D (batch 1).")
    if b is not None and (b.dtype not in FLOATS or not b.is_const):
        return reject(Reason.CONSTANT, "The bias must be a float constant.")
    if o.get("fused_activation_function") == "SIGN_BIT":
        return reject(Reason.ACTIVATION, "Fused activation SIGN_BIT is not supported.")
    return None


def _pad_words(p) -> np.ndarray | None:
    """The paddings as IsPadOpSupported reads them, GetTensorData<int32_t>: the raw bytes as int32, whatever
    the tensor's type (int64 paddings give two words per value: rows 0 and 1 fill the first eight)."""
    if p.data is None or len(p.data) < 32:
        return None
    return np.frombuffer(p.data, "<i4", count=8)


def _pad(node: NodeView, _t) -> Verdict | None:
    p = node.input(1)
    if p is None or not p.is_const:
        return reject(Reason.CONSTANT, "Only constant padding is supported.")
    if p.shape != (4, 2):
        return reject(Reason.TENSOR_RANK, "Only 4D inputs are supported for PAD (paddings [4,2]).")
    w = _pad_words(p)
    if w is None:
        return reject(Reason.CONSTANT, "Paddings must be readable constants.")
    misread = f" ({p.dtype} paddings read as int32)" if p.dtype != "int32" else ""
    if w[0] or w[1]:
        return reject(Reason.OPTION, f"Padding for batch dimension is not supported in PAD{misread}.")
    if w[6] or w[7]:
        return reject(Reason.OPTION, f"Padding for channel dimension is not supported in PAD{misread}.")
    if misread:
        return reject(
            Reason.TENSOR_TYPE,
            f"Paddings of type {p.dtype} are read as int32: the check passes on the wrong values and the layer "
            "would pad the wrong dimensions.",
            detail=p.dtype,
        )
    return None


def _mirror_pad(node: NodeView, t) -> Verdict | None:
    if node.opts.get("mode") != "REFLECT":
        return reject(Reason.OPTION, "Only REFLECT mode is supported for MIRROR_PAD.")
    return _pad(node, t)


def _mean(node: NodeView, _t) -> Verdict | None:
    if not node.opts.get("keep_dims"):
        return reject(Reason.OPTION, "keep_dims should be true for Mean op.")
    x, axes = node.input(0), node.input(1)
    if x is None or x.rank != 4:
        return reject(Reason.TENSOR_RANK, "Mean op is only supported for 4D input.")
    v = axes.values() if axes is not None else None
    if v is None or any(int(a) % 4 not in (1, 2) for a in v):
        return reject(Reason.OPTION, "Mean op should reduce for H and W dimensions.")
    return None


def _reshape(node: NodeView, target: TargetParams) -> Verdict | None:
    if target.coreml_version >= 3:
        return reject(
            Reason.FEATURE_LEVEL, "RESHAPE is delegated only with Core ML version 2 (coreml_version=3 on iOS 13+).", 2
        )
    if len(node.op.inputs) == 1:
        if len(node.opts.get("new_shape") or ()) in (3, 4):
            return None
        return reject(Reason.TENSOR_RANK, "New shape must be 3-D or 4-D.")
    s = node.input(1)
    if s is None or not s.is_const:
        return reject(Reason.CONSTANT, "Reshape has non-const shape.")
    if s.dtype != "int32" or s.rank != 1 or s.numel not in (3, 4):
        return reject(Reason.SHAPE, "The shape must be a 1-D int32 tensor with 3 or 4 elements.")
    return None


def _resize_bilinear(node: NodeView, _t) -> Verdict | None:
    if not node.opts:
        return reject(Reason.OPTION, "Missing builtin options.")
    size = node.input(1)
    if size is not None and size.is_const:
        return None
    return reject(Reason.CONSTANT, "Output size of ResizeBilinear should be constant.")


def _softmax(node: NodeView, _t) -> Verdict | None:
    return None if node.opts.get("beta", 1.0) == 1.0 else reject(Reason.OPTION, "Softmax beta must be 1.")


def _always(node: NodeView, _t) -> Verdict | None:
    """HARD_SWISH, LOGISTIC, RELU, RELU_N1_TO_1, RELU6, TANH: supported once the global checks pass."""
    return None


OPS: dict[str, Callable[[NodeView, TargetParams], Verdict | None]] = {
    "ADD": _add_mul,
    "MUL": _add_mul,
    "AVERAGE_POOL_2D": _act_none,
    "MAX_POOL_2D": _act_none,
    "CONCATENATION": _concat,
    "CONV_2D": _conv,
    "DEPTHWISE_CONV_2D": _conv,
    "TRANSPOSE_CONV": _conv,
    "FULLY_CONNECTED": _fc,
    **{op: _always for op in ("HARD_SWISH", "LOGISTIC", "RELU", "RELU_N1_TO_1", "RELU6", "TANH")},
    "MIRROR_PAD": _mirror_pad,
    "PAD": _pad,
    "PADV2": _pad,
    "MEAN": _mean,
    "RESHAPE": _reshape,
    "RESIZE_BILINEAR": _resize_bilinear,
    "SOFTMAX": _softmax,
}
_VMAX = {"DEPTHWISE_CONV_2D": 2, "FULLY_CONNECTED": 6}


def _global(node: NodeView) -> Verdict | None:
    """Version allowlist, then a float32 first input (TRANSPOSE_CONV: input 2)."""
    name = node.name
    vmax = _VMAX.get(name, 1)
    if node.version > vmax:
        return reject(
            Reason.OP_VERSION,
            f"Core ML delegate supports {name} up to version {vmax}; this is version {node.version}.",
            vmax,
        )
    first = node.input(2 if name == "TRANSPOSE_CONV" else 0)
    got = first.dtype if first is not None else "none"
    if got != "float32":
        return reject(Reason.TENSOR_TYPE, f"The first input must be float32 (got {got}).", detail=got)
    return None


def check(node: NodeView, target: TargetParams) -> Verdict | None:
    fn = OPS.get(node.name)
    if fn is None:
        extra = f" (custom op '{node.op.custom_code}')" if node.name == "CUSTOM" else ""
        return reject(Reason.UNSUPPORTED_OP, f"Operation is not supported by the Core ML delegate{extra}.")
    return _global(node) or fn(node, target)


def build_failure(node: NodeView, target: TargetParams, boundary: Boundary) -> Verdict | None:
    """BuildModel describes each partition output and each partition input it uses as a 4-D Core ML array
    (coreml_delegate_kernel.mm:154-166): GetDims fails above rank 4 (:32-34), and the delegate kernel with it
    (the node rules check no rank for RELU, TANH, LOGISTIC or HARD_SWISH)."""
    for x, edge, where in ((node.runtime_inputs, boundary.inputs, "input"), (node.outputs, boundary.outputs, "output")):
        for t in x:
            if t.index in edge and t.rank > 4:
                return reject(
                    Reason.TENSOR_RANK,
                    f"Partition {where} {t.name or t.index} has rank {t.rank}: the delegate kernel describes "
                    "partition inputs and outputs in at most 4 dimensions.",
                    limit=4,
                )
    return None


def hints(findings: Sequence[Finding], target: TargetParams, scheme: str) -> list[str]:
    out = []
    if findings and scheme in (Scheme.INT8, Scheme.INT16X8, Scheme.DYNAMIC):
        out.append("Core ML runs float models only: use float16.")
    if any(f.verdict.code is Reason.TENSOR_TYPE and f.verdict.detail == "float16" for f in findings):
        out.append("Core ML needs float32 activations: keep float16 for weights only (the converter's float16 scheme).")
    if any(f.verdict.code is Reason.FEATURE_LEVEL and f.op == "RESHAPE" for f in findings):
        out.append(
            "Core ML: RESHAPE splits the graph on iOS 13+ (coreml_version 3); avoid reshapes between delegated ops."
        )
    return out


RULES = ModuleRules(Delegate.COREML, SOURCE, policy, check, build_failure=build_failure, hints=hints)

"""NNAPI delegate: NNAPIDelegateKernel::Validate per node, then at most 3 partitions (no minimum size).

L is the target feature level (the Android API level, or 1000006+ for updatable NNAPI feature levels).
The prediction is an upper bound: on API >= 29 the driver is asked which operations it supports
(`getSupportedOperationsForDevices`), which is device-specific and cannot be known offline.
"""

from __future__ import annotations

from .graph import NodeView
from .rules import Policy
from .target import NNAPI_FL6, NNAPI_FL7, TargetParams

SOURCE = "tflite/delegates/nnapi/nnapi_delegate.cc (NNAPIDelegateKernel::Validate) @ LiteRT f67457790c9c (Aug 2026)"
NAME = "nnapi"

F32 = {"float32"}
Q8 = {"uint8", "int8"}
FQ8 = F32 | Q8
NNAPI_TYPES = {"float32", "float16", "uint8", "int8", "int32", "bool", "int16"}


def policy(target: TargetParams) -> Policy:
    mp = 3 if target.nnapi_max_partitions is None else target.nnapi_max_partitions
    mn = target.nnapi_min_nodes or 0
    return Policy(
        max_partitions=mp if mp > 0 else None,
        min_nodes=mn,
        fp16_helper=True,
        allows_dynamic=False,
        params={
            "android_api": target.android_api,
            "feature_level": target.nnapi_level,
            "accelerator": target.nnapi_is_accel,
            "max_partitions": mp,
            "min_nodes": mn,
        },
    )


def veto(model, target: TargetParams) -> str | None:
    if target.android_api < 27:
        return f"NNAPI needs Android 8.1 (API 27); the target is API {target.android_api}."
    return None


# ---- helpers ----------------------------------------------------------------------------------------


def _type(node: NodeView, i: int) -> str:
    t = node.input(i)
    return t.dtype if t is not None else "none"


def _in0(allowed) -> callable:
    def check(node: NodeView, L: int, accel: bool) -> str | None:
        return None if _type(node, 0) in allowed else f"Input type {_type(node, 0)} is not supported."

    return check


def _ranks_le4(node: NodeView, L, accel) -> str | None:
    for t in node.inputs:
        if t is not None and t.rank > 4:
            return "Input rank should be <= 4."
    return None


def _hybrid(node: NodeView) -> bool:
    """IsHybridOperator: float32 input with 8-bit weights (CONV_2D, FULLY_CONNECTED, LSTM family)."""
    w = 2 if node.name in ("LSTM", "UNIDIRECTIONAL_SEQUENCE_LSTM", "BIDIRECTIONAL_SEQUENCE_LSTM") else 1
    return _type(node, 0) == "float32" and _type(node, w) in Q8


def _restricted_scales(node: NodeView) -> bool:
    x, w, y = node.input(0), node.input(1), node.output(0)
    if not (x and w and y and x.quant and w.quant and y.quant):
        return True
    return float(x.quant.scales[0]) * float(w.quant.scales[0]) < float(y.quant.scales[0])


def _add_mul(node: NodeView, L, accel) -> str | None:
    t = _type(node, 0)
    if L >= 30:
        if t not in FQ8 | {"int32"}:
            return "Input should be Float, Quant8, or Int32."
        if t == "int32" and node.opts.get("fused_activation_function", "NONE") != "NONE":
            return "No activation function supported."
    elif t not in FQ8:
        return "Input should be Float or Quant8."
    return _ranks_le4(node, L, accel)


def _sub(node: NodeView, L, accel) -> str | None:
    t = _type(node, 0)
    ok = (t == "float32") or (L >= 29 and t in Q8) or (L >= 30 and t == "int32")
    if not ok:
        return f"SUB input type {t} is not supported at feature level {L}."
    if t == "int32" and node.opts.get("fused_activation_function", "NONE") != "NONE":
        return "No activation function supported."
    return _ranks_le4(node, L, accel)


def _arg(node: NodeView, L, accel) -> str | None:
    if _type(node, 0) not in {"float16", "float32", "int32", "uint8", "int8"}:
        return "Input type not supported."
    axis = node.input(1)
    if axis is not None and axis.dtype == "int64":
        v = axis.values()
        if v is None or not (-(2**31) <= int(v[0]) < 2**31):
            return "NNAPI only supports axis as int32 (or a constant int64 that fits)."
    elif axis is None or axis.dtype != "int32":
        return "Axis should be Int32."
    return None if node.opts.get("output_type", "int32") == "int32" else "NNAPI only supports int32 output."


def _avg_pool(node: NodeView, L, accel) -> str | None:
    if _type(node, 0) not in FQ8:
        return "Input should be Float or Quant8."
    o = node.opts
    if _type(node, 0) in Q8 and not accel and o.get("filter_width", 1) * o.get("filter_height", 1) > 256:
        return "Large filter window would overflow on the reference CPU path."
    return None


def _conv(node: NodeView, L, accel) -> str | None:
    if L < 29:
        if _hybrid(node):
            return "Hybrid operators not supported before NNAPI 1.2."
        if _type(node, 0) not in {"float32", "uint8"}:
            return "Input should be Float or UINT8."
        w = node.input(1)
        if w is not None and w.quant is not None and w.quant.per_channel:
            return "Per-channel quantized convolution not supported before NNAPI 1.2."
        if _type(node, 0) == "uint8" and not _restricted_scales(node):
            return "When using NN API version 1.0 or 1.1, input_scale * filter_scale < output_scale."
    if len(node.op.inputs) != 3 or node.input(2) is None:
        return "Conv2D with omitted bias not supported."
    o = node.opts
    if (o.get("dilation_w_factor", 1) != 1 or o.get("dilation_h_factor", 1) != 1) and L < 29:
        return "NNAPI supports dilated Conv2D since NNAPI 1.2."
    x, w = node.input(0), node.input(1)
    if L < 29 and x is not None and w is not None and x.rank == 4 and w.rank == 4 and x.shape[3] != w.shape[3]:
        return "Grouped convolution is not supported before NNAPI 1.2."
    return None


def _dwconv(node: NodeView, L, accel) -> str | None:
    if L < 29:
        if _type(node, 0) not in {"float32", "uint8"}:
            return "Input should be Float or UINT8."
        if _type(node, 0) == "uint8" and not _restricted_scales(node):
            return "When using NN API version 1.0 or 1.1, input_scale * filter_scale < output_scale."
        o = node.opts
        if o.get("dilation_w_factor", 1) != 1 or o.get("dilation_h_factor", 1) != 1:
            return "dilation_width_factor and dilation_height_factor expected to be equal to 1."
    return None


def _fc(node: NodeView, L, accel) -> str | None:
    y = node.output(0)
    if y is not None and y.dtype == "int16":
        return "Unsupported output of type kTfLiteInt16."
    if L < 29:
        if _hybrid(node):
            return "Hybrid operators not supported before NNAPI 1.2."
        if _type(node, 0) not in {"float32", "uint8"}:
            return "Input should be Float or UINT8."
        if _type(node, 0) == "uint8" and not _restricted_scales(node):
            return "When using NN API version 1.0 or 1.1, input_scale * filter_scale < output_scale."
    if node.opts.get("keep_num_dims") and L < 30:
        return "Android sdk version less than 30 (keep_num_dims)."
    return None


def _softmax(node: NodeView, L, accel) -> str | None:
    if _type(node, 0) not in FQ8:
        return "Input should be Float or Quant8."
    y = node.output(0)
    if y is None or y.dtype not in FQ8:
        return "Output type should be one of kTfLiteFloat32, kTfLiteUInt8, kTfLiteInt8."
    r = node.input(0).rank
    if r > 4:
        return "Input rank should be <= 4."
    if L < 29 and r not in (2, 4):
        return "Before API level 29 only 2D and 4D input tensors were supported."
    return None


def _reshape(node: NodeView, L, accel) -> str | None:
    allowed = FQ8 | ({"int32"} if L >= NNAPI_FL6 else set())
    if _type(node, 0) not in allowed:
        return "Input should be Float or Quant8."
    for t in [node.input(0), node.output(0)]:
        if t is not None and t.rank > 4:
            return "Input and output rank should be <= 4."
    if len(node.op.inputs) >= 2:
        s = node.input(1)
        if s is None or not s.is_const:
            return "The shape input tensor must be constant."
    else:
        shape = tuple(node.opts.get("new_shape") or ())
        if len(shape) == 0 or shape == (0,):
            return "New shape rank should be > 0."
    return None


def _no_align(node: NodeView, L) -> str | None:
    if L <= 29 and (node.opts.get("align_corners") or node.opts.get("half_pixel_centers")):
        return "NNAPI does not support align_corners or half_pixel_centers == true."
    return None


def _resize(node: NodeView, L, accel) -> str | None:
    x = node.input(0)
    if node.name == "RESIZE_BILINEAR" and (x is None or x.rank != 4):
        return "Input should have rank 4."
    if _type(node, 0) not in FQ8:
        return "Input should be Float or Quant8."
    if len(node.op.inputs) < 2:
        return "Expected at least 2 inputs."
    s = node.input(1)
    if s is None or not s.is_const:
        return "The size input tensor must be constant."
    if node.name == "RESIZE_BILINEAR" and L < 29:
        y = node.output(0)
        if y is not None and y.rank == 4 and y.shape[1] != y.shape[2]:
            return "Require width == height due to driver differences in NNAPI < 1.2."
        if x.dtype != "float32":
            return "NNAPI 1.0 & 1.1 only supports float input."
    return _no_align(node, L)


def _concat(node: NodeView, L, accel) -> str | None:
    if node.opts.get("fused_activation_function", "NONE") != "NONE":
        return "Activation function should be None."
    x = node.input(0)
    if x is not None and x.rank > 4:
        return "Input rank should be <= 4."
    if _type(node, 0) not in {"float16", "float32", "uint8", "int8"}:
        return "Input type not supported."
    if _type(node, 0) == "uint8" and L < 29:
        qs = [
            (float(t.quant.scales[0]), int(t.quant.zero_points[0]) if len(t.quant.zero_points) else 0)
            for t in node.inputs
            if t is not None and t.quant is not None
        ]
        if len(set(qs)) > 1:
            return "Output scale and zero point must match the inputs before NNAPI 1.2."
    return None


def _dequantize(node: NodeView, L, accel) -> str | None:
    x = node.input(0)
    if L >= 30 and x is not None and x.dtype == "float16" and not x.is_const:
        return None
    if node.version > 2:
        return "OP Version higher than 2."
    t = _type(node, 0)
    if L < 29 and t != "uint8":
        return "Input should be UINT8 before NNAPI 1.2."
    if L >= 29 and t not in Q8:
        return f"Input type {t} is not supported (DEQUANTIZE takes uint8/int8)."
    if L == 29 and t == "int8" and x.quant is not None and len(x.quant.zero_points) and any(x.quant.zero_points):
        return "NN API supports int8 type since version 1.2 but only for symmetric quantization."
    return None


def _pad(node: NodeView, L, accel) -> str | None:
    if _type(node, 0) not in FQ8:
        return "Input should be Float or Quant8."
    x = node.input(0)
    if x is not None and 0 in x.shape:
        return "NN API pad ops do not support input tensors with no elements."
    n = len(node.op.inputs)
    if n < 2:
        return "Expecting at least 2 inputs."
    if n == 3 and L < 29:
        return "Specification of the padding value is supported from NNAPI 1.2."
    if n == 2 and L < 29 and _type(node, 0) != "float32":
        return "Only float32 PAD is supported before NNAPI 1.2."
    return None


def _mirror_pad(node: NodeView, L, accel) -> str | None:
    if _type(node, 0) not in FQ8 | {"int32"}:
        return "Input type not supported."
    x = node.input(0)
    if x is not None and 0 in x.shape:
        return "NN API pad ops do not support input tensors with no elements."
    return None if len(node.op.inputs) == 2 else "Expecting 2 inputs."


def _b2s(node: NodeView, L, accel) -> str | None:
    crops = node.input(2)
    v = crops.values() if crops is not None else None
    if v is None or crops.dtype != "int32" or v.size != 4 or v.any():
        return "All crops should be 0."
    return None


def _const(i: int, what: str):
    def check(node: NodeView, L, accel) -> str | None:
        t = node.input(i)
        return None if t is not None and t.is_const else f"{what} must be constant."

    return check


def _maxmin(node: NodeView, L, accel) -> str | None:
    if _type(node, 0) not in FQ8 | {"int32"}:
        return "Input type not supported."
    for t in node.inputs[:2]:
        if t is not None and t.rank == 0 and not t.is_const:
            return "Scalar operands must be constant."
    return None


def _cast(node: NodeView, L, accel) -> str | None:
    allowed = {"float32", "int32", "uint8"} | ({"int8"} if L >= 30 else set())
    y = node.output(0)
    if _type(node, 0) not in allowed or y is None or y.dtype not in allowed:
        return "Input or output type not supported."
    return None


def _select(node: NodeView, L, accel) -> str | None:
    if _type(node, 1) not in {"float32", "int32", "uint8", "int8"}:
        return "Value type not supported."
    c, v = node.input(0), node.input(1)
    return (
        None
        if c is not None and v is not None and c.shape == v.shape
        else "Condition and inputs tensors should have the same shape."
    )


def _gather(node: NodeView, L, accel) -> str | None:
    if _type(node, 0) not in {"float32", "float16", "int32", "uint8", "int8"}:
        return "Input type not supported."
    p = node.input(1)
    return None if p is not None and p.dtype == "int32" and p.rank != 0 else "Positions must be int32 and not scalar."


def _axis_const_i32(i: int):
    def check(node: NodeView, L, accel) -> str | None:
        t = node.input(i)
        return None if t is not None and t.is_const and t.dtype == "int32" else "Axis must be a constant int32 tensor."

    return check


def _split(node: NodeView, L, accel) -> str | None:
    allowed = {"float32", "uint8", "int32"} | ({"int8"} if L >= 30 else set())
    return None if _type(node, 1) in allowed else "Value type not supported."


def _split_v(node: NodeView, L, accel) -> str | None:
    if _type(node, 0) not in FQ8 | {"int32"}:
        return "Input type not supported."
    sizes, axis = node.input(1), node.input(2)
    if sizes is None or not sizes.is_const or sizes.dtype != "int32" or sizes.rank != 1:
        return "size_splits must be a constant 1-D int32 tensor."
    if axis is None or not axis.is_const or axis.dtype != "int32":
        return "Axis must be a constant int32 tensor."
    v, x = sizes.values(), node.input(0)
    if v is not None:
        vals = [int(s) for s in v]
        if 0 in vals:
            return "NNAPI does not support zero split sizes."
        if -1 in vals and x is not None and axis.values() is not None:
            ax = int(axis.values()[0]) % max(x.rank, 1)
            if x.shape and x.shape[ax] - sum(s for s in vals if s != -1) == 0:
                return "NNAPI does not support zero split sizes."
    return None


def _quantize(node: NodeView, L, accel) -> str | None:
    x, y = node.input(0), node.output(0)
    if x is None or y is None:
        return "QUANTIZE needs 1 input and 1 output."
    if x.dtype not in FQ8 or (x.dtype in Q8 and (x.quant is None or x.quant.scales[0] <= 0)):
        return "Input should be Float or Quant8 with a positive scale."
    out_ok = {"uint8"} | ({"int8"} if L >= 30 else set())
    if y.dtype not in out_ok:
        return f"Output type {y.dtype} is not supported."
    if y.quant is None or y.quant.scales[0] <= 0:
        return "Output scale must be positive."
    return None


def _fill(node: NodeView, L, accel) -> str | None:
    dims, value = node.input(0), node.input(1)
    if dims is None or not dims.is_const or dims.dtype not in ("int32", "int64"):
        return "Dims must be a constant int32/int64 tensor."
    if dims.shape and dims.shape[0] == 0:
        return "Zero-rank output is not supported."
    v = dims.values()
    if dims.dtype == "int64" and v is not None and ((v >= 2**31) | (v < -(2**31))).any():
        return "int64 dims do not fit int32."
    if value is None or value.dtype not in ("float32", "int32", "int64"):
        return "Value type not supported."
    if value.dtype == "int64":
        vv = value.values()
        if vv is None or abs(int(vv[0])) >= 2**31:
            return "int64 value must be a constant that fits int32."
    return None


def _pack(node: NodeView, L, accel) -> str | None:
    x = node.input(0)
    if L >= NNAPI_FL6:
        return None if _type(node, 0) in {"int32", "float32", "int8", "uint8"} else "Input type not supported."
    if _type(node, 0) not in {"float32", "int8"}:
        return "Input type not supported."
    axis = node.opts.get("axis", 0)
    if x is not None and axis in (-1, x.rank):
        return "Packing along the last axis is not supported."
    return None


def _unpack(node: NodeView, L, accel) -> str | None:
    x = node.input(0)
    if _type(node, 0) not in FQ8:
        return "Input should be Float or Quant8."
    if x is None or not 2 <= x.rank <= 4:
        return "Input rank should be 2..4."
    axis = node.opts.get("axis", 0)
    return "Unpacking along the last axis is not supported." if axis in (-1, x.rank - 1) else None


def _sqdiff(node: NodeView, L, accel) -> str | None:
    allowed = FQ8 | {"int32"} if L >= 30 else ({"float32", "uint8"} if L == 29 else F32)
    return (None if _type(node, 0) in allowed else "Input type not supported.") or _ranks_le4(node, L, accel)


def _bmm(node: NodeView, L, accel) -> str | None:
    a, b = node.input(0), node.input(1)
    if a is None or b is None or a.dtype not in ("float32", "int32", "int8") or a.dtype != b.dtype:
        return "Inputs must be float32, int32 or int8 of the same type."
    if not 2 <= a.rank <= 4 or a.rank != b.rank or a.shape[:-2] != b.shape[:-2]:
        return "Inputs must have rank 2..4, equal ranks and equal batch dimensions (no broadcast)."
    return None


def _lstm(node: NodeView, L, accel) -> str | None:
    n = len(node.op.inputs)
    if _hybrid(node) and L < 29:
        return "Hybrid operators not supported before NNAPI 1.2."
    if n == 5:
        w = node.input(2)
        if w is None or w.dtype != "uint8":
            return "Basic LSTM weights must be uint8."
        x, y = node.input(0), node.output(0)
        for t in (x, y):
            if (
                t is None
                or t.quant is None
                or abs(float(t.quant.scales[0]) - 1 / 128) > 1e-9
                or int(t.quant.zero_points[0]) != 128
            ):
                return "Basic LSTM input/output must be quantized with scale 1/128 and zero point 128."
        cs = node.output(1)
        if (
            cs is None
            or cs.quant is None
            or not (abs(float(cs.quant.scales[0]) - 16 / 32768) < 1e-12 or int(cs.quant.zero_points[0]) == 0)
        ):
            return "Basic LSTM cell state quantization is not supported."
        if not (node.input(2).is_const and node.input(3) is not None and node.input(3).is_const):
            return "Basic LSTM weights and bias must be constant."
        return None
    if n not in (20, 24):
        return "LSTM needs 5, 20 or 24 inputs."
    if n == 24 and L < 29:
        return "Android sdk version less than 29 (24-input LSTM)."
    allowed = {"float32", "uint8"} | ({"int8"} if L >= 30 else set())
    return None if _type(node, 4) in allowed else "Weight type not supported."


def _not_hybrid(node: NodeView, L, accel) -> str | None:
    return "Hybrid operators are not supported." if _hybrid(node) else None


def _out_rank_nonzero(node: NodeView, L, accel) -> str | None:
    y = node.output(0)
    return None if y is not None and y.rank != 0 else "NNAPI does not support generating a scalar as output."


def _mean(node: NodeView, L, accel) -> str | None:
    allowed = FQ8 if L >= 29 else F32
    if _type(node, 0) not in allowed:
        return "Input type not supported."
    x = node.input(0)
    if x is not None and x.rank > 4:
        return "Input rank should be <= 4."
    return _out_rank_nonzero(node, L, accel)


def _squeeze(node: NodeView, L, accel) -> str | None:
    if L == 28 and not node.opts.get("squeeze_dims"):
        return "NNAPI 1.1 requires squeeze_dims to be specified."
    return None


def _l2norm(node: NodeView, L, accel) -> str | None:
    if node.opts.get("fused_activation_function", "NONE") != "NONE":
        return "Activation function should be None."
    x = node.input(0)
    if L < 29 and (x is None or x.dtype != "float32" or x.rank != 4):
        return "Expected float32 4-D input before NNAPI 1.2."
    return None


def _lsh(node: NodeView, L, accel) -> str | None:
    if node.opts.get("type") == "SPARSE" and (L < 29 or len(node.op.inputs) != 2):
        return "NNAPI does not support sparse projection with weights (or before NNAPI 1.2)."
    return None


def _rsqrt(node: NodeView, L, accel) -> str | None:
    allowed = F32 if L < NNAPI_FL7 else FQ8
    return None if _type(node, 0) in allowed else "Input type not supported."


def _tanh(node: NodeView, L, accel) -> str | None:
    t = _type(node, 0)
    return None if t == "float32" or (t in Q8 and L >= 29) else "Input type not supported."


def _l2pool(node: NodeView, L, accel) -> str | None:
    if L < 29 and node.opts.get("fused_activation_function", "NONE") != "NONE":
        return "Before NNAPI 1.2 fused activation for l2_pool may not be supported."
    return None


def _slice(node: NodeView, L, accel) -> str | None:
    if _type(node, 0) not in {"float32", "int32", "uint8", "int8"}:
        return "Input type not supported."
    return None if _type(node, 1) == "int32" and _type(node, 2) == "int32" else "Begin and size must be int32."


def _tile(node: NodeView, L, accel) -> str | None:
    if _type(node, 0) not in {"float32", "int8", "uint8", "int32"}:
        return "Input type not supported."
    return None if _type(node, 1) == "int32" else "Multipliers must be int32."


def _topk(node: NodeView, L, accel) -> str | None:
    if _type(node, 0) not in {"float32", "int32", "uint8", "int8"}:
        return "Input type not supported."
    k = node.input(1)
    return None if k is not None and k.is_const and k.dtype == "int32" else "K must be a constant int32 tensor."


def _densify(node: NodeView, L, accel) -> str | None:
    x = node.input(0)
    return None if x is not None and x.is_const else "Densify with a non-constant input is not supported."


def _in1_f32(node: NodeView, L, accel) -> str | None:
    return None if _type(node, 1) == "float32" else "Weights must be float32."


def _n_in(k: int):
    def check(node: NodeView, L, accel) -> str | None:
        return None if len(node.op.inputs) == k else f"Expected {k} inputs."

    return check


def _out0_f32(node: NodeView, L, accel) -> str | None:
    y = node.output(0)
    return None if y is not None and y.dtype == "float32" else "Output must be float32."


def _rank_nonzero(node: NodeView, L, accel) -> str | None:
    x = node.input(0)
    return None if x is not None and x.rank != 0 else "Input rank must not be 0."


BOOL = {"bool"}
CMP = {"float32", "uint8", "int8", "bool", "int32"}

# op -> (max version or None, min feature level, checks)
OPS: dict[str, tuple[int | None, int, tuple]] = {
    "ADD": (2, 27, (_add_mul,)),
    "SUB": (3, 28, (_sub,)),
    "DIV": (1, 28, (_in0(F32), _ranks_le4)),
    "ARG_MAX": (2, 29, (_arg,)),
    "ARG_MIN": (2, 29, (_arg,)),
    "AVERAGE_POOL_2D": (2, 27, (_avg_pool,)),
    "MAX_POOL_2D": (2, 27, (_in0(FQ8),)),
    "L2_POOL_2D": (1, 27, (_in0(F32), _l2pool)),
    "CONV_2D": (5, 27, (_conv,)),
    "DEPTHWISE_CONV_2D": (3, 27, (_dwconv,)),
    "FULLY_CONNECTED": (5, 27, (_fc,)),
    "HARD_SWISH": (None, 27, (_in0(FQ8),)),
    "SOFTMAX": (2, 27, (_softmax,)),
    "RESHAPE": (1, 27, (_reshape,)),
    "RESIZE_BILINEAR": (3, 27, (_resize,)),
    "RESIZE_NEAREST_NEIGHBOR": (3, 29, (_resize,)),
    "SQUEEZE": (1, 28, (_squeeze,)),
    "L2_NORMALIZATION": (2, 27, (_l2norm,)),
    "LOCAL_RESPONSE_NORMALIZATION": (1, 27, ()),
    "LSH_PROJECTION": (1, 27, (_lsh,)),
    "CONCATENATION": (2, 27, (_concat,)),
    "DENSIFY": (None, 30, (_densify,)),
    "FLOOR": (1, 27, ()),
    **{op: (2, 27, (_in0(FQ8),)) for op in ("RELU", "RELU_N1_TO_1", "RELU6", "LOGISTIC")},
    "TANH": (2, 27, (_tanh,)),
    "PAD": (2, 28, (_pad,)),
    "PADV2": (2, 28, (_pad,)),
    "MIRROR_PAD": (2, NNAPI_FL7, (_mirror_pad,)),
    "SPACE_TO_BATCH_ND": (2, 28, ()),
    "BATCH_TO_SPACE_ND": (2, 28, (_b2s,)),
    "STRIDED_SLICE": (2, 28, (_in0(FQ8),)),
    "TRANSPOSE": (2, 28, (_const(1, "The permutation (input 1)"),)),
    **{op: (1, 29, (_in0(F32),)) for op in ("ABS", "EXP", "LOG", "POW", "SIN", "COS", "SQRT", "LOG_SOFTMAX")},
    "RSQRT": (2, 29, (_rsqrt,)),
    "SLICE": (2, 29, (_slice,)),
    "TRANSPOSE_CONV": (4, 29, (_const(0, "The output shape (input 0)"), _const(1, "The weights (input 1)"))),
    "RNN": (1, 27, (_n_in(5), _in1_f32)),
    "SVDF": (1, 28, (_n_in(5), _in1_f32)),
    "LSTM": (3, 28, (_lstm,)),
    "UNIDIRECTIONAL_SEQUENCE_LSTM": (2, 29, (_not_hybrid,)),
    "UNIDIRECTIONAL_SEQUENCE_RNN": (1, 29, (_not_hybrid,)),
    "BIDIRECTIONAL_SEQUENCE_LSTM": (1, 29, (_not_hybrid,)),
    "MEAN": (2, 28, (_mean,)),
    "SUM": (1, 29, (_in0(F32), _out_rank_nonzero)),
    "REDUCE_PROD": (1, 29, (_in0(F32), _out_rank_nonzero)),
    "REDUCE_MAX": (2, 29, (_in0(FQ8), _rank_nonzero)),
    "REDUCE_MIN": (2, 29, (_in0(FQ8), _rank_nonzero)),
    "REDUCE_ANY": (2, 29, (_out_rank_nonzero,)),
    "EMBEDDING_LOOKUP": (1, 27, (_in1_f32,)),
    "HASHTABLE_LOOKUP": (1, 27, (_out0_f32,)),
    "MAXIMUM": (3, 29, (_maxmin,)),
    "MINIMUM": (3, 29, (_maxmin,)),
    "CAST": (1, 29, (_cast,)),
    "LEAKY_RELU": (1, 29, (_in0(FQ8),)),
    "PRELU": (1, 29, (_in0(FQ8),)),
    "TILE": (1, 29, (_tile,)),
    **{op: (1, 29, (_in0(BOOL),)) for op in ("LOGICAL_AND", "LOGICAL_OR", "LOGICAL_NOT")},
    **{op: (2, 29, (_in0(CMP),)) for op in ("EQUAL", "NOT_EQUAL", "LESS", "LESS_EQUAL", "GREATER", "GREATER_EQUAL")},
    "NEG": (2, 29, (_in0({"float32", "int32"}),)),
    "TOPK_V2": (2, 29, (_topk,)),
    "SELECT": (2, 29, (_select,)),
    "GATHER": (2, 29, (_gather,)),
    "EXPAND_DIMS": (1, 29, (_in0({"float32", "float16", "int32", "uint8", "int8"}), _axis_const_i32(1))),
    "SPLIT": (3, 29, (_split, _axis_const_i32(0))),
    "SPLIT_V": (2, 30, (_split_v,)),
    "QUANTIZE": (2, 29, (_quantize,)),
    "DEPTH_TO_SPACE": (None, 27, (_in0(FQ8),)),
    "SPACE_TO_DEPTH": (2, 27, (_in0(FQ8),)),
    "ELU": (1, 30, (_in0(F32),)),
    "FILL": (1, 30, (_fill,)),
    "PACK": (2, 30, (_pack,)),
    "UNPACK": (2, 30, (_unpack,)),
    "SQUARED_DIFFERENCE": (2, 28, (_sqdiff,)),
    "BATCH_MATMUL": (2, NNAPI_FL6, (_bmm,)),
    "REVERSE_V2": (3, NNAPI_FL7, (_in0(FQ8 | {"int32"}), _n_in(2))),
}


def check(node: NodeView, target: TargetParams) -> str | None:
    """NNAPI's Validate for one node: None when accepted, else the first failure message."""
    L, accel = target.nnapi_level, target.nnapi_is_accel
    name = node.name
    if name == "MUL":
        spec = (3 if accel else 2, 27, (_add_mul,))
    elif name == "DEQUANTIZE":
        return _dequantize(node, L, accel)
    else:
        spec = OPS.get(name)
    if spec is None:
        return (
            "Unsupported operation type."
            if name != "CUSTOM"
            else f"Unsupported operation type (custom op '{node.op.custom_code}')."
        )
    vmax, min_level, checks = spec
    if vmax is not None and node.version > vmax:
        return f"OP Version higher than {vmax}."
    if L < min_level:
        return f"Android sdk version less than {min_level}."
    for c in checks:
        r = c(node, L, accel)
        if r:
            return r
    return None


def build_failure(node: NodeView, target: TargetParams) -> str | None:
    """A runtime tensor type NNAPI cannot represent fails the whole delegation when the model is built."""
    for t in node.runtime_inputs + node.outputs:
        if t.dtype not in NNAPI_TYPES:
            return f"Failed to add NN API tensor: type {t.dtype} is not supported"
    return None


def hints(reasons: dict, target: TargetParams, scheme: str) -> list[str]:
    out: list[str] = []
    text = " ".join(r for _, _, r in reasons.values())
    if "Hybrid" in text or (scheme == "dynamic" and reasons):
        out.append(
            "NNAPI rejects dynamic-range models (float activations, int8 weights): use int8 (full integer) or float16."
        )
    if "Android sdk version less than" in text:
        out.append(
            f"NNAPI: some ops need a newer Android / NNAPI feature level than the target ({target.nnapi_level})."
        )
    if scheme == "int16x8" and reasons:
        out.append("NNAPI does not take int16 activations: use int8.")
    out.append("NNAPI: this is an upper bound; on Android 10+ the device driver may refuse more nodes.")
    return out

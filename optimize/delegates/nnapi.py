"""NNAPI delegate: NNAPIDelegateKernel::Validate per node, then at most 3 partitions (no minimum size).

L is the target feature level (the Android API level, or 1000006+ for updatable NNAPI feature levels).
The prediction is an upper bound: on API >= 29 the driver is asked which operations it supports
(`getSupportedOperationsForDevices`), which is device-specific and cannot be known offline.
docs/delegate-rules-audit.md maps every function here to its lines in nnapi_delegate.cc.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from optimize.core.vocab import Delegate, Scheme
from optimize.delegates.conflicts import NNAPI_FLOAT16
from optimize.delegates.graph import NodeView
from optimize.delegates.rules import (
    Boundary,
    Finding,
    ModuleRules,
    Policy,
    Reason,
    Rule,
    Verdict,
    build_detail,
    codes,
    constant_input,
    dtype,
    first,
    input_type_in,
    reject,
)
from optimize.delegates.target import NNAPI_FL6, NNAPI_FL7, TargetParams

SOURCE = "tflite/delegates/nnapi/nnapi_delegate.cc (NNAPIDelegateKernel::Validate) @ LiteRT f67457790c9c (Aug 2026)"

# nnapi_delegate_kernel.h:41-47
NNAPI10, NNAPI11, NNAPI12, NNAPI13 = 27, 28, 29, 30

F32 = frozenset({"float32"})
Q8 = frozenset({"uint8", "int8"})
FQ8 = F32 | Q8
FQ8I = FQ8 | {"int32"}
NNAPI_TYPES = frozenset({"float32", "float16", "uint8", "int8", "int32", "bool", "int16"})


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


def veto(model, target: TargetParams) -> Verdict | None:
    if target.android_api < NNAPI10:
        return reject(
            Reason.PLATFORM, f"NNAPI needs Android 8.1 (API 27); the target is API {target.android_api}.", limit=27
        )
    return None


# ---- helpers ----------------------------------------------------------------------------------------


def _L(t: TargetParams) -> int:
    return t.nnapi_level


def _level(need: int, what: str = "") -> Verdict:
    """ExpectMinAndroidSdkVersion's failure."""
    return reject(Reason.FEATURE_LEVEL, f"Android sdk version less than {need}{what}.", limit=need)


def _in0(allowed, what: str = "Input type") -> callable:
    return input_type_in(0, allowed, what)


def _ranks_le4(node: NodeView, _t) -> Verdict | None:
    """Input rank must be <= 4 (checked on inputs 0 and 1)."""
    for t in node.inputs[:2]:
        if t is not None and t.rank > 4:
            return reject(Reason.TENSOR_RANK, "Input rank must be <= 4.", limit=4)
    return None


def _hybrid(node: NodeView) -> bool:
    """IsHybridOperator: float32 input with 8-bit weights (CONV_2D, FULLY_CONNECTED, LSTM family, RNN)."""
    w = 2 if "LSTM" in node.name else 1
    return dtype(node, 0) == "float32" and dtype(node, w) in Q8


def _restricted_scales(node: NodeView) -> bool:
    """input_scale * filter_scale < output_scale on the legacy per-tensor scales, in float32: a per-channel,
    blockwise or unquantized tensor's scale reads as 0 (core/subgraph.cc:145-170)."""
    x, w, y = (np.float32(t.quant.legacy_scale if t is not None and t.quant else 0.0) for t in _first_io(node))
    return bool(x * w < y)


def _first_io(node: NodeView) -> tuple:
    return node.input(0), node.input(1), node.output(0)


def _no_act_int32(node: NodeView) -> Verdict | None:
    if dtype(node, 0) == "int32" and node.opts.get("fused_activation_function", "NONE") != "NONE":
        return reject(Reason.ACTIVATION, "No activation function supported.")
    return None


def _add_mul(node: NodeView, t) -> Verdict | None:
    got = dtype(node, 0)
    if _L(t) >= NNAPI13:
        if got not in FQ8I:
            return reject(Reason.TENSOR_TYPE, "Input should be Float, Quant8, or Int32.")
        r = _no_act_int32(node)
        if r:
            return r
    elif got not in FQ8:
        return reject(Reason.TENSOR_TYPE, "Input should be Float or Quant8.")
    return _ranks_le4(node, t)


def _sub(node: NodeView, t) -> Verdict | None:
    got, L = dtype(node, 0), _L(t)
    ok = (L >= NNAPI11 and got == "float32") or (L >= NNAPI12 and got in Q8) or (L >= NNAPI13 and got == "int32")
    if not ok:
        return reject(Reason.TENSOR_TYPE, f"NNAPI only support float sub (input {got} at feature level {L}).")
    return _no_act_int32(node) or _ranks_le4(node, t)


def _arg(node: NodeView, _t) -> Verdict | None:
    if dtype(node, 0) not in {"float16", "float32", "int32", "uint8", "int8"}:
        return reject(Reason.TENSOR_TYPE, "Input type not supported.")
    axis = node.input(1)
    if axis is not None and axis.dtype == "int64":
        v = axis.values()
        if v is None or not (-(2**31) <= int(v[0]) < 2**31):
            return reject(Reason.CONSTANT, "NNAPI only supports axis as int32 (or a constant int64 that fits).")
    elif axis is None or axis.dtype != "int32":
        return reject(Reason.TENSOR_TYPE, "Axis should be Int32.")
    if node.opts.get("output_type", "int32") != "int32":
        return reject(Reason.OPTION, "NNAPI only supports int32 output.")
    return None


def _avg_pool(node: NodeView, t) -> Verdict | None:
    o = node.opts
    if dtype(node, 0) in Q8 and not t.nnapi_is_accel and o.get("filter_width", 1) * o.get("filter_height", 1) > 256:
        return reject(Reason.OPTION, "Large filter window would overflow on the reference CPU path.")
    return None


def _pre12_weights(node: NodeView) -> Verdict | None:
    """CONV_2D / FULLY_CONNECTED before NNAPI 1.2: no hybrid, float or uint8, restricted scales."""
    if _hybrid(node):
        return reject(Reason.DYNAMIC_RANGE, "Hybrid operators not supported before NNAPI 1.2.", limit=NNAPI12)
    if dtype(node, 0) not in {"float32", "uint8"}:
        return reject(Reason.TENSOR_TYPE, "Input should be Float or UINT8.")
    return None


def _restricted(node: NodeView, t) -> Verdict | None:
    if _L(t) < NNAPI12 and dtype(node, 0) == "uint8" and not _restricted_scales(node):
        return reject(
            Reason.QUANTIZATION, "When using NN API version 1.0 or 1.1, input_scale * filter_scale < output_scale."
        )
    return None


def _conv_pre12(node: NodeView, t) -> Verdict | None:
    if _L(t) >= NNAPI12:
        return None
    r = _pre12_weights(node)
    if r:
        return r
    w = node.input(1)
    if w is not None and w.quant is not None and w.quant.per_channel:
        return reject(Reason.PER_CHANNEL, "Per-channel quantized convolution not supported before NNAPI 1.2.")
    return None


def _conv(node: NodeView, t) -> Verdict | None:
    """Validate only counts the inputs: an omitted (-1) bias slot still makes 3 (nnapi_delegate.cc:2518)."""
    if len(node.op.inputs) != 3:
        return reject(Reason.ARITY, "Conv2D with omitted bias not supported.")
    o, L = node.opts, _L(t)
    if (o.get("dilation_w_factor", 1) != 1 or o.get("dilation_h_factor", 1) != 1) and L < NNAPI12:
        return reject(Reason.FEATURE_LEVEL, "NNAPI supports dilated Conv2D since NNAPI 1.2.", limit=NNAPI12)
    x, w = node.input(0), node.input(1)
    if L < NNAPI12 and x is not None and w is not None and x.rank == 4 and w.rank == 4 and x.shape[3] != w.shape[3]:
        return reject(Reason.FEATURE_LEVEL, "Grouped convolution not supported before NNAPI 1.2.", limit=NNAPI12)
    return None


def _dwconv(node: NodeView, t) -> Verdict | None:
    if _L(t) >= NNAPI12:
        return None
    if dtype(node, 0) not in {"float32", "uint8"}:
        return reject(Reason.TENSOR_TYPE, "Input should be Float or UINT8.")
    o = node.opts
    if o.get("dilation_w_factor", 1) != 1 or o.get("dilation_h_factor", 1) != 1:
        return reject(Reason.OPTION, "dilation_width_factor and dilation_height_factor expected to be equal to 1.")
    return None


def _fc(node: NodeView, t) -> Verdict | None:
    y = node.output(0)
    if y is not None and y.dtype == "int16":
        return reject(Reason.TENSOR_TYPE, "Unsupported output of type kTfLiteInt16.")
    if _L(t) < NNAPI12:
        r = _pre12_weights(node)
        if r:
            return r
    if node.opts.get("keep_num_dims") and _L(t) < NNAPI13:
        return _level(NNAPI13, " (keep_num_dims)")
    return None


def _softmax(node: NodeView, t) -> Verdict | None:
    y = node.output(0)
    if y is None or y.dtype not in FQ8:
        return reject(Reason.TENSOR_TYPE, "Output type should be one of kTfLiteFloat32, kTfLiteUInt8, kTfLiteInt8.")
    r = node.input(0).rank if node.input(0) is not None else 0
    if r > 4:
        return reject(Reason.TENSOR_RANK, "Input rank should be <= 4.", limit=4)
    if _L(t) < NNAPI12 and r not in (2, 4):
        return reject(Reason.TENSOR_RANK, "Before API level 29 only 2D and 4D input tensors were supported.")
    return None


def _reshape(node: NodeView, t) -> Verdict | None:
    allowed = FQ8I if _L(t) >= NNAPI_FL6 else FQ8
    if dtype(node, 0) not in allowed:
        return reject(Reason.TENSOR_TYPE, "Input should be Float or Quant8.")
    for x in (node.input(0), node.output(0)):
        if x is not None and x.rank > 4:
            return reject(Reason.TENSOR_RANK, "Input and output rank should be <= 4.", limit=4)
    if len(node.op.inputs) >= 2:
        return constant_input(1, "The shape input tensor")(node, t)
    shape = tuple(node.opts.get("new_shape") or ())
    return reject(Reason.OPTION, "New shape rank should be > 0.") if shape in ((), (0,)) else None


def _no_align(node: NodeView, t) -> Verdict | None:
    if _L(t) <= NNAPI12 and (node.opts.get("align_corners") or node.opts.get("half_pixel_centers")):
        return reject(Reason.OPTION, "NNAPI does not support align_corners or half_pixel_centers == true.")
    return None


def _size_const(node: NodeView, t) -> Verdict | None:
    if len(node.op.inputs) < 2:
        return reject(Reason.ARITY, "Expected at least 2 inputs.")
    return constant_input(1, "The size input tensor")(node, t)


def _bilinear_pre12(node: NodeView, t) -> Verdict | None:
    if _L(t) >= NNAPI12:
        return None
    y = node.output(0)
    if y is not None and y.rank == 4 and y.shape[1] != y.shape[2]:
        return reject(Reason.SHAPE, "Require width == height due to driver differences in NNAPI < 1.2.")
    if dtype(node, 0) != "float32":
        return reject(Reason.TENSOR_TYPE, "NNAPI 1.0 & 1.1 only supports float input.")
    return None


def _rank4(node: NodeView, _t) -> Verdict | None:
    x = node.input(0)
    return None if x is not None and x.rank == 4 else reject(Reason.TENSOR_RANK, "Input should have rank 4.")


def _concat_pre12_scales(node: NodeView, t) -> Verdict | None:
    if dtype(node, 0) != "uint8" or _L(t) >= NNAPI12:
        return None
    qs = {
        (float(x.quant.scales[0]), int(x.quant.zero_points[0]) if len(x.quant.zero_points) else 0)
        for x in node.inputs
        if x is not None and x.quant is not None
    }
    if len(qs) > 1:
        return reject(
            Reason.QUANTIZATION,
            "NNAPI 1.0-1 only supported concatenating quantized tensor of the same scale and offset.",
        )
    return None


def _concat(node: NodeView, t) -> Verdict | None:
    if node.opts.get("fused_activation_function", "NONE") != "NONE":
        return reject(Reason.ACTIVATION, "No activation function supported.")
    x = node.input(0)
    if x is not None and x.rank > 4:
        return reject(Reason.TENSOR_RANK, "Input rank should be less than 4.", limit=4)
    if dtype(node, 0) not in {"float16", "float32", "uint8", "int8"}:
        return reject(Reason.TENSOR_TYPE, "Input type not supported.")
    return _concat_pre12_scales(node, t)


def _dequantize(node: NodeView, t) -> Verdict | None:
    """DEQUANTIZE has its own order: a runtime float16 input is accepted from NNAPI 1.3 before any check."""
    x, L = node.input(0), _L(t)
    if L >= NNAPI13 and x is not None and x.dtype == "float16" and not x.is_const:
        return None
    if node.version > 2:
        return reject(Reason.OP_VERSION, "Supported op versions are 1 and 2 only.", limit=2)
    got = dtype(node, 0)
    if got not in (Q8 if L >= NNAPI12 else {"uint8"}):
        return reject(Reason.TENSOR_TYPE, f"Input type {got} is not supported.")
    if L == NNAPI12 and got == "int8" and x.quant is not None and len(x.quant.zero_points) and x.quant.zero_points[0]:
        return reject(
            Reason.QUANTIZATION, "NN API supports int8 type since version 1.2 but only for symmetric quantization."
        )
    return None


def _no_empty_input(node: NodeView, _t) -> Verdict | None:
    x = node.input(0)
    if x is not None and 0 in x.shape:
        return reject(Reason.SHAPE, "NN API pad ops do not support input tensors with no elements.")
    return None


def _pad(node: NodeView, t) -> Verdict | None:
    n, L = len(node.op.inputs), _L(t)
    if n < 2:
        return reject(Reason.ARITY, "Expecting at least 2 inputs.")
    if n == 3 and L < NNAPI12:
        return reject(Reason.FEATURE_LEVEL, "Specification of the padding value is supported from NNAPI 1.2.", NNAPI12)
    if n != 3 and L < NNAPI12 and dtype(node, 0) != "float32":
        return reject(Reason.TENSOR_TYPE, "Only Float32 inputs are supported before NNAPI 1.2.")
    return None


def _mirror_pad(node: NodeView, _t) -> Verdict | None:
    if node.opts.get("mode") not in ("REFLECT", "SYMMETRIC"):
        return reject(Reason.OPTION, "Unknown padding mode.")
    return None if len(node.op.inputs) == 2 else reject(Reason.ARITY, "Expecting 2 inputs.")


def _b2s(node: NodeView, _t) -> Verdict | None:
    crops = node.input(2)
    v = crops.values() if crops is not None else None
    if v is None or crops.dtype != "int32" or v.size != 4 or v.any():
        return reject(Reason.CONSTANT, "All crops should be 0.")
    return None


def _transpose(node: NodeView, t) -> Verdict | None:
    if len(node.op.inputs) > 1 and node.input(1) is not None and node.input(1).is_const:
        return None
    return reject(Reason.CONSTANT, "Dynamically-sized tensors not supported (the permutation must be constant).")


def _transpose_conv(node: NodeView, t) -> Verdict | None:
    ins = node.inputs
    if len(ins) > 1 and all(x is not None and x.is_const for x in ins[:2]):
        return None
    return reject(
        Reason.CONSTANT, "Dynamically-sized tensors not supported (output shape and weights must be constant)."
    )


def _maxmin(node: NodeView, _t) -> Verdict | None:
    for x in node.inputs[:2]:
        if x is not None and x.rank == 0 and not x.is_const:
            return reject(Reason.CONSTANT, "Scalar operand should be constant.")
    return None


def _cast(node: NodeView, t) -> Verdict | None:
    allowed = {"float32", "int32", "uint8"} | ({"int8"} if _L(t) >= NNAPI13 else set())
    y = node.output(0)
    if dtype(node, 0) not in allowed or y is None or y.dtype not in allowed:
        return reject(Reason.TENSOR_TYPE, "Input or output type not supported.")
    return None


def _select(node: NodeView, _t) -> Verdict | None:
    if dtype(node, 1) not in {"float32", "int32", "uint8", "int8"}:
        return reject(Reason.TENSOR_TYPE, "Value type not supported.")
    c, v = node.input(0), node.input(1)
    if c is not None and v is not None and c.shape == v.shape:
        return None
    return reject(Reason.BROADCAST, "Condition and inputs tensors should have the same shape.")


def _gather(node: NodeView, _t) -> Verdict | None:
    p = node.input(1)
    if p is None or p.dtype != "int32":
        return reject(Reason.TENSOR_TYPE, "Positions type should be one of kTfLiteInt32.")
    return None if p.rank != 0 else reject(Reason.TENSOR_RANK, "0-dimension args are not supported by NNAPI.")


def _axis_const_i32(i: int):
    def check(node: NodeView, _t) -> Verdict | None:
        x = node.input(i)
        if x is not None and x.is_const and x.dtype == "int32":
            return None
        return reject(Reason.CONSTANT, "NNAPI only supports constant int32 axis tensor.")

    return check


def _split(node: NodeView, t) -> Verdict | None:
    allowed = {"float32", "uint8", "int32"} | ({"int8"} if _L(t) >= NNAPI13 else set())
    return None if dtype(node, 1) in allowed else reject(Reason.TENSOR_TYPE, "Value type not supported.")


def _split_sizes(node: NodeView) -> list[int] | None:
    sizes = node.input(1)
    v = sizes.values() if sizes is not None else None
    return None if v is None else [int(s) for s in v]


def _unknown_split(node: NodeView, vals: list[int]) -> int:
    """ComputeSplitVUnknownSplitSize: the size a -1 entry stands for (-1 when there is none)."""
    x, axis = node.input(0), node.input(2).values()
    if -1 not in vals or x is None or not x.shape or axis is None:
        return -1
    ax = int(axis[0]) % x.rank
    return x.shape[ax] - sum(s for s in vals if s != -1)


def _split_v(node: NodeView, t) -> Verdict | None:
    sizes, axis = node.input(1), node.input(2)
    if sizes is None or not sizes.is_const or sizes.dtype != "int32" or sizes.rank != 1:
        return reject(Reason.CONSTANT, "NNAPI only supports constant int32 size_splits vector.")
    if axis is None or not axis.is_const or axis.dtype != "int32":
        return reject(Reason.CONSTANT, "NNAPI only supports constant int32 axis tensor.")
    vals = _split_sizes(node)
    if vals is not None and (0 in vals or _unknown_split(node, vals) == 0):
        return reject(Reason.SHAPE, "NNAPI only supports non-zero split sizes.")
    return None


def _quantize(node: NodeView, t) -> Verdict | None:
    x, y = node.input(0), node.output(0)
    if x is None or y is None or x.dtype not in FQ8:
        return reject(Reason.TENSOR_TYPE, "Value should be quantized or Float32.")
    if x.dtype in Q8 and (x.quant is None or x.quant.scales[0] <= 0):
        return reject(Reason.QUANTIZATION, "Quantization scale should be > 0.")
    out_ok = {"uint8"} | ({"int8"} if _L(t) >= NNAPI13 else set())
    if y.dtype not in out_ok:
        return reject(Reason.TENSOR_TYPE, "Output should be kTfLiteUInt8.")
    if y.quant is None or y.quant.scales[0] <= 0:
        return reject(Reason.QUANTIZATION, "Quantization scale should be > 0.")
    return None


def _fill_dims(dims) -> Verdict | None:
    if dims is None or not dims.is_const:
        return reject(Reason.CONSTANT, "NNAPI doesn't support dynamic dimensions tensor.")
    if dims.dtype not in ("int32", "int64"):
        return reject(Reason.TENSOR_TYPE, "Dims type not supported.")
    if dims.shape and dims.shape[0] == 0:
        return reject(Reason.SHAPE, "NNAPI doesn't support generating scalars from FILL.")
    v = dims.values()
    if dims.dtype == "int64" and v is not None and ((v >= 2**31) | (v < -(2**31))).any():
        return reject(Reason.CONSTANT, "NNAPI only supports int32 dimensions tensor.")
    return None


def _fill(node: NodeView, _t) -> Verdict | None:
    r = _fill_dims(node.input(0))
    if r:
        return r
    value = node.input(1)
    if value is None or value.dtype not in ("float32", "int32", "int64"):
        return reject(Reason.TENSOR_TYPE, "Value type not supported.")
    if value.dtype == "int64" and value.is_const:
        vv = value.values()
        if vv is None or abs(int(vv[0])) >= 2**31:
            return reject(Reason.CONSTANT, "NNAPI only supports int32 input.")
    return None


def _pack(node: NodeView, t) -> Verdict | None:
    x = node.input(0)
    if _L(t) >= NNAPI_FL6:
        return _in0({"int32", "float32", "int8", "uint8"})(node, t)
    r = _in0({"float32", "int8"})(node, t)
    if r:
        return r
    axis = node.opts.get("axis", 0)
    if x is not None and axis in (-1, x.rank):
        return reject(Reason.OPTION, "NNAPI does not support axis being the last dimension.")
    return None


def _unpack(node: NodeView, _t) -> Verdict | None:
    x = node.input(0)
    if x is None or not 2 <= x.rank <= 4:
        return reject(Reason.TENSOR_RANK, "NNAPI unpacks tensors of rank 2 to 4 only.")
    axis = node.opts.get("axis", 0)
    if axis in (-1, x.rank - 1):
        return reject(Reason.OPTION, "NNAPI does not support axis being the last dimension.")
    return None


def _sqdiff(node: NodeView, t) -> Verdict | None:
    L = _L(t)
    allowed = FQ8I if L >= NNAPI13 else ({"float32", "uint8"} if L == NNAPI12 else F32)
    return _in0(allowed)(node, t) or _ranks_le4(node, t)


def _bmm(node: NodeView, _t) -> Verdict | None:
    a, b = node.input(0), node.input(1)
    if a is None or b is None or a.dtype not in ("float32", "int32", "int8"):
        return reject(Reason.TENSOR_TYPE, "Input type not supported.")
    if a.dtype != b.dtype:
        return reject(Reason.DYNAMIC_RANGE, "NNAPI does not support hybrid batch matmul.")
    if not 2 <= a.rank <= 4:
        return reject(Reason.TENSOR_RANK, "NNAPI does not support input rank greater than 4 or less than 2.")
    if a.rank != b.rank or a.shape[:-2] != b.shape[:-2]:
        return reject(Reason.BROADCAST, "NNAPI does not support broadcast batch matmul.")
    return None


def _quant_params(x, scale: float, zp: int) -> bool:
    return (
        x is not None
        and x.quant is not None
        and abs(float(x.quant.scales[0]) - scale) < 1e-9
        and len(x.quant.zero_points) > 0
        and int(x.quant.zero_points[0]) == zp
    )


def _basic_lstm(node: NodeView) -> Verdict | None:
    if dtype(node, 2) != "uint8":
        return reject(Reason.TENSOR_TYPE, "Basic LSTM Kernels support only UINT8 weights.")
    if not (_quant_params(node.input(0), 1 / 128, 128) and _quant_params(node.output(0), 1 / 128, 128)):
        return reject(Reason.QUANTIZATION, "Invalid input/output quantization (needs scale 1/128, zero point 128).")
    cs = node.output(1)
    zp0 = cs is not None and cs.quant is not None and len(cs.quant.zero_points) and int(cs.quant.zero_points[0]) == 0
    if not (zp0 or (cs is not None and cs.quant is not None and abs(float(cs.quant.scales[0]) - 16 / 32768) < 1e-12)):
        return reject(Reason.QUANTIZATION, "Invalid cell state quantization.")
    w, b = node.input(2), node.input(3)
    if not (w is not None and w.is_const and b is not None and b.is_const):
        return reject(Reason.CONSTANT, "Weights and biases tensors should be constant.")
    return None


def _lstm(node: NodeView, t) -> Verdict | None:
    L = _L(t)
    if L < NNAPI12 and _hybrid(node) and len(node.op.inputs) in (20, 24):
        return reject(Reason.DYNAMIC_RANGE, "Hybrid operators not supported before NNAPI 1.2.", limit=NNAPI12)
    if len(node.op.inputs) == 5:  # isLstmBasicKernel
        return _basic_lstm(node)
    if len(node.op.inputs) == 24 and L < NNAPI12:
        return _level(NNAPI12, " (24-input LSTM)")
    allowed = {"float32", "uint8"} | ({"int8"} if L >= NNAPI13 else set())
    return None if dtype(node, 4) in allowed else reject(Reason.TENSOR_TYPE, "Weight has to be Float32 or UINT8.")


def _not_hybrid(node: NodeView, _t) -> Verdict | None:
    if _hybrid(node):
        return reject(Reason.DYNAMIC_RANGE, "Hybrid version of this op is not supported by NN API.")
    return None


def _n_in(*k: int):
    def check(node: NodeView, _t) -> Verdict | None:
        n = len(node.op.inputs)
        return None if n in k else reject(Reason.ARITY, f"Expected {' or '.join(map(str, k))} inputs, got {n}.")

    return check


def _out_rank_nonzero(node: NodeView, _t) -> Verdict | None:
    y = node.output(0)
    if y is not None and y.rank != 0:
        return None
    return reject(Reason.TENSOR_RANK, "NNAPI does not support generating a scalar as output.")


def _in_rank_nonzero(node: NodeView, _t) -> Verdict | None:
    x = node.input(0)
    if x is not None and x.rank != 0:
        return None
    return reject(Reason.TENSOR_RANK, "NNAPI does not support generating a scalar as output.")


def _mean(node: NodeView, t) -> Verdict | None:
    r = _in0(FQ8 if _L(t) >= NNAPI12 else F32)(node, t) or _out_rank_nonzero(node, t)
    if r:
        return r
    x = node.input(0)
    if x is not None and x.rank > 4:
        return reject(Reason.TENSOR_RANK, "NNAPI does not support mean of a tensor with rank > 4.", limit=4)
    return None


def _squeeze(node: NodeView, t) -> Verdict | None:
    if _L(t) == NNAPI11 and not node.opts.get("squeeze_dims"):
        return reject(Reason.OPTION, "NNAPI 1.1 does not support null squeeze_dims properly.")
    return None


def _l2norm(node: NodeView, t) -> Verdict | None:
    x = node.input(0)
    if _L(t) < NNAPI12 and (x is None or x.dtype != "float32" or x.rank != 4):
        return reject(Reason.TENSOR_TYPE, "Expected a float32 4-D input before NNAPI 1.2.")
    if node.opts.get("fused_activation_function", "NONE") != "NONE":
        return reject(Reason.ACTIVATION, "Expected no activation.")
    return None


def _lsh(node: NodeView, t) -> Verdict | None:
    if node.opts.get("type") != "SPARSE":
        return None
    if _L(t) < NNAPI12:
        return _level(NNAPI12, " (sparse projection)")
    return (
        None
        if len(node.op.inputs) == 2
        else reject(Reason.ARITY, "NNAPI does not support weights for sparse projects.")
    )


def _rsqrt(node: NodeView, t) -> Verdict | None:
    return _in0(F32 if _L(t) < NNAPI_FL7 else FQ8)(node, t)


def _tanh(node: NodeView, t) -> Verdict | None:
    got = dtype(node, 0)
    if got == "float32" or (got in Q8 and _L(t) >= NNAPI12):
        return None
    return reject(Reason.TENSOR_TYPE, "NNAPI only support float tanh.")


def _l2pool(node: NodeView, t) -> Verdict | None:
    if _L(t) < NNAPI12 and node.opts.get("fused_activation_function", "NONE") != "NONE":
        return reject(Reason.ACTIVATION, "Before NNAPI 1.2 fused activation for l2_pool may not be supported.")
    return None


def _topk(node: NodeView, _t) -> Verdict | None:
    k = node.input(1)
    if k is not None and k.is_const and k.dtype == "int32":
        return None
    return reject(Reason.CONSTANT, "K param should be a constant of type Int32.")


def _densify(node: NodeView, _t) -> Verdict | None:
    x = node.input(0)
    return None if x is not None and x.is_const else reject(Reason.CONSTANT, "Densify with a non-constant input.")


def _type_at(i: int, allowed, what: str):
    return input_type_in(i, allowed, what)


def _out0_f32(node: NodeView, _t) -> Verdict | None:
    y = node.output(0)
    if y is not None and y.dtype == "float32":
        return None
    return reject(Reason.TENSOR_TYPE, "NNAPI only support float32 output.")


BOOL = frozenset({"bool"})
CMP = frozenset({"float32", "uint8", "int8", "bool", "int32"})
_FLOAT_W = _type_at(1, F32, "Weights type")

# op -> Rule(max version, checks, min feature level). MUL and DEQUANTIZE are special-cased in `check`.
OPS: dict[str, Rule] = {
    "ADD": Rule(2, (_add_mul,), NNAPI10),
    "SUB": Rule(3, (_sub,), NNAPI10),
    "DIV": Rule(1, (_in0(F32), _ranks_le4), NNAPI11),
    "ARG_MAX": Rule(2, (_arg,), NNAPI12),
    "ARG_MIN": Rule(2, (_arg,), NNAPI12),
    "AVERAGE_POOL_2D": Rule(2, (_in0(FQ8), _avg_pool), NNAPI10),
    "MAX_POOL_2D": Rule(2, (_in0(FQ8),), NNAPI10),
    "L2_POOL_2D": Rule(1, (_in0(F32), _l2pool), NNAPI10),
    "CONV_2D": Rule(5, (_conv_pre12, _restricted, _conv), NNAPI10),
    "DEPTHWISE_CONV_2D": Rule(3, (_dwconv, _restricted), NNAPI10),
    "FULLY_CONNECTED": Rule(5, (_fc, _restricted), NNAPI10),
    "HARD_SWISH": Rule(None, (_in0(FQ8),), NNAPI10),
    "SOFTMAX": Rule(2, (_in0(FQ8), _softmax), NNAPI10),
    "RESHAPE": Rule(1, (_reshape,), NNAPI10),
    "RESIZE_BILINEAR": Rule(3, (_rank4, _in0(FQ8), _size_const, _bilinear_pre12, _no_align), NNAPI10),
    "RESIZE_NEAREST_NEIGHBOR": Rule(3, (_in0(FQ8), _size_const, _no_align), NNAPI12),
    "SQUEEZE": Rule(1, (_squeeze,), NNAPI11),
    "L2_NORMALIZATION": Rule(2, (_l2norm,), NNAPI10),
    "LOCAL_RESPONSE_NORMALIZATION": Rule(1, (), NNAPI10),
    "LSH_PROJECTION": Rule(1, (_lsh,), NNAPI10),
    "CONCATENATION": Rule(2, (_concat,), NNAPI10),
    "DENSIFY": Rule(None, (_densify,), NNAPI13),
    "FLOOR": Rule(1, (), NNAPI10),
    **{op: Rule(2, (_in0(FQ8),), NNAPI10) for op in ("RELU", "RELU_N1_TO_1", "RELU6", "LOGISTIC")},
    "TANH": Rule(2, (_tanh,), NNAPI10),
    "PAD": Rule(2, (_in0(FQ8), _no_empty_input, _pad), NNAPI11),
    "PADV2": Rule(2, (_in0(FQ8), _no_empty_input, _pad), NNAPI11),
    "MIRROR_PAD": Rule(2, (_in0(FQ8I), _no_empty_input, _mirror_pad), NNAPI_FL7),
    "SPACE_TO_BATCH_ND": Rule(2, (), NNAPI11),
    "BATCH_TO_SPACE_ND": Rule(2, (_b2s,), NNAPI11),
    "STRIDED_SLICE": Rule(2, (_in0(FQ8),), NNAPI11),
    "TRANSPOSE": Rule(2, (_transpose,), NNAPI11),
    **{op: Rule(1, (_in0(F32),), NNAPI12) for op in ("ABS", "EXP", "LOG", "POW", "SIN", "COS", "SQRT", "LOG_SOFTMAX")},
    "RSQRT": Rule(2, (_rsqrt,), NNAPI12),
    "SLICE": Rule(
        2,
        (
            _in0({"float32", "int32", "uint8", "int8"}),
            _type_at(1, {"int32"}, "Begin type"),
            _type_at(2, {"int32"}, "Size type"),
        ),
        NNAPI12,
    ),
    "TRANSPOSE_CONV": Rule(4, (_transpose_conv,), NNAPI12),
    "RNN": Rule(1, (_n_in(5), _FLOAT_W), NNAPI10),
    "SVDF": Rule(1, (_n_in(5), _FLOAT_W), NNAPI11),
    "LSTM": Rule(3, (_lstm,), NNAPI11),
    "UNIDIRECTIONAL_SEQUENCE_LSTM": Rule(2, (_not_hybrid, _n_in(20, 24)), NNAPI12),
    "UNIDIRECTIONAL_SEQUENCE_RNN": Rule(1, (_not_hybrid,), NNAPI12),
    "BIDIRECTIONAL_SEQUENCE_LSTM": Rule(1, (_not_hybrid,), NNAPI12),
    "MEAN": Rule(2, (_mean,), NNAPI11),
    "SUM": Rule(1, (_out_rank_nonzero, _in0(F32)), NNAPI12),
    "REDUCE_PROD": Rule(1, (_out_rank_nonzero, _in0(F32)), NNAPI12),
    "REDUCE_MAX": Rule(2, (_in0(FQ8), _in_rank_nonzero), NNAPI12),
    "REDUCE_MIN": Rule(2, (_in0(FQ8), _in_rank_nonzero), NNAPI12),
    "REDUCE_ANY": Rule(2, (_out_rank_nonzero,), NNAPI12),
    "EMBEDDING_LOOKUP": Rule(1, (_type_at(1, F32, "Values type"),), NNAPI10),
    "HASHTABLE_LOOKUP": Rule(1, (_out0_f32,), NNAPI10),
    "MAXIMUM": Rule(3, (_in0(FQ8I), _maxmin), NNAPI12),
    "MINIMUM": Rule(3, (_in0(FQ8I), _maxmin), NNAPI12),
    "CAST": Rule(1, (_cast,), NNAPI12),
    "LEAKY_RELU": Rule(1, (_in0(FQ8),), NNAPI12),
    "PRELU": Rule(1, (_in0(FQ8),), NNAPI12),
    "TILE": Rule(1, (_in0(FQ8I), _type_at(1, {"int32"}, "Multipliers type")), NNAPI12),
    **{op: Rule(1, (_in0(BOOL),), NNAPI12) for op in ("LOGICAL_AND", "LOGICAL_OR", "LOGICAL_NOT")},
    **{
        op: Rule(2, (_in0(CMP),), NNAPI12)
        for op in ("EQUAL", "NOT_EQUAL", "LESS", "LESS_EQUAL", "GREATER", "GREATER_EQUAL")
    },
    "NEG": Rule(2, (_in0({"float32", "int32"}),), NNAPI12),
    "TOPK_V2": Rule(2, (_in0(FQ8I), _topk), NNAPI12),
    "SELECT": Rule(2, (_select,), NNAPI12),
    "GATHER": Rule(2, (_in0({"float32", "float16", "int32", "uint8", "int8"}), _gather), NNAPI12),
    "EXPAND_DIMS": Rule(1, (_in0({"float32", "float16", "int32", "uint8", "int8"}), _axis_const_i32(1)), NNAPI12),
    "SPLIT": Rule(3, (_split, _axis_const_i32(0)), NNAPI12),
    "SPLIT_V": Rule(2, (_in0(FQ8I), _split_v), NNAPI13),
    "QUANTIZE": Rule(2, (_quantize,), NNAPI12),
    "DEPTH_TO_SPACE": Rule(None, (_in0(FQ8),), NNAPI10),
    "SPACE_TO_DEPTH": Rule(2, (_in0(FQ8),), NNAPI10),
    "ELU": Rule(1, (_in0(F32),), NNAPI13),
    "FILL": Rule(1, (_fill,), NNAPI13),
    "PACK": Rule(2, (_pack,), NNAPI13),
    "UNPACK": Rule(2, (_in0(FQ8), _unpack), NNAPI13),
    "SQUARED_DIFFERENCE": Rule(2, (_sqdiff,), NNAPI11),
    "BATCH_MATMUL": Rule(2, (_bmm,), NNAPI_FL6),
    "REVERSE_V2": Rule(3, (_in0(FQ8I), _n_in(2)), NNAPI_FL7),
}


def _mul_rule(target: TargetParams) -> Rule:
    """MUL's version cap depends on whether an accelerator is named (nnapi_delegate.cc:2435-2439)."""
    return Rule(3 if target.nnapi_is_accel else 2, (_add_mul,), NNAPI10)


def _unsupported(node: NodeView) -> Verdict:
    extra = f" (custom op '{node.op.custom_code}')" if node.name == "CUSTOM" else ""
    return reject(Reason.UNSUPPORTED_OP, f"Unsupported operation type{extra}.")


def check(node: NodeView, target: TargetParams) -> Verdict | None:
    """NNAPI's Validate for one node: None when accepted, else the first failure."""
    if node.name == "DEQUANTIZE":
        return _dequantize(node, target)
    rule = _mul_rule(target) if node.name == "MUL" else OPS.get(node.name)
    if rule is None:
        return _unsupported(node)
    if rule.vmax is not None and node.version > rule.vmax:
        return reject(Reason.OP_VERSION, f"OP Version higher than {rule.vmax}.", limit=rule.vmax)
    if rule.min_level is not None and _L(target) < rule.min_level:
        return _level(rule.min_level)
    return first(rule.checks, node, target)


# ---- build time (AddOpsAndTensors): every node the partitions hold is added to the NNAPI model --------

# Input slots the builder does not add with AddTensorInput (nnapi_delegate.cc:5822-6190): the op's Map adds
# them itself (as scalars, or in another order), or skips them. Everything else goes through AddTensor.
_NOT_ADDED: dict[str, object] = {
    "TRANSPOSE_CONV": lambda pos, node: True,  # :5829-5833, all in Map
    "FILL": lambda pos, node: True,  # :6122-6186, dims and value converted in place
    "SPLIT": lambda pos, node: pos == 0,  # :5915-5920, the axis is a scalar
    "PAD": lambda pos, node: pos == 2,  # :5924-5978, the pad value is a scalar
    "PADV2": lambda pos, node: pos == 2,
    "RESIZE_BILINEAR": lambda pos, node: pos >= 1,  # :5987-5996, the size is two scalars
    "RESIZE_NEAREST_NEIGHBOR": lambda pos, node: pos >= 1,
    "TOPK_V2": lambda pos, node: pos >= 1,  # :5997-6001
    "GATHER": lambda pos, node: pos >= 1,  # :6002-6009
    "EXPAND_DIMS": lambda pos, node: pos == 1,  # :6010-6013
    "BATCH_TO_SPACE_ND": lambda pos, node: pos == 2,  # :6014-6018
    "ARG_MAX": lambda pos, node: pos == 1,  # :6019-6049
    "ARG_MIN": lambda pos, node: pos == 1,
    "LSTM": lambda pos, node: len(node.op.inputs) == 5 or pos >= 20,  # :5890-5901
    "UNIDIRECTIONAL_SEQUENCE_LSTM": lambda pos, node: pos >= 20,  # :5902-5909
}
_MAXMIN = frozenset({"MAXIMUM", "MINIMUM"})
_SCALAR_FORMS = _MAXMIN | frozenset({"MEAN", "SUM", "REDUCE_PROD", "REDUCE_MAX", "REDUCE_MIN", "REDUCE_ANY"})
# Omitted (-1) inputs the builder has a path for (:5834-5838, 5910-5913, 5928-5929, 5980-5986); any other -1
# slot reaches AddTensor (:1780-1809) as tensor index -1.
_OPTIONAL_OK = frozenset(
    {"FULLY_CONNECTED", "LSTM", "SVDF", "BIDIRECTIONAL_SEQUENCE_LSTM", "UNIDIRECTIONAL_SEQUENCE_LSTM", "PAD", "PADV2"}
)


def _added(node: NodeView):
    """(position, tensor or None for -1) of the inputs AddTensorInput receives."""
    skip = _NOT_ADDED.get(node.name)
    for pos, t in enumerate(node.inputs):
        if skip is not None and skip(pos, node):
            continue
        if node.name in _SCALAR_FORMS and t is not None and t.rank == 0 and (pos == 1 or node.name in _MAXMIN):
            continue  # a scalar axis or operand becomes a vector or constant operand (:6050-6121)
        yield pos, t


def _omitted_input(node: NodeView) -> Verdict | None:
    if node.name in _OPTIONAL_OK or node.name in _NOT_ADDED:
        return None
    for pos, t in _added(node):
        if t is None:
            what = "Conv2D with omitted bias" if node.name == "CONV_2D" else f"{node.name} with omitted input {pos}"
            return reject(
                Reason.ARITY,
                f"{what}: the model builder has no path for a -1 input (TODO(b/132950584)): it reaches AddTensor "
                "as tensor index -1.",
            )
    return None


def build_failure(node: NodeView, target: TargetParams, boundary: Boundary | None = None) -> Verdict | None:
    """What fails the whole delegation while the NNAPI model is built: a tensor type AddTensor cannot map
    (constants included, e.g. int64 PAD paddings or int4 weights), or an omitted input with no path."""
    if all(t is not None and t.dtype in NNAPI_TYPES for t in node.inputs) and all(
        t.dtype in NNAPI_TYPES for t in node.outputs
    ):
        return None  # the common case: nothing AddTensor could refuse
    r = _omitted_input(node)
    if r:
        return r
    added = [t for _, t in _added(node) if t is not None]
    for x in added + node.outputs:
        if x.dtype not in NNAPI_TYPES:
            return reject(
                Reason.TENSOR_TYPE,
                f"Failed to add NN API tensor: type {x.dtype.upper()} is not supported "
                f"({'constant' if x.is_const else 'tensor'} {x.name or x.index}).",
                detail=x.dtype,
            )
    return None


def hints(findings: Sequence[Finding], target: TargetParams, scheme: str) -> list[str]:
    out: list[str] = []
    found = codes(findings)
    if Reason.DYNAMIC_RANGE in found:
        out.append(
            "NNAPI rejects these dynamic-range (hybrid) ops at this feature level: use int8 (full integer) or "
            "float16, or target Android 10+ (API 29)."
        )
    if Reason.FEATURE_LEVEL in found:
        out.append(
            f"NNAPI: some ops need a newer Android / NNAPI feature level than the target ({target.nnapi_level})."
        )
    if scheme == Scheme.INT16X8 and findings:
        out.append("NNAPI does not take int16 activations: use int8.")
    dtype = build_detail(findings)
    if dtype == "int64":
        out.append("NNAPI cannot add int64 tensors to its model: store paddings and other index constants as int32.")
    elif dtype == "int4":
        out.append("NNAPI has no 4-bit tensors: use int8 (full integer) for NNAPI; int4 weights are for the CPU.")
    if scheme == Scheme.FLOAT16:
        out.append(NNAPI_FLOAT16.hint)
    out.append("NNAPI: this is an upper bound; on Android 10+ the device driver may refuse more nodes.")
    return out


RULES = ModuleRules(Delegate.NNAPI, SOURCE, policy, check, veto=veto, build_failure=build_failure, hints=hints)

"""GPU delegate (TfLiteGpuDelegateV2; Metal uses the same GetOpsToReplace): which nodes it takes.

Order per node, as the runtime does it: parser chosen by op (unknown/custom -> "Operation is not
supported."), version cap, the op's IsSupported checks (including gpu_compatibility.cc's shared rules with
standard broadcast), then the tensor type/rank gate (IsAllAllowedTensors). Partitioning uses the FP16
helper; by default only the single largest partition is delegated. A few build-time failures, which make
the whole delegation fail, are checked on the delegated nodes.
"""

from __future__ import annotations

import struct

from .graph import NodeView
from .rules import (
    FLOAT,
    QUANT8,
    Policy,
    Rule,
    activation_in,
    n_inputs,
    n_outputs,
    option,
    runtime_const,
    shape_str,
)
from .target import TargetParams

SOURCE = (
    "tflite/delegates/gpu/common/model_builder.cc + tflite/tools/versioning/gpu_compatibility.cc "
    "@ LiteRT f67457790c9c (Aug 2026)"
)
NAME = "gpu"

ACT_OK = frozenset({"NONE", "RELU", "RELU_N1_TO_1", "RELU6", "TANH", "SIGMOID"})
COMPARISONS = frozenset({"EQUAL", "NOT_EQUAL", "GREATER", "GREATER_EQUAL", "LESS", "LESS_EQUAL"})


def policy(target: TargetParams) -> Policy:
    mp = target.gpu_max_partitions
    mp = 1 if mp is None or mp <= 0 else mp
    return Policy(
        max_partitions=mp,
        min_nodes=target.gpu_min_nodes or 0,
        fp16_helper=True,
        allows_dynamic=False,
        params={
            "max_partitions": mp,
            "min_nodes": target.gpu_min_nodes or 0,
            "allow_quant": target.gpu_allow_quant,
            "opencl": target.gpu_opencl,
        },
    )


def version_msg(vmax: int, v: int) -> str:
    return f"Max version supported: {vmax}. Requested version {v}."


# ---- checks -----------------------------------------------------------------------------------------

act = activation_in(ACT_OK)


def _one_runtime(node: NodeView, _t) -> str | None:
    if len(node.runtime_inputs) != 1:
        return f"Expected 1 runtime input, got {len(node.runtime_inputs)}."
    if len(node.op.outputs) != 1:
        return f"Expected 1 output, got {len(node.op.outputs)}."
    return None


def _unary(node: NodeView, _t) -> str | None:
    if len(node.runtime_inputs) != 1 or node.const_inputs or len(node.op.outputs) != 1:
        return "Expected 1 runtime input, 0 constant inputs and 1 output."
    return None


binary = runtime_const((2, 0), (1, 1))


def _conv_io(node: NodeView, _t) -> str | None:
    r = len(node.runtime_inputs)
    if r < 1 or r > 2:
        return f"Expected 1 or 2 runtime inputs, got {r}."
    if len(node.op.outputs) != 1:
        return "Expected 1 output."
    if r == 1 and node.input(1) is None:
        return "Expected a weights input (input 1)."
    return None


def _strides(node: NodeView, _t) -> str | None:
    o = node.opts
    if o.get("stride_w", 1) <= 0 or o.get("stride_h", 1) <= 0:
        return "Strides must be positive."
    if o.get("dilation_w_factor", 1) <= 0 or o.get("dilation_h_factor", 1) <= 0:
        return "Dilations must be positive."
    return None


def _pool(node: NodeView, _t) -> str | None:
    o = node.opts
    if o.get("filter_width", 1) <= 0 or o.get("filter_height", 1) <= 0:
        return "Filter size must be positive."
    return _strides(node, _t)


def _broadcast(node: NodeView, _t) -> str | None:
    """CheckAddMulBroadcastCompatibility, kStandard: only when both ranks > 1 and they differ."""
    a, b = node.input(0), node.input(1)
    if a is None or b is None or a.rank <= 1 or b.rank <= 1 or a.rank == b.rank:
        return None
    long, short = (a, b) if a.rank > b.rank else (b, a)
    ok = False
    if long.rank == 4 and short.rank == 3 and long.shape[0] == 1:
        ok = True
    elif long.rank == 4 and short.rank == 2:
        ok = (short.shape == (1, 1) and long.shape[0] == 1) or (
            short.shape[0] == long.shape[0] and short.shape[1] == long.shape[3]
        )
    return None if ok else f"Doesn't support broadcasting - input0: {shape_str(a)}, input1: {shape_str(b)}."


def _add(node: NodeView, _t) -> str | None:
    if len(node.op.inputs) != 2:
        return f"ADD requires exactly 2 inputs, got {len(node.op.inputs)}."
    if node.opts.get("fused_activation_function") == "SIGN_BIT":
        return "Unsupported fused activation SIGN_BIT."
    return _broadcast(node, _t)


def _mul(node: NodeView, _t) -> str | None:
    if len(node.op.inputs) != 2:
        return f"MUL requires exactly 2 inputs, got {len(node.op.inputs)}."
    return _broadcast(node, _t) or act(node, _t)


def _comparison(node: NodeView, _t) -> str | None:
    """Logical ops are taken only when their single consumer is CAST/SELECT/SELECT_V2 producing float."""
    out = node.output(0)
    cons = node.consumers(out) if out is not None else []
    if out is None or node.is_graph_output(out) or len(cons) != 1:
        return "Not supported logical op case (the bool output must feed exactly one CAST/SELECT)."
    c = cons[0]
    c_out = node.sg.tensors[c.outputs[0]] if c.outputs else None
    if c.opcode not in ("CAST", "SELECT", "SELECT_V2") or c_out is None or c_out.dtype not in FLOAT:
        return "Not supported logical op case (the bool output must feed a CAST/SELECT with a float output)."
    return None


def _cast(node: NodeView, _t) -> str | None:
    x, y = node.input(0), node.output(0)
    if x is None or y is None:
        return "CAST needs 1 input and 1 output."
    if x.dtype == "bool" and y.dtype in FLOAT:
        prod = node.producer(x)
        cons = node.consumers(x)
        if prod is not None and prod.opcode in COMPARISONS and len(cons) == 1:
            if len(node.consumers(y)) == 1 and not node.is_graph_output(y):
                return None
    if len(node.runtime_inputs) != 1 or len(node.op.outputs) != 1:
        return "Expected 1 runtime input and 1 output."
    pair = (x.dtype, y.dtype)
    ok = (
        (x.dtype == "bool" and y.dtype in FLOAT)
        or (x.dtype in FLOAT and y.dtype == "bool")
        or (x.dtype in ("float32", "int32") and y.dtype in ("float32", "int32"))
    )
    return None if ok else f"Unsupported CAST {pair[0]} -> {pair[1]}."


def _axes_const_int32(index: int):
    def check(node: NodeView, _t) -> str | None:
        t = node.input(index)
        if t is None or not t.is_const or t.dtype != "int32":
            return "Axes must be a constant int32 tensor."
        return None

    return check


def _depthwise(node: NodeView, _t) -> str | None:
    x, w, y, b = node.input(0), node.input(1), node.output(0), node.input(2)
    if x is None or w is None or y is None:
        return "Expected input, filter and output."
    if x.rank != 4 or w.rank != 4 or y.rank != 4:
        return "Input, filter and output must be 4-D."
    if x.shape[0] != y.shape[0]:
        return "Input and output batch differ."
    if w.shape[3] != y.shape[3]:
        return "Filter channels must equal output channels."
    if y.shape[3] != x.shape[3] * int(node.opts.get("depth_multiplier", 1) or 1):
        return "Output channels must be input channels x depth_multiplier."
    if b is not None and b.numel != y.shape[3]:
        return "Bias size must equal output channels."
    return None


def _dequantize(node: NodeView, t: TargetParams) -> str | None:
    x = node.input(0)
    if x is not None and x.dtype == "int16":
        return "DEQUANTIZE of an int16 input is not supported."
    return n_inputs(1)(node, t) or n_outputs(1)(node, t)


def _fully_connected(node: NodeView, _t) -> str | None:
    if node.opts.get("weights_format", "DEFAULT") != "DEFAULT":
        return "Unsupported FullyConnected weights format."
    if len(node.runtime_inputs) > 2:
        return "FullyConnected takes at most 2 runtime inputs."
    x = node.input(0)
    if x is None or x.is_const:
        return "FullyConnected input 0 must not be constant."
    y = node.output(0)
    if node.opts.get("keep_num_dims") and y is not None and x.rank != y.rank:
        return "keep_num_dims requires input rank == output rank."
    return None


def _gather(node: NodeView, t) -> str | None:
    r = binary(node, t)
    if r:
        return r
    idx = node.input(1)
    if idx is None or idx.rank != 1 or idx.dtype != "int32":
        return "Indices must be a 1-D int32 tensor."
    return None


def _lstm(node: NodeView, _t) -> str | None:
    o, n_in = node.opts, len(node.op.inputs)
    if o.get("kernel_type", "FULL") == "BASIC":
        if (len(node.runtime_inputs), len(node.const_inputs)) != (3, 2) or len(node.op.outputs) != 4:
            return "Basic LSTM needs 3 runtime + 2 constant inputs and 4 outputs."
        if o.get("fused_activation_function") != "TANH" or o.get("cell_clip") or o.get("proj_clip"):
            return "Basic LSTM needs TANH activation and no clipping."
        out3 = node.output(3)
        if out3 is not None and out3.shape and out3.shape[-1] % 4:
            return "Basic LSTM output 3 last dimension must be a multiple of 4."
        return None
    if n_in not in (20, 24) or len(node.op.outputs) != 1:
        return "Full LSTM needs 20 or 24 inputs and 1 output."
    if o.get("fused_activation_function") not in ("SIGMOID", "TANH"):
        return "Full LSTM activation must be SIGMOID or TANH."
    return None


def _mean(node: NodeView, t) -> str | None:
    return runtime_const((1, 1))(node, t) or _axes_const_int32(1)(node, t)


def _pad(node: NodeView, t) -> str | None:
    r = _one_runtime(node, t)
    if r:
        return r
    p = node.input(1)
    if p is None or p.shape not in ((4, 2), (3, 2)):
        return f"Paddings must have shape [4,2] or [3,2], got {shape_str(p)}."
    return None


def _one_hot(node: NodeView, _t) -> str | None:
    if len(node.op.inputs) != 4 or len(node.op.outputs) != 1:
        return "ONE_HOT needs 4 inputs and 1 output."
    idx = node.input(0)
    if idx is None or idx.dtype != "int32":
        return "Indices must be int32."
    axis = node.opts.get("axis", -1)
    if axis != -1 and not (idx.shape and axis == idx.shape[-1]):
        return "Only one-hot along the last axis is supported."
    for i, d in enumerate(idx.shape[:-1]):
        if d != 1 and not (i == 0 and idx.rank > 3):
            return "All but the last index dimension must be 1."
    for k in (2, 3):
        v = node.input(k)
        if v is None or v.dtype != "float32" or not v.is_const or v.numel != 1:
            return "on/off values must be constant float32 scalars."
    return None


def _select(node: NodeView, _t) -> str | None:
    if len(node.op.inputs) != 3 or len(node.op.outputs) != 1:
        return "SELECT needs 3 inputs and 1 output."
    cond, y = node.input(0), node.output(0)
    if cond is None or cond.dtype not in ("bool", "float16", "float32"):
        return "Condition must be bool or float."
    for k in (1, 2):
        v = node.input(k)
        if v is None:
            return "SELECT branches are required."
        if v.rank == 2 and not v.is_const:
            return "A 2-D non-constant branch is not supported."
        if v.numel != 1 and y is not None and v.shape != y.shape:
            return "Each branch must be a scalar or have the output's shape."
    return None


def _slice(node: NodeView, _t) -> str | None:
    if len(node.op.inputs) < 3:
        return "SLICE needs begin and size inputs."
    x = node.input(0)
    return None if x is not None and x.rank in (3, 4) else "SLICE input must be 3-D or 4-D."


def _strided_slice(node: NodeView, _t) -> str | None:
    o = node.opts
    for k in ("ellipsis_mask", "new_axis_mask", "shrink_axis_mask"):
        if o.get(k, 0):
            return f"Slicing with {k} != 0 is not supported."
    if len(node.op.inputs) < 4:
        return "STRIDED_SLICE needs begin, end and strides."
    x = node.input(0)
    return None if x is not None and x.rank in (3, 4) else "STRIDED_SLICE input must be 3-D or 4-D."


def _block(node: NodeView, t) -> str | None:
    return _one_runtime(node, t) or (None if node.opts.get("block_size", 0) > 1 else "block_size must be > 1.")


def _split(node: NodeView, t: TargetParams) -> str | None:
    return None if t.gpu_opencl else "SPLIT/SPLIT_V are excluded when OpenCL is unavailable."


def _quant_allowed(node: NodeView, t: TargetParams) -> str | None:
    return None if t.gpu_allow_quant else "Operation is not supported (quantized models are not allowed)."


def _resize_bilinear(node: NodeView, t) -> str | None:
    o = node.opts
    if o.get("align_corners") and o.get("half_pixel_centers"):
        return "align_corners and half_pixel_centers cannot both be true."
    return _one_runtime(node, t)


OPS: dict[str, Rule] = {
    **{
        op: Rule(2, (_unary,))
        for op in (
            "ABS",
            "COS",
            "ELU",
            "EXP",
            "FLOOR",
            "GELU",
            "LOG",
            "LOGISTIC",
            "NEG",
            "RSQRT",
            "SIGN",
            "SIN",
            "SQRT",
            "SQUARE",
            "TANH",
        )
    },
    "ADD": Rule(2, (_add,)),
    "ADD_N": Rule(2, (n_inputs(2),)),
    **{
        op: Rule(2, (binary, n_outputs(1)))
        for op in ("POW", "SQUARED_DIFFERENCE", "MAXIMUM", "MINIMUM", "FLOOR_DIV", "FLOOR_MOD")
    },
    "SUB": Rule(2, (binary, n_outputs(1), act)),
    "DIV": Rule(2, (binary, n_outputs(1), act)),
    "MUL": Rule(3, (_mul,)),
    "LOGICAL_AND": Rule(2, (binary,)),
    **{op: Rule(2, (_comparison,)) for op in COMPARISONS},
    "AVERAGE_POOL_2D": Rule(2, (_one_runtime, _pool, act)),
    "MAX_POOL_2D": Rule(2, (_one_runtime, _pool, act)),
    "BATCH_MATMUL": Rule(None, (n_inputs(2), n_outputs(1))),
    "CAST": Rule(None, (_cast,)),
    "CONCATENATION": Rule(2, ()),
    "CONV_2D": Rule(6, (_conv_io, _strides, act)),
    "CUMSUM": Rule(1, (n_inputs(2), n_outputs(1), _axes_const_int32(1))),
    "DENSIFY": Rule(1, (runtime_const((0, 1)), n_outputs(1))),
    "DEPTHWISE_CONV_2D": Rule(6, (_conv_io, _strides, act, _depthwise)),
    "DEPTH_TO_SPACE": Rule(None, (_block,)),
    "DEQUANTIZE": Rule(3, (_quant_allowed, _dequantize)),
    "FULLY_CONNECTED": Rule(9, (_fully_connected,)),
    "GATHER": Rule(1, (_gather,)),
    "HARD_SWISH": Rule(None, (_one_runtime,)),
    "LSTM": Rule(4, (_lstm,)),
    "MEAN": Rule(None, (_mean,)),
    "MIRROR_PAD": Rule(2, (option("mode", lambda m: m == "REFLECT", "Only REFLECT mirror padding"), _pad)),
    "PAD": Rule(2, (_pad,)),
    "PADV2": Rule(2, (_pad,)),
    "ONE_HOT": Rule(1, (_one_hot,)),
    "PACK": Rule(None, ()),
    "PRELU": Rule(1, ()),
    "QUANTIZE": Rule(2, (_quant_allowed, _one_runtime)),
    **{op: Rule(2, ()) for op in ("RELU", "RELU6", "RELU_0_TO_1", "RELU_N1_TO_1", "LEAKY_RELU")},
    **{op: Rule(None, (_mean,)) for op in ("REDUCE_MAX", "REDUCE_MIN", "REDUCE_PROD", "SUM")},
    "RESHAPE": Rule(1, (_one_runtime,)),
    "RESIZE_BILINEAR": Rule(3, (_resize_bilinear,)),
    "RESIZE_NEAREST_NEIGHBOR": Rule(3, (_one_runtime,)),
    "SELECT": Rule(1, (_select,)),
    "SELECT_V2": Rule(1, (_select,)),
    "SLICE": Rule(2, (_slice,)),
    "SOFTMAX": Rule(2, (option("beta", lambda b: b == 1.0, "Softmax beta must be 1"),)),
    "SPACE_TO_DEPTH": Rule(2, (_block,)),
    "SPLIT": Rule(None, (_split,)),
    "SPLIT_V": Rule(None, (_split,)),
    "STRIDED_SLICE": Rule(4, (_strided_slice,)),
    "TILE": Rule(None, (_one_runtime,)),
    "TRANSPOSE": Rule(4, (_one_runtime,)),
    "TRANSPOSE_CONV": Rule(3, (_conv_io, _strides)),
    "UNPACK": Rule(None, ()),
}

# ---- custom ops the GPU delegate knows (custom_initial_data is a raw C struct) ------------------------


def _ints(data: bytes, n: int) -> tuple[int, ...] | None:
    return struct.unpack_from(f"<{n}i", data) if len(data) >= 4 * n else None


def _custom(node: NodeView, _t) -> str | None:
    name, data = node.op.custom_code, node.op.custom_options
    if name == "Convolution2DTransposeBias":
        if node.input(1) is None:
            return "Convolution2DTransposeBias needs weights (input 1)."
        p = _ints(data, 3)  # TfLiteTransposeConvParams: padding, stride_width, stride_height
        return None if p and p[1] > 0 and p[2] > 0 else "Convolution2DTransposeBias strides must be positive."
    if name == "MaxPoolingWithArgmax2D":
        if len(node.runtime_inputs) != 1 or len(node.op.outputs) != 2:
            return "MaxPoolingWithArgmax2D needs 1 runtime input and 2 outputs."
        p = _ints(data, 5)  # TfLitePoolParams: padding, stride_w, stride_h, filter_w, filter_h
        return None if p and min(p[1:5]) > 0 else "Pooling strides and filter must be positive."
    if name == "MaxUnpooling2D":
        if len(node.runtime_inputs) != 2 or len(node.op.outputs) != 1:
            return "MaxUnpooling2D needs 2 runtime inputs and 1 output."
        p = _ints(data, 5)
        return None if p and min(p[1:5]) > 0 else "Unpooling kernel and strides must be positive."
    if name == "Resampler":
        src, warp = node.input(0), node.input(1)
        if len(node.runtime_inputs) != 2 or len(node.op.outputs) != 1:
            return "Resampler needs 2 runtime inputs and 1 output."
        if src.rank != 4 or warp.rank != 4 or src.shape[0] != warp.shape[0] or warp.shape[3] < 2:
            return "Resampler needs 4-D src and warp with the same batch and warp channels >= 2."
        return None
    return f"Custom op '{name}' is not supported."


# ---- tensor type/rank gate (IsAllAllowedTensors) -------------------------------------------------------

_EXTRA_IN = {
    "CAST": {"bool", "int32", "float32"},
    "SELECT": {"bool"},
    "SELECT_V2": {"bool"},
    "LOGICAL_AND": {"bool"},
    "ONE_HOT": {"int32"},
    "GATHER": {"int32"},
}
_EXTRA_OUT = {**{op: {"bool"} for op in COMPARISONS}, "CAST": {"int32", "bool"}, "LOGICAL_AND": {"bool"}}


def _gate(node: NodeView, t: TargetParams) -> str | None:
    base = set(FLOAT) | (set(QUANT8) if t.gpu_allow_quant else set())
    allowed_in = base | _EXTRA_IN.get(node.name, set())
    allowed_out = base | _EXTRA_OUT.get(node.name, set())
    for tensors, allowed in ((node.inputs, allowed_in), (node.outputs, allowed_out)):
        for x in tensors:
            if x is None:
                continue
            if x.rank >= 5:
                return f"OP is supported, but tensor type/shape isn't compatible (rank {x.rank} tensor)."
            if not x.is_const and not x.is_variable and x.dtype not in allowed:
                return f"OP is supported, but tensor type/shape isn't compatible ({x.dtype} tensor)."
    return None


def check(node: NodeView, target: TargetParams) -> str | None:
    """The GPU delegate's decision for one node: None when it takes it, else its reason."""
    if node.name == "CUSTOM":
        reason = _custom(node, target)
    else:
        rule = OPS.get(node.name)
        if rule is None:
            return "Operation is not supported."
        if rule.vmax is not None and node.version > rule.vmax:
            return version_msg(rule.vmax, node.version)
        reason = next((r for c in rule.checks if (r := c(node, target))), None)
    return reason or _gate(node, target)


def build_failure(node: NodeView, target: TargetParams) -> str | None:
    """Failures at delegate build time (Parse/graph transform): all-or-nothing, the CPU plan is restored."""
    for x in node.runtime_inputs + node.outputs:
        if x.dtype in QUANT8 and x.quant is not None and x.quant.per_channel:
            return f"{node.name}: Non-constant per-channel quantized tensor {x.name or x.index}."
    name = node.name
    if name in ("SUB", "DIV", "POW", "SQUARED_DIFFERENCE", "MAXIMUM", "MINIMUM", "FLOOR_DIV", "FLOOR_MOD"):
        ins = node.op.inputs
        if len(ins) == 2 and ins[0] == ins[1]:
            return f"{name}: both inputs are the same tensor."
    if name == "BATCH_MATMUL":
        rhs = node.input(1)
        if rhs is not None and rhs.is_const and rhs.rank != 2:
            return "BATCH_MATMUL: a constant second input must be 2-D."
    if name == "TRANSPOSE":
        perm = node.input(1)
        if perm is not None and perm.numel not in (2, 3, 4):
            return f"TRANSPOSE: permutation of size {perm.numel} is not supported."
    if name == "STRIDED_SLICE":
        s = node.input(3)
        v = s.values() if s is not None else None
        if v is not None and (v <= 0).any():
            return "STRIDED_SLICE: zero or negative (reverse) strides are not supported."
    if name == "FULLY_CONNECTED":
        x, w = node.input(0), node.input(1)
        if x is not None and w is not None and x.shape and w.rank == 2 and x.shape[-1] != w.shape[1]:
            return "FULLY_CONNECTED: input channels differ from the weights' width."
    if name == "DEQUANTIZE":
        x = node.input(0)
        if x is not None and x.dtype != "float16" and x.quant is None:
            return "DEQUANTIZE: input has no quantization parameters."
    return None


def hints(reasons: dict[tuple[int, int], tuple[str, int, str]], target: TargetParams, scheme: str) -> list[str]:
    """Concrete advice from the reasons (keyed by (subgraph, node) -> (op, version, reason))."""
    out: list[str] = []
    for (_sg, _i), (op, version, reason) in reasons.items():
        if reason.startswith("Max version supported"):
            cap = reason.split(":")[1].split(".")[0].strip()
            h = f"GPU: this {op} is version {version}, the delegate takes version {cap}."
            if h not in out:
                out.append(h)
    text = " ".join(r for _, _, r in reasons.values())
    if "quantized models are not allowed" in text or (not target.gpu_allow_quant and "int8 tensor" in text):
        out.append("GPU: enable quantized models (gpu_allow_quant / setQuantizedModelsAllowed), or use float16.")
    elif scheme == "int16x8" and reasons:
        out.append("GPU runs float and 8-bit tensors only: int16x8 stays on the CPU; use float16 or int8.")
    if "rank 5" in text or "rank 6" in text:
        out.append("GPU: tensors of rank 5 or more are not supported; reshape to at most 4-D.")
    if "OpenCL" in text:
        out.append("GPU: without OpenCL, SPLIT/SPLIT_V stay on the CPU (OpenGL backend).")
    return out

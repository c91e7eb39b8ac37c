"""GPU delegate (TfLiteGpuDelegateV2; Metal uses the same GetOpsToReplace): which nodes it takes.

Order per node, as the runtime does it: parser chosen by op (unknown/custom -> "Operation is not
supported."), version cap, the op's IsSupported checks (including gpu_compatibility.cc's shared rules with
standard broadcast), then the tensor type/rank gate (IsAllAllowedTensors). Partitioning uses the FP16
helper; by default only the single largest partition is delegated. A few build-time failures, which make
the whole delegation fail, are checked on the delegated nodes. docs/delegate-rules-audit.md maps every
function here to its upstream lines.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from optimize.core.vocab import Delegate, Scheme
from optimize.delegates.graph import NodeView
from optimize.delegates.rules import (
    FLOAT,
    QUANT8,
    Boundary,
    Finding,
    ModuleRules,
    Policy,
    Reason,
    Rule,
    Verdict,
    activation_in,
    build_detail,
    codes,
    first,
    n_inputs,
    n_outputs,
    option,
    reject,
    runtime_const,
    shape_str,
)
from optimize.delegates.target import TargetParams

SOURCE = (
    "tflite/delegates/gpu/common/model_builder.cc + tflite/tools/versioning/gpu_compatibility.cc "
    "@ LiteRT f67457790c9c (Aug 2026)"
)

ACT_OK = frozenset({"NONE", "RELU", "RELU_N1_TO_1", "RELU6", "TANH", "SIGMOID"})
COMPARISONS = frozenset({"EQUAL", "NOT_EQUAL", "GREATER", "GREATER_EQUAL", "LESS", "LESS_EQUAL"})
_BOOL_CONSUMERS = frozenset({"CAST", "SELECT", "SELECT_V2"})
_TWO_ARGS = COMPARISONS | {
    "SUB",
    "DIV",
    "POW",
    "SQUARED_DIFFERENCE",
    "MAXIMUM",
    "MINIMUM",
    "FLOOR_DIV",
    "FLOOR_MOD",
    "LOGICAL_AND",
}


def policy(target: TargetParams) -> Policy:
    mp = target.gpu_max_partitions
    mp = 1 if mp is None or mp <= 0 else mp
    mn = target.gpu_min_nodes or 0
    return Policy(
        max_partitions=mp,
        min_nodes=mn,
        fp16_helper=True,
        allows_dynamic=False,
        params={
            "max_partitions": mp,
            "min_nodes": mn,
            "allow_quant": target.gpu_allow_quant,
            "opencl": target.gpu_opencl,
        },
    )


def version_verdict(vmax: int, v: int) -> Verdict:
    return reject(Reason.OP_VERSION, f"Max version supported: {vmax}. Requested version {v}.", limit=vmax)


# ---- shared checks (gpu_compatibility.cc) -----------------------------------------------------------

act = activation_in(ACT_OK)


def _io(runtime: int, outputs: int):
    """CheckInputsOutputs: exactly `runtime` runtime inputs and `outputs` outputs."""

    def check(node: NodeView, _t) -> Verdict | None:
        r, o = len(node.runtime_inputs), len(node.op.outputs)
        if r != runtime:
            return reject(Reason.ARITY, f"Expected {runtime} runtime input tensor(s), but node has {r}.")
        if o != outputs:
            return reject(Reason.ARITY, f"Expected {outputs} output tensor(s), but node has {o}.")
        return None

    return check


_one_runtime = _io(1, 1)
_unary = runtime_const((1, 0))
binary = runtime_const((2, 0), (1, 1))


def _one_output(node: NodeView, t) -> Verdict | None:
    return n_outputs(1)(node, t)


def _conv_io(node: NodeView, _t) -> Verdict | None:
    r = len(node.runtime_inputs)
    if r < 1 or r > 2:
        return reject(Reason.ARITY, f"Expected 1 or 2 input tensor(s), but node has {r} runtime inputs.")
    if len(node.op.outputs) != 1:
        return reject(Reason.ARITY, "Expected 1 output tensor(s).")
    if r == 1 and len(node.op.inputs) < 2:
        return reject(Reason.ARITY, "Requested index goes beyond array size: 1 (no weights input).")
    return None


def _strides(node: NodeView, _t) -> Verdict | None:
    o = node.opts
    if o.get("stride_w", 1) <= 0 or o.get("stride_h", 1) <= 0:
        return reject(Reason.OPTION, "Incorrect stride values.")
    if o.get("dilation_w_factor", 1) <= 0 or o.get("dilation_h_factor", 1) <= 0:
        return reject(Reason.OPTION, "Incorrect dilation values.")
    return None


def _pool(node: NodeView, _t) -> Verdict | None:
    o = node.opts
    if o.get("filter_width", 1) <= 0 or o.get("filter_height", 1) <= 0:
        return reject(Reason.OPTION, "Incorrect kernel values.")
    return _strides(node, _t)


def _standard_broadcast(long: tuple[int, ...], short: tuple[int, ...]) -> bool:
    """kStandard: 4-D with batch 1 vs 3-D; 4-D with batch 1 vs [1,1]; or [b,h,w,c] vs [b,c]."""
    if len(long) != 4 or len(short) not in (2, 3):
        return False
    if len(short) == 3:
        return long[0] == 1
    return (long[0] == 1 and short == (1, 1)) or (long[0] == short[0] and long[3] == short[1])


def _broadcast(node: NodeView, _t) -> Verdict | None:
    """CheckAddMulBroadcastCompatibility, kStandard: only when both ranks > 1 and they differ."""
    a, b = node.input(0), node.input(1)
    ra, rb = (a.rank if a else 0), (b.rank if b else 0)
    if ra <= 1 or rb <= 1 or ra == rb:
        return None
    long, short = (a, b) if ra >= rb else (b, a)
    if _standard_broadcast(long.shape, short.shape):
        return None
    return reject(Reason.BROADCAST, f"Doesn't support broadcasting - input0: {shape_str(a)}, input1: {shape_str(b)}.")


def _add(node: NodeView, t) -> Verdict | None:
    if len(node.op.inputs) != 2:
        return reject(Reason.ARITY, "ADD requires two input tensors.")
    return _broadcast(node, t)


def _mul(node: NodeView, t) -> Verdict | None:
    if len(node.op.inputs) != 2:
        return reject(Reason.ARITY, "MUL requires two input tensors.")
    return _broadcast(node, t) or act(node, t)


# ---- runtime-only special cases (model_builder.cc) --------------------------------------------------


def _comparison(node: NodeView, _t) -> Verdict | None:
    """A comparison is taken only when its output has one producer and one consumer, a CAST/SELECT/SELECT_V2
    with a float output (graph outputs are not counted as consumers)."""
    out = node.output(0)
    cons = node.consumers(out) if out is not None else []
    if out is None or len(cons) != 1:
        return reject(Reason.GRAPH, "Not supported logical op case (the bool output must feed exactly one op).")
    c = cons[0]
    c_out = node.sg.tensors[c.outputs[0]] if c.outputs and c.outputs[0] >= 0 else None
    if c.opcode not in _BOOL_CONSUMERS or c_out is None or c_out.dtype not in FLOAT:
        return reject(Reason.GRAPH, "Not supported logical op case (it must feed a CAST/SELECT with a float output).")
    return None


def _bool_cast(node: NodeView) -> Verdict | None | bool:
    """CAST bool -> float: True when the comparison special case takes it, a Verdict when it rejects,
    None to fall through to the shared rule."""
    x, y = node.input(0), node.output(0)
    cons = node.consumers(x)
    if node.producer(x) is None or len(cons) != 1:
        return reject(Reason.GRAPH, "Not supported cast case (the bool input needs one producer and one consumer).")
    if len(node.consumers(y)) != 1:
        return reject(Reason.GRAPH, "Cast from bool not supported for outputs (the float output needs one consumer).")
    return True if node.producer(x).opcode in COMPARISONS else None


def _cast_pair_ok(src: str, dst: str) -> bool:
    return (
        (src == "bool" and dst in FLOAT)
        or (src in FLOAT and dst == "bool")
        or (src in ("float32", "int32") and dst in ("float32", "int32"))
    )


def _cast(node: NodeView, t) -> Verdict | None:
    x, y = node.input(0), node.output(0)
    if x is None or y is None:
        return reject(Reason.ARITY, "CAST needs 1 input and 1 output.")
    if x.dtype == "bool" and y.dtype in FLOAT:
        special = _bool_cast(node)
        if special is True:
            return None
        if special is not None:
            return special
    r = _one_runtime(node, t)
    if r:
        return r
    if _cast_pair_ok(x.dtype, y.dtype):
        return None
    return reject(Reason.TENSOR_TYPE, f"Not supported Cast case. Input type: {x.dtype} and output type: {y.dtype}.")


def _axes_const_int32(index: int):
    def check(node: NodeView, _t) -> Verdict | None:
        t = node.input(index)
        if t is None or not t.is_const:
            return reject(Reason.CONSTANT, f"{node.name} is only supported with constant axes.")
        if t.dtype != "int32":
            return reject(Reason.TENSOR_TYPE, f"{node.name} supports int32 tensor for axes, got {t.dtype}.")
        return None

    return check


def _cumsum(node: NodeView, _t) -> Verdict | None:
    if len(node.op.inputs) != 2 or len(node.op.outputs) != 1:
        return reject(Reason.ARITY, "Expects 2 inputs and 1 output.")
    x, axis, y = node.input(0), node.input(1), node.output(0)
    x_t, y_t = (x.dtype if x else "none"), (y.dtype if y else "none")
    if x_t not in FLOAT or y_t != x_t or axis is None or axis.dtype != "int32" or not axis.is_const:
        return reject(Reason.TENSOR_TYPE, "Input/output must be float type and indices must be constant int32 type.")
    return None


def _depthwise_shapes(node: NodeView) -> Verdict | None:
    x, w, y = node.input(0), node.input(1), node.output(0)
    if x is None or w is None or y is None or x.rank != 4 or w.rank != 4 or y.rank != 4:
        return reject(Reason.TENSOR_RANK, "Input, filter and output must be 4-D.")
    if x.shape[0] != y.shape[0]:
        return reject(Reason.SHAPE, "input.b != output.b")
    if w.shape[3] != y.shape[3]:
        return reject(Reason.SHAPE, "filter.i != output.c")
    if y.shape[3] != x.shape[3] * int(node.opts.get("depth_multiplier", 0)):
        return reject(Reason.SHAPE, "output.c != input.c * depth_multiplier")
    return None


def _depthwise_bias(node: NodeView) -> Verdict | None:
    """bias.size != output.c. An omitted (-1) bias slot still exists in the op signature: a tensor with no
    dimensions, which counts as one element (gpu_compatibility.cc NumElements of an empty dims list)."""
    if len(node.op.inputs) <= 2:
        return None
    b, y = node.input(2), node.output(0)
    size = b.numel if b is not None else 1
    if size != y.shape[3]:
        return reject(Reason.SHAPE, f"bias.size != output.c ({size} vs {y.shape[3]}).")
    return None


def _depthwise(node: NodeView, _t) -> Verdict | None:
    return _depthwise_shapes(node) or _depthwise_bias(node)


def _dequantize(node: NodeView, t: TargetParams) -> Verdict | None:
    if len(node.op.inputs) != 1 or len(node.op.outputs) != 1:
        return reject(Reason.ARITY, "Expected 1 input & output each from Dequantize.")
    x = node.input(0)
    if x is not None and x.dtype == "int16":
        return reject(Reason.TENSOR_TYPE, "Unsupported dequantization type (int16).")
    return None


def _fully_connected(node: NodeView, _t) -> Verdict | None:
    if not node.op.inputs:
        return reject(Reason.ARITY, "Expected at least 1 input.")
    if node.opts.get("weights_format", "DEFAULT") != "DEFAULT":
        return reject(Reason.OPTION, "Unsupported FullyConnected weights format.")
    if len(node.runtime_inputs) > 2:
        return reject(Reason.ARITY, "FullyConnected doesn't support more than 2 runtime inputs.")
    x, y = node.input(0), node.output(0)
    if x is not None and x.is_const:
        return reject(Reason.CONSTANT, "FullyConnected doesn't support constant input.")
    if node.opts.get("keep_num_dims") and (y is None or (x.rank if x else 0) != y.rank):
        return reject(
            Reason.SHAPE, "Input and output dimensions different and FullyConnected doesn't support keep_num_dims."
        )
    return None


def _gather(node: NodeView, t) -> Verdict | None:
    r = binary(node, t) or _one_output(node, t)
    if r:
        return r
    idx = node.input(1)
    if idx is None or idx.rank != 1:
        return reject(Reason.TENSOR_RANK, "Only support 1D indices.")
    return None if idx.dtype == "int32" else reject(Reason.TENSOR_TYPE, "Only accept INT32 indices.")


def _basic_lstm(node: NodeView) -> Verdict | None:
    o = node.opts
    if (len(node.runtime_inputs), len(node.const_inputs)) != (3, 2) or len(node.op.outputs) != 4:
        return reject(Reason.ARITY, "Basic LSTM needs 3 runtime + 2 constant inputs and 4 outputs.")
    out3 = node.output(3)
    if out3 is not None and out3.shape and out3.shape[-1] % 4:
        return reject(Reason.SHAPE, "BasicLSTM activation depth must be a multiple of 4.")
    if o.get("fused_activation_function") != "TANH":
        return reject(Reason.ACTIVATION, "Only TANH activation is supported.")
    if o.get("cell_clip") or o.get("proj_clip"):
        return reject(Reason.OPTION, "cell_clip and proj_clip are not supported.")
    return None


def _lstm(node: NodeView, _t) -> Verdict | None:
    if node.opts.get("kernel_type", "FULL") == "BASIC":
        return _basic_lstm(node)
    if len(node.op.inputs) not in (20, 24):
        return reject(Reason.ARITY, f"Expected 20 or 24 input tensors, but node has {len(node.op.inputs)}.")
    if len(node.op.outputs) != 1:
        return reject(Reason.ARITY, "Expected 1 output tensor.")
    if node.opts.get("fused_activation_function") not in ("SIGMOID", "TANH"):
        return reject(Reason.ACTIVATION, "Only sigmoid or tanh activation is supported.")
    return None


def _reduce(node: NodeView, t) -> Verdict | None:
    return runtime_const((1, 1))(node, t) or _one_output(node, t) or _axes_const_int32(1)(node, t)


def _pad(node: NodeView, t) -> Verdict | None:
    r = _one_runtime(node, t)
    if r:
        return r
    if len(node.op.inputs) < 2:
        return reject(Reason.ARITY, "Requested index goes beyond array size: 1 (no paddings).")
    p = node.input(1)
    shape = p.shape if p is not None else ()
    if len(shape) != 2:
        return reject(Reason.TENSOR_RANK, f"Invalid paddings tensor dimension: expected 2 dim, got {len(shape)} dim.")
    if shape[0] not in (3, 4) or shape[1] != 2:
        return reject(Reason.SHAPE, f"Invalid paddings tensor shape: expected 4x2 or 3x2, got {shape_str(p)}.")
    return None


def _one_hot_indices(idx) -> Verdict | None:
    for i, d in enumerate(idx.shape[:-1]):
        if idx.rank > 3 and i == 0:
            continue
        if d != 1:
            return reject(Reason.SHAPE, f"Unsupported non-singleton dim at {i}.")
    return None


def _one_hot_value(v) -> bool:
    """On/off values: float32, constant, scalar or 1-D of at most one element."""
    return v is not None and v.dtype == "float32" and v.is_const and v.rank <= 1 and not (v.rank and v.shape[0] > 1)


def _one_hot(node: NodeView, _t) -> Verdict | None:
    if len(node.op.inputs) != 4 or len(node.op.outputs) != 1:
        return reject(Reason.ARITY, "Expects 4 inputs and 1 output.")
    idx = node.input(0)
    if idx is None or idx.dtype != "int32":
        return reject(Reason.TENSOR_TYPE, "Indices must be int32 type.")
    axis = node.opts.get("axis", -1)
    if axis != -1 and (not idx.shape or axis != idx.shape[-1]):
        return reject(Reason.OPTION, "Axis must be -1 or last dim.")
    bad_dim = _one_hot_indices(idx)
    if bad_dim:
        return bad_dim
    if not (_one_hot_value(node.input(2)) and _one_hot_value(node.input(3))):
        return reject(Reason.CONSTANT, "On/off tensors must be constant, scalar, float type.")
    return None


def _select_cond(cond, out_shape: tuple[int, ...]) -> bool:
    """The condition broadcasts to the output: right-aligned, each dim equal or 1, rank not above."""
    dims = cond.shape
    offset = len(out_shape) - len(dims)
    if not dims:
        return True
    if offset < 0:
        return False
    return all(d == out_shape[offset + i] or d == 1 for i, d in enumerate(dims))


def _select_branch(v, out_shape: tuple[int, ...]) -> Verdict | None:
    """A branch has the output's shape, or is a scalar / a 1-D tensor of one element; 2-D only when constant."""
    dims = v.shape if v is not None else ()
    if dims and dims != out_shape and (len(dims) > 1 or dims[0] > 1):
        return reject(Reason.SHAPE, "If/else tensors must either be the same shape as output or constant, scalar.")
    if v is not None and not v.is_const and len(dims) == 2:
        return reject(Reason.CONSTANT, "2-D if/else tensor only supported if constant.")
    return None


def _select(node: NodeView, _t) -> Verdict | None:
    if len(node.op.inputs) != 3 or len(node.op.outputs) != 1:
        return reject(Reason.ARITY, "Expected 3 inputs and 1 output.")
    cond, y = node.input(0), node.output(0)
    out_shape = y.shape if y is not None else ()
    if cond is None or cond.dtype not in ("bool", "float16", "float32"):
        return reject(Reason.TENSOR_TYPE, "Cond must be float or bool type.")
    if not _select_cond(cond, out_shape):
        return reject(Reason.BROADCAST, f"Cond {shape_str(cond)} does not broadcast to the output {shape_str(y)}.")
    return _select_branch(node.input(1), out_shape) or _select_branch(node.input(2), out_shape)


def _slice(node: NodeView, _t) -> Verdict | None:
    if len(node.op.inputs) < 3:
        return reject(Reason.ARITY, f"SLICE requires 3 inputs, but node has {len(node.op.inputs)} inputs.")
    x = node.input(0)
    if x is not None and x.rank in (3, 4):
        return None
    return reject(Reason.TENSOR_RANK, "SLICE supports for 3 or 4 dimensional tensors only.")


def _strided_slice(node: NodeView, _t) -> Verdict | None:
    o = node.opts
    for k in ("ellipsis_mask", "new_axis_mask", "shrink_axis_mask"):
        if o.get(k, 0):
            return reject(Reason.OPTION, f"StridedSlice does not support {k}.")
    if len(node.op.inputs) < 4:
        return reject(Reason.ARITY, "STRIDED_SLICE requires 4 inputs.")
    x = node.input(0)
    if x is not None and x.rank in (3, 4):
        return None
    return reject(Reason.TENSOR_RANK, "STRIDED_SLICE supports for 3 or 4 dimensional tensors only.")


def _block(node: NodeView, t) -> Verdict | None:
    r = _one_runtime(node, t)
    if r:
        return r
    return None if node.opts.get("block_size", 0) > 1 else reject(Reason.OPTION, "block_size must be > 1.")


def _split(node: NodeView, t: TargetParams) -> Verdict | None:
    if t.gpu_opencl:
        return None
    return reject(
        Reason.NO_OPENCL, "Operation is not supported (SPLIT/SPLIT_V are excluded when OpenCL is unavailable)."
    )


def _quant_allowed(node: NodeView, t: TargetParams) -> Verdict | None:
    if t.gpu_allow_quant:
        return None
    return reject(Reason.QUANT_DISABLED, "Operation is not supported (quantized models are not allowed).")


def _resize_bilinear(node: NodeView, t) -> Verdict | None:
    r = _one_runtime(node, t)
    if r:
        return r
    o = node.opts
    if o.get("align_corners") and o.get("half_pixel_centers"):
        return reject(Reason.OPTION, "If half_pixel_centers is True, align_corners must be False.")
    return None


def _densify(node: NodeView, t) -> Verdict | None:
    return _io(0, 1)(node, t)


_UNARY = (
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

OPS: dict[str, Rule] = {
    **{op: Rule(2, (_unary, _one_output)) for op in _UNARY},
    "ADD": Rule(2, (_add,)),
    "ADD_N": Rule(2, (n_inputs(2),)),
    **{
        op: Rule(2, (binary, _one_output))
        for op in ("POW", "SQUARED_DIFFERENCE", "MAXIMUM", "MINIMUM", "FLOOR_DIV", "FLOOR_MOD", "LOGICAL_AND")
    },
    "SUB": Rule(2, (binary, _one_output, act)),
    "DIV": Rule(2, (binary, _one_output, act)),
    "MUL": Rule(3, (_mul,)),
    **{op: Rule(2, (_comparison,)) for op in COMPARISONS},
    "AVERAGE_POOL_2D": Rule(2, (_one_runtime, _pool, act)),
    "MAX_POOL_2D": Rule(2, (_one_runtime, _pool, act)),
    "BATCH_MATMUL": Rule(None, (n_inputs(2), n_outputs(1))),
    "CAST": Rule(None, (_cast,)),
    "CONCATENATION": Rule(2, ()),
    "CONV_2D": Rule(6, (_conv_io, _strides, act)),
    "CUMSUM": Rule(1, (_cumsum,)),
    "DENSIFY": Rule(1, (_densify,)),
    "DEPTHWISE_CONV_2D": Rule(6, (_conv_io, _strides, act, _depthwise)),
    "DEPTH_TO_SPACE": Rule(None, (_block,)),
    "DEQUANTIZE": Rule(3, (_quant_allowed, _dequantize)),
    "FULLY_CONNECTED": Rule(9, (_fully_connected,)),
    "GATHER": Rule(1, (_gather,)),
    "HARD_SWISH": Rule(None, (_one_runtime,)),
    "LSTM": Rule(4, (_lstm,)),
    "MEAN": Rule(None, (_reduce,)),
    "MIRROR_PAD": Rule(2, (option("mode", lambda m: m == "REFLECT", "Only Reflective padding is supported"), _pad)),
    "PAD": Rule(2, (_pad,)),
    "PADV2": Rule(2, (_pad,)),
    "ONE_HOT": Rule(1, (_one_hot,)),
    "PACK": Rule(None, ()),
    "PRELU": Rule(1, ()),
    "QUANTIZE": Rule(2, (_quant_allowed, _one_runtime)),
    **{op: Rule(2, ()) for op in ("RELU", "RELU6", "RELU_0_TO_1", "RELU_N1_TO_1", "LEAKY_RELU")},
    **{op: Rule(None, (_reduce,)) for op in ("REDUCE_MAX", "REDUCE_MIN", "REDUCE_PROD", "SUM")},
    "RESHAPE": Rule(1, (_one_runtime,)),
    "RESIZE_BILINEAR": Rule(3, (_resize_bilinear,)),
    "RESIZE_NEAREST_NEIGHBOR": Rule(3, (_one_runtime,)),
    "SELECT": Rule(1, (_select,)),
    "SELECT_V2": Rule(1, (_select,)),
    "SLICE": Rule(2, (_slice,)),
    "SOFTMAX": Rule(2, (option("beta", lambda b: b == 1.0, "Softmax.beta != 1 is not supported"),)),
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

_SIGN_BIT = 5  # TfLiteFusedActivation kTfLiteActSignBit


def _ints(data: bytes, n: int) -> tuple[int, ...] | None:
    return struct.unpack_from(f"<{n}i", data) if len(data) >= 4 * n else None


def _custom_transpose_conv(node: NodeView) -> Verdict | None:
    if len(node.op.inputs) < 2:
        return reject(Reason.ARITY, "Convolution2DTransposeBias needs a weights input (input 1).")
    p = _ints(node.op.custom_options, 3)  # TfLiteTransposeConvParams: padding, stride_width, stride_height
    if p is None:
        return reject(Reason.OPTION, "Unable to retrieve custom_initial_data.")
    return None if p[1] > 0 and p[2] > 0 else reject(Reason.OPTION, "Incorrect stride values.")


def _pool_params(node: NodeView) -> Verdict | None:
    p = _ints(
        node.op.custom_options, 6
    )  # TfLitePoolParams: padding, stride_w, stride_h, filter_w, filter_h, activation
    if p is None:
        return reject(Reason.OPTION, "Unable to retrieve custom_initial_data.")
    if min(p[1:5]) <= 0:
        return reject(Reason.OPTION, "Incorrect kernel or stride values.")
    return None


def _custom_max_pool_argmax(node: NodeView) -> Verdict | None:
    r = _io(1, 2)(node, None) or _pool_params(node)
    if r:
        return r
    act_code = _ints(node.op.custom_options, 6)[5]
    return reject(Reason.ACTIVATION, "TfLiteFusedActivation.kTfLiteActSignBit") if act_code == _SIGN_BIT else None


def _custom_max_unpool(node: NodeView) -> Verdict | None:
    return _io(2, 1)(node, None) or _pool_params(node)


def _custom_resampler(node: NodeView) -> Verdict | None:
    r = _io(2, 1)(node, None)
    if r:
        return r
    src, warp = node.input(0), node.input(1)
    if src.rank != 4 or warp.rank != 4:
        return reject(Reason.TENSOR_RANK, "src or warp dims size != 4")
    if src.shape[0] != warp.shape[0]:
        return reject(Reason.SHAPE, "src.b != warp.b")
    return None if warp.shape[3] >= 2 else reject(Reason.SHAPE, "warp.c < 2")


_CUSTOM = {
    "Convolution2DTransposeBias": _custom_transpose_conv,
    "MaxPoolingWithArgmax2D": _custom_max_pool_argmax,
    "MaxUnpooling2D": _custom_max_unpool,
    "Resampler": _custom_resampler,
}


def _custom(node: NodeView, _t) -> Verdict | None:
    fn = _CUSTOM.get(node.op.custom_code or "")
    if fn is None:
        return reject(Reason.UNSUPPORTED_OP, f"Custom op '{node.op.custom_code}' is not supported.")
    return fn(node)


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


def _gate_tensor(x, allowed: set[str], persistent: frozenset[int]) -> Verdict | None:
    if x.rank >= 5:
        return reject(
            Reason.TENSOR_RANK,
            f"OP is supported, but tensor type/shape isn't compatible (rank {x.rank} tensor).",
            limit=4,
        )
    # Only kTfLiteArenaRw tensors are type-checked: not constants, variables or prepare-time (persistent) values.
    if x.is_const or x.is_variable or x.index in persistent or x.dtype in allowed:
        return None
    return reject(Reason.TENSOR_TYPE, f"OP is supported, but tensor type/shape isn't compatible ({x.dtype} tensor).")


_BASE = {True: FLOAT | QUANT8, False: FLOAT}  # allow_quant: int8/uint8 too


def _gate(node: NodeView, t: TargetParams) -> Verdict | None:
    base = _BASE[t.gpu_allow_quant]
    for tensors, extra in ((node.inputs, _EXTRA_IN), (node.outputs, _EXTRA_OUT)):
        more = extra.get(node.name)
        allowed = base | more if more else base
        for x in tensors:
            v = _gate_tensor(x, allowed, node.persistent) if x is not None else None
            if v:
                return v
    return None


def check(node: NodeView, target: TargetParams) -> Verdict | None:
    """The GPU delegate's decision for one node: None when it takes it, else its verdict."""
    if node.name == "CUSTOM":
        return _custom(node, target) or _gate(node, target)
    rule = OPS.get(node.name)
    if rule is None:
        return reject(Reason.UNSUPPORTED_OP, "Operation is not supported.")
    if rule.vmax is not None and node.version > rule.vmax:
        return version_verdict(rule.vmax, node.version)
    return first(rule.checks, node, target) or _gate(node, target)


# ---- build-time failures (Parse / graph transforms): all-or-nothing, the CPU plan is restored ----------


def _runtime_quant(node: NodeView) -> Verdict | None:
    """Runtime 8-bit tensors are dequantized into the GPU graph: each needs one per-tensor scale."""
    for x in node.runtime_inputs + node.outputs:
        if x.dtype not in QUANT8:
            continue
        if x.quant is None:
            return reject(Reason.QUANTIZATION, f"{node.name}: Tensor not quantized: {x.name or x.index}.")
        if x.quant.per_channel:
            return reject(
                Reason.PER_CHANNEL, f"{node.name}: Non-constant per-channel quantized tensor {x.name or x.index}."
            )
    return None


def _same_inputs(node: NodeView) -> Verdict | None:
    ins = node.op.inputs
    if node.name in _TWO_ARGS and len(ins) == 2 and ins[0] == ins[1] and ins[0] >= 0:
        return reject(Reason.BUILD_FAILURE, f"{node.name}: No support of few identical inputs in the same operation.")
    return None


def _parse_batch_matmul(node: NodeView) -> Verdict | None:
    rhs = node.input(1)
    if len(node.runtime_inputs) == 1 and (rhs is None or not rhs.is_const or rhs.rank != 2):
        return reject(
            Reason.BUILD_FAILURE, "BATCH_MATMUL: Not supported batched mat mul case (constant rhs must be 2-D)."
        )
    return None


def _parse_transpose(node: NodeView) -> Verdict | None:
    perm = node.input(1)
    if perm is not None and perm.numel not in (2, 3, 4):
        return reject(Reason.BUILD_FAILURE, f"TRANSPOSE: Permutation for transpose is invalid (size {perm.numel}).")
    return None


def _parse_strided_slice(node: NodeView) -> Verdict | None:
    s = node.input(3)
    v = s.values() if s is not None else None
    if v is not None and (v <= 0).any():
        return reject(Reason.BUILD_FAILURE, "STRIDED_SLICE: zero or negative (reverse) strides are not supported.")
    return None


def _parse_fully_connected(node: NodeView) -> Verdict | None:
    x, w = node.input(0), node.input(1)
    if len(node.runtime_inputs) == 2 or x is None or w is None or not x.shape or w.rank != 2:
        return None
    if x.shape[-1] != w.shape[1]:
        return reject(Reason.BUILD_FAILURE, "FULLY_CONNECTED: Amount of input channels should match weights width.")
    return None


def _parse_add(node: NodeView) -> Verdict | None:
    if node.opts.get("fused_activation_function") == "SIGN_BIT":
        return reject(Reason.ACTIVATION, "ADD: Unsupported fused activation SIGN_BIT.")
    return None


# CreateVectorCopyData<float> (model_builder_helper.cc:259-281): what a constant read as float data can be.
FLOAT_READABLE = frozenset({"float32", "float16", "int8", "uint8", "int32"})
# ParseInputsWithConstTensor (model_builder.cc:189-220) gives bool and int32 constants readers of their own.
_ELEMENTWISE_READABLE = FLOAT_READABLE | {"bool"}
_DTYPE_WORDS = frozenset({"int4", "int2", "int16", "int64", "uint16", "uint32", "uint64", "float64", "bfloat16"})
_CONST_OPERAND = _TWO_ARGS | {"ADD", "MUL"}  # IsTwoArgumentOperationWithConst (model_builder.cc:1256-1279)
_WEIGHTS_AT_1 = frozenset({"CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED", "TRANSPOSE_CONV", "BATCH_MATMUL"})


def _float_read(node: NodeView) -> list:
    """The constants the node's parser reads as float data (weights, constant operands, concatenated values)."""
    name = node.name
    if name in _WEIGHTS_AT_1 or (name == "CUSTOM" and node.op.custom_code == "Convolution2DTransposeBias"):
        w = node.input(1)
        return [w] if w is not None and w.is_const and len(node.runtime_inputs) == 1 else []
    if name in ("CONCATENATION", "PACK", "PRELU") or (name == "DEQUANTIZE" and not node.runtime_inputs):
        return node.const_inputs
    if name in _CONST_OPERAND and len(node.const_inputs) == 1 and len(node.runtime_inputs) == 1:
        return node.const_inputs
    return []


def _parse_constants(node: NodeView) -> Verdict | None:
    """A constant of a type the float reader cannot convert (int4, int16, int64, ...) fails the parse: the type
    gate only checks arena tensors, so such a node is accepted and then fails the whole delegation."""
    readable = _ELEMENTWISE_READABLE if node.name in _CONST_OPERAND else FLOAT_READABLE
    for x in _float_read(node):
        if x.dtype not in readable:
            return reject(
                Reason.TENSOR_TYPE,
                f"{node.name}: Unsupported data type for float32 tensor ({x.dtype} constant {x.name or x.index}).",
                detail=x.dtype,
            )
    return None


def _bhwc(shape: tuple[int, ...]) -> tuple[int, int, int, int] | None:
    """ExtractTensorShape (model_builder_helper.cc:97-121): rank 1 B, 2 BC, 3 BWC, 4 BHWC."""
    r = len(shape)
    if r == 1:
        return (shape[0], 1, 1, 1)
    if r == 2:
        return (shape[0], 1, 1, shape[1])
    if r == 3:
        return (shape[0], 1, shape[1], shape[2])
    return tuple(shape) if r == 4 else None


def _parse_conv(node: NodeView) -> Verdict | None:
    """Runtime weights must have the input's channels: grouped convolution needs constant weights."""
    if len(node.runtime_inputs) != 2:
        return None
    x, w = _bhwc(node.input(0).shape), _bhwc(node.input(1).shape)
    if x is not None and w is not None and x[3] != w[3]:
        return reject(Reason.SHAPE, "CONV_2D: No support of CONVOLUTION_2D with runtime grouped weights.")
    return None


def _parse_transpose_conv(node: NodeView) -> Verdict | None:
    """With a non-constant output shape there are two runtime inputs, and the parser then reads input 1 (the
    constant weights) as a runtime value, which fails."""
    w = node.input(1)
    if len(node.runtime_inputs) == 2 and w is not None and w.is_const:
        return reject(
            Reason.CONSTANT,
            "TRANSPOSE_CONV: ReadNonConstantTensor: value is a constant tensor (the output shape is not a "
            "constant, so the constant weights are read as a runtime input).",
        )
    return None


def _concat_axis_ok(shapes: list[tuple[int, int, int, int]]) -> bool:
    """ConcatenationOperationParser::SetAxis, as written: it fails only when every axis is ruled out."""
    s0 = shapes[0]

    def differ(a: int, b: int, c: int) -> bool:
        return any(s[a] != s0[a] and s[b] != s0[b] and s[c] != s0[c] for s in shapes[1:])

    return not differ(1, 2, 3) or not differ(0, 2, 3) or not differ(0, 1, 3) or not differ(0, 2, 1)


def _parse_concat(node: NodeView) -> Verdict | None:
    """Constant inputs become 4-D float tensors (others fail); the inputs must differ along one axis only."""
    if node.name == "PACK" and len(node.inputs) < 2:
        return None  # a one-input PACK becomes a RESHAPE
    for x in node.const_inputs:
        if x.rank != 4:
            return reject(
                Reason.TENSOR_RANK,
                f"{node.name}: Expected a 4D tensor of shape BxHxWxC but got {shape_str(x)} (constant input).",
            )
    if node.name == "PACK":
        return None
    shapes = [_bhwc(x.shape) for x in node.inputs if x is not None]
    if len(shapes) > 1 and None not in shapes and not _concat_axis_ok(shapes):
        return reject(Reason.SHAPE, "CONCATENATION: Can concatenate tensors only by batch, height, width, or channels.")
    return None


_PARSE = {
    "ADD": _parse_add,
    "BATCH_MATMUL": _parse_batch_matmul,
    "CONCATENATION": _parse_concat,
    "CONV_2D": _parse_conv,
    "PACK": _parse_concat,
    "TRANSPOSE": _parse_transpose,
    "TRANSPOSE_CONV": _parse_transpose_conv,
    "STRIDED_SLICE": _parse_strided_slice,
    "FULLY_CONNECTED": _parse_fully_connected,
}


def build_failure(node: NodeView, target: TargetParams, boundary: Boundary | None = None) -> Verdict | None:
    """Failures at delegate build time (Parse/graph transform): all-or-nothing, the CPU plan is restored."""
    parse = _PARSE.get(node.name)
    return _runtime_quant(node) or _same_inputs(node) or _parse_constants(node) or (parse(node) if parse else None)


def hints(findings: Sequence[Finding], target: TargetParams, scheme: str) -> list[str]:
    """Concrete advice keyed on the verdicts' reason codes."""
    out: list[str] = []
    for f in findings:
        if f.verdict.code is Reason.OP_VERSION:
            h = f"GPU: this {f.op} is version {f.version}, the delegate takes version {f.verdict.limit}."
            if h not in out:
                out.append(h)
    found = codes(findings)
    if Reason.QUANT_DISABLED in found or (not target.gpu_allow_quant and scheme in (Scheme.INT8, Scheme.INT16X8)):
        out.append("GPU: enable quantized models (gpu_allow_quant / setQuantizedModelsAllowed), or use float16.")
    elif scheme == Scheme.INT16X8 and findings:
        out.append("GPU runs float and 8-bit tensors only: int16x8 stays on the CPU; use float16 or int8.")
    if any(f.verdict.code is Reason.TENSOR_RANK and f.verdict.limit == 4 for f in findings):
        out.append("GPU: tensors of rank 5 or more are not supported; reshape to at most 4-D.")
    if Reason.NO_OPENCL in found:
        out.append("GPU: without OpenCL, SPLIT/SPLIT_V stay on the CPU (OpenGL backend).")
    return out + _integer_input_hints(findings) + _build_hints(findings)


#: Ops that pick rows of a table by integer ids (a text model's embedding).
LOOKUPS = ("EMBEDDING_LOOKUP", "GATHER", "GATHER_ND")


def _integer_input_hints(findings: Sequence[Finding]) -> list[str]:
    """What keeps a text or recommender model (integer token ids, an integer attention mask) off the GPU, and
    the fix: the delegate computes in float, and refuses the integer-to-bool CAST of a mask and the lookups of
    an embedding table by integer ids."""
    out = []
    masks = [f for f in findings if f.op == "CAST" and "output type: bool" in f.verdict.text]
    if masks:
        f = masks[0]
        out.append(
            f"GPU: #{f.index} CAST turns an integer mask into bool ({f.verdict.text.split('. ', 1)[-1].rstrip('.')}), "
            "which the GPU refuses; it takes a float32 mask: give the model its attention mask as float32 (0/1), "
            "whose CAST to bool, or comparison feeding a SELECT, runs on the GPU."
        )
    lookups = [f for f in findings if f.op in LOOKUPS and f.verdict.code is not Reason.PARTITION_LIMIT]
    if lookups:
        f = lookups[0]
        out.append(
            f"GPU: #{f.index} {f.op} looks up an embedding table by integer ids ({f.verdict.text.rstrip('.')}), "
            "which stays on the CPU: look the embeddings up on the CPU and give the model them as a float input, "
            "so the encoder runs on the GPU in one partition."
        )
    return out


def _build_hints(findings: Sequence[Finding]) -> list[str]:
    dtype = build_detail(findings)
    if dtype not in _DTYPE_WORDS:
        return []
    return [
        f"GPU: the delegate reads constant weights as float and cannot convert {dtype}: for the GPU use "
        "float16, dynamic (int8 weights) or int8; int4 weights are for the CPU (XNNPACK)."
    ]


RULES = ModuleRules(Delegate.GPU, SOURCE, policy, check, build_failure=build_failure, hints=hints)

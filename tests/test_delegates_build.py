"""The second stage (issue 21): nodes the node rules accept that fail the delegate while it builds its graph.

When a delegate kernel fails Init/Prepare, the runtime restores the original execution plan and the whole
model runs on the CPU (LiteRT f67457790c9c `tflite/core/subgraph.cc:2507-2515`). Each test builds the
smallest graph that reaches one build-time failure, cites the LiteRT lines (at that commit) that decide it,
and asserts the exact whole-delegation outcome: verdict none, the failing node named, and how many nodes the
delegate would otherwise have taken. Graphs the interpreter can run are loaded in it too.
"""

from __future__ import annotations

import numpy as np
import pytest
from delegate_fixtures import op, tensor, tiny

from optimize.delegates import TargetParams, check_delegates, format_report, rules_for
from optimize.delegates.apply_rules import boundary
from optimize.delegates.graph import NodeView
from optimize.delegates.overlay import LOST, RED, node_data
from optimize.delegates.rules import Reason
from optimize.models import runtime
from optimize.models.tflite import read_model

F32 = "float32"


def loads(data: bytes) -> None:
    runtime.load(data, xnnpack=False).interpreter.invoke()


def built(report) -> tuple[str, str, int | None]:
    """(verdict, veto code, nodes the first stage would have delegated) of a report."""
    return report.verdict, report.veto_code, report.nodes_delegated


def culprit(report) -> tuple[int, str, str]:
    (v,) = [v for v in report.cpu_nodes if v.code == Reason.BUILD_FAILURE]
    return v.index, v.op, v.reason


def node(data: bytes, i: int = 0) -> NodeView:
    sg = read_model(data).main
    return NodeView(sg, sg.ops[i])


# ---- GPU ---------------------------------------------------------------------------------------------


def _fc_int4() -> bytes:
    """FULLY_CONNECTED with channel-wise int4 weights and float activations: what the int4 scheme makes."""
    w = np.random.default_rng(0).integers(-7, 8, (4, 8))
    tensors = [tensor([1, 8]), tensor([4, 8], "int4", w, quant=([0.1, 0.2, 0.3, 0.4], [0, 0, 0, 0])), tensor([1, 4])]
    ops = [op("FULLY_CONNECTED", [0, 1, -1], [2], ("FullyConnectedOptions", {}))]
    return tiny(tensors, ops, [0], [2])


def test_gpu_int4_weights_fail_the_float_reader():
    """gpu/common/model_builder.cc:66-71 (GetFullyConnectedAttributes, called at :1356) reads the weights
    through ObjectReader::ReadTensor (object_reader.h:66-121) into float, and CreateVectorCopyData<float>
    (model_builder_helper.cc:259-281) converts only float32, float16, int8, uint8 and int32: int4 returns
    "Unsupported data type for float32 tensor". The type gate (model_builder.cc:3055-3077) checks only
    arena tensors, so the node was accepted; the failed Parse fails the whole delegation."""
    data = _fc_int4()
    loads(data)
    gpu = check_delegates(data, ["gpu"])["gpu"]
    assert built(gpu) == ("none", Reason.BUILD_FAILURE, 0)
    assert "would take 1 of 1 nodes" in gpu.vetoed and "int4 constant" in gpu.vetoed
    assert culprit(gpu)[:2] == (0, "FULLY_CONNECTED")
    assert any("int4" in h for h in gpu.hints)


def test_gpu_constant_operand_readers():
    """ParseInputsWithConstTensor (model_builder.cc:189-220) reads a bool or int32 constant operand with its own
    reader and anything else as float (model_builder_helper.cc:259-281): an int16 constant fails, a bool one
    does not. (The interpreter would not run a float LESS against int16; the rule is exercised on its own.)"""
    gpu = rules_for("gpu")
    for dtype, fails in (("int16", True), ("bool", False), ("int32", False), ("float16", False)):
        tensors = [tensor([1, 4], dtype), tensor([4], dtype, np.ones(4)), tensor([1, 4], "bool")]
        v = gpu.build_failure(node(tiny(tensors, [op("LESS", [0, 1], [2])], [0], [2])), TargetParams(), None)
        assert (v is not None) == fails, dtype


def test_gpu_concatenation_constant_must_be_4d():
    """ConcatenationOperationParser::Parse reads a constant input into a TensorFloat32 (model_builder.cc:
    512-514), whose BHWC shape needs exactly 4 dimensions (model_builder_helper.cc:367-372): a [1,4] constant
    fails the build. The same constant as a 4-D tensor is fine."""
    for shape, fails in (([1, 4], True), ([1, 1, 1, 4], False)):
        x = tensor(shape)
        c = tensor(shape, data=np.ones(shape, np.float32))
        out = tensor(shape[:-1] + [8])
        opts = ("ConcatenationOptions", {"axis": len(shape) - 1})
        data = tiny([x, c, out], [op("CONCATENATION", [0, 1], [2], opts)], [0], [2])
        loads(data)
        gpu = check_delegates(data, ["gpu"])["gpu"]
        assert (gpu.veto_code == Reason.BUILD_FAILURE) == fails, shape
        if fails:
            assert "Expected a 4D tensor of shape BxHxWxC but got [1,4]" in gpu.vetoed


def test_gpu_concatenation_axis_as_set_axis_computes_it():
    """ConcatenationOperationParser::SetAxis (model_builder.cc:573-612) fails only when each axis is ruled out
    (:603-610, "Can concatenate tensors only by batch, height, width, or channels."). The interpreter never
    prepares such a model (concatenation.cc:202-213 requires the other dimensions equal), so the rule is checked
    on the flatbuffer alone: inputs differing in all four dimensions fail, inputs differing in one do not."""
    gpu = rules_for("gpu")
    for other, fails in (([2, 3, 5, 7], True), ([1, 2, 3, 9], False)):
        tensors = [tensor([1, 2, 3, 4]), tensor(other), tensor([3, 5, 8, 11])]
        ops = [op("CONCATENATION", [0, 1], [2], ("ConcatenationOptions", {"axis": 3}))]
        v = gpu.build_failure(node(tiny(tensors, ops, [0, 1], [2])), TargetParams(), None)
        assert (v is not None and v.code == Reason.SHAPE) == fails, other


def _conv_runtime_weights(groups: int) -> bytes:
    tensors = [tensor([1, 6, 6, 4]), tensor([8, 3, 3, 4 // groups]), tensor([1, 6, 6, 8])]
    tensors.append(tensor([8], F32, np.zeros(8, np.float32)))
    opts = ("Conv2DOptions", {"padding": 0, "strideW": 1, "strideH": 1})
    return tiny(tensors, [op("CONV_2D", [0, 1, 3], [2], opts)], [0, 1], [2])


def test_gpu_conv_with_runtime_grouped_weights():
    """Conv2DOperationParser::Parse (model_builder.cc:631-644): with two runtime inputs, weights whose input
    channels differ from the input's (a grouped convolution) fail "No support of CONVOLUTION_2D with runtime
    grouped weights."; IsSupported allows 1-2 runtime inputs (gpu_compatibility.cc:171-188), so the node was
    accepted. Ungrouped runtime weights build. (The interpreter runs both.)"""
    loads(_conv_runtime_weights(2))
    grouped = check_delegates(_conv_runtime_weights(2), ["gpu"])["gpu"]
    assert built(grouped) == ("none", Reason.BUILD_FAILURE, 0)
    assert "runtime grouped weights" in grouped.vetoed
    assert check_delegates(_conv_runtime_weights(1), ["gpu"])["gpu"].verdict == "full"


def test_gpu_transpose_conv_with_runtime_output_shape():
    """TransposeConvBuiltinOperationParser::Parse (model_builder.cc:2715-2717): with a non-constant output shape
    there are two runtime inputs, so AddInput(node, 1) reads the constant weights as a runtime value and
    ReadNonConstantTensor fails ("value is a constant tensor", object_reader.cc:45-48). Through the whole check
    the dynamic-tensor veto comes first: transpose_conv.cc:401-403 makes the output dynamic when the output
    shape is not a constant, and the GPU delegate does not allow dynamic tensors (core/subgraph.cc:2538-2552).
    Both say: nothing runs on the GPU."""
    w = np.full((2, 3, 3, 2), 0.1, np.float32)
    tensors = [tensor([1, 4, 4, 2]), tensor([4], "int32"), tensor([2, 3, 3, 2], data=w), tensor([1, 4, 4, 2])]
    opts = ("TransposeConvOptions", {"padding": 0, "strideW": 1, "strideH": 1})
    data = tiny(tensors, [op("TRANSPOSE_CONV", [1, 2, 0], [3], opts)], [0, 1], [3])
    v = rules_for("gpu").build_failure(node(data), TargetParams(), None)
    assert v is not None and "ReadNonConstantTensor: value is a constant tensor" in v.text
    assert check_delegates(data, ["gpu"])["gpu"].veto_code == Reason.DYNAMIC_TENSOR


# ---- NNAPI -------------------------------------------------------------------------------------------


def _pad(name: str, paddings_dtype: str) -> bytes:
    p = np.array([[0, 0], [1, 1], [1, 1], [0, 0]])
    tensors = [tensor([1, 4, 4, 2]), tensor([4, 2], paddings_dtype, p), tensor([1, 6, 6, 2])]
    inputs = [0, 1]
    opts = ("MirrorPadOptions", {"mode": 0}) if name == "MIRROR_PAD" else None
    if name == "PADV2":
        tensors.append(tensor([1], F32, [0.0]))
        inputs.append(3)
    return tiny(tensors, [op(name, inputs, [2], opts)], [0], [2])


@pytest.mark.parametrize("name", ["PAD", "PADV2", "MIRROR_PAD"])
def test_nnapi_int64_paddings_fail_add_tensor(name):
    """TFLite's pad kernels take int64 paddings (pad.cc:306-313, mirror_pad.cc:143-144). NNAPI's Validate
    (nnapi_delegate.cc:2898-2931, 3621-3640) does not look at them, but AddOpsAndTensors adds the paddings with
    AddTensorInput (:6187-6189; only PAD's pad value has its own path, :5924-5978), and AddTensor's type switch
    (:1815-1904) has no int64 case: "Failed to add NN API tensor: type INT64 is not supported." fails the
    whole NNAPI delegation. int32 paddings build."""
    target = TargetParams(android_api=34)  # MIRROR_PAD needs feature level 7
    data = _pad(name, "int64")
    loads(data)
    nn = check_delegates(data, ["nnapi"], target=target)["nnapi"]
    assert built(nn) == ("none", Reason.BUILD_FAILURE, 0)
    assert "type INT64 is not supported" in nn.vetoed and culprit(nn)[1] == name
    assert check_delegates(_pad(name, "int32"), ["nnapi"], target=target)["nnapi"].verdict == "full"


def test_nnapi_int4_weights_fail_add_tensor():
    """An int4 FULLY_CONNECTED is not hybrid for NNAPI (IsHybridOperator wants 8-bit weights, nnapi_delegate.cc:
    386-433) and Validate checks no weight type from NNAPI 1.2 (:2555-2578); AddTensor (:1815-1904) then has no
    int4 case, so the int4 scheme's models build on no NNAPI device."""
    nn = check_delegates(_fc_int4(), ["nnapi"])["nnapi"]
    assert built(nn) == ("none", Reason.BUILD_FAILURE, 0) and "type INT4 is not supported" in nn.vetoed


def _scaled(kind: str, w_scales, out_quant) -> bytes:
    """A uint8 DEPTHWISE_CONV_2D or FULLY_CONNECTED with the given filter scales and output quantization."""
    x = tensor([1, 2, 2, 2] if kind == "dw" else [1, 4], "uint8", quant=([0.5], [128]))
    shape = [1, 1, 1, 2] if kind == "dw" else [2, 4]
    w = tensor(shape, "uint8", np.full(shape, 130), quant=(w_scales, [128] * len(w_scales), 3 if kind == "dw" else 0))
    b = tensor([2], "int32", [0, 0])
    y = tensor([1, 2, 2, 2] if kind == "dw" else [1, 2], "uint8", quant=out_quant)
    if kind == "dw":
        opts = ("DepthwiseConv2DOptions", {"padding": 0, "strideW": 1, "strideH": 1, "depthMultiplier": 1})
        o = op("DEPTHWISE_CONV_2D", [0, 1, 2], [3], opts)
    else:
        o = op("FULLY_CONNECTED", [0, 1, 2], [3], ("FullyConnectedOptions", {}))
    return tiny([x, w, b, y], [o], [0], [3])


def test_nnapi_restricted_scales_read_the_legacy_scale():
    """ExpectIsRestrictedScalesCompliant (nnapi_delegate.cc:2220-2234), before NNAPI 1.2 with uint8 input
    (:2511-2515, 2538-2543, 2567-2571), compares TfLiteTensor.params.scale: GetLegacyQuantization
    (core/subgraph.cc:145-170) sets it only for exactly one scale, 0 otherwise. A per-channel filter therefore
    reads 0 and passes (old rules used its first scale, 4.0, and refused); a missing output quantization reads
    0 and fails (old rules passed it). These are Validate's verdicts on the flatbuffer: TFLite's own kernels
    would not prepare either graph (per-channel needs int8, kernel_util.cc:240; an unquantized uint8 output
    has no scale), but models from other converters reach NNAPI's Validate first."""
    api28 = TargetParams(android_api=28)
    per_channel = _scaled("dw", [4.0, 0.01], ([1.0], [128]))
    assert check_delegates(per_channel, ["nnapi"], target=api28)["nnapi"].verdict == "full"
    for kind in ("dw", "fc"):
        unquantized = check_delegates(_scaled(kind, [0.1], None), ["nnapi"], target=api28)["nnapi"]
        assert [(v.code, v.reason) for v in unquantized.cpu_nodes] == [
            (Reason.QUANTIZATION, "When using NN API version 1.0 or 1.1, input_scale * filter_scale < output_scale.")
        ], kind
        assert check_delegates(_scaled(kind, [0.1], ([1.0], [128])), ["nnapi"], target=api28)["nnapi"].verdict == (
            "full"
        )


# ---- Core ML -----------------------------------------------------------------------------------------


def _pad_relu(paddings, dtype: str) -> bytes:
    p = np.array(paddings)
    out = [1, 4 + p[1].sum(), 4 + p[2].sum(), 2]
    tensors = [tensor([1, 4, 4, 2]), tensor([4, 2], dtype, p), tensor(out), tensor(out)]
    return tiny(tensors, [op("PAD", [0, 1], [2]), op("RELU", [2], [3])], [0], [3])


def test_coreml_reads_int64_paddings_as_int32():
    """IsPadOpSupported (coreml/builders/pad_op_builder.cc:100-131) reads the paddings with
    GetTensorData<int32_t> (:116) and checks words 0-1 (batch) and 6-7 (channel). int64 paddings
    [[0,0],[1,1],[1,1],[0,0]] are the words 0,0,0,0,1,0,1,0 ...: word 6 is the low half of the height padding,
    so the node is refused as "channel padding". Where the misread passes ([[0,0],[1,0],[1,0],[0,0]]), the layer
    would be built from the same wrong words (SetPadding, :50-59): refused too (a deliberate difference). int32
    paddings are delegated."""
    same = [[0, 0], [1, 1], [1, 1], [0, 0]]
    data = _pad_relu(same, "int64")
    loads(data)
    cm = check_delegates(data, ["coreml"])["coreml"]
    assert (
        cm.cpu_nodes[0].reason
        == "Padding for channel dimension is not supported in PAD (int64 paddings read as int32)."
    )
    passes = check_delegates(_pad_relu([[0, 0], [1, 0], [1, 0], [0, 0]], "int64"), ["coreml"])["coreml"]
    assert (passes.cpu_nodes[0].code, passes.verdict) == (Reason.TENSOR_TYPE, "none")
    assert check_delegates(_pad_relu(same, "int32"), ["coreml"])["coreml"].verdict == "full"


def test_coreml_partition_tensors_above_rank_4_fail_build_model():
    """RELU and TANH pass IsNodeSupportedByDelegate with any rank (coreml_delegate.mm:123-125, 144-146);
    BuildModel (coreml_delegate_kernel.mm:121-178, called by Init at :69) then describes each partition output
    (AddOutputTensors, :97-119, called at :154) and each partition input it uses (:156-166) through GetDims
    (:30-42), which fails above rank 4 (:32-34): the delegate kernel fails to initialize."""
    shape = [1, 2, 3, 4, 5]
    data = tiny([tensor(shape), tensor(shape), tensor(shape)], [op("RELU", [0], [1]), op("TANH", [1], [2])], [0], [2])
    loads(data)
    cm = check_delegates(data, ["coreml"])["coreml"]
    assert built(cm) == ("none", Reason.BUILD_FAILURE, 0) and "would take 2 of 2 nodes" in cm.vetoed
    assert culprit(cm)[:2] == (0, "RELU") and "rank 5" in cm.vetoed
    b = boundary(read_model(data).main, [0, 1])
    assert (b.inputs, b.outputs) == ({0}, {2})


# ---- Hexagon -----------------------------------------------------------------------------------------


def _hexagon(kind: str) -> bytes:
    """conv: CONV_2D whose int8 weights are a graph input -> ADD. argmax: ADD -> ARG_MAX whose axis is SHAPE(t),
    a prepare-time (persistent) value, so the output stays static (arg_min_max.cc:136-140) but the axis is not
    a kTfLiteMmapRo constant."""
    q = ([0.05], [0])
    x = tensor([1, 4, 4, 2], "int8", quant=q)
    if kind == "conv":
        w = tensor([2, 1, 1, 2], "int8", quant=q)
        opts = ("Conv2DOptions", {"padding": 0, "strideW": 1, "strideH": 1})
        tensors = [x, w, tensor([2], "int32", [0, 0]), tensor([1, 4, 4, 2], "int8", quant=q)]
        tensors.append(tensor([1, 4, 4, 2], "int8", quant=q))
        ops = [op("CONV_2D", [0, 1, 2], [3], opts), op("ADD", [3, 3], [4], ("AddOptions", {}))]
        return tiny(tensors, ops, [0, 1], [4])
    tensors = [x, tensor([3]), tensor([1], "int32"), tensor([1, 4, 4, 2], "int8", quant=q), tensor([1, 4, 4], "int32")]
    ops = [
        op("SHAPE", [1], [2], ("ShapeOptions", {"outType": 2})),
        op("ADD", [0, 0], [3], ("AddOptions", {})),
        op("ARG_MAX", [3, 2], [4], ("ArgMaxOptions", {"outputType": 2})),
    ]
    return tiny(tensors, ops, [0, 1], [4])


@pytest.mark.parametrize("kind", ["conv", "argmax"])
def test_hexagon_builders_need_constants(kind):
    """IsNodeSupportedByHexagon checks only input types for CONV_2D (hexagon/utils.cc:299-312) and ARG_MAX
    (:383-386); the builders then need constants: Conv2dOpBuilder::InitializeWeightsNodes fails on weights that
    are not kTfLiteMmapRo (hexagon/builders/conv_2d_helpers.cc:229-233, called from conv_2d_builder.cc:421-422),
    ArgMinMaxOpBuilder on a runtime axis (arg_min_max_builder.cc:41-45). PopulateSubGraph's failure
    (hexagon_delegate_kernel.cc:281-282) fails the whole Hexagon graph."""
    data = _hexagon(kind)
    if kind == "argmax":
        loads(data)
    hx = check_delegates(data, ["hexagon"])["hexagon"]
    assert built(hx) == ("none", Reason.BUILD_FAILURE, 0) and "would take 2 of" in hx.vetoed
    assert "doesn't have correct allocation type" in hx.vetoed


# ---- the whole-delegation effect, shown -------------------------------------------------------------


def test_build_failure_is_shown_as_a_whole_delegation_effect():
    """compat prints the failure on a line of its own; the Model Explorer overlay marks the failing node, marks
    the nodes lost with the delegation in a colour of their own, and keeps the node rules' reasons elsewhere.
    FULLY_CONNECTED (int4 weights) -> RELU -> LOG_SOFTMAX: the GPU has no LOG_SOFTMAX parser."""
    w = np.random.default_rng(0).integers(-7, 8, (4, 8))
    tensors = [tensor([1, 8]), tensor([4, 8], "int4", w, quant=([0.1] * 4, [0] * 4)), tensor([1, 4])]
    tensors += [tensor([1, 4]), tensor([1, 4])]
    ops = [
        op("FULLY_CONNECTED", [0, 1, -1], [2], ("FullyConnectedOptions", {})),
        op("RELU", [2], [3]),
        op("LOG_SOFTMAX", [3], [4]),
    ]
    data = tiny(tensors, ops, [0], [4])
    loads(data)
    gpu = check_delegates(data, ["gpu"])["gpu"]
    text = format_report({"gpu": gpu})
    assert "  build fails at #0 FULLY_CONNECTED v1 (the whole delegation): The delegate would take 2 of 3" in text
    assert "vetoed:" not in text
    results = node_data(gpu, read_model(data))["main"]["results"]
    assert results["0"]["value"].startswith("cpu: build-failure: Accepted node by node, but fails the delegate's")
    assert results["1"]["value"].startswith("cpu: build-failure: accepted, lost with the delegation (#0 FULLY")
    assert results["1"]["bgColor"] == LOST and results["0"]["bgColor"] == RED
    assert results["2"]["value"] == "cpu: unsupported-op: Operation is not supported."


def test_the_sweep_table_marks_a_build_failure():
    """The sweep's delegate cell shows 0/N with a '!' (legend: the delegate would fail building its graph), and
    the Markdown/HTML report says the whole model stays on the CPU."""
    from types import SimpleNamespace

    from optimize.present.report import _cell_text
    from optimize.present.report_text import _delegate_cell

    gpu = check_delegates(_fc_int4(), ["gpu"])["gpu"]
    assert _delegate_cell(SimpleNamespace(delegates={"gpu": gpu}), "gpu") == "[red]0/1![/red]"
    assert _cell_text(gpu) == "none (build fails: the whole model on the CPU): 0/1 nodes, 0 partitions"

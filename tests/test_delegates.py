"""Delegate rules on tiny converted models. Expected verdicts follow the delegates' source logic (noted
per test), not this package's output."""

from __future__ import annotations

import struct

import pytest
from delegate_fixtures import (
    drop_input,
    empty_graph,
    make_custom,
    models_fixture,  # noqa: F401  (the session fixture `models`)
    per_channel_activation,
    set_version,
    unknown_builtin,
)
from pydantic import ValidationError

from optimize.core.errors import ModelError, OptimizeError
from optimize.delegates import DELEGATES, SOURCE_CONFLICTS, TargetParams, check_delegates, format_report
from optimize.delegates.conflicts import NNAPI_FLOAT16
from optimize.delegates.rules import Reason
from optimize.models.tflite import read_model

RULES = ("gpu", "nnapi", "hexagon", "coreml")


def reasons(report) -> dict[str, str]:
    return {v.op: v.reason for v in report.cpu_nodes}


# ---- sanity across delegates -------------------------------------------------------------------------


def codes(report) -> list[tuple[str, str]]:
    """(op, reason code) of every node left on the CPU, in order."""
    return [(v.op, v.code) for v in report.cpu_nodes]


def test_float32_convnet(models):
    r = check_delegates(models["float32"], RULES)
    # Every op of the graph is in the GPU and NNAPI tables with satisfied constraints.
    assert (r["gpu"].verdict, r["gpu"].nodes_delegated, r["gpu"].partitions) == ("full", 7, 1)
    assert (r["nnapi"].verdict, r["nnapi"].nodes_delegated, r["nnapi"].partitions) == ("full", 7, 1)
    # Hexagon: no float op matches its 8-bit input type lists (hexagon/utils.cc InputsWithCorrectTypes).
    assert r["hexagon"].verdict == "none" and {c for _, c in codes(r["hexagon"])} == {Reason.TENSOR_TYPE}
    assert r["hexagon"].hints == ["Hexagon needs 8-bit: use int8 (full integer quantization)."]
    # Core ML: MEAN needs keep_dims (GlobalAveragePooling has none) -> 2 partitions around it.
    cm = r["coreml"]
    assert (cm.verdict, cm.nodes_delegated, cm.partitions) == ("partial", 6, 2)
    assert codes(cm) == [("MEAN", Reason.OPTION)] and "keep_dims" in reasons(cm)["MEAN"]
    assert [x.rules_version.split(" ")[0] for x in r.values()] == [
        "tflite/delegates/gpu/common/model_builder.cc",
        "tflite/delegates/nnapi/nnapi_delegate.cc",
        "tflite/delegates/hexagon/utils.cc",
        "tflite/delegates/coreml/coreml_delegate.mm",
    ]


def test_float16_gpu_full_with_dequantize(models):
    r = check_delegates(models["float16"], ("gpu", "coreml", "nnapi"))
    m = read_model(models["float16"])
    # FP16GraphPartitionHelper: supported + fp16-constant DEQUANTIZE == all nodes -> everything delegated.
    assert r["gpu"].verdict == "full" and r["gpu"].nodes_delegated == len(m.main.ops) == 12
    assert r["nnapi"].verdict == "full" and r["nnapi"].nodes_delegated == 12
    # Core ML is partial (MEAN), so its DEQUANTIZE nodes stay on the CPU (scenario 2 of the FP16 helper).
    cm = r["coreml"]
    assert cm.verdict == "partial" and cm.nodes_delegated == 6
    assert codes(cm) == [("DEQUANTIZE", Reason.FP16_DEQUANT)] * 5 + [("MEAN", Reason.OPTION)]


def test_nnapi_float16_states_which_source_holds(models):
    """The docs table (delegates.md:104) says NNAPI does not take float16 models; nnapi_delegate.cc does, and
    the report says so with the API level and the citations."""
    nn = check_delegates(models["float16"], ["nnapi"])["nnapi"]
    assert NNAPI_FLOAT16.hint in nn.hints
    assert NNAPI_FLOAT16.holds == "source" and NNAPI_FLOAT16.from_api == 27
    assert all("nnapi_delegate.cc:" in c for c in NNAPI_FLOAT16.citations)
    assert NNAPI_FLOAT16 in SOURCE_CONFLICTS
    assert NNAPI_FLOAT16.hint not in check_delegates(models["float32"], ["nnapi"])["nnapi"].hints


def test_int8_convnet(models):
    r = check_delegates(models["int8"], RULES)
    assert r["gpu"].verdict == "full"  # quantized models allowed by default
    assert r["nnapi"].verdict == "full"
    # Core ML: only v1 ops (DWConv <= 2) and a float32 first input: nothing of an int8 model.
    assert r["coreml"].verdict == "none"
    assert {c for _, c in codes(r["coreml"])} == {Reason.OP_VERSION, Reason.TENSOR_TYPE}
    assert "Core ML runs float models only: use float16." in r["coreml"].hints
    # The converter quantizes FULLY_CONNECTED weights per channel (a property of the fixture, checked here).
    m = read_model(models["int8"])
    fc = next(op for op in m.main.ops if op.opcode == "FULLY_CONNECTED")
    assert m.main.tensors[fc.inputs[1]].quant.per_channel
    # Hexagon refuses per-channel FC weights (utils.cc:214-222); SOFTMAX is then alone, below min nodes 2.
    hx = r["hexagon"]
    assert (hx.verdict, hx.nodes_delegated, hx.partitions) == ("partial", 5, 1)
    assert codes(hx) == [("FULLY_CONNECTED", Reason.PER_CHANNEL), ("SOFTMAX", Reason.PARTITION_SIZE)]
    assert "below min_nodes_per_partition=2" in reasons(hx)["SOFTMAX"]


def test_int16x8_stays_on_cpu(models):
    r = check_delegates(models["int16x8"], RULES)
    # GPU type gate: int16 runtime tensors are never allowed; DEQUANTIZE of int16 is refused by compat.
    assert r["gpu"].verdict == "none"
    assert codes(r["gpu"])[-1] == ("DEQUANTIZE", Reason.TENSOR_TYPE)
    assert {c for _, c in codes(r["gpu"])} == {Reason.TENSOR_TYPE}
    assert any("int16" in h for h in r["gpu"].hints)
    assert r["hexagon"].verdict == "none" and r["coreml"].verdict == "none"
    # NNAPI at API 30: CONV_2D and DEPTHWISE_CONV_2D check no input type from NNAPI 1.2 on (nnapi_delegate.cc
    # 2490-2554), so Validate gives the three convolutions one partition; the int16 ADD, MEAN, FC, SOFTMAX,
    # QUANTIZE and DEQUANTIZE are refused by their type checks. Building that partition then adds the int16x8
    # convolution's int64 bias as an NNAPI tensor, which AddTensor has no case for (nnapi_delegate.cc:1815-1904):
    # the whole delegation fails.
    nn = r["nnapi"]
    assert (nn.verdict, nn.nodes_delegated, nn.veto_code) == ("none", 0, Reason.BUILD_FAILURE)
    assert "would take 3 of 9 nodes" in nn.vetoed and "type INT64 is not supported" in nn.vetoed
    assert [op for op, _ in codes(nn)] == [
        "QUANTIZE",
        "CONV_2D",
        "ADD",
        "MEAN",
        "FULLY_CONNECTED",
        "SOFTMAX",
        "DEQUANTIZE",
    ]
    assert {c for op, c in codes(nn) if op != "CONV_2D"} == {Reason.TENSOR_TYPE}
    assert dict(codes(nn))["CONV_2D"] == Reason.BUILD_FAILURE


def test_dynamic_range(models):
    m = read_model(models["dynamic"])
    conv = [op for op in m.main.ops if op.opcode == "CONV_2D"][1]
    assert m.main.tensors[conv.inputs[1]].dtype == "int8"  # the fixture really is hybrid
    r = check_delegates(models["dynamic"], ("gpu", "coreml", "hexagon", "nnapi"))
    assert r["gpu"].verdict == "full"  # constants are not type-checked; weights are dequantized
    # Core ML: the hybrid CONV_2D is version 5 (> 1); the lone DEPTHWISE and ADD partitions are below 2 nodes.
    assert codes(r["coreml"]) == [
        ("CONV_2D", Reason.OP_VERSION),
        ("DEPTHWISE_CONV_2D", Reason.PARTITION_SIZE),
        ("CONV_2D", Reason.OP_VERSION),
        ("ADD", Reason.PARTITION_SIZE),
        ("MEAN", Reason.OPTION),
    ]
    assert r["hexagon"].verdict == "none"
    # NNAPI 1.2+ (API 29+) takes hybrid CONV_2D / FULLY_CONNECTED (the checks are pre-1.2 only).
    assert r["nnapi"].verdict == "full"
    old = check_delegates(models["dynamic"], ["nnapi"], TargetParams(android_api=28))["nnapi"]
    # NNAPI before 1.2 (API 29) rejects hybrid CONV_2D / FULLY_CONNECTED (nnapi_delegate.cc:2494-2497, 2561-2564):
    # only the second CONV_2D has int8 weights (the others are below the 1,024-weight threshold).
    assert [(v.index, v.op, v.code) for v in old.cpu_nodes] == [(2, "CONV_2D", Reason.DYNAMIC_RANGE)]
    assert (old.verdict, old.nodes_delegated, old.partitions) == ("partial", 6, 2)
    assert any("dynamic-range (hybrid) ops" in h for h in old.hints)


# ---- single rules ------------------------------------------------------------------------------------


def test_gpu_version_cap_and_hint(models):
    data = set_version(models["reshape"], "RESHAPE", 2)
    gpu = check_delegates(data, ["gpu"])["gpu"]
    assert reasons(gpu)["RESHAPE"] == "Max version supported: 1. Requested version 2."
    assert "GPU: this RESHAPE is version 2, the delegate takes version 1." in gpu.hints
    assert (gpu.nodes_delegated, gpu.nodes_total, gpu.verdict) == (2, 3, "partial")
    assert check_delegates(models["reshape"], ["gpu"])["gpu"].verdict == "full"


def test_gpu_max_partitions(models):
    # DEPTHWISE_CONV_2D v7 > cap 6 splits the graph: [CONV] | DW | [CONV, ADD, MEAN, FC, SOFTMAX].
    data = set_version(models["float32"], "DEPTHWISE_CONV_2D", 7)
    one = check_delegates(data, ["gpu"])["gpu"]
    assert (one.nodes_delegated, one.partitions) == (5, 1)
    assert "not among the 1 largest" in reasons(one)["CONV_2D"]
    two = check_delegates(data, ["gpu"], TargetParams(gpu_max_partitions=2))["gpu"]
    assert (two.nodes_delegated, two.partitions) == (6, 2)
    # Core ML keeps every partition of >= 2 nodes; the lone CONV_2D is below its minimum.
    cm = check_delegates(data, ["coreml"])["coreml"]
    assert "min_nodes_per_partition=2" in reasons(cm)["CONV_2D"]


def test_gpu_comparison_feeding_cast(models):
    # GREATER -> CAST(bool->float) -> MUL: the logical-op special case accepts both.
    assert check_delegates(models["greater_cast"], ["gpu"])["gpu"].verdict == "full"
    # GREATER as a graph output has no CAST/SELECT consumer: refused.
    gpu = check_delegates(models["greater_out"], ["gpu"])["gpu"]
    assert "Not supported logical op case" in reasons(gpu)["GREATER"]
    assert gpu.verdict == "partial"


def test_rank5(models):
    r = check_delegates(models["rank5"], RULES)
    assert {name: codes(rep) for name, rep in r.items()} == {name: [("ADD", Reason.TENSOR_RANK)] for name in RULES}
    assert reasons(r["gpu"])["ADD"] == "OP is supported, but tensor type/shape isn't compatible (rank 5 tensor)."
    assert reasons(r["nnapi"])["ADD"] == "Input rank must be <= 4."
    assert reasons(r["hexagon"])["ADD"].endswith("has rank 5; Hexagon supports at most 4.")
    assert reasons(r["coreml"])["ADD"] == "Broadcasting needs both ranks <= 4."
    assert "GPU: tensors of rank 5 or more are not supported; reshape to at most 4-D." in r["gpu"].hints


def test_dynamic_tensor_veto(models):
    r = check_delegates(models["dynamic_reshape"], RULES)
    for rep in r.values():
        assert rep.nodes_delegated == 0 and rep.verdict == "none"
        assert "dynamic-sized tensors" in rep.vetoed


def test_unknown_custom_op_is_reported(models):
    data = make_custom(models["float32"], "CONV_2D", "MyCustomOp")
    r = check_delegates(data)
    for name in RULES:
        assert any("MyCustomOp" in v.op for v in r[name].cpu_nodes), name
    # The runtime cannot resolve it: the XNNPACK column says so instead of crashing.
    assert r["xnnpack"].source == "runtime" and r["xnnpack"].vetoed


def test_gpu_custom_transpose_conv_bias(models):
    opts = struct.pack("<3i", 1, 2, 2)  # TfLiteTransposeConvParams: padding, stride_w, stride_h
    data = make_custom(models["float32"], "CONV_2D", "Convolution2DTransposeBias", opts)
    assert check_delegates(data, ["gpu"])["gpu"].verdict == "full"
    bad = make_custom(models["float32"], "CONV_2D", "Convolution2DTransposeBias", struct.pack("<3i", 1, 0, 2))
    assert reasons(check_delegates(bad, ["gpu"])["gpu"])["Convolution2DTransposeBias"] == "Incorrect stride values."


def test_exact_input_counts(models):
    data = drop_input(models["int8"], "CONV_2D", 2)  # a CONV_2D without bias
    r = check_delegates(data, ("hexagon", "nnapi"))
    assert "Expected exactly 3 input(s), got 2." in [v.reason for v in r["hexagon"].cpu_nodes]
    assert "Conv2D with omitted bias not supported." in [v.reason for v in r["nnapi"].cpu_nodes]


def test_coreml_float_first_input(models):
    data = set_version(models["int8"], "CONV_2D", 1)  # passes the version check, not the type check
    cm = check_delegates(data, ["coreml"])["coreml"]
    assert "The first input must be float32 (got int8)." in [v.reason for v in cm.cpu_nodes]


def test_gpu_per_channel_activation_fails_build(models):
    data = per_channel_activation(models["int8"], "ADD")
    gpu = check_delegates(data, ["gpu"])["gpu"]
    assert gpu.nodes_delegated == 0 and "per-channel" in gpu.vetoed


def test_nnapi_needs_api_27(models):
    r = check_delegates(models["float32"], ["nnapi"], TargetParams(android_api=26))["nnapi"]
    assert r.verdict == "none" and "API 27" in r.vetoed


def test_gpu_quant_flag(models):
    r = check_delegates(models["int8"], ["gpu"], TargetParams(gpu_allow_quant=False))["gpu"]
    assert r.verdict == "none"


# ---- XNNPACK evidence --------------------------------------------------------------------------------


def test_xnnpack_is_runtime_evidence(models):
    for scheme in ("float32", "int8"):
        x = check_delegates(models[scheme], ["xnnpack"])["xnnpack"]
        assert x.source == "runtime" and x.partitions >= 1
        assert x.nodes_delegated + len(x.cpu_nodes) == x.nodes_total == len(read_model(models[scheme]).main.ops)
    # int16x8 runs on the reference kernels: XNNPACK takes nothing (observed on this runtime).
    assert check_delegates(models["int16x8"], ["xnnpack"])["xnnpack"].nodes_delegated == 0


# ---- API and bad input -------------------------------------------------------------------------------


def test_api_and_format(models, tmp_path):
    path = tmp_path / "m.tflite"
    path.write_bytes(models["float32"])
    r = check_delegates(path)
    assert tuple(r) == DELEGATES
    text = format_report(r)
    assert "observed in the runtime" in text and "predicted from the delegate's rules" in text
    with pytest.raises(OptimizeError, match="Choose from gpu, nnapi"):
        check_delegates(path, ["tpu"])
    with pytest.raises(ValidationError):
        TargetParams(android_level=30)


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda m: b"not a flatbuffer at all", "not a TFLite flatbuffer"),
        (lambda m: m[: len(m) // 2], "truncated"),
        (lambda m: unknown_builtin(m), "newer schema"),
        (lambda m: empty_graph(m), "empty graph"),
    ],
)
def test_bad_models(models, make, match):
    with pytest.raises(ModelError, match=match) as e:
        check_delegates(make(models["float32"]))
    assert e.value.exit_code == 2 and "\n" not in str(e.value)


def test_missing_file(tmp_path):
    with pytest.raises(ModelError, match="No model file"):
        check_delegates(tmp_path / "nope.tflite")

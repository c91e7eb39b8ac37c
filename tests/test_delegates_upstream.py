"""The eight mismatches issue 12 found against LiteRT's source, each on the smallest graph that hits it.

Every expected verdict is the upstream one, read from the cited lines of LiteRT at commit f67457790c9c
(github.com/google-ai-edge/LiteRT). The graphs are built with the schema's object API (no TensorFlow), and
those the runtime can run are loaded in the real interpreter too, so a fixture cannot be malformed.
"""

from __future__ import annotations

import numpy as np
import pytest
from delegate_fixtures import op, tensor, tiny

from optimize.delegates import TargetParams, check_delegates, rules_for
from optimize.delegates.dynamic import analyse
from optimize.delegates.graph import partition
from optimize.delegates.rules import Reason
from optimize.models import runtime
from optimize.models.flatbuffer import Op, Subgraph, Tensor
from optimize.models.tflite import read_model

RULES = ("gpu", "nnapi", "hexagon", "coreml")
I32 = "int32"


def by_op(report) -> dict[str, list[tuple[str, str]]]:
    out: dict[str, list[tuple[str, str]]] = {}
    for v in report.cpu_nodes:
        out.setdefault(v.op, []).append((v.code, v.reason))
    return out


def loads(data: bytes) -> None:
    """The graph is a model the real interpreter accepts and runs."""
    loaded = runtime.load(data, xnnpack=False)
    loaded.interpreter.invoke()


# ---- 1. dynamic-tensor veto: prepare-time (persistent) values are known -------------------------------


def _shape_chain(middle: str) -> bytes:
    """x[2,8] -> SHAPE -> STRIDED_SLICE -> (CONCATENATION with [-1], or ADD of 8) -> RESHAPE(x, .) -> ADD."""
    first = middle == "CONCATENATION"  # slice the batch (2), or the row length (8)
    tensors = [
        tensor([2, 8]),  # 0 x
        tensor([2], I32),  # 1 shape(x)
        tensor([1], I32, [0 if first else 1]),  # 2 begin
        tensor([1], I32, [1 if first else 2]),  # 3 end
        tensor([1], I32, [1]),  # 4 strides
        tensor([1], I32),  # 5 batch
        tensor([1], I32, [-1]),  # 6 constant -1
        tensor([2], I32),  # 7 new shape
        tensor([2, 8]),  # 8 reshaped
        tensor([2, 8]),  # 9 y
    ]
    if middle == "CONCATENATION":
        mid = op("CONCATENATION", [5, 6], [7], ("ConcatenationOptions", {"axis": 0}))
    else:  # ADD of two int32 tensors: computed at invoke time, so its output is not known at prepare
        tensors[6] = tensor([1], I32, [8])
        tensors[7] = tensor([1], I32)
        tensors[8] = tensor([16])
        tensors[9] = tensor([16])
        mid = op("ADD", [5, 6], [7], ("AddOptions", {}))
    ops = [
        op("SHAPE", [0], [1], ("ShapeOptions", {"outType": 2})),
        op("STRIDED_SLICE", [1, 2, 3, 4], [5], ("StridedSliceOptions", {})),
        mid,
        op("RESHAPE", [0, 7], [8]),
        op("ADD", [8, 8], [9], ("AddOptions", {})),
    ]
    return tiny(tensors, ops, [0], [9])


def test_shape_strided_slice_reshape_is_static():
    """SHAPE -> STRIDED_SLICE -> CONCATENATION -> RESHAPE leaves no dynamic tensor, so no delegate is vetoed.

    Upstream (LiteRT f67457790c9c): shape.cc:66 marks SHAPE's output kTfLitePersistentRo;
    strided_slice.cc:327-338 computes the slice at prepare time when input, begin and end are constant or
    persistent; concatenation.cc:159-166,250-251 does the same for all-known inputs; reshape.cc:136-139 then
    sizes its output at prepare time. subgraph.cc:1559-1565 stops only at a dynamic output, and
    subgraph.cc:2538-2552 vetoes a delegate only then. Old rules: only SHAPE outputs counted as known, so
    every delegate was vetoed.
    """
    data = _shape_chain("CONCATENATION")
    loads(data)
    dyn = analyse(read_model(data).main)
    assert dyn.first_dynamic is None and dyn.persistent == {1, 5, 7}
    r = check_delegates(data, RULES)
    assert all(rep.veto_code != Reason.DYNAMIC_TENSOR for rep in r.values())
    assert all(r[d].vetoed is None for d in ("nnapi", "hexagon", "coreml"))
    gpu = by_op(r["gpu"])
    # GPU: SHAPE has no parser; a 1-D STRIDED_SLICE is refused; RESHAPE has two runtime inputs. The
    # CONCATENATION is taken node by node (its int32 tensors are prepare-time or constant, which the type gate
    # does not check), but its parser reads the constant [-1] as a 4-D float tensor (model_builder.cc:512-514,
    # model_builder_helper.cc:367-372) and fails: the second stage (issue 21) fails the whole delegation.
    assert gpu["SHAPE"][0][0] == Reason.UNSUPPORTED_OP and gpu["RESHAPE"][0][0] == Reason.ARITY
    assert gpu["CONCATENATION"][0][0] == Reason.BUILD_FAILURE
    assert r["gpu"].veto_code == Reason.BUILD_FAILURE and "would take 1 of 5 nodes" in r["gpu"].vetoed


def test_shape_through_add_is_dynamic():
    """An int32 ADD is evaluated at invoke time (add.cc never marks its output persistent), so a RESHAPE
    reading it cannot size its output at prepare time: reshape.cc:140-150 returns kTfLiteOutputShapeNotKnown,
    subgraph.cc:1559-1565 flags the graph dynamic and subgraph.cc:2538-2552 vetoes every delegate."""
    data = _shape_chain("ADD")
    loads(data)
    r = check_delegates(data, RULES)
    for rep in r.values():
        assert rep.verdict == "none" and rep.veto_code == Reason.DYNAMIC_TENSOR
        assert "tensor#8" in rep.vetoed and "RESHAPE" in rep.vetoed


# ---- 2. GPU CAST bool -> float: one producer, one consumer, one consumer of the output --------------


def _cast_graph(second_reader: str | None) -> bytes:
    """GREATER(x, 0) -> bool -> CAST -> float -> MUL(x); optionally a second reader of the bool or the float."""
    tensors = [tensor([1, 4, 4, 2]), tensor([1], data=[0.5]), tensor([1, 4, 4, 2], "bool"), tensor([1, 4, 4, 2])]
    tensors += [tensor([1, 4, 4, 2]), tensor([1, 4, 4, 2])]
    ops = [
        op("GREATER", [0, 1], [2], ("GreaterOptions", {})),
        op("CAST", [2], [3], ("CastOptions", {"inDataType": 6, "outDataType": 0})),
        op("MUL", [3, 0], [4], ("MulOptions", {})),
    ]
    outputs = [4]
    if second_reader == "bool":
        ops.append(op("CAST", [2], [5], ("CastOptions", {"inDataType": 6, "outDataType": 0})))
        outputs.append(5)
    elif second_reader == "float":
        ops.append(op("ADD", [3, 0], [5], ("AddOptions", {})))
        outputs.append(5)
    return tiny(tensors, ops, [0], outputs)


def test_gpu_cast_from_bool_needs_single_consumers():
    """model_builder.cc:385-407: a bool -> float CAST is refused ("Not supported cast case") when the bool
    input has more than one producer or consumer, and ("Cast from bool not supported for outputs") when the
    float output has more or fewer than one consumer; it never falls through to the shared rule. Old rules
    accepted both (a false 'delegated')."""
    ok = _cast_graph(None)
    loads(ok)
    assert check_delegates(ok, ["gpu"])["gpu"].verdict == "full"

    two_readers = _cast_graph("bool")
    loads(two_readers)
    gpu = check_delegates(two_readers, ["gpu"])["gpu"]
    cast = by_op(gpu)["CAST"]
    assert len(cast) == 2 and all(code == Reason.GRAPH and "Not supported cast case" in why for code, why in cast)
    assert by_op(gpu)["GREATER"][0][0] == Reason.GRAPH  # two consumers: model_builder.cc:1077-1080

    two_users = _cast_graph("float")
    loads(two_users)
    gpu = check_delegates(two_users, ["gpu"])["gpu"]
    assert by_op(gpu)["CAST"] == [(Reason.GRAPH, by_op(gpu)["CAST"][0][1])]
    assert "Cast from bool not supported for outputs" in by_op(gpu)["CAST"][0][1]


# ---- 3. GPU SELECT / SELECT_V2: condition broadcast and [1,1] branches --------------------------------


def _select(cond_shape, branch_shape, out_shape=(1, 4, 8), const_branch=False) -> bytes:
    data = np.full(branch_shape, 2.0, np.float32) if const_branch else None
    tensors = [
        tensor(cond_shape, "bool"),
        tensor(branch_shape, data=data),
        tensor(out_shape),
        tensor(out_shape),
    ]
    inputs = [0] if const_branch else [0, 1]
    return tiny(tensors, [op("SELECT_V2", [0, 1, 2], [3], ("SelectV2Options", {}))], inputs + [2], [3])


def test_gpu_select_condition_must_broadcast_to_the_output():
    """gpu_compatibility.cc:385-397: a non-scalar condition is right-aligned with the output and each of its
    dims must equal the output's or be 1, and its rank must not exceed the output's. Old rules skipped this
    check (a false 'delegated')."""
    gpu = check_delegates(_select((3,), (1, 4, 8)), ["gpu"])["gpu"]
    assert [c for c, _ in by_op(gpu)["SELECT_V2"]] == [Reason.BROADCAST]
    assert check_delegates(_select((4, 1), (1, 4, 8)), ["gpu"])["gpu"].verdict == "full"
    assert check_delegates(_select((1, 1, 4, 8), (1, 4, 8)), ["gpu"])["gpu"].verdict == "none"  # rank above


def test_gpu_select_branch_of_shape_1x1_is_refused():
    """gpu_compatibility.cc:398-403 (and 408-413 for else): a branch that is not the output's shape must have
    rank <= 1 and at most one element, so [1,1] is refused even though it holds one element; [1] and a
    scalar pass. Old rules compared the element count and accepted [1,1]."""
    for const in (False, True):
        data = _select((1, 4, 8), (1, 1), const_branch=const)
        gpu = check_delegates(data, ["gpu"])["gpu"]
        assert [c for c, _ in by_op(gpu)["SELECT_V2"]] == [Reason.SHAPE], const
    assert check_delegates(_select((1, 4, 8), (1,)), ["gpu"])["gpu"].verdict == "full"
    assert check_delegates(_select((1, 4, 8), ()), ["gpu"])["gpu"].verdict == "full"


# ---- 4. GPU comparison feeding a CAST while also being a graph output ----------------------------------


def test_gpu_comparison_that_is_also_a_graph_output():
    """model_builder.cc:1073-1092 with GetTensorInfo (model_builder.cc:271-300): the comparison's output
    must have one producer and one *node* consumer, a CAST/SELECT with a float output; graph outputs are not
    consumers. Old rules refused a comparison whose bool output is also a graph output (a false CPU
    fallback)."""
    tensors = [tensor([1, 4, 4, 2]), tensor([1], data=[0.5]), tensor([1, 4, 4, 2], "bool"), tensor([1, 4, 4, 2])]
    tensors.append(tensor([1, 4, 4, 2]))
    ops = [
        op("GREATER", [0, 1], [2], ("GreaterOptions", {})),
        op("CAST", [2], [3], ("CastOptions", {"inDataType": 6, "outDataType": 0})),
        op("MUL", [3, 0], [4], ("MulOptions", {})),
    ]
    data = tiny(tensors, ops, [0], [4, 2])  # the bool is a graph output too
    loads(data)
    gpu = check_delegates(data, ["gpu"])["gpu"]
    assert (gpu.verdict, gpu.nodes_delegated, gpu.partitions) == ("full", 3, 1)


# ---- 5. GPU DEPTHWISE_CONV_2D with an omitted (-1) bias ------------------------------------------------


def _depthwise(channels: int, bias: str) -> bytes:
    """A 3x3 depthwise convolution on [1,8,8,C] (multiplier 1); bias 'omitted' (-1 slot), 'absent' (2 inputs)."""
    tensors = [
        tensor([1, 8, 8, channels]),
        tensor([1, 3, 3, channels], data=np.full((1, 3, 3, channels), 0.1, np.float32)),
        tensor([1, 8, 8, channels]),
    ]
    inputs = [0, 1, -1] if bias == "omitted" else [0, 1]
    opts = ("DepthwiseConv2DOptions", {"padding": 0, "strideW": 1, "strideH": 1, "depthMultiplier": 1})
    return tiny(tensors, [op("DEPTHWISE_CONV_2D", inputs, [2], opts)], [0], [2])


def test_gpu_depthwise_with_omitted_bias():
    """gpu_compatibility.cc:279 takes input 2 whenever the op has more than two input slots, and
    gpu_compatibility.cc:301-303 requires NumElements(bias) == output channels. An omitted (-1) slot becomes
    a spec with no dims (tools/versioning/op_signature.cc:36-52), whose NumElements is 1, so the GPU refuses
    it unless the output has one channel. Old rules skipped the -1 bias (a false 'delegated')."""
    refused = check_delegates(_depthwise(8, "omitted"), ["gpu"])["gpu"]
    assert by_op(refused)["DEPTHWISE_CONV_2D"] == [(Reason.SHAPE, "bias.size != output.c (1 vs 8).")]
    assert check_delegates(_depthwise(1, "omitted"), ["gpu"])["gpu"].verdict == "full"
    assert check_delegates(_depthwise(8, "absent"), ["gpu"])["gpu"].verdict == "full"  # no slot: no bias check


# ---- 6. NNAPI CONV_2D counts input slots, not tensors ----------------------------------------------------


def _conv(inputs) -> bytes:
    tensors = [
        tensor([1, 8, 8, 2]),
        tensor([4, 3, 3, 2], data=np.full((4, 3, 3, 2), 0.1, np.float32)),
        tensor([1, 8, 8, 4]),
    ]
    opts = ("Conv2DOptions", {"padding": 0, "strideW": 1, "strideH": 1})
    return tiny(tensors, [op("CONV_2D", inputs, [2], opts)], [0], [2])


def test_nnapi_conv_with_omitted_bias_slot():
    """nnapi_delegate.cc:2516-2520 (Validate) only checks node->inputs->size == 3, and a -1 slot counts: the
    node is accepted. Building the model has no omitted-bias path (the TODO at :2517): the input loop hands the
    -1 slot to AddTensorInput (:5822, 6187-6189) and AddTensor indexes the tensors with it (:1780-1809), so the
    whole delegation fails (issue 21). A CONV_2D with two inputs is refused by Validate itself."""
    nn = check_delegates(_conv([0, 1, -1]), ["nnapi"])["nnapi"]
    assert (nn.verdict, nn.veto_code) == ("none", Reason.BUILD_FAILURE)
    assert by_op(nn)["CONV_2D"][0][0] == Reason.BUILD_FAILURE and "would take 1 of 1 nodes" in nn.vetoed
    assert "Conv2D with omitted bias" in nn.vetoed
    nn = check_delegates(_conv([0, 1]), ["nnapi"])["nnapi"]
    assert by_op(nn)["CONV_2D"] == [(Reason.ARITY, "Conv2D with omitted bias not supported.")]
    assert nn.veto_code is None


# ---- 7. Hexagon and Core ML partition overrides <= 0 ---------------------------------------------------


@pytest.mark.parametrize("value", [0, -3])
def test_partition_overrides_at_or_below_zero_fall_back(value):
    """hexagon_delegate.cc:41-52: max_delegated_partitions <= 0 becomes 4 (kMaxHexagonGraphs), above 16
    becomes 16, min_nodes_per_partition <= 0 becomes 2. coreml_delegate.mm:172-177: max <= 0 is unlimited,
    min_nodes_per_partition <= 0 becomes 2. Old rules gave Hexagon unlimited partitions and Core ML 0."""
    hexagon = rules_for("hexagon").policy(TargetParams(hexagon_max_partitions=value, hexagon_min_nodes=max(value, 0)))
    assert (hexagon.max_partitions, hexagon.min_nodes) == (4, 2)
    assert rules_for("hexagon").policy(TargetParams(hexagon_max_partitions=40)).max_partitions == 16
    coreml = rules_for("coreml").policy(TargetParams(coreml_max_partitions=value, coreml_min_nodes=max(value, 0)))
    assert (coreml.max_partitions, coreml.min_nodes) == (None, 2)


# ---- 8. side-effect ordering edges: resource tensors only ----------------------------------------------


def _graph(ops, n, dtypes) -> Subgraph:
    tensors = [Tensor(i, f"t{i}", dtypes.get(i, "float32"), (1, 4), None, 0, False, False) for i in range(n)]
    return Subgraph(
        0, "", tensors, [Op(i, name, None, 1, ins, outs) for i, (name, ins, outs) in enumerate(ops)], (0,), ()
    )


def test_variant_tensors_do_not_chain_ops():
    """core/subgraph.cc:1190-1216 OpMightHaveSideEffect: only kTfLiteResource tensors (and IF/WHILE/
    CALL_ONCE) make an op side-effecting; graph_info.cc:318-327 chains only those. Old rules also chained ops
    touching variant tensors, which changes partitions."""
    # n0 CPU; n1 delegated; n2 and n3 CPU and both touch tensor 5. Only a resource makes n3 wait for n2.
    ops = [("U", (0,), (1,)), ("A", (1,), (2,)), ("V", (2, 5), (3,)), ("V", (0, 5), (4,))]
    variant = [(p.delegated, p.nodes) for p in partition(_graph(ops, 6, {5: "variant"}), {1})]
    assert variant == [(False, [0, 3]), (True, [1]), (False, [2])]
    resource = [(p.delegated, p.nodes) for p in partition(_graph(ops, 6, {5: "resource"}), {1})]
    assert resource == [(False, [0]), (True, [1]), (False, [2, 3])]

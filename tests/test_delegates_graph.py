"""The partitioner and selection on hand-built graphs (no TensorFlow), checked against graph_info.cc's
greedy-epoch logic and GetFirstNLargestPartitions, worked out by hand."""

from __future__ import annotations

from optimize.delegates.dynamic import first_dynamic_tensor
from optimize.delegates.graph import largest, partition
from optimize.delegates.xnnpack import replaced_nodes
from optimize.models.flatbuffer import Op, Subgraph, Tensor


def graph(ops: list[tuple[str, tuple[int, ...], tuple[int, ...]]], n_tensors: int, const=(), dtypes=None):
    tensors = [
        Tensor(i, f"t{i}", (dtypes or {}).get(i, "float32"), (1, 4), None, 0, i in const, False)
        for i in range(n_tensors)
    ]
    return Subgraph(
        0, "", tensors, [Op(i, name, None, 1, ins, outs) for i, (name, ins, outs) in enumerate(ops)], (0,), ()
    )


def test_greedy_epochs_skip_ahead():
    # n0: t0->t1 (yes), n1: t0->t2 (no), n2: t1->t3 (yes), n3: t2,t3->t4 (yes)
    sg = graph([("A", (0,), (1,)), ("B", (0,), (2,)), ("A", (1,), (3,)), ("A", (2, 3), (4,))], 5)
    parts = partition(sg, {0, 2, 3})
    # Epoch 1 takes n0's kind and greedily adds n2 (ready, same kind) past n1; n3 waits for n1.
    assert [(p.delegated, p.nodes) for p in parts] == [(True, [0, 2]), (False, [1]), (True, [3])]
    assert [p.nodes for p in largest(parts, 1, 0)] == [[0, 2]]
    assert [p.nodes for p in largest(parts, None, 0)] == [[0, 2], [3]]
    # Selection stops at the first partition below the minimum.
    assert [p.nodes for p in largest(parts, 4, 2)] == [[0, 2]]
    assert largest(parts, 4, 3) == []


def test_chain_and_all_supported():
    sg = graph([("A", (0,), (1,)), ("A", (1,), (2,)), ("A", (2,), (3,))], 4)
    assert [(p.delegated, p.nodes) for p in partition(sg, {0, 1, 2})] == [(True, [0, 1, 2])]
    assert [(p.delegated, p.nodes) for p in partition(sg, {0, 2})] == [(True, [0]), (False, [1]), (True, [2])]


def test_control_edges_between_side_effect_ops():
    # Two independent branches, each with a resource-touching op: the second waits for the first.
    sg = graph(
        [("A", (0,), (1,)), ("VAR", (5,), (2,)), ("A", (0,), (3,)), ("VAR", (5,), (4,))], 6, dtypes={5: "resource"}
    )
    parts = partition(sg, {0, 2})
    assert [(p.delegated, p.nodes) for p in parts] == [(True, [0, 2]), (False, [1, 3])]


def test_dynamic_tensor_detection():
    sg = graph([("RESHAPE", (0, 1), (2,))], 3, const=(1,))
    assert first_dynamic_tensor(sg) is None
    sg = graph([("RESHAPE", (0, 1), (2,))], 3)
    assert first_dynamic_tensor(sg)[0].index == 2
    sg = graph([("SHAPE", (0,), (1,)), ("RESHAPE", (0, 1), (2,))], 3)  # SHAPE of a static tensor is known
    assert first_dynamic_tensor(sg) is None
    assert first_dynamic_tensor(graph([("WHERE", (0,), (1,))], 2)) is not None


def test_xnnpack_trace():
    ops = [
        {"index": 0, "op_name": "CONV_2D", "inputs": [0, 9], "outputs": [1]},
        {"index": 1, "op_name": "RELU", "inputs": [1], "outputs": [2]},
        {"index": 2, "op_name": "CUSTOM", "inputs": [2], "outputs": [3]},
        {"index": 3, "op_name": "ADD", "inputs": [3, 2], "outputs": [4]},
        {"index": 4, "op_name": "DELEGATE", "inputs": [0, 9], "outputs": [2]},
        {"index": 5, "op_name": "DELEGATE", "inputs": [3, 2], "outputs": [4]},
    ]
    parts, total = replaced_nodes(ops)
    assert total == 4 and parts == [{0, 1}, {3}]

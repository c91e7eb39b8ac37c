"""The ONNX route's pieces on small graphs built here: each of our onnx2torch converters against ONNX Runtime
(or onnx's reference evaluator), eager and after torch.export (export-friendliness is the point), and the
normalisation passes real exporters' files need (Constant weights, If on a frozen input, fusions).
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the torch extra (pip install -e '.[torch]') is not installed")
ort = pytest.importorskip("onnxruntime", reason="the torch extra is not installed")
if importlib.util.find_spec("onnx2torch") is None:  # not imported here: torch_ops imports it (torchvision aside)
    pytest.skip("the torch extra is not installed", allow_module_level=True)

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from optimize.convert import onnx_ops  # noqa: E402
from optimize.convert.onnx_graph import normalize  # noqa: E402

RNG = np.random.default_rng(0)


def _model(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "t", inputs, outputs, [numpy_helper.from_array(v, k) for k, v in inits])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def _vi(name, shape, dtype=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, dtype, shape)


def _reference(model, feeds):
    try:
        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        return sess.run(None, feeds)
    except Exception:  # noqa: BLE001 - ONNX Runtime has no batch-first (layout=1) LSTM: the reference evaluator
        from onnx.reference import ReferenceEvaluator

        return ReferenceEvaluator(model).run(None, feeds)


def _check(model, feeds, atol=1e-5, freeze=None):
    """Our route's module against the reference, in eager mode and after torch.export."""
    ref = _reference(model, {**feeds, **(freeze or {})})
    norm = normalize(model, {k: v.shape for k, v in feeds.items()}, freeze)
    assert not onnx_ops.unsupported_ops(norm.model)
    mod = onnx_ops.convert(norm.model)
    args = tuple(torch.from_numpy(v) for v in feeds.values())
    ep = torch.export.export(mod, args, strict=False)
    for out in (mod(*args), ep.module()(*args)):
        out = out if isinstance(out, (list, tuple)) else [out]
        for o, r in zip(out, ref):
            np.testing.assert_allclose(o.detach().numpy(), r, atol=atol, rtol=1e-4)
    return norm


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("layout", [0, 1])
@pytest.mark.parametrize("states", [False, True])
def test_lstm(direction, layout, states):
    T, B, n_in, H = 5, 2, 3, 4
    D = 2 if direction == "bidirectional" else 1
    W = RNG.normal(0, 0.5, (D, 4 * H, n_in)).astype(np.float32)
    R = RNG.normal(0, 0.5, (D, 4 * H, H)).astype(np.float32)
    Bb = RNG.normal(0, 0.5, (D, 8 * H)).astype(np.float32)
    x_shape = [T, B, n_in] if layout == 0 else [B, T, n_in]
    s_shape = [D, B, H] if layout == 0 else [B, D, H]
    inputs = [_vi("x", x_shape)] + ([_vi("h0", s_shape), _vi("c0", s_shape)] if states else [])
    node = helper.make_node(
        "LSTM",
        ["x", "W", "R", "B", "", "h0" if states else "", "c0" if states else ""],
        ["y", "yh", "yc"],
        hidden_size=H,
        direction=direction,
        layout=layout,
    )
    outs = [_vi("y", None), _vi("yh", None), _vi("yc", None)]
    m = _model([node], inputs, outs, [("W", W), ("R", R), ("B", Bb)], opset=14)
    feeds = {"x": RNG.normal(size=x_shape).astype(np.float32)}
    if states:
        feeds.update(h0=RNG.normal(size=s_shape).astype(np.float32), c0=RNG.normal(size=s_shape).astype(np.float32))
    _check(m, feeds)


@pytest.mark.parametrize("linear_before_reset", [0, 1])
@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_gru(linear_before_reset, direction):
    T, B, n_in, H = 4, 1, 3, 5
    D = 2 if direction == "bidirectional" else 1
    W = RNG.normal(0, 0.5, (D, 3 * H, n_in)).astype(np.float32)
    R = RNG.normal(0, 0.5, (D, 3 * H, H)).astype(np.float32)
    Bb = RNG.normal(0, 0.5, (D, 6 * H)).astype(np.float32)
    node = helper.make_node(
        "GRU",
        ["x", "W", "R", "B"],
        ["y", "yh"],
        hidden_size=H,
        direction=direction,
        linear_before_reset=linear_before_reset,
    )
    m = _model([node], [_vi("x", [T, B, n_in])], [_vi("y", None), _vi("yh", None)], [("W", W), ("R", R), ("B", Bb)], 14)
    _check(m, {"x": RNG.normal(size=(T, B, n_in)).astype(np.float32)})


@pytest.mark.parametrize(
    "starts,ends,axes,steps",
    [([1], [-1], [2], [1]), ([0, 0], [9999, 9999], [2, 3], [2, 2]), ([-1], [-9999], [3], [-1]), ([4], [0], [3], [-2])],
)
def test_slice(starts, ends, axes, steps):
    c = {k: np.array(v, np.int64) for k, v in {"s": starts, "e": ends, "a": axes, "st": steps}.items()}
    node = helper.make_node("Slice", ["x", "s", "e", "a", "st"], ["y"])
    m = _model([node], [_vi("x", [1, 3, 6, 7])], [_vi("y", None)], list(c.items()))
    _check(m, {"x": RNG.normal(size=(1, 3, 6, 7)).astype(np.float32)})


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge"])
def test_pad(mode):
    node = helper.make_node("Pad", ["x", "p"], ["y"], mode=mode)
    m = _model(
        [node], [_vi("x", [1, 2, 5, 6])], [_vi("y", None)], [("p", np.array([0, 0, 1, 2, 0, 0, 2, 1], np.int64))]
    )
    _check(m, {"x": RNG.normal(size=(1, 2, 5, 6)).astype(np.float32)})


@pytest.mark.parametrize("mode", ["reflect", "edge", "wrap"])
@pytest.mark.parametrize(
    "shape,pads",
    [
        ([1, 20, 4], [0, 3, 0, 0, 2, 0]),  # the middle axis of [N, T, C] (tf2onnx's Keras audio models)
        ([1, 4, 8, 3], [0, 1, 2, 0, 0, 1, 2, 0]),  # H and W of an NHWC image
        ([3, 5], [1, 0, 2, 0]),  # the first axis
    ],
)
def test_pad_of_any_axis(mode, shape, pads):
    node = helper.make_node("Pad", ["x", "p"], ["y"], mode=mode)
    m = _model([node], [_vi("x", shape)], [_vi("y", None)], [("p", np.array(pads, np.int64))], opset=19)
    _check(m, {"x": RNG.normal(size=shape).astype(np.float32)})


def test_pad_positions():
    assert onnx_ops.pad_index(4, 2, 2, "reflect") == [2, 1, 0, 1, 2, 3, 2, 1]
    assert onnx_ops.pad_index(4, 2, 1, "replicate") == [0, 0, 0, 1, 2, 3, 3]
    assert onnx_ops.pad_index(3, 1, 2, "circular") == [2, 0, 1, 2, 0, 1]


@pytest.mark.parametrize(
    "mode,ctm,nearest,scale",
    [
        ("nearest", "asymmetric", "floor", 2.0),
        ("nearest", "half_pixel", "round_prefer_floor", 2.0),
        ("nearest", "half_pixel", "round_prefer_ceil", 1.5),  # no interpolate equivalent: an exact gather
        ("linear", "half_pixel", "", 2.0),
        ("linear", "align_corners", "", 2.0),
    ],
)
def test_resize(mode, ctm, nearest, scale):
    attrs = {"mode": mode, "coordinate_transformation_mode": ctm, **({"nearest_mode": nearest} if nearest else {})}
    node = helper.make_node("Resize", ["x", "", "s"], ["y"], **attrs)
    m = _model([node], [_vi("x", [1, 2, 4, 6])], [_vi("y", None)], [("s", np.array([1, 1, scale, scale], np.float32))])
    _check(m, {"x": RNG.normal(size=(1, 2, 4, 6)).astype(np.float32)})


def test_reshape_zero_squeeze_unsqueeze_gather_split():
    nodes = [
        helper.make_node("Reshape", ["x", "shape"], ["r"]),
        helper.make_node("Unsqueeze", ["r", "ax0"], ["u"]),
        helper.make_node("Squeeze", ["u", "ax0"], ["s"]),
        helper.make_node("Gather", ["s", "idx"], ["g"], axis=1),
        helper.make_node("Split", ["g", "sp"], ["a", "b"], axis=-1),
    ]
    inits = [
        ("shape", np.array([0, -1, 4], np.int64)),
        ("ax0", np.array([0], np.int64)),
        ("idx", np.array([[2, 0], [1, 1]], np.int64)),
        ("sp", np.array([1, 3], np.int64)),
    ]
    m = _model(nodes, [_vi("x", [2, 3, 8])], [_vi("a", None), _vi("b", None)], inits, opset=13)
    _check(m, {"x": RNG.normal(size=(2, 3, 8)).astype(np.float32)})


def test_scalar_constants_become_python_numbers():
    """x*c + d with [1]-shaped constants: exported as scalar ops, with no tensor operand (which would pin the
    op to NCHW behind TRANSPOSEs once converted)."""
    nodes = [helper.make_node("Mul", ["x", "c"], ["m"]), helper.make_node("Add", ["d", "m"], ["y"])]
    inits = [("c", np.array([1.5], np.float32)), ("d", np.array([0.25], np.float32))]
    m = _model(nodes, [_vi("x", [1, 2, 3, 3])], [_vi("y", None)], inits)
    _check(m, {"x": RNG.normal(size=(1, 2, 3, 3)).astype(np.float32)})
    mod = onnx_ops.convert(normalize(m, {"x": (1, 2, 3, 3)}).model)
    assert all(not list(sub.buffers()) for name, sub in mod.named_children() if "Mul" in name or "Add" in name)


def test_if_on_a_frozen_input_is_inlined_and_shapes_folded():
    """silero-vad's shape: an If on a frozen scalar input, and inside it an If on a shape-derived condition."""
    inner_then = helper.make_graph([helper.make_node("Neg", ["x"], ["t"])], "it", [], [_vi("t", None)])
    inner_else = helper.make_graph([helper.make_node("Identity", ["x"], ["e"])], "ie", [], [_vi("e", None)])
    shape_cond = [
        helper.make_node("Shape", ["x"], ["sh"]),
        helper.make_node("Gather", ["sh", "zero"], ["b"], axis=0),
        helper.make_node("Equal", ["b", "one"], ["is1"]),
        helper.make_node("If", ["is1"], ["inner"], then_branch=inner_then, else_branch=inner_else),
        helper.make_node("Mul", ["inner", "two"], ["o"]),
    ]
    then_g = helper.make_graph(shape_cond, "then", [], [_vi("o", None)])
    else_g = helper.make_graph([helper.make_node("Add", ["x", "two"], ["o2"])], "else", [], [_vi("o2", None)])
    nodes = [
        helper.make_node("Equal", ["sr", "k16"], ["c"]),
        helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g),
    ]
    inits = [
        ("k16", np.array(16000, np.int64)),
        ("zero", np.array(0, np.int64)),
        ("one", np.array(1, np.int64)),
        ("two", np.array(2.0, np.float32)),
    ]
    m = _model(nodes, [_vi("x", ["batch", 4]), _vi("sr", [], TensorProto.INT64)], [_vi("y", None)], inits)
    norm = _check(m, {"x": RNG.normal(size=(1, 4)).astype(np.float32)}, freeze={"sr": np.array(16000, np.int64)})
    assert [n.op_type for n in norm.model.graph.node] == ["Neg", "Mul"]
    assert any("If node(s) with a constant condition" in f for f in norm.facts)


def test_an_if_on_run_time_data_is_named():
    then_g = helper.make_graph([helper.make_node("Neg", ["x"], ["t"])], "then", [], [_vi("t", None)])
    else_g = helper.make_graph([helper.make_node("Identity", ["x"], ["e"])], "else", [], [_vi("e", None)])
    nodes = [
        helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
        helper.make_node("Greater", ["s", "zero"], ["c"]),
        helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g, name="gate"),
    ]
    m = _model(nodes, [_vi("x", [1, 4])], [_vi("y", None)], [("zero", np.array(0.0, np.float32))], opset=12)
    norm = normalize(m, {"x": (1, 4)})
    with pytest.raises(NotImplementedError, match="If node gate branches on a value computed at run time"):
        onnx_ops.convert(norm.model)


def test_constant_weights_become_initializers_and_conv_bn_folds():
    """paddle2onnx's shape: weights in Constant nodes, BatchNormalization after a Conv."""
    W = RNG.normal(size=(4, 3, 3, 3)).astype(np.float32)
    stats = [RNG.uniform(0.5, 1.5, 4).astype(np.float32) for _ in range(4)]
    nodes = [helper.make_node("Constant", [], ["w"], value=numpy_helper.from_array(W))]
    nodes += [helper.make_node("Constant", [], [k], value=numpy_helper.from_array(v)) for k, v in zip("sbmv", stats)]
    nodes += [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["y"]),
    ]
    m = _model(nodes, [_vi("x", [1, 3, 8, 8])], [_vi("y", None)], opset=12)
    norm = _check(m, {"x": RNG.normal(size=(1, 3, 8, 8)).astype(np.float32)}, atol=1e-4)
    assert [n.op_type for n in norm.model.graph.node] == ["Conv"]
    assert any("Constant node(s) moved into initializers" in f for f in norm.facts)


def test_hardswish_fusion_in_an_old_opset():
    nodes = [
        helper.make_node("Add", ["x", "three"], ["a"]),
        helper.make_node("Clip", ["a", "zero", "six"], ["c"]),
        helper.make_node("Mul", ["x", "c"], ["m"]),
        helper.make_node("Div", ["m", "six"], ["y"]),
    ]
    inits = [
        ("three", np.array([3.0], np.float32)),
        ("zero", np.array(0.0, np.float32)),
        ("six", np.array(6.0, np.float32)),
    ]
    m = _model(nodes, [_vi("x", [1, 2, 4, 4])], [_vi("y", None)], inits, opset=12)
    norm = _check(m, {"x": RNG.normal(0, 4, size=(1, 2, 4, 4)).astype(np.float32)})
    assert [(n.domain, n.op_type) for n in norm.model.graph.node] == [("optimize", "HardSwish")]


def test_unsupported_ops_are_named():
    node = helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "s", "z"], name="dq")
    m = _model([node], [_vi("x", [4])], [_vi("y", None)], opset=12)
    bad = onnx_ops.unsupported_ops(m)
    assert bad == ["DynamicQuantizeLinear (opset 12, node dq)"]


def test_free_dimensions_without_data_are_named():
    from optimize.convert.onnx_graph import NormalizeError

    m = _model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", ["batch", 3, "h", "w"])], [_vi("y", None)])
    with pytest.raises(NormalizeError, match=r"input x has free dimensions \[batch, 3, h, w\]"):
        normalize(m, {})

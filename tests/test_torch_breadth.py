"""More PyTorch and ONNX files as users bring them (issue 34): reflect padding of a middle axis through the
whole conversion, opsets outside the converters' range (22, 7) converted first, an empty .onnx, torch.cond,
a .pt2 exported with a dynamic batch, the op that keeps int8 with int8 I/O from being integer-only, torch's
chatter kept off the screen, and transformers importable beside the torch extra. Built here, no downloads.
"""

from __future__ import annotations

import logging
import os
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the torch extra (pip install -e '.[torch]') is not installed")
pytest.importorskip("litert_torch", reason="the torch extra is not installed")
pytest.importorskip("onnxruntime", reason="the torch extra is not installed")

from onnx import TensorProto, checker, helper, numpy_helper  # noqa: E402
from tests_support import one_line_error as assert_one_line_error  # noqa: E402

from optimize.convert.front import open_inputs  # noqa: E402
from optimize.models.tflite import read_model  # noqa: E402

RNG = np.random.default_rng(0)


def _cnn(opset: int):
    """Conv, Relu, MaxPool, GlobalAveragePool, Flatten, Gemm, Softmax at `opset` (IR 3 lists the weights as
    inputs, as files of that age do)."""
    inits = [
        numpy_helper.from_array(RNG.normal(size=(8, 3, 3, 3)).astype(np.float32) * 0.3, "w"),
        numpy_helper.from_array(RNG.normal(size=(8,)).astype(np.float32) * 0.1, "b"),
        numpy_helper.from_array(RNG.normal(size=(10, 8)).astype(np.float32) * 0.3, "fw"),
        numpy_helper.from_array(RNG.normal(size=(10,)).astype(np.float32) * 0.1, "fb"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("GlobalAveragePool", ["p"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("Gemm", ["f", "fw", "fb"], ["z"], transB=1),
        helper.make_node("Softmax", ["z"], ["y"], axis=1),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])
    listed = (
        [helper.make_tensor_value_info(i.name, TensorProto.FLOAT, list(i.dims)) for i in inits] if opset < 9 else []
    )
    g = helper.make_graph(nodes, f"cnn{opset}", [x, *listed], [helper.make_tensor_value_info("y", 1, [1, 10])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 3 if opset < 9 else 10
    checker.check_model(m)
    return m


@pytest.mark.parametrize("opset", [22, 7])
def test_an_onnx_model_of_another_opset_is_converted_first(opset, tmp_path):
    from optimize.convert import fidelity

    (tmp_path / "cnn.onnx").write_bytes(_cnn(opset).SerializeToString())
    np.savez(tmp_path / "d.npz", x=RNG.normal(size=(8, 3, 16, 16)).astype(np.float32))
    src, ds = open_inputs(tmp_path / "cnn.onnx", tmp_path / "d.npz")
    c = fidelity.measure(src, ds).conversion
    assert any(f.startswith(f"opset {opset} converted to opset ") for f in c.facts), c.facts
    assert c.fidelity.relative_error < 1e-5


def test_reflect_padding_of_a_middle_axis_converts(tmp_path):
    """tf2onnx's Keras audio models (basic-pitch) reflect-pad the time axis of [N, T, C]."""
    from optimize.convert import fidelity

    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("Pad", ["r", "pads"], ["p"], mode="reflect"),
        helper.make_node("Mul", ["p", "p"], ["y"]),
    ]
    pads = numpy_helper.from_array(np.array([0, 3, 0, 0, 2, 0], np.int64), "pads")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 20, 4])
    g = helper.make_graph(nodes, "pad3", [x], [helper.make_tensor_value_info("y", 1, None)], [pads])
    (tmp_path / "pad.onnx").write_bytes(
        helper.make_model(g, opset_imports=[helper.make_opsetid("", 15)]).SerializeToString()
    )
    np.savez(tmp_path / "d.npz", x=RNG.normal(size=(8, 20, 4)).astype(np.float32))
    src, ds = open_inputs(tmp_path / "pad.onnx", tmp_path / "d.npz")
    assert fidelity.measure(src, ds).conversion.fidelity.relative_error == 0


def test_an_empty_onnx_file_is_named_empty(tmp_path, cli):
    (tmp_path / "model.onnx").write_bytes(b"")
    np.savez(tmp_path / "d.npz", x=np.zeros((4, 3), np.float32))
    for cmd in ("sweep", "compat"):
        assert_one_line_error(
            cli(cmd, str(tmp_path / "model.onnx"), "-d", str(tmp_path / "d.npz")), "is empty (0 bytes)"
        )


class Branching(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 4)

    def forward(self, x):
        return torch.cond(x.sum() > 0, lambda x: self.lin(x).relu(), lambda x: self.lin(x) * 0.5, (x,))


class Plain(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.lin(x).relu()


def test_torch_cond_is_refused_with_the_rewrite(tmp_path, cli):
    torch.manual_seed(0)
    torch.export.save(torch.export.export(Branching().eval(), (torch.randn(1, 8),)), str(tmp_path / "cond.pt2"))
    np.savez(tmp_path / "d.npz", x=RNG.normal(size=(8, 8)).astype(np.float32))
    msg = assert_one_line_error(
        cli("compat", str(tmp_path / "cond.pt2"), "-d", str(tmp_path / "d.npz")), "uses torch.cond", "torch.where"
    )
    assert "test_torch_breadth.py" in msg  # where in the model's code


def test_a_dynamic_batch_fixed_to_the_data_is_said(tmp_path):
    batch = torch.export.Dim("batch", min=1, max=64)
    ep = torch.export.export(Plain().eval(), (torch.randn(2, 8),), dynamic_shapes={"x": {0: batch}})
    torch.export.save(ep, str(tmp_path / "dyn.pt2"))
    np.savez(tmp_path / "d.npz", x=RNG.normal(size=(8, 8)).astype(np.float32))
    src, _ = open_inputs(tmp_path / "dyn.pt2", tmp_path / "d.npz")
    assert "input x [?, 8] fixed to [1, 8] (dynamic in the program" in " ".join(src.conversion.facts)
    assert src.conversion.inputs[0].shape == [1, 8]
    from optimize.present.lines import conversion_line

    assert "; input x [?, 8] fixed to [1, 8])" in conversion_line(src.conversion)  # the note every candidate has


def test_int8_with_int8_io_names_the_op_that_blocks_it(tmp_path):
    """HardSigmoid lowers to RELU_0_TO_1, which LiteRT Quantizer has no integer version of: that is the
    blocker, not the CONV_2D beside it."""
    from optimize.core.recipe import build
    from optimize.engine import single

    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.Hardsigmoid(), torch.nn.Conv2d(8, 8, 3, padding=1),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 4),
    ).eval()  # fmt: skip
    torch.onnx.export(net, (torch.randn(1, 3, 16, 16),), str(tmp_path / "hs.onnx"), dynamo=False, opset_version=13)
    np.savez(tmp_path / "d.npz", x=RNG.normal(size=(24, 3, 16, 16)).astype(np.float32))
    c = single.run(
        build("int8-int8io", [{"technique": "quantize", "scheme": "int8", "io": "int8"}]), tmp_path / "hs.onnx",
        tmp_path / "d.npz", tmp_path / "out", jobs=0,
    )  # fmt: skip
    assert not c.ok and "RELU_0_TO_1 has no integer version in LiteRT Quantizer" in c.error, c.error


def test_torch_and_its_libraries_talk_into_the_log_not_on_the_screen(capfd, caplog):
    from optimize.convert import torch_export

    with caplog.at_level(logging.DEBUG, logger="optimize.convert"), torch_export.quiet():
        print("Failed to load .../torchao/_C_mxfp8.so")  # torchao, on stdout or stderr
        print("W1127 _pytree.py:630] <enum 'KernelPreference'> ...", file=sys.stderr)
        os.write(2, b"WARNING: All log messages before absl::InitializeLog() is called\n")  # C++, on fd 2
    out, err = capfd.readouterr()
    assert "torchao" not in out + err and "_pytree" not in out + err and "absl" not in out + err
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "torchao" in said and "_pytree" in said and "absl" in said


def test_a_pt2e_note_says_what_the_edges_hold(tmp_path):
    from optimize.convert import torch_export
    from optimize.transforms.pt2e import io_words

    torch.export.save(torch.export.export(Plain().eval(), (torch.randn(1, 8),)), str(tmp_path / "p.pt2"))
    np.savez(tmp_path / "d.npz", x=RNG.normal(size=(8, 8)).astype(np.float32))
    src, _ = open_inputs(tmp_path / "p.pt2", tmp_path / "d.npz")
    assert io_words(src.content) == "float32 input and output tensors"
    sg = read_model(src.content).main
    assert sg.tensors[sg.inputs[0]].dtype == "float32"
    assert torch_export.HIGHER_ORDER["cond"].startswith("compute both branches")

"""One module, two routes (issue 42 item 2; issue 40 items 4 and 5): a module's ONNX export converts to the ops
its .pt2 converts to (GELU fused, MatMul + bias as FULLY_CONNECTED), so the same candidates exist through both;
an end-to-end detector head (TopK with a constant K, ArgMax, GatherElements) converts from ONNX; a lowering that
fails names the ONNX node and op; PT2E keeps integer constants and tensors off quantization and writes softmax
outputs at the scale LiteRT requires; clamps (MINIMUM/MAXIMUM) are integer in an integer-only model.
"""

from __future__ import annotations

import sys
from collections import Counter

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the torch extra (pip install -e '.[torch]') is not installed")
pytest.importorskip("litert_torch", reason="the torch extra is not installed")
pytest.importorskip("onnxruntime", reason="the torch extra is not installed")

from optimize.convert.front import open_inputs  # noqa: E402
from optimize.core.errors import ModelError  # noqa: E402
from optimize.core.recipe import build  # noqa: E402
from optimize.engine import single  # noqa: E402
from optimize.models import runtime  # noqa: E402
from optimize.models.tflite import read_model  # noqa: E402


def _export(net, folder, name, sample, inputs=("x",), outputs=("y",)):
    net.eval()
    torch.export.save(torch.export.export(net, sample), str(folder / f"{name}.pt2"))
    torch.onnx.export(
        net, sample, str(folder / f"{name}.onnx"), input_names=list(inputs), output_names=list(outputs),
        opset_version=17, dynamo=False,
    )  # fmt: skip


def _ops(content: bytes) -> Counter:
    return Counter(op.name for op in read_model(content).main.ops)


class Block(torch.nn.Module):
    """A transformer's feed-forward block on a sequence: LayerNorm, Linear, GELU (erf), Linear, clamped."""

    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(16)
        self.up, self.down = torch.nn.Linear(16, 32), torch.nn.Linear(32, 4)

    def forward(self, x):
        return torch.clamp(self.down(torch.nn.functional.gelu(self.up(self.norm(x)))), -1.5, 2.0)


class Head(torch.nn.Module):
    """An end-to-end detector head: boxes from cell centres (`* 8`: an integer constant in float arithmetic),
    the best class per cell, TopK cells, their boxes and classes gathered: [1, K, 6]."""

    def __init__(self):
        super().__init__()
        self.box, self.cls = torch.nn.Conv2d(3, 4, 4, 4), torch.nn.Conv2d(3, 3, 4, 4)
        g = torch.arange(4, dtype=torch.float32) * 4 + 2
        yy, xx = torch.meshgrid(g, g, indexing="ij")
        self.register_buffer("centers", torch.stack([xx, yy], -1).reshape(1, 16, 2))

    def forward(self, images):
        d = torch.nn.functional.softplus(self.box(images)).flatten(2).transpose(1, 2) * 8
        p = torch.sigmoid(self.cls(images)).flatten(2).transpose(1, 2)
        boxes = torch.cat([self.centers - d[..., :2], self.centers + d[..., 2:]], -1)
        score, label = p.max(-1)
        top, idx = score.topk(5, dim=1)
        boxes = boxes.gather(1, idx.unsqueeze(-1).expand(-1, -1, 4))
        return torch.cat([boxes, top.unsqueeze(-1), label.gather(1, idx).unsqueeze(-1).to(boxes.dtype)], -1)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("routes")
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    _export(Block(), d, "block", (torch.randn(1, 6, 16),))
    np.savez(d / "block.npz", x=rng.normal(size=(32, 1, 6, 16)).astype(np.float32))
    _export(Head(), d, "head", (torch.rand(1, 3, 16, 16),), ["images"], ["detections"])
    np.savez(d / "head.npz", x=rng.uniform(size=(24, 1, 3, 16, 16)).astype(np.float32))
    return d


def test_an_onnx_export_converts_to_the_ops_its_pt2_converts_to(files):
    pt2, _ = open_inputs(files / "block.pt2", files / "block.npz")
    onnx, _ = open_inputs(files / "block.onnx", files / "block.npz")
    a, b = _ops(pt2.content), _ops(onnx.content)
    assert b["GELU"] == a["GELU"] == 1 and "MINIMUM" in b  # the erf polynomial fused back into one GELU
    assert b["FULLY_CONNECTED"] == a["FULLY_CONNECTED"] == 2  # MatMul + bias Add: one FULLY_CONNECTED each
    assert "BATCH_MATMUL" not in b and b["ADD"] <= a["ADD"]
    assert any("fused" in f and "Gelu" in f and "Linear" in f for f in onnx.facts), onnx.facts


def test_an_end_to_end_detector_head_converts_from_onnx_and_matches_onnx_runtime(files):
    src, ds = open_inputs(files / "head.onnx", files / "head.npz", threads=1)
    ops = _ops(src.content)
    assert ops["TOPK_V2"] == 1 and ops["ARG_MAX"] == 1 and ("GATHER" in ops or "GATHER_ND" in ops)
    fid = src.conversion.fidelity
    assert fid is not None and max(o.max_abs_diff for o in fid.outputs) < 1e-4  # against ONNX Runtime
    pt2, _ = open_inputs(files / "head.pt2", files / "head.npz")
    x = {"images": ds.x_test[:4]} if not isinstance(ds.x_test, dict) else {k: v[:4] for k, v in ds.x_test.items()}
    a = runtime.Runner(runtime.load(src.content)).predict(x)[0]
    b = runtime.Runner(runtime.load(pt2.content)).predict(x)[0]
    np.testing.assert_allclose(a, b, atol=1e-4)  # the same detections through both routes


def test_a_lowering_that_fails_names_the_onnx_node_and_op(tmp_path):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"], name="/head/MatMul"),
        helper.make_node("NonZero", ["h"], ["nz"], name="/head/NonZero"),
        helper.make_node("Cast", ["nz"], ["f"], to=1, name="/head/Cast"),
        helper.make_node("ReduceSum", ["f"], ["y"], keepdims=0, name="/head/Sum"),
    ]
    g = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.ones((8, 8), np.float32), "w")],
    )  # fmt: skip
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "nz.onnx")
    np.savez(tmp_path / "d.npz", x=np.ones((2, 1, 8), np.float32))
    with pytest.raises(ModelError, match=r"at ONNX node 'head/NonZero', op NonZero; torch op aten\.nonzero"):
        open_inputs(tmp_path / "nz.onnx", tmp_path / "d.npz")


# ------------------------------------------------------------------------------------------- PT2E graph fixes


def test_integer_constants_of_float_arithmetic_are_written_as_floats():
    from optimize.transforms.pt2e import float_scalars

    class M(torch.nn.Module):
        def forward(self, x):
            return x * 8 + 1

    ep = torch.export.export(M(), (torch.randn(2, 3),))
    module = ep.module()
    assert float_scalars(module) == 2
    args = [a for n in module.graph.nodes if n.op == "call_function" for a in n.args if not hasattr(a, "op")]
    assert args and all(isinstance(a, float) for a in args)
    x = torch.randn(2, 3)
    torch.testing.assert_close(module(x), x * 8 + 1)


def test_quantize_dequantize_pairs_on_integer_tensors_are_removed():
    """PT2E's annotators can put a quantize/dequantize pair on an integer tensor (an int64 constant, top-k
    indices): removed, the tensor kept integer, and the op reading it named."""
    from torch.ao.quantization.fx import _decomposed  # noqa: F401 - registers quantized_decomposed ops

    from optimize.transforms.pt2e import integers_kept

    g = torch.fx.Graph()
    x = g.placeholder("x")
    idx = g.call_function(torch.ops.aten.argmax.default, (x, 1))
    q = g.call_function(
        torch.ops.quantized_decomposed.quantize_per_tensor.default, (idx, 0.1, 0, -128, 127, torch.int8)
    )
    dq = g.call_function(
        torch.ops.quantized_decomposed.dequantize_per_tensor.default, (q, 0.1, 0, -128, 127, torch.int8)
    )
    out = g.call_function(torch.ops.aten.add.Tensor, (dq, 1))
    g.output(out)
    m = torch.fx.GraphModule(torch.nn.Module(), g)
    idx.meta["val"] = torch.zeros(2, dtype=torch.int64)
    assert integers_kept(m) == ["add"]
    assert not any("quantize" in str(n.target) for n in m.graph.nodes)
    xs = torch.randn(2, 5)
    torch.testing.assert_close(m(xs), xs.argmax(1) + 1)


def test_a_softmax_at_the_wrong_scale_gets_the_scale_its_kernel_requires(tmp_path):
    """LiteRT's int8 SOFTMAX refuses an output scale other than 1/256 (PT2E wrote one: YOLOv8's DFL softmax);
    the fix sets it and requantizes to the old scale for the readers."""
    from optimize.core.registry import Context
    from optimize.models.normalize import _load, _save
    from optimize.transforms.tflite import kernel_params
    from optimize.transforms.tflite.quantize import QuantizeParams, quantize

    class Dfl(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c = torch.nn.Conv2d(3, 64, 3, 2, 1)
            self.proj = torch.nn.Conv2d(16, 1, 1, bias=False)

        def forward(self, x):
            b = self.c(x).view(1, 4, 16, 64).transpose(2, 1)
            return self.proj(b.softmax(1)).view(1, 4, 64)

    torch.manual_seed(0)
    torch.export.save(torch.export.export(Dfl().eval(), (torch.randn(1, 3, 16, 16),)), str(tmp_path / "dfl.pt2"))
    np.savez(tmp_path / "d.npz", x=np.random.default_rng(0).normal(size=(16, 1, 3, 16, 16)).astype(np.float32))
    src, ds = open_inputs(tmp_path / "dfl.pt2", tmp_path / "d.npz")
    (tmp_path / "f.tflite").write_bytes(src.content)
    good = quantize(tmp_path / "f.tflite", QuantizeParams(scheme="int8", samples=8), Context(workdir=tmp_path, data=ds))
    good = good.read_bytes()
    assert kernel_params.fixed_output_scales(good) == (good, [])  # LiteRT Quantizer writes 1/256 itself
    model = _load(good)
    sg = model.subgraphs[0]
    codes = [max(c.builtinCode or 0, c.deprecatedBuiltinCode or 0) for c in model.operatorCodes]
    softmax = next(op for op in sg.operators if codes[op.opcodeIndex] == 25)  # SOFTMAX
    sg.tensors[int(softmax.outputs[0])].quantization.scale[:] = 0.0007  # a reader's calibrated scale
    bad = _save(model)
    with pytest.raises(ModelError, match="1.f / 256"):
        runtime.load(bad)
    fixed, said = kernel_params.fixed_output_scales(bad)
    assert said and said[0].startswith("SOFTMAX")
    x = ds.x_test
    a = runtime.Runner(runtime.load(fixed)).predict(x)[0].astype(np.float32)
    b = runtime.Runner(runtime.load(good)).predict(x)[0].astype(np.float32)
    assert np.abs(a - b).mean() <= 0.05 * (np.abs(b).max() + 1e-6)


def test_a_clamp_is_integer_in_an_integer_only_model(files, tmp_path):
    for kind in ("pt2", "onnx"):
        c = single.run(
            build("int8-int8io", [{"technique": "quantize", "scheme": "int8", "io": "int8"}]),
            files / f"block.{kind}", files / "block.npz", tmp_path / kind, jobs=0,
        )  # fmt: skip
        assert c.ok, c.error
        assert not c.composition.float_compute_ops and any("MINIMUM/MAXIMUM" in n for n in c.notes), c.notes
        assert c.metrics.fidelity.relative_error < 0.05


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["pt2", "onnx"])
def test_pt2e_makes_the_detector_head_and_the_block_through_both_routes(files, tmp_path, kind):
    for name in ("head", "block"):
        c = single.run(
            build("int8-pt2e", [{"technique": "pt2e"}]), files / f"{name}.{kind}", files / f"{name}.npz",
            tmp_path / name, jobs=0,
        )  # fmt: skip
        assert c.ok, (name, c.error)
        assert c.composition.shrink <= 0.5


def test_constant_subgraphs_of_a_pt2_are_folded_as_the_onnx_route_folds_them(tmp_path):
    """Hugging Face's ViT computes constants from its own buffers at run time: the .pt2 route kept those ops (the
    GPU refuses BROADCAST_TO; XNNPACK does not take them), the ONNX route folded them; both now store the values,
    and the outputs are the same."""
    try:
        import torchvision  # noqa: F401  (transformers imports it; PyPI's CUDA build fails beside a CPU torch)
    except Exception:  # noqa: BLE001
        sys.modules.update({m: None for m in [m for m in sys.modules if m.split(".")[0] == "torchvision"]})
        sys.modules["torchvision"] = None
    transformers = pytest.importorskip("transformers")
    cfg = transformers.ViTConfig(
        image_size=16, patch_size=8, num_channels=3, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=32, num_labels=3,
    )  # fmt: skip

    class ViT(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = transformers.ViTForImageClassification(cfg)

        def forward(self, x):
            return self.m(pixel_values=x).logits

    torch.manual_seed(0)
    _export(ViT(), tmp_path, "m", (torch.randn(1, 3, 16, 16),))
    np.savez(tmp_path / "d.npz", x=np.random.default_rng(0).normal(size=(8, 1, 3, 16, 16)).astype(np.float32))
    pt2, ds = open_inputs(tmp_path / "m.pt2", tmp_path / "d.npz", threads=1)
    onnx, _ = open_inputs(tmp_path / "m.onnx", tmp_path / "d.npz")
    assert any("on constants computed once" in f for f in pt2.facts), pt2.facts
    assert "BROADCAST_TO" not in _ops(pt2.content)
    assert max(o.max_abs_diff for o in pt2.conversion.fidelity.outputs) < 1e-4
    a = runtime.Runner(runtime.load(pt2.content)).predict(ds.x_test)[0]
    b = runtime.Runner(runtime.load(onnx.content)).predict(ds.x_test)[0]
    np.testing.assert_allclose(a, b, atol=1e-4)


def test_a_constant_operand_of_a_lower_rank_is_given_its_readers_rank(tmp_path):
    """A positional table [T, C] added to [1, T, C] (Whisper's encoder through torch.export): the GPU delegate
    refuses the broadcast, torch.onnx writes the table [1, T, C]; the .pt2 route now stores it at rank 3 too."""

    class Positions(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.pos = torch.nn.Parameter(torch.randn(6, 8))

        def forward(self, x):
            return torch.tanh(torch.relu(x) + self.pos)

    torch.manual_seed(0)
    _export(Positions(), tmp_path, "p", (torch.randn(1, 6, 8),))
    np.savez(tmp_path / "d.npz", x=np.random.default_rng(0).normal(size=(8, 1, 6, 8)).astype(np.float32))
    pt2, ds = open_inputs(tmp_path / "p.pt2", tmp_path / "d.npz", threads=1)
    g = read_model(pt2.content).main
    add = next(op for op in g.ops if op.name == "ADD")
    ranks = [len(g.tensors[i].shape) for i in add.inputs]
    assert ranks[0] == ranks[1], ranks  # no broadcast left for the GPU delegate to refuse
    assert any("given their reader's rank" in f for f in pt2.facts), pt2.facts
    assert max(o.max_abs_diff for o in pt2.conversion.fidelity.outputs) < 1e-5

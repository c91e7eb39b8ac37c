"""Attention models (issue 34): a seeded nn.TransformerEncoder classifier with a padding mask, as a .pt2 and as
ONNX, and a Keras 3 MultiHeadAttention classifier with int32 ids and a padding mask, all built here (no
downloads). Their masks' -inf / -1e9 fills are made finite before calibration without changing the float
model; an ONNX embedding becomes EMBEDDING_LOOKUP; weights a weight recipe leaves float32 are stored at its
width; int8 is made and measured; the GPU report names what keeps them off the GPU; TRANSPOSEs that move
attention heads are not called layout changes. A Hugging Face BertModel (built from a config) runs end to end
in the slow tests.
"""

from __future__ import annotations

import math
import sys

import encoder_fixtures
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the torch extra (pip install -e '.[torch]') is not installed")
pytest.importorskip("litert_torch", reason="the torch extra is not installed")
pytest.importorskip("onnxruntime", reason="the torch extra is not installed")

from optimize.convert.front import open_inputs  # noqa: E402
from optimize.core.recipe import build  # noqa: E402
from optimize.engine import single  # noqa: E402
from optimize.models.tflite import read_model  # noqa: E402
from optimize.transforms.tflite import masks  # noqa: E402

VOCAB, T = 40, 8


def tokens(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    return encoder_fixtures.tokens(n, VOCAB, T, seed)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    torch.manual_seed(0)
    net = encoder_fixtures.encoder(VOCAB, 32, 64, T).eval()
    return encoder_fixtures.save(tmp_path_factory.mktemp("attention"), net, *tokens(48))


def _samples(ds, n: int, split: str = "x_cal") -> list[dict]:
    xs = getattr(ds, split)
    return [{k: v[i : i + 1] for k, v in xs.items()} for i in range(min(n, len(next(iter(xs.values())))))]


def _ops(content: bytes) -> list[str]:
    return [op.name for op in read_model(content).main.ops]


def test_mask_fills_are_made_finite_and_the_float_model_computes_the_same(files):
    from optimize.models import runtime

    src, ds = open_inputs(files / "enc.pt2", files / "tokens.npz")
    fills = masks.find(src.content)
    assert fills is not None and math.isinf(fills.fill) and fills.scores  # masked_fill(-inf) reaches a softmax
    cal, held = _samples(ds, 16), _samples(ds, 8, "x_test")
    made = masks.make_finite(src.content, cal, held)
    assert made.note and "of -inf set to" in made.note and "8 held out" in made.note
    assert masks.find(made.content) is None  # nothing at or below -LARGE is left on a path to a softmax
    value = next(v for i in fills.constants for v in read_model(made.content).main.tensors[i].values())
    lo, _ = masks.score_range(src.content, fills, cal)
    assert -1e4 < value < lo - 10  # finite, below every score the calibration samples give by the margin
    before = runtime.Runner(runtime.load(src.content)).predict(ds.x_test)
    after = runtime.Runner(runtime.load(made.content)).predict(ds.x_test)
    np.testing.assert_allclose(after[0], before[0], rtol=1e-6, atol=1e-6)


def test_a_fill_that_changes_the_outputs_is_left_as_it_was(files):
    src, ds = open_inputs(files / "enc.pt2", files / "tokens.npz")
    cal = _samples(ds, 8)
    fills = masks.find(src.content)
    # scores measured as if they reached 1e3 above what they do: a fill this close changes the softmax
    real = masks.score_range

    def close_range(*a, **k):
        lo, hi = real(*a, **k)
        return lo + 1e3, hi

    masks.score_range = close_range
    try:
        made = masks.make_finite(src.content, cal, cal[:2])
    finally:
        masks.score_range = real
    assert made.content == src.content and fills is not None
    assert "no finite fill keeps the float model's outputs" in made.note


def test_int8_of_a_transformer_encoder_calibrates_its_mask(files, tmp_path):
    cand = single.run(
        build("int8", [{"technique": "quantize", "scheme": "int8"}]), files / "enc.pt2", files / "tokens.npz",
        tmp_path, jobs=0,
    )  # fmt: skip
    assert cand.ok, cand.error
    assert any("attention mask fill(s) of -inf set to" in n for n in cand.notes), cand.notes
    assert cand.composition.weight_bytes.get("int8") and cand.metrics.fidelity.relative_error < 0.05


def test_an_onnx_embedding_is_an_embedding_lookup_that_float16_and_dynamic_shrink(files, tmp_path):
    src, _ = open_inputs(files / "enc.onnx", files / "tokens.npz")
    ops = _ops(src.content)
    assert "EMBEDDING_LOOKUP" in ops and "GATHER_ND" not in ops
    for scheme, limit in (("float16", 0.6), ("dynamic", 0.5)):
        cand = single.run(
            build(scheme, [{"technique": "quantize", "scheme": scheme}]), files / "enc.onnx", files / "tokens.npz",
            tmp_path / scheme, jobs=0,
        )  # fmt: skip
        assert cand.ok, cand.error
        assert cand.composition.shrink <= limit and "EMBEDDING_LOOKUP" not in cand.composition.float_op_types


def test_tensor_names_are_the_models_own():
    from optimize.convert.names import readable

    stack = "optimize.convert.onnx_ops.NamedIO/optimize.convert.onnx_ops.Program_inner"
    unflat = "/torch.export.unflatten.UnflattenedModule_m/torch.export.unflatten.InterpreterModule_enc"
    assert readable(f"{stack}{unflat}/torch.export.unflatten.InterpreterModule_self_attn;17") == "enc/self_attn;17"
    assert readable(f"{stack};31") == ";31"  # nothing readable left: the caller names it after its op
    fused = "optimize.convert.onnx_ops.NamedIO/onnx2torch.node_converters.matmul.OnnxMatMul_enc/layers/0/MatMul;"
    assert readable(fused + fused.replace("MatMul;", "Add;")) == "enc/layers/0/MatMul;enc/layers/0/Add;"
    for plain in ("arith.constant12", "serving_default_x:0", "model/dense/MatMul;model/dense/BiasAdd"):
        assert readable(plain) == plain


def test_a_converted_pt2_names_tensors_after_its_modules(files):
    src, _ = open_inputs(files / "enc.pt2", files / "tokens.npz")
    names = [t.name for t in read_model(src.content).main.tensors]
    assert not any("optimize.convert" in n or "torch.export" in n for n in names)
    assert any(n.startswith("enc/0/self_attn;") for n in names) and len(set(names)) == len(names)


def test_the_gpu_report_names_the_integer_inputs_and_transposes_are_attention_heads(files):
    from optimize.delegates import check_delegates, format_report

    src, _ = open_inputs(files / "enc.pt2", files / "tokens.npz")
    reports = check_delegates(src.content, ["gpu"])
    r = reports["gpu"]
    assert r.verdict != "full" and any("EMBEDDING_LOOKUP looks up an embedding table" in h for h in r.hints)
    text = format_report(reports)
    assert r.transposes and r.layout_transposes == 0
    assert "heads of multi-head attention" in text and "channels-last" not in text


def test_quantizer_outputs_the_runtime_aborts_on_are_a_failed_attempt(files):
    """A constant operand with quantization scale 0 makes the runtime's preparation abort the process (the
    TFLite calibrator's int16 SUB on a BertModel did that to a worker): made in a child, named, contained."""
    from optimize.core.errors import TechniqueFailed
    from optimize.models.normalize import _load, _save
    from optimize.transforms.tflite.session import made_by, zero_scales

    src, ds = open_inputs(files / "enc.pt2", files / "tokens.npz")
    cand_model = _int8_model(src, ds)
    model = _load(cand_model)
    sg = model.subgraphs[0]
    broken = None
    for op in sg.operators:
        code = model.operatorCodes[op.opcodeIndex]
        if max(code.builtinCode, code.deprecatedBuiltinCode) == 0:  # ADD
            for i in op.inputs:
                t = sg.tensors[i]
                if (
                    t.quantization is not None
                    and t.quantization.scale is not None
                    and model.buffers[t.buffer].data is not None
                ):
                    t.quantization.scale = np.zeros_like(t.quantization.scale)
                    broken = t
                    break
        if broken is not None:
            break
    assert broken is not None
    bad = _save(model)
    assert zero_scales(bad)
    with pytest.raises(TechniqueFailed, match="crashed .SIGABRT. while preparing it .ADD"):
        made_by("a quantizer", bad)
    assert made_by("a quantizer", cand_model) == cand_model


def _int8_model(src, ds) -> bytes:
    from pathlib import Path
    from tempfile import mkdtemp

    from optimize.core.registry import Context
    from optimize.transforms.tflite.quantize import QuantizeParams, quantize

    folder = Path(mkdtemp())
    (folder / "f.tflite").write_bytes(src.content)
    out = quantize(folder / "f.tflite", QuantizeParams(scheme="int8", samples=16), Context(workdir=folder, data=ds))
    return out.read_bytes()


def test_per_tensor_ranges_get_one_value_per_axis():
    from optimize.transforms.tflite.quantizer_setup import _keepdims

    class T:
        def __init__(self, name, rank):
            self.name, self.rank = name, rank

    class G:
        tensors = [T("a", 2), T("b", 3), T("c", 2)]

    class M:
        subgraphs = [G()]

    import optimize.models.tflite as tfl

    real = tfl.read_model
    tfl.read_model = lambda content: M()
    try:
        out = _keepdims({"a": {"min": np.zeros(1), "max": np.ones(1)}, "c": {"min": np.zeros(2)}}, b"")
    finally:
        tfl.read_model = real
    assert out["a"]["min"].shape == (1, 1) and out["a"]["max"].shape == (1, 1)
    assert out["c"]["min"].shape == (2,)  # per-channel ranges are left as they are


# ------------------------------------------------------------------------------------------- Keras 3


@pytest.fixture(scope="module")
def keras_text(tmp_path_factory):
    """A Keras 3 text classifier: int32 ids and padding mask, MultiHeadAttention (its softmax adds -1e9-ish
    fills where the mask is 0)."""
    from optimize.models import _tf

    keras = _tf.keras3()
    keras.utils.set_random_seed(0)
    d = tmp_path_factory.mktemp("keras_text")
    ids_in = keras.Input((T,), dtype="int32", name="input_ids")
    mask_in = keras.Input((T,), dtype="int32", name="attention_mask")
    h = keras.layers.Embedding(64, 16)(ids_in)
    h = h + keras.layers.Embedding(T, 16)(keras.ops.arange(T)[None])
    a = keras.layers.MultiHeadAttention(2, 8)(h, h, attention_mask=keras.ops.cast(mask_in[:, None, :], "bool"))
    h = keras.layers.LayerNormalization()(h + a)
    out = keras.layers.Dense(3)(keras.ops.mean(h, 1))
    keras.Model([ids_in, mask_in], out).save(d / "text.keras")
    ids, mask = tokens(40, 1)
    np.savez(d / "text.npz", **{"x:input_ids": ids.astype(np.int32), "x:attention_mask": mask.astype(np.int32)})
    return d


def test_keras_attention_gets_int8_and_its_embedding_float16(keras_text, tmp_path):
    made = {}
    for scheme in ("int8", "float16"):
        made[scheme] = c = single.run(
            build(scheme, [{"technique": "convert"}, {"technique": "quantize", "scheme": scheme}]),
            keras_text / "text.keras", keras_text / "text.npz", tmp_path / scheme, jobs=0,
        )  # fmt: skip
        assert c.ok, c.error
    assert any("attention mask fill(s) of -" in n for n in made["int8"].notes), made["int8"].notes
    assert made["int8"].metrics.fidelity.relative_error < 0.05
    # the embedding's GATHER table, which the float16 recipe does not reach, stored as float16 too
    assert any("read by" in n and "GATHER" in n and "float16 behind DEQUANTIZE" in n for n in made["float16"].notes)
    assert made["float16"].composition.shrink <= 0.55


def test_keras_mask_cast_is_named_as_the_gpu_blocker_with_the_fix(keras_text, tmp_path):
    from optimize.delegates import check_delegates

    c = single.run(
        build("float32", [{"technique": "convert"}]), keras_text / "text.keras", keras_text / "text.npz",
        tmp_path, jobs=0,
    )  # fmt: skip
    hints = check_delegates(tmp_path / c.artifact, ["gpu"])["gpu"].hints
    assert any("CAST turns an integer mask into bool" in h and "float32" in h for h in hints), hints


# ------------------------------------------------------------------------------------------- Hugging Face


def _bert():
    """A 2-layer BertModel from a config (random init) with a classifier on its pooled output. transformers
    imports torchvision when it is installed; PyPI's CUDA build fails beside the CPU torch, so it is hidden
    here when it cannot be imported (pyproject's torch extra pins the build installed beside torch)."""
    try:
        import torchvision  # noqa: F401
    except Exception:  # noqa: BLE001 - the CUDA build beside a CPU torch
        for name in [m for m in sys.modules if m.split(".")[0] == "torchvision"]:
            del sys.modules[name]
        sys.modules["torchvision"] = None
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=16, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )  # fmt: skip

    class Classifier(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bert = transformers.BertModel(cfg)
            self.head = torch.nn.Linear(32, 3)

        def forward(self, input_ids, attention_mask):
            return self.head(self.bert(input_ids=input_ids, attention_mask=attention_mask).pooler_output)

    torch.manual_seed(0)
    return Classifier().eval()


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["pt2", "onnx"])
def test_a_bert_model_gets_float16_dynamic_and_int8(kind, files, tmp_path):
    net = _bert()
    ids, mask = tokens(48, 2)
    sample = (torch.from_numpy(ids[:1]), torch.from_numpy(mask[:1]))
    path = tmp_path / f"bert.{kind}"
    if kind == "pt2":
        torch.export.save(torch.export.export(net, sample), str(path))
    else:
        torch.onnx.export(
            net, sample, str(path), input_names=["input_ids", "attention_mask"], output_names=["logits"],
            opset_version=17, dynamo=False,
        )  # fmt: skip
    np.savez(tmp_path / "d.npz", **{"x:input_ids": ids, "x:attention_mask": mask})
    for scheme, limit in (("float16", 0.6), ("dynamic", 0.5), ("int8", 0.5)):
        c = single.run(
            build(scheme, [{"technique": "quantize", "scheme": scheme}]), path, tmp_path / "d.npz",
            tmp_path / scheme, jobs=0,
        )  # fmt: skip
        assert c.ok, c.error
        assert c.composition.shrink <= limit and c.metrics.fidelity.relative_error < 0.05, (scheme, c.metrics)

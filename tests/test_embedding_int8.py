"""int8 for embedding-heavy models (issue 42 item 1): a seeded encoder whose weights are mostly its embedding
table, as a .pt2 and as ONNX, gets int8, int8 with int8 I/O and PT2E int8 whose weights shrink as int8's do
(the table int8 however it is looked up); the edits that make it so are exact; a Keras transformer's mask CAST
is integer with int8 I/O; pruning a recommender whose weights are its embeddings reaches its sparsity, and a
layer it cannot prune is named.
"""

from __future__ import annotations

import encoder_fixtures
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the torch extra (pip install -e '.[torch]') is not installed")
pytest.importorskip("litert_torch", reason="the torch extra is not installed")
pytest.importorskip("onnxruntime", reason="the torch extra is not installed")

from optimize.convert.front import open_inputs  # noqa: E402
from optimize.core.recipe import build  # noqa: E402
from optimize.engine import single  # noqa: E402
from optimize.models import runtime  # noqa: E402
from optimize.models.tflite import read_model  # noqa: E402
from optimize.transforms.tflite import islands, tables  # noqa: E402

VOCAB, T, D = 600, 8, 16  # the table (9,600 weights) outweighs the rest of the model (~3,300)


def tokens(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    return encoder_fixtures.tokens(n, VOCAB, T, seed)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    torch.manual_seed(0)
    net = encoder_fixtures.encoder(VOCAB, D, 32, T).eval()
    return encoder_fixtures.save(tmp_path_factory.mktemp("embedding_heavy"), net, *tokens(40))


def _run(content: bytes, ds) -> np.ndarray:
    return runtime.Runner(runtime.load(content)).predict(ds.x_test)[0].astype(np.float32)


def test_a_lookup_as_gather_computes_the_same_rows(files):
    src, ds = open_inputs(files / "enc.pt2", files / "tokens.npz")
    assert tables.lookups(src.content) and "EMBEDDING_LOOKUP" in [op.name for op in read_model(src.content).main.ops]
    made, n = tables.lookups_as_gather(src.content)
    ops = [op.name for op in read_model(made).main.ops]
    assert n == 1 and "GATHER" in ops and "EMBEDDING_LOOKUP" not in ops
    np.testing.assert_array_equal(_run(made, ds), _run(src.content, ds))  # bit for bit


def test_a_rewrite_a_model_holds_nothing_for_hands_its_bytes_back_unread(float_tflite):
    """The int8 routes' rewrites (NEG as MUL, lookups, casts, clamps) each unpacked the whole model (0.1-0.3 s on
    MobileNetV2) to find none of their ops: they ask the validated structure first."""
    from optimize.transforms.tflite import graphfix, islands, tables

    content = open(float_tflite, "rb").read()
    assert graphfix._holds(content, "CONV_2D") and not graphfix._holds(content, "NEG", "CAST")
    for rewrite in (graphfix.negations_as_mul, tables.lookups_as_gather, tables.integer_lookups, islands.integer_casts):
        made, done = rewrite(content)
        assert made is content and not done


def test_hybrid_lookup_and_gather_behind_dequantize_store_the_table_int8(files):
    from optimize.measure import verify

    src, ds = open_inputs(files / "enc.pt2", files / "tokens.npz")
    before = _run(src.content, ds)
    hybrid, said = tables.hybrid_lookups(src.content)
    assert said and read_model(hybrid).main.tensors[_table(hybrid)].dtype == "int8"
    gathered, _ = tables.lookups_as_gather(src.content)
    behind, said2 = tables.gathers_behind_dequantize(gathered)
    assert said2 and "DEQUANTIZE" in [op.name for op in read_model(behind).main.ops]
    for made in (hybrid, behind):  # one int8 step per row: the outputs move by a fraction of their range
        err = np.abs(_run(made, ds) - before).mean() / (before.max() - before.min())
        assert err < 0.01 and verify.compose(made).shrink < 0.5


def _table(content: bytes) -> int:
    sg = read_model(content).main
    op = next(op for op in sg.ops if op.name in ("EMBEDDING_LOOKUP", "GATHER"))
    return op.inputs[1] if op.name == "EMBEDDING_LOOKUP" else op.inputs[0]


def test_an_integer_lookup_is_exactly_the_quantized_rows(files):
    """lookup then QUANTIZE == QUANTIZE the table then look up: the edit changes no output."""
    from optimize.models.normalize import _load, _save
    from optimize.transforms.tflite.graphfix import _op, _quant, _tensor

    src, ds = open_inputs(files / "enc.pt2", files / "tokens.npz")
    model = _load(src.content)
    sg = model.subgraphs[0]
    k = [op.name for op in read_model(src.content).main.ops].index("EMBEDDING_LOOKUP")
    op = sg.operators[k]
    rows = int(op.outputs[0])
    # a QUANTIZE / DEQUANTIZE pair after the lookup, as a quantizer writes it around an int8 reader
    q = _tensor(sg, "rows/q", list(sg.tensors[rows].shape), 9, 0, _quant(0.02, 3))
    dq = _tensor(sg, "rows/dq", list(sg.tensors[rows].shape), 0)
    for later in sg.operators[k + 1 :]:
        later.inputs = np.array([dq if int(i) == rows else int(i) for i in later.inputs], np.int32)
    sg.operators[k + 1 : k + 1] = [_op(model, "QUANTIZE", [rows], [q]), _op(model, "DEQUANTIZE", [q], [dq])]
    pair = _save(model)
    made, said = tables.integer_lookups(pair)
    ops = read_model(made).main.ops
    assert said and [op.name for op in ops].count("QUANTIZE") == 0  # the QUANTIZE after the lookup is gone
    gather = next(op for op in ops if op.name == "GATHER")
    assert read_model(made).main.tensors[gather.inputs[0]].dtype == "int8"
    np.testing.assert_array_equal(_run(made, ds), _run(pair, ds))


@pytest.mark.parametrize("kind", ["pt2", "onnx"])
@pytest.mark.parametrize(
    "name, steps",
    [
        ("int8", [{"technique": "quantize", "scheme": "int8"}]),
        ("int8-int8io", [{"technique": "quantize", "scheme": "int8", "io": "int8"}]),
    ],
)
def test_int8_candidates_shrink_the_embedding_table(files, tmp_path, kind, name, steps):
    c = single.run(build(name, steps), files / f"enc.{kind}", files / "tokens.npz", tmp_path, jobs=0)
    assert c.ok, c.error
    assert c.composition.shrink <= 0.30, c.composition  # every weight int8 (the table is most of them)
    assert not c.composition.float_compute_ops or name == "int8", c.composition.float_compute_ops
    assert c.metrics.fidelity.relative_error < 0.05
    if name == "int8-int8io":
        assert any("cast to int16 at scale 1" in n for n in c.notes), c.notes  # the mask's CAST made integer


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["pt2", "onnx"])
def test_pt2e_int8_shrinks_the_embedding_table(files, tmp_path, kind):
    c = single.run(
        build("int8-pt2e", [{"technique": "pt2e"}]), files / f"enc.{kind}", files / "tokens.npz", tmp_path, jobs=0
    )
    assert c.ok, c.error
    assert c.composition.shrink <= 0.5, c.composition
    assert any("embedding table" in n for n in c.notes), c.notes
    assert c.metrics.fidelity.relative_error < 0.05


def test_a_cast_of_integers_to_float_becomes_an_int16_cast(files):
    """LiteRT Quantizer leaves the mask's CAST (int32 -> float32) float before a QUANTIZE; the edit casts to
    int16 at scale 1 and requantizes, which is exact for a 0/1 mask."""
    from optimize.core.registry import Context
    from optimize.transforms.tflite import quantize as q

    src, ds = open_inputs(files / "enc.pt2", files / "tokens.npz")
    seen = {}
    real = q._completed

    def spy(data, said):
        seen["before"] = data
        return real(data, said)

    q._completed = spy
    try:
        out = q.quantize(
            _written(src.content, files), q.QuantizeParams(scheme="int8", samples=16),
            Context(workdir=files, data=ds),
        )  # fmt: skip
    finally:
        q._completed = real
    made, casts = islands.integer_casts(seen["before"])
    assert casts and out.read_bytes() and "CAST" in [op.name for op in read_model(made).main.ops]
    sg = read_model(made).main
    cast = next(op for op in sg.ops if op.name == "CAST")
    assert sg.tensors[cast.outputs[0]].dtype == "int16"
    a, b = _run(made, ds), _run(seen["before"], ds)
    np.testing.assert_allclose(a, b, atol=1e-6)


def _written(content: bytes, folder):
    path = folder / "float.tflite"
    path.write_bytes(content)
    return path


def test_shrink_failures_name_the_layers_left_float(files):
    """A candidate whose table stays float says which layer holds the weights (not only the op type)."""
    from optimize.measure import verify

    src, _ = open_inputs(files / "enc.pt2", files / "tokens.npz")
    c = verify.compose(src.content)
    assert (
        c.float_weights and c.float_weights[0].startswith("EMBEDDING_LOOKUP ") and "9,600 weights" in c.float_weights[0]
    )
    why = verify.check(build("int8", [{"technique": "quantize", "scheme": "int8"}]), c)
    assert "EMBEDDING_LOOKUP" in why and "9,600 weights" in why


# ------------------------------------------------------------------------------------------- Keras


@pytest.fixture(scope="module")
def keras_text(tmp_path_factory):
    """A Keras 3 transformer with int32 ids and a padding mask cast to float for its pooling."""
    from optimize.models import _tf

    keras = _tf.keras3()
    keras.utils.set_random_seed(0)
    d = tmp_path_factory.mktemp("keras_ids")
    ids_in = keras.Input((T,), dtype="int32", name="input_ids")
    mask_in = keras.Input((T,), dtype="int32", name="attention_mask")
    h = keras.layers.Embedding(VOCAB, D)(ids_in)
    a = keras.layers.MultiHeadAttention(2, 8)(h, h, attention_mask=keras.ops.cast(mask_in[:, None, :], "bool"))
    h = keras.layers.LayerNormalization()(h + a)
    m = keras.ops.cast(mask_in, "float32")[..., None]
    out = keras.layers.Dense(3)(keras.ops.sum(h * m, 1) / keras.ops.maximum(keras.ops.sum(m, 1), 1.0))
    keras.Model([ids_in, mask_in], out).save(d / "text.keras")
    ids, mask = tokens(40, 1)
    np.savez(d / "text.npz", **{"x:input_ids": ids.astype(np.int32), "x:attention_mask": mask.astype(np.int32)})
    return d


def test_keras_transformer_quantize_io_int8_exits_0(keras_text, tmp_path):
    from typer.testing import CliRunner

    from optimize.cli import app

    out = tmp_path / "q.tflite"
    r = CliRunner().invoke(
        app, ["quantize", str(keras_text / "text.keras"), "-c", str(keras_text / "text.npz"), "--io", "int8",
              "-o", str(out), "--no-delegates"],
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    from optimize.measure.verify import float_compute

    assert out.is_file() and not float_compute(read_model(out.read_bytes()))


# ------------------------------------------------------------------------------------------- pruning


@pytest.fixture(scope="module")
def recommender(tmp_path_factory):
    """A tf_keras recommender: user and item ids -> two embeddings (most of the weights) -> dense -> sigmoid."""
    from optimize.models import _tf

    tf, keras = _tf.tf(), _tf.keras()
    tf.random.set_seed(0)
    d = tmp_path_factory.mktemp("recommender")
    u, i = keras.Input((1,), dtype="int32", name="user"), keras.Input((1,), dtype="int32", name="item")
    a = keras.layers.Flatten()(keras.layers.Embedding(300, 16)(u))
    b = keras.layers.Flatten()(keras.layers.Embedding(200, 16)(i))
    h = keras.layers.Dense(16, activation="relu")(keras.layers.Concatenate()([a, b]))
    model = keras.Model([u, i], keras.layers.Dense(1, activation="sigmoid")(h))
    model.save(d / "rec.h5")
    rng = np.random.default_rng(0)
    users, items = rng.integers(0, 300, (200, 1)), rng.integers(0, 200, (200, 1))
    np.savez(d / "rec.npz", **{"x:user": users.astype(np.int32), "x:item": items.astype(np.int32),
                               "y": rng.integers(0, 2, 200).astype(np.float32)})  # fmt: skip
    return d


def test_pruning_an_embedding_model_reaches_its_sparsity_through_int8(recommender, tmp_path):
    steps = [{"technique": "prune", "target_sparsity": 0.5, "epochs": 1}, {"technique": "convert"},
             {"technique": "quantize", "scheme": "int8"}]  # fmt: skip
    c = single.run(build("prune-int8", steps), recommender / "rec.h5", recommender / "rec.npz", tmp_path, jobs=0)
    assert c.ok, c.error
    # the int8 tables are quantized like activations (a zero point that is not 0): zeros counted at it
    assert c.composition.sparsity >= 0.45, c.composition
    assert all(s >= 0.45 for s in c.composition.sparsity_by_weight.values()), c.composition.sparsity_by_weight


def test_a_layer_pruning_did_not_reach_is_named():
    from optimize.core.results import Composition
    from optimize.measure import verify

    c = Composition(
        weight_bytes={"int8": 100}, float32_equivalent_bytes=400, float_ops=0, sparsity=0.1,
        sparsity_by_weight={"model/embedding/table": 0.0, "model/dense/MatMul": 0.5},
    )  # fmt: skip
    why = verify.check(build("p", [{"technique": "prune"}, {"technique": "convert"}]), c)
    assert "not pruned: 'model/embedding/table'" in why and "dense/MatMul" not in why

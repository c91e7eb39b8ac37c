"""Integer inputs end to end (issue 34): token ids, padding masks, user and item ids stay integer on every route.

Models built here, seeded (no downloads): a Keras 3 MultiHeadAttention text classifier (int32 ids and an int32
padding mask), a Keras 3 recommender (int32 user and item ids; a rating regression head and a click sigmoid head),
and a Keras 2.0.8 .h5 (Embedding + bidirectional GRU, whose config has no reset_after) written as that Keras
wrote it. The data checks (ids stored as floats, ids beyond an embedding's rows) are tested on plain arrays too.
"""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
from tests_support import one_line_error

from optimize.core.errors import DataError
from optimize.core.recipe import build
from optimize.models import legacy, vocabulary
from optimize.models.data import check_ids, from_arrays, integer_ids

V, T = 40, 8  # vocabulary and sequence length of the text classifier
USERS, ITEMS = 80, 70  # 80 x 16 and 70 x 16 embedding tables: over 1,024 weights each, so they quantize


# ------------------------------------------------------------------------------------------- the data checks


def test_calibration_keeps_integer_inputs_integer_and_floats_float32():
    ids = np.arange(40, dtype=np.int32).reshape(10, 4) % 7
    ds = from_arrays(x={"ids": ids, "dense": np.ones((10, 3), np.float64)})
    cal = ds.calibration(5)
    assert cal["ids"].dtype == np.int32 and cal["dense"].dtype == np.float32
    assert np.array_equal(cal["ids"], ids[ds.calibration_index(5)])


def test_ids_stored_as_floats_are_cast_when_whole_and_refused_otherwise():
    ids = (np.arange(24).reshape(8, 3) % 5).astype(np.float32)
    ds = from_arrays(x={"ids": ids, "mask": np.ones((8, 3), np.float32)}, source="d.npz")
    fitted, notes = integer_ids(ds, {"ids": "int32", "mask": "float32"})
    assert fitted.x_cal["ids"].dtype == np.int32 and np.array_equal(fitted.x_test["ids"], ds.x_test["ids"])
    assert fitted.x_cal["mask"] is ds.x_cal["mask"]  # a float input keeps its array
    assert fitted.x_cal is fitted.x_train  # cut from x: one cast, the identity kept
    assert notes == [
        "d.npz: x:ids holds ids stored as float32: whole numbers, cast to int32 (the model's input ids takes int32)"
    ]
    half = ids.copy()
    half[2, 1] = 2.5
    with pytest.raises(DataError, match=r"x:ids holds 2.5, not a whole number \(1 value"):
        integer_ids(from_arrays(x={"ids": half, "mask": ids}, source="d.npz"), {"ids": "int32", "mask": "float32"})
    # integer data and float models: nothing to do, nothing said
    assert integer_ids(ds, {"ids": "float32", "mask": "float32"}) == (ds, [])


def test_ids_beyond_an_embedding_are_one_line_naming_the_input_and_the_bound():
    ids = np.random.default_rng(0).integers(0, 50, (20, 4)).astype(np.int32)
    ds = from_arrays(x=ids, source="tokens.npz")
    check_ids(ds, [vocabulary.IdBound("tokens", 50, "Embedding 'emb'")], 1)  # every id fits
    bad = ids.copy()
    bad[3, 2] = 57
    with pytest.raises(DataError) as e:
        check_ids(from_arrays(x=bad, source="tokens.npz"), [vocabulary.IdBound("tokens", 50, "Embedding 'emb'")], 1)
    assert (
        "tokens.npz: x holds id 57 (1 id(s) out of range): input tokens indexes Embedding 'emb' of 50 rows, ids 0..49"
        in str(e.value.problem)
    )
    bad[3, 2] = -1
    with pytest.raises(DataError, match="holds id -1"):
        check_ids(from_arrays(x=bad, source="tokens.npz"), [vocabulary.IdBound("tokens", 50, "Embedding 'emb'")], 1)
    # Keras 3's Embedding counts ids -50..-1 from the end (it wraps them itself): those fit, -51 does not
    check_ids(from_arrays(x=bad, source="tokens.npz"), [vocabulary.IdBound("tokens", 50, "Embedding 'emb'", True)], 1)
    bad[3, 2] = -51
    with pytest.raises(DataError, match=r"holds id -51 .* ids -50\.\.49"):
        check_ids(
            from_arrays(x=bad, source="tokens.npz"), [vocabulary.IdBound("tokens", 50, "Embedding 'emb'", True)], 1
        )


def _keras2_functional() -> dict:
    """A tf_keras functional config: ids -> Reshape -> Embedding(120), and a float input beside it."""
    node = lambda name: [[[name, 0, 0, {}]]]  # noqa: E731 - Keras 2's inbound form
    return {
        "class_name": "Functional",
        "config": {
            "input_layers": [["ids", 0, 0], ["dense", 0, 0]],
            "layers": [
                {"class_name": "InputLayer", "name": "ids", "config": {"name": "ids"}, "inbound_nodes": []},
                {"class_name": "InputLayer", "name": "dense", "config": {"name": "dense"}, "inbound_nodes": []},
                {"class_name": "Reshape", "name": "r", "config": {"name": "r"}, "inbound_nodes": node("ids")},
                {"class_name": "Embedding", "name": "e", "config": {"name": "e", "input_dim": 120}, "inbound_nodes": node("r")},
                {"class_name": "Dense", "name": "d", "config": {"name": "d"}, "inbound_nodes": node("dense")},
                {"class_name": "Embedding", "name": "f", "config": {"name": "f", "input_dim": 9}, "inbound_nodes": node("d")},
            ],
        },
    }  # fmt: skip


def test_embedding_bounds_are_read_from_keras_configs():
    (b,) = vocabulary.keras_bounds(_keras2_functional())  # 'f' reads a Dense's output: not the user's ids
    assert (b.input, b.size, b.layer) == ("ids", 120, "Embedding 'e'")
    old = {
        "class_name": "Sequential",
        "config": [{"class_name": "Embedding", "config": {"name": "emb", "input_dim": 33}}],
    }
    assert vocabulary.keras_bounds(old) == []  # Keras 2.0's bare list: read once normalised
    (b,) = vocabulary.keras_bounds(legacy.normalized(old))
    assert (b.input, b.size) == ("emb", 33)


def test_an_old_gru_config_is_restored_to_what_its_keras_computed():
    config = {
        "class_name": "Sequential",
        "config": [
            {"class_name": "Bidirectional", "config": {"name": "bi", "layer": {"class_name": "GRU", "config": {"name": "gru_1", "units": 4}}}},
            {"class_name": "GRU", "config": {"name": "gru_2", "reset_after": True}},
        ],
    }  # fmt: skip
    fixed, changes = legacy.restored(legacy.normalized(config))
    assert changes == ["GRU 'gru_1': reset_after=False"]
    assert fixed["config"]["layers"][0]["config"]["layer"]["config"]["reset_after"] is False
    assert "reset_after" not in config["config"][0]["config"]["layer"]["config"]  # the given config untouched


def test_a_crash_names_the_step_and_the_quantizer():
    from optimize.engine.work import crashed

    cand = crashed(
        build("prune-int8", [{"technique": "convert", "scheme": "int8"}]), "killed by SIGSEGV", "convert scheme=int8"
    )
    assert cand.error == (
        "worker process killed by SIGSEGV in step `convert scheme=int8` (the TFLite converter's int8 calibration "
        "and quantizer)"
    )


# ------------------------------------------------------------------------------------------- Keras models


@pytest.fixture(scope="module")
def text3(tmp_path_factory):
    """A Keras 3 MultiHeadAttention text classifier: int32 token ids and an int32 padding mask."""
    from optimize.models import _tf

    k = _tf.keras3()
    k.utils.set_random_seed(0)
    ids = k.Input((T,), dtype="int32", name="ids")
    mask = k.Input((T,), dtype="int32", name="mask")
    h = k.layers.Embedding(V, 16, name="emb")(ids)
    att = k.layers.MultiHeadAttention(2, 8, name="mha")(h, h, attention_mask=k.ops.cast(mask, "bool")[:, None, :])
    h = k.layers.GlobalAveragePooling1D()(k.layers.LayerNormalization()(h + att))
    model = k.Model([ids, mask], k.layers.Dense(3, activation="softmax", name="cls")(h))
    rng = np.random.default_rng(0)
    x_mask = (np.arange(T)[None] < rng.integers(3, T + 1, 160)[:, None]).astype(np.int32)
    x_ids = rng.integers(1, V, (160, T)).astype(np.int32) * x_mask
    y = (x_ids[:, 0] % 3).astype(np.int64)
    model.compile("adam", "sparse_categorical_crossentropy")
    model.fit([x_ids, x_mask], y, epochs=3, verbose=0)
    d = tmp_path_factory.mktemp("text3")
    model.save(d / "text.keras")
    np.savez(d / "text.npz", **{"x:ids": x_ids, "x:mask": x_mask, "y": y})
    np.savez(d / "text_f32.npz", **{"x:ids": x_ids.astype(np.float32), "x:mask": x_mask, "y": y})
    oov = x_ids.copy()
    oov[7, 3] = V + 2
    np.savez(d / "text_oov.npz", **{"x:ids": oov, "x:mask": x_mask, "y": y})
    return d


@pytest.fixture(scope="module")
def recsys(tmp_path_factory):
    """A Keras 3 recommender: int32 user and item ids; a rating (regression) and a click (sigmoid) head."""
    from optimize.models import _tf

    k = _tf.keras3()
    k.utils.set_random_seed(0)
    user = k.Input((1,), dtype="int32", name="user")
    item = k.Input((1,), dtype="int32", name="item")
    eu = k.layers.Flatten()(k.layers.Embedding(USERS, 16, name="user_emb")(user))
    ei = k.layers.Flatten()(k.layers.Embedding(ITEMS, 16, name="item_emb")(item))
    h = k.layers.Dense(64, activation="relu")(k.layers.Concatenate()([eu, ei]))
    model = k.Model(
        [user, item], [k.layers.Dense(1, name="rating")(h), k.layers.Dense(1, activation="sigmoid", name="click")(h)]
    )
    rng = np.random.default_rng(0)
    xu, xi = rng.integers(0, USERS, (240, 1)).astype(np.int32), rng.integers(0, ITEMS, (240, 1)).astype(np.int32)
    rating = ((xu[:, 0] % 5) + (xi[:, 0] % 3)).astype(np.float32)
    click = ((xu[:, 0] + xi[:, 0]) % 2).astype(np.float32)
    model.compile("adam", {"rating": "mse", "click": "binary_crossentropy"})
    model.fit([xu, xi], {"rating": rating, "click": click}, epochs=3, verbose=0)
    d = tmp_path_factory.mktemp("recsys")
    model.save(d / "recsys.keras")
    np.savez(d / "recsys.npz", **{"x:user": xu, "x:item": xi, "y:rating": rating, "y:click": click})
    return d


def _run(recipe, model, data, out, **kw):
    import optimize

    cand = optimize.run(recipe, model, data, out, jobs=0, **kw)
    assert cand.ok, cand.error
    return cand


def test_int8_with_int8_io_on_the_keras_transformer(text3, tmp_path):
    """The issue's `optimize quantize text.keras --scheme int8 --io int8` (exit 1, "Cannot set tensor: Got value
    of type FLOAT32 but expected type INT32"): its ids and mask stay int32, said in a note, and LayerNorm's NEG
    is made integer (as MUL by -1), so the model is integer-only."""
    recipe = build("int8-int8io", [{"technique": "convert"}, {"technique": "quantize", "scheme": "int8", "io": "int8"}])
    cand = _run(recipe, text3 / "text.keras", text3 / "text.npz", tmp_path / "q.tflite")
    assert cand.composition.float_compute_ops == [], cand.composition
    assert any("integer input(s) ids (int32), mask (int32) keep their type" in n for n in cand.notes), cand.notes
    assert any("NEG op(s) computed as MUL by -1" in n for n in cand.notes), cand.notes
    assert cand.metrics.accuracy_delta >= -0.05, cand.metrics
    from optimize.models import runtime

    kinds = {
        d["name"]: np.dtype(d["dtype"]).name
        for d in runtime.describe((tmp_path / "q.tflite").read_bytes()).get_input_details()
    }
    assert sorted(kinds.values()) == ["int32", "int32"], kinds


def test_the_converters_int8_feeds_integer_inputs_their_own_type(recsys, tmp_path):
    """The TFLite converter's representative dataset (the route after QAT, and the fallback) takes int32 ids."""
    recipe = build("int8-int8io", [{"technique": "convert", "scheme": "int8", "io": "int8"}])
    cand = _run(recipe, recsys / "recsys.keras", recsys / "recsys.npz", tmp_path / "c.tflite", backend="converter")
    assert cand.backend == "converter" and cand.composition.shrink < 0.5
    assert any(n.startswith("convert: int8 I/O quantizes the float inputs and outputs only") for n in cand.notes)


def test_prune_then_int8_on_an_id_model(recsys, tmp_path, caplog):
    recipe = build(
        "prune-int8",
        [{"technique": "prune", "epochs": 1}, {"technique": "convert"}, {"technique": "quantize", "scheme": "int8"}],
    )
    cand = _run(recipe, recsys / "recsys.keras", recsys / "recsys.npz", tmp_path / "p.tflite")
    assert cand.composition.sparsity > 0.2 and cand.composition.shrink < 0.5


def test_ids_as_floats_and_ids_beyond_the_vocabulary_in_a_keras_model(text3, cli, tmp_path, caplog):
    from optimize.convert.front import open_inputs

    with caplog.at_level(logging.WARNING):
        _, ds = open_inputs(text3 / "text.keras", text3 / "text_f32.npz")
    assert ds.x_cal["ids"].dtype == np.int32 and ds.x_cal["mask"].dtype == np.int32
    assert "text_f32.npz: x:ids holds ids stored as float32: whole numbers, cast to int32" in caplog.text
    r = cli("quantize", str(text3 / "text.keras"), "-c", str(text3 / "text_oov.npz"), "-o", str(tmp_path / "o"))
    one_line_error(r, "text_oov.npz: x:ids holds id 42", "input ids indexes Embedding 'emb' of 40 rows, ids -40..39")
    assert not (tmp_path / "o").exists()


def test_a_float_tflite_reads_its_bounds_from_its_tables(recsys, tmp_path, cli):
    """The GATHER tables of a converted float .tflite bound its ids (Keras 3 reads each index through its
    negative-index wrap, SELECT(ids < 0, ids + rows, ids)), and data beyond them is one line."""
    recipe = build("float32", [{"technique": "convert"}])
    _run(
        recipe, recsys / "recsys.keras", recsys / "recsys.npz", tmp_path / "f.tflite", measure_it=False, delegates=False
    )
    from optimize.models.source import id_bounds, open_model

    assert {b.input: b.size for b in id_bounds(open_model(tmp_path / "f.tflite"))} == {"user": USERS, "item": ITEMS}
    with np.load(recsys / "recsys.npz") as z:
        arrays = dict(z)
    arrays["x:item"] = arrays["x:item"] + 5
    np.savez(tmp_path / "beyond.npz", **arrays)
    r = cli("evaluate", str(tmp_path / "f.tflite"), "-d", str(tmp_path / "beyond.npz"))
    one_line_error(r, "beyond.npz: x:item holds id 74", "input item indexes GATHER table", "of 70 rows, ids -70..69")


# ------------------------------------------------------------------------------------------- old Keras files


@pytest.fixture(scope="module")
def old_h5(tmp_path_factory):
    """A Keras 2.0.8 .h5: Embedding + bidirectional GRU, its config as that Keras wrote it (a Sequential's bare
    list of layers, no reset_after: its GRU computed what reset_after=False computes), and its reference outputs."""
    import h5py

    from optimize.models import _tf

    k = _tf.keras()
    k.utils.set_random_seed(0)
    model = k.Sequential(
        [
            k.layers.Embedding(V, 8, name="embedding_1", batch_input_shape=(None, T)),
            k.layers.Bidirectional(k.layers.GRU(4, reset_after=False, name="gru_1"), name="bidirectional_1"),
            k.layers.Dense(2, activation="softmax", name="dense_1"),
        ]
    )
    d = tmp_path_factory.mktemp("old")
    model.save(d / "old.h5")
    x = np.random.default_rng(0).integers(0, V, (24, T)).astype(np.float32)
    expected = model.predict(x, verbose=0)

    def old(v):
        if isinstance(v, dict):
            return {a: old(b) for a, b in v.items() if a not in ("module", "registered_name")}
        return [old(b) for b in v] if isinstance(v, list) else v

    with h5py.File(d / "old.h5", "r+") as f:
        layers = [
            layer
            for layer in json.loads(f.attrs["model_config"])["config"]["layers"]
            if layer["class_name"] != "InputLayer"
        ]
        layers[0]["config"]["batch_input_shape"] = [None, T]
        inner = layers[1]["config"]["layer"]["config"]
        for key in ("reset_after", "time_major", "unroll", "zero_output_for_mask"):
            inner.pop(key, None)
        f.attrs["model_config"] = json.dumps(old({"class_name": "Sequential", "config": layers})).encode()
        f.attrs["keras_version"] = b"2.0.8"
    np.savez(d / "old.npz", x=x)
    return d, x, expected


def test_a_keras_2_0_gru_h5_opens_as_its_keras_computed(old_h5, caplog):
    from optimize.models import source as models

    d, x, expected = old_h5
    with caplog.at_level(logging.WARNING):
        src = models.open_model(d / "old.h5")
    assert (
        "old.h5 was saved by a Keras without these settings; loaded as it computed: GRU 'gru_1': reset_after=False"
        in caplog.text
    )
    assert [(s.name, s.shape) for s in src.inputs] == [("embedding_1", (-1, T))]
    assert [(b.input, b.size) for b in models.id_bounds(src)] == [("embedding_1", V)]
    model = models.load_keras2(src)
    assert np.allclose(model.predict(x, verbose=0), expected, atol=1e-6)


# ------------------------------------------------------------------------------------------- PyTorch and ONNX


@pytest.fixture(scope="module")
def tokens(tmp_path_factory):
    """An nn.TransformerEncoder token classifier (int64 ids) as a .pt2 and as ONNX, and its data: ids as int64,
    as float32, with a fraction, and beyond the vocabulary."""
    torch = pytest.importorskip("torch", reason="the torch extra is not installed")
    pytest.importorskip("litert_torch", reason="the torch extra is not installed")
    pytest.importorskip("onnxruntime", reason="the torch extra is not installed")

    class Tokens(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(V, 16)
            layer = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
            self.enc = torch.nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
            self.fc = torch.nn.Linear(16, 3)

        def forward(self, tokens):
            return torch.softmax(self.fc(self.enc(self.emb(tokens)).mean(1)), -1)

    torch.manual_seed(0)
    net = Tokens().eval()
    ids = np.random.default_rng(0).integers(0, V, (48, T)).astype(np.int64)
    d = tmp_path_factory.mktemp("tokens")
    sample = (torch.from_numpy(ids[:1]),)
    torch.export.save(torch.export.export(net, sample), str(d / "tok.pt2"))
    torch.onnx.export(net, sample, str(d / "tok.onnx"), dynamo=False, input_names=["tokens"], output_names=["probs"])
    np.savez(d / "tokens.npz", x=ids)
    np.savez(d / "tokens_f32.npz", x=ids.astype(np.float32))
    frac = ids.astype(np.float32)
    frac[4, 2] = 3.5
    np.savez(d / "tokens_frac.npz", x=frac)
    oov = ids.copy()
    oov[5, 1] = V + 3
    np.savez(d / "tokens_oov.npz", x=oov)
    return d


@pytest.mark.slow
def test_pt2e_quantizes_a_token_id_model(tokens, cli, tmp_path):
    """`optimize quantize model.pt2 --scheme int8 --backend pt2e -c tokens.npz`: the calibration samples stay
    integer ("Expected tensor for argument #1 'indices' ... but got torch.float32" before)."""
    out = tmp_path / "q.tflite"
    r = cli("quantize", str(tokens / "tok.pt2"), "--scheme", "int8", "--backend", "pt2e", "-c", str(tokens / "tokens.npz"),
            "--samples", "16", "-o", str(out), env={"NO_COLOR": "1"})  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    assert "pt2e: int8 I/O quantizes the float inputs and outputs only; the" in r.stdout
    from optimize.models.tflite import read_model

    sg = read_model(out.read_bytes()).main
    assert sg.tensors[sg.inputs[0]].dtype in ("int32", "int64")


def test_token_ids_as_floats_and_beyond_the_vocabulary_in_torch_and_onnx(tokens, caplog):
    from optimize.convert import fidelity
    from optimize.convert.front import open_inputs
    from optimize.models.tflite import read_model

    for model in ("tok.pt2", "tok.onnx"):
        with caplog.at_level(logging.WARNING):
            src, ds = open_inputs(tokens / model, tokens / "tokens_f32.npz")
        assert np.issubdtype(ds.x_cal.dtype, np.integer)
        c = fidelity.measure(src, ds).conversion  # the source runtime runs the ids it takes (a traceback before)
        assert c.fidelity.relative_error < 1e-4
        assert [(b.input, b.size) for b in vocabulary.tflite_bounds(read_model(src.content))] == [("tokens", V)]
        with pytest.raises(DataError, match=r"x holds 3.5, not a whole number"):
            open_inputs(tokens / model, tokens / "tokens_frac.npz")
        with pytest.raises(DataError) as e:
            open_inputs(tokens / model, tokens / "tokens_oov.npz")
        table = "the embedding 'emb.weight'" if model == "tok.pt2" else "the Gather table"
        assert f"x holds id {V + 3} (1 id(s) out of range): input tokens indexes {table}" in e.value.problem
        assert f"of {V} rows, ids 0..{V - 1}" in e.value.problem
    assert "tokens_f32.npz: x holds ids stored as float32: whole numbers, cast to int64" in caplog.text


def test_integer_only_int8_of_a_gru_loop_is_refused_without_the_converter_that_crashes(old_h5, tmp_path):
    """LiteRT Quantizer keeps the GRU's WHILE loop float, so int8 with int8 I/O cannot be integer-only; the
    TFLite converter's calibrator, the fallback, crashes on such loops (SIGSEGV): it is not tried, and said so.
    (Run in this process: were it tried, the test process would die.)"""
    import optimize

    d, _, _ = old_h5
    recipe = build("int8-int8io", [{"technique": "convert"}, {"technique": "quantize", "scheme": "int8", "io": "int8"}])
    cand = optimize.run(recipe, d / "old.h5", d / "old.npz", tmp_path / "q.tflite", jobs=0)
    assert not cand.ok
    assert "cannot be integer-only: the model has a WHILE loop" in cand.error
    assert cand.error.endswith(
        "not made by the TFLite converter: its int8 calibration does not go through a WHILE loop (a GRU or SimpleRNN lowered to a loop, or a loop from another converter) (it crashes)"
    )

"""The .tflite front door and artifact verification, on tiny flatbuffers shaped like MediaPipe's files.

A MediaPipe model has float16 weights behind DEQUANTIZE, no signature, and operator codes in the old
schema's field. Each is made here from a seeded Keras model, then normalised: the result must be a plain
float32 model with a serving_default signature that computes what the original computes. A model whose
float16 feeds a non-constant path is refused in one line; a model whose weights a scheme cannot touch
is a failed candidate, never a result under the scheme's name.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from delegate_fixtures import _schema, load_t, save_t
from tests_support import one_line_error

from optimize.core.errors import ModelError
from optimize.models import _tf, runtime
from optimize.models.normalize import normalize
from optimize.models.tflite import read_model


def _keras(filters: int = 16, units: int = 80):
    keras = _tf.keras()
    keras.utils.set_random_seed(0)
    inp = keras.Input((8, 8, 3))
    h = keras.layers.Conv2D(filters, 3, padding="same", activation="relu")(inp)
    h = keras.layers.Flatten()(h)
    return keras.Model(inp, keras.layers.Dense(units)(h))


def _convert(model, float16: bool) -> bytes:
    tf = _tf.tf()
    conv = tf.lite.TFLiteConverter.from_keras_model(model)
    if float16:
        conv.optimizations = [tf.lite.Optimize.DEFAULT]
        conv.target_spec.supported_types = [tf.float16]
    return conv.convert()


@pytest.fixture(scope="module")
def float16_model() -> bytes:
    return _convert(_keras(), float16=True)


@pytest.fixture(scope="module")
def mediapipe_like(float16_model) -> bytes:
    """float16 weights behind DEQUANTIZE, no signature, op codes only in deprecated_builtin_code."""
    m = load_t(float16_model)
    m.signatureDefs = []
    for code in m.operatorCodes:
        if code.builtinCode < 127:
            code.deprecatedBuiltinCode, code.builtinCode = code.builtinCode, 0
    return save_t(m)


def _outputs(content: bytes, x: np.ndarray) -> list[np.ndarray]:
    runner = runtime.Runner(runtime.load(content, threads=1))
    return runner.run(x)


def _dtypes(content: bytes) -> set[str]:
    """The dtypes of the weights the model holds (tensors with data)."""
    return {t.dtype for t in read_model(content).main.tensors if t.data is not None and len(t.data)}


def _ops(content: bytes) -> set[str]:
    return {op.name for op in read_model(content).main.ops}


def test_mediapipe_style_model_becomes_plain_float32(mediapipe_like):
    assert "float16" in _dtypes(mediapipe_like) and "DEQUANTIZE" in _ops(mediapipe_like)
    n = normalize(mediapipe_like)
    text = "; ".join(n.facts)
    assert "operator code(s) moved" in text
    assert "float16 weight tensor(s) behind DEQUANTIZE folded" in text
    assert "serving_default signature" in text
    assert "float16" not in _dtypes(n.content) and "DEQUANTIZE" not in _ops(n.content)
    it = runtime.describe(n.content)
    assert list(it.get_signature_list()) == ["serving_default"]
    x = np.random.default_rng(0).normal(size=(1, 8, 8, 3)).astype(np.float32)
    for a, b in zip(_outputs(mediapipe_like, x), _outputs(n.content, x), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def test_a_plain_float32_model_is_left_as_it_is():
    f32 = _convert(_keras(), float16=False)
    n = normalize(f32)
    assert not n.changed and n.content == f32


def test_unreadable_bytes_are_a_model_error():
    with pytest.raises(ModelError, match="not a TFLite flatbuffer|truncated or corrupt|cannot be read"):
        normalize(b"TFL3" + bytes(range(200)))


def _float16_on_a_live_path(float16_model: bytes) -> bytes:
    """The first float16 weight made a graph input: its DEQUANTIZE now runs on data, not a constant."""
    s = _schema()
    m = load_t(float16_model)
    sg = m.subgraphs[0]
    i = next(
        int(op.inputs[0])
        for op in sg.operators
        if m.operatorCodes[op.opcodeIndex].builtinCode == s.BuiltinOperator.DEQUANTIZE
    )
    m.buffers[sg.tensors[i].buffer].data = None
    sg.inputs = [*sg.inputs, i]
    m.signatureDefs = []
    return save_t(m)


def test_float16_feeding_a_non_constant_path_is_refused_in_one_line(float16_model, tmp_path, cli):
    model = tmp_path / "live16.tflite"
    model.write_bytes(_float16_on_a_live_path(float16_model))
    n = normalize(model.read_bytes())
    assert "DEQUANTIZE" in _ops(n.content)  # left alone: nothing constant to fold
    out = tmp_path / "out"
    one_line_error(cli("quantize", str(model), "--scheme", "dynamic", "-o", str(out)), "float16")
    assert not out.exists()


def test_a_scheme_that_touches_no_weight_is_a_failed_candidate(tmp_path):
    """Every weight under 1,024 elements: dynamic range keeps them all float, so 'dynamic' is refused."""
    import optimize
    from optimize.core.recipe import build

    model = tmp_path / "small.tflite"
    model.write_bytes(_convert(_keras(filters=4, units=3), float16=False))
    cand = optimize.run(
        build("dynamic", [{"technique": "quantize", "scheme": "dynamic"}]), model, output=tmp_path / "o"
    )
    assert not cand.ok
    assert "no weights were quantized" in cand.error and "1,024" in cand.error
    assert not list((tmp_path / "o").glob("*.tflite"))  # no artifact under a name it does not deserve


def test_verified_candidates_carry_their_composition(tmp_path):
    import optimize
    from optimize.core.recipe import build

    model = tmp_path / "f32.tflite"
    model.write_bytes(_convert(_keras(), float16=False))
    cand = optimize.run(build("float16", [{"technique": "quantize", "scheme": "float16"}]), model, output=tmp_path)
    assert cand.ok, cand.error
    assert 0.45 <= cand.composition.shrink <= 0.55
    assert set(cand.composition.weight_bytes) >= {"float16"}


@pytest.fixture(scope="module")
def onnx_like_if(tmp_path_factory) -> Path:
    """An IF whose two branch subgraphs name their tensors arg0, arg1, ... as an ONNX converter does."""
    tf = _tf.tf()
    rng = np.random.default_rng(0)
    w1, w2 = (rng.normal(size=(32, 64)).astype(np.float32) for _ in range(2))

    class Branchy(tf.Module):  # the weights are constants inside each branch
        @tf.function(input_signature=[tf.TensorSpec([1, 32], tf.float32, name="x")])
        def serve(self, x):
            y = tf.cond(
                tf.reduce_sum(x) > 0, lambda: tf.matmul(x, tf.constant(w1)), lambda: tf.matmul(x, tf.constant(w2))
            )
            return {"y": tf.nn.relu(y)}

    m = Branchy()
    content = tf.lite.TFLiteConverter.from_concrete_functions([m.serve.get_concrete_function()], m).convert()
    t = load_t(content)
    for sg in t.subgraphs[1:]:
        for i, tensor in enumerate(sg.tensors):
            tensor.name = f"arg{i}"
    folder = tmp_path_factory.mktemp("onnx_like")
    (folder / "branchy.tflite").write_bytes(save_t(t))
    np.savez(folder / "d.npz", x=rng.normal(size=(40, 32)).astype(np.float32))
    return folder


def test_an_if_with_repeated_tensor_names_takes_every_scheme_it_can(onnx_like_if, tmp_path):
    from optimize.engine import sweeps

    before = {t.name for sg in read_model((onnx_like_if / "branchy.tflite").read_bytes()).subgraphs for t in sg.tensors}
    assert "arg0" in before
    n = normalize((onnx_like_if / "branchy.tflite").read_bytes())
    assert any("duplicate tensor name(s) made unique" in f for f in n.facts), n.facts
    names = [t.name for sg in read_model(n.content).subgraphs for t in sg.tensors]
    assert len(names) == len(set(names))
    study = sweeps.sweep(onnx_like_if / "branchy.tflite", onnx_like_if / "d.npz", tmp_path, delegates=False, runs=3)
    by = {c.name: c for c in study.candidates}
    assert by["float16"].ok and by["dynamic"].ok, (by["float16"].error, by["dynamic"].error)
    assert by["int8"].ok and any("IF conditional" in n for n in by["int8"].notes), by["int8"].error  # around it
    assert "IF conditional" in by["int8-int8io"].error and "integer-only" in by["int8-int8io"].error


def test_weights_stored_after_the_flatbuffer_are_kept_when_it_is_written_again():
    """LiteRT Quantizer stores buffers after the flatbuffer (offset/size). Folding float16 weights writes
    the model again: those bytes must come along, or every offset points past the end (issue 18: the
    normaliser now validates what it writes, which is how this showed)."""
    from delegate_fixtures import op, tensor, tiny

    w = (np.arange(12, dtype=np.float16).reshape(3, 4) - 6) / 8
    tensors = [tensor([1, 4]), tensor([3, 4], "float16", w), tensor([3, 4]), tensor([1, 3])]
    m = load_t(tiny(tensors, [op("DEQUANTIZE", [1], [2]), op("FULLY_CONNECTED", [0, 2, -1], [3])], [0], [3]))
    buf = m.buffers[m.subgraphs[0].tensors[1].buffer]
    payload = np.asarray(buf.data, np.uint8).tobytes()
    buf.data, buf.offset, buf.size = None, 1 << 20, len(payload)  # a placeholder of the final width
    head = len(save_t(m))
    buf.offset = -(-head // 16) * 16
    data = save_t(m).ljust(buf.offset, b"\0") + payload
    out = normalize(data)
    assert out.facts and read_model(out.content).main.tensors  # valid: nothing points past the end
    x = np.linspace(-1, 1, 4, dtype=np.float32)[None]
    a, b = runtime.Runner(runtime.load(data)), runtime.Runner(runtime.load(out.content))
    np.testing.assert_array_equal(a.run(x)[0], b.run(x)[0])


def _runtime_io(content: bytes):
    """Inputs and outputs as the interpreter lists them through the signature (the runtime's own view)."""
    it = runtime.describe(content)
    key = runtime.signature_key(it)
    if key is None:
        items = [(d["name"], d) for d in it.get_input_details()]
        return [(n, tuple(d["shape_signature"]), np.dtype(d["dtype"]).name) for n, d in items], [
            d["name"] for d in it.get_output_details()
        ]
    details = it.get_signature_runner(key).get_input_details()
    inputs = [(n, tuple(int(v) for v in d["shape_signature"]), np.dtype(d["dtype"]).name) for n, d in details.items()]
    return inputs, list(it.get_signature_list()[key]["outputs"])


def test_a_model_is_described_from_its_parse_as_the_runtime_lists_it(mediapipe_like):
    """Opening a .tflite reads its inputs and outputs from the normalised parse (no interpreter): the same names,
    order (a signature's keys by name, as the runtime sorts them), free dimensions and types as the runtime's."""
    from optimize.models.spec import tflite_io

    keras = _tf.keras()
    ids, pixels = keras.Input((None,), dtype="int32", name="zeta_ids"), keras.Input((4,), name="alpha")
    pooled = keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(50, 4)(ids))
    both = keras.layers.Concatenate()([pooled, pixels])
    two = keras.Model([ids, pixels], [keras.layers.Dense(3, name="b")(both), keras.layers.Dense(1, name="a")(both)])
    for content in (_convert(two, float16=False), mediapipe_like, normalize(mediapipe_like).content):
        n = normalize(content)
        assert (list(n.inputs), list(n.outputs)) == _runtime_io(n.content)
        specs, outputs = tflite_io(n.content)
        assert [(s.name, s.shape, s.dtype) for s in specs] == list(n.inputs) and outputs == n.outputs
    assert [name for name, _, _ in normalize(_convert(two, float16=False)).inputs] == ["alpha", "zeta_ids"]
    specs, outputs = tflite_io(mediapipe_like)  # no signature: the graph's tensors, in order
    assert ([(s.name, s.shape, s.dtype) for s in specs], list(outputs)) == _runtime_io(mediapipe_like)

"""Tiny seeded models for the delegate tests: one graph in every scheme, plus a few single-purpose graphs.

`patch()` edits a .tflite with the schema's object API (op version, custom op, inputs, quantization), so
a rule can be exercised exactly, e.g. "RESHAPE at version 2" or "a CONV_2D without bias".
"""

from __future__ import annotations

import numpy as np
import pytest

from optimize.models import _tf

SCHEMES = ("float32", "float16", "dynamic", "int8", "int16x8")


def convert(make_converter, scheme: str, rep_shape) -> bytes:
    """Convert with the TFLite converter to one of the fixed schemes (seeded representative data)."""
    tf = _tf.tf()
    c = make_converter()
    if scheme == "float16":
        c.optimizations = [tf.lite.Optimize.DEFAULT]
        c.target_spec.supported_types = [tf.float16]
    elif scheme == "dynamic":
        c.optimizations = [tf.lite.Optimize.DEFAULT]
    elif scheme in ("int8", "int16x8"):
        rng = np.random.default_rng(0)

        def rep():
            for _ in range(8):
                yield [rng.random(rep_shape, dtype=np.float32)]

        c.optimizations = [tf.lite.Optimize.DEFAULT]
        c.representative_dataset = rep
        if scheme == "int8":
            c.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
            c.inference_input_type = tf.int8
            c.inference_output_type = tf.int8
        else:
            c.target_spec.supported_ops = [tf.lite.OpsSet.EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8]
    return c.convert()


def convnet():
    """CONV_2D -> DEPTHWISE_CONV_2D -> CONV_2D -> ADD (skip) -> MEAN -> FULLY_CONNECTED -> SOFTMAX."""
    keras = _tf.keras()
    _tf.tf().random.set_seed(0)
    x = keras.Input((16, 16, 3), batch_size=1)
    a = keras.layers.Conv2D(32, 3, padding="same", activation="relu")(x)
    b = keras.layers.DepthwiseConv2D(3, padding="same", activation="relu")(a)
    b = keras.layers.Conv2D(32, 1)(b)  # 1024 weights: big enough for dynamic-range quantization
    c = keras.layers.Add()([a, b])
    d = keras.layers.GlobalAveragePooling2D()(c)
    y = keras.layers.Dense(4, activation="softmax")(d)
    return keras.Model(x, y)


def from_function(fn, *specs) -> bytes:
    """Convert a tf.function with the given input specs (float32 unless a spec says otherwise)."""
    tf = _tf.tf()
    concrete = tf.function(fn, input_signature=list(specs)).get_concrete_function()
    return tf.lite.TFLiteConverter.from_concrete_functions([concrete]).convert()


def build_all(tmp_path_factory) -> dict[str, bytes]:
    tf = _tf.tf()
    model = convnet()
    out = {s: convert(lambda: tf.lite.TFLiteConverter.from_keras_model(model), s, (1, 16, 16, 3)) for s in SCHEMES}
    spec = tf.TensorSpec
    out["dynamic_reshape"] = from_function(
        lambda x, s: tf.reshape(x, s) * 2.0, spec([1, 8], tf.float32), spec([2], tf.int32)
    )
    out["greater_cast"] = from_function(lambda x: tf.cast(tf.greater(x, 0.5), tf.float32) * x, spec([1, 8, 8, 4]))
    out["greater_out"] = from_function(lambda x: tf.greater(x * 2.0, 0.5), spec([1, 8, 8, 4]))
    out["rank5"] = from_function(lambda x: x + 1.0, spec([1, 2, 3, 4, 5]))
    out["reshape"] = from_function(lambda x: tf.reshape(x * 2.0, [1, 32]) + 1.0, spec([1, 4, 8]))
    folder = tmp_path_factory.mktemp("delegate_models")
    for name, data in out.items():
        (folder / f"{name}.tflite").write_bytes(data)
    return out


@pytest.fixture(scope="session", name="models")
def models_fixture(tmp_path_factory) -> dict[str, bytes]:
    return build_all(tmp_path_factory)


# ---- patching with the schema's object API ------------------------------------------------------------


def _schema():
    from ai_edge_litert import schema_py_generated as s

    return s


def load_t(data: bytes):
    return _schema().ModelT.InitFromPackedBuf(bytearray(data), 0)


def save_t(m) -> bytes:
    import flatbuffers

    b = flatbuffers.Builder(1024)
    b.Finish(m.Pack(b), file_identifier=b"TFL3")
    return bytes(b.Output())


def op_index(m, name: str, nth: int = 0) -> int:
    """Index (in subgraph 0) of the nth operator with builtin `name`."""
    s = _schema()
    code = getattr(s.BuiltinOperator, name)
    hits = [
        i
        for i, op in enumerate(m.subgraphs[0].operators)
        if max(m.operatorCodes[op.opcodeIndex].builtinCode, m.operatorCodes[op.opcodeIndex].deprecatedBuiltinCode)
        == code
    ]
    return hits[nth]


def set_version(data: bytes, name: str, version: int, nth: int = 0) -> bytes:
    """Give one operator its own operator code with another version."""
    import copy

    m = load_t(data)
    i = op_index(m, name, nth)
    op = m.subgraphs[0].operators[i]
    code = copy.deepcopy(m.operatorCodes[op.opcodeIndex])
    code.version = version
    m.operatorCodes.append(code)
    op.opcodeIndex = len(m.operatorCodes) - 1
    return save_t(m)


def make_custom(data: bytes, name: str, custom_code: str, custom_options: bytes = b"", nth: int = 0) -> bytes:
    """Turn one builtin operator into a CUSTOM op with the given name and raw options."""
    s = _schema()
    m = load_t(data)
    i = op_index(m, name, nth)
    code = s.OperatorCodeT()
    code.builtinCode = code.deprecatedBuiltinCode = s.BuiltinOperator.CUSTOM
    code.customCode = custom_code
    code.version = 1
    m.operatorCodes.append(code)
    op = m.subgraphs[0].operators[i]
    op.opcodeIndex = len(m.operatorCodes) - 1
    op.builtinOptionsType = 0
    op.builtinOptions = None
    op.customOptions = list(custom_options) or None
    return save_t(m)


def drop_input(data: bytes, name: str, k: int, nth: int = 0) -> bytes:
    m = load_t(data)
    op = m.subgraphs[0].operators[op_index(m, name, nth)]
    op.inputs = [x for j, x in enumerate(op.inputs) if j != k]
    return save_t(m)


def unknown_builtin(data: bytes, code: int = 250) -> bytes:
    m = load_t(data)
    m.operatorCodes[0].builtinCode = code
    m.operatorCodes[0].deprecatedBuiltinCode = 127
    return save_t(m)


def empty_graph(data: bytes) -> bytes:
    m = load_t(data)
    m.subgraphs[0].operators = []
    return save_t(m)


def per_channel_activation(data: bytes, name: str) -> bytes:
    """Give the output of the first `name` op one scale per channel: a per-channel quantized runtime tensor
    (as many scales as channels, as the interpreter requires of any per-channel tensor)."""
    m = load_t(data)
    op = m.subgraphs[0].operators[op_index(m, name)]
    t = m.subgraphs[0].tensors[op.outputs[0]]
    q, channels = t.quantization, int(t.shape[3])
    q.scale = [float(q.scale[0])] * channels
    q.zeroPoint = [int(q.zeroPoint[0])] * channels
    q.quantizedDimension = 3
    return save_t(m)


# ---- tiny graphs built directly with the schema's object API (no TensorFlow) ---------------------------

_NP_TYPES = {
    "float32": 0,
    "float16": 1,
    "int32": 2,
    "uint8": 3,
    "int64": 4,
    "bool": 6,
    "int16": 7,
    "int8": 9,
    "int4": 17,
}


def _packed(spec: dict) -> bytes:
    """A constant's bytes; int4 values (-8..7) are packed two per byte, the first in the low nibble."""
    if spec["dtype"] != "int4":
        return np.asarray(spec["data"], dtype=spec["dtype"]).tobytes()
    v = np.asarray(spec["data"], np.int8).ravel() & 0x0F
    v = np.concatenate([v, np.zeros(len(v) % 2, np.int8)])
    return (v[0::2] | (v[1::2] << 4)).astype(np.uint8).tobytes()


def tensor(shape, dtype: str = "float32", data=None, name: str | None = None, signature=None, quant=None) -> dict:
    """A tensor spec for `tiny`: shape, dtype, constant data (numpy-able), shape signature, quantization as
    (scales, zero points) or (scales, zero points, quantized dimension)."""
    return {"shape": list(shape), "dtype": dtype, "data": data, "name": name, "signature": signature, "quant": quant}


def op(name: str, inputs, outputs, options: tuple[str, dict] | None = None, version: int = 1) -> dict:
    """An operator spec for `tiny`: builtin name, tensor indices (-1: omitted), (options class, fields)."""
    return {"name": name, "inputs": list(inputs), "outputs": list(outputs), "options": options, "version": version}


def _tensor_t(s, i: int, spec: dict, buffers: list):
    t = s.TensorT()
    t.shape = spec["shape"]
    t.type = _NP_TYPES[spec["dtype"]]
    t.name = spec["name"] or f"t{i}"
    if spec["signature"] is not None:
        t.shapeSignature = list(spec["signature"])
    if spec["data"] is not None:
        b = s.BufferT()
        b.data = list(_packed(spec))
        buffers.append(b)
        t.buffer = len(buffers) - 1
    if spec["quant"] is not None:
        q = s.QuantizationParametersT()
        q.scale, q.zeroPoint = list(spec["quant"][0]), list(spec["quant"][1])
        q.quantizedDimension = spec["quant"][2] if len(spec["quant"]) > 2 else 0
        t.quantization = q
    return t


def _operator_t(s, spec: dict, codes: dict, model):
    key = (spec["name"], spec["version"])
    if key not in codes:
        code = s.OperatorCodeT()
        code.builtinCode = getattr(s.BuiltinOperator, spec["name"])
        code.deprecatedBuiltinCode = min(code.builtinCode, 127)
        code.version = spec["version"]
        model.operatorCodes.append(code)
        codes[key] = len(model.operatorCodes) - 1
    o = s.OperatorT()
    o.opcodeIndex = codes[key]
    o.inputs, o.outputs = spec["inputs"], spec["outputs"]
    if spec["options"] is not None:
        kind, fields = spec["options"]
        opts = getattr(s, kind + "T")()
        for k, v in fields.items():
            setattr(opts, k, v)
        o.builtinOptionsType = getattr(s.BuiltinOptions, kind)
        o.builtinOptions = opts
    return o


def tiny(tensors: list[dict], ops: list[dict], inputs, outputs) -> bytes:
    """A one-subgraph .tflite from specs: the smallest graph that exercises one rule."""
    s = _schema()
    m = s.ModelT()
    m.version = 3
    m.operatorCodes, m.buffers = [], [s.BufferT()]
    g = s.SubGraphT()
    g.tensors = [_tensor_t(s, i, spec, m.buffers) for i, spec in enumerate(tensors)]
    codes: dict = {}
    g.operators = [_operator_t(s, spec, codes, m) for spec in ops]
    g.inputs, g.outputs = list(inputs), list(outputs)
    m.subgraphs = [g]
    return save_t(m)

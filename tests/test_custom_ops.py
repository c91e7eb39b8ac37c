"""MediaPipe's custom transposed convolution (Convolution2DTransposeBias) loads without XNNPACK (issue 40 item 6):
the selective search's per-layer error builds its interpreter without the default delegates, where the op had no
kernel ("Convolution2DTransposeBias node 134"). A seeded Keras Conv2DTranspose is converted, its builtin op made
the custom one as MediaPipe writes it, and then run every way."""

from __future__ import annotations

import numpy as np
import pytest

from optimize.models import custom_ops, runtime
from optimize.models.tflite import read_model


def _as_mediapipe(content: bytes) -> bytes:
    """The model with its TRANSPOSE_CONV (output shape, weights, input, bias) as MediaPipe's custom op (input,
    weights, bias; options: TfLitePadding SAME = 1, strides as int32)."""
    from optimize.models.normalize import _load, _save, _schema

    s = _schema()
    model = _load(content)
    sg = model.subgraphs[0]
    code = s.OperatorCodeT()
    code.builtinCode = code.deprecatedBuiltinCode = s.BuiltinOperator.CUSTOM
    code.customCode, code.version = custom_ops.OP.encode(), 1
    model.operatorCodes.append(code)
    done = 0
    for op in sg.operators:
        c = model.operatorCodes[op.opcodeIndex]
        if max(c.builtinCode or 0, c.deprecatedBuiltinCode or 0) != s.BuiltinOperator.TRANSPOSE_CONV:
            continue
        o = op.builtinOptions
        _, weights, source, bias = (int(i) for i in op.inputs)
        op.opcodeIndex, op.inputs = len(model.operatorCodes) - 1, [source, weights, bias]
        op.builtinOptionsType, op.builtinOptions = 0, None
        op.customOptions = np.frombuffer(np.array([1, o.strideW, o.strideH], "<i4").tobytes(), np.uint8)
        done += 1
    assert done == 1
    return _save(model)


@pytest.fixture(scope="module")
def upsampler():
    import tensorflow as tf

    tf.keras.utils.set_random_seed(0)
    inp = tf.keras.Input((8, 8, 4), batch_size=1)
    out = tf.keras.layers.Conv2DTranspose(3, 2, strides=2, padding="same", bias_initializer="random_normal")(inp)
    model = tf.keras.Model(inp, out)
    builtin = tf.lite.TFLiteConverter.from_keras_model(model).convert()
    x = np.random.default_rng(0).random((3, 8, 8, 4)).astype(np.float32)
    return _as_mediapipe(builtin), x, model(x).numpy()


def test_mediapipes_transposed_convolution_loads_without_xnnpack_and_computes_the_same(upsampler):
    content, x, keras_out = upsampler
    assert custom_ops.has_transpose_bias(content)
    rewritten, n = custom_ops.builtin_transpose_conv(content)
    assert n == 1
    ops = [op.name for op in read_model(rewritten).main.ops]
    assert "TRANSPOSE_CONV" in ops and custom_ops.OP not in ops
    for kw in ({"xnnpack": False}, {"keep_tensors": True}):
        out = runtime.Runner(runtime.load(content, threads=1, **kw)).predict(x)[0]
        np.testing.assert_allclose(out, keras_out, atol=1e-5)
    assert runtime.loads(content)


def test_a_model_without_the_op_is_handed_over_unchanged(upsampler, tmp_path):
    content, _, _ = upsampler
    plain, _ = custom_ops.builtin_transpose_conv(content)
    assert custom_ops.builtin_transpose_conv(plain) == (plain, 0)
    path = tmp_path / "m.tflite"
    path.write_bytes(content)
    assert runtime.loads(path)  # read from a path: found in the mapped file, rewritten for the interpreter

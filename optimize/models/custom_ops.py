"""MediaPipe's custom transposed convolution as the builtin one, for interpreters built without XNNPACK.

MediaPipe's segmenters (the selfie segmenter, hair and multiclass ones) upsample with the custom op
`Convolution2DTransposeBias`: a transposed convolution with a bias, written before the builtin TRANSPOSE_CONV
took one. XNNPACK's delegate has a kernel for it, so the default interpreter runs these models; an interpreter
built without the default delegates (`runtime.load(..., xnnpack=False)`, and preserve-all-tensors, which the
per-layer error of the selective search needs) has none: "Convolution2DTransposeBias node 134" fails to load.

`builtin_transpose_conv` rewrites each such op as TRANSPOSE_CONV (version 3: output shape, weights, input, bias),
the same function: its custom options are MediaPipe's `TfLiteTransposeConvParams` (padding, stride_width,
stride_height as int32; TfLite's padding enum 1 = SAME, 2 = VALID). The model on disk is never changed: only
what such an interpreter is handed.
"""

from __future__ import annotations

import numpy as np

OP = "Convolution2DTransposeBias"
#: TfLitePadding (1 SAME, 2 VALID) -> the schema's Padding (0 SAME, 1 VALID).
PADDING = {1: 0, 2: 1}


def has_transpose_bias(content: bytes) -> bool:
    """Whether the model holds the custom op (its name in the bytes: cheap, read before parsing)."""
    return OP.encode() in content


def builtin_transpose_conv(content: bytes) -> tuple[bytes, int]:
    """The model with every `Convolution2DTransposeBias` as TRANSPOSE_CONV with its bias, and how many (0: the
    model unchanged, also when an op's options or inputs are not as MediaPipe writes them)."""
    from optimize.models.normalize import _load, _save, _schema

    s = _schema()
    model = _load(content)
    mine = {i for i, c in enumerate(model.operatorCodes) if bytes(c.customCode or b"") == OP.encode()}
    done = 0
    for sg in model.subgraphs:
        for op in sg.operators:
            if op.opcodeIndex in mine and _rewrite(model, sg, op, s):
                done += 1
    return (_save(model), done) if done else (content, 0)


def _rewrite(model, sg, op, s) -> bool:
    raw = bytes(np.asarray(op.customOptions if op.customOptions is not None else [], np.uint8))
    if len(raw) < 12 or len(op.inputs) != 3:
        return False
    padding, stride_w, stride_h = (int(v) for v in np.frombuffer(raw[:12], "<i4"))
    if padding not in PADDING:
        return False
    shape = [int(d) for d in sg.tensors[int(op.outputs[0])].shape]
    buffer = s.BufferT()
    buffer.data = np.frombuffer(np.array(shape, np.int32).tobytes(), np.uint8)
    model.buffers.append(buffer)
    t = s.TensorT()
    t.shape, t.type, t.buffer, t.name = [len(shape)], s.TensorType.INT32, len(model.buffers) - 1, b"output_shape"
    sg.tensors.append(t)
    options = s.TransposeConvOptionsT()
    options.padding, options.strideW, options.strideH = PADDING[padding], stride_w, stride_h
    source, weights, bias = (int(i) for i in op.inputs)
    op.opcodeIndex = _transpose_conv(model, s)
    op.inputs = [len(sg.tensors) - 1, weights, source, bias]
    op.builtinOptionsType, op.builtinOptions = s.BuiltinOptions.TransposeConvOptions, options
    op.customOptions = None
    return True


def _transpose_conv(model, s) -> int:
    """The index of TRANSPOSE_CONV version 3 (the one with a bias) among the model's operator codes."""
    code = s.BuiltinOperator.TRANSPOSE_CONV
    for i, c in enumerate(model.operatorCodes):
        if max(c.builtinCode or 0, c.deprecatedBuiltinCode or 0) == code and (c.version or 1) >= 3:
            return i
    oc = s.OperatorCodeT()
    oc.builtinCode, oc.deprecatedBuiltinCode, oc.version = code, min(code, 127), 3
    model.operatorCodes.append(oc)
    return len(model.operatorCodes) - 1

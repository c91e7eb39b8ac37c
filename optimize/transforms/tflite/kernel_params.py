"""What LiteRT's int8 kernels require of a tensor's scale, written into a quantized model that broke it.

LiteRT's int8 SOFTMAX and LOGISTIC refuse to prepare unless their output is at scale 1/256, zero point -128
(TANH: 1/128, 0): `activations.cc` "output->params.scale not near 1.f / 256". LiteRT Quantizer and the TFLite
calibrator write those; PT2E (litert-torch) does not always: where a softmax's output is quantized by its
reader's observer (YOLOv8's DFL softmax feeding a convolution, or a softmax written `aten.softmax.int`, which
its fixed-scale annotator does not match), the int8 SOFTMAX gets the reader's scale and the model does not
load. `fixed_output_scales` gives such an op the scale its kernel requires and requantizes (QUANTIZE int8 ->
int8) to the scale its readers were calibrated for: the readers see what they saw, the op its fixed range.
"""

from __future__ import annotations

import numpy as np

from optimize.models.normalize import _load, _save
from optimize.transforms.tflite.graphfix import _codes, _name, _op, _quant, _tensor

INT8 = 9  # schema TensorType value
#: The output scale and zero point each int8 kernel requires (LiteRT's activations.cc).
REQUIRED = {"SOFTMAX": (1 / 256, -128), "LOGISTIC": (1 / 256, -128), "TANH": (1 / 128, 0)}


def _params(t) -> tuple[float, int] | None:
    q = t.quantization
    if q is None or q.scale is None or len(q.scale) != 1:
        return None
    return float(q.scale[0]), int(q.zeroPoint[0]) if q.zeroPoint is not None and len(q.zeroPoint) else 0


def _wrong(t, want: tuple[float, int]) -> bool:
    have = _params(t)
    return t.type == INT8 and have is not None and (abs(have[0] - want[0]) > 1e-6 * want[0] or have[1] != want[1])


def fixed_output_scales(content: bytes) -> tuple[bytes, list[str]]:
    """Every int8 SOFTMAX / LOGISTIC / TANH in the main graph whose output is not at the scale its kernel
    requires: its output at that scale, and a QUANTIZE to the old scale writing the old tensor, which its readers
    (and a graph output) keep reading. Returns the model and the ops fixed (`OP tensor`)."""
    model = _load(content)
    codes, sg = _codes(model), model.subgraphs[0]
    done, ops = [], []
    for op in sg.operators:
        ops.append(op)
        name = codes[op.opcodeIndex]
        if name not in REQUIRED or not len(op.outputs):
            continue
        out = int(op.outputs[0])
        t = sg.tensors[out]
        if not _wrong(t, REQUIRED[name]):
            continue
        scale, zero = REQUIRED[name]
        fixed = _tensor(
            sg, f"{_name(t)}/{name.lower()}_scale", list(t.shape), INT8, 0, _quant(scale, zero), t.shapeSignature
        )
        op.outputs = np.array([fixed], np.int32)
        ops.append(_op(model, "QUANTIZE", [fixed], [out]))
        done.append(f"{name} {_name(t)}")
    if not done:
        return content, []
    sg.operators = ops
    return _save(model), done

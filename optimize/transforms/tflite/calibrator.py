"""The TFLite calibrator on a float flatbuffer: what the converter uses for full-integer quantization, run
directly on a .tflite (TensorFlow's copy: see _tf.calibration_wrapper). The quantize technique falls back to it where
LiteRT Quantizer leaves ops float that it would quantize: the fused LSTM ops, which LiteRT Quantizer
does not support at all, and, in integer-only models, ops it leaves float between DEQUANTIZE and
QUANTIZE (PRELU, LEAKY_RELU), which the calibrator quantizes. It does not go through control flow: on a WHILE loop (a GRU or SimpleRNN
lowered to a loop) it crashes, so such models are refused before it runs.
"""

from __future__ import annotations

import numpy as np

from optimize.core.errors import TechniqueFailed
from optimize.core.vocab import IO

#: Ops LiteRT Quantizer leaves float that the calibrator quantizes.
CALIBRATOR_OPS = frozenset({"UNIDIRECTIONAL_SEQUENCE_LSTM", "BIDIRECTIONAL_SEQUENCE_LSTM", "LSTM"})
CONTROL_FLOW = frozenset({"WHILE", "IF", "CALL_ONCE"})
_IO = {IO.FLOAT: np.float32, IO.INT8: np.int8, IO.UINT8: np.uint8, IO.INT16: np.int16}


#: What each control-flow op is, in words a user recognises.
FLOW_WORDS = {
    "WHILE": "a WHILE loop (a GRU or SimpleRNN lowered to a loop, or a loop from another converter)",
    "IF": "an IF conditional (two branch subgraphs: tf.cond, or an ONNX If node)",
    "CALL_ONCE": "a CALL_ONCE initialiser (variables set up on the first run)",
}


def describe_flow(ops: list[str]) -> str:
    """`an IF conditional (...)` / `a WHILE loop (...) and an IF conditional (...)`."""
    return " and ".join(FLOW_WORDS.get(op, op) for op in ops)


def control_flow(content: bytes) -> list[str]:
    from optimize.models.tflite import read_model

    return sorted({op.name for sg in read_model(content).subgraphs for op in sg.ops} & CONTROL_FLOW)


def _ordered(content: bytes, samples: list[dict[str, np.ndarray]], signature: str) -> list[list[np.ndarray]]:
    """Samples keyed by signature input name, as lists in the interpreter's input order."""
    from optimize.models import runtime

    it = runtime.describe(content)
    by_index = {d["index"]: name for name, d in it.get_signature_runner(signature).get_input_details().items()}
    order = [by_index[d["index"]] for d in it.get_input_details()]
    return [[s[name] for name in order] for s in samples]


def quantize(
    content: bytes, scheme: str, io: str, per_tensor: bool, calibration: dict, allow_float: bool = True
) -> bytes:
    """Full-integer (int8) or 16x8 quantization of `content` by the TFLite calibrator. `allow_float=False`
    (integer-only) makes an op it cannot quantize an error instead of a float island."""
    from optimize.models import _tf

    wrapper = _tf.calibration_wrapper()
    flow = control_flow(content)
    if flow:
        raise TechniqueFailed(
            f"{scheme}: the model has {describe_flow(flow)}, which neither LiteRT Quantizer nor the TFLite "
            "calibrator quantizes through: use dynamic or float16 for it."
        )
    ((signature, samples),) = calibration.items()
    ordered = _ordered(content, samples, signature)
    activations, bias = (np.int16, np.int64) if scheme == "int16x8" else (np.int8, np.int32)
    try:
        prepared = wrapper.AddIntermediateTensors(content)  # kept alive: the wrapper reads it, not a copy
        cal = wrapper.CalibrationWrapper(prepared, [], [])
        cal.Prepare([list(a.shape) for a in ordered[0]])
        for sample in ordered:
            cal.FeedTensor(sample)
        kind = np.dtype(_IO[IO(io)]).num
        out = cal.QuantizeModel(
            kind, kind, allow_float, np.dtype(activations).num, np.dtype(bias).num, per_tensor, per_tensor
        )
    except Exception as e:  # noqa: BLE001 - the calibrator raises RuntimeError/ValueError on models it cannot do
        raise TechniqueFailed(f"{scheme}: the TFLite calibrator could not quantize this model ({_line(e)})") from e
    return bytes(out)


def _line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:200] if text else type(e).__name__

"""The TFLite calibrator on a float flatbuffer: what the TFLite converter itself does for full-integer
quantization, run directly on a .tflite (TensorFlow's copy: see _tf.calibration_wrapper).

int8: the model is calibrated once (the calibrator records each tensor's min/max), then quantized by
TensorFlow's MLIR quantizer, as `TFLiteConverter` does, with named ops (by output tensor) left float: the
per-op fallback the failure rescue (optimize.transforms.tflite.repair) uses on this route. int16x8: the
calibrator's own quantizer, as the converter does for 16-bit activations (no per-op fallback there).

It is the other backend where LiteRT Quantizer fails, crashes or leaves ops float that the runtime has
integer kernels for (the fused LSTM ops, LEAKY_RELU, PRELU, ABS, ...). It does not go through
control flow (on a WHILE loop it crashes), so such models are refused before it runs. Every native call
runs in a forked child (optimize.transforms.tflite.isolate): a crash is a failed attempt, not a dead process.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from optimize.core.errors import TechniqueFailed
from optimize.core.vocab import IO
from optimize.transforms.tflite.isolate import isolated

#: Ops LiteRT Quantizer leaves float that the calibrator quantizes and a per-op search through LiteRT
#: Quantizer can never reach (it does not support the fused LSTM ops at all).
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


def _refuse_flow(content: bytes, scheme: str) -> None:
    flow = control_flow(content)
    if flow:
        raise TechniqueFailed(
            f"{scheme}: the model has {describe_flow(flow)}, which the TFLite calibrator does not quantize through."
        )


def _wrapper(content: bytes, ordered: list[list[np.ndarray]]):
    """The calibration wrapper, prepared at the data's shape and fed every sample."""
    from optimize.models import _tf

    wrapper = _tf.calibration_wrapper()
    prepared = wrapper.AddIntermediateTensors(content)
    cal = wrapper.CalibrationWrapper(prepared, [], [])
    cal.Prepare([list(a.shape) for a in ordered[0]])
    for sample in ordered:
        cal.FeedTensor(sample)
    return cal, prepared  # `prepared` kept alive: the wrapper reads it, not a copy


def _loaded() -> None:
    from optimize.models import _tf

    _tf.calibration_wrapper()
    _tf.lite_convert()


def _calibrated(content: bytes, ordered: list[list[np.ndarray]]) -> bytes:
    cal, _ = _wrapper(content, ordered)
    return bytes(cal.Calibrate())


def nonfinite_ranges(calibrated: bytes) -> list[str]:
    """Tensors of a calibrated model whose recorded min or max is NaN or infinite (read with the schema's
    accessors: nothing else of the model is unpacked)."""
    from ai_edge_litert import schema_py_generated as s

    m = s.Model.GetRootAsModel(calibrated, 0)
    bad = []
    for si in range(m.SubgraphsLength()):
        sg = m.Subgraphs(si)
        for ti in range(sg.TensorsLength()):
            t = sg.Tensors(ti)
            q = t.Quantization()
            if q is None or not (q.MinLength() or q.MaxLength()):
                continue
            lows = q.MinAsNumpy() if q.MinLength() else np.zeros(0)
            highs = q.MaxAsNumpy() if q.MaxLength() else np.zeros(0)
            values = np.concatenate([lows, highs]).astype(np.float64)
            if not np.all(np.isfinite(values)):
                bad.append((t.Name() or b"").decode(errors="replace"))
    return bad


def _mlir(calibrated: bytes, io: str, per_tensor: bool, denylist: tuple[str, ...]) -> bytes:
    from optimize.models import _tf
    from optimize.models.runtime import captured_stderr

    kind = _tf.tf().as_dtype(_IO[IO(io)])
    with captured_stderr():  # the quantizer prints its settings
        return bytes(
            _tf.lite_convert().mlir_quantize(
                calibrated,
                disable_per_channel=per_tensor,
                input_data_type=kind,
                output_data_type=kind,
                denylisted_nodes=list(denylist) or None,
            )
        )


def _int16(content: bytes, ordered: list[list[np.ndarray]], io: str, per_tensor: bool, allow_float: bool) -> bytes:
    cal, _ = _wrapper(content, ordered)
    kind = np.dtype(_IO[IO(io)]).num
    out = cal.QuantizeModel(
        kind, kind, allow_float, np.dtype(np.int16).num, np.dtype(np.int64).num, per_tensor, per_tensor
    )
    return bytes(out)


class Calibrated:
    """A float model calibrated once by the TFLite calibrator; `quantize(denylist)` makes int8 variants with
    the ops named (by output tensor) left float, each in a fraction of a second."""

    def __init__(self, content: bytes, scheme: str, calibration: dict):
        _refuse_flow(content, scheme)
        ((signature, samples),) = calibration.items()
        self.content, self.scheme = content, scheme
        self.ordered = _ordered(content, samples, signature)
        self.calibrated: bytes | None = None
        _loaded()  # TensorFlow imported here once, not in every forked child
        if scheme != "int16x8":
            try:
                self.calibrated = isolated(_calibrated, content, self.ordered, what="the TFLite calibrator")
            except TechniqueFailed:
                raise
            except Exception as e:  # noqa: BLE001 - the calibrator raises RuntimeError/ValueError on models it cannot do
                raise TechniqueFailed(
                    f"{scheme}: the TFLite calibrator could not calibrate this model ({_line(e)})"
                ) from e
            bad = nonfinite_ranges(self.calibrated)
            if bad:  # never handed to the quantizer
                raise TechniqueFailed(
                    f"{scheme}: calibration gives {len(bad)} tensor(s) a non-finite range ({bad[0]}, ...): the float "
                    "model computes inf or NaN inside on the calibration data"
                )

    def quantize(self, io: str, per_tensor: bool, denylist: Iterable[str] = (), allow_float: bool = True) -> bytes:
        deny = tuple(sorted(denylist))
        try:
            if self.scheme == "int16x8":
                if deny:
                    raise TechniqueFailed(
                        "int16x8: the TFLite calibrator has no per-op float fallback for 16-bit activations"
                    )
                return isolated(
                    _int16, self.content, self.ordered, io, per_tensor, allow_float, what="the TFLite calibrator"
                )
            out = isolated(_mlir, self.calibrated, io, per_tensor, deny, what="the TFLite converter's quantizer")
        except TechniqueFailed:
            raise
        except Exception as e:  # noqa: BLE001
            raise TechniqueFailed(
                f"{self.scheme}: the TFLite calibrator could not quantize this model ({_line(e)})"
            ) from e
        if not allow_float:
            from optimize.measure.verify import float_compute
            from optimize.models.tflite import read_model

            left = float_compute(read_model(out))
            if left:
                raise TechniqueFailed(f"{self.scheme}: the TFLite calibrator leaves {', '.join(left[:4])} float")
        return out


def _line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:200] if text else type(e).__name__

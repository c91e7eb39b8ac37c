"""A LiteRT Quantizer session: calibrate a float .tflite once, then quantize it as often as a search needs,
with some ops held at a higher precision.

LiteRT Quantizer matches per-op configs by a regex over the op's *scope*: its output tensor names joined
by ";" with a trailing ";" (litert_quantizer.utils.tfl_flatbuffer_utils.get_op_scope), and the latest
matching rule wins. So one op is addressed as `^<escaped output name>;`. Calibration statistics (per-tensor
min/max) do not depend on the bit width, so one calibration serves every variant: a variant costs one
quantization pass (~10 ms on a small model), not a calibration.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from optimize.core.errors import OptimizeError, TechniqueFailed
from optimize.core.registry import Context
from optimize.core.vocab import Precision


def scope_regex(tensor_name: str) -> str:
    """The regex LiteRT Quantizer matches against exactly one op: the one whose first output is `tensor_name`."""
    return "^" + re.escape(tensor_name) + ";"


@dataclass
class Session:
    """Calibrate once (`content` is a float .tflite, `params` the quantize technique's params), then
    `quantize(overrides)` any number of variants."""

    content: bytes
    params: object  # transforms.tflite.quantize.QuantizeParams
    ctx: Context
    calibration: dict | None = None
    qsvs: dict | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        from optimize.transforms.tflite.quantize import _calibrate, _quiet, _recipe

        recipe = _recipe(self.params)
        if self.calibration is not None and recipe.need_calibration():
            try:
                with _quiet():
                    self.qsvs = _calibrate(self.content, self.calibration, recipe, self.params, self.ctx)
            except OptimizeError:
                raise
            except Exception as e:  # the quantizer raises many types on models it cannot handle
                raise TechniqueFailed(f"LiteRT Quantizer could not calibrate this model: {_first_line(e)}") from e

    def quantize(self, overrides: Mapping[str, Precision] | None = None) -> bytes:
        """The model quantized by the session's scheme, except the ops named (by output tensor) in `overrides`."""
        from litert_quantizer import qtyping, quantizer
        from litert_quantizer.algorithm_manager import AlgorithmName

        from optimize.transforms.tflite.quantize import _quiet, _recipe

        rm = _recipe(self.params)
        op = qtyping.TFLOperationName
        gran = (
            qtyping.QuantGranularity.CHANNELWISE
            if self.params.granularity == "channel"
            else qtyping.QuantGranularity.TENSORWISE
        )
        for tensor, precision in (overrides or {}).items():
            if precision == Precision.FLOAT:
                rm.add_quantization_config(scope_regex(tensor), op.ALL_SUPPORTED, None, AlgorithmName.NO_QUANTIZE)
            else:
                rm.add_static_config(scope_regex(tensor), op.ALL_SUPPORTED, 16, 8, gran)
        try:
            with _quiet():
                qt = quantizer.Quantizer(bytearray(self.content), rm.get_quantization_recipe())
                out = qt.quantize(self.qsvs, enable_progress_bar=False, enable_progress_report=False).quantized_model
        except Exception as e:  # noqa: BLE001 - a variant the quantizer cannot make is reported, not fatal
            raise TechniqueFailed(f"LiteRT Quantizer could not make this variant: {_first_line(e)}") from e
        if not out:
            raise TechniqueFailed("LiteRT Quantizer returned no model.")
        return bytes(out)


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:200] if text else type(e).__name__

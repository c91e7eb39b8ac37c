"""Conversion to .tflite with the TFLite converter: float32, float16, dynamic range, full int8, int16x8."""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import Field, model_validator

from .. import _tf
from ..data import count, take
from ..errors import DataError, TechniqueFailed
from ..registry import Context, Params, Stage, technique
from ..results import write_atomic
from ..runtime import captured_stderr
from ..vocab import CALIBRATED_SCHEMES, IO, Scheme, io_allowed


class ConvertParams(Params):
    scheme: Scheme = Field(
        Scheme.FLOAT32,
        description="float32 (baseline), float16 weights, dynamic-range int8 weights, full int8, int16x8.",
    )
    io: IO = Field(
        IO.FLOAT, description="Input/output type: int8/uint8 for int8 (Edge TPU, microcontrollers), int16 for int16x8."
    )
    samples: int = Field(200, ge=1, le=10000, description="Calibration samples for int8 and int16x8.")
    float_fallback: bool = Field(
        False, description="int8/int16x8: keep ops that cannot be quantized in float instead of failing."
    )

    @model_validator(mode="before")
    @classmethod
    def _drop_inert_calibration(cls, data):
        """Calibration settings do not change a float32/float16/dynamic conversion: leave them at their
        defaults, so equal conversions share one step (and one cache entry) whatever was written."""
        if isinstance(data, dict) and data.get("scheme", Scheme.FLOAT32) not in CALIBRATED_SCHEMES:
            data = {k: v for k, v in data.items() if k not in ("samples", "float_fallback")}
        return data

    @model_validator(mode="after")
    def _io_fits_scheme(self):
        problem = io_allowed(self.scheme, self.io)
        if problem:
            raise ValueError(problem)
        return self


def _representative(ctx: Context, n: int, scheme: str):
    if ctx.data is None:
        raise DataError(f"{scheme} needs calibration data.", "Pass --calibration DATA (an .npz with x) or --data DATA.")
    xs = ctx.data.calibration(n)

    def gen():  # one sample at a time; several inputs go by their signature names
        for i in range(count(xs)):
            sample = take(xs, slice(i, i + 1))
            yield sample if isinstance(sample, dict) else [sample]

    return gen


def _converter_error(e: Exception, log: list[str]) -> str:
    """The useful line of a converter failure (they are long and nested)."""
    text = "\n".join([str(e), *log])
    for pat in (r"error: ([^\n]+)", r"(Quantization[^\n]+not yet supported[^\n]*)", r"(ConverterError[^\n]*)"):
        m = re.search(pat, text)
        if m:
            return m.group(1).strip()
    return str(e).strip().splitlines()[0] if str(e).strip() else e.__class__.__name__


def configure(converter, params: ConvertParams, ctx: Context) -> None:
    """Set the converter flags for a scheme (shared by the pipeline and the benchmarks' bare calls)."""
    tf = _tf.tf()
    scheme = params.scheme
    if scheme == "float32":
        return
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    if scheme == "float16":
        converter.target_spec.supported_types = [tf.float16]
    elif scheme == "int8":
        converter.representative_dataset = _representative(ctx, params.samples, scheme)
        ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        converter.target_spec.supported_ops = ops + ([tf.lite.OpsSet.TFLITE_BUILTINS] if params.float_fallback else [])
        if params.io != "float":
            converter.inference_input_type = converter.inference_output_type = getattr(tf, params.io)
    elif scheme == "int16x8":
        converter.representative_dataset = _representative(ctx, params.samples, scheme)
        ops = [tf.lite.OpsSet.EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8]
        converter.target_spec.supported_ops = ops + ([tf.lite.OpsSet.TFLITE_BUILTINS] if params.float_fallback else [])
        if params.io == "int16":
            converter.inference_input_type = converter.inference_output_type = tf.int16


@technique("convert", stage=Stage.CONVERT, params=ConvertParams)
def convert(model: Path, params: ConvertParams, ctx: Context) -> Path:
    """Convert a SavedModel to .tflite with the TFLite converter, quantizing by the chosen scheme.

    int8 is full-integer (every op int8, calibrated on ctx.data); int16x8 keeps 16-bit activations and
    runs on slow reference kernels; dynamic quantizes weights only and can run slower than float.
    """
    tf = _tf.tf()
    converter = tf.lite.TFLiteConverter.from_saved_model(str(model))
    configure(converter, params, ctx)
    with captured_stderr() as log:
        try:
            flat = converter.convert()
        except (DataError, KeyboardInterrupt):
            raise
        except Exception as e:  # the converter raises many types; every one fails only this candidate
            raise TechniqueFailed(f"conversion to {params.scheme} failed: {_converter_error(e, log)}") from None
    suffix = params.scheme if params.io == "float" else f"{params.scheme}-{params.io}io"
    return write_atomic(ctx.workdir / f"convert-{suffix}.tflite", flat)

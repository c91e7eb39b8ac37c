"""Conversion to .tflite with the TFLite converter: float32, float16, dynamic range, full int8, int16x8."""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import Field, model_validator

from optimize.core.errors import DataError, TechniqueFailed
from optimize.core.registry import Context, SchemeParams, Stage, technique
from optimize.core.results import write_atomic
from optimize.core.vocab import CALIBRATED_SCHEMES, IO, LITERT_ONLY_SCHEMES, Scheme
from optimize.models import _tf
from optimize.models.data import count, take
from optimize.models.runtime import captured_stderr


class ConvertParams(SchemeParams):
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
    select_tf_ops: bool = Field(
        False,
        description="Allow TensorFlow ops the LiteRT builtins lack (Flex): the model converts, but needs the Flex "
        "delegate to run, which the Python runtime here does not have.",
    )

    @model_validator(mode="before")
    @classmethod
    def _drop_inert_calibration(cls, data):
        """Calibration settings do not change a float32/float16/dynamic conversion: leave them at their
        defaults, so equal conversions share one step (and one cache entry) whatever was written."""
        if isinstance(data, dict) and data.get("scheme", Scheme.FLOAT32) not in CALIBRATED_SCHEMES:
            data = {k: v for k, v in data.items() if k not in ("samples", "float_fallback")}
        return data


def _representative(ctx: Context, n: int, scheme: str):
    if ctx.data is None:
        raise DataError(f"{scheme} needs calibration data.", "Pass --calibration DATA (an .npz with x) or --data DATA.")
    xs = ctx.data.calibration(n)

    def gen():  # one sample at a time; several inputs go by their signature names
        for i in range(count(xs)):
            sample = take(xs, slice(i, i + 1))
            yield sample if isinstance(sample, dict) else [sample]

    return gen


def configure(converter, params: ConvertParams, ctx: Context) -> None:
    """Set the converter flags for a scheme (shared by the pipeline and the benchmarks' bare calls)."""
    tf = _tf.tf()
    scheme = params.scheme
    if params.select_tf_ops:
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS, tf.lite.OpsSet.SELECT_TF_OPS]
    if scheme == "float32":
        return
    if scheme in LITERT_ONLY_SCHEMES:  # a recipe expresses it as float32 + quantize, except after QAT/fallback
        raise TechniqueFailed(
            f"the TFLite converter makes no {scheme} weights: LiteRT Quantizer does (backend litert; not after QAT "
            "or with float_fallback)."
        )
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


#: Converter failures we can name, with what to do: (pattern over the full text, the problem, the fix).
KNOWN_FAILURES: tuple[tuple[str, str, str], ...] = (
    (
        r"'(tf\.TensorList\w+)' op requires element_shape to be static",
        "op {0} needs a static shape (a recurrent layer with a dynamic batch)",
        "the fixed-batch route is tried next; if it fails too, give the model fixed input shapes",
    ),
    (
        r"Quantization to 16x8-bit not yet supported for op: '(\w+)'",
        "int16x8 does not support op {0}",
        "set float_fallback = true to keep it in float, or use int8",
    ),
    (
        r"(?s:Some ops are not supported.*?)?Flex ops: ([\w, ]+)|Some ops are not supported by the native TFLite",
        "it needs TensorFlow ops the LiteRT builtins lack ({0})",
        "set select_tf_ops = true in the convert step (the artifact then needs the Flex delegate to run)",
    ),
)
#: A failure that a fixed batch of 1 can fix: recurrent layers unrolled through TensorLists.
BATCH_PROBLEM = re.compile(r"TensorList|element_shape|must be static|Lowering tensor list ops")


def _converter_error(e: Exception, log: list[str]) -> tuple[str, str]:
    """(one line naming the op and the fix, the full text) for a converter failure."""
    text = "\n".join([str(e), *log])
    for pattern, problem, fix in KNOWN_FAILURES:
        m = re.search(pattern, text)
        if m:
            found = [g.strip() for g in m.groups() if g] or ["see error_detail"]
            return f"{problem.format(*found)}: {fix}", text
    m = re.search(r"'([\w.]+)' op ([^\n.]+)", text) or re.search(r"error: ([^\n]+)", text)
    line = (f"op {m.group(1)}: {m.group(2)}" if m and m.lastindex == 2 else m.group(1)) if m else ""
    first = str(e).strip().splitlines()[0] if str(e).strip() else e.__class__.__name__
    return (line or first)[:300], text


def _fixed_batch(saved_model: Path):
    """A converter over the SavedModel's serving signature traced with a batch of 1: the route for Keras
    LSTM/GRU/Bidirectional models whose dynamic batch leaves TensorList shapes unknown."""
    tf = _tf.tf()
    loaded = tf.saved_model.load(str(saved_model))
    sig = loaded.signatures["serving_default"]
    specs = {k: tf.TensorSpec([1, *v.shape[1:]], v.dtype, name=k) for k, v in sig.structured_input_signature[1].items()}

    @tf.function
    def serve(**inputs):
        return sig(**inputs)

    return tf.lite.TFLiteConverter.from_concrete_functions([serve.get_concrete_function(**specs)], loaded)


def _run(make, params: ConvertParams, ctx: Context) -> bytes:
    converter = make()
    configure(converter, params, ctx)
    with captured_stderr() as log:
        try:
            return converter.convert()
        except (DataError, KeyboardInterrupt):
            raise
        except Exception as e:  # the converter raises many types; every one fails only this candidate
            line, text = _converter_error(e, log)
            raise TechniqueFailed(f"conversion to {params.scheme} failed: {line}", detail=text) from None


@technique("convert", stage=Stage.CONVERT, params=ConvertParams)
def convert(model: Path, params: ConvertParams, ctx: Context) -> Path:
    """Convert a SavedModel to .tflite with the TFLite converter, quantizing by the chosen scheme.

    int8 is full-integer (every op int8, calibrated on ctx.data); int16x8 keeps 16-bit activations and
    runs on slow reference kernels; dynamic quantizes weights only and can run slower than float. When
    the dynamic-batch export cannot convert (Keras RNNs), it is traced again with a batch of 1.
    """
    from optimize.models.source import export_notes

    tf = _tf.tf()
    ctx.notes.extend(n for n in export_notes(model) if n not in ctx.notes)
    try:
        flat = _run(lambda: tf.lite.TFLiteConverter.from_saved_model(str(model)), params, ctx)
    except TechniqueFailed as e:
        if not BATCH_PROBLEM.search(e.detail or ""):
            raise
        if ctx.fixed_batch_export is not None:  # the Keras model itself, traced with a batch of 1
            fixed = ctx.fixed_batch_export()
            ctx.notes.extend(n for n in export_notes(fixed) if n not in ctx.notes)
            flat = _run(lambda: tf.lite.TFLiteConverter.from_saved_model(str(fixed)), params, ctx)
        else:  # a plain SavedModel: its serving signature, traced again with a batch of 1
            flat = _run(lambda: _fixed_batch(model), params, ctx)
        why = str(e).split(": ")[1] if str(e).count(": ") >= 1 else str(e)
        ctx.notes.append(f"convert: fixed batch of 1 (the dynamic-batch export failed: {why})")
    suffix = params.scheme if params.io == "float" else f"{params.scheme}-{params.io}io"
    return write_atomic(ctx.workdir / f"convert-{suffix}.tflite", flat)

"""quantize: quantize a float32 .tflite with LiteRT Quantizer (`litert-quantizer`), no TensorFlow needed.

Convert once to float32, then quantize the flatbuffer as often as you like: LiteRT Quantizer rewrites
the .tflite directly, an order of magnitude faster than one converter run per scheme. Schemes map to
the quantizer's recipes:

    float16  -> weight-only float16 (its `float_casting` algorithm; it has no named float16 recipe)
    dynamic  -> dynamic_wi8_afp32  (int8 weights, float activations quantized on the fly)
    int8     -> static_wi8_ai8     (int8 weights and activations, calibrated)
    int16x8  -> static_wi8_ai16    (int8 weights, int16 activations, calibrated)
    int4     -> dynamic_wi4_afp32  (4-bit Dense/MatMul weights, channel-wise or blockwise (dynamic_wi4b{N}_afp32);
                                    convolution weights int8, which XNNPACK runs; float activations)
"""

from __future__ import annotations

import contextlib
import io
import logging
import re
import warnings
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import Field, field_validator, model_validator

from optimize.core.errors import DataError, ModelError, OptimizeError, TechniqueFailed
from optimize.core.registry import Context, SchemeParams, Stage, technique
from optimize.core.results import write_atomic
from optimize.core.vocab import CALIBRATED_SCHEMES, IO, PTQ_SCHEMES, Backend, Scheme
from optimize.models import runtime
from optimize.models.normalize import not_float
from optimize.models.source import FLAT_KINDS
from optimize.models.weights import INT4_OPS
from optimize.transforms.tflite import calibrator

RECIPES = {
    Scheme.FLOAT16: "weight-only float16 (float_casting)",
    Scheme.DYNAMIC: "dynamic_wi8_afp32",
    Scheme.INT8: "static_wi8_ai8",
    Scheme.INT16X8: "static_wi8_ai16",
    Scheme.INT4: "dynamic_wi4_afp32",
}
# int4 makes the Dense / MatMul / embedding family 4-bit (weights.INT4_OPS), whose 4-bit hybrid kernels XNNPACK
# has; convolutions get 8-bit weights (XNNPACK does not take a 4-bit CONV_2D; the reference kernel would run it).


class QuantizeParams(SchemeParams):
    scheme: Scheme = Field(
        description="float16 weights; dynamic (int8 weights); int8 (calibrated); int16x8 (int16 activations, "
        "calibrated); int4 (4-bit Dense/MatMul weights, float activations)."
    )
    io: IO = Field(
        IO.FLOAT,
        description="Model input/output type. 'float' keeps float I/O (QUANTIZE/DEQUANTIZE at the edges); "
        "int8 or uint8 with scheme int8, int16 with int16x8, for integer-only pipelines.",
    )
    samples: int = Field(200, ge=1, le=10000, description="Calibration samples for int8/int16x8.")
    min_weight_elements: int = Field(
        1024,
        ge=0,
        description="dynamic: weights with fewer elements stay float, as the TFLite converter does "
        "(more faithful, and small ops avoid on-the-fly quantization overhead); 0 quantizes every weight.",
    )
    granularity: Literal["channel", "tensor"] = Field(
        "channel",
        description="Weight scales per output channel (best accuracy) or one per tensor (for older NPUs/delegates).",
    )
    block_size: Literal[0, 32, 64, 128, 256] = Field(
        0,
        description="int4: 0 keeps one scale per output channel; 32, 64, 128 or 256 gives each block of that many "
        "input weights its own scale (blockwise: closer to float, a little bigger and slower).",
    )
    calibration: Literal["minmax", "moving_average", "percentile", "mse", "auto"] = Field(
        "minmax",
        description="Activation ranges: global min/max over all samples (as the converter does); the "
        "quantizer's own default, a moving average of per-sample ranges (clips outliers, depends on order); "
        "the 0.01-99.99th percentiles; the MSE-optimal clipping; or auto: per tensor, whichever of min/max, "
        "percentile and MSE quantizes its values best (optimize.transforms.tflite.ranges).",
    )

    @field_validator("scheme")
    @classmethod
    def _quantized(cls, scheme: Scheme) -> Scheme:
        if scheme not in PTQ_SCHEMES:
            raise ValueError(f"quantize makes {', '.join(PTQ_SCHEMES)}; {scheme} is what it starts from")
        return scheme

    @model_validator(mode="after")
    def _blocks_for_int4(self):
        if self.block_size and self.scheme != Scheme.INT4:
            raise ValueError(f"block_size applies to int4 weights, not {self.scheme}")
        return self

    @property
    def recipe_name(self) -> str:
        if self.scheme == Scheme.INT4 and self.block_size:
            return f"dynamic_wi4b{self.block_size}_afp32"
        return RECIPES[self.scheme]


@technique("quantize", stage=Stage.TFLITE, params=QuantizeParams)
def quantize(model: Path, params: QuantizeParams, ctx: Context) -> Path:
    """Quantize a float32 .tflite with LiteRT Quantizer (litert-quantizer): float16, dynamic, int8, int16x8 or
    int4 (4-bit Dense/MatMul weights, channel-wise or in blocks of `block_size`).

    Works on the converted flatbuffer, so any float .tflite qualifies, whatever framework made it.
    int8 and int16x8 are calibrated on the context's data, fed to the model's signature by input name.
    Inputs and outputs stay float unless `io` asks for an integer type. Already-quantized models are
    refused: quantize the float32 model instead.
    """
    model = Path(model)
    content = _read_model(model)
    signature, inputs = _inspect(content, model)
    calibration = None
    if params.scheme in CALIBRATED_SCHEMES:
        _refuse_control_flow(content, params)
        calibration = _calibration_data(params, ctx, signature, inputs, model)
    data = _quantized(content, params, ctx, signature, calibration, inputs)
    left = _left_float(data) if ctx.records.get("backend") != Backend.CALIBRATOR else []
    if calibration is not None and left:  # LiteRT Quantizer does not quantize these; the calibrator does
        data = calibrator.quantize(content, params.scheme, params.io, params.granularity == "tensor", calibration)
        ctx.records["backend"] = Backend.CALIBRATOR
        ctx.notes.append(f"quantize: LiteRT Quantizer leaves {', '.join(left)} float: the TFLite calibrator made it.")
    elif calibration is not None and params.io != "float" and ctx.source_kind in (None, *FLAT_KINDS):
        data = _integer_only(content, data, params, ctx, calibration)
    _check_loads(data, params, ctx, source=content)
    blocks = f"-b{params.block_size}" if params.block_size else ""
    out = ctx.workdir / f"quantize-{params.scheme}{blocks}{'' if params.io == 'float' else '-' + params.io}.tflite"
    write_atomic(out, data)
    if ctx.records.get("backend") != Backend.CALIBRATOR:
        ctx.notes.append(
            f"quantize: LiteRT Quantizer recipe {params.recipe_name}, {_granularity(params)} weights, "
            f"{params.io} I/O"
            + (
                f", {params.calibration} ranges{_picked(ctx)} from {_count(calibration, params)} samples"
                if calibration
                else ""
            )
            + "."
        )
    return out


def _picked(ctx: Context) -> str:
    """` (mse 4, minmax 2 tensors)`: what a chosen-ranges calibration picked per tensor."""
    picked = ctx.records.get("ranges") or {}
    return f" ({', '.join(f'{k} {v}' for k, v in sorted(picked.items()))} tensors)" if picked else ""


def _granularity(params: QuantizeParams) -> str:
    return f"{params.block_size}-blockwise" if params.block_size else f"{params.granularity}-wise"


def _left_float(data: bytes) -> list[str]:
    """Ops with float weights LiteRT Quantizer left behind that the TFLite calibrator would quantize."""
    from optimize.measure.verify import compose

    return sorted(set(compose(data).float_op_types) & calibrator.CALIBRATOR_OPS)


def _quantized(content: bytes, params: QuantizeParams, ctx: Context, signature, calibration, inputs) -> bytes:
    """LiteRT Quantizer's result. Its calibrator allocates the model at the runtime's default shape (1 along
    every free dimension), which a variable-length model may not run at (XNNPACK fails to reshape a framed
    signal of length 1): such a model is calibrated by the TFLite calibrator, at the data's shape."""
    try:
        return _run_quantizer(content, params, ctx, signature, calibration)
    except TechniqueFailed as e:
        free = [n for n, d in inputs.items() if any(int(v) < 0 for v in d["shape_signature"])]
        if calibration is None or not free:
            raise
        made = calibrator.quantize(content, params.scheme, params.io, params.granularity == "tensor", calibration)
        ctx.records["backend"] = Backend.CALIBRATOR
        ctx.notes.append(
            f"quantize: LiteRT Quantizer calibrates at 1 along free dimensions (input {', '.join(free)}), where "
            f"this model does not run ({runtime.invoke_failure(str(e).split(': ', 1)[-1])}): the TFLite calibrator made it at the "
            "data's shape."
        )
        return made


def _integer_only(content: bytes, data: bytes, params: QuantizeParams, ctx: Context, calibration: dict) -> bytes:
    """Integer I/O promises integer-only compute. Where LiteRT Quantizer leaves ops float between DEQUANTIZE
    and QUANTIZE (PRELU, LEAKY_RELU), the TFLite calibrator quantizes the model with no float fallback.
    (A Keras or SavedModel source is made by the converter instead: its run falls back on verification.)"""
    from optimize.measure.verify import float_compute
    from optimize.models.tflite import read_model

    left = float_compute(read_model(data))
    if not left:
        return data
    try:
        made = calibrator.quantize(
            content, params.scheme, params.io, params.granularity == "tensor", calibration, allow_float=False
        )
    except TechniqueFailed as e:
        raise TechniqueFailed(
            f"{params.scheme} with {params.io} I/O: LiteRT Quantizer leaves {', '.join(left)} float, and {e}"
        ) from None
    ctx.records["backend"] = Backend.CALIBRATOR
    ctx.notes.append(
        f"quantize: LiteRT Quantizer leaves {', '.join(left)} float in an integer-only model: the TFLite "
        "calibrator made it, with no float fallback."
    )
    return made


def _refuse_control_flow(content: bytes, params: QuantizeParams) -> None:
    """Calibrated schemes cannot go through control flow (a loop body's or a branch's types must match the
    op's): say so plainly, naming what the op is."""
    flow = calibrator.control_flow(content)
    if flow:
        lstm = " (for a GRU or SimpleRNN, an LSTM layer converts to a fused op)" if "WHILE" in flow else ""
        raise TechniqueFailed(
            f"{params.scheme}: neither LiteRT Quantizer nor the TFLite calibrator quantizes through "
            f"{calibrator.describe_flow(flow)}: use dynamic or float16 for this model{lstm}."
        )


def _count(calibration: dict, params: QuantizeParams) -> str:
    n = sum(len(v) for v in calibration.values())
    return str(n) if n == params.samples else f"{n} (of {params.samples} asked)"


def _read_model(model: Path) -> bytes:
    if not model.is_file():
        raise ModelError(f"No .tflite at {model}.", "Pass the path of a float32 .tflite model.")
    return model.read_bytes()


def _inspect(content: bytes, model: Path) -> tuple[str | None, dict[str, dict]]:
    """The signature to calibrate and its input details; refuse models that are not float
    (normalize.not_float, the same check a run makes up front)."""

    try:
        it = runtime.describe(content)
    except ModelError as e:
        raise ModelError(f"{model.name}: {e.problem}", e.fix) from None
    why = not_float(content)
    if why:
        raise ModelError(
            f"{model.name}: {why}; pass the float32 model.",
            "Quantize the float32 .tflite it was made from (convert without quantization).",
        )
    key = runtime.signature_key(it)
    if key is None:
        return None, {}
    return key, it.get_signature_runner(key).get_input_details()


def _calibration_data(
    params: QuantizeParams, ctx: Context, signature: str | None, inputs: dict[str, dict], model: Path
) -> dict[str, list[dict[str, np.ndarray]]]:
    """Calibration samples keyed the way the quantizer wants them: {signature: [{input_name: batch_of_1}]}."""
    if ctx.data is None:
        raise DataError(f"{params.scheme} needs calibration data.", "Pass --calibration DATA (an .npz with x).")
    if signature is None:
        raise ModelError(
            f"{model.name} has no signature, which LiteRT Quantizer needs to feed calibration data.",
            "Convert from a SavedModel or Keras model (they export a serving_default signature).",
        )
    from optimize.models.data import check_inputs, count
    from optimize.models.source import InputSpec

    specs = [InputSpec(n, tuple(d["shape_signature"]), np.dtype(d["dtype"]).name) for n, d in inputs.items()]
    check_inputs(ctx.data, specs)
    xs = ctx.data.calibration(params.samples)
    named = xs if isinstance(xs, dict) else {specs[0].name: xs}
    typed = {s.name: named[s.name].astype(np.dtype(s.dtype), copy=False) for s in specs}
    return {signature: [{k: v[i : i + 1] for k, v in typed.items()} for i in range(count(xs))]}


def _recipe(params: QuantizeParams, content: bytes | None = None):
    """The quantizer's RecipeManager holding the recipe for a scheme, granularity and I/O type (for blockwise
    int4, `content` lets weights whose rows do not split into whole blocks keep one scale per channel)."""
    from litert_quantizer import qtyping, recipe_manager
    from litert_quantizer.algorithm_manager import AlgorithmName

    op = qtyping.TFLOperationName
    gran = (
        qtyping.QuantGranularity.CHANNELWISE if params.granularity == "channel" else qtyping.QuantGranularity.TENSORWISE
    )
    rm = recipe_manager.RecipeManager()
    if params.scheme == "float16":
        rm.add_weight_only_config(".*", op.ALL_SUPPORTED, 16, gran, AlgorithmName.FLOAT_CASTING)
    elif params.scheme in ("dynamic", "int4"):
        rm.add_quantization_config(".*", op.ALL_SUPPORTED, _dynamic(8, gran, params))
        if params.scheme == "int4":  # later rules override earlier ones
            blocks = getattr(qtyping.QuantGranularity, f"BLOCKWISE_{params.block_size}", gran)
            for name in INT4_OPS:
                rm.add_quantization_config(".*", getattr(op, name), _dynamic(4, blocks, params))
            for name, scope in _uneven_blocks(content, params.block_size):
                rm.add_quantization_config(f"^{re.escape(scope)}$", getattr(op, name), _dynamic(4, gran, params))
    else:
        rm.add_static_config(".*", op.ALL_SUPPORTED, 16 if params.scheme == "int16x8" else 8, 8, gran)
        if params.io == "float":
            for edge in (op.INPUT, op.OUTPUT):
                rm.add_quantization_config(".*", edge, None, AlgorithmName.NO_QUANTIZE)
        elif params.io == "uint8":
            uint8 = qtyping.OpQuantizationConfig(
                activation_tensor_config=qtyping.TensorQuantizationConfig(
                    num_bits=8, symmetric=False, dtype=qtyping.TensorDataType.UINT
                ),
                weight_tensor_config=qtyping.TensorQuantizationConfig(num_bits=8, symmetric=True, granularity=gran),
                compute_precision=qtyping.ComputePrecision.INTEGER,
            )
            for edge in (op.INPUT, op.OUTPUT):
                rm.add_quantization_config(".*", edge, uint8)
        # io int8 (with int8) and int16 (with int16x8) are the static recipes' own default.
    # Custom ops have kernels of their own that expect float tensors: keep them (and their weights) float,
    # with QUANTIZE/DEQUANTIZE around them, in every scheme.
    rm.add_quantization_config(".*", op.CUSTOM_OP, None, AlgorithmName.NO_QUANTIZE)
    return rm


def _uneven_blocks(content: bytes | None, block_size: int) -> list[tuple[str, str]]:
    """(op, scope) of the 4-bit ops whose weight rows are not a whole number of blocks: the quantizer refuses
    to split them ("not divisible by block size"), so they keep one scale per output channel. The scope is
    the quantizer's own: the op's output tensor names, each followed by ';'."""
    if not content or not block_size:
        return []
    from optimize.models.tflite import read_model

    sg = read_model(content).main
    out = []
    for o in sg.ops:
        w = sg.tensors[o.inputs[1]] if o.opcode in INT4_OPS and len(o.inputs) > 1 and o.inputs[1] >= 0 else None
        if w is not None and w.shape and w.shape[-1] % block_size:
            out.append((o.opcode, "".join(f"{sg.tensors[i].name};" for i in o.outputs if i >= 0)))
    return out


def _dynamic(bits: int, granularity, params: QuantizeParams):
    """Weights of `bits` bits, float activations quantized on the fly (the dynamic_wi{bits} recipes)."""
    from litert_quantizer import qtyping

    return qtyping.OpQuantizationConfig(
        weight_tensor_config=qtyping.TensorQuantizationConfig(num_bits=bits, symmetric=True, granularity=granularity),
        compute_precision=qtyping.ComputePrecision.INTEGER,
        explicit_dequantize=False,
        min_weight_elements=params.min_weight_elements,
    )


@contextlib.contextmanager
def _quiet():
    """Silence the quantizer: its progress bars and reports, Python warnings and the C++ runtime's logs."""
    from optimize.models.runtime import captured_stderr

    sink = io.StringIO()
    with (
        captured_stderr(),
        contextlib.redirect_stdout(sink),
        contextlib.redirect_stderr(sink),
        warnings.catch_warnings(),
    ):
        warnings.simplefilter("ignore")
        yield


def _run_quantizer(content: bytes, params: QuantizeParams, ctx: Context, signature, calibration) -> bytes:
    """Calibrate (if needed) and quantize; a failure inside the quantizer is a failed candidate."""
    try:
        with _quiet():
            from litert_quantizer import quantizer

            recipe = _recipe(params, content)
            qsvs = None
            if calibration is not None and recipe.need_calibration():
                qsvs = _calibrate(content, calibration, recipe, params, ctx)
            qt = quantizer.Quantizer(bytearray(content), recipe.get_quantization_recipe())
            quantized = qt.quantize(qsvs, enable_progress_bar=False, enable_progress_report=False).quantized_model
    except OptimizeError:
        raise
    except Exception as e:  # the quantizer raises ValueError, RuntimeError, KeyError, ... on models it cannot handle
        reason = str(e).strip().splitlines()[0] if str(e).strip() else e.__class__.__name__
        raise TechniqueFailed(f"LiteRT Quantizer could not apply {params.recipe_name}: {reason}") from e
    if not quantized:
        raise TechniqueFailed(f"LiteRT Quantizer returned no model for {params.recipe_name}.")
    return bytes(quantized)


def _calibrate(content: bytes, calibration: dict, recipe, params: QuantizeParams, ctx: Context) -> dict:
    """Activation ranges from the samples. The profiler-based calibrator tracks min/max in C++ and is ~4x
    faster on MobileNetV2 than the quantizer's default (keep every tensor, reduce in Python), with the same
    ranges; if it fails on a model, fall back to the default."""
    from litert_quantizer import calibrator
    from litert_quantizer.utils import qsv_utils

    update = qsv_utils.moving_average_update if params.calibration == "moving_average" else qsv_utils.min_max_update
    mode = calibrator.CalibrationMode
    try:
        calib = calibrator.Calibrator(
            content, num_threads=max(1, ctx.threads), mode=mode.CALIBRATION_PROFILER_BASED, qsv_update_func=update
        )
        calib.calibrate(calibration, recipe)
    except Exception as e:  # noqa: BLE001 - retried with the default calibrator, which raises for real
        # Nothing here for a user to act on: the default calibrator gives the same ranges (or fails with a
        # reason of its own, which the candidate reports), so this is a debugging line, with the cause.
        reason = (str(e).strip().splitlines() or [""])[0][:200]
        logging.getLogger(__name__).debug(
            "quantize: the profiler-based calibrator failed (%s: %s); calibrating with the default one",
            e.__class__.__name__,
            reason,
        )
        calib = calibrator.Calibrator(
            content, num_threads=max(1, ctx.threads), mode=mode.CALIBRATION_PRESERVE_ALL_TENSORS, qsv_update_func=update
        )
        calib.calibrate(calibration, recipe)
    return _ranges(calib.get_model_qsvs(), content, calibration, params, ctx)


def _ranges(qsvs: dict, content: bytes, calibration: dict, params: QuantizeParams, ctx: Context) -> dict:
    """The calibrated min/max ranges, or those that `params.calibration` chooses per tensor (optimize.transforms.tflite.ranges);
    the model's inputs keep the data's own range."""
    if params.calibration in ("minmax", "moving_average"):
        return qsvs
    from optimize.models.tflite import read_model
    from optimize.transforms.tflite import ranges

    sg = read_model(content).main
    keep = {sg.tensors[i].name for i in sg.inputs}
    samples = [s for group in calibration.values() for s in group]
    out, picked = ranges.override(qsvs, content, samples, params.calibration, keep, max(1, ctx.threads))
    ctx.records["ranges"] = picked
    return out


def _check_loads(data: bytes, params: QuantizeParams, ctx: Context, source: bytes | None = None) -> None:
    """Fail the candidate now if the runtime cannot prepare the result (e.g. int16x8 kernels refusing a layer).

    When the float `source` does not load either (custom ops this runtime lacks, MediaPipe's for one), the
    result cannot be judged here: it is kept, with a note, and measured by size only."""
    from optimize.models.data import take

    like = take(ctx.data.x_test, slice(0, 1)) if ctx.data is not None else None  # free dimensions: the data's
    try:
        runtime.load(data, threads=max(1, ctx.threads), like=like)  # the default resolver: it has the custom kernels
    except ModelError as e:
        if source is not None and not runtime.loads(source, like):
            ctx.notes.append(f"quantize: not run here, as the float model is not: {e.problem}")
            return
        who = "the TFLite calibrator" if ctx.records.get("backend") == Backend.CALIBRATOR else "LiteRT Quantizer"
        raise TechniqueFailed(f"{params.scheme} model from {who} does not load: {e.problem}") from None

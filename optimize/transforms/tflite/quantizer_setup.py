"""What LiteRT Quantizer is handed, shared by a one-shot quantization (`quantize`) and a session that
calibrates once and quantizes many variants (`session`): the recipe for a scheme, granularity and I/O type,
calibration (the profiler-based calibrator, with the default one behind it) with the range choice on top, and
the quantizer kept quiet."""

from __future__ import annotations

import contextlib
import io
import logging
import re
import warnings

import numpy as np

from optimize.core.registry import Context
from optimize.models.weights import INT4_OPS


def recipe(params, content: bytes | None = None):
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


def _dynamic(bits: int, granularity, params):
    """Weights of `bits` bits, float activations quantized on the fly (the dynamic_wi{bits} recipes)."""
    from litert_quantizer import qtyping

    return qtyping.OpQuantizationConfig(
        weight_tensor_config=qtyping.TensorQuantizationConfig(num_bits=bits, symmetric=True, granularity=granularity),
        compute_precision=qtyping.ComputePrecision.INTEGER,
        explicit_dequantize=False,
        min_weight_elements=params.min_weight_elements,
    )


@contextlib.contextmanager
def quiet():
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


def calibrate(content: bytes, calibration: dict, recipe, params, ctx: Context) -> dict:
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
    return _ranges(_keepdims(calib.get_model_qsvs(), content), content, calibration, params, ctx)


def _keepdims(qsvs: dict, content: bytes) -> dict:
    """Per-tensor ranges shaped like the default calibrator's: one value per axis of the tensor ((1, 1) for a
    [1, 1] tensor), not the profiler's (1,). LiteRT Quantizer broadcasts a (1,) scale against every axis of a
    constant that shares its op's output scale (MAXIMUM's, MINIMUM's, CONCATENATION's operands), making it one
    axis too many ("Ranks of scales (3) and zps (3) must be the same as the tensor rank (2)")."""
    from optimize.models.tflite import read_model

    ranks = {t.name: t.rank for g in read_model(content).subgraphs for t in g.tensors}
    out = {}
    for name, v in qsvs.items():
        rank = ranks.get(name)
        fixed = dict(v)
        for key in ("min", "max"):
            a = v.get(key)
            if rank and a is not None and np.size(a) == 1 and np.ndim(a) != rank:
                fixed[key] = np.reshape(a, (1,) * rank)
        out[name] = fixed
    return out


def _ranges(qsvs: dict, content: bytes, calibration: dict, params, ctx: Context) -> dict:
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

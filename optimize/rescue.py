"""The accuracy rescue that keeps 8 bits: what the transform techniques and the selective search share.

Order (the `selective` search follows it; each step is kept only when it helps):
1. equalize (cross-layer equalization: exact, data-free),
2. bias_correction (the int8 weights' mean output shift folded into the biases),
3. calibration `auto` (per tensor, min/max, percentile or MSE-optimal activation ranges),
4. adaround (learned rounding of the worst layers' weights),
and only then an op raised to int16 activations or kept float. Every step is a `results.RescueStep` on the
candidate, with the per-layer int8 error (relative RMSE vs float, optimize.debug) before and after.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .results import LayerChange

#: The rescue's steps in order: (transform, the technique that makes it, its params).
ORDER = (
    ("equalize", "equalize", {}),
    ("bias_correction", "bias_correction", {}),
    ("calibration:auto", None, {"calibration": "auto"}),
    ("adaround", "adaround", {}),
)
SHOWN = 8  # layers recorded per step (the largest changes)


def samples(ctx, n: int, what: str) -> list:
    """n calibration samples (batch of 1 each), or a DataError naming the technique that needs them."""
    from .data import count, take
    from .errors import DataError

    if ctx.data is None:
        raise DataError(f"{what} needs calibration data.", "Pass --calibration DATA (an .npz with x).")
    xs = ctx.data.calibration(n)
    return [take(xs, slice(i, i + 1)) for i in range(count(xs))]


def session(content: bytes, ctx, granularity: str = "channel", calibration: str = "minmax", n: int = 200):
    """A LiteRT Quantizer int8 session for a float model held in memory (calibrated once)."""
    from . import litert
    from .registry import get
    from .techniques.litert_quantize import _calibration_data, _inspect

    params = get("quantize").parse(
        {"scheme": "int8", "granularity": granularity, "calibration": calibration, "samples": n}
    )
    path = Path(ctx.workdir) / "rescue-probe.tflite"
    path.write_bytes(content)
    signature, inputs = _inspect(content, path)
    return litert.Session(content, params, ctx, _calibration_data(params, ctx, signature, inputs, path))


def layer_errors(float_model: bytes, quantized: bytes, xs, n: int = 32) -> dict[str, tuple[str, float]]:
    """tensor -> (op, relative RMSE of its int8 output vs float) on n samples."""
    from . import debug

    layers, _ = debug.layer_errors(float_model, quantized, debug.Samples.from_array(xs, n))
    return {le.tensor: (le.op, le.relative_rmse) for le in layers}


def changes(before: dict, after: dict) -> list[LayerChange]:
    """The layers whose error moved most, before -> after (as many as SHOWN)."""
    common = [t for t in before if t in after]
    common.sort(key=lambda t: -abs(before[t][1] - after[t][1]))
    return [LayerChange(tensor=t, op=before[t][0], before=before[t][1], after=after[t][1]) for t in common[:SHOWN]]


def worst_linear(float_model: bytes, quantized: bytes, xs, k: int) -> list[str]:
    """The k Conv/DepthwiseConv/Dense ops that add the most int8 error (per-layer analysis), worst first."""
    from . import debug
    from .equalize import LINEAR

    layers, _ = debug.layer_errors(float_model, quantized, debug.Samples.from_array(xs, 32))
    ranked = sorted((le for le in layers if le.op in LINEAR), key=lambda le: -le.error_added)
    return [le.tensor for le in ranked[:k]] if k else [le.tensor for le in ranked]


def relative_error(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    """Largest |a - b| over the largest |a|, across outputs (how the transforms' exactness is judged)."""
    return max(float(np.abs(x - y).max() / max(np.abs(x).max(), 1e-12)) for x, y in zip(a, b, strict=True))

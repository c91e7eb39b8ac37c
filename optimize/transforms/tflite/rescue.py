"""The accuracy rescue that keeps 8 bits: what the transform techniques and the selective search share.

Order (the `selective` search follows it; each step is kept only when it helps):
1. equalize (cross-layer equalization, exact and data-free, then high-bias absorption where calibration
   data shows a channel floor): it fixes the cause (channels of very different ranges) and costs nothing,
2. bias_correction (the int8 weights' mean output shift folded into the biases): one pass over the data,
3. calibration `auto` (per tensor, min/max, percentile or MSE-optimal activation ranges): one pass,
4. adaround (learned rounding of the worst layers' weights): the costliest, seconds per layer,
and only then an op raised to int16 activations or kept float, which gives up size (float) or speed
(int16 runs on reference kernels). Every step is a `results.RescueStep` on the
candidate, with the per-layer int8 error (relative RMSE vs float, optimize.measure.layer_error) before and after.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from optimize.core.results import LayerChange

#: The rescue's steps in order (each a technique of techniques/transforms.py, or a quantize calibration).
ORDER = ("equalize", "bias_correction", "calibration:auto", "adaround")
SHOWN = 8  # layers recorded per step (the largest changes)


def samples(ctx, n: int, what: str) -> list:
    """n calibration samples (batch of 1 each), or a DataError naming the technique that needs them."""
    from optimize.core.errors import DataError
    from optimize.models.data import count, take

    if ctx.data is None:
        raise DataError(f"{what} needs calibration data.", "Pass --calibration DATA (an .npz with x).")
    xs = ctx.data.calibration(n)
    return [take(xs, slice(i, i + 1)) for i in range(count(xs))]


def session(content: bytes, ctx, granularity: str = "channel", calibration: str = "minmax", n: int = 200):
    """A LiteRT Quantizer int8 session for a float model held in memory (calibrated once)."""
    from optimize.core.registry import get
    from optimize.transforms.tflite import session as litert
    from optimize.transforms.tflite.quantize import _calibration_data, _inspect

    params = get("quantize").parse(
        {"scheme": "int8", "granularity": granularity, "calibration": calibration, "samples": n}
    )
    path = Path(ctx.workdir) / "rescue-probe.tflite"
    path.write_bytes(content)
    signature, inputs = _inspect(content, path)
    return litert.Session(content, params, ctx, _calibration_data(params, ctx, signature, inputs, path))


def layer_errors(float_model: bytes, quantized: bytes, xs, n: int = 32) -> dict[str, tuple[str, float]]:
    """tensor -> (op, relative RMSE of its int8 output vs float) on n samples."""
    from optimize.measure import layer_error as debug

    layers, _ = debug.layer_errors(float_model, quantized, debug.Samples.from_array(xs, n))
    return {le.tensor: (le.op, le.relative_rmse) for le in layers}


def changes(before: dict, after: dict) -> list[LayerChange]:
    """The layers whose error moved most, before -> after (as many as SHOWN)."""
    common = [t for t in before if t in after]
    common.sort(key=lambda t: -abs(before[t][1] - after[t][1]))
    return [LayerChange(tensor=t, op=before[t][0], before=before[t][1], after=after[t][1]) for t in common[:SHOWN]]


def worst_linear(float_model: bytes, quantized: bytes, xs, k: int) -> list[str]:
    """The k Conv/DepthwiseConv/Dense ops that add the most int8 error (per-layer analysis), worst first."""
    from optimize.measure import layer_error as debug
    from optimize.transforms.tflite.flatedit import LINEAR

    layers, _ = debug.layer_errors(float_model, quantized, debug.Samples.from_array(xs, 32))
    ranked = sorted((le for le in layers if le.op in LINEAR), key=lambda le: -le.error_added)
    return [le.tensor for le in ranked[:k]] if k else [le.tensor for le in ranked]


def relative_error(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    """Largest |a - b| over the largest |a|, across outputs (how the transforms' exactness is judged)."""
    return max(float(np.abs(x - y).max() / max(np.abs(x).max(), 1e-12)) for x, y in zip(a, b, strict=True))


def _make(transform: str, content: bytes, qparams, cur, xs, samples: list, ctx) -> tuple[bytes, object, str]:
    """(float model, quantize params, what was done) for one rescue step."""
    from optimize.transforms.tflite import equalize, rounding

    per_tensor = qparams.granularity == "tensor"
    if transform == "equalize":
        made = equalize.cle(content, lambda: samples, ctx.threads)
        clipped = equalize.left(made.skipped)
        if not made.pairs:
            return content, qparams, f"no pair of layers to rescale{clipped}"
        absorbed = f", high bias absorbed in {made.absorbed}" if made.absorbed else ""
        return (
            made.content,
            qparams,
            f"{len(made.pairs)} pair(s), largest scale {made.max_scale:.3g}{absorbed}{clipped}",
        )
    if transform == "bias_correction":
        made = rounding.bias_correct(content, samples, per_tensor, max(1, ctx.threads))
        return made.content, qparams, f"{len(made.layers)} bias(es) corrected on {len(samples)} samples"
    if transform.startswith("calibration:"):
        method = transform.split(":", 1)[1]
        return content, qparams.model_copy(update={"calibration": method}), f"{method} activation ranges"
    worst = worst_linear(content, cur.content, xs, 4)
    made = rounding.adaround(
        content, samples, worst, per_tensor, iters=300, max_seconds=30, threads=max(1, ctx.threads)
    )
    gain = sum(b for *_, b, _ in made.layers) / max(sum(a for *_, a in made.layers), 1e-30)
    return (
        made.content,
        qparams,
        f"{len(made.layers)} worst layer(s), output error {gain:.2g}x lower, {made.seconds:.1f} s",
    )


def keep_8_bits(search, content: bytes, qparams, calibration: dict, ctx, start):
    """The rescue before any op is raised: each step of ORDER tried on the whole model (one evaluation each,
    half the search's evaluations at most), kept when `search.better` says it helps, until the budget holds. Returns the float model, the quantize
    params and the result kept (the search's session is the kept one), and the steps as RescueSteps."""
    from optimize.core.errors import OptimizeError, TechniqueFailed
    from optimize.core.results import RescueStep
    from optimize.transforms.tflite import session as litert

    xs = search.budget.xs
    samples = [s for group in calibration.values() for s in group][:256]
    reference, cur, steps = content, start, []
    before = layer_errors(reference, start.content, xs)
    for transform in ORDER:
        if search.budget.meets(cur.value) or search.evals >= search.params.max_evals // 2:
            break  # half the evaluations at most: the rest is for raising ops, if it comes to that
        kept_session = search.session
        try:
            made, q, detail = _make(transform, content, qparams, cur, xs, samples, ctx)
            if made == content and q == qparams:
                steps.append(RescueStep(transform=transform, detail=f"nothing to do ({detail})", kept=False))
                continue
            search.session = litert.Session(made, q, ctx, calibration).with_base(kept_session.base, kept_session.clamps)
            r = search.evaluate({})
        except (OptimizeError, TechniqueFailed) as e:
            steps.append(RescueStep(transform=transform, detail=f"failed: {getattr(e, 'problem', e)}", kept=False))
            search.session = kept_session
            continue
        ref = made if transform == "equalize" else reference
        after = layer_errors(ref, r.content, xs)
        if transform.startswith("calibration:"):
            picked = ctx.records.get("ranges") or {}
            detail += f" ({', '.join(f'{k} {v}' for k, v in sorted(picked.items()))} tensors)" if picked else ""
        kept = search.better(r, cur)
        b = search.budget.describe(r.value)
        steps.append(
            RescueStep(
                transform=transform, detail=f"{detail}: {b}", metric=r.value, kept=kept, layers=changes(before, after)
            )
        )
        if kept:
            content, qparams, cur, before, reference = made, q, r, after, ref
        else:
            search.session = kept_session
    return content, qparams, cur, steps

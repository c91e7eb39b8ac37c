"""equalize, bias_correction, adaround: float32 .tflite -> float32 .tflite, made for a following int8 quantize.

They run after the conversion to float32 and before `quantize` (or `selective`), in any chain:
`prune -> cluster -> convert float32 -> equalize -> bias_correction -> quantize int8`. The model stays a float
model with the same graph; only weights and biases change (optimize.transforms.tflite.equalize, optimize.transforms.tflite.rounding). Each
records a `RescueStep` on the candidate and a note.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from optimize.core.registry import Context, Params, Stage, technique
from optimize.core.results import LayerChange, RescueStep, write_atomic
from optimize.transforms.tflite import rescue

Granularity = Literal["channel", "tensor"]
GRANULARITY = Field("channel", description="The int8 weight scales the following quantize uses: per channel or tensor.")


def _float_model(model: Path) -> bytes:
    from optimize.transforms.tflite.quantize import _inspect, _read_model

    content = _read_model(Path(model))
    _inspect(content, Path(model))  # refuses a model that is not float
    return content


def _record(ctx: Context, step: RescueStep, out: Path, content: bytes) -> Path:
    ctx.records["rescue"] = [*ctx.records.get("rescue", []), step]
    ctx.notes.append(f"{step.transform}: {step.detail}")
    return write_atomic(out, content)


class EqualizeParams(Params):
    method: Literal["cle", "smooth"] = Field(
        "cle",
        description="cle: cross-layer equalization of weight ranges (data-free); smooth: SmoothQuant-style "
        "migration of activation outliers into the next layer's weights (calibration data).",
    )
    alpha: float = Field(0.5, gt=0, lt=1, description="smooth: how much of the activation range moves (0.5).")
    samples: int = Field(64, ge=1, le=1024, description="Calibration samples (smooth, absorb).")
    absorb: bool = Field(
        False,
        description="cle: then absorb high biases (a channel's floor on calibration data moved into the next "
        "layer's bias); exact only where inputs keep that floor, so off by default.",
    )


@technique("equalize", stage=Stage.TFLITE, params=EqualizeParams)
def equalize(model: Path, params: EqualizeParams, ctx: Context) -> Path:
    """Cross-layer equalization (or SmoothQuant-style smoothing) of a float32 .tflite: rescales consecutive
    Conv/DepthwiseConv/Dense layers' channels so one int8 range fits them all, keeping the float function.

    Pairs joined by ReLU or nothing (through pooling, padding, flatten) are rescaled; ReLU6 clips are not
    crossed (it would change the float model). Run before quantize int8.
    """
    from optimize.transforms.tflite import equalize as eq

    content = _float_model(model)
    absorbed = ""
    if params.method == "smooth":
        act = _activation_ranges(content, rescue.samples(ctx, params.samples, "equalize (smooth)"), ctx)
        made = eq.smooth(content, act, params.alpha)
    else:  # no data: one line, as smooth says (asked for only when there are pairs to absorb into)
        picked = (lambda: rescue.samples(ctx, params.samples, "equalize (absorb)")) if params.absorb else None
        made = eq.cle(content, picked, ctx.threads)
        absorbed = f"; high bias absorbed in {made.absorbed} pair(s)" if made.absorbed else ""
    clipped = eq.left(made.skipped)
    detail = (
        f"{params.method} rescaled {len(made.pairs)} layer pair(s), largest scale {made.max_scale:.3g}{absorbed}{clipped}"
        if made.pairs
        else f"no pair of layers to rescale{clipped}; the model is unchanged"
    )
    step = RescueStep(
        transform="equalize" if params.method == "cle" else "smooth", detail=detail, kept=bool(made.pairs)
    )
    return _record(ctx, step, ctx.workdir / f"equalize-{params.method}.tflite", made.content)


def _activation_ranges(content: bytes, samples: list, ctx: Context) -> dict:
    """max |x| per channel (last axis) of every Conv/DepthwiseConv/Dense data input, on the samples."""
    import numpy as np

    from optimize.measure.tensors import channel_extremes
    from optimize.transforms.tflite.flatedit import LINEAR, Graph

    g = Graph.load(content)
    idx = sorted({g.inputs(k)[0] for k, n in enumerate(g.names) if n in LINEAR})
    seen = channel_extremes(content, samples, idx, max(1, ctx.threads))
    return {g.tensor_name(i): np.maximum(-lo, hi) for i, (lo, hi) in seen.items()}


class BiasCorrectionParams(Params):
    samples: int = Field(128, ge=1, le=1024, description="Calibration samples the mean inputs are taken over.")
    granularity: Granularity = GRANULARITY


@technique("bias_correction", stage=Stage.TFLITE, params=BiasCorrectionParams)
def bias_correction(model: Path, params: BiasCorrectionParams, ctx: Context) -> Path:
    """Empirical bias correction: each Conv/DepthwiseConv/Dense bias absorbs the mean output shift that its
    int8 weights cause (measured on calibration samples). Run right before quantize int8."""
    from optimize.transforms.tflite.rounding import bias_correct

    content = _float_model(model)
    picked = rescue.samples(ctx, params.samples, "bias_correction")
    made = bias_correct(content, picked, params.granularity == "tensor", ctx.threads)
    worst = max(made.layers, key=lambda lr: lr[1], default=None)
    detail = f"{len(made.layers)} bias(es) corrected on {len(picked)} samples" + (
        f"; largest shift {worst[1]:.3g}x the bias range ({worst[0]})" if worst else ""
    )
    step = RescueStep(transform="bias_correction", detail=detail)
    return _record(ctx, step, ctx.workdir / "bias-corrected.tflite", made.content)


class AdaroundParams(Params):
    samples: int = Field(128, ge=8, le=256, description="Calibration samples whose layer inputs are recorded.")
    layers: int = Field(4, ge=0, le=1000, description="How many of the worst layers (per-layer analysis); 0: all.")
    iterations: int = Field(400, ge=10, le=5000, description="Optimisation steps per layer.")
    max_seconds: float = Field(60.0, gt=0, le=3600, description="Time bound: layers not reached keep nearest rounding.")
    granularity: Granularity = GRANULARITY


@technique("adaround", stage=Stage.TFLITE, params=AdaroundParams)
def adaround(model: Path, params: AdaroundParams, ctx: Context) -> Path:
    """AdaRound-style learned rounding: the int8 weights of the layers the per-layer analysis ranks worst
    round up or down to minimise each layer's output error on recorded inputs (bounded in samples and
    time). Run right before quantize int8."""
    from optimize.transforms.tflite.rounding import adaround as learn

    content = _float_model(model)
    picked = rescue.samples(ctx, params.samples, "adaround")
    worst = None
    if params.layers:
        q = rescue.session(content, ctx, params.granularity, n=params.samples).quantize()
        worst = rescue.worst_linear(content, q, ctx.data.calibration(32), params.layers)
    made = learn(
        content, picked, worst, params.granularity == "tensor", params.iterations, params.max_seconds, ctx.threads
    )
    layers = [LayerChange(tensor=t, op=op, before=a, after=b) for t, op, a, b in made.layers]
    gain = sum(c.before for c in layers) / max(sum(c.after for c in layers), 1e-30)
    detail = (
        f"{len(made.layers)} layer(s) rounded by learning on {len(picked)} samples in {made.seconds:.1f} s; "
        f"their output error {gain:.2g}x lower than nearest rounding"
    )
    step = RescueStep(transform="adaround", detail=detail, layers=layers)
    return _record(ctx, step, ctx.workdir / "adarounded.tflite", made.content)

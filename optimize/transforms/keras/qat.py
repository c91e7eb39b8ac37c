"""Quantization-aware training (tfmot): fake-quantize during fine-tuning so int8 conversion loses less."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from optimize.core.registry import Context, Params, Stage, technique
from optimize.models import _tf
from optimize.transforms.keras.common import fine_tune, require_keras2, teacher_outputs, wrap_supported


class QATParams(Params):
    preserve: Literal["none", "sparsity", "clusters", "clusters+sparsity"] = Field(
        "none", description="Collaborative optimization: keep an earlier step's zeros and/or clusters."
    )
    epochs: int = Field(2, ge=1, le=1000, description="Fine-tuning epochs.")
    batch_size: int = Field(32, ge=1)
    learning_rate: float = Field(1e-4, gt=0)


@technique("qat", stage=Stage.KERAS, params=QATParams)
def qat(model, params: QATParams, ctx: Context):
    """Quantization-aware training with tfmot's default 8-bit scheme (or its prune/cluster-preserving variants).

    Follow it with `convert` scheme int8 (or dynamic); the fake-quant ranges learned here are used.
    """
    require_keras2(model, "qat")
    tfmot = _tf.tfmot()
    q = tfmot.quantization.keras
    registry = q.default_8bit.Default8BitQuantizeRegistry()
    teacher = teacher_outputs(model, ctx)  # what outputs without labels keep to (before any weight moves)
    annotated = wrap_supported(model, registry.supports, q.quantize_annotate_layer, ctx, "qat")
    scheme = None
    if params.preserve == "sparsity":
        scheme = q.collab_opts.Default8BitPrunePreserveQuantizeScheme()
    elif params.preserve.startswith("clusters"):
        # tfmot exports only the prune-preserving scheme publicly; the cluster-preserving one has no public path.
        from tensorflow_model_optimization.python.core.quantization.keras.collab_opts.cluster_preserve import (
            default_8bit_cluster_preserve_quantize_scheme as cqat,
        )

        scheme = cqat.Default8BitClusterPreserveQuantizeScheme(preserve_sparsity=params.preserve.endswith("sparsity"))
    with q.quantize_scope():
        qmodel = q.quantize_apply(annotated, scheme) if scheme else q.quantize_apply(annotated)
    _calibrate_ranges(qmodel, ctx)
    return fine_tune(
        qmodel, ctx, params.epochs, params.batch_size, params.learning_rate, technique="qat", teacher=teacher
    )


#: Training samples the fake-quant ranges are first calibrated on (one batch, as post-training int8 does).
RANGE_SAMPLES = 128


def _calibrate_ranges(qmodel, ctx: Context) -> None:
    """Start every fake-quant range at the range the model's tensors take on the training inputs.

    tfmot starts activation ranges at -6..6 and moves them by 0.1% per training step (an EMA of decay
    0.999): on a few hundred samples, two epochs leave them near -6..6, which clips wider activations (a
    box output in pixels, logits) and wastes int8's resolution on narrow ones (inputs in 0..1). A digits CNN
    lost 70 points of top-1 that way. One forward pass in training mode with the decay at 0 sets each range
    to what its tensor holds on a batch (with the ranges before it already in place, as training sees
    them); fine-tuning then moves them as tfmot does. Any failure leaves tfmot's own start, with a note.
    """
    import numpy as np

    from optimize.models.data import as_inputs, count, take

    ds = ctx.data
    if ds is None or ds.x_train is None:
        return
    try:
        from tensorflow_model_optimization.python.core.quantization.keras import quant_ops
    except ImportError:  # tfmot moved its internals: its own start stands
        return
    weights = {  # the weights' own ranges (reset from the weights at every training step): left alone
        id(v) for layer in qmodel.layers for entry in getattr(layer, "_weight_vars", ()) for v in entry[2].values()
    }
    ranges = [
        w
        for w in qmodel.non_trainable_weights
        if w.name.split(":")[0].endswith(("_min", "_max")) and id(w) not in weights
    ]
    n = count(ds.x_train)
    pick = np.sort(np.random.default_rng(ctx.seed).choice(n, min(RANGE_SAMPLES, n), replace=False))
    xs = as_inputs(take(ds.x_train, pick))
    original = quant_ops.MovingAvgQuantize

    def at_once(*args, **kwargs):
        kwargs["ema_decay"] = 0.0  # the batch's range, not 0.1% of the way to it
        return original(*args, **kwargs)

    saved = [w.numpy() for w in ranges]
    try:
        for w in ranges:  # 0..0: an EMA of decay 0 and a running min/max both take the batch's range
            w.assign(np.zeros(w.shape, w.dtype.as_numpy_dtype))
        quant_ops.MovingAvgQuantize = at_once
        qmodel(xs, training=True)
    except Exception as e:  # noqa: BLE001 - tfmot's own start is a working, if poorer, fallback
        for w, v in zip(ranges, saved):
            w.assign(v)
        ctx.notes.append(f"qat: fake-quant ranges left at tfmot's start (-6..6): calibrating them failed ({e!r:.120})")
        return
    finally:
        quant_ops.MovingAvgQuantize = original
    ctx.notes.append(f"qat: fake-quant ranges calibrated on {len(pick)} training samples before fine-tuning.")

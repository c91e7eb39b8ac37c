"""Quantization-aware training (tfmot): fake-quantize during fine-tuning so int8 conversion loses less."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from optimize.core.registry import Context, Params, Stage, technique
from optimize.models import _tf
from optimize.transforms.keras.common import fine_tune, require_keras2, wrap_supported


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
    return fine_tune(qmodel, ctx, params.epochs, params.batch_size, params.learning_rate, technique="qat")

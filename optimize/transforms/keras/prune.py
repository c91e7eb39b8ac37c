"""Magnitude pruning (tfmot): zero the smallest weights, fine-tune, strip the wrappers."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field

from optimize.core.registry import Context, Params, Stage, technique
from optimize.models import _tf
from optimize.models.data import count
from optimize.transforms.keras.common import fine_tune, require_keras2, teacher_outputs, wrap_supported


class PruneParams(Params):
    target_sparsity: float = Field(0.5, gt=0, lt=1, description="Final fraction of zero weights.")
    schedule: Literal["constant", "polynomial"] = Field(
        "polynomial", description="Constant sparsity from the start, or ramp up polynomially during fine-tuning."
    )
    structured: Literal["2:4"] | None = Field(
        None, description="'2:4': two zeros in every block of four (hardware-friendly structured sparsity)."
    )
    epochs: int = Field(2, ge=1, le=1000, description="Fine-tuning epochs.")
    batch_size: int = Field(32, ge=1)
    learning_rate: float = Field(1e-3, gt=0)


@technique("prune", stage=Stage.KERAS, params=PruneParams)
def prune(model, params: PruneParams, ctx: Context):
    """Magnitude pruning with tfmot, layer by layer, fine-tuned on the context's data, wrappers stripped.

    Pruning zeroes weights but a .tflite stores zeros like any other value: the raw file does not
    shrink, only the compressed (gzip) size does. Follow it with clustering or int8 for a smaller file.
    """
    require_keras2(model, "prune")
    tfmot = _tf.tfmot()
    sparsity = tfmot.sparsity.keras
    if ctx.data is not None and ctx.data.x_train is not None:
        steps = params.epochs * math.ceil(count(ctx.data.x_train) / params.batch_size)
    else:
        steps = 1
    if params.schedule == "constant":
        schedule = sparsity.ConstantSparsity(params.target_sparsity, begin_step=0, frequency=max(1, steps // 10))
    else:
        schedule = sparsity.PolynomialDecay(
            0.0, params.target_sparsity, begin_step=0, end_step=max(1, int(steps * 0.8)), frequency=max(1, steps // 20)
        )
    kwargs = {"pruning_schedule": schedule}
    if params.structured:
        kwargs = {"sparsity_m_by_n": (2, 4)}
        ctx.notes.append("prune: 2:4 structured sparsity (the schedule does not apply).")
    # tfmot has no public "is this layer prunable?": its registry is the only source of that answer.
    from tensorflow_model_optimization.python.core.sparsity.keras.prune_registry import PruneRegistry

    def supports(layer) -> bool:
        return PruneRegistry.supports(layer) or isinstance(layer, sparsity.PrunableLayer)

    teacher = teacher_outputs(model, ctx)  # what outputs without labels keep to (before any weight moves)
    wrapped = wrap_supported(model, supports, lambda layer: sparsity.prune_low_magnitude(layer, **kwargs), ctx, "prune")
    fine_tune(
        wrapped,
        ctx,
        params.epochs,
        params.batch_size,
        params.learning_rate,
        callbacks=[sparsity.UpdatePruningStep()],
        technique="prune",
        teacher=teacher,
    )
    return sparsity.strip_pruning(wrapped)

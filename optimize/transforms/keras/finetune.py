"""Fine-tuning alone: the float model trained as prune, cluster and QAT train it, with nothing compressed.

A pruned, clustered or quantization-aware-trained candidate is fine-tuned on the user's data for an epoch or two;
on an under-trained model that alone gains points of accuracy (issue 43: a small CNN went from 90.7% to 97.3% by
two epochs of fine-tuning, and its compressed chains read "+7 to +9 points" as if compression had bought them).
A sweep that fine-tunes measures this control beside them (`float32-finetuned`): the same data, loss, seed and
schedule, no pruning, clustering or fake quantization, converted to float32, so the gain the retrained
candidates show is split into training's and compression's.
"""

from __future__ import annotations

from pydantic import Field

from optimize.core.registry import Context, Params, Stage, technique
from optimize.transforms.keras.common import fine_tune, require_keras2, teacher_outputs


class FinetuneParams(Params):
    epochs: int = Field(2, ge=1, le=1000, description="Fine-tuning epochs.")
    batch_size: int = Field(32, ge=1)
    learning_rate: float = Field(1e-3, gt=0)


@technique("finetune", stage=Stage.KERAS, params=FinetuneParams)
def finetune(model, params: FinetuneParams, ctx: Context):
    """Fine-tune the Keras model on the context's training data as the compressing techniques do (same loss,
    seed and schedule; outputs without labels learn the float model's own), compressing nothing: the control
    that tells training's accuracy gain from compression's."""
    require_keras2(model, "finetune")
    teacher = teacher_outputs(model, ctx)  # what outputs without labels keep to (before any weight moves)
    return fine_tune(
        model, ctx, params.epochs, params.batch_size, params.learning_rate, technique="finetune", teacher=teacher
    )

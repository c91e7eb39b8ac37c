"""What planning a sweep asks of a model, answered in one visit: whether Dense/MatMul weights dominate (the
sweep then tries int4) and why pruning, clustering and QAT cannot fine-tune it, if they cannot."""

from __future__ import annotations

from dataclasses import dataclass

from optimize.core.errors import ModelError
from optimize.models import rebuild, weights
from optimize.models.data import Dataset
from optimize.models.source import ModelSource


@dataclass(frozen=True)
class PlanFacts:
    mostly_dense: bool  # most weight elements are Dense/MatMul matrices (int4 makes them 4-bit)
    training_blocker: str | None  # why tfmot cannot fine-tune this model on this data; None: it can


def for_planning(src: ModelSource, ds: Dataset | None) -> PlanFacts:
    return PlanFacts(weights.mostly_dense(src), training_blocker(src, ds))


def training_blocker(src: ModelSource, ds: Dataset | None) -> str | None:
    """Why pruning, clustering and QAT cannot run on this model and data, or None when they can."""
    if src.torch:
        from optimize.models.torch_source import TRAINING

        return TRAINING
    if src.kind == "tflite":
        return "the model is a .tflite: pruning, clustering and QAT need the Keras model it was made from"
    if src.kind == "savedmodel":
        return "the model is a SavedModel: pruning, clustering and QAT need a Keras model (tfmot)"
    if ds is None or ds.x_train is None:
        return "no training inputs (x or x_train) to fine-tune on"
    if src.kind == "keras3":
        try:
            rebuild.require_keras2(src, ds)
        except ModelError as e:
            return e.problem
    return None

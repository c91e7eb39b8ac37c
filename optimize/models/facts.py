"""What planning a sweep asks of a model, answered in one visit: whether Dense/MatMul weights dominate (the
sweep then tries int4) and why pruning, clustering and QAT cannot fine-tune it, if they cannot."""

from __future__ import annotations

from dataclasses import dataclass

from optimize.core.errors import ModelError
from optimize.models import rebuild, weights
from optimize.models.data import Dataset
from optimize.models.source import ModelSource, load_keras2


@dataclass(frozen=True)
class PlanFacts:
    mostly_dense: bool  # most weight elements are Dense/MatMul matrices (int4 makes them 4-bit)
    training_blocker: str | None  # why tfmot cannot fine-tune this model on this data; None: it can
    keras_refusal: ModelError | None = None  # why a Keras step cannot load this model (asked for: `trains`)
    rebuild: tuple[str | None, str] | None = None  # a Keras 3 model's tf_keras rebuild: (why not, note), if checked


def for_planning(src: ModelSource, ds: Dataset | None, trains: bool = False, known=None) -> PlanFacts:
    """Everything planning asks of the model; `trains`: a recipe with a Keras step is planned, so whether
    tfmot can load the model is asked too (loading a SavedModel as Keras costs seconds: only then). `known`:
    a `known.KnownRebuild` an earlier run found for these bytes and data, taken instead of rebuilding."""
    if known is not None:
        rebuild.remember(src.fingerprint, known.why, known.note)
    blocker = training_blocker(src, ds)
    refusal = keras_refusal(src, ds) if trains else None
    found = rebuild.verdict(src.fingerprint) if src.kind == "keras3" else None
    return PlanFacts(weights.mostly_dense(src), blocker, refusal, found)


def keras_refusal(src: ModelSource, ds: Dataset | None) -> ModelError | None:
    """The one-line error a Keras step (prune, cluster, QAT) meets on this model, or None: a Keras 3 model that
    does not rebuild in tf_keras (checked on `ds`, as the sweep checks it), a SavedModel tf_keras cannot load."""
    try:
        if src.kind == "keras3":
            rebuild.require_keras2(src, ds)
        elif src.kind == "savedmodel":
            load_keras2(src)
    except ModelError as e:
        return e
    return None


def training_blocker(src: ModelSource, ds: Dataset | None) -> str | None:
    """Why pruning, clustering and QAT cannot run on this model and data, or None when they can."""
    if src.converted:
        from optimize.models.spec import TRAINING

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

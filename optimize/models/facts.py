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
    a `known.KnownRebuild` an earlier run found for these bytes and data, taken instead of rebuilding. A Keras 3
    model's rebuild is asked once (`rebuild.for_planning`), and both answers below read it."""
    blocker = _blocker(src, ds)
    found = rebuild.for_planning(src, ds, trains, known)
    refused = rebuild.refusal(src.path.name, found[0]) if found is not None and found[0] else None
    blocker = blocker or (refused.problem if refused is not None else None)
    refusal = (refused or _savedmodel_refusal(src)) if trains else None
    return PlanFacts(weights.mostly_dense(src), blocker, refusal, found)


def keras_refusal(src: ModelSource, ds: Dataset | None) -> ModelError | None:
    """The one-line error a Keras step (prune, cluster, QAT) meets on this model, or None: a Keras 3 model that
    does not rebuild in tf_keras (checked on `ds`, as the sweep checks it), a SavedModel tf_keras cannot load."""
    try:
        if src.kind == "keras3":
            rebuild.require_keras2(src, ds)
    except ModelError as e:
        return e
    return _savedmodel_refusal(src)


def _savedmodel_refusal(src: ModelSource) -> ModelError | None:
    """Why tf_keras cannot load a SavedModel for a Keras step (None: it can, or the model is no SavedModel)."""
    if src.kind != "savedmodel":
        return None
    try:
        load_keras2(src)
    except ModelError as e:
        return e
    return None


def training_blocker(src: ModelSource, ds: Dataset | None) -> str | None:
    """Why pruning, clustering and QAT cannot run on this model and data, or None when they can."""
    blocker = _blocker(src, ds)
    if blocker is not None or src.kind != "keras3":
        return blocker
    try:
        rebuild.require_keras2(src, ds)
    except ModelError as e:
        return e.problem
    return None


def _blocker(src: ModelSource, ds: Dataset | None) -> str | None:
    """Why pruning, clustering and QAT cannot run, from the model's kind and the data alone (None: nothing there
    stands in the way; a Keras 3 model's rebuild is asked apart)."""
    if src.converted:
        from optimize.models.spec import TRAINING

        return TRAINING
    if src.kind == "tflite":
        return "the model is a .tflite: pruning, clustering and QAT need the Keras model it was made from"
    if src.kind == "savedmodel":
        return "the model is a SavedModel: pruning, clustering and QAT need a Keras model (tfmot)"
    if ds is None or ds.x_train is None:
        return "no training inputs (x or x_train) to fine-tune on"
    return None

"""Shared by the Keras-stage techniques: per-layer wrapping (so unknown layers are skipped, not fatal)
and a short, seeded fine-tune on the context's training data."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from optimize.core.errors import ModelError, TechniqueFailed
from optimize.core.registry import Context
from optimize.models import _tf
from optimize.models.data import as_inputs
from optimize.models.tasks import _head


def require_keras2(model, technique: str) -> None:
    keras = _tf.keras()
    if not isinstance(model, keras.Model):
        raise ModelError(
            f"{technique} needs a Keras 2 (tf_keras) model; this is a {type(model).__module__} model.",
            "Save the model with tf_keras, or use a post-training scheme (optimize quantize) instead.",
        )


def wrap_supported(model, supports: Callable, wrap: Callable, ctx: Context, technique: str):
    """Clone the model, wrapping only the layers the technique supports.

    tfmot's whole-model helpers fail on layers they do not know (Rescaling, TFOpLambda in MobileNetV3);
    wrapping layer by layer works, and the layers left as they were are reported in the candidate.
    """
    keras = _tf.keras()
    wrapped = 0

    def clone(layer):
        nonlocal wrapped
        if layer.weights and supports(layer):
            wrapped += 1
            return wrap(layer)
        return layer.__class__.from_config(layer.get_config())

    skipped = [  # e.g. Rescaling, TFOpLambda: left as they were
        f"{layer.name} ({layer.__class__.__name__})"
        for layer in model.layers
        if not isinstance(layer, keras.layers.InputLayer) and not supports(layer)
    ]

    try:
        out = keras.models.clone_model(model, clone_function=clone)
    except (ValueError, TypeError, RuntimeError) as e:
        raise TechniqueFailed(f"{technique} could not rebuild the model: {str(e).splitlines()[0]}") from None
    for src in model.layers:
        try:
            dst = out.get_layer(src.name)
        except ValueError:
            continue
        if src.weights and not hasattr(dst, "layer"):
            dst.set_weights(src.get_weights())
    if not wrapped:
        raise TechniqueFailed(f"{technique}: no layer of this model is supported by tfmot.")
    ctx.skipped_layers.extend(skipped)
    if skipped:
        ctx.notes.append(f"{technique}: {len(skipped)} layer(s) left as they were (tfmot does not support them).")
    return out


def _loss(task, head):
    """The fine-tuning loss and metrics that fit what an output predicts."""
    from optimize.models.tasks import Task

    keras = _tf.keras()
    if task is Task.CLASSIFICATION:
        return keras.losses.SparseCategoricalCrossentropy(from_logits=head.activation != "softmax"), ["accuracy"]
    if task in (Task.BINARY, Task.MULTILABEL):
        return keras.losses.BinaryCrossentropy(from_logits=head.activation != "sigmoid"), ["accuracy"]
    return keras.losses.MeanSquaredError(), []


def _distill_loss(head, target: np.ndarray):
    """(loss, weight) that pulls an output toward the float model's own outputs: cross-entropy on its soft
    classes or probabilities (a softmax or sigmoid head), else squared error over the output's variance, so
    an output in pixels weighs as much as one in probabilities."""
    keras = _tf.keras()
    if head.activation == "softmax":
        return keras.losses.CategoricalCrossentropy(), 1.0
    if head.activation == "sigmoid":
        return keras.losses.BinaryCrossentropy(), 1.0
    var = float(np.var(target.astype(np.float64)))
    return keras.losses.MeanSquaredError(), 1.0 / var if var > 1e-12 else 1.0


def output_index(name: str, names: list[str], source: tuple[str, ...]) -> int | None:
    """Which output of a (possibly tfmot-wrapped) model the labels named `name` belong to: by the source
    model's output order (tfmot renames a wrapped output `prune_low_magnitude_<name>`, `cluster_<name>`,
    `quant_<name>`), else by the model's own names, else by a wrapped name ending in `_<name>`."""
    if name in source and source.index(name) < len(names):
        return source.index(name)
    if name in names:
        return names.index(name)
    ends = [i for i, n in enumerate(names) if n.endswith(f"_{name}")]
    return ends[0] if len(ends) == 1 else None


@dataclass
class Targets:
    """What each output of the model being fine-tuned is trained toward: its labels, or the float model's own
    outputs (distillation) for an output without labels."""

    targets: dict = field(default_factory=dict)  # output name -> array
    losses: dict = field(default_factory=dict)
    metrics: dict = field(default_factory=dict)
    weights: dict = field(default_factory=dict)
    distilled: list[str] = field(default_factory=list)  # the source model's names of the distilled outputs

    def fit_args(self, names: list[str]) -> tuple:
        """(y, loss, metrics, loss_weights) as Model.compile/fit take them (plain values for one output)."""
        if len(names) == 1:
            (only,) = names
            return self.targets[only], self.losses[only], self.metrics[only], None
        return self.targets, self.losses, self.metrics, self.weights


def _labelled(model, ds, targets: Targets) -> dict:
    """The labelled outputs' targets and losses; labels keyed by the source model's output names (y:<output>,
    or --label-output for plain y); a wrapped model's outputs are found by position, whatever tfmot renamed
    them to. Returns the labels as given, to name them in an error."""
    from optimize.models.tasks import check_labels, detect

    names = list(getattr(model, "output_names", None) or ["output"])
    source = tuple(ds.outputs or names)
    y = ds.y_train
    if y is None:
        return {}
    if not isinstance(y, dict):
        y = {ds.label_output or source[0]: y}
    for label, ys in y.items():
        i = output_index(label, names, source)
        if i is None:
            continue
        name = names[i]
        head = _head(model, i)
        task = detect(head, ys, ds.task)
        targets.targets[name] = check_labels(task, head, ys, f"y_train for {label}")
        targets.losses[name], targets.metrics[name] = _loss(task, head)
        targets.weights[name] = 1.0
    return y


def targets_for(model, ds, teacher: list[np.ndarray] | None) -> Targets:
    """Every output's training target: its labels where the data has some, else the float model's own output
    on the same training inputs (`teacher`, one array per output in the model's order), so fine-tuning
    keeps what it was not told about instead of letting it drift."""
    from optimize.core.errors import DataError

    names = list(getattr(model, "output_names", None) or ["output"])
    source = tuple(ds.outputs or names)
    out = Targets()
    given = _labelled(model, ds, out)
    for i, name in enumerate(names):
        if name in out.targets:
            continue
        if teacher is None or i >= len(teacher):
            continue
        target = np.asarray(teacher[i], np.float32)
        out.targets[name] = target
        out.losses[name], out.weights[name] = _distill_loss(_head(model, i), target)
        out.metrics[name] = []
        out.distilled.append(source[i] if i < len(source) else name)
    if given and len(out.targets) == len(out.distilled):
        raise DataError(
            f"The training labels ({', '.join(f'y:{k}' for k in given)}) match none of the model's outputs "
            f"({', '.join(source)}).",
            "Key labels as y:<output name>, or pass --label-output for plain y.",
        )
    if len(out.targets) < len(names):
        missing = [source[i] if i < len(source) else n for i, n in enumerate(names) if n not in out.targets]
        raise DataError(
            f"No training target for output(s) {', '.join(missing)}: no labels, and no float model to learn from.",
            "Add labels y:<output> for them.",
        )
    return out


def teacher_outputs(model, ctx: Context) -> list[np.ndarray] | None:
    """The float model's outputs on the training inputs, one array per output: what an output without
    labels is trained toward. The run's float source model's (`ctx.teacher`, shared by a chain's steps), else
    this model's own before it is wrapped; None when every output has labels (nothing to distil)."""
    ds = ctx.data
    if ds is None or ds.x_train is None:
        return None
    names = list(getattr(model, "output_names", None) or ["output"])
    labelled = ds.y_train if isinstance(ds.y_train, dict) else ({"": ds.y_train} if ds.y_train is not None else {})
    if len(labelled) >= len(names):
        return None
    if ctx.teacher is not None:
        return ctx.teacher()
    return predict(model, ds.x_train)


def predict(model, xs) -> list[np.ndarray]:
    """A Keras model's outputs on `xs` (every output, in order), quietly, in batches."""
    out = model.predict(as_inputs(xs), batch_size=64, verbose=0)
    out = list(out.values()) if isinstance(out, dict) else out
    return [np.asarray(o) for o in (out if isinstance(out, (list, tuple)) else [out])]


def fine_tune(
    model,
    ctx: Context,
    epochs: int,
    batch_size: int,
    learning_rate: float,
    callbacks=(),
    technique="",
    teacher: list[np.ndarray] | None = None,
):
    """Compile and fit on ctx.data's training split, seeded, quietly. The loss follows each output's task
    (classes, one sigmoid unit, several labels, values); an output without labels learns the float model's
    own outputs (`teacher`: distillation), so the outputs nobody labelled stay where they were, and a model
    with no labels at all can still be fine-tuned."""
    if ctx.data is None:
        from optimize.core.errors import DataError

        raise DataError(
            f"{technique} fine-tunes the model and needs training data.", "Pass --data DATA.npz with x (and y)."
        )
    ctx.data.require_training(technique)
    keras = _tf.keras()
    keras.utils.set_random_seed(ctx.seed)
    names = list(getattr(model, "output_names", None) or ["output"])
    targets = targets_for(model, ctx.data, teacher)
    y, loss, metrics, weights = targets.fit_args(names)
    if targets.distilled:
        which = "every output" if len(targets.distilled) == len(names) else ", ".join(targets.distilled)
        note = f"{technique}: trained {which} toward the float model's own outputs (no labels: distillation)."
        if note not in ctx.notes:
            ctx.notes.append(note)
    model.compile(optimizer=keras.optimizers.Adam(learning_rate), loss=loss, metrics=metrics, loss_weights=weights)
    model.fit(
        as_inputs(ctx.data.x_train),
        y,
        epochs=epochs,
        batch_size=batch_size,
        callbacks=list(callbacks),
        verbose=0,
        shuffle=True,
    )
    return model

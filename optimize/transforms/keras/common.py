"""Shared by the Keras-stage techniques: per-layer wrapping (so unknown layers are skipped, not fatal)
and a short, seeded fine-tune on the context's training data."""

from __future__ import annotations

from collections.abc import Callable

from optimize.core.errors import ModelError, TechniqueFailed
from optimize.core.registry import Context
from optimize.models import _tf
from optimize.models.data import as_float
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


def _losses(model, ds):
    """(labels, losses, metrics) for every output that has labels: keyed by output name when several.

    Labels are keyed by the source model's output names (y:<output>, or --label-output for plain y); a
    wrapped model's outputs are found by position, whatever tfmot renamed them to."""
    from optimize.core.errors import DataError
    from optimize.models.tasks import check_labels, detect

    names = list(getattr(model, "output_names", None) or ["output"])
    source = tuple(ds.outputs or names)
    y = ds.y_train
    if not isinstance(y, dict):
        y = {ds.label_output or source[0]: y}
    losses, metrics, labels = {}, {}, {}
    for label, ys in y.items():
        i = output_index(label, names, source)
        if i is None:
            continue
        name = names[i]
        head = _head(model, i)
        task = detect(head, ys, ds.task)
        labels[name] = check_labels(task, head, ys, f"y_train for {label}")
        losses[name], metrics[name] = _loss(task, head)
    if not labels:
        raise DataError(
            f"The training labels ({', '.join(f'y:{k}' for k in y)}) match none of the model's outputs "
            f"({', '.join(source)}).",
            "Key labels as y:<output name>, or pass --label-output for plain y.",
        )
    if len(names) == 1:
        (only,) = labels
        return labels[only], losses[only], metrics[only]
    return labels, losses, metrics


def fine_tune(model, ctx: Context, epochs: int, batch_size: int, learning_rate: float, callbacks=(), technique=""):
    """Compile and fit on ctx.data's training split, seeded, quietly; the loss follows each output's task
    (classes, one sigmoid unit, several labels, values)."""
    if ctx.data is None:
        from optimize.core.errors import DataError

        raise DataError(
            f"{technique} fine-tunes the model and needs training data.", "Pass --data DATA.npz with x and y."
        )
    ctx.data.require_training(technique)
    keras = _tf.keras()
    keras.utils.set_random_seed(ctx.seed)
    labels, loss, metrics = _losses(model, ctx.data)
    model.compile(optimizer=keras.optimizers.Adam(learning_rate), loss=loss, metrics=metrics)
    model.fit(
        as_float(ctx.data.x_train),
        labels,
        epochs=epochs,
        batch_size=batch_size,
        callbacks=list(callbacks),
        verbose=0,
        shuffle=True,
    )
    return model

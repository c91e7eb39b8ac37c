"""Shared by the Keras-stage techniques: per-layer wrapping (so unknown layers are skipped, not fatal)
and a short, seeded fine-tune on the context's training data."""

from __future__ import annotations

from collections.abc import Callable

from .. import _tf
from ..data import as_float
from ..errors import ModelError, TechniqueFailed
from ..registry import Context


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


def _head(model, i: int):
    """The Keras model's i-th output as a task Head: its shape and its final activation."""
    from ..tasks import Head

    layer = model.get_layer(model.output_names[i]) if hasattr(model, "output_names") else model.layers[-1]
    inner = getattr(layer, "layer", layer)  # a tfmot wrapper keeps the layer inside
    act = getattr(getattr(inner, "activation", None), "__name__", None)
    shape = tuple(-1 if d is None else int(d) for d in model.outputs[i].shape)
    return Head(shape, act)


def _loss(task, head):
    """The fine-tuning loss and metrics that fit what an output predicts."""
    from ..tasks import Task

    keras = _tf.keras()
    if task is Task.CLASSIFICATION:
        return keras.losses.SparseCategoricalCrossentropy(from_logits=head.activation != "softmax"), ["accuracy"]
    if task in (Task.BINARY, Task.MULTILABEL):
        return keras.losses.BinaryCrossentropy(from_logits=head.activation != "sigmoid"), ["accuracy"]
    return keras.losses.MeanSquaredError(), []


def _losses(model, ds):
    """(labels, losses, metrics) for every output that has labels: keyed by output name when several."""
    from ..tasks import check_labels, detect

    names = list(getattr(model, "output_names", None) or ["output"])
    y = ds.y_train
    if not isinstance(y, dict):
        label = ds.label_output if ds.label_output in names else names[0]
        y = {label: y}
    losses, metrics, labels = {}, {}, {}
    for name, ys in y.items():
        if name not in names:
            continue
        head = _head(model, names.index(name))
        task = detect(head, ys, ds.task)
        labels[name] = check_labels(task, head, ys, f"y_train for {name}")
        losses[name], metrics[name] = _loss(task, head)
    if len(names) == 1:
        (only,) = labels
        return labels[only], losses[only], metrics[only]
    return labels, losses, metrics


def fine_tune(model, ctx: Context, epochs: int, batch_size: int, learning_rate: float, callbacks=(), technique=""):
    """Compile and fit on ctx.data's training split, seeded, quietly; the loss follows each output's task
    (classes, one sigmoid unit, several labels, values)."""
    if ctx.data is None:
        from ..errors import DataError

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

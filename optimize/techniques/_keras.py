"""Shared by the Keras-stage techniques: per-layer wrapping (so unknown layers are skipped, not fatal)
and a short, seeded fine-tune on the context's training data."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .. import _tf
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


def _loss_for(model, y: np.ndarray):
    keras = _tf.keras()
    last = model.layers[-1]
    softmax = getattr(getattr(last, "activation", None), "__name__", "") == "softmax"
    if getattr(last, "layer", None) is not None:  # a tfmot wrapper
        softmax = getattr(getattr(last.layer, "activation", None), "__name__", "") == "softmax"
    if np.issubdtype(y.dtype, np.integer) and y.ndim == 1:
        return keras.losses.SparseCategoricalCrossentropy(from_logits=not softmax), ["accuracy"]
    return keras.losses.MeanSquaredError(), []


def fine_tune(model, ctx: Context, epochs: int, batch_size: int, learning_rate: float, callbacks=(), technique=""):
    """Compile and fit on ctx.data's training split, seeded, quietly."""
    if ctx.data is None:
        from ..errors import DataError

        raise DataError(
            f"{technique} fine-tunes the model and needs training data.", "Pass --data DATA.npz with x and y."
        )
    ctx.data.require_training(technique)
    keras = _tf.keras()
    keras.utils.set_random_seed(ctx.seed)
    loss, metrics = _loss_for(model, ctx.data.y_train)
    model.compile(optimizer=keras.optimizers.Adam(learning_rate), loss=loss, metrics=metrics)
    model.fit(
        ctx.data.x_train.astype(np.float32),
        ctx.data.y_train,
        epochs=epochs,
        batch_size=batch_size,
        callbacks=list(callbacks),
        verbose=0,
        shuffle=True,
    )
    return model

"""Keras 3 activations and operations in tf_keras terms, for rebuilding a Keras 3 model in tf_keras (`rebuild`).

Activations: Keras 3 names tf_keras lacks (`silu`, `hard_silu`, `relu6`, ...) or computes otherwise (Keras 3's
`hard_sigmoid` is relu6(x + 3) / 6, tf_keras's 0.2x + 0.5): each is a tf_keras name that computes the same, or a
function of ours registered with tf_keras (package "optimize"), so the rebuilt model saves and loads again.

Operations: a Keras 3 model may apply an operation outside any layer (`x + 3.0`, `x * (1 / 6)` in
keras.applications' MobileNetV3): each elementwise one here is applied to the tf_keras tensors as the same
TensorFlow op (tf_keras records it as a TFOpLambda layer, which pruning, clustering and QAT leave as it is).
Any other is named in the one line that says the model cannot be rebuilt.
"""

from __future__ import annotations

from optimize.models import _tf


def hard_silu(x):
    """Keras 3's hard_silu (hard_swish): x * relu6(x + 3) / 6."""
    tf = _tf.tf()
    return x * tf.nn.relu6(x + 3.0) * (1.0 / 6.0)


def hard_sigmoid(x):
    """Keras 3's hard_sigmoid: relu6(x + 3) / 6 (tf_keras's is 0.2x + 0.5, clipped)."""
    return _tf.tf().nn.relu6(x + 3.0) * (1.0 / 6.0)


def relu6(x):
    return _tf.tf().nn.relu6(x)


def leaky_relu(x):
    """Keras 3's leaky_relu activation: a negative slope of 0.2."""
    return _tf.tf().nn.leaky_relu(x, alpha=0.2)


def log_softmax(x):
    return _tf.tf().nn.log_softmax(x, axis=-1)


def hard_tanh(x):
    return _tf.tf().clip_by_value(x, -1.0, 1.0)


#: Keras 3 activation name -> what computes the same in tf_keras (a name it knows, or one of ours above).
ACTIVATIONS = {
    "silu": "swish",
    "hard_silu": hard_silu,
    "hard_swish": hard_silu,
    "hard_sigmoid": hard_sigmoid,
    "relu6": relu6,
    "leaky_relu": leaky_relu,
    "log_softmax": log_softmax,
    "hard_tanh": hard_tanh,
}
_REGISTERED: list[bool] = []


def register() -> None:
    """Our activation functions registered with tf_keras (once per process): a model rebuilt with them is
    saved under these names and loads again wherever this has run."""
    if _REGISTERED:
        return
    keras2 = _tf.keras()
    for fn in {f for f in ACTIVATIONS.values() if callable(f)}:
        keras2.utils.register_keras_serializable(package="optimize", name=fn.__name__)(fn)
    _REGISTERED.append(True)


def activation(value):
    """A layer's activation setting (a Keras 3 name) as tf_keras takes it; anything else as it is."""
    if isinstance(value, str) and value in ACTIVATIONS:
        register()
        return ACTIVATIONS[value]
    return value


def _binary(name: str):
    def apply(a, b):
        return getattr(_tf.tf().math, name)(a, b)

    return apply


def _unary(path: str):
    def apply(x):
        module, fn = path.split(".")
        return getattr(getattr(_tf.tf(), module), fn)(x)

    return apply


#: Keras 3 operation class (keras.src.ops) -> the TensorFlow function applying it to tf_keras tensors.
OPERATIONS = {
    "Add": _binary("add"),
    "Subtract": _binary("subtract"),
    "Multiply": _binary("multiply"),
    "Divide": _binary("truediv"),
    "TrueDivide": _binary("truediv"),
    "Maximum": _binary("maximum"),
    "Minimum": _binary("minimum"),
    "Power": _binary("pow"),
    "Negative": _unary("math.negative"),
    "Abs": _unary("math.abs"),
    "Sqrt": _unary("math.sqrt"),
    "Exp": _unary("math.exp"),
    "Log": _unary("math.log"),
    "Tanh": _unary("math.tanh"),
    "Sigmoid": _unary("math.sigmoid"),
    "Relu": _unary("nn.relu"),
    "Relu6": _unary("nn.relu6"),
}


def operation(op):
    """The TensorFlow function that applies a Keras 3 operation (not a layer) to tf_keras tensors, or None."""
    return OPERATIONS.get(type(op).__name__) if type(op).__module__.startswith("keras.src.ops") else None

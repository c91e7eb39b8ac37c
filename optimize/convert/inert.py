"""Parts of a Keras model that do nothing at inference, cleared before it is exported for conversion.

A recurrent layer's `dropout` and `recurrent_dropout` act only while training, yet Keras traces a layer
with `recurrent_dropout > 0` through its generic loop instead of the fused kernel: the converter then
emits a WHILE loop, which no calibrator quantizes through, where the same LSTM without it converts to
one UNIDIRECTIONAL_SEQUENCE_LSTM op (int8-ready, and far smaller with dynamic range). So before export,
the model is rebuilt from its config with those rates at 0 and its own weights, and used only when its
outputs match the original's (on zeros and seeded inputs in [0, 1)); otherwise the original is exported
as it is. A subclassed model (no config to rebuild from) is left alone.
"""

from __future__ import annotations

import numpy as np

#: Layer classes (Keras 2 and 3) whose dropout rates are training-only, and the keys that hold them.
RECURRENT = frozenset(
    {
        "LSTM",
        "GRU",
        "SimpleRNN",
        "LSTMCell",
        "GRUCell",
        "SimpleRNNCell",
        "ConvLSTM1D",
        "ConvLSTM2D",
        "ConvLSTM3D",
        "LSTMV1",
        "GRUV1",
    }
)
DROPOUT_KEYS = ("dropout", "recurrent_dropout")
TOLERANCE = 1e-5  # outputs may differ by this much, relative to their largest magnitude (float rounding)


def _clear(node, found: list[str]) -> None:
    """Set the dropout rates of every recurrent layer in a (nested) Keras config to 0, noting each."""
    if isinstance(node, dict):
        cls = node.get("class_name")
        cfg = node.get("config")
        if cls in RECURRENT and isinstance(cfg, dict):
            keys = [k for k in DROPOUT_KEYS if isinstance(cfg.get(k), (int, float)) and cfg[k] > 0]
            for k in keys:
                cfg[k] = 0.0
            if keys:
                found.append(f"{cfg.get('name', cls)} ({', '.join(keys)})")
        for v in node.values():
            _clear(v, found)
    elif isinstance(node, list):
        for v in node:
            _clear(v, found)


def _probe_inputs(model) -> list[list[np.ndarray]]:
    """Zeros and seeded values in [0, 1) for every input (batch 2; free dimensions at 8)."""
    rng = np.random.default_rng(0)
    shapes = [[2, *[d if d is not None else 8 for d in t.shape[1:]]] for t in model.inputs]
    dtypes = [getattr(t.dtype, "name", None) or str(t.dtype) for t in model.inputs]
    zeros = [np.zeros(s, np.float32) for s in shapes]
    seeded = [rng.random(s).astype(np.float32) for s in shapes]
    cast = [[x.astype(d) if "int" in d else x for x, d in zip(xs, dtypes)] for xs in (zeros, seeded)]
    return cast


def _outputs(model, xs: list[np.ndarray]) -> list[np.ndarray]:
    out = model(xs if len(xs) > 1 else xs[0], training=False)
    out = out if isinstance(out, (list, tuple)) else list(out.values()) if isinstance(out, dict) else [out]
    return [np.asarray(o) for o in out]


def inference_ready(model):
    """(the model to export, what was cleared): the model rebuilt with its recurrent layers' dropout rates at
    0 when it has any and the rebuild computes the same, else the model itself and an empty list."""
    try:
        config = model.get_config()
    except (NotImplementedError, TypeError, ValueError, AttributeError):
        return model, []
    cleared: list[str] = []
    _clear(config, cleared)
    if not cleared:
        return model, []
    try:
        rebuilt = type(model).from_config(config)
        rebuilt.set_weights(model.get_weights())
        for xs in _probe_inputs(model):
            for a, b in zip(_outputs(model, xs), _outputs(rebuilt, xs), strict=True):
                if np.abs(a - b).max() > TOLERANCE * max(1.0, float(np.abs(a).max())):
                    return model, []
    except Exception:  # noqa: BLE001 - a model that cannot be rebuilt is exported as it is
        return model, []
    return rebuilt, cleared

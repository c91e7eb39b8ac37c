"""Keras 3 models rebuilt in tf_keras, so pruning, clustering and QAT (tfmot, Keras 2 only) apply to them.

A Keras 3 model made of standard layers is rebuilt layer by layer: each layer from its own config (the
dtype policy read as its name, nested objects in the Keras 2 form, Keras 3 activation names as tf_keras
computes them (`keras3_ops`), keys tf_keras does not take dropped where they hold Keras 3's own default,
initializers left at tf_keras's defaults, an attention layer built at the shapes it was built at), an
operation applied outside any layer (`x + 3.0`) as the same TensorFlow op, the graph traced again through Keras
3's own walk of its nodes with the new layers, the weights copied.
The rebuild is used only when it is exact: both models run on the same samples and every output must
match (max |diff| <= 1e-5 + 1e-4 x |output|). Anything else (a Keras 3 op that is not a layer, a layer
tf_keras lacks, outputs that differ) is a ModelError saying why, which a sweep lists as the reason its
Keras-stage techniques were dropped.

    keras2_why(src, data=None) -> str | None    why it cannot be rebuilt exactly (None: it can), once per process
    keras2_path(src, data, folder) -> Path      the rebuilt tf_keras model, saved in the caller's workspace
"""

from __future__ import annotations

import inspect
from pathlib import Path

import numpy as np

from optimize.core.errors import ModelError
from optimize.models import _tf, keras3_ops

ATOL, RTOL = 1e-5, 1e-4
SAMPLES = 8
#: Keyword arguments every tf_keras layer takes besides its own (base Layer kwargs).
BASE_KWARGS = {"name", "dtype", "trainable", "dynamic", "input_dim", "input_shape", "batch_input_shape", "batch_size"}
FIX = "Save it with tf_keras (Keras 2), or use the post-training schemes (they take Keras 3 as it is)."


def _legacy(value):
    """Keras 3's serialised objects ({module, class_name, config, registered_name}) in the Keras 2 form."""
    if isinstance(value, dict) and "class_name" in value and "config" in value:
        if value["class_name"] in ("DTypePolicy", "FloatDTypePolicy"):
            return value["config"].get("name", "float32")
        return {"class_name": value["class_name"], "config": _legacy(value["config"])}
    if isinstance(value, dict):
        return {k: _legacy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_legacy(v) for v in value]
    return value


def _accepted(cls) -> set[str]:
    """Every keyword a tf_keras layer class takes, its bases' included (subclasses pass **kwargs up)."""
    names = set(BASE_KWARGS)
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is not None:
            names |= {p for p, v in inspect.signature(init).parameters.items() if v.kind is v.POSITIONAL_OR_KEYWORD}
    return names - {"self"}


def _twin(layer3):
    """The tf_keras layer that computes what a Keras 3 layer computes, from its config (or, for a Keras 3
    operation applied outside any layer, the TensorFlow function that computes it)."""
    keras2 = _tf.keras()
    name = type(layer3).__name__
    if not isinstance(layer3, _tf.keras3().layers.Layer):
        op = keras3_ops.operation(layer3)
        if op is None:
            raise ModelError(f"it applies the Keras 3 operation {layer3.name!r} ({name}) outside any layer", FIX)
        return op
    cls = getattr(keras2.layers, name, None)
    if cls is None:
        raise ModelError(f"its layer {layer3.name!r} ({name}) has no tf_keras counterpart", FIX)
    # initializers only shape new weights, and every weight is copied: tf_keras's defaults serve
    config = {k: v for k, v in _legacy(layer3.get_config()).items() if not k.endswith("_initializer")}
    config = {k: keras3_ops.activation(v) if k == "activation" else v for k, v in config.items()}
    built = _built_shapes(layer3)
    keep = _accepted(cls) | set(built)
    odd = sorted(k for k, v in config.items() if k not in keep and not _inert(layer3, k, v))
    if odd:
        raise ModelError(
            f"layer {layer3.name!r} ({name}) uses Keras 3 settings tf_keras lacks, away from their defaults: {odd}",
            FIX,
        )
    try:
        return cls.from_config({**{k: v for k, v in config.items() if k in keep}, **built})
    except (TypeError, ValueError, KeyError) as e:
        raise ModelError(f"layer {layer3.name!r} ({name}) does not rebuild in tf_keras: {_first(e)}", FIX) from None


def _inert(layer3, key: str, value) -> bool:
    """Whether a setting tf_keras does not take changes nothing: empty or off, or what the Keras 3 layer holds
    when it is left out (Resizing's data_format "channels_last", fill_mode "constant")."""
    if value in (None, False, 0, {}, []):
        return True
    config = layer3.get_config()
    try:
        fresh = type(layer3).from_config({k: v for k, v in config.items() if k != key})
    except Exception:  # noqa: BLE001 - a layer that needs the setting: not a default
        return False
    return fresh.get_config().get(key) == config.get(key)


def _built_shapes(layer3) -> dict:
    """The input shapes a layer was built at, where its tf_keras twin is built from its config with them (an
    attention layer's query_shape, value_shape and key_shape); {} for any other layer."""
    if "MultiHeadAttention" not in type(layer3).__name__ or not hasattr(layer3, "get_build_config"):
        return {}
    shapes = (layer3.get_build_config() or {}).get("shapes_dict") or {}
    query, value = shapes.get("query_shape"), shapes.get("value_shape")
    return {"query_shape": query, "value_shape": value, "key_shape": shapes.get("key_shape") or value}


def _first(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:160]


def rebuild(model3):
    """The Keras 3 model's tf_keras twin (weights copied), or a ModelError naming what stands in the way."""
    keras2 = _tf.keras()
    graph = getattr(model3, "_functional", None) or model3
    if not hasattr(graph, "_run_through_graph") or not getattr(model3, "inputs", None):
        raise ModelError(f"{type(model3).__name__} is not a functional or sequential model with known inputs", FIX)
    twins: dict[int, object] = {}

    def twin(op):
        if id(op) not in twins:
            twins[id(op)] = _twin(op)
        return twins[id(op)]

    inputs = [
        keras2.Input(
            shape=tuple(x.shape[1:]), batch_size=x.shape[0], dtype=x.dtype, name=x.name.split(":")[0].split("/")[0]
        )
        for x in model3.inputs
    ]
    try:
        outputs = graph._run_through_graph(inputs, operation_fn=twin)
        model2 = keras2.Model(inputs if len(inputs) > 1 else inputs[0], outputs, name=model3.name)
    except ModelError:
        raise
    except Exception as e:  # noqa: BLE001 - any failure to trace is a model this route cannot take
        raise ModelError(f"it does not trace in tf_keras: {_first(e)}", FIX) from None
    _copy_weights(model3, twins)
    return model2


def _copy_weights(model3, twins: dict[int, object]) -> None:
    for layer in _layers(model3):
        dst = twins.get(id(layer))
        if dst is None or not hasattr(dst, "get_weights"):  # an operation's TensorFlow function holds none
            continue
        weights = layer.get_weights()
        if len(weights) != len(dst.get_weights()):
            raise ModelError(
                f"layer {layer.name!r} holds {len(weights)} weights in Keras 3, {len(dst.get_weights())} in tf_keras",
                FIX,
            )
        dst.set_weights(weights)


def _layers(model) -> list:
    graph = getattr(model, "_functional", None) or model
    return list(getattr(graph, "operations", None) or getattr(graph, "layers", []))


def _samples(model3, data) -> list[np.ndarray]:
    """Inputs to compare the two models on: the data's test samples, else seeded normal values (small
    non-negative ids for an integer input: an embedding indexes with them)."""
    if data is not None:
        from optimize.models.data import as_inputs, take

        xs = as_inputs(take(data.x_test, slice(0, SAMPLES)))
        names = [x.name for x in model3.inputs]
        return [xs[n] for n in names] if isinstance(xs, dict) else [xs]
    rng = np.random.default_rng(0)
    out = []
    for x in model3.inputs:
        shape = (SAMPLES, *[d or 1 for d in x.shape[1:]])
        ints = np.issubdtype(np.dtype(str(x.dtype)), np.integer)
        out.append(
            rng.integers(0, 2, size=shape).astype(str(x.dtype)) if ints else rng.normal(size=shape).astype(np.float32)
        )
    return out


def _outputs(model, xs: list[np.ndarray]) -> list[np.ndarray]:
    out = model(xs if len(xs) > 1 else xs[0], training=False)
    out = list(out.values()) if isinstance(out, dict) else out
    return [np.asarray(o) for o in (out if isinstance(out, (list, tuple)) else [out])]


def check_exact(model3, model2, data=None) -> float:
    """The largest |difference| between the two models' outputs on the same samples; a ModelError when they
    do not match (the rebuild is not the same function)."""
    xs = _samples(model3, data)
    a, b = _outputs(model3, xs), _outputs(model2, xs)
    if len(a) != len(b) or any(x.shape != y.shape for x, y in zip(a, b)):
        raise ModelError("its tf_keras rebuild has different outputs", FIX)
    worst = max(float(np.max(np.abs(x - y))) if x.size else 0.0 for x, y in zip(a, b))
    if not all(np.allclose(x, y, rtol=RTOL, atol=ATOL) for x, y in zip(a, b)):
        raise ModelError(f"its tf_keras rebuild computes something else (outputs differ by up to {worst:.3g})", FIX)
    return worst


#: Per process, by model fingerprint: why a Keras 3 model cannot be rebuilt exactly (None: it can), the note,
#: and whether the check ran on the user's data (a check on seeded normal inputs is redone once data comes).
_VERDICTS: dict[str, tuple[str | None, str, bool]] = {}
_SAVED: dict[tuple[str, str], Path] = {}


def remember(fingerprint: str, why: str | None, note: str = "") -> None:
    """Take a verdict found earlier on the same model file (the planning facts a warm re-run reads back), so
    planning needs no TensorFlow for it."""
    _VERDICTS.setdefault(fingerprint, (why, note, True))


def verdict(fingerprint: str) -> tuple[str | None, str] | None:
    """(why not, note) found in this process for the model, or None when it was not checked."""
    found = _VERDICTS.get(fingerprint)
    return found[:2] if found is not None else None


def keras2_why(src, data=None) -> str | None:
    """Why the Keras 3 model cannot be rebuilt in tf_keras exactly, or None when it can (checked once per
    process, in memory: nothing is written). The check runs on the data's test samples when there is data,
    so `optimize prune` judges a rebuild as the sweep does; one made without data (seeded normal inputs) is
    made again on the data when data comes."""
    found = _VERDICTS.get(src.fingerprint)
    if found is None or (data is not None and not found[2]):
        _VERDICTS[src.fingerprint] = (*_check(src, data)[1:], data is not None)
    return _VERDICTS[src.fingerprint][0]


def require_keras2(src, data=None) -> str:
    """The note a rebuild adds to a candidate; a ModelError ("Keras 3 model <name>: pruning, ... need ...") when
    the model cannot be rebuilt exactly."""
    why = keras2_why(src, data)
    if why is not None:
        raise refusal(src.path.name, why)
    return _VERDICTS[src.fingerprint][1]


def refusal(name: str, why: str) -> ModelError:
    """The one line a Keras step meets on a Keras 3 model that cannot be rebuilt exactly (`why`)."""
    return ModelError(
        f"Pruning, clustering and QAT need a Keras 2 (tf_keras) model; {name} is Keras 3 and cannot be rebuilt in "
        f"tf_keras exactly: {why}.",
        FIX,
    )


def for_planning(src, data, asked: bool, known=None) -> tuple[str | None, str] | None:
    """(why not, note) for a Keras 3 model's rebuild, as planning needs it: checked on `data` where a Keras step
    is `asked` for or there are training inputs to fine-tune on, else what this process found already (or
    None); `known`: a `known.KnownRebuild` an earlier run found for these bytes and data, taken instead."""
    if src.kind != "keras3":
        return None
    if known is not None:
        remember(src.fingerprint, known.why, known.note)
    if asked or (data is not None and data.x_train is not None):
        keras2_why(src, data)
    return verdict(src.fingerprint)


def keras2_path(src, data, folder: Path) -> tuple[Path, str]:
    """(the Keras 3 model rebuilt in tf_keras and saved as .keras in `folder`, a note saying so), made once per
    process and folder. `folder` is the caller's workspace (inside the run's staging folder), never the
    system's temp folder: the copy of the user's model goes when the run ends, however it ends."""
    require_keras2(src, data)
    key = (src.fingerprint, str(folder))
    path = _SAVED.get(key)
    if path is None or not path.is_file():
        model2, why, note = _check(src, data)
        if model2 is None:  # pragma: no cover - the verdict above said it rebuilds
            raise ModelError(f"{src.path.name} cannot be rebuilt in tf_keras exactly: {why}.", FIX)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"keras2-{src.fingerprint}.keras"
        model2.save(path)
        _SAVED[key] = path
    return path, _VERDICTS[src.fingerprint][1]


def _check(src, data):
    """(the tf_keras twin or None, why not or None, the note)."""
    from optimize.models.source import load_keras3

    model3 = load_keras3(src)
    try:
        model2 = rebuild(model3)
        worst = check_exact(model3, model2, data)
    except ModelError as e:
        return None, e.problem, ""
    n = len(model2.layers)
    return (
        model2,
        None,
        f"Keras 3 model rebuilt in tf_keras ({n} layers, config and weights; outputs match to {worst:.1g})",
    )

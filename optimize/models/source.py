"""Model inputs: recognise Keras 2, Keras 3, SavedModel and .tflite; load them fresh. (PyTorch and ONNX models
are recognised and converted by `optimize.convert.formats`; Keras models exported by `optimize.convert.keras`.)

Every failure to recognise a model is one ModelError line naming what was expected. Keras stage
techniques get a fresh load each time (tfmot mutates the model it is given).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import zipfile
from dataclasses import replace
from pathlib import Path

from optimize.core.bounded import loads_json, member_json
from optimize.core.errors import ModelError, reason
from optimize.core.paths import check_tree, open_regular, read_bounded, regular_file
from optimize.models import _tf, keras3_ops, legacy

# the opened model's record and its description, known to every caller as source.X too
from optimize.models.spec import FLAT_KINDS as FLAT_KINDS
from optimize.models.spec import TF_KINDS as TF_KINDS
from optimize.models.spec import TRAINING as TRAINING
from optimize.models.spec import InputSpec as InputSpec
from optimize.models.spec import Kind as Kind
from optimize.models.spec import ModelSource as ModelSource
from optimize.models.spec import digest as digest
from optimize.models.spec import fingerprint_of as fingerprint_of
from optimize.models.spec import opened_content as opened_content
from optimize.models.spec import opened_tflite as opened_tflite
from optimize.models.spec import tflite_heads as tflite_heads
from optimize.models.spec import tflite_io as tflite_io

log = logging.getLogger(__name__)

EXPECTED = (
    "Pass a Keras .keras/.h5 file, a SavedModel directory, a .tflite, a .pt2, an .onnx or a TF1 frozen graph .pb."
)


def file_fingerprint(path: Path, files: list[Path] | None = None) -> str:
    """A content hash of the model file, or of every regular file of a folder (`check_tree`'s list: no
    FIFO, no device, no link outside, bounded in size), read through the one bounded reader."""
    h = hashlib.sha256()
    if files is None:
        files = check_tree(path, "SavedModel", ModelError) if path.is_dir() else [path]
    for f in files:
        h.update(os.fsencode(f.relative_to(path) if path.is_dir() else f.name))  # any name, UTF-8 or not
        with open_regular(f, "model", ModelError) as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()[:16]


KERAS_JSON = "a readable Keras model config"
MAX_KERAS_JSON = 64 * 2**20  # config.json and metadata.json: a large functional model's config is ~1 MiB


#: A .keras archive's config.json and metadata.json are read by `member_json`: size and compression ratio
#: checked before reading, nesting before parsing (a zip bomb or a 200,000-deep config is one line, not
#: MemoryError or RecursionError); what it says when one is not readable ends with this fix.
KERAS_FIX = "Save the model again with Keras."


def _keras_major(path: Path) -> int | None:
    """Which Keras wrote a .keras/.h5 file (2 = tf_keras, 3 = Keras 3), or None if it is neither."""
    with open_regular(path, "model", ModelError) as f:
        head = f.read(8)
    if head.startswith(b"PK"):
        try:
            with zipfile.ZipFile(path) as z:
                meta = member_json(z, "metadata.json", MAX_KERAS_JSON, str(path), ModelError, KERAS_FIX, KERAS_JSON)
            if not isinstance(meta, dict):
                raise ModelError(f"{path}: its metadata.json is not a Keras metadata object.", EXPECTED)
            return int(str(meta.get("keras_version", "0")).split(".")[0])
        except (zipfile.BadZipFile, KeyError, ValueError, UnicodeDecodeError, NotImplementedError, RuntimeError):
            return None
    if head.startswith(b"\x89HDF"):
        import h5py

        try:
            with h5py.File(path, "r") as f:
                v = f.attrs.get("keras_version")
        except OSError:
            return None
        v = v.decode() if isinstance(v, bytes) else v
        return int(str(v).split(".")[0]) if v else None
    return None


def is_tflite(data: bytes) -> bool:
    """A TFLite flatbuffer carries the file identifier 'TFL3' at bytes 4..8."""
    return len(data) >= 8 and data[4:8] == b"TFL3"


def open_model(path, trust: bool = False, known=None) -> ModelSource:
    """Recognise a model file or directory without loading it (cheap, TF-free except for .h5 probing).

    A Keras file must carry a readable model config, and none with Python code in it (Lambda layers,
    marshalled functions) unless `trust`: loading a legacy .h5 runs that code. A SavedModel is read with
    TensorFlow (its signature), unless `known` (a `known.Memo`) holds what reading these exact files found.
    PyTorch and ONNX models are opened by `optimize.convert.formats.opened` (the front door,
    `optimize.convert.front.open_inputs`, asks it first).
    """
    p = Path(path)
    if not p.exists():
        raise ModelError(f"No model at {p}.", EXPECTED)
    if p.is_dir():
        return _open_savedmodel(p, known)
    regular_file(p, "model", ModelError)  # not a FIFO, a device, or larger than a flatbuffer can be
    with open_regular(p, "model", ModelError) as f:
        head = f.read(16)
    if is_tflite(head):
        from optimize.models import runtime
        from optimize.models.tflite import read_model

        content = read_bounded(p, "model", ModelError)  # the one read of the file
        read_model(content, str(p))  # the structural validation every reader shares, named by the file
        try:  # a truncated or corrupt flatbuffer fails here, with the runtime's reason
            runtime.describe(content)
        except ModelError as e:
            raise ModelError(f"{p}: {e.problem}", e.fix) from None
        return opened_tflite(ModelSource(p, "tflite", digest(p.name, content)), content)
    if p.suffix == ".tflite":
        raise ModelError(
            f"{p} is not a TFLite flatbuffer (no 'TFL3' identifier).", "Pass a .tflite written by a converter."
        )
    major = _keras_major(p)
    if major not in (2, 3):
        raise ModelError(f"{p} is not a model optimize can read.", EXPECTED)
    src = ModelSource(p, "keras2" if major == 2 else "keras3", file_fingerprint(p), trust)
    config = _keras_config(src)
    if not (isinstance(config, dict) and isinstance(config.get("config"), dict) and config.get("class_name")):
        raise ModelError(f"{p} has no readable Keras model config.", "Save the model again with Keras.")
    check_trust(src, config, trust)
    check_modules(src, config, trust)
    if p.suffix.lower() in (".h5", ".hdf5"):
        _say_restored(p, config)
    return _opened_keras(src, config)


def _say_restored(p: Path, config: dict) -> None:
    """Say on screen what an old Keras file leaves out that loading it makes explicit (`legacy.restored`)."""
    _, changes = legacy.restored(config)
    if changes:
        log.warning(
            "%s was saved by a Keras without these settings; loaded as it computed: %s.", p.name, "; ".join(changes)
        )


def _open_savedmodel(p: Path, known=None) -> ModelSource:
    """A SavedModel folder checked and described: its signature read with TensorFlow, unless `known` holds
    what reading these exact files found."""
    if not ((p / "saved_model.pb").is_file() or (p / "saved_model.pbtxt").is_file()):
        raise ModelError(f"{p} is a directory but not a SavedModel (no saved_model.pb).", EXPECTED)
    files = check_tree(p, "SavedModel", ModelError)  # no FIFO, device or link outside; bounded size
    fingerprint = file_fingerprint(p, files)
    record = known.model(fingerprint) if known is not None else None
    if record is not None and record.kind == "savedmodel" and record.inputs is not None:
        from optimize.models.known import specs_of

        return ModelSource(p, "savedmodel", fingerprint, inputs=specs_of(record), outputs=())
    _check_fingerprint(p)
    specs = _savedmodel_inputs(p)  # a corrupt graph or missing variables: one line now, not later
    return ModelSource(p, "savedmodel", fingerprint, inputs=tuple(specs), outputs=())


def _check_fingerprint(p: Path) -> None:
    """A fingerprint.pb that does not parse: TensorFlow logs a traceback and carries on; we say so once."""
    fp = p / "fingerprint.pb"
    if fp.exists() and not _tf.fingerprint_readable(read_bounded(fp, "SavedModel", ModelError, limit=2**20)):
        raise ModelError(
            f"{p}: its fingerprint.pb is not a SavedModel fingerprint (corrupt or replaced).",
            "Export the SavedModel again, or delete fingerprint.pb.",
        )


def output_heads(src: ModelSource, model=None) -> list:
    """(output name, tasks.Head) per output of an opened model (`opened`), in order, to check labels before any
    work: a Keras model's (loaded, `model`) or a .tflite's (read from its parse when it was opened). [] for a
    SavedModel (its outputs are known once converted)."""
    if src.kind in ("keras2", "keras3") and model is not None:
        from optimize.models.tasks import _head

        names = list(getattr(model, "output_names", None) or [])
        return [(n, _head(model, i)) for i, n in enumerate(names)]
    return list(src.heads)  # a .tflite's, described when it was opened; () for a SavedModel


def check_loads(src: ModelSource):
    """Load a Keras model once before any work (issue 18): whatever makes it fail to load (garbage weights,
    unknown activations, shapes Keras refuses) is one line and exit 2 now, not a failed candidate later. A
    model with code of its own (a Lambda layer, a custom layer) is also called once, on zeros: code that fails
    when it runs ("name 'tf' is not defined") is one line now, not every candidate failing with it."""
    if src.kind not in ("keras2", "keras3"):
        return None
    model = load_keras2(src) if src.kind == "keras2" else load_keras3(src)
    own = code_of(model)
    if own:
        runs_once(model, src.path.name, own)
    return model


#: What to do about a model whose own code fails: what every candidate would meet, said once.
CODE_FIX = (
    "Build it from Keras layers, or a custom layer registered with keras.saving.register_keras_serializable, and "
    "save it again: a .keras file keeps a Lambda's bytecode, not the module globals it uses (tf, np)."
)


def code_of(model) -> list[str]:
    """The layers of a loaded Keras model (nested models too) that run code of the model's own: Lambda layers
    and classes from outside Keras, as `name (Class)`."""
    found, todo = [], list(getattr(model, "layers", []))
    while todo:
        layer = todo.pop(0)
        todo.extend(getattr(layer, "layers", []) if layer is not model else [])
        module = type(layer).__module__.split(".")[0]
        if type(layer).__name__ == "Lambda" or module not in KERAS_MODULES:
            found.append(f"{layer.name} ({type(layer).__name__})")
    return found


def runs_once(model, name: str, own: list[str]) -> None:
    """Call the model once on zeros (a batch of one, free dimensions 1): its own code failing is one line with
    that code's own message and the remedy."""
    import numpy as np

    xs = [
        np.zeros([1, *[d or 1 for d in t.shape[1:]]], getattr(t.dtype, "name", None) or str(t.dtype))
        for t in model.inputs
    ]
    try:
        model(xs if len(xs) > 1 else xs[0], training=False)
    except Exception as e:  # noqa: BLE001 - whatever the model's own code raises: one line, before any work
        raise ModelError(
            f"{name}: its own code fails when the model runs ({', '.join(own[:3])}): {reason(e)}.", CODE_FIX
        ) from None


def load_keras2(src: ModelSource):
    """A fresh tf_keras model from disk. Keras 3 files get a clear line: tfmot needs Keras 2."""
    if src.kind != "keras2":
        if src.converted:
            raise ModelError(
                f"{src.path.name}: {TRAINING}.",
                "Use a post-training scheme (optimize quantize), or fine-tune in PyTorch and export again.",
            )
        if src.kind == "tflite":
            raise ModelError(
                f"{src.path.name} is already a .tflite: pruning, clustering and QAT need the Keras 2 model.",
                "Pass the tf_keras .keras/.h5 model, or quantize the .tflite with optimize quantize.",
            )
        raise ModelError(
            f"Pruning, clustering and QAT need a Keras 2 (tf_keras) model; {src.path.name} is {src.kind}.",
            "Save it with tf_keras (pip install tf-keras), or use a post-training scheme: optimize quantize.",
        )
    keras = _tf.keras()
    keras3_ops.register()  # a Keras 3 model rebuilt in tf_keras names our activations (`rebuild`)
    # tfmot's classes are needed only to read back a model saved with its wrappers (QAT); importing tfmot costs
    # ~2 s, on the float32 baseline's path of every sweep
    scope = _tf.tfmot().quantization.keras.quantize_scope() if _saved_with_tfmot(src) else contextlib.nullcontext()
    changes: list[str] = []
    try:
        with scope:
            config = _keras_config(src) if src.path.suffix.lower() in (".h5", ".hdf5") else None
            fixed, changes = legacy.restored(config) if config is not None else (None, [])
            if changes:  # a Keras 2.0.x file: what its Keras meant, made explicit (models.legacy)
                model = keras.models.model_from_json(json.dumps(fixed))
                model.load_weights(str(src.path))
                return model
            return keras.models.load_model(src.path, compile=False, safe_mode=not src.trusted)
    except Exception as e:  # corrupt or partial file
        restored = f" (restored from its old config: {'; '.join(changes)})" if changes else ""
        raise ModelError(
            f"Cannot load {src.path.name} with tf_keras{restored}: {reason(e)}.", _load_fix(e, "tf_keras")
        ) from None


def _saved_with_tfmot(src: ModelSource) -> bool:
    """Whether a Keras 2 file's stored config names tfmot's quantization classes (QuantizeWrapperV2,
    QuantizeLayer, their quantizers); an unreadable config counts as yes."""
    config = _keras_config(src)
    return config is None or "quantize" in json.dumps(config).lower()


def load_keras3(src: ModelSource):
    keras3 = _tf.keras3()
    try:
        return keras3.saving.load_model(src.path, compile=False, safe_mode=not src.trusted)
    except Exception as e:
        raise ModelError(f"Cannot load {src.path.name} with Keras 3: {reason(e)}.", _load_fix(e, "Keras 3")) from None


def _load_fix(e: BaseException, keras: str) -> str:
    """The remedy for a Keras file that does not load: its Lambda's code (what `CODE_FIX` says), else saving it
    again with the Keras that wrote it."""
    return CODE_FIX if "Lambda" in str(e) else f"Save the model again with {keras}."


def _keras_config(src: ModelSource) -> dict | None:
    try:
        with open_regular(src.path, "model", ModelError) as f:
            zipped = f.read(2) == b"PK"
        if zipped:
            with zipfile.ZipFile(src.path) as z:
                config = member_json(z, "config.json", MAX_KERAS_JSON, str(src.path), ModelError, KERAS_FIX, KERAS_JSON)
        else:
            import h5py

            with h5py.File(src.path, "r") as f:
                raw = f.attrs.get("model_config")
            config = loads_json(raw, str(src.path), ModelError, KERAS_FIX, KERAS_JSON)
        return legacy.normalized(config) if isinstance(config, dict) else None
    except (KeyError, TypeError, ValueError, OSError, zipfile.BadZipFile, NotImplementedError, RuntimeError):
        return None


def _shape_of(layer_config: dict) -> tuple | None:
    shape = layer_config.get("batch_input_shape") or layer_config.get("batch_shape")
    return tuple(-1 if d is None else int(d) for d in shape) if shape else None


def _config_inputs(config: dict | None) -> list[InputSpec] | None:
    """Every input from a Keras file's stored config (no TensorFlow, no weights loaded), in order."""
    try:
        body = config["config"]
        layers = {layer["config"]["name"]: layer for layer in body["layers"]}
        order = [entry[0] if isinstance(entry, list) else entry for entry in body.get("input_layers") or []]
        if not order:  # Sequential: the first layer is (or describes) the input
            first = body["layers"][0]
            shape = _shape_of(first["config"])
            return [InputSpec(first["config"]["name"], shape)] if shape else None
        order = [o[0] if isinstance(o, list) else o for o in order]
        specs = [
            InputSpec(n, _shape_of(layers[n]["config"]), layers[n]["config"].get("dtype") or "float32") for n in order
        ]
        return specs if all(s.shape for s in specs) else None
    except (KeyError, IndexError, TypeError, ValueError):
        return None


def opened(src: ModelSource) -> ModelSource:
    """The source with what every later step needs read once: a .tflite normalised (its bytes and facts)
    and described; a Keras file's inputs and outputs from its config; a SavedModel's signature (read when
    it was recognised)."""
    if src.kind == "tflite" and src.content is None:
        return opened_tflite(src, read_bounded(src.path, "model", ModelError))
    if src.converted and src.content is None:
        raise ModelError(
            f"{src.path.name} has not been converted yet.", "Open it with open_inputs (it needs the data's shapes)."
        )
    if src.kind in ("keras2", "keras3") and src.outputs is None:
        return _opened_keras(src, _keras_config(src))
    return src


def _opened_keras(src: ModelSource, config: dict | None) -> ModelSource:
    """A Keras source with its inputs and outputs read from its stored config (None where it does not say),
    and how many ids each id input takes (its Embeddings' input_dim, `vocabulary.keras_bounds`)."""
    from optimize.models.vocabulary import keras_bounds

    specs = _config_inputs(config)
    bounds = tuple(keras_bounds(config, keras3=src.kind == "keras3"))
    return replace(
        src, inputs=tuple(specs) if specs is not None else None, outputs=_config_outputs(config), id_bounds=bounds
    )


def _savedmodel_inputs(path: Path) -> list[InputSpec]:
    try:
        signature = _tf.serving_inputs(path)
    except Exception as e:  # noqa: BLE001 - any failure to read it is a corrupt SavedModel
        raise ModelError(f"{path} is not a readable SavedModel ({str(e).splitlines()[0][:160]}).", EXPECTED) from None
    if signature is None:
        raise ModelError(f"{path} has no serving_default signature.", "Export the SavedModel with a signature.")
    return [InputSpec(*i) for i in signature]


def input_specs(src: ModelSource, loaded=None) -> list[InputSpec]:
    """Every input of an opened model (`opened`), in the order the model takes them, to check data before any
    work: as opening it read them, else (a Keras config that does not say) from the Keras model, `loaded` or
    loaded now."""
    if src.inputs is not None:
        return list(src.inputs)
    if src.kind == "savedmodel":
        return _savedmodel_inputs(src.path)
    model = loaded if loaded is not None else check_loads(src)
    return [
        InputSpec(t.name.split(":")[0], tuple(-1 if d is None else int(d) for d in t.shape), _dtype_name(t.dtype))
        for t in model.inputs
    ]


def _dtype_name(dtype) -> str:
    """A Keras tensor's dtype as numpy names it (tf_keras gives a tf.DType, Keras 3 a string)."""
    return str(getattr(dtype, "name", dtype) or "float32")


def id_bounds(src: ModelSource) -> list:
    """How many ids each id input takes (`vocabulary.IdBound`), read from the model without TensorFlow when it
    was opened: a Keras file's Embedding layers (its stored config), a float .tflite's GATHER /
    EMBEDDING_LOOKUP tables. [] for a SavedModel (its graph is TensorFlow's to read) or where the model does not
    say."""
    return list(opened(src).id_bounds)


def input_shape(src: ModelSource) -> tuple:
    """The first input's shape (batch first, -1 for unknown)."""
    return input_specs(opened(src))[0].shape


def output_names(src: ModelSource) -> tuple[str, ...]:
    """The model's outputs in order: a Keras model's output layer names, else the signature's keys.

    A converted model names its outputs output_0, output_1, ... in the same order, so labels keyed by a
    Keras output name find their output in any artifact made from it.
    """
    if src.outputs is not None:
        return src.outputs
    if src.kind in ("keras2", "keras3") or src.flat:
        return opened(src).outputs
    return ()


def _config_outputs(config: dict | None) -> tuple[str, ...]:
    """A Keras config's output layer names, in order (() where it does not say)."""
    try:
        body = config["config"]
        outs = body.get("output_layers")
        if outs:
            flat = outs if isinstance(outs[0], list) else [outs]
            return tuple(o[0] for o in flat)
        return (body["layers"][-1]["config"]["name"],)
    except (KeyError, IndexError, TypeError):
        return ()


RECURRENT = frozenset({"LSTM", "GRU", "SimpleRNN", "RNN", "Bidirectional", "ConvLSTM1D", "ConvLSTM2D", "ConvLSTM3D"})


def has_recurrent(model) -> bool:
    """Whether a Keras model holds a recurrent layer (also inside a tfmot wrapper)."""
    return any(type(getattr(layer, "layer", layer)).__name__ in RECURRENT for layer in model.layers)


# ---------------------------------------------------------------------------------------------- trust
#: Config keys whose values are Python code that deserialising would run (marshalled bytecode).
CODE_KEYS = ("function", "output_shape")
CODE_TYPES = ("lambda", "raw")


def code_layers(config) -> list[str]:
    """Layers in a Keras config that carry Python code deserialising would run: Lambda layers, and any
    layer with a marshalled function (`function_type: lambda`). Nested models are searched too."""
    found: list[str] = []

    def walk(node) -> None:
        if isinstance(node, dict):
            cfg = node.get("config") if isinstance(node.get("config"), dict) else {}
            marshalled = any(cfg.get(f"{k}_type") in CODE_TYPES and cfg.get(k) for k in CODE_KEYS)
            if node.get("class_name") == "Lambda" or marshalled:
                found.append(f"{cfg.get('name', '?')} ({node.get('class_name', '?')})")
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(config)
    return found


def check_trust(src: ModelSource, config: dict | None, trust: bool) -> None:
    """Refuse a model file whose config carries Python code, unless the user trusts it."""
    if trust or config is None:
        return
    layers = code_layers(config)
    if layers:
        raise ModelError(
            f"{src.path.name} holds Python code that loading it would run: {', '.join(layers[:3])}"
            + (f" and {len(layers) - 3} more" if len(layers) > 3 else "")
            + ".",
            "Pass --trust-model-code if you trust where the file came from, or rebuild it without Lambda layers.",
        )


#: Where a Keras config's classes may come from. Anything else ("os", "subprocess", a package of the
#: file's choosing) would be imported by deserialising it: refused, like Python code, unless trusted.
KERAS_MODULES = ("keras", "tf_keras", "tensorflow", "tensorflow_model_optimization", "builtins")


def foreign_modules(config) -> list[str]:
    """Every `module` a Keras config names outside KERAS_MODULES (nested configs too), in order."""
    found: list[str] = []
    stack = [config]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            module = node.get("module")
            if module is not None and (not isinstance(module, str) or module.split(".")[0] not in KERAS_MODULES):
                found.append(str(module)[:80])
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return list(dict.fromkeys(found))


def check_modules(src: ModelSource, config: dict | None, trust: bool) -> None:
    """Refuse a Keras config whose classes come from modules other than Keras's own, unless trusted."""
    foreign = [] if trust or config is None else foreign_modules(config)
    if foreign:
        raise ModelError(
            f"{src.path.name} names classes from {', '.join(repr(m) for m in foreign[:3])}: loading it would "
            "import that code.",
            "Pass --trust-model-code if you trust where the file came from, or save it again with Keras.",
        )

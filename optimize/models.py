"""Model inputs: recognise Keras 2, Keras 3, SavedModel and .tflite; load them fresh; export for conversion.

Every failure to recognise a model is one ModelError line naming what was expected. Keras stage
techniques get a fresh load each time (tfmot mutates the model it is given).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from . import _tf
from .errors import ModelError

Kind = Literal["keras2", "keras3", "savedmodel", "tflite"]
EXPECTED = "Pass a Keras .keras/.h5 file, a SavedModel directory, or a .tflite file."


@dataclass(frozen=True)
class ModelSource:
    path: Path
    kind: Kind
    fingerprint: str

    @property
    def name(self) -> str:
        return self.path.stem if self.path.is_file() else self.path.name


def _fingerprint(path: Path) -> str:
    h = hashlib.sha256()
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for f in files:
        h.update(str(f.relative_to(path) if path.is_dir() else f.name).encode())
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()[:16]


def _keras_major(path: Path) -> int | None:
    """Which Keras wrote a .keras/.h5 file (2 = tf_keras, 3 = Keras 3), or None if it is neither."""
    head = path.read_bytes()[:8]
    if head.startswith(b"PK"):
        try:
            with zipfile.ZipFile(path) as z:
                meta = json.loads(z.read("metadata.json"))
            return int(str(meta.get("keras_version", "0")).split(".")[0])
        except (zipfile.BadZipFile, KeyError, ValueError):
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


def open_model(path: str | Path) -> ModelSource:
    """Recognise a model file or directory without loading it (cheap, TF-free except for .h5 probing)."""
    p = Path(path)
    if not p.exists():
        raise ModelError(f"No model at {p}.", EXPECTED)
    if p.is_dir():
        if (p / "saved_model.pb").is_file() or (p / "saved_model.pbtxt").is_file():
            return ModelSource(p, "savedmodel", _fingerprint(p))
        raise ModelError(f"{p} is a directory but not a SavedModel (no saved_model.pb).", EXPECTED)
    with open(p, "rb") as f:
        head = f.read(16)
    if is_tflite(head):
        from . import runtime

        runtime.load(p, threads=1)  # a truncated or corrupt flatbuffer fails here, with the runtime's reason
        return ModelSource(p, "tflite", _fingerprint(p))
    if p.suffix == ".tflite":
        raise ModelError(
            f"{p} is not a TFLite flatbuffer (no 'TFL3' identifier).", "Pass a .tflite written by a converter."
        )
    major = _keras_major(p)
    if major == 2:
        return ModelSource(p, "keras2", _fingerprint(p))
    if major == 3:
        return ModelSource(p, "keras3", _fingerprint(p))
    raise ModelError(f"{p} is not a model optimize can read.", EXPECTED)


def load_keras2(src: ModelSource):
    """A fresh tf_keras model from disk. Keras 3 files get a clear line: tfmot needs Keras 2."""
    if src.kind != "keras2":
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
    tfmot = _tf.tfmot()
    try:
        with tfmot.quantization.keras.quantize_scope():
            return keras.models.load_model(src.path, compile=False)
    except Exception as e:  # corrupt or partial file
        raise ModelError(
            f"Cannot load {src.path.name} with tf_keras: {str(e).splitlines()[0][:200]}", EXPECTED
        ) from None


def load_keras3(src: ModelSource):
    keras3 = _tf.keras3()
    try:
        return keras3.saving.load_model(src.path, compile=False)
    except Exception as e:
        raise ModelError(
            f"Cannot load {src.path.name} with Keras 3: {str(e).splitlines()[0][:200]}", EXPECTED
        ) from None


def export_saved_model(model, out: Path) -> Path:
    """Export a Keras 2 or Keras 3 model as an inference-only SavedModel (its serving endpoint only).

    `model.export()` writes just the serving function; `tf.saved_model.save` on a Keras model also
    traces every layer's training and loss functions, which made each MobileNetV2 conversion ~7x slower.
    """
    out.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.redirect_stdout(io.StringIO()):
        model.export(str(out))
    return out


def _config_input_shape(src: ModelSource) -> tuple | None:
    """The first input's shape from a Keras file's stored config (no TensorFlow, no weights loaded)."""
    try:
        if src.path.read_bytes()[:2] == b"PK":
            with zipfile.ZipFile(src.path) as z:
                config = json.loads(z.read("config.json"))
        else:
            import h5py

            with h5py.File(src.path, "r") as f:
                raw = f.attrs.get("model_config")
            config = json.loads(raw.decode() if isinstance(raw, bytes) else raw)
        layers = config["config"]["layers"]
        first = layers[0]
        shape = first["config"].get("batch_input_shape") or first["config"].get("batch_shape")
        if first["class_name"] != "InputLayer" or shape is None:
            return None
        return tuple(shape)
    except (KeyError, IndexError, TypeError, ValueError, OSError, zipfile.BadZipFile):
        return None


def input_shape(src: ModelSource, keras_model=None) -> tuple:
    """The first input's shape (batch first, None/-1 for unknown), to check data before any work."""
    if keras_model is None and src.kind in ("keras2", "keras3"):
        shape = _config_input_shape(src)
        if shape is not None:
            return shape
    if src.kind == "tflite":
        from . import runtime

        d = runtime.load(src.path).interpreter.get_input_details()[0]
        return tuple(int(x) for x in d.get("shape_signature", d["shape"]))
    if keras_model is None and src.kind == "keras2":
        keras_model = load_keras2(src)
    elif keras_model is None and src.kind == "keras3":
        keras_model = load_keras3(src)
    if keras_model is not None:
        shape = keras_model.inputs[0].shape
        return tuple(None if s is None else int(s) for s in shape)
    tf = _tf.tf()
    loaded = tf.saved_model.load(str(src.path))
    sig = loaded.signatures.get("serving_default")
    if sig is None:
        raise ModelError(f"{src.path} has no serving_default signature.", "Export the SavedModel with a signature.")
    spec = list(sig.structured_input_signature[1].values())[0]
    return tuple(spec.shape.as_list())

"""Keras and SavedModel models to .tflite with the TFLite converter: the export that prepares a Keras model
for it (inference-only SavedModel, training-only parts cleared, a fixed batch for recurrent layers), and the
`convert` technique: float32, and the converter's own float16, dynamic range, full int8 and int16x8.

The float32 conversion is the pipeline's baseline; every LiteRT Quantizer scheme starts from it. The
converter's quantizing schemes are the `--backend converter` route (and what follows QAT or needs float
fallback). This module and `torch_export` are the only places that make a float .tflite from a model.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path

from pydantic import Field, model_validator

from optimize.convert.inert import inference_ready
from optimize.core.bounded import loads_json
from optimize.core.errors import DataError, TechniqueFailed
from optimize.core.paths import read_bounded
from optimize.core.registry import Context, SchemeParams, Stage, technique
from optimize.core.results import write_atomic
from optimize.core.vocab import CALIBRATED_SCHEMES, IO, LITERT_ONLY_SCHEMES, Scheme
from optimize.models import _tf
from optimize.models.data import Dataset, count, take
from optimize.models.runtime import captured_stderr
from optimize.models.spec import integer_io_note

# ------------------------------------------------------------------------------------------- export


def export_saved_model(model, out: Path, batch: int | None = None) -> Path:
    """Export a Keras 2 or Keras 3 model as an inference-only SavedModel (its serving endpoint only).

    `model.export()` writes just the serving function; `tf.saved_model.save` on a Keras model also
    traces every layer's training and loss functions, which made each MobileNetV2 conversion ~7x slower.
    `batch` fixes the batch dimension (the route for recurrent layers, whose TensorList shapes must be
    static); the signature keeps the model's input names either way.
    """
    out.parent.mkdir(parents=True, exist_ok=True)
    model, cleared = inference_ready(model)  # training-only parts that change how a layer converts
    handlers = list(logging.root.handlers)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            if batch is None:
                model.export(str(out))
            else:
                _export_fixed(model, out, batch)
    finally:  # absl's first message configures the root logger (a stderr handler): the caller's stays as it was
        logging.root.handlers[:] = handlers
    if cleared:
        write_atomic(out / EXPORT_NOTES, json.dumps([_cleared_note(cleared)]).encode())
    return out


def _cleared_note(cleared: list[str]) -> str:
    return (
        f"convert: dropout of {', '.join(cleared)} cleared before export (it acts only in training; with "
        "recurrent_dropout the layer converts to a WHILE loop instead of its fused op); outputs checked equal"
    )


#: A file beside an exported SavedModel holding what the export changed (read by the convert technique).
EXPORT_NOTES = "optimize-export-notes.json"


def export_notes(saved_model: Path) -> list[str]:
    """What exporting the model changed, for the candidate's notes (empty for a SavedModel as given)."""
    p = Path(saved_model) / EXPORT_NOTES
    if not p.is_file():
        return []
    try:
        notes = loads_json(read_bounded(p, "export notes"), "export notes")
    except Exception:  # noqa: BLE001 - a note is never worth failing a conversion
        return []
    return [str(n) for n in notes] if isinstance(notes, list) else []


def _export_fixed(model, out: Path, batch: int) -> None:
    tf = _tf.tf()
    keras = _tf.keras() if isinstance(model, _tf.keras().Model) else _tf.keras3()
    archive = keras.export.ExportArchive()
    archive.track(model)
    specs = [tf.TensorSpec([batch, *t.shape[1:]], t.dtype, name=t.name.split(":")[0]) for t in model.inputs]
    if len(specs) == 1:
        archive.add_endpoint("serve", lambda x: model(x), input_signature=specs)
    else:
        archive.add_endpoint("serve", lambda *xs: model(list(xs)), input_signature=specs)
    archive.write_out(str(out))


# ------------------------------------------------------------------------------------------- the direct route

#: How close the direct route's float32 .tflite must come to the Keras model it was made from, per output
#: (what a float32 conversion keeps: op fusion and folded batch norm move the last bits only).
DIRECT_ATOL, DIRECT_RTOL = 1e-5, 1e-4


@dataclass(frozen=True)
class Direct:
    """A float32 .tflite made straight from a loaded Keras model, and the notes its convert step carries."""

    content: bytes
    notes: tuple[str, ...] = ()


def float32_direct(model, ds: Dataset | None, batch: int | None = None) -> Direct | None:
    """The float32 .tflite of a loaded Keras 2 or Keras 3 model without the SavedModel round trip: its call
    traced as one concrete function, variables frozen and converted (about 2x less work than exporting a
    SavedModel and converting from it, the same graph). The converter leaves no signature that way, so the
    export's own is written: inputs by the model's input names, outputs output_0, output_1, ... in order.

    Used only when it is the same model: the .tflite's outputs on two test samples of `ds` (without data, zeros
    and seeded values) must match the Keras model's (max |diff| <= DIRECT_ATOL + DIRECT_RTOL x |output|).
    None otherwise, or when the model is one this route does not take (recurrent layers: their TensorList
    shapes need the fixed-batch export; outputs that are not tensors); the caller then exports a SavedModel."""
    from optimize.models.normalize import named_signature
    from optimize.models.source import has_recurrent

    tf = _tf.tf()
    handlers = list(logging.root.handlers)
    try:
        if has_recurrent(model):
            return None
        model, cleared = inference_ready(model)
        names = [t.name.split(":")[0] for t in model.inputs]
        specs = [
            tf.TensorSpec([batch, *t.shape[1:]] if batch else t.shape, t.dtype, name=n)
            for t, n in zip(model.inputs, names)
        ]
        many = len(specs) > 1

        def serve(*xs):
            out = model(list(xs) if many else xs[0], training=False)
            return list(out) if isinstance(out, (list, tuple)) else [out]

        function = tf.function(serve).get_concrete_function(*specs)
        if not all(isinstance(o, tf.Tensor) for o in function.structured_outputs):
            return None
        with captured_stderr():
            flat = tf.lite.TFLiteConverter.from_concrete_functions([function]).convert()
        content = named_signature(flat, names, [f"output_{i}" for i in range(len(function.structured_outputs))])
        if not _same_outputs(model, content, _samples(model, ds), many):
            return None
    except (DataError, KeyboardInterrupt):
        raise
    except Exception as e:  # noqa: BLE001 - any failure here: the SavedModel route, as before
        logging.getLogger(__name__).debug("the direct float32 route did not take %s: %s", model, e)
        return None
    finally:  # absl's first message configures the root logger (a stderr handler): the caller's stays as it was
        logging.root.handlers[:] = handlers
    return Direct(content, (_cleared_note(cleared),) if cleared else ())


def _samples(model, ds: Dataset | None) -> list:
    """Two test samples (or, without data, zeros and seeded values), each a list of one array per input in the
    model's input order, with a batch of 1."""
    import numpy as np

    names = [t.name.split(":")[0] for t in model.inputs]
    rows = _test_rows(ds, names)
    if rows:
        return rows
    shapes = [[1, *(d if d is not None else 1 for d in t.shape[1:])] for t in model.inputs]
    dtypes = [np.dtype(getattr(t.dtype, "name", None) or str(t.dtype)) for t in model.inputs]
    rng = np.random.default_rng(0)
    return [[np.zeros(s, d) for s, d in zip(shapes, dtypes)], [rng.random(s).astype(d) for s, d in zip(shapes, dtypes)]]


def _test_rows(ds: Dataset | None, names: list[str]) -> list:
    """Two test samples by input name (one input: the array itself), or [] when the data does not name them all."""
    if ds is None or ds.x_test is None:
        return []
    rows = []
    for i in range(min(2, count(ds.x_test))):
        row = take(ds.x_test, slice(i, i + 1))
        arrays = [row.get(n) for n in names] if isinstance(row, dict) else [row]
        if len(arrays) != len(names) or any(a is None for a in arrays):
            return []
        rows.append(arrays)
    return rows


def _same_outputs(model, content: bytes, samples: list, many: bool) -> bool:
    """The .tflite computes what the Keras model does on each sample (input names in order)."""
    import numpy as np

    from optimize.models import runtime

    if not samples:
        return False
    order = [t.name.split(":")[0] for t in model.inputs]
    for sample in samples:
        want = model(list(sample) if many else sample[0], training=False)
        want = [np.asarray(w) for w in (want if isinstance(want, (list, tuple)) else [want])]
        it = runtime.describe(content)  # a fresh interpreter per sample: its input shapes are the sample's
        runner = it.get_signature_runner(runtime.signature_key(it))
        details = runner.get_input_details()
        names = list(details)
        got = runner(**{n: np.asarray(sample[order.index(n)], details[n]["dtype"]) for n in names})
        for i, w in enumerate(want):
            g = np.asarray(got[f"output_{i}"], dtype=np.float32)
            if g.shape != w.shape or not np.all(np.abs(g - w) <= DIRECT_ATOL + DIRECT_RTOL * np.abs(w)):
                return False
    return True


# ------------------------------------------------------------------------------------------- the converter


class ConvertParams(SchemeParams):
    scheme: Scheme = Field(
        Scheme.FLOAT32,
        description="float32 (baseline), float16 weights, dynamic-range int8 weights, full int8, int16x8.",
    )
    io: IO = Field(
        IO.FLOAT, description="Input/output type: int8/uint8 for int8 (Edge TPU, microcontrollers), int16 for int16x8."
    )
    samples: int = Field(200, ge=1, le=10000, description="Calibration samples for int8 and int16x8.")
    float_fallback: bool = Field(
        False, description="int8/int16x8: keep ops that cannot be quantized in float instead of failing."
    )
    select_tf_ops: bool = Field(
        False,
        description="Allow TensorFlow ops the LiteRT builtins lack (Flex): the model converts, but needs the Flex "
        "delegate to run, which the Python runtime here does not have.",
    )

    @model_validator(mode="before")
    @classmethod
    def _drop_inert_calibration(cls, data):
        """Calibration settings do not change a float32/float16/dynamic conversion: leave them at their
        defaults, so equal conversions share one step (and one cache entry) whatever was written."""
        if isinstance(data, dict) and data.get("scheme", Scheme.FLOAT32) not in CALIBRATED_SCHEMES:
            data = {k: v for k, v in data.items() if k not in ("samples", "float_fallback")}
        return data


def _representative(ctx: Context, n: int, scheme: str, types: dict | None = None):
    if ctx.data is None:
        raise DataError(f"{scheme} needs calibration data.", "Pass --calibration DATA (an .npz with x) or --data DATA.")
    xs = ctx.data.calibration(n)  # integer inputs stay integer: the converter feeds each tensor its own type
    if types:
        xs = _typed(xs, types)

    def gen():  # one sample at a time; several inputs go by their signature names
        for i in range(count(xs)):
            sample = take(xs, slice(i, i + 1))
            yield sample if isinstance(sample, dict) else [sample]

    return gen


def _typed(xs, types: dict):
    """Samples cast to the signature's input types (int64 ids for an int32 input, uint8 pixels for a float
    one): the calibrator refuses a tensor of any other type ("Cannot set tensor: Got value of type ...")."""
    if isinstance(xs, dict):
        return {k: v.astype(types[k], copy=False) if k in types else v for k, v in xs.items()}
    return xs.astype(next(iter(types.values())), copy=False) if len(types) == 1 else xs


def signature_types(saved_model: Path) -> dict:
    """The serving signature's input types, by name, read from saved_model.pb (nothing loaded or traced)."""
    tf = _tf.tf()
    from tensorflow.core.protobuf import saved_model_pb2

    try:
        sm = saved_model_pb2.SavedModel()
        sm.ParseFromString(read_bounded(Path(saved_model) / "saved_model.pb", "SavedModel"))
        defs = sm.meta_graphs[0].signature_def
        sig = defs["serving_default"] if "serving_default" in defs else next(iter(defs.values()))
        return {k: tf.dtypes.as_dtype(v.dtype).as_numpy_dtype for k, v in sig.inputs.items()}
    except Exception:  # noqa: BLE001 - no types known: the samples go as they are
        return {}


def configure(converter, params: ConvertParams, ctx: Context, types: dict | None = None) -> None:
    """Set the converter flags for a scheme (shared by the pipeline and the benchmarks' bare calls); `types`:
    the model's input types by name, which calibration samples are cast to."""
    tf = _tf.tf()
    scheme = params.scheme
    if params.select_tf_ops:
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS, tf.lite.OpsSet.SELECT_TF_OPS]
    if scheme == "float32":
        return
    if scheme in LITERT_ONLY_SCHEMES:  # a recipe expresses it as float32 + quantize, except after QAT/fallback
        raise TechniqueFailed(
            f"the TFLite converter makes no {scheme} weights: LiteRT Quantizer does (backend litert; not after QAT "
            "or with float_fallback)."
        )
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    if scheme == "float16":
        converter.target_spec.supported_types = [tf.float16]
    elif scheme == "int8":
        converter.representative_dataset = _representative(ctx, params.samples, scheme, types)
        ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        converter.target_spec.supported_ops = ops + ([tf.lite.OpsSet.TFLITE_BUILTINS] if params.float_fallback else [])
        if params.io != "float":
            converter.inference_input_type = converter.inference_output_type = getattr(tf, params.io)
    elif scheme == "int16x8":
        converter.representative_dataset = _representative(ctx, params.samples, scheme, types)
        ops = [tf.lite.OpsSet.EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8]
        converter.target_spec.supported_ops = ops + ([tf.lite.OpsSet.TFLITE_BUILTINS] if params.float_fallback else [])
        if params.io == "int16":
            converter.inference_input_type = converter.inference_output_type = tf.int16


#: Converter failures we can name, with what to do: (pattern over the full text, the problem, the fix).
KNOWN_FAILURES: tuple[tuple[str, str, str], ...] = (
    (
        r"'(tf\.TensorList\w+)' op requires element_shape to be static",
        "op {0} needs a static shape (a recurrent layer with a dynamic batch)",
        "the fixed-batch route is tried next; if it fails too, give the model fixed input shapes",
    ),
    (
        r"Quantization to 16x8-bit not yet supported for op: '(\w+)'",
        "int16x8 does not support op {0}",
        "set float_fallback = true to keep it in float, or use int8",
    ),
    (
        r"(?s:Some ops are not supported.*?)?Flex ops: ([\w, ]+)|Some ops are not supported by the native TFLite",
        "it needs TensorFlow ops the LiteRT builtins lack ({0})",
        "set select_tf_ops = true in the convert step (the artifact then needs the Flex delegate to run)",
    ),
)
#: A failure that a fixed batch of 1 can fix: recurrent layers unrolled through TensorLists.
BATCH_PROBLEM = re.compile(r"TensorList|element_shape|must be static|Lowering tensor list ops")


def _converter_error(e: Exception, log: list[str]) -> tuple[str, str]:
    """(one line naming the op and the fix, the full text) for a converter failure."""
    text = "\n".join([str(e), *log])
    for pattern, problem, fix in KNOWN_FAILURES:
        m = re.search(pattern, text)
        if m:
            found = [g.strip() for g in m.groups() if g] or ["see error_detail"]
            return f"{problem.format(*found)}: {fix}", text
    m = re.search(r"'([\w.]+)' op ([^\n.]+)", text) or re.search(r"error: ([^\n]+)", text)
    line = (f"op {m.group(1)}: {m.group(2)}" if m and m.lastindex == 2 else m.group(1)) if m else ""
    first = str(e).strip().splitlines()[0] if str(e).strip() else e.__class__.__name__
    return (line or first)[:300], text


def _fixed_batch(saved_model: Path):
    """A converter over the SavedModel's serving signature traced with a batch of 1: the route for Keras
    LSTM/GRU/Bidirectional models whose dynamic batch leaves TensorList shapes unknown."""
    tf = _tf.tf()
    loaded = tf.saved_model.load(str(saved_model))
    sig = loaded.signatures["serving_default"]
    specs = {k: tf.TensorSpec([1, *v.shape[1:]], v.dtype, name=k) for k, v in sig.structured_input_signature[1].items()}

    @tf.function
    def serve(**inputs):
        return sig(**inputs)

    return tf.lite.TFLiteConverter.from_concrete_functions([serve.get_concrete_function(**specs)], loaded)


def _run(make, params: ConvertParams, ctx: Context, types: dict | None = None) -> bytes:
    converter = make()
    configure(converter, params, ctx, types)
    with captured_stderr() as log:
        try:
            return converter.convert()
        except (DataError, KeyboardInterrupt):
            raise
        except Exception as e:  # the converter raises many types; every one fails only this candidate
            line, text = _converter_error(e, log)
            raise TechniqueFailed(f"conversion to {params.scheme} failed: {line}", detail=text) from None


@technique("convert", stage=Stage.CONVERT, params=ConvertParams)
def convert(model: Path, params: ConvertParams, ctx: Context) -> Path:
    """Convert a SavedModel to .tflite with the TFLite converter, quantizing by the chosen scheme.

    int8 is full-integer (every op int8, calibrated on ctx.data); int16x8 keeps 16-bit activations and
    runs on slow reference kernels; dynamic quantizes weights only and can run slower than float. When
    the dynamic-batch export cannot convert (Keras RNNs), it is traced again with a batch of 1.
    """
    tf = _tf.tf()
    ctx.notes.extend(n for n in export_notes(model) if n not in ctx.notes)
    types = signature_types(model) if params.scheme in CALIBRATED_SCHEMES else {}
    try:
        flat = _run(lambda: tf.lite.TFLiteConverter.from_saved_model(str(model)), params, ctx, types)
    except TechniqueFailed as e:
        if not BATCH_PROBLEM.search(e.detail or ""):
            raise
        if ctx.fixed_batch_export is not None:  # the Keras model itself, traced with a batch of 1
            fixed = ctx.fixed_batch_export()
            ctx.notes.extend(n for n in export_notes(fixed) if n not in ctx.notes)
            flat = _run(lambda: tf.lite.TFLiteConverter.from_saved_model(str(fixed)), params, ctx, types)
        else:  # a plain SavedModel: its serving signature, traced again with a batch of 1
            flat = _run(lambda: _fixed_batch(model), params, ctx, types)
        why = str(e).split(": ")[1] if str(e).count(": ") >= 1 else str(e)
        ctx.notes.append(f"convert: fixed batch of 1 (the dynamic-batch export failed: {why})")
    note = integer_io_note(flat, params.io, "convert") if params.scheme in CALIBRATED_SCHEMES else None
    if note:
        ctx.notes.append(note)
    suffix = params.scheme if params.io == "float" else f"{params.scheme}-{params.io}io"
    return write_atomic(ctx.workdir / f"convert-{suffix}.tflite", flat)

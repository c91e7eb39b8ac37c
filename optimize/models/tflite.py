"""A .tflite read for everything downstream: parsed (`flatbuffer.py`), then validated (`validate.py`).

`read_model` is what every reader calls; `checked` is the gate before a flatbuffer reaches native code
(the runtime, the normaliser, the quantizers), remembered per content so a model is validated once.
"""

from __future__ import annotations

import hashlib
import os
import stat
import zlib
from collections import OrderedDict
from pathlib import Path

from optimize.core.errors import ModelError
from optimize.models.flatbuffer import Model, _parse, _schema, _source
from optimize.models.validate import validate


def read_model(model: str | Path | bytes, where: str | None = None) -> Model:
    """Parse a .tflite file or its bytes and validate its structure (`validate.py`): anything unreadable
    or inconsistent is one ModelError with a fix, before any rule, reader, normaliser, quantizer or
    interpreter looks at it. `where` names bytes in messages (a path names itself).

    Remembered per content (bytes: length and CRC; a file: its identity, size and mtime) for the last few
    models, so the model a run opened is parsed and validated once, however many steps ask for it."""
    key = _key(model)
    if key is not None and key in _PARSED:
        _PARSED.move_to_end(key)
        return _PARSED[key]
    parsed = _read(model, where)
    if key is not None:
        _PARSED[key] = parsed
        while len(_PARSED) > KEEP or (len(_PARSED) > 1 and sum(m.size_bytes for m in _PARSED.values()) > KEEP_BYTES):
            _PARSED.popitem(last=False)
    return parsed


#: How many parsed models are remembered (a run's source, its normalised form, the artifact at hand).
KEEP = 4
#: And how many bytes of them beyond the newest: a parsed model holds views of its file's bytes, so four of a
#: BERT-base-sized model kept 1.7 GB alive in a worker after it had moved on (issue 44). Parsing again costs a
#: read of the file: the structure is read in place.
KEEP_BYTES = 256 * 10**6
_PARSED: OrderedDict[tuple, Model] = OrderedDict()


def _key(model) -> tuple | None:
    """What a model is remembered by: its content (length and CRC), so a file and the same bytes held in
    memory (a copy written out, say) are parsed once. A file's content key is kept per identity, size and
    mtime, so asking again costs a stat, not a read."""
    if isinstance(model, bytes | bytearray | memoryview):
        return ("content", len(model), zlib.crc32(model))
    try:
        st = os.stat(model)
    except (OSError, ValueError):
        return None  # _read says what is wrong with it
    if not stat.S_ISREG(st.st_mode) or st.st_size >= 1 << 31:
        return None  # not remembered: _read refuses it (a FIFO, a device, larger than a flatbuffer can be)
    where = (os.fspath(model), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    if where not in _FILES:
        try:
            with open(model, "rb") as f:
                data = f.read(st.st_size + 1)
        except OSError:
            return None
        if len(data) != st.st_size:
            return None  # changing under us: not remembered
        if len(_FILES) > 256:
            _FILES.clear()
        _FILES[where] = ("content", len(data), zlib.crc32(data))
    return _FILES[where]


_FILES: dict[tuple, tuple] = {}


def _read(model: str | Path | bytes, where: str | None) -> Model:
    buf, where = _source(model, where)
    s = _schema()
    if len(buf) < 8 or not s.Model.ModelBufferHasIdentifier(buf, 0):
        raise ModelError(
            f"{where} is not a TFLite flatbuffer (no 'TFL3' identifier).",
            "Pass a .tflite file written by the TFLite/LiteRT converter.",
        )
    try:
        parsed = _parse(buf)
    except ModelError:
        raise
    except Exception as e:  # truncated or corrupt: offsets point outside the file
        raise ModelError(
            f"{where} is truncated or corrupt ({e.__class__.__name__} while reading the flatbuffer).",
            "Re-export the model; check the file copied completely.",
        ) from None
    if not parsed.subgraphs or not parsed.main.ops:
        raise ModelError(f"{where} has an empty graph (no operators).", "Export a model that computes something.")
    validate(parsed, where)
    return parsed


def checked(model, where: str | None = None):
    """`model` (a path or bytes) once the structural validation every reader shares has passed: what the
    runtime, the normaliser and the quantizers call before a flatbuffer reaches native code (validated once
    per content, `read_model`)."""
    read_model(model, where)
    return model


def graph_fingerprint(model: str | Path | bytes) -> str:
    """A digest of a .tflite's graph, validated first (`read_model`): every operator (code, version, what it
    reads and writes), every tensor's type, shape, constness and quantization count, the graph's inputs and
    outputs and its signatures; not the weights' bytes. What a cached artifact is said to be, and checked to be
    before it is shipped (`optimize.engine.cache`)."""
    m = read_model(model)
    h = hashlib.sha256()
    for sg in m.subgraphs:
        h.update(repr((sg.index, sg.inputs, sg.outputs)).encode())
        for t in sg.tensors:
            q = t.quant
            h.update(repr((t.dtype, t.shape, t.is_const, t.sparse, q.count if q is not None else 0)).encode())
        for op in sg.ops:
            h.update(repr((op.opcode, op.custom_code, op.version, op.inputs, op.outputs)).encode())
    for sig in m.signatures:
        h.update(repr((sig.key, sig.subgraph, sig.inputs, sig.outputs)).encode())
    return h.hexdigest()


def signature_io(parsed) -> tuple[tuple, tuple[str, ...]]:
    """((name, shape, dtype) per input, output names) of a parsed .tflite as the runtime lists them through its
    signature (serving_default, else the first by key): by name, as the runtime sorts a signature's keys; the
    main subgraph's tensors in graph order when it has none. A free dimension is -1 (its shape signature)."""
    sg, ins, outs = signature_tensors(parsed)
    inputs = tuple((name, _shape(sg.tensors[i]), _numpy_name(sg.tensors[i].dtype)) for name, i in ins)
    return inputs, tuple(name for name, _ in outs)


def signature_tensors(parsed) -> tuple[object, list[tuple[str, int]], list[tuple[str, int]]]:
    """(the subgraph, [(name, tensor index)] per input, the same per output) as the runtime lists a model's
    inputs and outputs: through its signature (serving_default, else the first by key) by name, or the main
    subgraph's tensors in graph order when it has none."""
    sigs = {s.key: s for s in parsed.signatures if s.key is not None}
    key = "serving_default" if "serving_default" in sigs else min(sigs, default=None)
    if key is None:
        sg = parsed.main
        return sg, [(sg.tensors[i].name, i) for i in sg.inputs], [(sg.tensors[i].name, i) for i in sg.outputs]
    sig = sigs[key]
    return parsed.subgraphs[sig.subgraph], sorted(sig.inputs or ()), sorted(sig.outputs or ())


def _shape(t) -> tuple[int, ...]:
    return tuple(int(d) for d in (t.shape_signature if t.shape_signature is not None else t.shape))


def _numpy_name(dtype: str) -> str:
    """A tensor type as numpy names it (what the runtime hands out: a string tensor is an object array)."""
    return {"string": "object"}.get(dtype, dtype)


def signature_outputs(parsed) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, shape, final activation) per output of a parsed .tflite, in the order the runtime lists them: the
    activation is the op that writes it, seen through a DEQUANTIZE or QUANTIZE ("softmax", "sigmoid", else
    "linear")."""
    sg, _, outputs = signature_tensors(parsed)
    producer = {o: op for op in sg.ops for o in op.outputs if o >= 0}
    out = []
    for name, index in outputs:
        op = producer.get(index)
        if op is not None and op.name in ("DEQUANTIZE", "QUANTIZE") and op.inputs:
            op = producer.get(op.inputs[0], op)
        act = {"SOFTMAX": "softmax", "LOGISTIC": "sigmoid"}.get(op.name if op else "", "linear")
        out.append((name, tuple(int(x) for x in sg.tensors[index].shape), act))
    return out


def not_float(content: bytes) -> str | None:
    """Why a (normalised) .tflite is not a float model every scheme can start from, or None when it is."""
    sg = read_model(content).main
    for op in sg.ops:
        if op.name == "DEQUANTIZE" and op.inputs and op.inputs[0] >= 0:
            src = sg.tensors[op.inputs[0]]
            if src.dtype == "float16" and not src.is_const:
                return (
                    f"a float16 tensor that is not a constant weight ({src.name or op.inputs[0]}) feeds DEQUANTIZE: "
                    "the model computes in float16 at run time, so it is not a float32 model"
                )
    scaled = any(t.quant is not None and t.dtype != "float32" for t in sg.tensors)
    if scaled or any(op.name in ("QUANTIZE", "DEQUANTIZE") for op in sg.ops):
        kinds = sorted({t.dtype for t in sg.tensors} & {"int8", "uint8", "int16", "float16"})
        return "it is already quantized" + (f" ({', '.join(kinds)} tensors)" if kinds else "")
    return None

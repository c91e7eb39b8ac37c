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
        while len(_PARSED) > KEEP:
            _PARSED.popitem(last=False)
    return parsed


#: How many parsed models are remembered (a run's source, its normalised form, the artifact at hand).
KEEP = 4
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

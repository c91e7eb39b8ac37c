"""Embedding tables inside int8 candidates: the table quantized wherever the lookup is, so an embedding-heavy
model's weights shrink as int8's do.

The int8 quantizers leave a lookup's table float32: LiteRT Quantizer's static recipes have no integer
EMBEDDING_LOOKUP (they do have GATHER and GATHER_ND), PT2E annotates no embedding, and the TFLite calibrator
keeps EMBEDDING_LOOKUP float. On a transformer with a vocabulary the table is most of the weights, so every
int8 candidate failed its own check ("the weights shrank only to 0.74x"). Three edits, each exact where it
says so:

    lookups_as_gather(f)     before a static quantizer: EMBEDDING_LOOKUP(ids, table) of a constant table as
                             GATHER(table, ids, axis 0), the same rows in float, which LiteRT Quantizer makes
                             integer (the table int8 at one scale, the rows looked up without arithmetic)
    integer_lookups(q)       after any int8 route: a lookup of a float32 table whose rows go straight into a
                             QUANTIZE is a GATHER of the table quantized at that QUANTIZE's scale: the same
                             int8 rows (quantize(lookup(t)) == lookup(quantize(t))), and the ids stay integer
    hybrid_lookups(q)        a lookup whose rows stay float (PT2E adds the position embeddings in float): its
                             table int8 with one scale per row, which the runtime's EMBEDDING_LOOKUP reads and
                             dequantizes row by row (weight-only int8 behind the lookup)

A lookup is EMBEDDING_LOOKUP, GATHER on axis 0 or GATHER_ND with one index per row, reading a constant float32
matrix. All read and write with normalize's loader (the schema object API ai-edge-litert ships).
"""

from __future__ import annotations

import numpy as np

from optimize.models.normalize import _load, _save, _schema
from optimize.transforms.tflite.graphfix import _buffer, _codes, _holds, _name, _op, _opcode, _quant, _tensor

INT8, FLOAT32 = 9, 0  # schema TensorType values
LOOKUPS = ("EMBEDDING_LOOKUP", "GATHER", "GATHER_ND")


def _const(model, t) -> np.ndarray | None:
    buf = model.buffers[t.buffer] if t.buffer and t.buffer < len(model.buffers) else None
    data = getattr(buf, "data", None)
    if data is None or len(data) == 0 or t.type != FLOAT32:
        return None
    shape = [int(d) for d in t.shape] if t.shape is not None else []
    return np.frombuffer(np.asarray(data, np.uint8).tobytes(), np.float32).reshape(shape)


def _table_and_ids(model, sg, op, name: str) -> tuple[int, int] | None:
    """(table tensor, ids tensor) of a lookup reading a constant float32 matrix, else None."""
    ins = [int(i) for i in op.inputs]
    if len(ins) < 2:
        return None
    if name == "EMBEDDING_LOOKUP":
        ids, table = ins[0], ins[1]
    elif name == "GATHER":
        opts = op.builtinOptions
        if int(getattr(opts, "axis", 0) or 0) != 0 or int(getattr(opts, "batchDims", 0) or 0) != 0:
            return None
        table, ids = ins
    else:  # GATHER_ND with one index per row
        table, ids = ins
        shape = sg.tensors[ids].shape
        if shape is None or len(shape) == 0 or int(shape[-1]) != 1:
            return None
    t = sg.tensors[table]
    values = _const(model, t)
    if values is None or values.ndim != 2 or not np.all(np.isfinite(values)):
        return None
    return table, ids


def lookups(content: bytes) -> list[str]:
    """`OP table` for every lookup of a constant float32 table in the main graph (what the edits here reach)."""
    model = _load(content)
    codes, sg = _codes(model), model.subgraphs[0]
    out = []
    for op in sg.operators:
        name = codes[op.opcodeIndex]
        found = _table_and_ids(model, sg, op, name) if name in LOOKUPS else None
        if found is not None:
            out.append(f"{name} {_name(sg.tensors[found[0]])}")
    return out


def _gather_options(axis: int = 0):
    s = _schema()
    o = s.GatherOptionsT()
    o.axis, o.batchDims = axis, 0
    return s.BuiltinOptions.GatherOptions, o


def lookups_as_gather(content: bytes) -> tuple[bytes, int]:
    """Every EMBEDDING_LOOKUP of a constant float32 table computed as GATHER(table, ids, axis 0) instead: the
    same rows, bit for bit, in an op the static int8 and int16x8 recipes quantize. Returns the model and how
    many lookups were rewritten."""
    if not _holds(content, "EMBEDDING_LOOKUP"):
        return content, 0
    model = _load(content)
    codes, sg = _codes(model), model.subgraphs[0]
    done = 0
    for op in sg.operators:
        if codes[op.opcodeIndex] != "EMBEDDING_LOOKUP" or _table_and_ids(model, sg, op, "EMBEDDING_LOOKUP") is None:
            continue
        ids, table = int(op.inputs[0]), int(op.inputs[1])
        op.opcodeIndex = _opcode(model, "GATHER")
        op.inputs = np.array([table, ids], np.int32)
        op.builtinOptionsType, op.builtinOptions = _gather_options()
        done += 1
    if not done:
        return content, 0
    _drop_unused_codes(model)
    return _save(model), done


def _drop_unused_codes(model) -> None:
    """Operator codes no op uses any more removed (a runtime resolves every code a model lists, used or not)."""
    used = sorted({int(op.opcodeIndex) for sg in model.subgraphs for op in sg.operators})
    if len(used) == len(model.operatorCodes):
        return
    at = {old: new for new, old in enumerate(used)}
    model.operatorCodes = [model.operatorCodes[i] for i in used]
    for sg in model.subgraphs:
        for op in sg.operators:
            op.opcodeIndex = at[int(op.opcodeIndex)]


def _readers(sg) -> dict[int, list]:
    out: dict[int, list] = {}
    for op in sg.operators:
        for i in op.inputs:
            if i >= 0:
                out.setdefault(int(i), []).append(op)
    return out


def _quantize_after(sg, codes, readers, tensor: int):
    """The one QUANTIZE (float32 -> int8, one scale) that alone reads `tensor`, which is no graph output."""
    users = readers.get(tensor, [])
    if len(users) != 1 or codes[users[0].opcodeIndex] != "QUANTIZE" or tensor in [int(o) for o in sg.outputs]:
        return None
    q = users[0]
    out = sg.tensors[int(q.outputs[0])]
    params = out.quantization
    if out.type != INT8 or params is None or params.scale is None or len(params.scale) != 1:
        return None
    return q


def integer_lookups(content: bytes) -> tuple[bytes, list[str]]:
    """Each lookup of a constant float32 table whose rows only a QUANTIZE to int8 reads: a GATHER of the table
    quantized at that QUANTIZE's scale and zero point, writing the QUANTIZE's output (the QUANTIZE removed).
    Exact: quantizing looked-up rows is looking up quantized rows. Returns the model and the tables made int8."""
    if not _holds(content, *LOOKUPS):
        return content, []
    model = _load(content)
    codes, sg = _codes(model), model.subgraphs[0]
    readers = _readers(sg)
    done, drop, replaced = [], set(), []
    for op in sg.operators:
        name = codes[op.opcodeIndex]
        found = _table_and_ids(model, sg, op, name) if name in LOOKUPS else None
        q = _quantize_after(sg, codes, readers, int(op.outputs[0])) if found else None
        if q is None:
            continue
        table, ids = found
        t = sg.tensors[table]
        params = sg.tensors[int(q.outputs[0])].quantization
        scale, zero = float(params.scale[0]), int(params.zeroPoint[0]) if params.zeroPoint is not None else 0
        rows = np.clip(np.round(_const(model, t) / scale) + zero, -128, 127).astype(np.int8)
        stored = _tensor(
            sg, f"{_name(t)}/int8", list(t.shape), INT8, _buffer(model, rows.tobytes()), _quant(scale, zero)
        )
        if name == "EMBEDDING_LOOKUP":
            op.opcodeIndex = _opcode(model, "GATHER")
            op.builtinOptionsType, op.builtinOptions = _gather_options()
        op.inputs = np.array([stored, ids], np.int32)
        op.outputs = np.array([int(q.outputs[0])], np.int32)
        drop.add(id(q))
        done.append(_name(t))
        replaced.append(table)
    if not done:
        return content, []
    sg.operators = [op for op in sg.operators if id(op) not in drop]
    _free(model, sg, replaced)
    _drop_unused_codes(model)
    return _save(model), done


def _free(model, sg, tables: list[int]) -> None:
    """The float32 tables an edit replaced emptied, where no op reads them (or a tensor sharing their buffer)
    any more: the file keeps only their int8 copies."""
    read = {(si, int(i)) for si, g in enumerate(model.subgraphs) for op in g.operators for i in op.inputs if i >= 0}
    keep = {model.subgraphs[si].tensors[ti].buffer for si, ti in read}
    for ti in tables:
        t = sg.tensors[ti]
        if t.buffer and t.buffer not in keep:
            model.buffers[t.buffer].data = None


def hybrid_lookups(content: bytes, min_elements: int = 1024) -> tuple[bytes, list[str]]:
    """Each EMBEDDING_LOOKUP of a constant float32 table (of `min_elements`+) whose rows stay float: the table
    stored int8, symmetric, one scale per row, which the runtime's hybrid EMBEDDING_LOOKUP dequantizes as it
    looks rows up (the rows move by at most half a step of their own row's scale). GATHER and GATHER_ND tables
    are left to `graphfix.weights_behind_dequantize`. Returns the model and the tables made int8."""
    if not _holds(content, "EMBEDDING_LOOKUP"):
        return content, []
    model = _load(content)
    codes, sg = _codes(model), model.subgraphs[0]
    done, replaced = [], []
    for op in sg.operators:
        found = (
            _table_and_ids(model, sg, op, "EMBEDDING_LOOKUP") if codes[op.opcodeIndex] == "EMBEDDING_LOOKUP" else None
        )
        if found is None:
            continue
        table, ids = found
        t = sg.tensors[table]
        values = _const(model, t)
        if values.size < min_elements:
            continue
        scale = np.maximum(np.abs(values).max(axis=1), 1e-30) / 127.0
        rows = np.clip(np.round(values / scale[:, None]), -127, 127).astype(np.int8)
        quant = _quant(scale, np.zeros(len(scale), np.int64), 0)
        stored = _tensor(sg, f"{_name(t)}/int8", list(t.shape), INT8, _buffer(model, rows.tobytes()), quant)
        op.inputs = np.array([ids, stored], np.int32)
        done.append(_name(t))
        replaced.append(table)
    if not done:
        return content, []
    _free(model, sg, replaced)
    return _save(model), done


def _behind_dequantize(model, sg, op, table: int):
    """The lookup reads its table through a DEQUANTIZE of an int8 copy (one scale per row), which the runtime
    expands once, at load."""
    t = sg.tensors[table]
    values = _const(model, t)
    scale = np.maximum(np.abs(values).max(axis=1), 1e-30) / 127.0
    rows = np.clip(np.round(values / scale[:, None]), -127, 127).astype(np.int8)
    quant = _quant(scale, np.zeros(len(scale), np.int64), 0)
    stored = _tensor(sg, f"{_name(t)}/int8", list(t.shape), INT8, _buffer(model, rows.tobytes()), quant)
    out = _tensor(sg, f"{_name(t)}/dequantized", list(t.shape), FLOAT32)
    op.inputs = np.array([out if int(i) == table else int(i) for i in op.inputs], np.int32)
    return _op(model, "DEQUANTIZE", [stored], [out])


def gathers_behind_dequantize(content: bytes, min_elements: int = 1024) -> tuple[bytes, list[str]]:
    """Each GATHER / GATHER_ND of a constant float32 table (of `min_elements`+) whose rows stay float reads an
    int8 copy of it (one scale per row) through a DEQUANTIZE: weight-only int8 behind the lookup. Returns the
    model and the tables made int8."""
    if not _holds(content, "GATHER", "GATHER_ND"):
        return content, []
    model = _load(content)
    codes, sg = _codes(model), model.subgraphs[0]
    done, replaced, new_ops = [], [], []
    for op in sg.operators:
        name = codes[op.opcodeIndex]
        found = _table_and_ids(model, sg, op, name) if name in ("GATHER", "GATHER_ND") else None
        if found is None or _const(model, sg.tensors[found[0]]).size < min_elements:
            continue
        new_ops.append(_behind_dequantize(model, sg, op, found[0]))
        done.append(_name(sg.tensors[found[0]]))
        replaced.append(found[0])
    if not done:
        return content, []
    sg.operators = new_ops + list(sg.operators)
    _free(model, sg, replaced)
    return _save(model), done


def complete(content: bytes) -> tuple[bytes, list[str]]:
    """An int8 model's float32 lookup tables made int8 (`integer_lookups`, then `hybrid_lookups` and
    `gathers_behind_dequantize` for the rows that stay float), and one line saying which and how."""
    said = []
    content, whole = integer_lookups(content)
    if whole:
        said.append(f"{_names(whole)} looked up in int8 (GATHER; quantized at the scale its rows are quantized to)")
    content, rows = hybrid_lookups(content)
    if rows:
        said.append(f"{_names(rows)} stored int8, one scale per row (the lookup dequantizes the rows it reads)")
    content, behind = gathers_behind_dequantize(content)
    if behind:
        said.append(f"{_names(behind)} stored int8 behind DEQUANTIZE (expanded once, at load)")
    return content, said


def _names(tables: list[str]) -> str:
    shown = ", ".join(repr(t) for t in tables[:3]) + (f" and {len(tables) - 3} more" if len(tables) > 3 else "")
    return f"embedding table{'s' if len(tables) > 1 else ''} {shown}"

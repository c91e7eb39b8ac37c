"""Read a `.tflite` flatbuffer completely into plain dataclasses, without TensorFlow.

Uses the `flatbuffers` runtime and the generated schema module that `ai-edge-litert` ships
(`ai_edge_litert/schema_py_generated.py`), so reading costs milliseconds, not TensorFlow's 3.5 s import.
Everything the delegate rules look at comes from here: operator codes (builtin or custom name), op
versions, builtin options, tensor dtype / shape / shape signature / quantization / constness, and the
producers and consumers of every tensor. Constness follows `op_signature.cc`: a tensor is constant when
its buffer index is not 0 and the buffer holds data (or, for >2 GB models, a non-empty offset/size).
"""

from __future__ import annotations

import math
import mmap
import re
import struct
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np

from optimize.core.errors import ModelError

_DTYPES = {
    0: "float32",
    1: "float16",
    2: "int32",
    3: "uint8",
    4: "int64",
    5: "string",
    6: "bool",
    7: "int16",
    8: "complex64",
    9: "int8",
    10: "float64",
    11: "complex128",
    12: "uint64",
    13: "resource",
    14: "variant",
    15: "uint32",
    16: "uint16",
    17: "int4",
    18: "bfloat16",
    19: "int2",
}
_NUMPY = {
    "float32": np.float32,
    "float16": np.float16,
    "int32": np.int32,
    "uint8": np.uint8,
    "int64": np.int64,
    "bool": np.bool_,
    "int16": np.int16,
    "int8": np.int8,
    "float64": np.float64,
    "uint64": np.uint64,
    "uint32": np.uint32,
    "uint16": np.uint16,
}


def _int4(data: bytes, n: int) -> np.ndarray | None:
    raw = np.frombuffer(data, np.uint8)
    if 2 * len(raw) < n:
        return None
    nibbles = np.empty(2 * len(raw), np.int8)
    nibbles[0::2], nibbles[1::2] = raw & 0x0F, raw >> 4
    return np.where(nibbles > 7, nibbles - 16, nibbles).astype(np.int8)[:n]


def _schema():
    from ai_edge_litert import schema_py_generated as s

    return s


class Quant:
    """Affine quantization of one tensor: one scale per tensor, or one per channel along `dim`.

    Scales and zero points are numpy views made on first use: per-channel models carry thousands of
    them, and most rules only ask whether there is more than one (`per_channel`).
    """

    __slots__ = ("_buf", "_scales_at", "_zps_at", "count", "zp_count", "dim", "blockwise")

    def __init__(self, buf, scales_at: int, count: int, zps_at: int, zp_count: int, dim: int, blockwise: bool):
        self._buf, self._scales_at, self._zps_at = buf, scales_at, zps_at
        self.count, self.zp_count, self.dim, self.blockwise = count, zp_count, dim, blockwise

    @property
    def scales(self) -> np.ndarray:
        return np.frombuffer(self._buf, "<f4", count=self.count, offset=self._scales_at)

    @property
    def zero_points(self) -> np.ndarray:
        if not self.zp_count:
            return np.zeros(0, np.int64)
        return np.frombuffer(self._buf, "<i8", count=self.zp_count, offset=self._zps_at)

    @property
    def per_channel(self) -> bool:
        return self.count > 1

    @property
    def legacy_scale(self) -> float:
        """The scale a kernel reading `TfLiteTensor.params` sees: the one scale of a per-tensor quantization,
        0 for per-channel or blockwise (core/subgraph.cc:145-170, GetLegacyQuantization)."""
        return float(self.scales[0]) if self.count == 1 and not self.blockwise else 0.0

    def __repr__(self) -> str:
        kind = f"per-channel x{self.count} (dim {self.dim})" if self.per_channel else "per-tensor"
        kind = "blockwise" if self.blockwise else kind
        return f"Quant({kind})"


@dataclass(slots=True)
class Tensor:
    index: int
    name: str
    dtype: str
    shape: tuple[int, ...]
    shape_signature: tuple[int, ...] | None
    buffer: int
    is_const: bool
    is_variable: bool
    quant_table: object = field(default=None, repr=False)  # parsed on first use: most rules never look
    data: memoryview | None = field(default=None, repr=False)
    sparse: bool = False  # has sparsity parameters (stored compressed: its buffer is not shape-sized)
    sparsity_table: object = field(default=None, repr=False)  # (buffer, its offset's position): `models.sparsity`

    @property
    def quant(self) -> Quant | None:
        """Quantization parameters (None for float tensors), read lazily from the flatbuffer."""
        q = self.quant_table
        if q is None or isinstance(q, Quant):
            return q
        buf, at = q  # (buffer, table position): the table is read on first use
        self.quant_table = q = _quant(_Table(buf, at))
        return q

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def values(self) -> np.ndarray | None:
        """The constant's values (flattened), or None when not constant or of a type numpy cannot view.
        int4 values are unpacked (two per byte, the first in the low nibble) into int8."""
        if self.is_const and self.data is not None and self.dtype == "int4":
            return _int4(self.data, self.numel)
        if not self.is_const or self.data is None or self.dtype not in _NUMPY:
            return None
        try:
            return np.frombuffer(self.data, dtype=_NUMPY[self.dtype])
        except ValueError:
            return None


@dataclass
class Op:
    index: int
    opcode: str  # builtin name, e.g. "CONV_2D", or "CUSTOM"
    custom_code: str | None
    version: int
    inputs: tuple[int, ...]  # -1 marks an omitted optional input
    outputs: tuple[int, ...]
    options_table: object = field(default=None, repr=False)  # unpacked on first use
    custom_options: bytes = b""

    @property
    def options(self) -> dict:
        """Builtin options by schema field name, enums as names (e.g. {'fused_activation_function': 'RELU6'})."""
        o = self.options_table
        if not isinstance(o, dict):
            try:
                o = {} if o is None else _options(o, _schema())
            except Exception as e:  # an options table pointing outside the file
                raise _corrupt(f"operator {self.index} ({self.opcode}) has unreadable options", e) from None
            self.options_table = o
        return o

    @property
    def name(self) -> str:
        """What a user recognises: the builtin name, or the custom op's own name."""
        return self.custom_code if self.opcode == "CUSTOM" and self.custom_code else self.opcode


@dataclass
class Subgraph:
    index: int
    name: str
    tensors: list[Tensor]
    ops: list[Op]
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]

    @cached_property
    def producer(self) -> dict[int, int]:
        """tensor index -> index of the op that writes it."""
        return {t: op.index for op in self.ops for t in op.outputs if t >= 0}

    @cached_property
    def consumers(self) -> dict[int, list[int]]:
        """tensor index -> indices of the ops that read it (in execution order)."""
        out: dict[int, list[int]] = {}
        for op in self.ops:
            for t in op.inputs:
                if t >= 0:
                    out.setdefault(t, []).append(op.index)
        return out


@dataclass(frozen=True)
class Signature:
    """One SignatureDef: its key, the subgraph it runs, and (name, tensor index) per input and output."""

    key: str | None
    subgraph: int
    inputs: tuple[tuple[str, int], ...] | None  # None: the vector is absent
    outputs: tuple[tuple[str, int], ...] | None


@dataclass
class Model:
    version: int
    description: str
    subgraphs: list[Subgraph]
    size_bytes: int
    n_buffers: int = 0
    signatures: list[Signature] = field(default_factory=list)

    @property
    def main(self) -> Subgraph:
        return self.subgraphs[0]


def _enum_names(cls) -> dict[int, str]:
    return {v: k for k, v in vars(cls).items() if not k.startswith("_") and isinstance(v, int)}


_CAMEL = re.compile(r"([A-Z])")
_cache: dict = {}


def _tables():
    """Name tables from the schema, built once."""
    if not _cache:
        s = _schema()
        _cache["ops"] = _enum_names(s.BuiltinOperator)
        _cache["opts"] = _enum_names(s.BuiltinOptions)
        _cache["opts2"] = _enum_names(s.BuiltinOptions2)
        _cache["enums"] = {
            "fused_activation_function": _enum_names(s.ActivationFunctionType),
            "activation": _enum_names(s.ActivationFunctionType),
            "padding": _enum_names(s.Padding),
            "weights_format": _enum_names(s.FullyConnectedOptionsWeightsFormat),
            "kernel_type": _enum_names(s.LSTMKernelType),
            "mode": _enum_names(s.MirrorPadMode),
            "output_type": _DTYPES,
            "in_data_type": _DTYPES,
            "out_data_type": _DTYPES,
        }
        _cache["lsh"] = _enum_names(s.LSHProjectionType)
        _cache["snake"] = {}
    return _cache


def _snake(name: str) -> str:
    snake = _cache["snake"]
    if name not in snake:
        snake[name] = _CAMEL.sub(r"_\1", name).lower()
    return snake[name]


_U32 = struct.Struct("<I")
_VTABLES = [struct.Struct(f"<{n}H") for n in range(64)]
_I32 = struct.Struct("<i")
_U16 = struct.Struct("<H")
_U64 = struct.Struct("<Q")


class _Table:
    """A flatbuffer table read with `struct` directly: one vtable read, then plain offsets.

    The generated accessors cost ~10 Python calls per field; a model has thousands of fields, and the
    compatibility check must cost less than loading the model in the interpreter. Slot numbers are the
    schema's field ids (slot = 4 + 2 * id), the same ones the generated module uses.
    """

    __slots__ = ("buf", "pos", "vt_len", "offsets")

    def __init__(self, buf, pos: int):
        self.buf = buf
        self.pos = pos
        vt = pos - _I32.unpack_from(buf, pos)[0]
        self.vt_len = _U16.unpack_from(buf, vt)[0]
        # The field offsets, slot 4 onwards, read in one call.
        n = max(self.vt_len - 4, 0) >> 1
        self.offsets = (_VTABLES[n] if n < len(_VTABLES) else struct.Struct(f"<{n}H")).unpack_from(buf, vt + 4)

    def _field(self, slot: int) -> int:
        k = (slot - 4) >> 1
        offsets = self.offsets
        off = offsets[k] if k < len(offsets) else 0
        return self.pos + off if off else 0

    def scalar(self, slot: int, fmt: struct.Struct, default=0):
        at = self._field(slot)
        return fmt.unpack_from(self.buf, at)[0] if at else default

    def byte(self, slot: int, signed: bool = False, default: int = 0) -> int:
        at = self._field(slot)
        if not at:
            return default
        v = self.buf[at]
        return v - 256 if signed and v > 127 else v

    def _target(self, slot: int) -> int:
        at = self._field(slot)
        return at + _U32.unpack_from(self.buf, at)[0] if at else 0

    def table(self, slot: int) -> _Table | None:
        at = self._target(slot)
        return _Table(self.buf, at) if at else None

    def vector(self, slot: int) -> tuple[int, int]:
        """(start of the elements, element count); (0, 0) when absent."""
        at = self._target(slot)
        if not at:
            return 0, 0
        return at + 4, _U32.unpack_from(self.buf, at)[0]

    def ints(self, slot: int) -> tuple[int, ...] | None:
        start, n = self.vector(slot)
        if not start:
            return None
        return struct.unpack_from(f"<{n}i", self.buf, start)

    def string(self, slot: int) -> str:
        start, n = self.vector(slot)
        return bytes(self.buf[start : start + n]).decode(errors="replace") if start else ""

    def tables(self, slot: int) -> list[_Table]:
        start, n = self.vector(slot)
        buf = self.buf
        return [_Table(buf, start + 4 * i + _U32.unpack_from(buf, start + 4 * i)[0]) for i in range(n)]


def _quant(q: _Table | None) -> Quant | None:
    if q is None:
        return None
    try:
        start, n = q.vector(8)
        zstart, zn = q.vector(10)
        dim, details = q.scalar(16, _I32), q.byte(12)
    except Exception as e:
        raise _corrupt("a tensor's quantization table is unreadable", e) from None
    if start + 4 * n > len(q.buf) or zstart + 8 * zn > len(q.buf):
        raise _corrupt("a tensor's quantization scales run past the end of the file")
    if not n and details != _BLOCKWISE:  # blockwise: the scales live in a tensor of their own
        return None
    return Quant(q.buf, start, n, zstart, zn, dim, details == _BLOCKWISE)


_BLOCKWISE = 2  # QuantizationDetails: 1 Custom, 2 Blockwise, 3 MultiAxis (tflite/converter/schema/schema.fbs:77-81)


_F32 = struct.Struct("<f")
# Hot option tables read straight from the flatbuffer: (field, vtable slot, kind, default). Slots were
# checked against schema_py_generated; anything not listed goes through the generated object API.
_PAD, _ACT = "padding", "fused_activation_function"
_FAST: dict[str, tuple[tuple[str, int, str, object], ...]] = {
    "Conv2DOptions": (
        (_PAD, 4, "b", 0),
        ("stride_w", 6, "i", 0),
        ("stride_h", 8, "i", 0),
        (_ACT, 10, "b", 0),
        ("dilation_w_factor", 12, "i", 1),
        ("dilation_h_factor", 14, "i", 1),
    ),
    "DepthwiseConv2DOptions": (
        (_PAD, 4, "b", 0),
        ("stride_w", 6, "i", 0),
        ("stride_h", 8, "i", 0),
        ("depth_multiplier", 10, "i", 0),
        (_ACT, 12, "b", 0),
        ("dilation_w_factor", 14, "i", 1),
        ("dilation_h_factor", 16, "i", 1),
    ),
    "AddOptions": ((_ACT, 4, "b", 0),),
    "MulOptions": ((_ACT, 4, "b", 0),),
    "SubOptions": ((_ACT, 4, "b", 0),),
    "DivOptions": ((_ACT, 4, "b", 0),),
    "Pool2DOptions": (
        (_PAD, 4, "b", 0),
        ("stride_w", 6, "i", 0),
        ("stride_h", 8, "i", 0),
        ("filter_width", 10, "i", 0),
        ("filter_height", 12, "i", 0),
        (_ACT, 14, "b", 0),
    ),
    "FullyConnectedOptions": (
        (_ACT, 4, "b", 0),
        ("weights_format", 6, "b", 0),
        ("keep_num_dims", 8, "?", False),
        ("asymmetric_quantize_inputs", 10, "?", False),
    ),
    "ConcatenationOptions": (("axis", 4, "i", 0), (_ACT, 6, "b", 0)),
    "SoftmaxOptions": (("beta", 4, "f", 0.0),),
    "ReducerOptions": (("keep_dims", 4, "?", False),),
    "ReshapeOptions": (("new_shape", 4, "v", ()),),
}


_SCALARS = {"i": struct.Struct("<i"), "b": struct.Struct("<b"), "?": struct.Struct("<?"), "f": _F32}


def _fast_options(table: _Table, name: str) -> dict:
    enums = _cache["enums"]
    buf, pos, offs = table.buf, table.pos, table.offsets
    n = len(offs)
    out: dict = {"_type": name}
    for key, slot, kind, default in _FAST[name]:
        k = (slot - 4) >> 1
        off = offs[k] if k < n else 0
        if kind == "v":
            v = _int_vector(buf, pos + off if off else 0) or ()
        else:
            v = _SCALARS[kind].unpack_from(buf, pos + off)[0] if off else default
        enum = enums.get(key)
        out[key] = enum.get(v, v) if enum is not None else v
    return out


def _options(o: _Table, s) -> dict:
    """Builtin options as a dict with schema field names; enum fields become their names (e.g. 'RELU6')."""
    t = _tables()
    for type_slot, table_slot, names in ((10, 12, t["opts"]), (26, 28, t["opts2"])):
        kind = o.byte(type_slot)
        if not kind:
            continue
        name = names.get(kind)
        table = o._target(table_slot)
        if name is None or not table:
            return {}
        if name in _FAST:
            return _fast_options(_Table(o.buf, table), name)
        obj = getattr(s, name)()
        obj.Init(o.buf, table)
        unpacked = getattr(s, name + "T").InitFromObj(obj)
        out: dict = {"_type": name}
        for key, value in vars(unpacked).items():
            key = _snake(key)
            if isinstance(value, np.ndarray):
                value = tuple(value.tolist())
            elif isinstance(value, list):
                value = tuple(value)
            enum = t["lsh"] if (name == "LSHProjectionOptions" and key == "type") else t["enums"].get(key)
            if enum is not None and isinstance(value, int):
                value = enum.get(value, value)
            out[key] = value
        return out
    return {}


def _map(path: Path):
    """Map the file instead of reading it: only the pages the reader touches are loaded (weights are not).
    Only a regular file within the model limit is opened (paths.open_regular: no FIFO, no device)."""
    from optimize.core.paths import open_regular

    with open_regular(path, "model", ModelError) as f:
        try:
            return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:  # empty file
            return b""


def _corrupt(what: str, e: Exception | None = None) -> ModelError:
    why = f" ({e.__class__.__name__})" if e is not None else ""
    return ModelError(f"The model is corrupt: {what}{why}.", "Re-export the model; check the file copied completely.")


def _source(model: str | Path | bytes, where: str | None = None):
    """(buffer, name for messages) of a model path or its bytes."""
    if isinstance(model, (bytes, bytearray, memoryview)):
        return bytes(model), where or "The model bytes"
    path = Path(model)
    return _map(path), str(path)


def _truncated() -> ModelError:
    return ModelError(
        "The model is truncated: a weight buffer runs past the end of the file.",
        "Re-export the model; check the file copied completely.",
    )


def _opcodes(m: _Table) -> list[tuple[str, str | None, int]]:
    """(builtin name, custom name, version) per operator code; builtin = max(deprecated, new) code."""
    names = _tables()["ops"]
    out = []
    for i, oc in enumerate(m.tables(6)):
        code = max(oc.byte(4, signed=True), oc.scalar(10, _I32))
        name = names.get(code)
        if name is None:
            raise ModelError(
                f"Operator code {i} uses builtin op {code}, which this schema (ai-edge-litert) does not know: "
                "the model was written with a newer schema.",
                "Upgrade ai-edge-litert, or convert with the matching TensorFlow/LiteRT version.",
            )
        out.append((name, oc.string(6) or None, oc.scalar(8, _I32, 1) or 1))
    return out


def _buffer(i: int, b: _Table, view: memoryview, size: int) -> memoryview | None:
    """A zero-copy view of one buffer's data, bounds-checked (truncation shows up here). Offset 0 means no data
    outside the flatbuffer and offset 1 is the converter's placeholder: with either, a size other than 0 names
    bytes that are nowhere (a crafted offset 1 and size 2**62 reached the quantizers), refused."""
    start, n = b.vector(4)
    if n:
        if start + n > size:
            raise _truncated()
        return view[start : start + n]
    off, sz = b.scalar(6, _U64), b.scalar(8, _U64)
    if off <= 1:
        if sz:
            raise ModelError(
                f"The model is corrupt: buffer {i} claims {sz:,} bytes at offset {off}, outside the file.",
                "The file is corrupt or hand-edited: re-export the model.",
            )
        return None
    if off + sz > size:
        raise _truncated()
    return view[off : off + sz] if sz else None


def _int_vector(buf, at: int) -> tuple[int, ...] | None:
    """The int32 vector whose offset field is at `at` (0: absent)."""
    if not at:
        return None
    start = at + _U32.unpack_from(buf, at)[0]
    n = _U32.unpack_from(buf, start)[0]
    return struct.unpack_from(f"<{n}i", buf, start + 4)


def _tensor(x: _Table, ti: int, buffers: list[memoryview | None]) -> Tensor:
    """One Tensor table, read field by field (field ids: shape 0, type 1, buffer 2, name 3, quantization 4,
    is_variable 5, sparsity 6, shape_signature 7, external_buffer 10)."""
    buf, pos, offs = x.buf, x.pos, x.offsets + (0,) * 11
    bi = _U32.unpack_from(buf, pos + offs[2])[0] if offs[2] else 0
    data = buffers[bi] if 0 < bi < len(buffers) else None
    is_var = bool(buf[pos + offs[5]]) if offs[5] else False
    external = _U32.unpack_from(buf, pos + offs[10])[0] if offs[10] else 0
    code = buf[pos + offs[1]] if offs[1] else 0
    code = code - 256 if code > 127 else code
    q = pos + offs[4] + _U32.unpack_from(buf, pos + offs[4])[0] if offs[4] else 0
    return Tensor(
        index=ti,
        name=x.string(10),
        dtype=_DTYPES.get(code, f"type{code}"),
        shape=_int_vector(buf, pos + offs[0] if offs[0] else 0) or (),
        shape_signature=_int_vector(buf, pos + offs[7] if offs[7] else 0),
        buffer=bi,
        is_const=(data is not None or external != 0) and not is_var,
        is_variable=is_var,
        quant_table=(buf, q) if q else None,
        data=data,
        sparse=offs[6] != 0,
        sparsity_table=(buf, pos + offs[6]) if offs[6] else None,
    )


def _op(o: _Table, oi: int, opcodes: list[tuple[str, str | None, int]], view: memoryview) -> Op:
    idx = o.scalar(4, _U32)
    if idx >= len(opcodes):
        raise ModelError(
            f"Operator {oi} refers to operator code {idx}, which does not exist.",
            "The file is corrupt: re-export the model.",
        )
    name, custom, version = opcodes[idx]
    start, n = o.vector(14)
    custom_options = bytes(view[start : start + n]) if n else b""
    large = o.scalar(22, _U64) if o.vt_len > 22 else 0
    if not n and large > 1:
        custom_options = bytes(view[large : large + o.scalar(24, _U64)])
    return Op(oi, name, custom, version, o.ints(6) or (), o.ints(8) or (), o, custom_options)


def _subgraph(si: int, g: _Table, opcodes, buffers, view: memoryview) -> Subgraph:
    tensors = [_tensor(x, ti, buffers) for ti, x in enumerate(g.tables(4))]
    ops = [_op(o, oi, opcodes, view) for oi, o in enumerate(g.tables(10))]
    return Subgraph(si, g.string(12), tensors, ops, g.ints(6) or (), g.ints(8) or ())


def _tensor_maps(sig: _Table, slot: int) -> tuple[tuple[str, int], ...] | None:
    """A SignatureDef's TensorMap vector (name field 0, tensor_index field 1), None when absent."""
    if not sig._field(slot):
        return None
    return tuple((t.string(4), t.scalar(6, _U32)) for t in sig.tables(slot))


def _signature(sig: _Table) -> Signature:
    """SignatureDef fields: inputs 0, outputs 1, signature_key 2, subgraph_index 4."""
    key = sig.string(8) if sig._field(8) else None
    return Signature(key, sig.scalar(12, _U32), _tensor_maps(sig, 4), _tensor_maps(sig, 6))


def _parse(buf) -> Model:
    _tables()
    size = len(buf)
    view = memoryview(buf)
    m = _Table(buf, _U32.unpack_from(buf, 0)[0])
    opcodes = _opcodes(m)
    buffers = [_buffer(i, b, view, size) for i, b in enumerate(m.tables(12))]
    subgraphs = [_subgraph(si, g, opcodes, buffers, view) for si, g in enumerate(m.tables(8))]
    signatures = [_signature(sig) for sig in m.tables(18)]
    return Model(m.scalar(4, _U32), m.string(10), subgraphs, size, len(buffers), signatures)

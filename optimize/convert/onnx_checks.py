"""An ONNX file checked before anything reads more of it than its protobuf: the front door's own walk over
every graph it holds, so that a crafted file is one line, never a read of another file, a huge allocation
or an hour of work.

What `check` refuses, each in one line naming where (`initializer w`, `Constant node c attribute value`,
`If node if0 then_branch: initializer w`, `function f: Constant node k ...`), to the bounds of `limits`:

* **external data** anywhere: a tensor whose bytes live in another file (`data_location = EXTERNAL` or an
  `external_data` entry) in an initializer, a sparse initializer, a node attribute (a `Constant`'s value
  among them), inside any subgraph (If/Loop/Scan bodies, at any depth), a model-local function or training
  info. onnx's `numpy_helper.to_array` and reference evaluator resolve such a location against the
  process's working folder, not the model's: a model file must never make optimize read any other file,
  so no location is ever looked at;
* **tensors that do not hold what they declare**: dimensions that are negative, a dtype optimize does not
  read (`STRING`, an unknown or 6-bit type), or a number of values (raw bytes or typed fields) other than
  the dimensions' product (`[2**40]` with 20 bytes); one tensor beyond MAX_TENSOR_BYTES, or all of them
  together beyond MAX_MODEL_BYTES;
* **sparse tensors** (sparse initializers, sparse attributes): not read;
* **graphs beyond MAX_FILE_NODES nodes** (every graph, subgraph and function counted), before any pass
  over them; `check_size` refuses a normalised graph of more than `max_nodes()` nodes before conversion,
  whose time (torch.export, litert-torch) grows faster than linearly with the graph (measured: 1,000 Add
  nodes 66 s, 3,000 nodes 281 s on 2 shared cores);
* **declared values beyond MAX_TENSOR_BYTES** (an input, output or inferred value of static shape): what
  running the graph would allocate (`check_values`, after normalisation too, with `check_nodes` for the
  ops sized by constant inputs whose output inference left open).

`fold_bytes` bounds what folding a node would make before numpy is asked to make it (`onnx_graph`).
Nothing here reads anything but the bytes given; nothing is evaluated. Names from the file are shown as
themselves when plain, `repr`-quoted otherwise (`shown`), so a name with a newline cannot forge a line.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from onnx import AttributeProto, GraphProto, ModelProto, TensorProto, ValueInfoProto

from optimize.convert.limits import MAX_FILE_NODES, MAX_MODEL_BYTES, MAX_TENSOR_BYTES, NODES_ENV, max_nodes, shown
from optimize.core.errors import ModelError

#: Bits per value of each tensor type optimize reads (STRING, UNDEFINED and the 6-bit floats are not).
BITS = {
    TensorProto.FLOAT: 32, TensorProto.UINT8: 8, TensorProto.INT8: 8, TensorProto.UINT16: 16,
    TensorProto.INT16: 16, TensorProto.INT32: 32, TensorProto.INT64: 64, TensorProto.BOOL: 8,
    TensorProto.FLOAT16: 16, TensorProto.DOUBLE: 64, TensorProto.UINT32: 32, TensorProto.UINT64: 64,
    TensorProto.COMPLEX64: 64, TensorProto.COMPLEX128: 128, TensorProto.BFLOAT16: 16,
    TensorProto.FLOAT8E4M3FN: 8, TensorProto.FLOAT8E4M3FNUZ: 8, TensorProto.FLOAT8E5M2: 8,
    TensorProto.FLOAT8E5M2FNUZ: 8, TensorProto.UINT4: 4, TensorProto.INT4: 4, TensorProto.FLOAT4E2M1: 4,
}  # fmt: skip
for _name, _bits in (("FLOAT8E8M0", 8), ("UINT2", 2), ("INT2", 2)):  # onnx >= 1.18 / 1.19
    if hasattr(TensorProto, _name):
        BITS[getattr(TensorProto, _name)] = _bits
#: The typed field each type keeps its values in (when it has no raw_data), and entries per value (complex
#: numbers take two; every other type not listed keeps one value, or a packed pair of 4-bit ones, per int32).
_FIELDS = {
    TensorProto.FLOAT: ("float_data", 1), TensorProto.COMPLEX64: ("float_data", 2),
    TensorProto.DOUBLE: ("double_data", 1), TensorProto.COMPLEX128: ("double_data", 2),
    TensorProto.INT64: ("int64_data", 1), TensorProto.UINT32: ("uint64_data", 1),
    TensorProto.UINT64: ("uint64_data", 1),
}  # fmt: skip

SAVE_ONE_FILE = "Save it as one file: onnx.save(onnx.load(path), 'model.onnx', save_as_external_data=False)."
EXPORT_AGAIN = "Export the model again (a float model, dense weights in the file)."


def _type_name(t: int) -> str:
    return TensorProto.DataType.Name(t) if t in TensorProto.DataType.values() else f"type {t}"


# ------------------------------------------------------------------------------------------- the walk


def _graphs(model: ModelProto) -> Iterator[tuple[str, GraphProto | None, list]]:
    """(where, graph, nodes) for every graph and function of the model, subgraphs at any depth
    (iteratively: a protobuf nests at most 100 deep, this walk any depth)."""
    stack: list[tuple[str, GraphProto]] = [("", model.graph)]
    for k, info in enumerate(model.training_info):
        stack += [(f"training info {k} initialization: ", info.initialization)]
        stack += [(f"training info {k} algorithm: ", info.algorithm)]
    for f in model.functions:
        yield f"function {shown(f.name)}: ", None, list(f.node)
        stack += [(f"function {shown(f.name)}: {w}", g) for w, g in _node_subgraphs(f.node)]
    while stack:
        where, g = stack.pop()
        yield where, g, list(g.node)
        stack += [(where + w, sg) for w, sg in _node_subgraphs(g.node)]


def _node_subgraphs(nodes) -> Iterator[tuple[str, GraphProto]]:
    for n in nodes:
        for a in n.attribute:
            if a.type == AttributeProto.GRAPH or a.HasField("g"):
                yield f"{_node(n)} {a.name}: ", a.g
            for k, g in enumerate(a.graphs):
                yield f"{_node(n)} {a.name}[{k}]: ", g


def _node(n) -> str:
    return f"{n.op_type or 'node'} node {shown(n.name or (n.output[0] if n.output else ''))}"


def _tensors(where: str, g: GraphProto | None, nodes) -> Iterator[tuple[str, TensorProto | None, bool]]:
    """(where, tensor, sparse) for every tensor a graph holds: initializers, sparse initializers (their
    values and indices), node attributes (TENSOR, TENSORS, SPARSE_TENSOR, SPARSE_TENSORS)."""
    if g is not None:
        for t in g.initializer:
            yield f"{where}initializer {shown(t.name)}", t, False
        for s in g.sparse_initializer:
            yield f"{where}sparse initializer {shown(s.values.name)}", s.values, True
            yield f"{where}sparse initializer {shown(s.values.name)} (indices)", s.indices, True
    for n in nodes:
        for a in n.attribute:
            at = f"{where}{_node(n)} attribute {shown(a.name)}"
            if a.HasField("t"):
                yield at, a.t, False
            for t in a.tensors:
                yield at, t, False
            sparse = list(a.sparse_tensors) + ([a.sparse_tensor] if a.HasField("sparse_tensor") else [])
            for s in sparse:
                yield at, s.values, True
                yield f"{at} (indices)", s.indices, True


def external(t: TensorProto) -> bool:
    """Whether a tensor's bytes live in another file."""
    return t.data_location == TensorProto.EXTERNAL or len(t.external_data) > 0


# ------------------------------------------------------------------------------------------- checks


def check(model: ModelProto, name: str) -> None:
    """Every refusal of the module docstring, in the order: external data, size of the graph, sparse
    tensors, each tensor's declared shape against its bytes, declared values. One ModelError line."""
    walk = list(_graphs(model))
    nodes = sum(len(n) for _, _, n in walk)
    tensors = [t for w, g, n in walk for t in _tensors(w, g, n)]
    for where, t, _ in tensors:  # first, and before anything reads a tensor
        if external(t):
            raise ModelError(
                f"{name}: {where} keeps its values in another file (ONNX external data); optimize reads no "
                "file but the model.",
                SAVE_ONE_FILE,
            )
    if nodes > MAX_FILE_NODES:
        raise ModelError(
            f"{name} holds {nodes:,} nodes, more than the {MAX_FILE_NODES:,} optimize reads.",
            "Simplify the graph (onnxsim) or export a smaller model.",
        )
    total = 0
    for where, t, sparse in tensors:
        if sparse:
            raise ModelError(f"{name}: {where} is a sparse tensor, which optimize does not read.", EXPORT_AGAIN)
        total += tensor_bytes(t, f"{name}: {where}")
        if total > MAX_MODEL_BYTES:
            raise ModelError(
                f"{name}: its tensors hold more than {MAX_MODEL_BYTES:,} bytes together (at {where}).",
                "Export a smaller model.",
            )
    check_values(model, name)


def tensor_bytes(t: TensorProto, where: str) -> int:
    """The bytes a tensor holds once read, after checking its dtype, dimensions and values agree."""
    bits = BITS.get(t.data_type)
    if bits is None:
        what = "a string tensor" if t.data_type == TensorProto.STRING else f"a tensor of {_type_name(t.data_type)}"
        raise ModelError(f"{where} is {what}, which optimize does not read.", EXPORT_AGAIN)
    dims = list(t.dims)
    if any(d < 0 for d in dims):
        raise ModelError(f"{where} has a negative dimension {dims[:8]}.", EXPORT_AGAIN)
    count = math.prod(dims)
    size = (count * bits + 7) // 8
    if size > MAX_TENSOR_BYTES:
        raise ModelError(
            f"{where} declares {_dims(dims)} ({size:,} bytes), more than the {MAX_TENSOR_BYTES:,} one tensor may hold.",
            EXPORT_AGAIN,
        )
    held, unit = _held(t, bits)
    if held != (size if unit == "bytes" else _entries(t.data_type, count, bits)):
        raise ModelError(
            f"{where} declares {_dims(dims)} {_type_name(t.data_type)} ({count:,} values) but holds {held:,} "
            f"{unit}: a damaged or forged file.",
            EXPORT_AGAIN,
        )
    return size


def _dims(dims: list[int]) -> str:
    return "[" + ", ".join(map(str, dims[:8])) + (", ..." if len(dims) > 8 else "") + "]"


def _held(t: TensorProto, bits: int) -> tuple[int, str]:
    """(how much the tensor holds, in what): its raw bytes, or the entries of its typed field."""
    if t.HasField("raw_data"):
        return len(t.raw_data), "bytes"
    field = _FIELDS.get(t.data_type, ("int32_data", 1))[0]
    return len(getattr(t, field)), f"{field} entries"


def _entries(data_type: int, count: int, bits: int) -> int:
    """The typed field's entries `count` values take (complex: two per value; sub-byte types: packed)."""
    per = _FIELDS.get(data_type, ("int32_data", 1))[1]
    return -(-count * bits // 8) if bits < 8 else count * per


def check_normalised(model: ModelProto, name: str) -> None:
    """The normalised graph, its shapes now fixed, checked before conversion starts (what running it would
    allocate: `check_values`, `check_nodes`; its size: `check_size`), and the conversion of `name` begun."""
    from optimize.convert import steps

    check_values(model, name)
    check_nodes(model, name)
    nodes = check_size(model, name)
    steps.begin(name, nodes, "a normalised ONNX graph")


def check_values(model: ModelProto, name: str) -> None:
    """Every value of static shape the top-level graph declares (inputs, outputs, value_info) within
    MAX_TENSOR_BYTES: what running it would allocate (an input declared [2**33, 1024] is refused here,
    not asked of the allocator)."""
    g = model.graph
    for kind, values in (("input", g.input), ("output", g.output), ("value", g.value_info)):
        for vi in values:
            size = value_bytes(vi)
            if size is not None and size > MAX_TENSOR_BYTES:
                dims = [d.dim_value for d in vi.type.tensor_type.shape.dim]
                raise ModelError(
                    f"{name}: {kind} {shown(vi.name)} is {_dims(dims)} ({size:,} bytes), more than the "
                    f"{MAX_TENSOR_BYTES:,} one tensor may hold.",
                    "Pass smaller inputs, or export the model without it.",
                )


def check_nodes(model: ModelProto, name: str) -> None:
    """Every top-level node sized by constant inputs (ConstantOfShape, Expand, Tile, Range: `fold_bytes`)
    within MAX_TENSOR_BYTES, whether or not shape inference knew its output: running it would allocate that."""
    from onnx import numpy_helper

    inits = {t.name: t for t in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type not in _COMPUTED or not all(i in inits for i in n.input if i):
            continue
        ins = {i: numpy_helper.to_array(inits[i]) for i in n.input if i and len(inits[i].raw_data) <= 1 << 16}
        size = fold_bytes(n, ins, {}) if len(ins) == len([i for i in n.input if i]) else None
        if size is not None and size > MAX_TENSOR_BYTES:
            raise ModelError(
                f"{name}: {_node(n)} would make {size:,} bytes, more than the {MAX_TENSOR_BYTES:,} one tensor may "
                "hold.",
                "Pass smaller inputs, or export the model without it.",
            )


def value_bytes(vi: ValueInfoProto) -> int | None:
    """The bytes of a value whose shape is static (every dimension a number), else None."""
    t = vi.type.tensor_type
    if not vi.type.HasField("tensor_type") or not t.HasField("shape"):
        return None
    dims = [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim]
    if any(d is None for d in dims):
        return None
    return (math.prod(max(d, 0) for d in dims) * BITS.get(t.elem_type, 64) + 7) // 8


def check_size(model: ModelProto, name: str) -> int:
    """The normalised graph's node count; refused beyond `max_nodes()` before conversion starts."""
    nodes = sum(len(n) for _, _, n in _graphs(model))
    limit = max_nodes()
    if nodes > limit:
        raise ModelError(
            f"{name} is {nodes:,} nodes once normalised, more than the {limit:,} optimize converts (converting "
            "takes minutes per thousand nodes).",
            f"Simplify the graph (onnxsim), or raise the limit with {NODES_ENV}=<nodes>.",
        )
    return nodes


def parse(data: bytes, name: str) -> ModelProto:
    """The file's bytes as an ONNX model, checked (`check`); nothing outside them is read (onnx's
    `load_from_string` never follows external data; `check` refuses any before a reader could)."""
    import onnx

    if not data:
        raise ModelError(
            f"{name} is empty (0 bytes).", "Pass the .onnx an exporter wrote (a copy may have been cut short)."
        )
    try:
        model = onnx.load_from_string(data)
    except Exception as e:  # noqa: BLE001 - DecodeError, RecursionError (nested too deep): not ONNX we read
        raise ModelError(
            f"{name} is not a readable ONNX file ({e.__class__.__name__}).", "Pass the .onnx an exporter wrote."
        ) from None
    if not model.HasField("graph") or not model.graph.node:  # stray protobuf bytes parse to an empty model
        raise ModelError(f"{name} holds no ONNX graph (no nodes).", "Pass the .onnx an exporter wrote.")
    check(model, name)
    return model


def read(path) -> tuple[ModelProto, bytes]:
    """(the checked model, the bytes it was parsed from) of an .onnx file, read once and bounded: ONNX
    Runtime is handed these same bytes, never the path (a file swapped meanwhile is never read)."""
    from pathlib import Path

    from optimize.core.paths import read_bounded

    p = Path(path)
    data = read_bounded(p, "model", ModelError)
    return parse(data, p.name), data


# ------------------------------------------------------------------------------------------- folding

#: Ops whose output size follows from their inputs' values (a shape, repeats, a range, pads, scales, a depth,
#: a length) or from size attributes (pads, strides, output sizes), not from their inputs' sizes alone.
SIZED_BY_VALUES = frozenset(
    {
        "ConstantOfShape", "Expand", "Tile", "Range", "Resize", "Upsample", "Pad", "OneHot", "MelWeightMatrix",
        "HannWindow", "HammingWindow", "BlackmanWindow", "DFT", "STFT", "MaxUnpool", "AffineGrid", "Col2Im",
        "CenterCropPad", "Conv", "ConvTranspose", "ConvInteger", "QLinearConv", "DeformConv", "MaxPool",
        "AveragePool", "LpPool", "RoiAlign", "MaxRoiPool", "TfIdfVectorizer", "ImageDecoder", "EyeLike",
    }
)  # fmt: skip


def fold_bytes(node, inputs: dict, vinfo: dict) -> int | None:
    """An upper bound of the bytes folding `node` on constant `inputs` makes, before numpy makes them: its
    outputs' inferred static shapes; else, for an op sized by its inputs' values, the size they ask for
    (ConstantOfShape, Expand, Tile, Range) or None (not folded); else the product of its inputs' sizes
    (a bound for any op whose output indexes combinations of its inputs' elements). 8 bytes per value
    where the type is not known."""
    outs = [o for o in node.output if o]
    known = [value_bytes(vinfo[o]) if o in vinfo else None for o in outs]
    if outs and all(k is not None for k in known):
        return sum(known)
    values = [inputs[i] for i in node.input if i]
    computed = _COMPUTED.get(node.op_type)
    if computed is not None:
        try:
            count = computed(values)
        except (IndexError, ValueError, OverflowError, TypeError, ZeroDivisionError):
            return None
        return count * 8
    if node.op_type in SIZED_BY_VALUES:
        return None
    return math.prod(max(int(v.size), 1) for v in values) * 8


def _ints(v) -> list[int]:
    return [int(d) for d in v.reshape(-1)]


def _range_count(values) -> int:
    start, limit, delta = (float(v.reshape(-1)[0]) for v in values[:3])
    return max(0, math.ceil((limit - start) / delta))


#: The values an op sized by its constant inputs makes, from those inputs.
_COMPUTED = {
    "ConstantOfShape": lambda v: math.prod(_ints(v[0])),
    "Expand": lambda v: math.prod(max(a, b) for a, b in _aligned(list(v[0].shape), _ints(v[1]))),
    "Tile": lambda v: v[0].size * math.prod(_ints(v[1])),
    "Range": _range_count,
}


def _aligned(a: list[int], b: list[int]) -> list[tuple[int, int]]:
    n = max(len(a), len(b))
    return list(zip([1] * (n - len(a)) + a, [1] * (n - len(b)) + b))

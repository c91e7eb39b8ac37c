"""How many ids each id input of a model takes: the vocabulary of the embedding its values index, read from the
model itself, so ids beyond it are refused before any work (a float32 baseline that fails "gather index out of
bounds" on every sample says nothing about quantization).

    IdBound(input, size, layer)      the input's ids must lie in 0..size-1 (`layer`: the table, in the user's words)
    keras_bounds(config)             a Keras model's, from its stored config: each Embedding's input_dim
    tflite_bounds(model)             a parsed .tflite's: the first dimension of each GATHER / EMBEDDING_LOOKUP table
    trace_input(start, step, ...)    the walk from an embedding's index back to a model input, shared with the
                                     torch and ONNX readers (`optimize.convert.vocabulary`)

An index counts only when it reaches a model input through ops that keep its values (casts, reshapes,
slices): ids computed inside the model (positions from a range, hashed buckets) are not the user's to check.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

#: Keras layers (by class name; Keras 3 operations are stored as layers of these names too) that pass ids on
#: unchanged in value: the walk from an Embedding back to its input goes through them.
KERAS_KEEPS_IDS = frozenset(
    {
        "Reshape",
        "Flatten",
        "Permute",
        "RepeatVector",
        "Cropping1D",
        "Cast",
        "GetItem",
        "Squeeze",
        "ExpandDims",
        "Identity",
        "SlicingOpLambda",
    }
)
#: tf_keras op layers (TFOpLambda) whose function keeps values.
KERAS_OP_FUNCTIONS = frozenset({"cast", "reshape", "squeeze", "expand_dims", "identity", "__operators__.getitem"})
#: .tflite ops that keep an index's values on its way from the model input to the table.
TFLITE_KEEPS_IDS = frozenset(
    {"CAST", "RESHAPE", "SQUEEZE", "EXPAND_DIMS", "STRIDED_SLICE", "SLICE", "TRANSPOSE", "IDENTITY"}
)


@dataclass(frozen=True)
class IdBound:
    """Input `input` holds ids into a table of `size` rows (`layer`: which table, as the user would name it);
    `negative`: ids -size..-1 count from the end, as Keras 3's Embedding takes them (it wraps them itself)."""

    input: str
    size: int
    layer: str
    negative: bool = False

    @property
    def lowest(self) -> int:
        return -self.size if self.negative else 0


def trace_input(start, step: Callable[[object], object | None], is_input: Callable[[object], str | None]):
    """The model input `start` is read from, walking `step` (the one value-keeping producer, or None) back:
    the input's name, or None when the walk meets anything else. Bounded, so a cycle cannot hang it."""
    node = start
    for _ in range(64):
        name = is_input(node)
        if name is not None:
            return name
        node = step(node)
        if node is None:
            return None
    return None


def tightest(bounds: Iterable[IdBound]) -> list[IdBound]:
    """One bound per input: the smallest table its ids index (an id must fit every table it reaches)."""
    best: dict[str, IdBound] = {}
    for b in bounds:
        if b.size > 0 and (b.input not in best or b.size < best[b.input].size):
            best[b.input] = b
    return list(best.values())


# ---------------------------------------------------------------------------------------------- Keras


def _inbound(layer: dict) -> list[str]:
    """The layer names a Keras layer's first call reads as its first argument (Keras 2 and Keras 3 forms)."""
    nodes = layer.get("inbound_nodes") or []
    if not nodes:
        return []
    node = nodes[0]
    if isinstance(node, dict):  # Keras 3: {"args": [keras tensor, ...], "kwargs": {...}}
        args = node.get("args") or []
        first = args[0] if args else None
        history = first.get("config", {}).get("keras_history") if isinstance(first, dict) else None
        return [history[0]] if isinstance(history, list) and history else []
    if isinstance(node, list) and node and isinstance(node[0], list) and node[0]:  # Keras 2: [[name, i, j, {}]]
        return [node[0][0]] if isinstance(node[0][0], str) else []
    return []


def _keeps_ids(layer: dict) -> bool:
    cls = layer.get("class_name")
    if cls == "TFOpLambda":
        return (layer.get("config") or {}).get("function") in KERAS_OP_FUNCTIONS
    return cls in KERAS_KEEPS_IDS


def keras_bounds(config: dict | None, keras3: bool = False) -> list[IdBound]:
    """Each Embedding's input_dim, for the model input its ids come from (a functional or Sequential model's
    stored config; nested models are not entered); `keras3`: the file is Keras 3's, whose Embedding also takes
    ids counted from the end. [] where the config does not say."""
    try:
        body = config["config"]
        layers = body["layers"]
        if config.get("class_name") == "Sequential" or not body.get("input_layers"):
            found = _sequential(layers)
        else:
            found = _functional(layers, body)
    except (KeyError, IndexError, TypeError, AttributeError):
        return []
    return [IdBound(b.input, b.size, b.layer, keras3) for b in found]


def _input_dim(layer: dict) -> int | None:
    if layer.get("class_name") != "Embedding":
        return None
    dim = (layer.get("config") or {}).get("input_dim")
    return int(dim) if isinstance(dim, int) and dim > 0 else None


def _functional(layers: list, body: dict) -> list[IdBound]:
    by_name = {layer.get("name") or layer["config"]["name"]: layer for layer in layers}
    inputs = {o[0] if isinstance(o, list) else o for o in body["input_layers"]}

    def step(n):
        up = by_name.get(n)
        src = _inbound(up) if up is not None and _keeps_ids(up) else []
        return src[0] if src else None

    out = []
    for name, layer in by_name.items():
        dim = _input_dim(layer)
        start = _inbound(layer)
        if dim is None or not start:
            continue
        found = trace_input(start[0], step, lambda n: n if n in inputs else None)
        if found is not None:
            out.append(IdBound(found, dim, f"Embedding {name!r}"))
    return tightest(out)


def _sequential(layers: list) -> list[IdBound]:
    """A Sequential model has one input: the first Embedding counts when only id-keeping layers precede it."""
    first = layers[0]
    name = (first.get("config") or {}).get("name", "input")
    for layer in layers:
        if layer.get("class_name") == "InputLayer":
            continue
        dim = _input_dim(layer)
        if dim is not None:
            return [IdBound(name, dim, f"Embedding {layer['config'].get('name')!r}")]
        if not _keeps_ids(layer):
            return []
    return []


# ---------------------------------------------------------------------------------------------- .tflite


def _operands(sg, op) -> tuple[int, int] | None:
    """(index tensor, table tensor) of an embedding read: GATHER on axis 0, EMBEDDING_LOOKUP, or GATHER_ND with
    one index per row."""
    if len(op.inputs) < 2:
        return None
    if op.name == "EMBEDDING_LOOKUP":
        return op.inputs[0], op.inputs[1]
    if op.name == "GATHER":
        opts = op.options
        flat = int(opts.get("axis", 0) or 0) == 0 and int(opts.get("batch_dims", 0) or 0) == 0
        return (op.inputs[1], op.inputs[0]) if flat else None
    if op.name == "GATHER_ND":
        ids = op.inputs[1]
        shape = sg.tensors[ids].shape if ids >= 0 else ()
        return (ids, op.inputs[0]) if shape and shape[-1] == 1 else None
    return None


def _table(sg, op) -> tuple[int, int] | None:
    """(index tensor, table rows) of an embedding read (`_operands`) whose table is a constant."""
    found = _operands(sg, op)
    if found is None:
        return None
    ids, table = found
    if table < 0 or ids < 0 or not sg.tensors[table].is_const or not sg.tensors[table].shape:
        return None
    return ids, int(sg.tensors[table].shape[0])


def _wrapped(sg, op) -> int | None:
    """The ids of Keras 3's negative-index wrap, SELECT(ids < 0, ids + rows, ids): a non-negative id passes
    unchanged (and a negative one is refused before it gets there)."""
    _, plus, ids = op.inputs
    add = sg.ops[sg.producer[plus]] if plus in sg.producer else None
    return ids if add is not None and add.name == "ADD" and ids in add.inputs else None


def tflite_bounds(m) -> list[IdBound]:
    """The rows of each embedding table a model input indexes, by the input's signature name (`m`: the model
    parsed, `tflite.read_model`)."""
    sg = m.main
    names = {i: sg.tensors[i].name for i in sg.inputs}
    sig = next((s for s in m.signatures if s.subgraph == 0 and s.inputs), None)
    if sig is not None:
        names = {t: n for n, t in sig.inputs}

    def step(t):
        op = sg.ops[sg.producer[t]] if t in sg.producer else None
        if op is not None and op.name in ("SELECT", "SELECT_V2") and len(op.inputs) == 3:
            return _wrapped(sg, op)
        return op.inputs[0] if op is not None and op.name in TFLITE_KEEPS_IDS and op.inputs else None

    out = []
    for op in sg.ops:
        found = _table(sg, op)
        if found is None:
            continue
        ids, rows = found
        wraps: list[bool] = []  # whether the walk went through Keras 3's negative-id wrap

        def walk(t, wraps=wraps):
            op = sg.ops[sg.producer[t]] if t in sg.producer else None
            if op is not None and op.name in ("SELECT", "SELECT_V2"):
                wraps.append(True)
            return step(t)

        name = trace_input(ids, walk, names.get)
        if name is not None:
            table = sg.tensors[op.inputs[1 if op.name == "EMBEDDING_LOOKUP" else 0]].name
            out.append(IdBound(name, rows, f"{op.name} table {table!r}", bool(wraps)))
    return tightest(out)

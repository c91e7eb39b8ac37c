"""A PyTorch or ONNX model's integer inputs, fitted before it is converted: ids stored as floats cast to the
input's integer type (whole numbers) or refused, and ids beyond the embedding they index refused, naming the
input and the bound. Converting traces the model on a sample and the source runtime runs it for the
conversion's error: an id stored as float32 ended there in a traceback, an id beyond the table in "index out of
range". The bounds are read from the source graph (`optimize.models.vocabulary` reads a .tflite's):

    .pt2    each aten.embedding's weight (its first dimension), for the user input its indices come from
    .onnx   each Gather on axis 0 of a constant table (an initializer or a Constant node), likewise
"""

from __future__ import annotations

from optimize.models.data import Dataset, check_ids, integer_ids
from optimize.models.vocabulary import IdBound, tightest, trace_input

#: aten ops (by name, without the overload) that pass an index's values on unchanged.
ATEN_KEEPS_IDS = frozenset(
    {"view", "reshape", "_to_copy", "to", "unsqueeze", "squeeze", "clone", "contiguous", "slice", "alias", "flatten"}
)
#: ONNX ops that pass an index's values on unchanged.
ONNX_KEEPS_IDS = frozenset({"Cast", "Reshape", "Unsqueeze", "Squeeze", "Identity", "Flatten", "Slice", "Transpose"})


def fit(declared: list, bounds: list[IdBound], ds: Dataset | None, signature_name) -> tuple[Dataset | None, list[str]]:
    """The data fitted to a PyTorch or ONNX source's declared inputs (`declared`: name and dtype each) and the
    vocabularies its graph says its id inputs index (`bounds`: `onnx_bounds`, `pt2_bounds`), before conversion;
    and the notes to say (`say_once`: the conversion runs with logging silenced). `signature_name` gives an
    input's name in the .tflite (the data may key it so)."""
    if ds is None:
        return None, []
    types: dict[str, str] = {}
    for d in declared:
        types[d.name] = d.dtype
        types.setdefault(signature_name(d.name), d.dtype)  # data keyed by the .tflite's name for it
    ds, notes = integer_ids(ds, types, single=len(declared) == 1)
    named = []
    for b in bounds:  # the data may key an input by its signature name
        named.append(b)
        if signature_name(b.input) != b.input:
            named.append(IdBound(signature_name(b.input), b.size, b.layer))
    check_ids(ds, named, len(declared))
    return ds, notes


def pt2_bounds(ep) -> list[IdBound]:
    """Each aten.embedding's table rows, for the user input its indices are read from."""
    users = {s.arg.name: s.arg.name for s in ep.graph_signature.input_specs if s.kind.name == "USER_INPUT"}
    params = dict(getattr(ep.graph_signature, "inputs_to_parameters", {}) or {})  # placeholder -> "emb.weight"

    def step(node):
        if getattr(node, "op", None) != "call_function" or not node.args:
            return None
        name = getattr(node.target, "__name__", str(node.target)).split(".")[0]
        return node.args[0] if name in ATEN_KEEPS_IDS else None

    def is_input(node):
        return users.get(node.name) if getattr(node, "op", None) == "placeholder" else None

    out = []
    for node in ep.graph.nodes:
        if node.op != "call_function" or "embedding" != getattr(node.target, "__name__", "").split(".")[0]:
            continue
        weight, ids = node.args[0], node.args[1]
        val = weight.meta.get("val") if hasattr(weight, "meta") else None
        if val is None or not len(val.shape):
            continue
        found = trace_input(ids, step, is_input)
        if found is not None:
            out.append(IdBound(found, int(val.shape[0]), f"the embedding {params.get(weight.name, weight.name)!r}"))
    return tightest(out)


def _onnx_tables(g) -> tuple[dict[str, tuple], dict[str, object]]:
    """(constant name -> dims, for initializers and Constant nodes; tensor name -> the node writing it)."""
    tables = {t.name: tuple(t.dims) for t in g.initializer}
    producer = {}
    for n in g.node:
        for o in n.output:
            producer[o] = n
        value = next((a.t for a in n.attribute if a.name == "value" and a.HasField("t")), None)
        if n.op_type == "Constant" and value is not None:
            tables[n.output[0]] = tuple(value.dims)
    return tables, producer


def _gather_table(n, tables: dict) -> tuple | None:
    """The dims of the constant table an ONNX Gather reads on axis 0, or None."""
    if n.op_type != "Gather" or len(n.input) < 2 or n.input[0] not in tables:
        return None
    axis = next((a.i for a in n.attribute if a.name == "axis"), 0)
    return tables[n.input[0]] if axis == 0 and tables[n.input[0]] else None


def onnx_bounds(model) -> list[IdBound]:
    """Each Gather (axis 0) of a constant table: its rows, for the graph input its indices are read from."""
    g = model.graph
    tables, producer = _onnx_tables(g)
    inputs = {i.name for i in g.input} - set(tables)

    def step(name):
        n = producer.get(name)
        return n.input[0] if n is not None and n.op_type in ONNX_KEEPS_IDS and n.input else None

    out = []
    for n in g.node:
        dims = _gather_table(n, tables)
        found = trace_input(n.input[1], step, lambda name: name if name in inputs else None) if dims else None
        if found is not None:
            out.append(IdBound(found, int(dims[0]), f"the Gather table {n.input[0]!r}"))
    return tightest(out)

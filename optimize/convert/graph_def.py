"""A TF1 frozen graph (a `.pb` GraphDef, variables folded into constants) in: read once and checked before
TensorFlow sees it, converted at the door by the TF1 converter (`tf.compat.v1.lite.TFLiteConverter
.from_frozen_graph`) to one float `.tflite`, which every scheme then takes as it takes a converted PyTorch
or ONNX model. Its conversion's error is measured against TensorFlow running the graph itself.

Inputs are the graph's placeholders and outputs the nodes nothing consumes that depend on an input (a
summary or a save op is not an output), unless `GraphIO` names them. An input's free dimensions are fixed
from the data (batch 1, as every converted model); the .tflite keeps the placeholders' names (cleaned as
`plan.signature_name` cleans any) and the output nodes' names, in a serving_default signature.

Checked before anything else reads the graph, each in one line: the file parses as a GraphDef (a SavedModel's
`saved_model.pb` is named as one), it is frozen (no variables), it holds at most `limits.MAX_FILE_NODES`
nodes, and no constant declares more than `limits.MAX_TENSOR_BYTES` (a splat value with a huge shape expands
when TensorFlow imports it) or all of them together more than `limits.MAX_MODEL_BYTES`.
"""

from __future__ import annotations

import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from optimize.convert import conversions
from optimize.convert.limits import MAX_FILE_NODES, MAX_MODEL_BYTES, MAX_TENSOR_BYTES, shown
from optimize.convert.plan import Declared, Plan
from optimize.convert.route import DoorSource
from optimize.core.errors import ModelError
from optimize.core.results import Conversion
from optimize.models import _tf
from optimize.models.spec import ModelSource, fingerprint_of

#: Ops whose values leave the graph without being a model output (bookkeeping, checks, summaries, saving).
NOT_OUTPUTS = frozenset(
    {
        "NoOp", "Assert", "Print", "PrintV2", "SaveV2", "RestoreV2", "Save", "Restore", "MergeSummary",
        "ScalarSummary", "HistogramSummary", "ImageSummary", "AudioSummary", "TensorSummary", "TensorSummaryV2",
        "WriteSummary", "Const", "Placeholder", "PlaceholderWithDefault",
    }
)  # fmt: skip
#: Ops a frozen graph has none of: its weights are constants.
VARIABLES = frozenset({"Variable", "VariableV2", "VarHandleOp", "ReadVariableOp", "AssignVariableOp", "Assign"})
FIX = "Freeze the graph (tf.compat.v1.graph_util.convert_variables_to_constants), or pass the SavedModel folder."


@dataclass(frozen=True)
class GraphIO:
    """The nodes a graph is read from and to (None: its placeholders / its outputs, found in the graph)."""

    inputs: tuple[str, ...] | None = None
    outputs: tuple[str, ...] | None = None


def is_graph_def(p: Path) -> bool:
    """A `.pb` file that is not a SavedModel's (those are opened as their folder)."""
    return p.suffix.lower() == ".pb" and p.is_file()


class FrozenGraph(DoorSource):
    """A frozen GraphDef, read and checked once (`open`), with its input and output nodes; the door's route
    (`route.prepare`) converts it like any model converted at the door."""

    images = ""  # a TensorFlow graph takes its images NHWC already

    def __init__(self, src: ModelSource, graph, inputs: list[str], outputs: list[str]):
        super().__init__(src)
        self.graph = graph
        self.input_nodes = inputs
        self.output_nodes = outputs

    @classmethod
    def open(cls, p: Path, fingerprint: str, io: GraphIO | None = None) -> FrozenGraph:
        graph = read(p)
        named = io if io is not None and (io.inputs or io.outputs) else None
        inputs, outputs = find_io(graph, named or GraphIO(), p.name)
        if named is not None:  # another choice of nodes is another model (and another cache entry)
            fingerprint = fingerprint_of(fingerprint, json.dumps([inputs, outputs]))
        return cls(ModelSource(p, "graphdef", fingerprint), graph, inputs, outputs)

    @classmethod
    def of(cls, src: ModelSource) -> FrozenGraph:
        """A converted graph's object again, read from its file (in a worker too), its nodes as converted."""
        record = src.conversion
        return cls(src, read(src.path), [i.name for i in record.inputs], list(record.outputs))

    def declared(self) -> list[Declared]:
        """Each input placeholder's name, dims (None where free) and dtype."""
        tf = _tf.tf()
        nodes = {n.name: n for n in self.graph.node}
        out = []
        for name in self.input_nodes:
            attr = nodes[name].attr
            shape = attr["shape"].shape if "shape" in attr else None
            dims = (
                None
                if shape is None or shape.unknown_rank
                else tuple(d.size if d.size >= 0 else None for d in shape.dim)
            )
            dtype = tf.dtypes.as_dtype(attr["dtype"].type).name if "dtype" in attr else "float32"
            out.append(Declared(name, dims, dtype))
        return out

    def converted(self, plan: Plan, key: str) -> tuple[bytes, Conversion]:
        """The float .tflite from the TF1 converter (the inputs at the plan's shapes) with a serving_default
        signature by the inputs' and outputs' names, and the record of how it was made, kept under `key`."""
        from optimize.models.normalize import named_signature
        from optimize.models.runtime import captured_stderr
        from optimize.models.spec import tflite_io

        tf = _tf.tf()
        t0 = time.perf_counter()
        shapes = {i.name: list(i.source_shape) for i in plan.inputs}
        with tempfile.TemporaryDirectory(prefix="optimize-graph-") as tmp, captured_stderr() as log:
            path = Path(tmp) / "graph.pb"
            path.write_bytes(self.graph.SerializeToString())  # the bytes checked here, not the file again
            try:
                converter = tf.compat.v1.lite.TFLiteConverter.from_frozen_graph(
                    str(path), [i.name for i in plan.inputs], self.output_nodes, shapes
                )
                flat = converter.convert()
            except Exception as e:  # noqa: BLE001 - the converter raises many types; each is this graph's
                raise ModelError(f"The TF1 converter could not convert {self.name}: {_first(e, log)}.", FIX) from None
        content = named_signature(flat, [i.key for i in plan.inputs], list(self.output_nodes))
        specs, _ = tflite_io(content)
        by_key = {s.name: s for s in specs}
        inputs = [
            i.model_copy(update={"shape": list(by_key[i.key].shape) if i.key in by_key else []}) for i in plan.inputs
        ]
        record = Conversion(
            source="graphdef", file=self.name, route=f"TFLiteConverter.from_frozen_graph (TensorFlow {tf.__version__})",
            layout=str(plan.layout), inputs=inputs, outputs=list(self.output_nodes), frozen=dict(plan.frozen),
            facts=list(plan.facts), seconds={"convert": round(time.perf_counter() - t0, 3)},
        )  # fmt: skip
        conversions.store(key, content, record)
        return content, record

    def reference(self, record: Conversion, feeds: list[dict]) -> tuple[str, list[list]]:
        """TensorFlow running the graph itself on each sample (its placeholders fed by name)."""
        tf = _tf.tf()
        tf1 = tf.compat.v1
        out = []
        with tf.Graph().as_default() as g:
            tf1.import_graph_def(self.graph, name="")
            fetches = [g.get_tensor_by_name(f"{o}:0") for o in record.outputs]
            with tf1.Session(graph=g) as sess:
                for sample in feeds:
                    out.append(sess.run(fetches, {g.get_tensor_by_name(f"{n}:0"): v for n, v in sample.items()}))
        return f"TensorFlow {tf.__version__} running {self.name}", out


def _first(e: BaseException, log: list[str]) -> str:
    """The converter's reason in one line: its `error:` line when it logged one, else the exception's first."""
    said = [ln.split("error:", 1)[1].strip() for ln in log if "error:" in ln]
    text = said[0] if said else next((ln.strip() for ln in str(e).splitlines() if ln.strip()), type(e).__name__)
    return text[:240]


def read(p: Path):
    """The GraphDef in the file, read once (bounded) and checked before TensorFlow sees it."""
    from optimize.core.paths import read_bounded

    _tf.tf()
    from tensorflow.core.framework import graph_pb2
    from tensorflow.core.protobuf import saved_model_pb2

    data = read_bounded(p, "model", ModelError)
    graph = graph_pb2.GraphDef()
    try:
        graph.ParseFromString(data)
    except Exception:  # noqa: BLE001 - DecodeError, or a message nested too deep: not a GraphDef
        graph = None
    if graph is None or not graph.node:
        saved = saved_model_pb2.SavedModel()
        try:
            is_saved = bool(saved.ParseFromString(data) and saved.meta_graphs)
        except Exception:  # noqa: BLE001 - not a SavedModel either
            is_saved = False
        if is_saved:
            raise ModelError(f"{p.name} is a SavedModel's saved_model.pb.", f"Pass its folder ({p.parent}).")
        raise ModelError(f"{p.name} is not a TensorFlow GraphDef (a frozen graph .pb).", "Pass the frozen graph's .pb.")
    check(graph, p.name)
    return graph


def check(graph, name: str) -> None:
    """A frozen graph within the bounds, each refusal one line naming the node."""
    nodes = list(graph.node) + [n for f in graph.library.function for n in f.node_def]
    if len(nodes) > MAX_FILE_NODES:
        raise ModelError(
            f"{name} holds {len(nodes):,} nodes; optimize reads at most {MAX_FILE_NODES:,}.", "Pass a smaller graph."
        )
    variables = [n.name for n in nodes if n.op in VARIABLES]
    if variables:
        raise ModelError(
            f"{name} is not frozen: it holds {len(variables)} variable(s) ({shown(variables[0])} ...) whose values "
            "are not in the graph.",
            FIX,
        )
    total = 0
    for n in nodes:
        if n.op == "Const" and "value" in n.attr:
            size = _tensor_bytes(n.attr["value"].tensor)
            if size > MAX_TENSOR_BYTES:
                raise ModelError(
                    f"{name}: constant {shown(n.name)} declares {size:,} bytes; optimize reads at most "
                    f"{MAX_TENSOR_BYTES:,} per tensor.",
                    "Pass a graph whose constants hold what they declare.",
                )
            total += size
    if total > MAX_MODEL_BYTES:
        raise ModelError(
            f"{name}: its constants declare {total:,} bytes; at most {MAX_MODEL_BYTES:,}.", "Pass a smaller graph."
        )


def _tensor_bytes(t) -> int:
    """What a TensorProto expands to: its dims' product times its type's size (a splat value is small on disk)."""
    dims = [d.size for d in t.tensor_shape.dim]
    if any(d < 0 for d in dims):
        return 0
    itemsize = {1: 4, 2: 8, 3: 4, 4: 1, 5: 2, 6: 1, 7: 0, 9: 8, 10: 1, 14: 2, 17: 2, 19: 2, 22: 4, 23: 8}.get(
        t.dtype, 8
    )
    return int(np.prod(dims, dtype=np.float64)) * itemsize


def _consumers(graph) -> dict[str, set[str]]:
    """node -> the nodes that read one of its outputs as data (control inputs, `^name`, do not count)."""
    out: dict[str, set[str]] = {n.name: set() for n in graph.node}
    for n in graph.node:
        for i in n.input:
            if not i.startswith("^"):
                out.setdefault(i.split(":")[0], set()).add(n.name)
    return out


def find_io(graph, io: GraphIO, name: str) -> tuple[list[str], list[str]]:
    """(input placeholders, output nodes): as `io` names them, each checked to be in the graph, else found."""
    nodes = {n.name: n for n in graph.node}
    inputs = list(io.inputs) if io.inputs else [n.name for n in graph.node if n.op == "Placeholder"]
    missing = [n for n in (*inputs, *(io.outputs or ())) if n not in nodes]
    if missing:
        raise ModelError(
            f"{name} has no node {shown(missing[0])}.", "Name nodes of the graph (its placeholders, its outputs)."
        )
    if not inputs:
        raise ModelError(f"{name} has no Placeholder to feed.", "Name the input nodes with --graph-inputs.")
    outputs = list(io.outputs) if io.outputs else _sinks(graph, inputs)
    if not outputs:
        raise ModelError(
            f"{name}: no node depends on its inputs ({', '.join(map(shown, inputs))}).",
            "Name the output nodes with --graph-outputs.",
        )
    return inputs, outputs


def _sinks(graph, inputs: list[str]) -> list[str]:
    """The nodes that depend on an input and whose values nothing reads (in graph order), bookkeeping aside."""
    consumers = _consumers(graph)
    reached, todo = set(inputs), list(inputs)
    while todo:
        for c in consumers.get(todo.pop(), ()):
            if c not in reached:
                reached.add(c)
                todo.append(c)
    return [n.name for n in graph.node if n.name in reached and not consumers.get(n.name) and n.op not in NOT_OUTPUTS]

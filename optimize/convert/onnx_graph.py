"""ONNX graphs as exporters really write them, made static so a graph-to-PyTorch converter can take them.

Real files from pip wheels (paddle2onnx, spox, old torch exporters) hold weights in `Constant` nodes, leave
every dimension free, compute shapes at run time (Shape -> Gather -> Concat -> Reshape) and branch on values
that are constant once the input shapes and a few configuration inputs are known (silero-vad's
`If(sr == 16000)`). `normalize` turns such a graph into a static one:

1. configuration inputs the caller freezes (a sample rate) become initializers;
2. every free input dimension is fixed from the data;
3. `Constant` nodes become initializers;
4. constants are folded to a fixed point, with shape inference between rounds: nodes whose inputs are all
   constant are evaluated (onnx's numpy reference evaluator), `Shape`/`Size` of statically shaped values
   become constants, and an `If` whose condition is constant is replaced by the branch it takes;
5. Identity and dead nodes, unused initializers and stale value_info are dropped;
6. exporter idioms are fused into the ops they spell (Conv + BatchNormalization, Conv + bias Add,
   x * clip(x + 3, 0, 6) / 6 and x * hardsigmoid(x) into HardSwish).

Nothing here runs code from the model file: ONNX is protobuf, evaluation is numpy. Every change is one
line in `Normalized.facts`. This module needs the `onnx` package (the torch extra): the front door imports
it only for an ONNX model.
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import AttributeProto, GraphProto, ModelProto, NodeProto, TensorProto, helper, numpy_helper, shape_inference

from optimize.convert.onnx_checks import fold_bytes
from optimize.core.shown import named

#: Ops never folded even when their inputs are constant (random).
NO_FOLD = {"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial", "Bernoulli"}
#: Folding that makes a tensor bigger than this (bytes) and bigger than its inputs is skipped (ConstantOfShape,
#: Expand and Tile would bloat the file).
MAX_FOLD_GROWTH = 1 << 20
MAX_ROUNDS = 50
OWN_DOMAIN = "optimize"  # ops our fusion writes into graphs whose opset predates them (HardSwish < 14)
ONNX_DOMAINS = ("", "ai.onnx")


@dataclass
class Normalized:
    """The static graph, and what normalising changed (one line each)."""

    model: ModelProto
    facts: list[str] = field(default_factory=list)


class NormalizeError(ValueError):
    """The graph cannot be made static (a dimension no data fixes, an input of the wrong rank)."""


# ----------------------------------------------------------------------------------------------- helpers


class Consts:
    """Initializers by name, each turned into an array only when asked for (once): a pass reading a few
    constants costs what it reads, not every weight of the model."""

    def __init__(self, tensors):
        self._protos = {t.name: t for t in tensors}
        self._arrays: dict[str, np.ndarray] = {}

    def __contains__(self, name) -> bool:
        return name in self._arrays or name in self._protos

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self._arrays:
            self._arrays[name] = numpy_helper.to_array(self._protos[name])
        return self._arrays[name]

    def __setitem__(self, name: str, value: np.ndarray) -> None:
        self._arrays[name] = value

    def get(self, name: str, default=None):
        return self[name] if name in self else default


def _const_attr_value(node: NodeProto) -> np.ndarray:
    """The value of a Constant node, whichever attribute holds it."""
    a = node.attribute[0]
    values = {
        "value": lambda: numpy_helper.to_array(a.t),
        "value_float": lambda: np.array(a.f, np.float32),
        "value_floats": lambda: np.array(list(a.floats), np.float32),
        "value_int": lambda: np.array(a.i, np.int64),
        "value_ints": lambda: np.array(list(a.ints), np.int64),
    }
    if a.name not in values:
        raise NormalizeError(f"Constant node {node.name or node.output[0]!r} holds a {a.name}, which is not supported")
    return values[a.name]()


def subgraphs(node: NodeProto):
    """The graphs a node holds (If branches, Loop and Scan bodies)."""
    for a in node.attribute:
        if a.type == AttributeProto.GRAPH:
            yield a.g
        elif a.type == AttributeProto.GRAPHS:
            yield from a.graphs


def _used_names(graph: GraphProto) -> set[str]:
    """Every value name a graph reads, including outer-scope names read inside its subgraphs."""
    used = set()
    for n in graph.node:
        used.update(i for i in n.input if i)
        for g in subgraphs(n):
            used |= _used_names(g)
    used.update(o.name for o in graph.output)
    return used


def _rename_inputs(graph: GraphProto, mapping: dict[str, str], outputs: bool = True) -> None:
    """Rename the values a graph (and its subgraphs) reads."""
    for n in graph.node:
        for k, i in enumerate(n.input):
            if i in mapping:
                n.input[k] = mapping[i]
        for g in subgraphs(n):
            _rename_inputs(g, mapping)
    for o in graph.output if outputs else ():
        if o.name in mapping:
            o.name = mapping[o.name]


def static_shape(vi: onnx.ValueInfoProto) -> tuple[int, ...] | None:
    """A value's shape when every dimension is a known positive number, else None."""
    t = vi.type.tensor_type
    if not t.HasField("shape"):
        return None
    dims = [d.dim_value if d.HasField("dim_value") and d.dim_value >= 0 else None for d in t.shape.dim]
    return None if any(d is None for d in dims) else tuple(dims)


def _set_shape(vi: onnx.ValueInfoProto, shape) -> None:
    t = vi.type.tensor_type
    t.ClearField("shape")
    t.shape.SetInParent()
    for s in shape:
        t.shape.dim.add().dim_value = int(s)


def shape_words(dims) -> str:
    """`[batch, 3, ?, ?]`: an input's declared dimensions as its file names them."""
    return (
        "["
        + ", ".join(named(d.dim_param) if d.dim_param else (str(d.dim_value) if d.dim_value > 0 else "?") for d in dims)
        + "]"
    )


def _eval_node(node: NodeProto, inputs: dict[str, np.ndarray], opset: list) -> list[np.ndarray]:
    """One node on constant inputs, by onnx's numpy reference implementation."""
    from onnx.reference import ReferenceEvaluator

    ins = [
        helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape) for n, v in inputs.items()
    ]
    outs = [helper.make_empty_tensor_value_info(o) for o in node.output if o]
    m = helper.make_model(helper.make_graph([node], "fold", ins, outs), opset_imports=opset)
    m.ir_version = min(m.ir_version, 10)
    return [np.asarray(r) for r in ReferenceEvaluator(m).run(None, inputs)]


# ----------------------------------------------------------------------------------------------- inputs


def declared_inputs(model: ModelProto) -> list[onnx.ValueInfoProto]:
    """The graph's real inputs (IR < 4 files also list their initializers as inputs)."""
    inits = {i.name for i in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in inits]


def drop_initializer_inputs(model: ModelProto, facts: list[str]) -> None:
    g = model.graph
    inits = {i.name for i in g.initializer}
    extra = [i for i in g.input if i.name in inits]
    for vi in extra:
        g.input.remove(vi)
    if extra:
        facts.append(f"{len(extra)} initializers listed as inputs are weights, not inputs")
        # IR 4 is the first that lets an initializer not be a graph input: below it, shape inference ignores
        # such initializers and every shape downstream stays unknown
        model.ir_version = max(model.ir_version, 4)


def freeze_inputs(model: ModelProto, values: dict[str, np.ndarray], facts: list[str]) -> None:
    """Turn the named graph inputs into initializers holding `values` (e.g. silero-vad's sample rate)."""
    g = model.graph
    for name, value in values.items():
        match = [i for i in g.input if i.name == name]
        if not match:
            raise NormalizeError(f"cannot freeze input {name!r}: the model has no such input")
        vi = match[0]
        dtype = helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type)
        arr = np.asarray(value).astype(dtype).reshape([d.dim_value for d in vi.type.tensor_type.shape.dim] or ())
        g.input.remove(vi)
        g.initializer.append(numpy_helper.from_array(arr, name))
        facts.append(f"input {named(name)} frozen to {arr.tolist() if arr.size <= 4 else arr.shape}")


def fix_input_shapes(model: ModelProto, shapes: dict[str, tuple[int, ...]], facts: list[str]) -> None:
    """Set every input's dimensions from the data; a free dimension the data does not fix is an error."""
    for vi in declared_inputs(model):
        dims = vi.type.tensor_type.shape.dim
        want = _wanted_shape(vi, shapes)
        if want is None:
            continue
        if any(not (d.HasField("dim_value") and d.dim_value > 0) for d in dims) or not dims:
            facts.append(f"input {named(vi.name)} {shape_words(dims)} fixed to {list(want)}")
        _set_shape(vi, want)


def _wanted_shape(vi: onnx.ValueInfoProto, shapes: dict[str, tuple[int, ...]]) -> tuple[int, ...] | None:
    """The shape the data gives an input (None: none given, and its declared dims are all fixed)."""
    dims = vi.type.tensor_type.shape.dim
    declared = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None for d in dims]
    if vi.name not in shapes:
        if any(d is None for d in declared):
            raise NormalizeError(
                f"input {named(vi.name)} has free dimensions {shape_words(dims)}: pass data for it to fix them"
            )
        return None
    want = tuple(int(s) for s in shapes[vi.name])
    if declared and len(declared) != len(want):
        raise NormalizeError(f"input {named(vi.name)} has rank {len(declared)}, the data's samples {want}")
    if any(d is not None and d != w for d, w in zip(declared, want)):
        raise NormalizeError(f"input {named(vi.name)} has shape {shape_words(dims)}, the data's samples {want}")
    return want


# ----------------------------------------------------------------------------------------------- folding


def constants_to_initializers(graph: GraphProto) -> int:
    """Move `Constant` nodes' values into initializers (top level: branches are inlined first)."""
    keep, moved = [], 0
    for n in graph.node:
        if (
            n.op_type == "Constant"
            and n.domain in ONNX_DOMAINS
            and n.attribute
            and n.attribute[0].name != "sparse_value"
        ):
            graph.initializer.append(numpy_helper.from_array(_const_attr_value(n), n.output[0]))
            moved += 1
        else:
            keep.append(n)
    del graph.node[:]
    graph.node.extend(keep)
    return moved


def _copy_renamed(node: NodeProto, mapping: dict[str, str], name: str) -> NodeProto:
    c = NodeProto()
    c.CopyFrom(node)
    c.name = name
    for k, o in enumerate(c.output):
        if o:
            c.output[k] = mapping[o]
    for k, i in enumerate(c.input):
        if i in mapping:
            c.input[k] = mapping[i]
    for sg in subgraphs(c):
        _rename_inputs(sg, mapping)
    return c


def _inline_if(model: ModelProto, node: NodeProto, cond: bool, counter) -> list[NodeProto]:
    """The nodes of the branch an `If` takes, renamed so they cannot clash, writing the If's outputs."""
    branch = next(a.g for a in node.attribute if a.name == ("then_branch" if cond else "else_branch"))
    prefix = f"if{next(counter)}{'t' if cond else 'e'}/"
    local = {o for n in branch.node for o in n.output if o} | {i.name for i in branch.initializer}
    mapping = {name: prefix + name for name in local}
    for init in branch.initializer:
        t = TensorProto()
        t.CopyFrom(init)
        t.name = mapping[init.name]
        model.graph.initializer.append(t)
    nodes = [_copy_renamed(n, mapping, prefix + (n.name or f"{n.op_type}_{k}")) for k, n in enumerate(branch.node)]
    for out_vi, if_out in zip(branch.output, node.output):
        src = mapping.get(out_vi.name, out_vi.name)
        nodes.append(helper.make_node("Identity", [src], [if_out], name=prefix + "out_" + if_out))
    return nodes


def _topological(graph: GraphProto) -> None:
    """Sort nodes so each follows the producers of what it reads (inlined branches may read later values)."""
    produced_by = {o: k for k, n in enumerate(graph.node) for o in n.output if o}

    def deps(k: int) -> list[int]:
        n = graph.node[k]
        names = {i for i in n.input if i}
        for sg in subgraphs(n):
            names |= _used_names(sg)
        return [produced_by[x] for x in names if x in produced_by]

    done: set[int] = set()
    order: list[int] = []
    for start in range(len(graph.node)):
        stack = [(start, iter(deps(start)))] if start not in done else []
        seen = {start}
        while stack:
            cur, it = stack[-1]
            nxt = next((d for d in it if d not in done and d not in seen), None)
            if nxt is None:
                stack.pop()
                if cur not in done:
                    done.add(cur)
                    order.append(cur)
            else:
                seen.add(nxt)
                stack.append((nxt, iter(deps(nxt))))
    nodes = [graph.node[k] for k in order]
    del graph.node[:]
    graph.node.extend(nodes)


def infer(model: ModelProto) -> ModelProto:
    """Shape inference from scratch (stale value_info with an exporter's dimension names would conflict)."""
    del model.graph.value_info[:]
    for o in model.graph.output:
        o.type.tensor_type.ClearField("shape")
    try:
        return shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    except Exception:  # noqa: BLE001 - inference helps folding; folding goes on without it
        return model


def _shape_value(n: NodeProto, shp: tuple[int, ...]) -> np.ndarray:
    """What a Shape (with its start/end) or Size node gives for a value of static shape `shp`."""
    if n.op_type == "Size":
        return np.array(int(np.prod(shp)), np.int64)
    attrs = {a.name: a.i for a in n.attribute}
    r = len(shp)
    s, e = attrs.get("start", 0), attrs.get("end", r)
    s, e = (s + r if s < 0 else s), (e + r if e < 0 else e)
    return np.array(shp[max(0, min(s, r)) : max(0, min(e, r))], np.int64)


class _Round:
    """One folding pass over the top-level graph: what it replaced, and the nodes that stay."""

    def __init__(self, model: ModelProto, counter, counts: Counter):
        self.model, self.counter, self.counts = model, counter, counts
        g = model.graph
        self.const = Consts(g.initializer)
        self.vinfo = {v.name: v for v in itertools.chain(g.input, g.value_info, g.output)}
        self.opset = list(model.opset_import)
        self.changed = False
        self.inlined = 0

    def _add(self, name: str, value: np.ndarray) -> None:
        self.model.graph.initializer.append(numpy_helper.from_array(value, name))
        self.const[name] = value

    def node(self, n: NodeProto) -> list[NodeProto]:
        """The nodes that replace `n`: the taken branch of a constant If, nothing for a folded node, or `n`."""
        standard = n.domain in ONNX_DOMAINS
        if standard and n.op_type == "If" and n.input[0] in self.const:
            self.changed, self.inlined = True, self.inlined + 1
            self.counts["If"] += 1
            taken = bool(np.asarray(self.const[n.input[0]]).reshape(-1)[0])
            return _inline_if(self.model, n, taken, self.counter)
        if standard and n.op_type in ("Shape", "Size") and n.input[0] not in self.const:
            vi = self.vinfo.get(n.input[0])
            shp = static_shape(vi) if vi is not None else None
            if shp is not None:
                self._add(n.output[0], _shape_value(n, shp))
                self.changed = True
                self.counts["shape"] += 1
                return []
        if standard and n.op_type not in NO_FOLD and not list(subgraphs(n)) and n.input and self._constant_inputs(n):
            return self._fold(n)
        return [n]

    def _constant_inputs(self, n: NodeProto) -> bool:
        return all(i in self.const or i == "" for i in n.input)

    def _fold(self, n: NodeProto) -> list[NodeProto]:
        ins = {i: self.const[i] for i in n.input if i}
        # what the node would make, bounded before numpy is asked to make it (ConstantOfShape([2**40]))
        size = fold_bytes(n, ins, self.vinfo)
        if size is None or (size > MAX_FOLD_GROWTH and size > sum(v.nbytes for v in ins.values())):
            return [n]
        try:
            outs = _eval_node(n, ins, self.opset)
        except Exception:  # noqa: BLE001 - a node the reference evaluator cannot run stays as it is
            return [n]
        grown = sum(o.nbytes for o in outs)
        if grown > MAX_FOLD_GROWTH and grown > sum(v.nbytes for v in ins.values()):
            return [n]
        for name, val in zip([o for o in n.output if o], outs):
            self._add(name, val)
        self.counts["folded:" + n.op_type] += 1
        self.changed = True
        return []


def fold_constants(model: ModelProto, facts: list[str]) -> ModelProto:
    """Fold to a fixed point (see the module docstring); returns the (new) model."""
    counter, counts = itertools.count(), Counter()
    for _ in range(MAX_ROUNDS):
        constants_to_initializers(model.graph)
        model = infer(model)
        step = _Round(model, counter, counts)
        nodes = [m for n in model.graph.node for m in step.node(n)]
        del model.graph.node[:]
        model.graph.node.extend(nodes)
        if step.inlined:
            _topological(model.graph)
        eliminate_dead(model)
        if not step.changed:
            break
    _fold_facts(counts, facts)
    return model


def _fold_facts(counts: Counter, facts: list[str]) -> None:
    if counts["If"]:
        facts.append(f"{counts['If']} If node(s) with a constant condition replaced by the branch taken")
    if counts["shape"]:
        facts.append(f"{counts['shape']} Shape/Size node(s) of static values made constants")
    folded = Counter({k.split(":", 1)[1]: v for k, v in counts.items() if k.startswith("folded:")})
    if folded:
        top = ", ".join(f"{k} {v}" for k, v in folded.most_common(6))
        facts.append(f"{sum(folded.values())} constant node(s) folded ({top})")


# ----------------------------------------------------------------------------------------------- clean-up


def _users(g: GraphProto) -> Counter:
    users = Counter(i for n in g.node for i in n.input)
    for n in g.node:
        for sg in subgraphs(n):
            users.update(_used_names(sg))
    return users


def remove_identities(model: ModelProto) -> int:
    """Bypass Identity nodes (the inlined branches' outputs among them); one writing a graph output has its
    producer write the output directly, when nothing else reads the producer's value."""
    g = model.graph
    outputs = {o.name for o in g.output}
    users = _users(g)
    producer = {o: n for n in g.node for o in n.output}
    mapping, keep = {}, []
    for n in g.node:
        if n.op_type != "Identity":
            keep.append(n)
        elif n.output[0] not in outputs:
            mapping[n.output[0]] = mapping.get(n.input[0], n.input[0])
        elif _writes_output_directly(n, producer, users, outputs, mapping):
            p = producer[n.input[0]]
            p.output[list(p.output).index(n.input[0])] = n.output[0]
        else:
            keep.append(n)
    removed = len(g.node) - len(keep)
    if removed:
        del g.node[:]
        g.node.extend(keep)
        _rename_inputs(g, mapping, outputs=False)
    return removed


def _writes_output_directly(n: NodeProto, producer: dict, users: Counter, outputs: set, mapping: dict) -> bool:
    src = n.input[0]
    return src in producer and users[src] == 1 and src not in outputs and src not in mapping


def eliminate_dead(model: ModelProto) -> None:
    """Drop nodes nothing reads and initializers nothing uses (each initializer once)."""
    g = model.graph
    needed = {o.name for o in g.output}
    keep = []
    for n in reversed(g.node):
        if any(o in needed for o in n.output):
            keep.append(n)
            needed.update(i for i in n.input if i)
            for sg in subgraphs(n):
                needed |= _used_names(sg)
    keep.reverse()
    del g.node[:]
    g.node.extend(keep)
    seen: set[str] = set()
    inits = []
    for i in g.initializer:
        if i.name in needed and i.name not in seen:
            seen.add(i.name)
            inits.append(i)
    del g.initializer[:]
    g.initializer.extend(inits)


# ----------------------------------------------------------------------------------------------- entry point


def normalize(
    model: ModelProto,
    shapes: dict[str, tuple[int, ...]] | None = None,
    freeze: dict[str, np.ndarray] | None = None,
    fuse: bool = True,
) -> Normalized:
    """A static, folded copy of `model` (the input is not changed)."""
    m = ModelProto()
    m.CopyFrom(model)
    facts: list[str] = []
    drop_initializer_inputs(m, facts)
    if freeze:
        freeze_inputs(m, freeze, facts)
    fix_input_shapes(m, shapes or {}, facts)
    n_const = sum(1 for n in m.graph.node if n.op_type == "Constant")
    if n_const:
        facts.append(f"{n_const} Constant node(s) moved into initializers")
    m = fold_constants(m, facts)
    ids = 0
    for _ in range(MAX_ROUNDS):  # a second pass sees output Identities once inner ones are gone
        k = remove_identities(m)
        ids += k
        if not k:
            break
    if ids:
        facts.append(f"{ids} Identity node(s) bypassed")
    eliminate_dead(m)
    m = infer(m)
    if fuse:
        m = _fused(m, facts)
    const_out = [o.name for o in m.graph.output if o.name in {i.name for i in m.graph.initializer}]
    if const_out:
        facts.append(f"outputs {', '.join(const_out)} are constant")
    return Normalized(m, facts)


def _fused(m: ModelProto, facts: list[str]) -> ModelProto:
    """Fusion, keeping the value shapes known before it (inference stops at ops of our own domain)."""
    known = {v.name: v for v in m.graph.value_info}
    fuse_patterns(m, facts)
    m = infer(m)
    have = {v.name for v in itertools.chain(m.graph.value_info, m.graph.input, m.graph.output)}
    produced = {o for n in m.graph.node for o in n.output}
    m.graph.value_info.extend(v for name, v in known.items() if name not in have and name in produced)
    for o in m.graph.output:
        if not o.type.tensor_type.HasField("shape") and o.name in known:
            o.type.CopyFrom(known[o.name].type)
    return m


# ----------------------------------------------------------------------------------------------- fusion


def _scalar(inits: dict, name: str) -> float | None:
    v = inits.get(name)
    return None if v is None or v.size != 1 else float(v.reshape(-1)[0])


def attr(node: NodeProto, name: str, default):
    """A node attribute's value, or `default`."""
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _fold_bn(n: NodeProto, bn: NodeProto, W: np.ndarray, b: np.ndarray, inits: dict, transpose: bool):
    if not all(i in inits for i in bn.input[1:5]) or len([o for o in bn.output if o]) != 1:
        return None
    scale, bias, mean, var = (inits[i].astype(np.float64) for i in bn.input[1:5])
    k = scale / np.sqrt(var + attr(bn, "epsilon", 1e-5))
    shape = (1, -1) + (1,) * (W.ndim - 2) if transpose else (-1,) + (1,) * (W.ndim - 1)
    W2 = W.astype(np.float64) * k.reshape(shape)
    return W2.astype(W.dtype), ((b - mean) * k + bias).astype(W.dtype), f"{n.op_type}+BatchNormalization"


def _fold_bias(n: NodeProto, add: NodeProto, W: np.ndarray, b: np.ndarray, inits: dict, c_out: int):
    other = add.input[1] if add.input[0] == n.output[0] else add.input[0]
    c = inits.get(other)
    # a per-channel constant of shape (C, 1, ..., 1) or (1, C, 1, ..., 1)
    if c is None or c.size != c_out or c.ndim < W.ndim - 1 or any(d != 1 for d in c.shape[-(W.ndim - 2) :]):
        return None
    return W, (b + c.reshape(-1)).astype(W.dtype), f"{n.op_type}+Add(bias)"


def _fold_conv(n: NodeProto, nxt: NodeProto, inits: dict):
    """New (W, b, what) for Conv `n` absorbing its only consumer `nxt` (BatchNormalization or a bias Add)."""
    W = inits.get(n.input[1])
    transpose = n.op_type == "ConvTranspose"
    if W is None or (transpose and attr(n, "group", 1) != 1):
        return None
    # output channels: Conv weights are (C_out, C_in/g, k...); ConvTranspose weights (C_in, C_out/g, k...)
    c_out = W.shape[1] if transpose else W.shape[0]
    b = inits.get(n.input[2]) if len(n.input) > 2 and n.input[2] else np.zeros(c_out, W.dtype)
    if b is None:
        return None
    if nxt.op_type == "BatchNormalization":
        return _fold_bn(n, nxt, W, b, inits, transpose)
    if nxt.op_type == "Add":
        return _fold_bias(n, nxt, W, b, inits, c_out)
    return None


class _Graph:
    """What the fusion patterns ask of the graph: constants, producers and the single consumer of a value,
    as they were when the pass began. A pass makes every fusion whose nodes no other fusion of the same
    pass touched (`touched`), marks what it removes and replaces, and `commit` rebuilds the node list once:
    a pass is linear in the graph, however many fusions it makes."""

    def __init__(self, model: ModelProto):
        g = model.graph
        self.g = g
        self.inits = Consts(g.initializer)
        self.dead: set[int] = set()
        self.replaced: dict[int, NodeProto] = {}
        self.changed: set[int] = set()
        self.prod = {o: n for n in g.node for o in n.output}
        self.outputs = {o.name for o in g.output}
        self.cons: dict[str, list[NodeProto]] = {}
        for n in g.node:
            for i in set(n.input):
                self.cons.setdefault(i, []).append(n)
            for sg in subgraphs(n):
                for name in _used_names(sg):
                    self.cons.setdefault(name, []).append(n)

    def touched(self, n: NodeProto) -> bool:
        return id(n) in self.dead or id(n) in self.replaced or id(n) in self.changed

    def only_user(self, name: str) -> NodeProto | None:
        users = self.cons.get(name, [])
        ok = len(users) == 1 and name not in self.outputs and not self.touched(users[0])
        return users[0] if ok else None

    def producer(self, name: str, op_type: str, user: NodeProto) -> NodeProto | None:
        """The node of `op_type` that writes `name`, when `user` is the only one reading it."""
        p = self.prod.get(name)
        ok = p is not None and p.op_type == op_type and not self.touched(p) and self.only_user(p.output[0]) is user
        return p if ok else None

    def remove(self, *nodes: NodeProto) -> None:
        self.dead.update(id(n) for n in nodes)

    def replace(self, n: NodeProto, new: NodeProto) -> None:
        self.replaced[id(n)] = new

    def commit(self) -> None:
        """The node list rebuilt once: removed nodes left out, replaced ones in their place."""
        nodes = [self.replaced.get(id(n), n) for n in self.g.node if id(n) not in self.dead]
        del self.g.node[:]
        self.g.node.extend(nodes)


def _fuse_conv(gr: _Graph, n: NodeProto) -> str | None:
    nxt = gr.only_user(n.output[0])
    folded = _fold_conv(n, nxt, gr.inits) if nxt is not None else None
    if folded is None:
        return None
    W2, b2, what = folded
    base = nxt.output[0]
    gr.g.initializer.extend([numpy_helper.from_array(W2, base + "__W"), numpy_helper.from_array(b2, base + "__b")])
    x = n.input[0]
    del n.input[:]
    n.input.extend([x, base + "__W", base + "__b"])
    n.output[0] = base  # the Conv now writes what its consumer wrote
    gr.changed.add(id(n))
    gr.remove(nxt)
    return what


def _clip_bounds(gr: _Graph, clip: NodeProto) -> tuple[float | None, float | None]:
    lo = _scalar(gr.inits, clip.input[1]) if len(clip.input) > 1 and clip.input[1] else attr(clip, "min", None)
    hi = _scalar(gr.inits, clip.input[2]) if len(clip.input) > 2 and clip.input[2] else attr(clip, "max", None)
    return lo, hi


def _hardswish_clip_input(gr: _Graph, mul: NodeProto) -> tuple[str, NodeProto, NodeProto] | None:
    """(x, the Clip, the Add) where `mul` is x * Clip(x + 3, 0, 6)."""
    for x, clip_out in ((mul.input[0], mul.input[1]), (mul.input[1], mul.input[0])):
        clip = gr.producer(clip_out, "Clip", mul)
        if clip is None or _clip_bounds(gr, clip) != (0.0, 6.0):
            continue
        add = gr.producer(clip.input[0], "Add", clip)
        if add is None or x not in add.input:
            continue
        other = add.input[1] if add.input[0] == x else add.input[0]
        if _scalar(gr.inits, other) == 3.0:
            return x, clip, add
    return None


def _fuse_div6(gr: _Graph, n: NodeProto, domain: str) -> str | None:
    """x * clip(x + 3, 0, 6) / 6 -> HardSwish(x) (paddle2onnx's hard_swish)."""
    if _scalar(gr.inits, n.input[1]) != 6.0:
        return None
    mul = gr.producer(n.input[0], "Mul", n)
    found = _hardswish_clip_input(gr, mul) if mul is not None else None
    if found is None:
        return None
    x, clip, add = found
    hs = helper.make_node("HardSwish", [x], [n.output[0]], name=(n.name or n.output[0]) + "/hardswish", domain=domain)
    gr.remove(add, clip, mul)
    gr.replace(n, hs)  # where the Div was: after x's producer
    return "HardSwish (x*clip(x+3,0,6)/6)"


def _fuse_hardsigmoid(gr: _Graph, n: NodeProto, domain: str) -> str | None:
    """x * HardSigmoid(x; alpha=1/6, beta=0.5) -> HardSwish(x)."""
    for x, hs_out in ((n.input[0], n.input[1]), (n.input[1], n.input[0])):
        hsig = gr.producer(hs_out, "HardSigmoid", n)
        if hsig is None or hsig.input[0] != x:
            continue
        if abs(attr(hsig, "alpha", 0.2) - 1 / 6) > 1e-6 or abs(attr(hsig, "beta", 0.5) - 0.5) > 1e-6:
            continue
        hs = helper.make_node(
            "HardSwish", [x], [n.output[0]], name=(n.name or n.output[0]) + "/hardswish", domain=domain
        )
        gr.remove(hsig)
        gr.replace(n, hs)
        return "HardSwish (x*hardsigmoid(x))"
    return None


SQRT2 = float(np.sqrt(2.0))


def _erf_input(gr: _Graph, erf: NodeProto) -> str | None:
    """x where `erf` reads x / sqrt(2) (a Div by sqrt(2) or a Mul by 1/sqrt(2)) that only it reads."""
    for op_type, want in (("Div", SQRT2), ("Mul", 1 / SQRT2)):
        scaled = gr.producer(erf.input[0], op_type, erf)
        if scaled is None:
            continue
        for x, c in ((scaled.input[0], scaled.input[1]), (scaled.input[1], scaled.input[0])):
            v = _scalar(gr.inits, c)
            if v is not None and abs(v - want) < 1e-4 and (op_type == "Mul" or x == scaled.input[0]):
                return x
    return None


def _times(gr: _Graph, mul: NodeProto, value: str) -> str | None:
    """The other operand of a Mul that reads `value`."""
    if mul is None or mul.op_type != "Mul" or value not in mul.input:
        return None
    return mul.input[1] if mul.input[0] == value else mul.input[0]


def _gelu_end(gr: _Graph, x: str, one_plus: NodeProto) -> tuple[NodeProto, list[NodeProto]] | None:
    """(the node that writes gelu(x), the other nodes of the pattern) after 1 + erf(x / sqrt 2): x * it * 0.5
    in any order of the two Muls, or (x * 0.5) * it."""
    first = gr.only_user(one_plus.output[0])
    other = _times(gr, first, one_plus.output[0])
    if other is None:
        return None
    if other == x or _scalar(gr.inits, other) == 0.5:  # x * (1 + erf) * 0.5, or 0.5 * (1 + erf) * x
        last = gr.only_user(first.output[0])
        rest = _times(gr, last, first.output[0])
        want = 0.5 if other == x else None
        if rest is not None and (_scalar(gr.inits, rest) == want if want else rest == x):
            return last, [first]
        return None
    half = gr.producer(other, "Mul", first)  # (x * 0.5) * (1 + erf)
    if half is not None and x in half.input and _scalar(gr.inits, _times(gr, half, x) or "") == 0.5:
        return first, [half]
    return None


def _fuse_gelu(gr: _Graph, erf: NodeProto, domain: str) -> str | None:
    """x * 0.5 * (1 + erf(x / sqrt 2)) -> Gelu(x) (how torch.onnx exports nn.GELU before opset 20)."""
    x = _erf_input(gr, erf)
    one_plus = gr.only_user(erf.output[0]) if x is not None else None
    if one_plus is None or one_plus.op_type != "Add" or _scalar(gr.inits, _times_add(one_plus, erf)) != 1.0:
        return None
    found = _gelu_end(gr, x, one_plus)
    if found is None:
        return None
    last, middle = found
    gelu = helper.make_node("Gelu", [x], [last.output[0]], name=(last.name or last.output[0]) + "/gelu", domain=domain)
    gr.remove(gr.prod[erf.input[0]], erf, one_plus, *middle)
    gr.replace(last, gelu)
    return "Gelu (x*0.5*(1+erf(x/sqrt2)))"


def _times_add(add: NodeProto, erf: NodeProto) -> str:
    """The Add's operand that is not the Erf's output."""
    return add.input[1] if add.input[0] == erf.output[0] else add.input[0]


def _fuse_linear(gr: _Graph, mm: NodeProto) -> str | None:
    """MatMul(x, W) + b with a constant float matrix W (K x N) and bias (N values) -> our Linear(x, W, b), which
    converts to one `F.linear` (a FULLY_CONNECTED with its bias, as a .pt2 of the same nn.Linear gives)."""
    w = gr.inits.get(mm.input[1])
    if w is None or w.ndim != 2 or w.dtype.kind != "f" or mm.input[0] in gr.inits:
        return None
    add = gr.only_user(mm.output[0])
    if add is None or add.op_type != "Add":
        return None
    b_name = add.input[1] if add.input[0] == mm.output[0] else add.input[0]
    b = gr.inits.get(b_name)
    if b is None or b.size != w.shape[1] or b.ndim < 1 or b.shape[-1] != w.shape[1] or b.dtype != w.dtype:
        return None
    linear = helper.make_node(
        "Linear", [mm.input[0], mm.input[1], b_name], [add.output[0]], name=mm.name or add.output[0] + "/linear",
        domain=OWN_DOMAIN,
    )  # fmt: skip
    gr.remove(mm)
    gr.replace(add, linear)
    return "Linear (MatMul + bias Add)"


def _fuse_pass(model: ModelProto, domain: str) -> Counter:
    """Every fusion that applies to nodes no other fusion of this pass touched, made; what each fused."""
    gr = _Graph(model)
    made = Counter()
    for n in list(gr.g.node):
        if gr.touched(n):
            continue
        done = None
        if n.op_type in ("Conv", "ConvTranspose"):
            done = _fuse_conv(gr, n)
        elif n.op_type == "Div":
            done = _fuse_div6(gr, n, domain)
        elif n.op_type == "Mul":
            done = _fuse_hardsigmoid(gr, n, domain)
        elif n.op_type == "MatMul":
            done = _fuse_linear(gr, n)
        elif n.op_type == "Erf":
            done = _fuse_gelu(gr, n, "" if _opset(model) >= 20 else OWN_DOMAIN)
        if done:
            made[done] += 1
    gr.commit()
    return made


def _opset(model: ModelProto) -> int:
    return max((o.version for o in model.opset_import if o.domain in ONNX_DOMAINS), default=1)


def fuse_patterns(model: ModelProto, facts: list[str]) -> None:
    """Rewrite exporter idioms into the single ops they spell (fewer ops; quantizers see whole ops), pass by
    pass until none applies (a Conv absorbs its BatchNormalization in one pass, the bias Add after it in
    the next)."""
    # HardSwish is an ONNX op from opset 14 (Gelu from 20); an older graph gets it in our own domain (a converter
    # of ours takes it; raising the opset would change the meaning of other ops, e.g. Squeeze's axes)
    domain = "" if _opset(model) >= 14 else OWN_DOMAIN
    counts = Counter()
    for _ in range(MAX_ROUNDS):
        made = _fuse_pass(model, domain)
        if not made:
            break
        counts.update(made)
    if counts:
        own = any(n.domain == OWN_DOMAIN for n in model.graph.node)
        if own and not any(o.domain == OWN_DOMAIN for o in model.opset_import):
            model.opset_import.append(helper.make_opsetid(OWN_DOMAIN, 1))
        eliminate_dead(model)
        _topological(model.graph)
        facts.append("fused " + ", ".join(f"{v} {k}" for k, v in counts.items()))

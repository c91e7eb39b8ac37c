"""Every artifact is what its name says: read the flatbuffer back, count what it holds, judge the claim.

After each technique the output is read (optimize.models.flatbuffer): weight bytes by dtype, the
float32-equivalent of the same weights, the ops that still compute in float with float weights, and for
pruned and clustered models the measured sparsity and distinct values of the big weight tensors. A
candidate whose weights are not what its scheme promises is a failed candidate, not a result:

    scheme    the weights must shrink to at most (of their float32 equivalent)
    float16   0.60   (float16 is 0.50; a little float32 may remain: tiny tensors, biases)
    dynamic   0.50   (int8 is 0.25; the converter keeps tensors under 1,024 elements float)
    int8      0.50
    int16x8   0.50
    int4      0.30   (4-bit Dense/MatMul weights are 0.125-0.14; convolutions get 8-bit); some weights must be int4
    selective -      (float islands are the point of it; at least some weights must be 8-bit)

A recipe whose name promises integer-only compute (int8 or int16x8 with integer I/O) fails when any op
still reads or writes a float tensor (PRELU or LEAKY_RELU left float between DEQUANTIZE and QUANTIZE,
say): a microcontroller or an Edge TPU cannot run it.

Pruning must leave at least half its target sparsity across the big weight tensors (layers tfmot could
not wrap stay dense), and clustering at most its cluster count of distinct values in the median big
weight tensor (per output channel once quantized).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from optimize.core.results import Composition
from optimize.core.vocab import Scheme
from optimize.models import postprocess
from optimize.models.flatbuffer import Model
from optimize.models.tflite import read_model

WEIGHT_DTYPES = ("float32", "float16", "int8", "uint8", "int16", "int4")
BYTES = {"float32": 4, "float16": 2, "int8": 1, "uint8": 1, "int16": 2, "int4": 0.5}
MAX_SHRINK = {Scheme.FLOAT16: 0.60, Scheme.DYNAMIC: 0.50, Scheme.INT8: 0.50, Scheme.INT16X8: 0.50, Scheme.INT4: 0.30}
BIG = 1024  # weight tensors this large are the ones pruning and clustering are judged on


def _big_weights(sg) -> list:
    return [t for t in sg.tensors if t.is_const and t.dtype in WEIGHT_DTYPES and t.numel >= BIG]


def _unique(t) -> int:
    """Distinct values of a weight tensor; per output channel (the first axis) when it is quantized."""
    v = t.values()
    if v is None:
        return 0
    if t.dtype in ("int8", "uint8", "int16", "int4") and t.shape:
        rows = v.reshape(t.shape[0], -1)
        return int(max(len(np.unique(r)) for r in rows))
    return int(len(np.unique(v)))


def _read(model: Model) -> set[int]:
    """Ids of the tensors some op reads, over every subgraph."""
    return {id(g.tensors[i]) for g in model.subgraphs for op in g.ops for i in op.inputs if i >= 0}


def _weight_bytes(sg, read: set[int]) -> tuple[dict[str, int], int]:
    """Bytes of the constant weights per dtype, and what the same weights would take in float32. A constant
    no op reads (`read`: ids of the tensors ops read; the scales of blockwise int4 weights live in a tensor of
    their own) is stored, so counted, but has no float32 counterpart."""
    by_dtype: dict[str, int] = {}
    equivalent = 0
    for t in sg.tensors:
        if t.is_const and t.dtype in WEIGHT_DTYPES and t.data is not None:
            by_dtype[t.dtype] = by_dtype.get(t.dtype, 0) + len(t.data)
            equivalent += t.numel * 4 if id(t) in read else 0
    return by_dtype, equivalent


def _computes_in_float(sg, op) -> bool:
    """An op with a float32 output and a float32 weight of any size is still computing in float."""
    if not op.outputs or op.outputs[0] < 0 or sg.tensors[op.outputs[0]].dtype != "float32":
        return False
    weights = (sg.tensors[i] for i in op.inputs if i >= 0 and sg.tensors[i].is_const)
    return any(w.dtype == "float32" and w.numel >= 16 for w in weights)


FLOAT_TYPES = ("float32", "float16")
CONVERSIONS = ("QUANTIZE", "DEQUANTIZE")  # float <-> integer at an edge or around a float island: not compute
SHAPE_ONLY = ("SHAPE", "RANK")  # read a tensor's shape, never its values


def computes_on_float(sg, op) -> bool:
    """Whether an op (not a conversion, not a shape read) reads or writes a non-constant float tensor."""
    if op.name in CONVERSIONS or op.name in SHAPE_ONLY:
        return False
    tensors = (sg.tensors[i] for i in (*op.inputs, *op.outputs) if 0 <= i < len(sg.tensors))
    return any(t.dtype in FLOAT_TYPES and not t.is_const for t in tensors)


def float_compute(model: Model) -> list[str]:
    """Op types, in every subgraph, that read or write a non-constant float tensor: ops an integer-only
    target cannot run. QUANTIZE and DEQUANTIZE are the conversions, not compute. A detector's post-processing
    tail (`tail_compute`) is left out: it is float in every shipped detector and runs on the CPU after the
    integer body, as shipped SSDs run on Hexagon and NNAPI."""
    return sorted({op.name for sg in model.subgraphs for op in _outside_tail(sg) if computes_on_float(sg, op)})


def tail_compute(model: Model) -> list[str]:
    """Op types of the main subgraph's post-processing tail (`models.postprocess.tail_nodes`:
    TFLite_Detection_PostProcess, NMS or TOPK_V2, what follows them and what only feeds them) that compute on
    float tensors."""
    sg = model.main
    tail = postprocess.tail_nodes(sg)
    return sorted({sg.ops[i].name for i in tail if computes_on_float(sg, sg.ops[i])})


def _outside_tail(sg) -> list:
    tail = postprocess.tail_nodes(sg)
    return [op for op in sg.ops if op.index not in tail] if tail else list(sg.ops)


def counts(model: Model) -> tuple[int, int, int]:
    """(ops that compute, of them the ops computing on float tensors, QUANTIZE/DEQUANTIZE ops), every subgraph."""
    ops = [(sg, op) for sg in model.subgraphs for op in sg.ops]
    compute = [(sg, op) for sg, op in ops if op.name not in CONVERSIONS and op.name not in SHAPE_ONLY]
    return len(compute), sum(computes_on_float(sg, op) for sg, op in compute), len(ops) - len(compute)


def integer_only(recipe) -> bool:
    """Whether the recipe's name promises integer-only compute: full int8 or int16x8 with integer I/O."""
    return str(recipe.scheme) in (Scheme.INT8, Scheme.INT16X8) and recipe.io in ("int8", "uint8", "int16")


def _zeros(t) -> tuple[int, int] | None:
    """(zeros, elements) of a weight tensor: a quantized one's zeros are the values at its zero point (per
    channel where it has one per channel: an int8 embedding table quantized like an activation has one that is
    not 0), a float one's are 0."""
    v = t.values()
    if v is None:
        return None
    q = t.quant if t.dtype in ("int8", "uint8", "int16", "int4") else None
    zps = q.zero_points if q is not None else np.zeros(0, np.int64)
    if len(zps) > 1 and t.shape and q.dim < len(t.shape) and len(zps) == t.shape[q.dim]:
        shape = [1] * len(t.shape)
        shape[q.dim] = len(zps)
        zero = zps.reshape(shape)
    else:
        zero = int(zps[0]) if len(zps) else 0
    return int((v.reshape(t.shape) == zero).sum()) if t.shape else int((v == zero).sum()), int(v.size)


def _sparsity(big: list) -> float | None:
    counted = [z for z in (_zeros(t) for t in big) if z is not None]
    total = sum(n for _, n in counted)
    return sum(z for z, _ in counted) / total if total else None


def _by_weight(big: list, keep: int = 12) -> dict[str, float]:
    """Share of zeros of the `keep` largest weight tensors, by name."""
    out = {}
    for t in sorted(big, key=lambda t: -t.numel)[:keep]:
        z = _zeros(t)
        if z is not None and z[1]:
            out[t.name] = z[0] / z[1]
    return out


def _float_weights(model: Model, keep: int = 5) -> list[str]:
    """`OP 'output tensor' (N weights)` of the ops computing with float32 weights, largest first: the layers an
    int8 candidate left float, named."""
    found = []
    for g in model.subgraphs:
        for op in g.ops:
            if not _computes_in_float(g, op):
                continue
            n = sum(g.tensors[i].numel for i in op.inputs if i >= 0 and g.tensors[i].is_const)
            found.append((n, f"{op.name} {g.tensors[op.outputs[0]].name!r} ({n:,} weights)"))
    return [text for _, text in sorted(found, key=lambda f: -f[0])[:keep]]


def compose(content: bytes | Model) -> Composition:
    """What an artifact holds: weight bytes per dtype, the float ops, sparsity and distinct values
    (from its bytes, or from the model already parsed)."""
    model = content if isinstance(content, Model) else read_model(content)
    sg = SimpleNamespace(tensors=[t for g in model.subgraphs for t in g.tensors])  # branch and loop bodies too
    by_dtype, equivalent = _weight_bytes(sg, _read(model))
    float_ops = [op.name for g in model.subgraphs for op in g.ops if _computes_in_float(g, op)]
    big = _big_weights(sg)
    compute, on_float, _ = counts(model)
    conversions = sum(op.name in CONVERSIONS for g in model.subgraphs for op in g.ops)
    return Composition(
        weight_bytes=by_dtype,
        float32_equivalent_bytes=equivalent,
        float_ops=len(float_ops),
        float_op_types=sorted(set(float_ops)),
        float_compute_ops=float_compute(model),
        tail_ops=tail_compute(model),
        sparsity=_sparsity(big),
        sparsity_by_weight=_by_weight(big),
        float_weights=_float_weights(model),
        distinct_values=int(np.median([_unique(t) for t in big])) if big else None,
        largest_weight=max((t.numel for t in sg.tensors if t.is_const and t.dtype in WEIGHT_DTYPES), default=0),
        compute_ops=compute,
        float_compute_count=on_float,
        conversions=conversions,
    )


def check(recipe, c: Composition) -> str | None:
    """Why the artifact is not what the recipe's name says, or None when it is."""
    techniques = [s.technique for s in recipe.steps]
    scheme = str(recipe.scheme)
    kept = c.float_weights[:3] or c.float_op_types[:3]
    why = f" ({', '.join(kept)} kept float)" if kept else ""
    problem = _missing_bits(scheme, techniques, c, why)
    if problem is None and "selective" not in techniques:
        problem = _shrink_problem(scheme, c, why)
    return (
        problem
        or _float_compute_problem(recipe, c)
        or next((p for p in (_technique_problem(s, c) for s in recipe.steps) if p), None)
    )


def _float_compute_problem(recipe, c: Composition) -> str | None:
    if integer_only(recipe) and c.float_compute_ops:
        ops = ", ".join(c.float_compute_ops[:4]) + (" ..." if len(c.float_compute_ops) > 4 else "")
        return f"{recipe.scheme} with {recipe.io} I/O still computes {ops} in float (not integer-only)"
    return None


def _missing_bits(scheme: str, techniques: list[str], c: Composition, why: str) -> str | None:
    """Schemes that must hold weights of a given type: selective some 8-bit ones, int4 some 4-bit ones."""
    if "selective" in techniques and not c.weight_bytes.get("int8"):
        return f"{scheme}: no weights were quantized{why}"
    if scheme == Scheme.INT4 and not c.weight_bytes.get("int4"):
        return f"int4: no weights were made 4-bit (no Dense/MatMul weights of 1,024 elements or more){why}"
    return None


def _shrink_problem(scheme: str, c: Composition, why: str) -> str | None:
    shrink = c.shrink
    if scheme not in MAX_SHRINK or shrink <= MAX_SHRINK[scheme]:
        return None
    if shrink > 0.98:
        small = (
            " (every weight is under 1,024 elements, which dynamic range keeps float)"
            if scheme == "dynamic" and c.largest_weight < 1024
            else ""
        )
        return f"{scheme}: no weights were quantized{small or why}"
    return f"{scheme}: the weights shrank only to {shrink:.2f}x of float32 (at most {MAX_SHRINK[scheme]:.2f}){why}"


def _technique_problem(step, c: Composition) -> str | None:
    p = step.params
    if step.technique == "prune" and c.sparsity is not None and c.sparsity < 0.5 * p.target_sparsity:
        dense = [f"{n!r}" for n, share in c.sparsity_by_weight.items() if share < 0.5 * p.target_sparsity][:4]
        where = f" (not pruned: {', '.join(dense)})" if dense else ""
        return f"prune: the weights are {c.sparsity:.0%} zeros, far from the {p.target_sparsity:.0%} asked{where}"
    if step.technique == "cluster" and c.distinct_values is not None and c.distinct_values > p.clusters:
        return f"cluster: the big weight tensors hold {c.distinct_values} distinct values, not {p.clusters}"
    return None

"""Ops a quantizer makes integer where integer buys nothing and loses the values: found in its first variant and
kept float before the failure rescue runs (optimize.transforms.tflite.repair), for every route and scheme.

    between      an integer op between float ops: every non-constant input a QUANTIZE of a float op's output,
                 every reader a DEQUANTIZE. Softplus as converted, SELECT(x > 20, x, LOG(EXP(x) + 1)), is the
                 case found: LiteRT Quantizer has no integer EXP or LOG, so both stay float, and the ADD between
                 them is quantized on EXP's calibrated range (up to e^20: one int8 step of 488,024); every
                 ordinary value rounds to 0, LOG(0) is -inf, and an end-to-end detector's box sizes were lost
                 (benchmarks/route_models.py's detector kept 0% of its detections in int8 and int16x8). Kept
                 float it costs nothing: the QUANTIZE/DEQUANTIZE pair around it goes with it. A convolution or
                 matrix product between float ops (a float island's neighbour) stays integer: its int8
                 arithmetic pays for the conversions.
    mixed_rows   a CONCATENATION in a detector's selection tail (after TOPK_V2 or NMS,
                 optimize.models.postprocess) writing a graph output: an end-to-end head's rows [x1, y1, x2, y2,
                 score, class id] put pixel boxes, 0..1 scores and class ids under one scale (one int8 step of
                 0.76 px read every score as 0 or 0.76). Kept float, each part keeps its own scale up to its
                 DEQUANTIZE. The tail is float in every shipped detector and runs on the CPU after the body, so an
                 integer-only target still gets its integer body (`verify.float_compute` leaves the tail out).
"""

from __future__ import annotations

from optimize.models.postprocess import tail_nodes
from optimize.models.tflite import read_model

CONVERSIONS = ("QUANTIZE", "DEQUANTIZE")
INTEGER = ("int8", "int16")
#: Where integer arithmetic pays for its conversions (a float island's convolution stays int8): never kept float.
WEIGHTED = frozenset(
    {
        "CONV_2D",
        "DEPTHWISE_CONV_2D",
        "FULLY_CONNECTED",
        "BATCH_MATMUL",
        "TRANSPOSE_CONV",
        "CONV_3D",
        "CONV_3D_TRANSPOSE",
    }
)
FLOAT = ("float32", "float16")
WHY_BETWEEN = "an integer op between float ops, quantized on their range (kept float: no conversion lost)"
WHY_ROWS = "the selected rows' boxes, scores and class ids under one scale (kept float: each keeps its own)"


def between(sg) -> list[int]:
    """Op indices of the integer ops whose every non-constant input is a QUANTIZE of a float op's output and
    whose every reader is a DEQUANTIZE (not a graph output); never a convolution or matrix product (`WEIGHTED`),
    whose int8 arithmetic is worth its conversions."""
    outputs = set(sg.outputs)
    return [
        op.index
        for op in sg.ops
        if op.name not in WEIGHTED and _integer_to_float(sg, op, outputs) and _from_floats(sg, op)
    ]


def _integer_to_float(sg, op, outputs: set[int]) -> bool:
    """Whether op computes an integer tensor (not a graph output) that only DEQUANTIZEs read."""
    if op.name in CONVERSIONS or not op.outputs or op.outputs[0] < 0:
        return False
    out = op.outputs[0]
    if sg.tensors[out].dtype not in INTEGER or out in outputs:
        return False
    readers = sg.consumers.get(out, [])
    return bool(readers) and all(sg.ops[r].name == "DEQUANTIZE" for r in readers)


def _from_floats(sg, op) -> bool:
    live = [i for i in op.inputs if i >= 0 and not sg.tensors[i].is_const]
    return bool(live) and all(_from_float_op(sg, i) for i in live)


def _from_float_op(sg, tensor: int) -> bool:
    """Whether `tensor` is a QUANTIZE of a float tensor that an op computed (not a graph input)."""
    q = sg.producer.get(tensor)
    if q is None or sg.ops[q].name != "QUANTIZE":
        return False
    src = sg.ops[q].inputs[0]
    p = sg.producer.get(src)
    return sg.tensors[src].dtype in FLOAT and p is not None and sg.ops[p].name not in CONVERSIONS


def mixed_rows(sg) -> list[int]:
    """Op indices of the integer CONCATENATIONs of a selection tail that write (through conversions) a graph
    output."""
    tail = tail_nodes(sg)
    return [
        i
        for i in sorted(tail)
        if sg.ops[i].name == "CONCATENATION" and sg.tensors[sg.ops[i].outputs[0]].dtype in INTEGER and _ends(sg, i)
    ]


def _ends(sg, i: int) -> bool:
    """Whether op i's output is a graph output, or only read by conversions writing one."""
    out = sg.ops[i].outputs[0]
    if out in set(sg.outputs):
        return True
    readers = sg.consumers.get(out, [])
    return bool(readers) and all(sg.ops[r].name in CONVERSIONS and _ends(sg, r) for r in readers)


def found(quantized: bytes, names: set[str]) -> dict[str, tuple[str, str]]:
    """{output tensor name: (op, why)} of the ops to keep float in a quantized variant, limited to `names` (the
    float model's op outputs, which a route's overrides are keyed by)."""
    sg = read_model(quantized).main
    picked = {i: WHY_BETWEEN for i in between(sg)} | {i: WHY_ROWS for i in mixed_rows(sg)}
    out = {}
    for i, why in picked.items():
        name = _float_name(sg, sg.ops[i].outputs[0], names)
        if name is not None:
            out[name] = (sg.ops[i].name, why)
    return out


def _float_name(sg, tensor: int, names: set[str]) -> str | None:
    """The float model's name of a quantized op's output: its own, or (an output the quantizer renamed to put a
    DEQUANTIZE behind it) that of the graph output its conversions write."""
    if sg.tensors[tensor].name in names:
        return sg.tensors[tensor].name
    readers = [sg.ops[r] for r in sg.consumers.get(tensor, [])]
    if len(readers) == 1 and readers[0].name in CONVERSIONS:
        return _float_name(sg, readers[0].outputs[0], names)
    return None

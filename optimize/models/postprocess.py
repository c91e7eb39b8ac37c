"""A detector's post-processing op as the runtime runs it: which outputs it writes, and what they hold.

SSD and EfficientDet-Lite files from the TF Object Detection API, Model Maker and MediaPipe end in the custom op
`TFLite_Detection_PostProcess`: boxes [1, M, 4] (ymin, xmin, ymax, xmax in 0..1), classes [1, M] (class ids as
floats), scores [1, M] and the count [1] of rows it filled. The kernel writes only the first `count` rows: the rest
hold whatever the tensor arena held before (measured here: NaN in the rows past the count of a float16 file's
outputs on an all-zero input, where float32's happened to read 0). Those rows are not outputs of the model, so
every reader sees them blanked (0, as the TF graph of the same detector pads them): a probe or a fidelity figure
that read them would judge memory, not the file.
"""

from __future__ import annotations

import numpy as np

OP = "TFLite_Detection_PostProcess"
#: What each of the op's outputs holds, in its output order.
ROLES = ("boxes", "classes", "scores", "count")


def roles(ops) -> dict[int, str]:
    """The role of every tensor a post-processing op writes, by tensor index (`ops`: (op name, output tensor
    indices) pairs, from the flatbuffer or the interpreter)."""
    out: dict[int, str] = {}
    for name, outputs in ops:
        if name == OP:
            out.update({int(t): role for t, role in zip(outputs, ROLES) if t >= 0})
    return out


def tails(ops, outputs: list[dict]) -> list[dict[str, int]]:
    """Per post-processing op whose four outputs are all model outputs: each role's position among `outputs`
    (the runtime's output details, in the order a runner returns them); `ops` as for `roles`."""
    at = {int(d["index"]): j for j, d in enumerate(outputs)}
    found = []
    for name, written in ops:
        if name != OP or len(written) != len(ROLES):
            continue
        where = {role: at.get(int(t)) for t, role in zip(written, ROLES)}
        if all(j is not None for j in where.values()):
            found.append(where)
    return found


def blank_past_count(outs: list[np.ndarray], tail: dict[str, int]) -> None:
    """Set the rows past the count (unwritten by the kernel) of one sample's outputs (batch axis dropped: boxes
    [M, 4], classes and scores [M], the count a scalar) to 0, in place; a count that is not finite blanks every
    row."""
    count = np.asarray(outs[tail["count"]]).reshape(-1)
    n = int(count[0]) if count.size and np.isfinite(count[0]) else 0
    for role in ("boxes", "classes", "scores"):
        a = outs[tail[role]]
        if a.ndim >= 1:
            a[max(0, n) :] = 0


# ------------------------------------------------------------------------------------------------ the tail
#: Post-processing ops that run on the CPU after an accelerated body, as shipped detectors do.
TAIL_OPS = frozenset({"TFLite_Detection_PostProcess", "NON_MAX_SUPPRESSION_V4", "NON_MAX_SUPPRESSION_V5", "TOPK_V2"})


def tail_nodes(sg) -> set[int]:
    """The op indices of the subgraph's post-processing tail: the tail ops, every op downstream of them and the
    conversions that only feed them (empty: no tail op)."""
    seeds = [op.index for op in sg.ops if op.name in TAIL_OPS]
    if not seeds:
        return set()
    tail: set[int] = set()
    todo = list(seeds)
    while todo:
        i = todo.pop()
        if i in tail:
            continue
        tail.add(i)
        todo += [c for t in sg.ops[i].outputs if t >= 0 for c in sg.consumers.get(t, [])]
    return tail | _feeding(sg, tail)


#: Ops in front of a tail op that serve it alone: a quantized body's outputs made float for it, and the best
#: class per anchor an end-to-end head's top-K selects by (its score and class id).
FEEDING_OPS = frozenset({"DEQUANTIZE", "QUANTIZE", "ARG_MAX", "ARG_MIN", "REDUCE_MAX", "CAST"})


def _feeding(sg, tail: set[int]) -> set[int]:
    """The FEEDING_OPS whose every reader is in the tail (or feeds it so), as far back as they go: part of the
    post-processing's input."""
    found = set(tail)
    grew = True
    while grew:
        grew = False
        for i in list(found):
            for t in sg.ops[i].inputs:
                p = sg.producer.get(t) if t >= 0 else None
                if p is None or p in found or sg.ops[p].name not in FEEDING_OPS:
                    continue
                if all(set(sg.consumers.get(o, [])) <= found for o in sg.ops[p].outputs if o >= 0):
                    found.add(p)
                    grew = True
    return found - tail

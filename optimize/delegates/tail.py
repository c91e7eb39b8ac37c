"""The CPU tail a delegate is expected to leave: a detector's post-processing at the end of the graph.

Every shipped SSD and EfficientDet-Lite ends in the custom op `TFLite_Detection_PostProcess` (decoding against the
anchors, non-maximum suppression, the top detections), which no delegate takes: the backbone runs on the GPU,
NNAPI, Hexagon or Core ML, and this op on the CPU, once per frame, on a few thousand boxes. The same holds for a
graph that ends in NON_MAX_SUPPRESSION and the gathers after it, and for an end-to-end head's selection (the best
class per anchor, its TOPK_V2 and the gathers of the rows it picks: what replaces NMS there). Such a tail is not a reason to call the model
unfit for the target: a candidate whose every other node is delegated runs there, with its tail named.

A node is in the tail when it is a post-processing op (`TAIL_OPS`), an op downstream of one, or one of
`FEEDING_OPS` that only feeds the tail (a quantized body's boxes and scores made float for it, the arg-max of the
class an end-to-end head selects by); the tail is expected only when those are all the nodes a delegate leaves. Rules read here; nothing is rewritten.
"""

from __future__ import annotations

from optimize.core.results import DelegateReport
from optimize.core.vocab import Delegate
from optimize.models.flatbuffer import Subgraph

#: Post-processing ops that run on the CPU after an accelerated body, as shipped detectors do.
TAIL_OPS = frozenset({"TFLite_Detection_PostProcess", "NON_MAX_SUPPRESSION_V4", "NON_MAX_SUPPRESSION_V5", "TOPK_V2"})
#: The delegates whose targets run a body and leave a tail to the CPU (XNNPACK is the CPU itself).
WITH_TAIL = (Delegate.GPU, Delegate.NNAPI, Delegate.HEXAGON, Delegate.COREML)


def tail_nodes(sg: Subgraph) -> set[int]:
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


def _feeding(sg: Subgraph, tail: set[int]) -> set[int]:
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


def expected_tail(sg: Subgraph, report: DelegateReport) -> list[str]:
    """The ops a delegate leaves to the CPU that are the model's post-processing tail, in graph order, when they
    are every node it leaves (else []: something in the body is refused, and that is the blocker)."""
    if report.delegate not in WITH_TAIL or report.vetoed or not report.cpu_nodes:
        return []
    tail = tail_nodes(sg)
    left = {v.index for v in report.cpu_nodes if v.subgraph == sg.index}
    if not left or not left <= tail or len(left) != len(report.cpu_nodes):
        return []
    return [sg.ops[i].name for i in sorted(left)]


def with_tail(reports: dict[str, DelegateReport], sg: Subgraph) -> dict[str, DelegateReport]:
    """The reports, each with the CPU tail it leaves (`DelegateReport.cpu_tail`) where it leaves only that."""
    out = {}
    for name, r in reports.items():
        found = expected_tail(sg, r)
        out[name] = r.model_copy(update={"cpu_tail": found}) if found else r
    return out

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

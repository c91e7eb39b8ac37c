"""A post-processed detector with integer I/O: its post-processing op's outputs left float, as shipped SSDs give them.

A detector ending in `TFLite_Detection_PostProcess` (SSD, EfficientDet-Lite) runs its body in integer and the op on
the CPU, in float: the op has no integer version, and the quantized SSDs the TF Object Detection API ships take a
uint8 image and give float boxes, classes, scores and count. A quantizer asked for integer I/O quantizes those
outputs too (a QUANTIZE after each), which breaks them: a class id or a count through an int8 scale comes back a
fraction off (a count of 10 read as 9.96 is 9 rows), and a consumer of a shipped SSD expects float there.

`float_outputs` takes those QUANTIZE ops away: each graph output a QUANTIZE makes from the post-processing op's
output is that float output again (the signature re-pointed). The input stays integer, so an integer-only
target (Hexagon) runs every node but the tail (`optimize.delegates.tail`). Exact: the float values are the op's own.
"""

from __future__ import annotations

from optimize.models.normalize import _load, _save
from optimize.models.postprocess import OP
from optimize.transforms.tflite.graphfix import _codes


def float_outputs(content: bytes) -> tuple[bytes, int]:
    """The model with the QUANTIZE ops after its post-processing op's outputs removed, the outputs float again,
    and how many (0: none, the model unchanged)."""
    model = _load(content)
    sg = model.subgraphs[0]
    dropped = []
    for k, op in _quantized_tail(model):
        source = int(op.inputs[0])
        _repoint(model, int(sg.outputs[k]), source)
        sg.outputs[k] = source
        dropped.append(op)
    if not dropped:
        return content, 0
    sg.operators = [op for op in sg.operators if all(op is not d for d in dropped)]
    return _save(model), len(dropped)


def _quantized_tail(model) -> list[tuple[int, object]]:
    """(output position, the QUANTIZE making it) for each graph output that is only a QUANTIZE of a
    post-processing op's output."""
    sg = model.subgraphs[0]
    codes = _codes(model)
    custom = [bytes(c.customCode or b"").decode(errors="replace") for c in model.operatorCodes]
    producer = {int(t): op for op in sg.operators for t in op.outputs}
    readers = {int(t) for op in sg.operators for t in op.inputs}
    found = []
    for k, t in enumerate(int(t) for t in sg.outputs):
        op = producer.get(t)
        if op is None or codes[op.opcodeIndex] != "QUANTIZE" or t in readers:
            continue
        made = producer.get(int(op.inputs[0]))
        if made is not None and custom[made.opcodeIndex] == OP:
            found.append((k, op))
    return found


def _repoint(model, old: int, new: int) -> None:
    """Signature outputs of the main subgraph at tensor `old` now at `new`."""
    for sd in model.signatureDefs or []:
        if (sd.subgraphIndex or 0) != 0:
            continue
        for tm in sd.outputs or []:
            if int(tm.tensorIndex) == old:
                tm.tensorIndex = new

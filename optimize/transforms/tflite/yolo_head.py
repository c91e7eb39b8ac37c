"""yolo_head: float32 .tflite -> float32 .tflite whose raw YOLO head an int8 output can hold.

A raw YOLO head `[1, 4+C, N]` concatenates pixel boxes (cx, cy, w, h: up to the input's size) with 0..1 class
scores. One int8 scale for that tensor gives the scores one or two steps: every detection is lost (measured on a
YOLOv8 from a wheel: 0 of 23 kept), so an integer-only target (Hexagon, a microcontroller) gets nothing. The
rewrite divides the boxes by the input's size inside the graph, before the concatenation (a MUL by
[1/W, 1/H, 1/W, 1/H] on each box input of the CONCATENATION), as Ultralytics' own TFLite int8 export does: boxes
and scores then share 0..1, and one int8 scale keeps both.

It changes the output contract: the head's boxes come out normalised (0..1 of the input's width and height), not
in pixels. The step says so in a note and records the contract (`OutputContract` on the candidate, in study.json
and the report); the measure multiplies the boxes back before comparing with float32, so every figure is against
float32's own outputs. Its precondition: one output is a raw yolo head made by a CONCATENATION along its feature
axis whose first inputs hold exactly the 4 box channels, with boxes beyond 0..1.5 on the data; its check: on
calibration samples the rewritten model's outputs are float32's with the boxes divided (within 1e-4 of range).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from optimize.core.errors import TechniqueFailed
from optimize.core.registry import Context, Params, Stage, technique
from optimize.core.results import OutputContract, write_atomic
from optimize.models.normalize import _load, _save, _schema
from optimize.transforms.tflite.graphfix import _buffer, _codes, _name, _op, _tensor

BOX_CHANNELS = 4
#: Boxes whose largest value on the data is at most this are taken as normalised already: nothing to rewrite.
NORMALISED = 1.5
CHECK_SAMPLES = 4


class YoloHeadParams(Params):
    """No parameters: the head and the input's size are read from the model."""


def _input_size(sg) -> tuple[int, int]:
    """(width, height) of the one image input: NCHW when its second axis holds 1 or 3 channels, else NHWC."""
    shape = [int(d) for d in sg.tensors[int(sg.inputs[0])].shape]
    if len(shape) != 4:
        raise TechniqueFailed(f"yolo_head: the input is {shape}, not an image [1, H, W, C] or [1, C, H, W].")
    return (shape[3], shape[2]) if shape[1] in (1, 3) else (shape[2], shape[1])


#: Ops between the head's CONCATENATION and the output that only move or regroup its values.
SHAPE_OPS = ("RESHAPE", "TRANSPOSE")


def _head(model):
    """(the CONCATENATION op making the raw yolo head output, its axis, the output's tensor index, the output's
    feature axis), or a failure.
    The concatenation may reach the output through RESHAPE and TRANSPOSE (a channels-last head permuted to
    [1, 4+C, N]); its axis is the one holding the head's 4+C features."""
    sg = model.subgraphs[0]
    codes = _codes(model)
    producer = {int(t): op for op in sg.operators for t in op.outputs}
    for out in sg.outputs:
        shape = [int(d) for d in sg.tensors[int(out)].shape]
        if len(shape) != 3:
            continue
        features, anchors = min(shape[1:]), max(shape[1:])
        op = producer.get(int(out))
        while op is not None and codes[op.opcodeIndex] in SHAPE_OPS:
            op = producer.get(int(op.inputs[0]))
        if op is None or codes[op.opcodeIndex] != "CONCATENATION" or features <= BOX_CHANNELS:
            continue
        made = [int(d) for d in sg.tensors[int(op.outputs[0])].shape]
        axis = op.builtinOptions.axis % len(made)
        if made[axis] == features and anchors >= 8 * features:
            return op, axis, int(out), 1 if shape[1] < shape[2] else 2
    raise TechniqueFailed(
        "yolo_head: no raw yolo head [1, 4+C, N] or [1, N, 4+C] made by a CONCATENATION among the outputs."
    )


def _box_inputs(sg, op, axis: int) -> list[tuple[int, int, int]]:
    """(input position, first channel, channels) of the concatenation's inputs that hold the 4 box channels."""
    found, at = [], 0
    for k, t in enumerate(op.inputs):
        width = int(sg.tensors[int(t)].shape[axis])
        if at < BOX_CHANNELS:
            if at + width > BOX_CHANNELS:
                raise TechniqueFailed("yolo_head: one input of the head's CONCATENATION mixes boxes and scores.")
            found.append((k, at, width))
        at += width
    return found


def normalise_boxes(content: bytes) -> tuple[bytes, OutputContract]:
    """The model with its raw yolo head's boxes divided by the input's size before the concatenation, and the
    output contract that says so."""
    s = _schema()
    model = _load(content)
    sg = model.subgraphs[0]
    op, axis, output, out_axis = _head(model)
    position, name = _position(content, output)
    width, height = _input_size(sg)
    per = np.array([1 / width, 1 / height, 1 / width, 1 / height], np.float32)
    inserted = []
    for k, first, n in _box_inputs(sg, op, axis):
        src = sg.tensors[int(op.inputs[k])]
        shape = [1] * len(src.shape)
        shape[axis] = n
        const = _tensor(sg, f"{_name(src)}/per_input_size", shape, 0, _buffer(model, per[first : first + n].tobytes()))
        scaled = _tensor(sg, f"{_name(src)}/normalised", src.shape, 0, 0, None, src.shapeSignature)
        options = s.MulOptionsT()
        inserted.append(_op(model, "MUL", [int(op.inputs[k]), const], [scaled], s.BuiltinOptions.MulOptions, options))
        op.inputs[k] = scaled
    at = sg.operators.index(op)
    sg.operators = [*sg.operators[:at], *inserted, *sg.operators[at:]]
    scale = [float(width), float(height), float(width), float(height)]
    contract = OutputContract(
        output=name,
        position=position,
        axis=out_axis,
        channels=list(range(BOX_CHANNELS)),
        multiply_by=scale,
        words=f"output {name}'s boxes (channels 0-3: cx, cy, w, h) are normalised by the input's size: multiply "
        f"them by {width} x {height} for pixels, as float32 gave them",
    )
    return _save(model), contract


def _outputs(content: bytes, samples: list, threads: int) -> list[np.ndarray]:
    from optimize.models import runtime

    runner = runtime.Runner(runtime.load(content, threads=threads, like=samples[0]))
    outs = [runner.run_fresh(x) for x in samples]
    return [np.stack([o[j] for o in outs]) for j in range(len(outs[0]))]


def _check(before: list[np.ndarray], after: list[np.ndarray], contract: OutputContract) -> None:
    """The rewrite kept the function: every output as before, the head's boxes divided by the input's size."""
    boxes = np.take(before[contract.position], contract.channels, axis=contract.axis)
    if float(np.abs(boxes).max()) <= NORMALISED:
        raise TechniqueFailed("yolo_head: the head's boxes are within 0..1.5 already: nothing to normalise.")
    restored = contract.restore(after)
    for b, a in zip(before, restored):
        span = float(b.max() - b.min()) or 1.0
        if a.shape != b.shape or float(np.abs(a - b).max()) > 1e-4 * span:
            raise TechniqueFailed("yolo_head: the rewritten model's outputs moved; the float model is kept.")


@technique("yolo_head", stage=Stage.TFLITE, params=YoloHeadParams)
def yolo_head(model: Path, params: YoloHeadParams, ctx: Context) -> Path:
    """Normalise a raw YOLO head's boxes by the input's size inside the float model (before its final
    concatenation), so one int8 output holds boxes and scores alike: run it before `quantize` int8 for integer
    targets. The output contract changes (boxes 0..1): recorded on the candidate and said in a note."""
    from optimize.models.data import take
    from optimize.transforms.tflite.quantize import _inspect, _read_model

    content = _read_model(Path(model))
    _inspect(content, Path(model))  # a float model only
    made, contract = normalise_boxes(content)
    if ctx.data is not None:
        samples = [take(ctx.data.x_cal, slice(i, i + 1)) for i in range(min(CHECK_SAMPLES, len(ctx.data.x_cal)))]
        _check(_outputs(content, samples, ctx.threads), _outputs(made, samples, ctx.threads), contract)
    ctx.records["contract"] = contract
    ctx.notes.append(f"yolo_head: the output contract changes: {contract.words}.")
    return write_atomic(ctx.workdir / "yolo-head.tflite", made)


def _position(content: bytes, tensor: int) -> tuple[int, str]:
    """(position, name) of the output written to `tensor`, in the order a runner returns them (the signature's
    names and order, else the graph's)."""
    from optimize.models import runtime

    _, _, _, names, outs = runtime.io_details(runtime.describe(content))
    at = [int(d["index"]) for d in outs].index(tensor)
    return at, names[at]

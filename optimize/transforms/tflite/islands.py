"""Float islands the int8 quantizers leave that have an exact integer form, made integer after quantizing.

An integer-only target (int8 with int8 I/O: a microcontroller, an NPU) runs no float op at all, and two
common islands kept transformers and ONNX exports off it:

    integer_casts(q)    CAST of integer values (a padding mask, a token count) to float32, read only by a
                        QUANTIZE: LiteRT Quantizer has no integer CAST ("CAST has no integer version"). The
                        same values are cast to int16 at scale 1 (an integer is its own int16 value) and the
                        QUANTIZE requantizes int16 -> int8: exact for values within the QUANTIZE's range, which
                        must lie within int16's (+-32,767)
    integer_clamps(q)   MINIMUM / MAXIMUM of an int8 activation and a constant (a clamp: ONNX `Clip`, the
                        bounds of an erf or a count) left float between DEQUANTIZE and QUANTIZE: LiteRT
                        Quantizer has no integer MINIMUM. The runtime's int8 MINIMUM / MAXIMUM compare raw
                        values, so the constant is quantized at the activation's own scale and zero point and
                        the result keeps them; a QUANTIZE requantizes it where the next op wants another scale.
                        Exact up to the constant's rounding to that scale (half a step)

Both read and write with normalize's loader (the schema object API ai-edge-litert ships).
"""

from __future__ import annotations

import numpy as np

from optimize.models.normalize import _load, _save, _schema
from optimize.transforms.tflite.graphfix import _buffer, _codes, _holds, _name, _quant, _tensor
from optimize.transforms.tflite.tables import _readers

FLOAT32, INT16, INT8 = 0, 7, 9  # schema TensorType values
INTEGER_TYPES = {2: "int32", 4: "int64", 6: "bool", 3: "uint8", 7: "int16", 9: "int8"}
INT16_MAX = 32767


def _producers(sg) -> dict[int, object]:
    return {int(o): op for op in sg.operators for o in op.outputs if o >= 0}


def _one_scale(t) -> tuple[float, int] | None:
    q = t.quantization
    if q is None or q.scale is None or len(q.scale) != 1:
        return None
    return float(q.scale[0]), int(q.zeroPoint[0]) if q.zeroPoint is not None and len(q.zeroPoint) else 0


def _represented(t) -> tuple[float, float] | None:
    """The real range an int8 tensor holds, from its one scale and zero point."""
    sz = _one_scale(t)
    if sz is None or t.type != INT8:
        return None
    s, z = sz
    return (-128 - z) * s, (127 - z) * s


# ------------------------------------------------------------------------------------------ casts
def _quantizes_only(sg, codes, readers, tensor: int) -> list | None:
    """The QUANTIZE ops (to int8, one scale) that are `tensor`'s only readers; None if anything else reads it."""
    users = readers.get(tensor, [])
    if not users or tensor in [int(o) for o in sg.outputs]:
        return None
    if any(codes[u.opcodeIndex] != "QUANTIZE" or _represented(sg.tensors[int(u.outputs[0])]) is None for u in users):
        return None
    return users


def integer_casts(content: bytes) -> tuple[bytes, list[str]]:
    """Each CAST from an integer (or bool) tensor to float32 that only QUANTIZE ops to int8 read, whose ranges
    lie within int16's: a CAST to int16 at scale 1 instead, the QUANTIZEs requantizing int16 -> int8. Returns the
    model and the casts made integer (their output tensors' names)."""
    if not _holds(content, "CAST"):
        return content, []
    s = _schema()
    model = _load(content)
    codes, sg = _codes(model), model.subgraphs[0]
    readers = _readers(sg)
    done = []
    for op in sg.operators:
        if codes[op.opcodeIndex] != "CAST" or len(op.inputs) < 1:
            continue
        src, out = sg.tensors[int(op.inputs[0])], sg.tensors[int(op.outputs[0])]
        if src.type not in INTEGER_TYPES or out.type != FLOAT32:
            continue
        users = _quantizes_only(sg, codes, readers, int(op.outputs[0]))
        if users is None:
            continue
        ranges = [_represented(sg.tensors[int(u.outputs[0])]) for u in users]
        if any(max(abs(lo), abs(hi)) > INT16_MAX for lo, hi in ranges):
            continue
        out.type = INT16
        out.quantization = _quant(1.0, 0)
        opts = s.CastOptionsT()
        opts.inDataType, opts.outDataType = src.type, INT16
        op.builtinOptionsType, op.builtinOptions = s.BuiltinOptions.CastOptions, opts
        done.append(_name(out))
    return (_save(model), done) if done else (content, [])


# ------------------------------------------------------------------------------------------ clamps
def _float_island(model, sg, codes, producers, readers, op):
    """(the DEQUANTIZE before, the QUANTIZE after, the constant operand's index) of a float MINIMUM / MAXIMUM
    between one int8 activation and a float32 constant, or None."""
    ins = [int(i) for i in op.inputs]
    if len(ins) != 2 or sg.tensors[int(op.outputs[0])].type != FLOAT32:
        return None
    const = [k for k, i in enumerate(ins) if _scalar_const(model, sg, i) is not None]
    if len(const) != 1:
        return None
    deq = producers.get(ins[1 - const[0]])
    if deq is None or codes[deq.opcodeIndex] != "DEQUANTIZE" or _represented(sg.tensors[int(deq.inputs[0])]) is None:
        return None
    users = _quantizes_only(sg, codes, readers, int(op.outputs[0]))
    return (deq, users, const[0]) if users is not None and len(users) == 1 else None


def _scalar_const(model, sg, i: int) -> float | None:
    """The value of a float32 constant holding one number, else None."""
    t = sg.tensors[i]
    buf = model.buffers[t.buffer] if t.buffer and t.buffer < len(model.buffers) else None
    data = getattr(buf, "data", None)
    if t.type != FLOAT32 or data is None or len(data) != 4:
        return None
    return float(np.frombuffer(np.asarray(data, np.uint8).tobytes(), np.float32)[0])


def integer_clamps(content: bytes) -> tuple[bytes, list[str]]:
    """Each float MINIMUM / MAXIMUM of a dequantized int8 activation and a scalar constant, quantized right
    after: the int8 op on the activation itself, the constant at the activation's scale and zero point, and a
    QUANTIZE (int8 -> int8) to the scale the float island's QUANTIZE had. Returns the model and the ops made
    integer (their output tensors' names)."""
    if not _holds(content, "MINIMUM", "MAXIMUM"):
        return content, []
    model = _load(content)
    codes, sg = _codes(model), model.subgraphs[0]
    producers, readers = _producers(sg), _readers(sg)
    done = []
    for op in list(sg.operators):
        if codes[op.opcodeIndex] not in ("MINIMUM", "MAXIMUM"):
            continue
        found = _float_island(model, sg, codes, producers, readers, op)
        if found is None:
            continue
        deq, (quantize,), k = found
        x = int(deq.inputs[0])
        scale, zero = _one_scale(sg.tensors[x])
        value = _scalar_const(model, sg, int(op.inputs[k]))
        q = np.array(np.clip(np.round(value / scale) + zero, -128, 127), np.int8).reshape(1)
        bound = _tensor(sg, f"{_name(sg.tensors[int(op.outputs[0])])}/bound", [1], INT8, _buffer(model, q.tobytes()))
        sg.tensors[bound].quantization = _quant(scale, zero)
        out = sg.tensors[int(op.outputs[0])]
        out.type, out.quantization = INT8, _quant(scale, zero)
        old = int(op.inputs[k])
        op.inputs = np.array([x, bound] if k == 1 else [bound, x], np.int32)
        if not any(old in [int(i) for i in o.inputs] for o in sg.operators):
            model.buffers[sg.tensors[old].buffer].data = None  # the float bound no op reads any more
        quantize.inputs = np.array([int(op.outputs[0])], np.int32)  # int8 -> int8: requantized to its scale
        done.append(_name(out))
    if not done:
        return content, []
    _drop_dead(sg, codes)
    return _save(model), done


def _drop_dead(sg, codes) -> None:
    """DEQUANTIZE ops whose output nothing reads any more removed."""
    read = {int(i) for op in sg.operators for i in op.inputs if i >= 0} | {int(o) for o in sg.outputs}
    sg.operators = [op for op in sg.operators if codes[op.opcodeIndex] != "DEQUANTIZE" or int(op.outputs[0]) in read]


def complete(content: bytes) -> tuple[bytes, list[str]]:
    """Both edits, and one line per kind saying which ops were made integer."""
    said = []
    content, casts = integer_casts(content)
    if casts:
        said.append(
            f"{len(casts)} CAST(s) of integer values to float ({_shown(casts)}) cast to int16 at scale 1 and "
            "requantized to int8 (LiteRT Quantizer has no integer CAST)"
        )
    content, clamps = integer_clamps(content)
    if clamps:
        said.append(
            f"{len(clamps)} MINIMUM/MAXIMUM op(s) with a constant ({_shown(clamps)}) computed in int8 at their "
            "input's scale (LiteRT Quantizer leaves them float)"
        )
    return content, said


def _shown(names: list[str]) -> str:
    return ", ".join(repr(n) for n in names[:2]) + (f" and {len(names) - 2} more" if len(names) > 2 else "")

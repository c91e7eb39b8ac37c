"""A copy of a candidate in the GPU's arithmetic, for the CPU interpreter to run: what a GPU computes from the
same file, emulated where no GPU exists.

A GPU delegate does not run the CPU's integer and hybrid kernels. It dequantizes weights and computes in float:
- dynamic range (int8 weights, float activations): the CPU's hybrid kernels quantize activations on the fly, the
  GPU multiplies float activations by the dequantized weights. Emulated by dequantizing every quantized
  constant into a float32 one (measured on MediaPipe's hand landmark model: this copy on the CPU and the H100's
  GPU accelerator on the original agree to 0.01-0.07% of range per output; the CPU on the original is 2x off);
- full integer (int8): weights and biases dequantized, float math, each int8 activation rounded to its scale's
  grid (a QUANTIZE then DEQUANTIZE after the op that makes it) as the delegate's quantize-dequantize emulation;
- float16 weights: float16 computation: every float activation rounded to float16 (CAST to float16 and back).
A model with int16 activations (int16x8) is not emulated: the GPU accelerator runs it on the CPU.
Pure flatbuffer rewriting with the schema ai-edge-litert ships; the graph's inputs and outputs keep their types.
"""

from __future__ import annotations

import numpy as np

from optimize.models.normalize import _load, _save, _schema

FLOAT32, FLOAT16, INT32, UINT8, INT16, INT8, INT4 = 0, 1, 2, 3, 7, 9, 17
QUANTIZED = (INT8, UINT8, INT16)
INT16X8 = "int16 activations (int16x8): the GPU accelerator runs the model on the CPU"


class NotEmulated(Exception):
    """The candidate has no GPU arithmetic of its own to emulate (the reason is the message)."""


def _code(model, builtin: int, version: int) -> int:
    """The index of an operator code for `builtin` (added when the model has none)."""
    for i, c in enumerate(model.operatorCodes):
        if max(c.builtinCode or 0, c.deprecatedBuiltinCode or 0) == builtin:
            c.version = max(c.version or 1, version)
            return i
    s = _schema()
    c = s.OperatorCodeT()
    c.builtinCode, c.deprecatedBuiltinCode, c.version = builtin, min(builtin, 127), version
    model.operatorCodes.append(c)
    return len(model.operatorCodes) - 1


def _data(model, t) -> np.ndarray | None:
    buf = model.buffers[t.buffer] if t.buffer and t.buffer < len(model.buffers) else None
    data = getattr(buf, "data", None)
    return None if data is None or len(data) == 0 else np.asarray(data, dtype=np.uint8)


def _scale(t) -> tuple[np.ndarray, np.ndarray, int] | None:
    q = t.quantization
    if q is None or q.scale is None or len(q.scale) == 0:
        return None
    zp = np.asarray(q.zeroPoint if q.zeroPoint is not None and len(q.zeroPoint) else [0], np.float64)
    return np.asarray(q.scale, np.float64), zp, int(q.quantizedDimension or 0)


def _values(raw: np.ndarray, t) -> np.ndarray:
    n = int(np.prod(t.shape)) if t.shape is not None and len(t.shape) else 1
    if t.type == INT4:
        low, high = (raw & 0x0F).astype(np.int8), (raw >> 4).astype(np.int8)
        v = np.stack([low, high], axis=1).reshape(-1)[:n]
        return np.where(v > 7, v - 16, v).astype(np.float64)
    dtype = {INT8: np.int8, UINT8: np.uint8, INT16: np.int16, INT32: np.int32}[t.type]
    return raw.view(dtype)[:n].astype(np.float64)


def _dequantized(raw: np.ndarray, t) -> np.ndarray:
    scale, zp, dim = _scale(t)
    v = _values(raw, t).reshape(tuple(t.shape) if t.shape is not None and len(t.shape) else ())
    if scale.size > 1 and v.ndim:
        shape = [1] * v.ndim
        shape[dim] = -1
        scale, zp = scale.reshape(shape), (zp.reshape(shape) if zp.size > 1 else zp)
    return ((v - zp) * scale).astype(np.float32)


def _tensor(sg, like, dtype: int, suffix: str, quantization=None) -> int:
    s = _schema()
    t = s.TensorT()
    t.shape, t.shapeSignature, t.type, t.buffer = like.shape, like.shapeSignature, dtype, 0
    name = like.name.decode() if isinstance(like.name, bytes) else (like.name or "t")
    t.name, t.quantization = f"{name}/{suffix}", quantization
    sg.tensors.append(t)
    return len(sg.tensors) - 1


def _op(code: int, inputs: list[int], outputs: list[int], cast: tuple[int, int] | None = None):
    s = _schema()
    op = s.OperatorT()
    op.opcodeIndex, op.inputs, op.outputs = code, inputs, outputs
    if cast is not None:
        opts = s.CastOptionsT()
        opts.inDataType, opts.outDataType = cast
        op.builtinOptionsType, op.builtinOptions = s.BuiltinOptions.CastOptions, opts
    return op


def gpu_copy(content: bytes, fp16: bool | None = None) -> tuple[bytes, str]:
    """The candidate rewritten into the GPU's arithmetic, and what was done in a line; NotEmulated when the
    GPU computes it as the CPU does (a plain float32 model) or runs it on the CPU (int16x8)."""
    s = _schema()
    model = _load(content)
    sg = model.subgraphs[0]
    ops = list(sg.operators)
    codes = [max(c.builtinCode or 0, c.deprecatedBuiltinCode or 0) for c in model.operatorCodes]
    deq, quant = s.BuiltinOperator.DEQUANTIZE, s.BuiltinOperator.QUANTIZE
    produced = {int(o) for op in ops for o in op.outputs}
    consts = {i for i, t in enumerate(sg.tensors) if i not in produced and _data(model, t) is not None}
    into_deq = {int(i) for op in ops if codes[op.opcodeIndex] == deq for i in op.inputs}
    if any(sg.tensors[i].type == INT16 and _scale(sg.tensors[i]) for i in produced | set(sg.inputs)):
        raise NotEmulated(INT16X8)
    weights = 0
    for i in sorted(consts - into_deq):  # quantized weights and biases -> float32 constants
        t = sg.tensors[i]
        if t.type in (*QUANTIZED, INT4, INT32) and _scale(t) is not None:
            buf = s.BufferT()
            buf.data = np.frombuffer(_dequantized(_data(model, t), t).tobytes(), np.uint8)
            model.buffers.append(buf)
            t.buffer, t.type, t.quantization = len(model.buffers) - 1, FLOAT32, None
            weights += 1
    half = (
        fp16
        if fp16 is not None
        else any(
            sg.tensors[int(op.inputs[0])].type == FLOAT16 and int(op.inputs[0]) in consts
            for op in ops
            if codes[op.opcodeIndex] == deq
        )
    )
    acts = {
        i for i in produced | {int(x) for x in sg.inputs} if sg.tensors[i].type in QUANTIZED and _scale(sg.tensors[i])
    }
    if not weights and not acts and not half:
        raise NotEmulated("float32 arithmetic, as on the CPU")
    d_code, q_code = _code(model, deq, 4), _code(model, quant, 3)
    c_code = _code(model, s.BuiltinOperator.CAST, 1) if half else -1
    alias: dict[int, int] = {}
    out: list = []

    def after(i: int, fp16: bool) -> None:
        """Consumers read a float view of tensor i: dequantized (an int8 activation) or rounded to float16."""
        t = sg.tensors[i]
        if i in acts:
            alias[i] = _tensor(sg, t, FLOAT32, "gpu")
            out.append(_op(d_code, [i], [alias[i]]))
        elif fp16 and t.type == FLOAT32:
            h, back = _tensor(sg, t, FLOAT16, "fp16"), _tensor(sg, t, FLOAT32, "gpu")
            out.extend([_op(c_code, [i], [h], (FLOAT32, FLOAT16)), _op(c_code, [h], [back], (FLOAT16, FLOAT32))])
            alias[i] = back

    for i in [int(x) for x in sg.inputs]:
        after(i, half)
    for op in ops:
        code = codes[op.opcodeIndex]
        keeps_ints = code in (deq, quant)
        op.inputs = [int(i) if keeps_ints or int(i) < 0 else alias.get(int(i), int(i)) for i in op.inputs]
        made, outputs = [], [int(x) for x in op.outputs]
        if not keeps_ints:
            for k, o in enumerate(int(x) for x in op.outputs):
                if o in acts:  # the op computes in float; its int8 output is the rounding of that
                    f = _tensor(sg, sg.tensors[o], FLOAT32, "float")
                    op.outputs[k] = f
                    made.append(_op(q_code, [f], [o]))
        out.extend([op, *made])
        from_const = code == deq and int(op.inputs[0]) in consts  # a float16 weight: float16 already
        for o in outputs:
            if o >= 0:
                after(o, half and not from_const)
    sg.operators = out
    words = []
    if weights:
        words.append(f"{weights} quantized weight tensors dequantized to float32")
    if acts:
        words.append(f"{len(acts)} int8 activations rounded to their scales, float math")
    if half:
        words.append("float16 computation (every activation rounded to float16)")
    return _save(model), "; ".join(words)

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


class _Rewrite:
    """The main subgraph of one model and what its rewrite into the GPU's arithmetic needs to know."""

    def __init__(self, content: bytes):
        s = _schema()
        self.model = _load(content)
        self.sg = self.model.subgraphs[0]
        self.ops = list(self.sg.operators)
        self.codes = [max(c.builtinCode or 0, c.deprecatedBuiltinCode or 0) for c in self.model.operatorCodes]
        self.deq, self.quant = s.BuiltinOperator.DEQUANTIZE, s.BuiltinOperator.QUANTIZE
        self.produced = {int(o) for op in self.ops for o in op.outputs}
        self.consts = {
            i for i, t in enumerate(self.sg.tensors) if i not in self.produced and _data(self.model, t) is not None
        }
        self.alias: dict[int, int] = {}
        self.out: list = []

    def code(self, op) -> int:
        return self.codes[op.opcodeIndex]

    def int16(self) -> bool:
        t = self.sg.tensors
        return any(t[i].type == INT16 and _scale(t[i]) for i in self.produced | {int(x) for x in self.sg.inputs})

    def dequantize_weights(self) -> int:
        """Quantized weights and biases (not those a DEQUANTIZE reads) made float32 constants; how many."""
        into_deq = {int(i) for op in self.ops if self.code(op) == self.deq for i in op.inputs}
        done = 0
        for i in sorted(self.consts - into_deq):
            t = self.sg.tensors[i]
            if t.type in (*QUANTIZED, INT4, INT32) and _scale(t) is not None:
                buf = _schema().BufferT()
                buf.data = np.frombuffer(_dequantized(_data(self.model, t), t).tobytes(), np.uint8)
                self.model.buffers.append(buf)
                t.buffer, t.type, t.quantization = len(self.model.buffers) - 1, FLOAT32, None
                done += 1
        return done

    def float16_weights(self) -> bool:
        """Whether the model keeps float16 weights behind DEQUANTIZE (a float16 candidate)."""
        ins = [int(op.inputs[0]) for op in self.ops if self.code(op) == self.deq]
        return any(self.sg.tensors[i].type == FLOAT16 and i in self.consts for i in ins)

    def activations(self) -> set[int]:
        """The quantized activation tensors (graph inputs included)."""
        t = self.sg.tensors
        return {i for i in self.produced | {int(x) for x in self.sg.inputs} if t[i].type in QUANTIZED and _scale(t[i])}

    def after(self, i: int, acts: set[int], fp16: bool, codes: tuple[int, int]) -> None:
        """Consumers read a float view of tensor i: dequantized (an int8 activation) or rounded to float16."""
        t, (d_code, c_code) = self.sg.tensors[i], codes
        if i in acts:
            self.alias[i] = _tensor(self.sg, t, FLOAT32, "gpu")
            self.out.append(_op(d_code, [i], [self.alias[i]]))
        elif fp16 and t.type == FLOAT32:
            h, back = _tensor(self.sg, t, FLOAT16, "fp16"), _tensor(self.sg, t, FLOAT32, "gpu")
            self.out += [_op(c_code, [i], [h], (FLOAT32, FLOAT16)), _op(c_code, [h], [back], (FLOAT16, FLOAT32))]
            self.alias[i] = back

    def float_math(self, acts: set[int], half: bool) -> None:
        """Every op in float: an op that made an int8 activation makes a float one, rounded to the int8 one's
        grid (QUANTIZE) and read back (DEQUANTIZE); QUANTIZE and DEQUANTIZE ops keep their integer side."""
        s = _schema()
        q_code = _code(self.model, self.quant, 3)
        codes = (_code(self.model, self.deq, 4), _code(self.model, s.BuiltinOperator.CAST, 1) if half else -1)
        for i in [int(x) for x in self.sg.inputs]:
            self.after(i, acts, half, codes)
        for op in self.ops:
            outputs = self.in_float(op, acts, q_code)
            from_const = self.code(op) == self.deq and int(op.inputs[0]) in self.consts  # float16 weights already
            for o in (o for o in outputs if o >= 0):
                self.after(o, acts, half and not from_const, codes)
        self.sg.operators = self.out

    def left_integer(self) -> str | None:
        """The first op that still reads or writes a quantized tensor the float rewrite cannot reach (an LSTM's
        state and intermediates, a control-flow body), by name; run as it is, such a copy corrupts the
        interpreter's memory."""
        names = {v: k for k, v in _schema().BuiltinOperator.__dict__.items() if isinstance(v, int)}
        codes = [max(c.builtinCode or 0, c.deprecatedBuiltinCode or 0) for c in self.model.operatorCodes]  # + added
        for op in self.sg.operators:
            code = codes[op.opcodeIndex]
            if code not in (self.deq, self.quant) and self._reads_quantized(op):
                return names.get(code, str(code))
        if any(_scale(x) and x.type in QUANTIZED for sg in self.model.subgraphs[1:] for x in sg.tensors):
            return "a control-flow body (subgraph)"
        return None

    def _reads_quantized(self, op) -> bool:
        """Whether an op reads or writes (intermediates included) a quantized tensor."""
        t = self.sg.tensors
        used = [*op.inputs, *op.outputs, *(op.intermediates if op.intermediates is not None else [])]
        return any(i >= 0 and t[i].type in QUANTIZED and _scale(t[i]) for i in (int(x) for x in used))

    def in_float(self, op, acts: set[int], q_code: int) -> list[int]:
        """One op reading the float views of its inputs and, where it made an int8 activation, making a float one
        rounded to that (QUANTIZE after it); its original outputs."""
        keeps_ints = self.code(op) in (self.deq, self.quant)
        op.inputs = [i if keeps_ints or i < 0 else self.alias.get(i, i) for i in (int(x) for x in op.inputs)]
        made, outputs = [], [int(x) for x in op.outputs]
        for k, o in enumerate(outputs):
            if o in acts and not keeps_ints:
                op.outputs[k] = _tensor(self.sg, self.sg.tensors[o], FLOAT32, "float")
                made.append(_op(q_code, [int(op.outputs[k])], [o]))
        self.out += [op, *made]
        return outputs


def gpu_copy(content: bytes, fp16: bool | None = None) -> tuple[bytes, str]:
    """The candidate rewritten into the GPU's arithmetic, and what was done in a line; NotEmulated when the
    GPU computes it as the CPU does (a plain float32 model) or runs it on the CPU (int16x8). `fp16`: round every
    float activation to float16 (default: for a model with float16 weights)."""
    rw = _Rewrite(content)
    if rw.int16():
        raise NotEmulated(INT16X8)
    weights = rw.dequantize_weights()
    half = rw.float16_weights() if fp16 is None else fp16
    acts = rw.activations()
    if not weights and not acts and not half:
        raise NotEmulated("float32 arithmetic, as on the CPU")
    rw.float_math(acts, half)
    if (op := rw.left_integer()) is not None:
        raise NotEmulated(f"{op} keeps integer state the GPU emulation cannot rewrite")
    words = [f"{weights} quantized weight tensors dequantized to float32"] if weights else []
    words += [f"{len(acts)} int8 activations rounded to their scales, float math"] if acts else []
    words += ["float16 computation (every activation rounded to float16)"] if half else []
    return _save(rw.model), "; ".join(words)

"""A float .tflite's main subgraph opened for the fit's rewrites: new tensors and ops, rewired readers, ops
taken out, constants seen in another shape, and the whole saved again. Built on `flatedit.Graph` (constants,
producers, consumers) and `graphfix`'s makers of tensors, buffers and ops (the schema object API ai-edge-litert
ships), so every rewrite of `fit_rewrites` is a few lines of intent.

The model's inputs and outputs are never rewired here: `redirect` leaves a graph output where it is (a
rewrite that would move one writes it again instead), so names, shapes and dtypes at the edges stay.
"""

from __future__ import annotations

import numpy as np

from optimize.models.normalize import _schema
from optimize.transforms.tflite.flatedit import Graph
from optimize.transforms.tflite.graphfix import _buffer, _codes, _op, _tensor

FLOAT32, INT32 = 0, 2
#: Ops never removed as dead: they act beyond their outputs (state, control flow, custom code).
SIDE_EFFECTS = frozenset(
    {"CALL_ONCE", "ASSIGN_VARIABLE", "VAR_HANDLE", "READ_VARIABLE", "WHILE", "IF", "CUSTOM", "CALL", "?"}
)


class Edit:
    """The main subgraph of a model being rewritten (ops addressed by their current index)."""

    def __init__(self, content: bytes):
        self.g = Graph.load(content)
        self.model, self.sg = self.g.model, self.g.sg

    # ---- reading
    def name(self, k: int) -> str:
        """The builtin name of op k (read afresh: ops come and go)."""
        return _codes(self.model)[self.sg.operators[k].opcodeIndex]

    @property
    def count(self) -> int:
        return len(self.sg.operators)

    def op(self, k: int):
        return self.sg.operators[k]

    def ins(self, k: int) -> list[int]:
        return [int(i) for i in self.op(k).inputs]

    def out(self, k: int) -> int:
        return int(self.op(k).outputs[0])

    def shape(self, t: int) -> tuple[int, ...]:
        return self.g.shape(t)

    def dtype(self, t: int) -> int:
        return int(self.sg.tensors[t].type)

    def const(self, t: int) -> np.ndarray | None:
        """A constant's values in its shape (any dtype), or None for a tensor computed at run time."""
        if t < 0:
            return None
        x = self.sg.tensors[t]
        data = getattr(self.model.buffers[x.buffer], "data", None) if x.buffer else None
        if data is None or not len(data):
            return None
        kind = {0: np.float32, 1: np.float16, 2: np.int32, 4: np.int64, 6: np.bool_, 9: np.int8}.get(x.type)
        if kind is None:
            return None
        raw = np.asarray(data, np.uint8).tobytes()
        return np.frombuffer(raw, kind).reshape(self.shape(t)).copy()

    def is_const(self, t: int) -> bool:
        x = self.sg.tensors[t]
        return bool(x.buffer) and getattr(self.model.buffers[x.buffer], "data", None) is not None

    def producer(self, t: int) -> int | None:
        return self.g.producer(t)

    def readers(self, t: int) -> list[int]:
        return self.g.consumers(t)

    def is_output(self, t: int) -> bool:
        return self.g.is_output(t)

    def options(self, k: int):
        return self.op(k).builtinOptions

    def tensor_name(self, t: int) -> str:
        return self.g.tensor_name(t)

    def input_name(self, t: int) -> str:
        """A model input's signature name (its tensor's name without a signature)."""
        for sd in self.model.signatureDefs or []:
            for tm in sd.inputs or [] if (sd.subgraphIndex or 0) == 0 else []:
                if int(tm.tensorIndex) == t:
                    return tm.name.decode() if isinstance(tm.name, bytes) else str(tm.name)
        return self.tensor_name(t)

    # ---- writing
    def tensor(self, like: int, shape, suffix: str, dtype: int | None = None) -> int:
        """A new run-time tensor named after `like`, of `shape` (and `like`'s dtype unless given)."""
        src = self.sg.tensors[like]
        kind = src.type if dtype is None else dtype
        return _tensor(self.sg, f"{self.tensor_name(like)}/{suffix}", list(shape), kind)

    def constant(self, name: str, values: np.ndarray, dtype: int) -> int:
        """A new constant of its own buffer."""
        return _tensor(self.sg, name, list(values.shape), dtype, _buffer(self.model, values.tobytes()))

    def seen_as(self, t: int, shape, suffix: str = "shaped") -> int:
        """Constant `t` read in another shape of the same size: `t` itself, reshaped, when one op reads it;
        else a copy (two tensors on one buffer would be quantized apart, and the buffer with them)."""
        src = self.sg.tensors[t]
        if len(self.readers(t)) == 1 and not self.is_output(t):
            src.shape = np.array(list(shape), np.int32)
            src.shapeSignature = None
            return t
        data = bytes(np.asarray(self.model.buffers[src.buffer].data, np.uint8))
        name = f"{self.tensor_name(t)}/{suffix}"
        return _tensor(self.sg, name, list(shape), src.type, _buffer(self.model, data), src.quantization)

    def insert(self, at: int, name: str, inputs, outputs, options_type=None, options=None) -> int:
        """Op `name` put at position `at` (before the op now there): returns its index."""
        self.sg.operators.insert(at, _op(self.model, name, inputs, outputs, options_type, options))
        return at

    def reshape(self, at: int, src: int, shape, suffix: str = "reshaped", out: int | None = None) -> int:
        """A RESHAPE of `src` to `shape` put at `at`; returns its output (`out`, or a new tensor)."""
        s = _schema()
        shape = [int(d) for d in shape]
        dims = self.constant(f"{self.tensor_name(src)}/{suffix}_shape", np.array(shape, np.int32), INT32)
        out = self.tensor(src, shape, suffix) if out is None else out
        opts = s.ReshapeOptionsT()
        opts.newShape = np.array(shape, np.int32)
        self.insert(at, "RESHAPE", [src, dims], [out], s.BuiltinOptions.ReshapeOptions, opts)
        return out

    def set_input(self, k: int, slot: int, t: int) -> None:
        ins = self.ins(k)
        ins[slot] = t
        self.op(k).inputs = np.array(ins, np.int32)

    def redirect(self, old: int, new: int, skip: int | None = None) -> None:
        """Every op reading `old` (but op `skip`) reads `new` instead (graph outputs stay where they are)."""
        for k in range(self.count):
            if k != skip and old in self.ins(k):
                self.op(k).inputs = np.array([new if i == old else i for i in self.ins(k)], np.int32)

    def remove(self, k: int) -> None:
        del self.sg.operators[k]

    def retype(self, k: int, name: str, options_type, options) -> None:
        """Op k computed as builtin `name` with new options (its inputs and outputs set by the caller)."""
        op = _op(self.model, name, self.ins(k), [self.out(k)], options_type, options)
        op.outputs = self.op(k).outputs
        self.sg.operators[k] = op

    def save(self) -> bytes:
        """The model, with the ops whose results nothing reads any more (the SHAPE, STRIDED_SLICE and PACK that
        computed a removed RESHAPE's shape) and the tensors nothing uses taken out, their buffers emptied."""
        self._dead_ops()
        self._prune()
        return self.g.save()

    def _dead_ops(self) -> None:
        """Ops without side effects whose outputs no op reads and are no graph outputs, removed (repeatedly)."""
        outputs = {int(i) for i in self.sg.outputs}
        while True:
            read = {int(i) for op in self.sg.operators for i in op.inputs if i >= 0}
            dead = [
                k
                for k in range(self.count)
                if self.name(k) not in SIDE_EFFECTS and not ({int(o) for o in self.op(k).outputs} & (read | outputs))
            ]
            if not dead:
                return
            for k in reversed(dead):
                self.remove(k)

    def _prune(self) -> None:
        sg = self.sg
        used = {int(i) for op in sg.operators for i in [*op.inputs, *op.outputs] if i >= 0}
        used |= {int(i) for i in [*sg.inputs, *sg.outputs]}
        if len(used) == len(sg.tensors):
            return
        self._empty_buffers(used)
        keep = sorted(used)
        where = {old: new for new, old in enumerate(keep)}
        sg.tensors = [sg.tensors[k] for k in keep]
        for op in sg.operators:
            op.inputs, op.outputs = _moved(op.inputs, where), _moved(op.outputs, where)
        sg.inputs, sg.outputs = _moved(sg.inputs, where), _moved(sg.outputs, where)
        for tm in self._signature_maps():
            tm.tensorIndex = where[int(tm.tensorIndex)]

    def _signature_maps(self) -> list:
        """The main graph's signature entries (input and output names to tensor indices)."""
        out = []
        for sd in self.model.signatureDefs or []:
            if (sd.subgraphIndex or 0) == 0:
                out += [*(sd.inputs or []), *(sd.outputs or [])]
        return out

    def _empty_buffers(self, used: set[int]) -> None:
        """The buffers of tensors about to go that no other tensor reads: emptied (no bytes left behind)."""
        sg = self.sg
        read = {t.buffer for k, t in enumerate(sg.tensors) if k in used}
        read |= {t.buffer for g in self.model.subgraphs if g is not sg for t in g.tensors}
        for k, t in enumerate(sg.tensors):
            if k not in used and t.buffer and t.buffer not in read:
                self.model.buffers[t.buffer].data = None


def _moved(ids, where: dict[int, int]) -> np.ndarray:
    return np.array([where[int(i)] if i >= 0 else -1 for i in ids], np.int32)

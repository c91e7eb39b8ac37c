"""Edit a float32 .tflite's constants in place: the object model of the schema ai-edge-litert ships, read and
written with normalize's loader (buffers stored after the flatbuffer are read inline), the graph untouched.

The accuracy-rescue transforms (optimize.transforms.tflite.equalize, optimize.transforms.tflite.rounding) change weights and biases only: they
read a constant as a numpy array, write a new one into a buffer of its own (a buffer two tensors share is
never changed under the other), and save. Ops are addressed by index in the main subgraph.

    g = Graph.load(content); w = g.const(op.inputs[1]); g.set_const(op.inputs[1], w * 2); g.save()
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from optimize.models.normalize import _load, _save, _schema

ACTIVATIONS = {0: "NONE", 1: "RELU", 2: "RELU_N1_TO_1", 3: "RELU6", 4: "TANH", 5: "SIGN_BIT"}


@dataclass
class Graph:
    """The main subgraph of a float model, its op names, producers and consumers."""

    model: object  # schema ModelT
    names: list[str] = field(default_factory=list)  # per op: its builtin name

    @classmethod
    def load(cls, content: bytes) -> Graph:
        model = _load(content)
        s = _schema()
        by_code = {v: k for k, v in vars(s.BuiltinOperator).items() if not k.startswith("_")}
        codes = [by_code.get(max(c.builtinCode or 0, c.deprecatedBuiltinCode or 0), "?") for c in model.operatorCodes]
        sg = model.subgraphs[0]
        return cls(model, [codes[op.opcodeIndex] for op in sg.operators])

    @property
    def sg(self):
        return self.model.subgraphs[0]

    @property
    def ops(self) -> list:
        return self.sg.operators

    def save(self) -> bytes:
        return _save(self.model)

    def tensor(self, i: int):
        return self.sg.tensors[i]

    def tensor_name(self, i: int) -> str:
        name = self.sg.tensors[i].name
        return name.decode() if isinstance(name, bytes) else str(name)

    def shape(self, i: int) -> tuple[int, ...]:
        return tuple(int(d) for d in (self.sg.tensors[i].shape if self.sg.tensors[i].shape is not None else ()))

    def const(self, i: int) -> np.ndarray | None:
        """A float32 constant's values in its shape, or None (not constant, not float32)."""
        if i < 0:
            return None
        t = self.sg.tensors[i]
        buf = self.model.buffers[t.buffer] if t.buffer and t.buffer < len(self.model.buffers) else None
        data = getattr(buf, "data", None)
        if data is None or len(data) == 0 or t.type != 0:
            return None
        return np.frombuffer(np.asarray(data, np.uint8).tobytes(), np.float32).reshape(self.shape(i)).copy()

    def set_const(self, i: int, values: np.ndarray) -> None:
        """Store `values` (float32, the tensor's shape) in the tensor's buffer, or in a new one of its own
        when another tensor shares it."""
        data = np.frombuffer(np.ascontiguousarray(values, np.float32).tobytes(), np.uint8)
        t = self.sg.tensors[i]
        shared = sum(x.buffer == t.buffer for sg in self.model.subgraphs for x in sg.tensors) > 1
        if t.buffer and not shared:
            self.model.buffers[t.buffer].data = data
            return
        buf = _schema().BufferT()
        buf.data = data
        self.model.buffers.append(buf)
        t.buffer = len(self.model.buffers) - 1

    def activation(self, op_index: int) -> str:
        """The op's fused activation ('NONE' when it has none)."""
        opts = self.ops[op_index].builtinOptions
        return ACTIVATIONS.get(getattr(opts, "fusedActivationFunction", 0) or 0, "?")

    def options(self, op_index: int):
        return self.ops[op_index].builtinOptions

    def producer(self, tensor: int) -> int | None:
        return next((k for k, op in enumerate(self.ops) if tensor in list(op.outputs)), None)

    def consumers(self, tensor: int) -> list[int]:
        return [k for k, op in enumerate(self.ops) if tensor in list(op.inputs)]

    def is_output(self, tensor: int) -> bool:
        return tensor in list(self.sg.outputs)

    def inputs(self, op_index: int) -> list[int]:
        return [int(i) for i in self.ops[op_index].inputs]

    def output(self, op_index: int) -> int:
        return int(self.ops[op_index].outputs[0])


LINEAR = ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED")


def clustered(w: np.ndarray | None) -> bool:
    """Weights that hold a few shared values (weight clustering): at most 256 distinct, 4+ uses each."""
    if w is None:
        return False
    distinct = len(np.unique(w))
    return distinct <= 256 and distinct * 4 <= w.size

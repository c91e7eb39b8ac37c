"""What an opened model is: a `ModelSource` (where, what kind, its fingerprint, and what every later step asks
of it) and its `InputSpec`s; how a float .tflite is described (normalised, its inputs, outputs and heads).
`source` opens Keras, SavedModel and .tflite files into one, `optimize.convert.formats` PyTorch and ONNX models."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np

Kind = Literal["keras2", "keras3", "savedmodel", "tflite", "onnx", "pt2", "module", "graphdef"]
#: Sources the pipeline sees as one float .tflite: a .tflite, and PyTorch / ONNX models and TF1 graphs once converted.
FLAT_KINDS = ("tflite", "onnx", "pt2", "module", "graphdef")
#: Sources that TensorFlow opens, checks and converts (a worker for them imports it first).
TF_KINDS = ("keras2", "keras3", "savedmodel")
#: PyTorch and ONNX sources (converted once to a float .tflite by litert-torch, `optimize.convert.torch_route`).
TORCH_KINDS = ("onnx", "pt2", "module")
#: Sources converted once, at the door, to the float .tflite the pipeline takes: PyTorch, ONNX, TF1 graphs.
CONVERTED_KINDS = (*TORCH_KINDS, "graphdef")
#: Why pruning, clustering and QAT are left out for a model converted at the door (and refused when asked for).
TRAINING = (
    "pruning, clustering and QAT fine-tune Keras models (tfmot), and a PyTorch, ONNX or TF1 graph model has none: "
    "its float .tflite cannot be fine-tuned"
)


@dataclass(frozen=True)
class InputSpec:
    """One model input: its name (the signature key of the converted model), shape (batch first, -1
    unknown) and dtype."""

    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"


@dataclass(frozen=True)
class ModelSource:
    """A model, opened once: where it is, what kind, its fingerprint, and (after `opened`) what every later
    step asks of it: for a .tflite its normalised float32 bytes and what normalising changed; for every
    kind its inputs and outputs. It is a plain value: it travels with each task to any worker or node."""

    path: Path
    kind: Kind
    fingerprint: str
    trusted: bool = False  # the user vouched for Python code in the file (--trust-model-code)
    content: bytes | None = field(default=None, repr=False, compare=False)  # .tflite: normalised bytes
    facts: tuple[str, ...] = ()  # what normalising changed (empty: the file is plain float32 already)
    inputs: tuple[InputSpec, ...] | None = field(default=None, compare=False)
    outputs: tuple[str, ...] | None = field(default=None, compare=False)
    conversion: Any = field(default=None, repr=False, compare=False)  # PyTorch / ONNX: results.Conversion
    module: Any = field(default=None, repr=False, compare=False)  # an nn.Module (Python API) before it is exported
    id_bounds: tuple = field(default=(), compare=False)  # vocabulary.IdBound per id input, read when it was opened
    heads: tuple = field(default=(), compare=False)  # (output name, tasks.Head) per output of a .tflite, when opened

    @property
    def name(self) -> str:
        return self.path.stem if self.path.is_file() or self.kind == "module" else self.path.name

    @property
    def flat(self) -> bool:
        """The pipeline sees a float .tflite: this one, or the one a PyTorch or ONNX model was converted to."""
        return self.kind in FLAT_KINDS

    @property
    def torch(self) -> bool:
        """A PyTorch or ONNX model (converted once to a float .tflite by litert-torch)."""
        return self.kind in TORCH_KINDS

    @property
    def converted(self) -> bool:
        """A model converted once at the door to its float .tflite (PyTorch, ONNX, a TF1 graph): its own error
        against its own runtime is measured, and there is no Keras model to fine-tune."""
        return self.kind in CONVERTED_KINDS


def fingerprint_of(*parts: str) -> str:
    """One fingerprint from several (a source file's and how it was converted)."""
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def digest(name: str, content: bytes) -> str:
    """A model file's fingerprint from its name and bytes (what `_fingerprint` computes for one file)."""
    h = hashlib.sha256(os.fsencode(name))
    h.update(content)
    return h.hexdigest()[:16]


def tflite_io(content: bytes) -> tuple[tuple[InputSpec, ...], tuple[str, ...]]:
    """Inputs and outputs of a .tflite as the techniques see them (its signature's names), read from its parse:
    custom ops this runtime lacks do not matter."""
    from optimize.models.tflite import read_model, signature_io

    inputs, outputs = signature_io(read_model(content))
    return tuple(InputSpec(*i) for i in inputs), outputs


def opened_content(src: ModelSource, content: bytes) -> ModelSource:
    """A source whose float .tflite is `content` (a PyTorch or ONNX model's conversion): normalised, described."""
    return opened_tflite(src, content)


def integer_inputs(content: bytes) -> list[tuple[str, str]]:
    """(name, dtype) of each input of a .tflite that takes integers which are not quantized values (token ids,
    masks, user ids: no scale): integer I/O leaves them as they are, as it must."""
    from optimize.models import runtime

    _, names, ins, _, _ = runtime.io_details(runtime.describe(content))
    return [
        (n, np.dtype(d["dtype"]).name)
        for n, d in zip(names, ins)
        if np.issubdtype(d["dtype"], np.integer) and not (d.get("quantization") or (0.0, 0))[0]
    ]


def integer_io_note(content: bytes, io: str, who: str) -> str | None:
    """What integer I/O did to a model with integer inputs: quantized its float inputs and outputs only."""
    kept = integer_inputs(content) if io != "float" else []
    if not kept:
        return None
    listed = ", ".join(f"{n} ({t})" for n, t in kept)
    return (
        f"{who}: {io} I/O quantizes the float inputs and outputs only; the integer input(s) {listed} keep their "
        "type (ids and masks are not quantized values)."
    )


def opened_tflite(src: ModelSource, content: bytes) -> ModelSource:
    """A .tflite source described from one read: its normalised bytes and what normalising changed, its inputs
    and outputs (the normalised parse's signature), what each output is (`tflite.signature_outputs`), and how many
    ids each id input takes (that parse's embedding tables, `vocabulary.tflite_bounds`)."""
    from optimize.models.normalize import normalize
    from optimize.models.tasks import Head
    from optimize.models.tflite import signature_outputs
    from optimize.models.vocabulary import tflite_bounds

    n = normalize(content)
    heads = tuple((name, Head(shape, act)) for name, shape, act in signature_outputs(n.model))
    bounds = tuple(tflite_bounds(n.model))
    return replace(
        src, content=n.content, facts=tuple(n.facts), inputs=tuple(InputSpec(*i) for i in n.inputs), outputs=n.outputs,
        id_bounds=bounds, heads=heads,
    )  # fmt: skip


def tflite_heads(content: bytes) -> list:
    """(output name, tasks.Head) per output of a normalised .tflite, read from its parse (no interpreter)."""
    from optimize.models.tasks import Head
    from optimize.models.tflite import read_model, signature_outputs

    return [(name, Head(shape, act)) for name, shape, act in signature_outputs(read_model(content))]

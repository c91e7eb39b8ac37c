"""What the TensorFlow-bound checks found about one model file, so an unchanged re-run can skip them.

Checking a Keras model or a SavedModel before any work means loading it, and that imports TensorFlow (about
3 s, more than the rest of a warm re-run together). What those checks conclude depends only on the file's
bytes (its fingerprint), the library versions and whether its code is trusted: that it loads, its inputs,
its outputs and what each output is (`Head`: shape and final activation); for a Keras 3 model, whether it
rebuilds exactly in tf_keras on the given data. `KnownModel` and `KnownRebuild` are those conclusions as
records; the engine keeps them in the result cache, keyed by all that they depend on, and hands them back
through a `Memo`. With them, a re-run decides "every candidate is cached" without importing TensorFlow. A
record that does not validate, or names another file, is never used (the checks run again).
"""

from __future__ import annotations

from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from optimize.models.spec import InputSpec

FORMAT = 1


class HeadRecord(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    name: str
    shape: tuple[int, ...]
    activation: str | None = None


class InputRecord(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"


class KnownModel(BaseModel):
    """A Keras model or SavedModel that loaded: its inputs, outputs and output heads."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    format: Literal[1] = FORMAT
    fingerprint: str = Field(pattern=r"^[0-9a-f]{16}$")
    kind: Literal["keras2", "keras3", "savedmodel"]
    inputs: tuple[InputRecord, ...] | None = None
    heads: tuple[HeadRecord, ...] = ()


class KnownRebuild(BaseModel):
    """Whether a Keras 3 model rebuilds exactly in tf_keras (on this data): why not, or the note saying it does."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    format: Literal[1] = FORMAT
    fingerprint: str = Field(pattern=r"^[0-9a-f]{16}$")
    data: str | None
    why: str | None
    note: str = ""


class Memo(Protocol):
    """Where the engine keeps these records (the result cache): None when it has none for the file."""

    def model(self, fingerprint: str) -> KnownModel | None: ...

    def rebuild(self, fingerprint: str, data: str | None) -> KnownRebuild | None: ...

    def put_model(self, record: KnownModel) -> None: ...

    def put_rebuild(self, record: KnownRebuild) -> None: ...


def heads_of(record: KnownModel) -> list:
    """(output name, tasks.Head) per output, as `source.output_heads` gives them."""
    from optimize.models.tasks import Head

    return [(h.name, Head(tuple(h.shape), h.activation)) for h in record.heads]


def specs_of(record: KnownModel) -> tuple | None:
    if record.inputs is None:
        return None
    return tuple(InputSpec(i.name, tuple(i.shape), i.dtype) for i in record.inputs)


def record_model(src, heads: list, inputs) -> KnownModel | None:
    """The record for a model that just passed the checks (None for a .tflite: its checks need no TensorFlow)."""
    if src.kind not in ("keras2", "keras3", "savedmodel"):
        return None
    return KnownModel(
        fingerprint=src.fingerprint,
        kind=src.kind,
        inputs=None
        if inputs is None
        else tuple(InputRecord(name=s.name, shape=tuple(int(d) for d in s.shape), dtype=str(s.dtype)) for s in inputs),
        heads=tuple(
            HeadRecord(name=str(n), shape=tuple(int(d) for d in h.shape), activation=h.activation) for n, h in heads
        ),
    )

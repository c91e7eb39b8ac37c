"""The technique registry: what each technique is called, which stage it runs in, what params it takes.

Techniques register with `@technique(...)` in their own module under `optimize/techniques/`. Those
modules import TensorFlow only inside the technique function, so importing the registry stays cheap.
"""

from __future__ import annotations

import difflib
import enum
import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from optimize.core.errors import RecipeError, from_validation

#: Where the techniques live (`optimize.transforms`, by stage): each module registers its own on import, in this order.
TECHNIQUE_MODULES = (
    "optimize.convert.keras",  # the convert stage: Keras/SavedModel -> .tflite (the TFLite converter)
    "optimize.transforms.keras.prune",
    "optimize.transforms.keras.cluster",
    "optimize.transforms.keras.qat",
    "optimize.transforms.keras.finetune",
    "optimize.transforms.tflite.quantize",
    "optimize.transforms.tflite.rescue_steps",
    "optimize.transforms.tflite.yolo_head",
    "optimize.transforms.tflite.selective",
    "optimize.transforms.tflite.fit",
    "optimize.transforms.pt2e",
)


class Stage(enum.StrEnum):
    """Steps run in this order and never go back."""

    KERAS = "keras"  # Keras -> Keras (prune, cluster, QAT)
    CONVERT = "convert"  # Keras/SavedModel -> .tflite (exactly one)
    TFLITE = "tflite"  # .tflite -> .tflite (quantize a float flatbuffer)

    @property
    def order(self) -> int:
        return list(Stage).index(self)


class Params(BaseModel):
    """Base for technique params: frozen, unknown keys are errors, and numbers are finite (a learning
    rate of inf or nan would train to NaN weights)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class SchemeParams(Params):
    """Params with a numeric `scheme` and an `io` type, which must fit the scheme (vocab.IO_BY_SCHEME)."""

    @model_validator(mode="after")
    def _io_fits_scheme(self):
        from optimize.core.vocab import io_allowed

        problem = io_allowed(self.scheme, self.io)
        if problem:
            raise ValueError(problem)
        return self


@dataclass
class Context:
    """What a technique may use besides its input model: data, a work folder, settings, a logger."""

    workdir: Path
    data: Any = None  # optimize.models.data.Dataset or None
    threads: int = 2
    seed: int = 0
    notes: list[str] = field(default_factory=list)  # facts for the candidate record
    skipped_layers: list[str] = field(default_factory=list)
    records: dict[str, Any] = field(default_factory=dict)  # typed records for the candidate (e.g. "search")
    fixed_batch_export: Callable[[], Path] | None = None  # the model again, exported with a batch of 1
    source_kind: str | None = None  # what the run started from (models.Kind): keras2, keras3, savedmodel, tflite
    teacher: Callable[[], list] | None = None  # the float source model's outputs on the training inputs
    source: Any = None  # the ModelSource the run started from (a PyTorch / ONNX model's PT2E route reads it)
    shared: Path | None = None  # a folder the run's tasks on this machine share (one calibration serves them all)


@dataclass(frozen=True)
class Technique:
    name: str
    stage: Stage
    params: type[Params]
    fn: Callable
    summary: str

    def parse(self, raw: dict | Params | None, where: str = "") -> Params:
        """The technique's frozen params from raw values (TOML, the CLI, a study file).

        The one place a params error is worded: a RecipeError naming the step, the field and the
        allowed keys or values.
        """
        if isinstance(raw, self.params):
            return raw
        if isinstance(raw, Params):
            raw = raw.model_dump()
        try:
            return self.params.model_validate(raw or {})
        except ValidationError as e:
            raise from_validation(
                e,
                self.params,
                where=where,
                root=self.name,
                kind=RecipeError,
                fix=f"Run `optimize recipes techniques` to see {self.name}'s params.",
            ) from None


_REGISTRY: dict[str, Technique] = {}
_loaded = False


def technique(name: str, *, stage: Stage, params: type[Params]):
    """Register a technique function `fn(model, params, ctx) -> model`."""

    def wrap(fn: Callable) -> Callable:
        if not (fn.__doc__ or "").strip():
            raise TypeError(f"technique {name!r} needs a docstring")
        _REGISTRY[name] = Technique(name, stage, params, fn, fn.__doc__.strip().splitlines()[0])
        return fn

    return wrap


def _load() -> None:
    global _loaded
    if not _loaded:
        for mod in TECHNIQUE_MODULES:
            importlib.import_module(mod)
        _loaded = True


def techniques() -> dict[str, Technique]:
    _load()
    return dict(_REGISTRY)


def get(name: str) -> Technique:
    _load()
    if name in _REGISTRY:
        return _REGISTRY[name]
    close = difflib.get_close_matches(name, _REGISTRY, n=1)
    hint = f"Did you mean {close[0]!r}? " if close else ""
    raise RecipeError(f"Unknown technique {name!r}.", f"{hint}Known: {', '.join(sorted(_REGISTRY))}.")

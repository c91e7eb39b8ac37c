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

from pydantic import BaseModel, ConfigDict

from .errors import RecipeError

TECHNIQUE_MODULES = ("convert", "prune", "cluster", "qat", "litert_quantize")


class Stage(str, enum.Enum):
    """Steps run in this order and never go back."""

    KERAS = "keras"  # Keras -> Keras (prune, cluster, QAT)
    CONVERT = "convert"  # Keras/SavedModel -> .tflite (exactly one)
    TFLITE = "tflite"  # .tflite -> .tflite (quantize a float flatbuffer)

    @property
    def order(self) -> int:
        return list(Stage).index(self)


class Params(BaseModel):
    """Base for technique params: frozen, and unknown keys are errors."""

    model_config = ConfigDict(frozen=True, extra="forbid")


@dataclass
class Context:
    """What a technique may use besides its input model: data, a work folder, settings, a logger."""

    workdir: Path
    data: Any = None  # optimize.data.Dataset or None
    threads: int = 2
    seed: int = 0
    log: Callable[[str], None] = lambda msg: None
    notes: list[str] = field(default_factory=list)  # facts for the candidate record
    skipped_layers: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Technique:
    name: str
    stage: Stage
    params: type[Params]
    fn: Callable
    summary: str

    def parse(self, raw: dict) -> Params:
        """Validate raw params (from TOML or the CLI); raise a RecipeError naming field and allowed values."""
        from .recipe import params_error

        try:
            return self.params.model_validate(raw or {})
        except Exception as e:  # pydantic.ValidationError
            raise params_error(self, e) from None


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
            importlib.import_module(f"optimize.techniques.{mod}")
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

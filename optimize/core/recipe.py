"""Recipes: an ordered list of technique steps, plus the model, data, targets, goals and output around it.

A recipe is TOML (`recipes/*.toml`) or is built in memory by a CLI shortcut (`chain`); both take the
same path. `Recipe.model_validate` checks everything before any model is loaded: keys, targets,
goals, every step's params (parsed by the technique itself) and the stage order. Every error names the
file, the step, the field and what is allowed, in one line.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from optimize.core import registry
from optimize.core.bounded import loads_toml
from optimize.core.errors import RecipeError, from_validation
from optimize.core.paths import read_bounded
from optimize.core.registry import Stage
from optimize.core.results import NAME_PATTERN, Goals, Step
from optimize.core.vocab import (
    CALIBRATED_SCHEMES,
    DEFAULT_BACKEND,
    LITERT_ONLY_SCHEMES,
    PTQ_SCHEMES,
    Backend,
    Scheme,
    Target,
)

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


class Recipe(BaseModel):
    """A validated pipeline. `steps` are resolved: every param has its value, defaults filled in."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=NAME_PATTERN, max_length=120, description="Also the artifact's file name.")
    description: str = ""
    model: str | None = None
    data: str | None = None
    targets: tuple[Target, ...] = ()
    goals: Goals = Field(default_factory=Goals)
    backend: Backend = Field(
        Backend.AUTO,
        description="Who quantizes post-training schemes: auto (per scheme), converter or litert.",
    )
    output: str | None = Field(None, description="Default output folder: a relative path below where you run it.")
    steps: tuple[Step, ...] = Field((), validate_default=True)
    source: str = Field("<memory>", exclude=True, description="Where it was loaded from (set by the loader).")

    @field_validator("model", "data", "output", "description")
    @classmethod
    def _no_control_characters(cls, text: str | None, info) -> str | None:
        """A path holds no control character (a NUL cannot be opened; a newline or escape sequence would
        forge terminal output); a description may break lines, nothing else."""
        allowed = "\n\t" if info.field_name == "description" else ""
        bad = _CONTROL.search(text.translate({ord(c): None for c in allowed})) if text else None
        if bad:
            raise ValueError(f"holds the control character {bad.group()!r}: remove it.")
        return text

    @field_validator("output")
    @classmethod
    def _output_stays_below(cls, output: str | None) -> str | None:
        """A shared recipe must not write anywhere it likes: its output is a relative folder, without '..'."""
        if output is not None and (Path(output).is_absolute() or ".." in Path(output).parts or not output.strip()):
            raise ValueError(f"output {output!r} must be a relative folder without '..'; pass -o to write elsewhere")
        return output

    @field_validator("steps")
    @classmethod
    def _has_steps(cls, steps: tuple[Step, ...]) -> tuple[Step, ...]:
        if not steps:
            raise ValueError("the recipe has no [[steps]]; add at least one [[steps]] table with a technique.")
        return steps

    @model_validator(mode="after")
    def _stage_order(self) -> Recipe:
        """keras* -> convert (at most once) -> tflite*: steps never go back."""
        last, converts = Stage.KERAS, 0
        for i, s in enumerate(self.steps, 1):
            stage = registry.get(s.technique).stage
            if stage.order < last.order:
                raise ValueError(
                    f"step {i}: {s.technique} ({stage.value} stage) comes after a {last.value} step; "
                    "order steps keras (prune/cluster/qat) -> convert -> tflite (quantize)."
                )
            converts += stage is Stage.CONVERT
            last = stage
        if converts > 1:
            raise ValueError(f"has {converts} convert steps; a pipeline converts to .tflite exactly once.")
        return self

    @property
    def hash(self) -> str:
        """Stable hash of the resolved steps: what was done, independent of names and paths."""
        blob = json.dumps([s.model_dump(mode="json") for s in self.steps], sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    @property
    def scheme(self) -> Scheme:
        """The numeric scheme of the final artifact (the last step that sets one)."""
        scheme = Scheme.FLOAT32
        for s in self.steps:
            scheme = getattr(s.params, "scheme", None) or scheme
        return Scheme(scheme)

    @property
    def made_by(self) -> Backend:
        """Which backend makes the artifact: litert-torch's PT2E quantizer when a pt2e step runs, LiteRT
        Quantizer when a quantize step runs, else the converter."""
        if any(s.technique == "pt2e" for s in self.steps):
            return Backend.PT2E
        tflite_steps = any(s.stage is Stage.TFLITE for s in self.steps)
        return Backend.LITERT if tflite_steps else Backend.CONVERTER

    @property
    def io(self) -> str:
        """The I/O type the last step that sets one asks for ('float' when none does)."""
        io = "float"
        for s in self.steps:
            io = str(getattr(s.params, "io", None) or io)
        return io

    @property
    def trains(self) -> bool:
        """A step works on the Keras model (prune, cluster, QAT: fine-tuning)."""
        return any(s.stage is Stage.KERAS for s in self.steps)

    def uses(self, *techniques: str) -> bool:
        return any(s.technique in techniques for s in self.steps)

    @property
    def needs_calibration(self) -> bool:
        return any(getattr(s.params, "scheme", None) in CALIBRATED_SCHEMES for s in self.steps)

    def to_toml(self) -> str:
        """The recipe as TOML a user can save and run with `optimize run` (written with tomli_w)."""
        import tomli_w

        doc: dict = {"name": self.name}
        if self.description:
            doc["description"] = self.description
        if self.targets:
            doc["targets"] = [str(t) for t in self.targets]
        if self.backend is not Backend.AUTO:
            doc["backend"] = str(self.backend)
        goals = {k: v for k, v in self.goals.model_dump(mode="json").items() if v is not None}
        if goals != {"objective": "size"}:
            doc["goals"] = goals
        steps = [{k: v for k, v in s.flat().items() if v is not None} for s in self.steps]
        # each step as a [[steps]] table, as recipes are written (tomli_w puts a step of up to 100 characters
        # on one line, which does not fit 80 columns)
        text = tomli_w.dumps(doc) + "".join(f"\n[[steps]]\n{tomli_w.dumps(step)}" for step in steps)
        return "\n".join(_fold_toml_line(line) for line in text.split("\n"))

    def with_backend(self, backend: Backend | str | None = None) -> Recipe:
        """The same pipeline with its post-training schemes made by `backend` (default: the recipe's own).

        converter: the TFLite converter quantizes while converting. litert: convert to float32 once and
        quantize the flatbuffer with LiteRT Quantizer (a `quantize` step). auto: per scheme, as
        `vocab.DEFAULT_BACKEND` says. After QAT, or with float fallback, the converter is always used
        (LiteRT Quantizer does not read fake-quant ranges or fall back per op).
        """
        backend = Backend(backend or self.backend)
        qat = any(s.technique == "qat" for s in self.steps)
        raw: list[dict] = []
        for s in self.steps:
            p = s.flat()
            wanted = backend
            if backend is Backend.AUTO:
                wanted = DEFAULT_BACKEND.get(p.get("scheme"), Backend.CONVERTER)
            raw = _express(raw, p, wanted, locked=qat or bool(p.get("float_fallback")))
        return self.model_copy(update={"steps": make_steps(raw), "backend": backend})


_FLOAT32 = {"technique": "convert", "scheme": "float32"}


def _is_float32(step: dict) -> bool:
    return step.get("technique") == "convert" and step.get("scheme") == "float32"


def _needs_litert(done: list[dict], step: dict) -> bool:
    """A quantize step the converter cannot express: after a flatbuffer transform (equalize, ...), or asking
    for what only LiteRT Quantizer does (activation ranges other than min/max, per-tensor weights, blocks).
    Folding it into the converter would drop that silently, so it stays a LiteRT step."""
    after_transform = any(registry.get(d["technique"]).stage is Stage.TFLITE for d in done)
    own = step.get("calibration", "minmax") != "minmax" or step.get("granularity", "channel") != "channel"
    return after_transform or own or bool(step.get("block_size"))


def _express(done: list[dict], step: dict, backend: Backend, locked: bool) -> list[dict]:
    """`done` followed by `step` expressed with `backend`: a post-training convert becomes float32 +
    quantize for LiteRT, and a quantize after a float32 conversion folds back into the converter."""
    scheme = step.get("scheme")
    calib = {"scheme": scheme, "io": step.get("io"), "samples": step.get("samples")}
    if scheme in LITERT_ONLY_SCHEMES and not locked:
        backend = Backend.LITERT  # the converter cannot make it
    if backend is Backend.LITERT and step["technique"] == "convert" and scheme in PTQ_SCHEMES and not locked:
        return [*done, dict(_FLOAT32), {"technique": "quantize", **calib}]
    folds = step["technique"] == "quantize" and any(map(_is_float32, done)) and not _needs_litert(done, step)
    if backend is Backend.CONVERTER and folds:
        return [*[d for d in done if not _is_float32(d)], {"technique": "convert", **calib}]
    return [*done, step]  # (a .tflite input keeps its quantize step: it cannot be converted again)


def as_given(name: str = "float32") -> Recipe:
    """A recipe of no steps: the input model itself (the baseline of a float .tflite)."""
    return Recipe.model_construct(name=name, steps=())


def make_steps(raw_steps: list[dict]) -> tuple[Step, ...]:
    """Typed steps from flat dicts (`{"technique": ..., **params}`), in order; errors name the step."""
    steps = []
    for i, raw in enumerate(raw_steps, 1):
        try:
            steps.append(Step.model_validate(raw))
        except ValidationError as e:
            raise from_validation(e, Step, where=f"step {i}: ", kind=RecipeError) from None
    return tuple(steps)


def build(name: str, steps: list[dict], **fields) -> Recipe:
    """Build a recipe in memory from flat steps (the CLI shortcuts, the sweep and the advisor use this)."""
    typed = make_steps(steps)
    try:
        return Recipe.model_validate({"name": name, "steps": typed, **fields})
    except ValidationError as e:
        raise from_validation(e, Recipe, kind=RecipeError) from None


#: Float-model transforms a chain may put between the float32 conversion and the quantization.
TRANSFORM_TOKENS = ("equalize", "bias_correction", "adaround")
#: Tokens `chain` understands after the first step: Keras techniques, transforms, or a scheme (the conversion).
CHAIN_TOKENS = ("prune", "cluster", "qat", *TRANSFORM_TOKENS, *(str(s) for s in Scheme))


def chain(first: dict, then: str | list[str] | None) -> list[dict]:
    """The steps of `first` followed by `then` (e.g. "cluster,int8"), so a chain never undoes its own work.

    Tokens: prune, cluster, qat, equalize, bias_correction, adaround, or a scheme (the final conversion). A
    later cluster keeps an earlier pruning's zeros; a later QAT preserves whatever the earlier steps made
    (sparsity, clusters or both). QAT must end in an int8 or dynamic conversion (its fake-quant ranges are
    for 8-bit). A transform converts to float32 first (once) and makes the scheme a quantize step after it.
    """
    tokens = [t.strip() for t in (then.split(",") if isinstance(then, str) else then or []) if t.strip()]
    steps = [dict(first)]
    for tok in tokens:
        floated = any(s["technique"] in TRANSFORM_TOKENS for s in steps)
        if tok in TRANSFORM_TOKENS:
            if not any(s["technique"] in ("convert", "quantize") or s["technique"] in TRANSFORM_TOKENS for s in steps):
                steps.append({"technique": "convert", "scheme": "float32"})
            steps.append({"technique": tok})
        elif tok in Scheme.__members__.values():
            steps.append({"technique": "quantize" if floated else "convert", "scheme": tok})
        elif tok in ("prune", "cluster", "qat"):
            steps.append(_keras_step(tok, steps))
        else:
            raise RecipeError(f"--then: unknown step {tok!r}.", f"Use one of: {', '.join(CHAIN_TOKENS)}.")
    _check_qat_ends_in_8bit(steps)
    return steps


def with_rescue(step: dict, transforms: list[str], ranges: str = "minmax") -> list[dict]:
    """A post-training `step` (convert or quantize) preceded by float-model transforms and/or with chosen
    activation ranges: convert float32, the transforms in the rescue's order, then LiteRT Quantizer's
    quantize (the only backend that takes chosen ranges). Unchanged when neither is asked."""
    if not transforms and ranges == "minmax":
        return [step]
    unknown = [t for t in transforms if t not in TRANSFORM_TOKENS]
    if unknown:
        raise RecipeError(f"Unknown transform {unknown[0]!r}.", f"Use: {', '.join(TRANSFORM_TOKENS)}.")
    if step.get("float_fallback"):
        raise RecipeError(
            "Float fallback is the converter's; equalize, bias correction, learned rounding and --ranges run "
            "with LiteRT Quantizer.",
            "Drop --float-fallback (or the rescue options).",
        )
    quantize = {k: v for k, v in step.items() if k not in ("technique", "float_fallback")}
    ordered = [t for t in TRANSFORM_TOKENS if t in transforms]
    return [
        {"technique": "convert", "scheme": "float32"},
        *({"technique": t} for t in ordered),
        {"technique": "quantize", **quantize, "calibration": ranges},
    ]


def _keras_step(technique: str, before: list[dict]) -> dict:
    """A Keras step that keeps what the steps before it made (zeros, clusters)."""
    pruned = any(s["technique"] == "prune" for s in before)
    clustered = [s for s in before if s["technique"] == "cluster"]
    if technique == "cluster":
        return {"technique": "cluster", "preserve_sparsity": pruned}
    if technique == "qat":
        sparse = pruned or any(s.get("preserve_sparsity") for s in clustered)
        kept = ("clusters+sparsity" if sparse else "clusters") if clustered else ("sparsity" if pruned else "none")
        return {"technique": "qat", "preserve": kept}
    return {"technique": technique}


def _check_qat_ends_in_8bit(steps: list[dict]) -> None:
    qat_at = next((i for i, s in enumerate(steps) if s["technique"] == "qat"), None)
    if qat_at is None:
        return
    after = [s.get("scheme", "float32") for s in steps[qat_at + 1 :] if s["technique"] == "convert"]
    if after and after[-1] not in (Scheme.INT8, Scheme.DYNAMIC):
        raise RecipeError(
            f"QAT then {after[-1]} makes no sense: QAT trains for 8-bit integer ranges.",
            "End the chain with int8 (or dynamic).",
        )


def name_for(first: str, then: str | list[str] | None) -> str:
    """A readable candidate name for a chain: `prune-cluster-int8`."""
    tokens = [t.strip() for t in (then.split(",") if isinstance(then, str) else then or []) if t.strip()]
    return "-".join([first, *tokens]) if tokens else f"{first}-float32"


def load_recipe(path: str | Path) -> Recipe:
    """Load and validate a TOML recipe. Errors name the file, the step, the field and the allowed values."""
    p = Path(path)
    if not p.exists():
        shipped = shipped_recipes()
        if str(path) in shipped:
            p = shipped[str(path)]
        else:
            raise RecipeError(f"No recipe at {path}.", f"Shipped recipes: {', '.join(sorted(shipped)) or 'none'}.")
    where = f"{p.name}: "
    try:
        text = read_bounded(p, "recipe", RecipeError).decode()
    except UnicodeDecodeError:
        raise RecipeError(f"{where}not UTF-8 text.", "Save the recipe as UTF-8; see recipes/README.md.") from None
    raw = loads_toml(text, p.name, RecipeError)
    raw.setdefault("name", p.stem)
    raw["source"] = str(p)
    try:
        return Recipe.model_validate(raw)
    except ValidationError as e:
        raise from_validation(e, Recipe, where=where, kind=RecipeError, fix="See recipes/README.md.") from None


def recipes_dir() -> Path:
    """The shipped recipes: `recipes/` beside the package (source checkout) or inside it (wheel)."""
    here = Path(__file__).resolve().parent.parent  # the package folder (this file is in optimize/core)
    for cand in (here.parent / "recipes", here / "recipes"):
        if cand.is_dir():
            return cand
    return here.parent / "recipes"


def shipped_recipes() -> dict[str, Path]:
    return {p.stem: p for p in sorted(recipes_dir().glob("*.toml"))}


_TOML_STRING = re.compile(r'^([A-Za-z0-9_-]+) = (".*")$')


def _fold_toml_line(line: str, columns: int = 78) -> str:
    """A `key = "long text"` line as a multi-line basic string whose lines end in a backslash (TOML then
    joins them back with the spaces kept), so a printed recipe fits 80 columns and still loads as is."""
    m = _TOML_STRING.match(line)
    body = m.group(2)[1:-1] if m else ""  # tomli_w's escaping kept: an escape holds no space
    if len(line) <= columns or m is None or body[:1].isspace():
        return line
    lines = [""]
    for word in re.findall(r"\S+\s*", body):  # each word with the spaces after it: a line never starts with one
        if lines[-1] and len(lines[-1]) + len(word) >= columns:
            lines.append("")
        lines[-1] += word
    return f'{m.group(1)} = """\\\n' + "\n".join(part + "\\" for part in lines) + '\n"""'

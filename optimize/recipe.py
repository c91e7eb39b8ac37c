"""Recipes: an ordered list of technique steps, plus the model, data, targets, goals and output around it.

A recipe is TOML (`recipes/*.toml`) or is built in memory by a CLI shortcut; both take the same path.
Every step is validated against its technique's params before any model is loaded, and every error
names the file, the step, the field and what is allowed.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import tomllib
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from . import registry
from .errors import RecipeError
from .results import TARGETS, Goals, Step

RECIPE_KEYS = ("name", "description", "model", "data", "targets", "goals", "output", "steps")
GOAL_KEYS = tuple(Goals.model_fields)


class Recipe(BaseModel):
    """A validated pipeline. `steps` are resolved: every param has its value, defaults filled in."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    description: str = ""
    model: str | None = None
    data: str | None = None
    targets: tuple[str, ...] = ()
    goals: Goals = Field(default_factory=Goals)
    output: str | None = None
    steps: tuple[Step, ...]
    source: str = "<memory>"

    @property
    def hash(self) -> str:
        """Stable hash of the resolved steps: what was done, independent of names and paths."""
        blob = json.dumps([s.model_dump() for s in self.steps], sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    @property
    def scheme(self) -> str:
        """The numeric scheme of the final artifact (the last step that sets one)."""
        scheme = "float32"
        for s in self.steps:
            scheme = s.params.get("scheme", scheme)
        return scheme

    @property
    def backend(self) -> str:
        return "litert" if any(s.technique == "quantize" for s in self.steps) else "converter"

    def to_toml(self) -> str:
        """The recipe as TOML a user can save and run with `optimize run`."""
        lines = [f'name = "{self.name}"']
        if self.description:
            lines.append(f"description = {json.dumps(self.description)}")
        if self.targets:
            lines.append(f"targets = {json.dumps(list(self.targets))}")
        goals = {k: v for k, v in self.goals.model_dump().items() if v is not None and k != "objective"}
        if goals or self.goals.objective != "size":
            lines.append("\n[goals]")
            lines += [f"{k} = {json.dumps(v)}" for k, v in goals.items()]
            lines.append(f'objective = "{self.goals.objective}"')
        for s in self.steps:
            lines.append("\n[[steps]]")
            lines.append(f'technique = "{s.technique}"')
            lines += [f"{k} = {_toml_value(v)}" for k, v in s.params.items() if v is not None]
        return "\n".join(lines) + "\n"


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return json.dumps(v)


def params_error(tech: registry.Technique, e: Exception, where: str = "") -> RecipeError:
    """Turn a pydantic error into one line naming the step, the field and what is allowed."""
    if not isinstance(e, ValidationError):
        return RecipeError(f"{where}{tech.name}: {e}")
    err = e.errors()[0]
    field = ".".join(str(x) for x in err["loc"]) or "(params)"
    if err["type"] == "extra_forbidden":
        allowed = ", ".join(tech.params.model_fields)
        return RecipeError(f"{where}{tech.name}: unknown key {field!r}.", f"Allowed keys: {allowed}.")
    return RecipeError(
        f"{where}{tech.name}.{field}: {err['msg']} (got {err.get('input')!r}).",
        f"Run `optimize recipes techniques` to see {tech.name}'s params.",
    )


def make_steps(raw_steps: list[dict], where: str = "") -> tuple[Step, ...]:
    """Validate raw steps, fill defaults, and check the stage order (keras* -> convert -> tflite*)."""
    steps: list[Step] = []
    last_stage = registry.Stage.KERAS
    converts = 0
    for i, raw in enumerate(raw_steps, 1):
        loc = f"{where}step {i}: "
        if not isinstance(raw, dict) or "technique" not in raw:
            raise RecipeError(f"{loc}missing 'technique'.", f"Known: {', '.join(sorted(registry.techniques()))}.")
        raw = dict(raw)
        try:
            tech = registry.get(raw.pop("technique"))
        except RecipeError as e:
            raise RecipeError(f"{loc}{e}") from None
        try:
            params = tech.params.model_validate(raw)
        except ValidationError as e:
            raise params_error(tech, e, loc) from None
        if tech.stage.order < last_stage.order:
            raise RecipeError(
                f"{loc}{tech.name} ({tech.stage.value} stage) comes after a {last_stage.value} step.",
                "Order steps keras (prune/cluster/qat) -> convert -> tflite (quantize).",
            )
        converts += tech.stage is registry.Stage.CONVERT
        last_stage = tech.stage
        steps.append(Step(technique=tech.name, params=params.model_dump(mode="json")))
    if converts > 1:
        raise RecipeError(f"{where}has {converts} convert steps.", "A pipeline converts to .tflite exactly once.")
    return tuple(steps)


def build(name: str, steps: list[dict], **fields) -> Recipe:
    """Build a recipe in memory (the CLI shortcuts and the sweep use this)."""
    return Recipe(name=name, steps=make_steps(steps), **fields)


def load_recipe(path: str | Path) -> Recipe:
    """Load and validate a TOML recipe. Errors name the file, the step, the field and the allowed values."""
    p = Path(path)
    if not p.is_file():
        shipped = shipped_recipes()
        if str(path) in shipped:
            p = shipped[str(path)]
        else:
            raise RecipeError(f"No recipe at {path}.", f"Shipped recipes: {', '.join(sorted(shipped)) or 'none'}.")
    where = f"{p.name}: "
    try:
        raw = tomllib.loads(p.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise RecipeError(f"{where}not valid TOML ({e}).", "Fix the syntax; see recipes/README.md.") from None
    unknown = sorted(set(raw) - set(RECIPE_KEYS))
    if unknown:
        raise RecipeError(f"{where}unknown key {unknown[0]!r}.", f"Allowed keys: {', '.join(RECIPE_KEYS)}.")
    goals = raw.get("goals", {})
    bad = sorted(set(goals) - set(GOAL_KEYS)) if isinstance(goals, dict) else ["(not a table)"]
    if bad:
        raise RecipeError(f"{where}goals: unknown key {bad[0]!r}.", f"Allowed keys: {', '.join(GOAL_KEYS)}.")
    targets = raw.get("targets", [])
    for t in targets:
        if t not in TARGETS:
            raise RecipeError(f"{where}unknown target {t!r}.", f"Allowed targets: {', '.join(TARGETS)}.")
    if not raw.get("steps"):
        raise RecipeError(f"{where}has no [[steps]].", "Add at least one [[steps]] table with a technique.")
    try:
        goals_model = Goals.model_validate(goals)
    except ValidationError as e:
        err = e.errors()[0]
        raise RecipeError(f"{where}goals.{err['loc'][0]}: {err['msg']}.") from None
    steps = make_steps(raw["steps"], where)
    return Recipe(
        name=raw.get("name", p.stem),
        description=raw.get("description", ""),
        model=raw.get("model"),
        data=raw.get("data"),
        targets=tuple(targets),
        goals=goals_model,
        output=raw.get("output"),
        steps=steps,
        source=str(p),
    )


def recipes_dir() -> Path:
    """The shipped recipes: `recipes/` beside the package (source checkout) or inside it (wheel)."""
    here = Path(__file__).resolve().parent
    for cand in (here.parent / "recipes", here / "recipes"):
        if cand.is_dir():
            return cand
    return here.parent / "recipes"


def shipped_recipes() -> dict[str, Path]:
    return {p.stem: p for p in sorted(recipes_dir().glob("*.toml"))}

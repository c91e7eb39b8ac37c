"""Which recipes run on a model: the default sweep (or the given recipes plus the float32 baseline), the
target's own recipe, what is dropped and why, and every recipe resolved for this model (implicit steps
filled in; what cannot apply refused up front)."""

from __future__ import annotations

import hashlib
import json
import logging

from optimize.core.errors import ModelError, RecipeError
from optimize.core.recipe import Recipe, as_given, build, load_recipe, make_steps
from optimize.core.registry import Stage
from optimize.core.results import TRAINING_CONTROL, Dropped
from optimize.core.vocab import PTQ_SCHEMES, Target
from optimize.models import facts
from optimize.models import source as models
from optimize.models.data import Dataset

log = logging.getLogger(__name__)


#: The default sweep: the float baseline, every post-training scheme and the useful chains.
DEFAULT_SWEEP: tuple[tuple[str, list[dict]], ...] = (
    ("float32", [{"technique": "convert", "scheme": "float32"}]),
    ("float16", [{"technique": "convert", "scheme": "float16"}]),
    ("dynamic", [{"technique": "convert", "scheme": "dynamic"}]),
    ("int8", [{"technique": "convert", "scheme": "int8"}]),
    ("int8-int8io", [{"technique": "convert", "scheme": "int8", "io": "int8"}]),
    ("int16x8", [{"technique": "convert", "scheme": "int16x8"}]),
    ("prune-int8", [{"technique": "prune"}, {"technique": "convert", "scheme": "int8"}]),
    ("cluster-int8", [{"technique": "cluster"}, {"technique": "convert", "scheme": "int8"}]),
    (
        "prune-cluster-int8",
        [
            {"technique": "prune"},
            {"technique": "cluster", "preserve_sparsity": True},
            {"technique": "convert", "scheme": "int8"},
        ],
    ),
    ("qat-int8", [{"technique": "qat"}, {"technique": "convert", "scheme": "int8"}]),
)


#: The shipped recipe made for each target: a targeted sweep always tries it.
TARGET_RECIPE: dict[Target, str] = {
    Target.CPU: "fastest-cpu",
    Target.GPU: "mobile-gpu",
    Target.NNAPI: "android-npu",
    Target.HEXAGON: "hexagon-dsp",
    Target.COREML: "coreml",
    Target.EDGETPU: "edgetpu-mcu",
    Target.MCU: "edgetpu-mcu",
}


def default_recipes(include_training: bool = True, backend: str | None = None) -> list[Recipe]:
    out = []
    for name, steps in DEFAULT_SWEEP:
        if not include_training and any(s["technique"] in ("prune", "cluster", "qat") for s in steps):
            continue
        out.append(build(name, steps).with_backend(backend))
    return out


TRAINING = ("prune", "cluster", "qat")


def _defaults(src: models.ModelSource, can: facts.PlanFacts, backend, dropped: list[Dropped]) -> list[Recipe]:
    """The default sweep; int4 (4-bit Dense/MatMul weights) only where those hold most of the weights."""
    int4 = [build("int4", [{"technique": "quantize", "scheme": "int4"}])] if can.mostly_dense else []
    if src.converted:
        return _torch_defaults(int4, dropped, pt2e=src.torch)
    if src.kind == "tflite":  # every post-training scheme of the default sweep, integer-only int8 too
        quantize = [
            build(n, [{**steps[0], "technique": "quantize"}])
            for n, steps in DEFAULT_SWEEP
            if len(steps) == 1 and steps[0]["scheme"] in PTQ_SCHEMES
        ]
        return [as_given("float32"), *quantize, *int4]
    why = can.training_blocker
    if why:
        names = [n for n, steps in DEFAULT_SWEEP if _trains(steps)]
        dropped.append(Dropped(recipes=names, reason=why))
    return default_recipes(why is None, backend) + [r.with_backend(backend) for r in int4]


def _torch_defaults(int4: list[Recipe], dropped: list[Dropped], pt2e: bool = True) -> list[Recipe]:
    """A model converted at the door to a float .tflite (PyTorch, ONNX, a TF1 graph): every scheme on it, for a
    PyTorch or ONNX model (`pt2e`) both int8 routes side by side (LiteRT Quantizer on the .tflite, litert-torch's
    PT2E on the torch graph), and the Keras techniques left out with the reason."""
    from optimize.models.spec import TRAINING

    def q(scheme: str, **kw) -> list[dict]:
        return [{"technique": "quantize", "scheme": scheme, **kw}]

    out = [
        as_given("float32"),
        build("float16", q("float16")),
        build("dynamic", q("dynamic")),
        build("int8", q("int8")),
    ]
    out += [build("int8-pt2e", [{"technique": "pt2e"}])] if pt2e else []
    out += [build("int8-int8io", q("int8", io="int8"))]
    out += [build("int16x8", q("int16x8")), *int4]
    dropped.append(Dropped(recipes=[n for n, steps in DEFAULT_SWEEP if _trains(steps)], reason=TRAINING))
    return out


def _trains(steps: list[dict]) -> bool:
    return any(s["technique"] in TRAINING for s in steps)


def _is_baseline(r: Recipe) -> bool:
    return r.scheme == "float32" and len(r.steps) <= 1


def _with_baseline(recipes: list[Recipe], src: models.ModelSource) -> list[Recipe]:
    """Given recipes, plus the float32 baseline first when none of them is one: every candidate is
    compared with it (fidelity, accuracy delta, latency ratio)."""
    if any(_is_baseline(r) for r in recipes):
        return recipes
    name = "float32" if all(r.name != "float32" for r in recipes) else "float32-baseline"
    if src.flat:
        return [as_given(name), *recipes]
    return [build(name, [{"technique": "convert", "scheme": "float32"}]), *recipes]


def _with_target_recipe(
    recipes: list[Recipe],
    extra: Recipe,
    src: models.ModelSource,
    can: facts.PlanFacts,
    dropped: list[Dropped],
) -> list[Recipe]:
    """The target's own shipped recipe added, unless a recipe with the same resolved steps is there already
    (or it needs a technique this model cannot take: then it is dropped, with the reason)."""
    try:
        resolved = resolve(extra, src, can.keras_refusal) if extra.steps else extra
    except ModelError as e:
        dropped.append(Dropped(recipes=[extra.name], reason=e.problem))
        return recipes
    if any(r.steps and resolve(r, src, can.keras_refusal).hash == resolved.hash for r in recipes):
        return recipes
    return [*recipes, resolved.model_copy(update={"targets": extra.targets})]


def _target_recipe(target: Target | None, src: models.ModelSource, backend) -> Recipe | None:
    """The target's own shipped recipe (none for a .tflite, whose recipes are the post-training schemes)."""
    if target is None or src.flat:
        return None
    extra = load_recipe(TARGET_RECIPE[Target(target)]).with_backend(backend)
    return extra.model_copy(update={"targets": (Target(target),)})


def asks_training(recipes: list[Recipe] | None, target: Target | None = None) -> bool:
    """Whether a recipe asked for, or the target's own, fine-tunes the Keras model (prune, cluster, QAT):
    then planning asks the model whether tfmot can load it (`facts.for_planning`)."""
    extra = [load_recipe(TARGET_RECIPE[Target(target)])] if target is not None else []
    return any(r.trains for r in [*(recipes or []), *extra])


def plan(
    src: models.ModelSource,
    ds: Dataset | None,
    recipes: list[Recipe] | None,
    backend: str | None,
    target: Target | None = None,
    dropped: list[Dropped] | None = None,
) -> list[Recipe]:
    """The resolved recipes a sweep will run (`plan_from`), the model asked what planning needs first."""
    can = facts.for_planning(src, ds, trains=asks_training(recipes, target))
    return plan_from(src, ds, can, recipes, backend, target, dropped)


def plan_from(
    src: models.ModelSource,
    ds: Dataset | None,
    can: facts.PlanFacts,
    recipes: list[Recipe] | None,
    backend: str | None,
    target: Target | None = None,
    dropped: list[Dropped] | None = None,
) -> list[Recipe]:
    """The resolved recipes a sweep will run: the defaults for this kind of model, or the given ones, plus
    the target's own recipe when a target is named. `can`: what the model answered (`facts.for_planning`).
    Default recipes left out are added to `dropped`, with the reason, and logged."""
    dropped = [] if dropped is None else dropped
    extra = _target_recipe(target, src, backend)
    if recipes is None:
        recipes = _defaults(src, can, backend, dropped)
    else:
        recipes = _with_baseline([r.with_backend(backend) for r in recipes], src)
    if extra is not None:
        recipes = _with_target_recipe(recipes, extra, src, can, dropped)
    if ds is None:
        recipes = _without_data(recipes, dropped)
    recipes = with_control(recipes)
    for d in dropped:
        log.warning("Dropped %s: %s", ", ".join(d.recipes), d.reason)
    _check_names(recipes)
    return [resolve(r, src, can.keras_refusal) if r.steps else r for r in recipes]


def with_control(recipes: list[Recipe]) -> list[Recipe]:
    """The recipes, plus the training control when any of them fine-tunes (prune, cluster, QAT): the float
    model fine-tuned as the longest of those chains is (each Keras step's epochs, batch size and learning rate,
    nothing compressed), converted to float32 (`TRAINING_CONTROL`). It tells the accuracy a retrained candidate
    gains from training apart from what compression costs (issue 43)."""
    trains = [r for r in recipes if r.trains and not r.uses("finetune")]
    if not trains or any(r.name == TRAINING_CONTROL for r in recipes):
        return recipes
    keras = lambda r: [s for s in r.steps if s.stage is Stage.KERAS]  # noqa: E731
    longest = max(trains, key=lambda r: sum(getattr(s.params, "epochs", 0) for s in keras(r)))
    steps = [
        {"technique": "finetune", **{k: getattr(s.params, k) for k in ("epochs", "batch_size", "learning_rate")}}
        for s in keras(longest)
    ]
    control = build(TRAINING_CONTROL, [*steps, {"technique": "convert", "scheme": "float32"}])
    return [*recipes, control.with_backend(longest.backend)]


def _check_names(recipes: list[Recipe]) -> None:
    names = [r.name for r in recipes]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup:
        raise RecipeError(f"Two recipes are named {dup!r}.", "Give every recipe in a sweep its own name.")


def _without_data(recipes: list[Recipe], dropped: list[Dropped]) -> list[Recipe]:
    left = [r.name for r in recipes if r.scheme in ("int8", "int16x8")]
    if left:
        dropped.append(Dropped(recipes=left, reason="no data: int8 and int16x8 need calibration samples"))
    return [r for r in recipes if r.scheme not in ("int8", "int16x8")]


def with_samples(recipe: Recipe, n: int) -> Recipe:
    """The recipe with `n` calibration samples on every calibrated step."""
    if not recipe.steps:
        return recipe
    flat = [{**s.flat(), "samples": n} if "samples" in type(s.params).model_fields else s.flat() for s in recipe.steps]
    return recipe.model_copy(update={"steps": build(recipe.name, flat).steps})


def checked(recipe: Recipe, src: models.ModelSource, ds: Dataset | None = None) -> Recipe:
    """`resolve`, with the model asked whether a Keras step can load it (a Keras 3 model's tf_keras rebuild is
    checked on `ds`, the user's data, as the sweep checks it)."""
    return resolve(recipe, src, facts.keras_refusal(src, ds) if recipe.trains else None)


def resolve(recipe: Recipe, src: models.ModelSource, keras_refusal: ModelError | None = None) -> Recipe:
    """Fill in what a recipe leaves implicit for this model.

    A Keras or SavedModel model without a convert step gets a float32 conversion; a float .tflite gets
    its post-training conversions as `quantize` steps (it is converted already). Refused up front: Keras
    steps on a model tfmot cannot read (`keras_refusal`, found by `models.facts`), and anything but
    quantization on a .tflite.
    """
    stages = [s.stage for s in recipe.steps]
    if Stage.KERAS in stages and src.converted:
        from optimize.models.spec import TRAINING

        raise ModelError(
            f"{recipe.name}: {TRAINING}.", "Use a post-training scheme, or fine-tune in PyTorch and export again."
        )
    if Stage.KERAS in stages and keras_refusal is not None:
        raise ModelError(keras_refusal.problem, keras_refusal.fix)
    if src.flat:
        return _on_tflite(recipe, src.path.name)
    if Stage.CONVERT in stages:
        return recipe
    flat = [s.flat() for s in recipe.steps]
    at = stages.index(Stage.TFLITE) if Stage.TFLITE in stages else len(flat)
    flat.insert(at, {"technique": "convert", "scheme": "float32"})
    return recipe.model_copy(update={"steps": make_steps(flat)})


def _on_tflite(recipe: Recipe, model_name: str) -> Recipe:
    """The recipe as it runs on a float .tflite (`model_name`, for messages): conversions become quantize steps,
    float32 ones drop out; anything but a .tflite step is refused."""
    flat = [s.flat() for s in recipe.steps]
    if [s["technique"] for s in flat] == ["convert"] and flat[0]["scheme"] == "float32":
        raise RecipeError(
            f"{model_name} is already a float32 .tflite.", "Pick a scheme: float16, dynamic, int8 or int16x8."
        )
    out = []
    for s in flat:
        if s["technique"] == "convert" and s["scheme"] in PTQ_SCHEMES:
            out.append({"technique": "quantize", "scheme": s["scheme"], "io": s["io"], "samples": s["samples"]})
        elif not (s["technique"] == "convert" and s["scheme"] == "float32"):  # it is float32 already
            out.append(s)
    steps = make_steps(out)
    if any(s.stage is not Stage.TFLITE for s in steps):
        raise ModelError(
            f"{model_name} is already a .tflite: only .tflite steps (quantize) apply to it.",
            "Pass the Keras or SavedModel model for prune/cluster/qat/convert.",
        )
    return recipe.model_copy(update={"steps": steps})


def _groups(recipes: list[Recipe]) -> list[list[Recipe]]:
    """Recipes that start with the same Keras step run together, so shared prefixes run once
    (prune -> int8 and prune -> cluster -> int8 prune once)."""
    groups: dict[str, list[Recipe]] = {}
    for r in recipes:
        groups.setdefault(group_key(r.steps), []).append(r)
    return list(groups.values())


def group_key(steps) -> str:
    """Which task a recipe (or candidate) joins: the recipes sharing their first Keras step run together."""
    keras = [s.model_dump(mode="json") for s in steps if s.stage is Stage.KERAS]
    return _key(keras[:1])


def _key(*parts) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def from_baseline(r: Recipe, base: Recipe) -> bool:
    """The recipe begins with the baseline's own steps and only quantizes the .tflite they made from there
    (float16, dynamic, int8, int16x8 by LiteRT Quantizer, a selective search): it can start from the
    baseline's artifact in any worker, with nothing converted again."""
    n = len(base.steps)
    rest = r.steps[n:]
    return list(r.steps[:n]) == list(base.steps) and bool(rest) and all(s.stage is Stage.TFLITE for s in rest)


def expected_cost(group: list[Recipe]) -> int:
    """A rough rank of what producing a group costs, so the longest start first and fewer workers sit idle at
    the end: fine-tuning, then 16-bit activations (reference kernels), then a selective search, then
    calibrated int8, then the rest."""

    def one(r: Recipe) -> int:
        if r.trains:
            return 4
        if r.scheme == "int16x8":
            return 3
        if r.uses("selective"):
            return 2
        return 1 if r.scheme == "int8" else 0

    return max((one(r) for r in group), default=0)


def tasks(recipes: list[Recipe]) -> int:
    """How many tasks a sweep of `recipes` can keep busy at once: one per group sharing a first Keras step,
    plus each recipe that starts from the baseline's artifact on its own (`from_baseline`)."""
    base = next((r for r in recipes if _is_baseline(r)), None)
    alone = sum(1 for r in recipes if base is not None and r is not base and from_baseline(r, base))
    return len(_groups(recipes)) + alone

"""optimize: every useful LiteRT variant of a trained model, measured, checked against delegates, recommended.

The public API (the CLI is a thin shell over these); with a Keras model and an .npz of its data:

    >>> import optimize
    >>> recipe = optimize.load_recipe("mobile-gpu")         # a shipped recipe: `optimize recipes list`
    >>> [str(step.params.scheme) for step in recipe.steps]
    ['float16']
    >>> study = optimize.sweep("model.keras", data="data.npz", output="out", recipes=[recipe])
    >>> [c.name for c in study.candidates]  # the baseline, each recipe, then fit-* (the graph fitted to Core ML here)
    ['float32', 'mobile-gpu', 'fit-float32', 'fit-mobile-gpu']
    >>> choice = optimize.recommend(study, target="gpu")
    >>> choice.chosen in {c.name for c in study.candidates}
    True
    >>> cand = optimize.run(recipe, "model.keras", data="data.npz", output="out/gpu.tflite")
    >>> cand.name, cand.artifact, str(cand.scheme)      # the recipe's name, the file asked for
    ('mobile-gpu', 'gpu.tflite', 'float16')
    >>> metrics = optimize.evaluate("out/gpu.tflite", data="data.npz", reference="out/float32.tflite")
    >>> metrics.size.bytes < study.candidates[0].metrics.size.bytes, metrics.fidelity.reference
    (True, 'float32.tflite')
    >>> reports = optimize.check_delegates("out/gpu.tflite")  # GPU, NNAPI, Hexagon, Core ML, XNNPACK
    >>> sorted(reports)
    ['coreml', 'gpu', 'hexagon', 'nnapi', 'xnnpack']

`optimize.sweep()` with no model sweeps the built-in demo. Importing optimize does not import
TensorFlow; the functions do, when they need it. tests/test_api.py runs these examples.
"""

from __future__ import annotations

__version__ = "0.1.0"

_LAZY = {
    "load_recipe": ("optimize.core.recipe", "load_recipe"),
    "Recipe": ("optimize.core.recipe", "Recipe"),
    "run": ("optimize.engine.single", "run"),
    "sweep": ("optimize.engine.sweeps", "sweep"),
    "evaluate": ("optimize.measure.metrics", "evaluate"),
    "check_delegates": ("optimize.delegates", "check_delegates"),
    "load_study": ("optimize.core.results", "load_study"),
    "Study": ("optimize.core.results", "Study"),
    "Candidate": ("optimize.core.results", "Candidate"),
    "Goals": ("optimize.core.results", "Goals"),
    "OptimizeError": ("optimize.core.errors", "OptimizeError"),
    "advise": ("optimize.decide.advice", "advise"),
    "recommend": ("optimize.decide.choose", "recommend"),
    "debug_model": ("optimize.engine.debug", "debug_model"),
}

__all__ = sorted(_LAZY)


def __dir__() -> list[str]:
    """The API as well as what is loaded already: the names are imported lazily, on first use."""
    return sorted({*globals(), *_LAZY} - {"annotations"})


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        mod, attr = _LAZY[name]
        return getattr(importlib.import_module(mod), attr)
    raise AttributeError(f"module 'optimize' has no attribute {name!r}")

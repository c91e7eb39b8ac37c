"""optimize: every useful LiteRT variant of a trained model, measured, checked against delegates, recommended.

The public API (the CLI is a thin shell over these):

    import optimize
    study = optimize.sweep()                               # demo model, every technique, measured
    cand = optimize.run(optimize.load_recipe("gpu"), "model.keras", data="data.npz")
    metrics = optimize.evaluate("model.tflite", data="data.npz", reference="float.tflite")
    reports = optimize.check_delegates("model.tflite")     # GPU, NNAPI, Hexagon, Core ML, XNNPACK
    choice = optimize.recommend(study, target="gpu")

Importing optimize does not import TensorFlow; the functions do, when they need it.
"""

from __future__ import annotations

__version__ = "0.1.0"

_LAZY = {
    "load_recipe": ("optimize.recipe", "load_recipe"),
    "Recipe": ("optimize.recipe", "Recipe"),
    "run": ("optimize.single", "run"),
    "sweep": ("optimize.sweeps", "sweep"),
    "evaluate": ("optimize.measure", "evaluate"),
    "check_delegates": ("optimize.delegates", "check_delegates"),
    "load_study": ("optimize.results", "load_study"),
    "Study": ("optimize.results", "Study"),
    "Candidate": ("optimize.results", "Candidate"),
    "Goals": ("optimize.results", "Goals"),
    "OptimizeError": ("optimize.errors", "OptimizeError"),
    "advise": ("optimize.advice", "advise"),
    "recommend": ("optimize.choose", "recommend"),
    "debug_model": ("optimize.debug", "debug_model"),
}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        mod, attr = _LAZY[name]
        return getattr(importlib.import_module(mod), attr)
    raise AttributeError(f"module 'optimize' has no attribute {name!r}")

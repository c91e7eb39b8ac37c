"""The registry: every technique is documented, has typed params, and is used by a shipped recipe."""

from __future__ import annotations

import pytest

from optimize.core import registry
from optimize.core.errors import RecipeError
from optimize.core.recipe import load_recipe, shipped_recipes


def test_every_technique_has_docs_params_and_a_recipe():
    used = {s.technique for p in shipped_recipes().values() for s in load_recipe(p).steps}
    techs = registry.techniques()
    assert {"convert", "prune", "cluster", "qat", "quantize"} <= set(techs)
    for name, t in techs.items():
        assert t.fn.__doc__ and t.summary, name
        for fname, f in t.params.model_fields.items():
            assert f.description or fname in ("batch_size", "learning_rate"), f"{name}.{fname} has no description"
        assert name in used, f"no shipped recipe uses {name}"


def test_unknown_technique_suggests():
    with pytest.raises(RecipeError, match="Did you mean 'cluster'"):
        registry.get("clustr")


def test_registering_without_docstring_fails():
    with pytest.raises(TypeError):

        @registry.technique("nodoc", stage=registry.Stage.KERAS, params=registry.Params)
        def nodoc(model, params, ctx):
            return model


def test_importing_optimize_does_not_import_tensorflow():
    import subprocess
    import sys

    code = "import sys, optimize, optimize.cli, optimize.core.recipe, optimize.core.results; optimize.core.recipe.build('x', [{'technique': 'prune'}]); print('tensorflow' in sys.modules, 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "False False", out.stderr  # nor torch: the registry lists pt2e without it


def test_help_does_not_import_torch():
    import subprocess
    import sys

    code = "import sys; sys.argv = ['optimize', '--help']\nfrom optimize.cli import main\ntry:\n    main()\nexcept SystemExit:\n    pass\nprint('torch' in sys.modules, 'tensorflow' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip().splitlines()[-1] == "False False", out.stderr

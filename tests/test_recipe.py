"""Recipes: validation before any model is loaded; errors name file, step, field and allowed values."""

from __future__ import annotations

import pytest

from optimize.core.errors import RecipeError
from optimize.core.recipe import build, load_recipe, shipped_recipes


def write(tmp_path, text: str):
    p = tmp_path / "r.toml"
    p.write_text(text)
    return p


def test_valid_recipe_fills_defaults(tmp_path):
    r = load_recipe(
        write(tmp_path, '[[steps]]\ntechnique = "prune"\n\n[[steps]]\ntechnique = "convert"\nscheme = "int8"\n')
    )
    assert [s.technique for s in r.steps] == ["prune", "convert"]
    assert r.steps[0].params.target_sparsity == 0.5
    assert r.steps[1].params.samples == 200
    assert r.scheme == "int8" and r.made_by == "converter"
    assert len(r.hash) == 16


def test_hash_depends_on_params_not_name():
    a = build("a", [{"technique": "convert", "scheme": "int8"}])
    b = build("b", [{"technique": "convert", "scheme": "int8"}])
    c = build("a", [{"technique": "convert", "scheme": "int8", "samples": 100}])
    assert a.hash == b.hash != c.hash


@pytest.mark.parametrize(
    "text, expected",
    [
        (
            '[[steps]]\ntechnique = "prune"\nsparsity = 0.5\n',
            "r.toml: step 1: prune: unknown key 'sparsity'. Allowed keys: target_sparsity",
        ),
        ('[[steps]]\ntechnique = "prune"\ntarget_sparsity = 1.5\n', "step 1: prune.target_sparsity"),
        ('[[steps]]\ntechnique = "prunee"\n', "Did you mean 'prune'?"),
        ('[[steps]]\ntechnique = "cluster"\nclusters = 1\n', "cluster.clusters"),
        ('[[steps]]\ntechnique = "convert"\nscheme = "int3"\n', "convert.scheme"),
        ('[[steps]]\ntechnique = "convert"\nscheme = "float16"\nio = "int8"\n', "does not go with scheme"),
        ('colour = "red"\n[[steps]]\ntechnique = "prune"\n', "unknown key 'colour'"),
        ('targets = ["tpu"]\n[[steps]]\ntechnique = "prune"\n', "target 1: 'tpu' is not allowed. Allowed: cpu, gpu"),
        ('[goals]\nmax_acc = 1\n[[steps]]\ntechnique = "prune"\n', "goals: unknown key 'max_acc'"),
        ('[goals]\nmax_accuracy_drop = -1\n[[steps]]\ntechnique = "prune"\n', "goals.max_accuracy_drop"),
        ('name = "x"\n', "has no [[steps]]"),
        ("[[steps\n", "not valid TOML"),
        ('[[steps]]\ntechnique = "convert"\n[[steps]]\ntechnique = "prune"\n', "comes after a convert step"),
        ('[[steps]]\ntechnique = "convert"\n[[steps]]\ntechnique = "convert"\n', "2 convert steps"),
    ],
)
def test_bad_recipes_name_the_problem(tmp_path, text, expected):
    with pytest.raises(RecipeError) as e:
        load_recipe(write(tmp_path, text))
    assert expected in str(e.value)
    assert "\n" not in str(e.value)


def test_missing_recipe_lists_shipped():
    with pytest.raises(RecipeError, match="Shipped recipes: .*mobile-gpu"):
        load_recipe("no-such-recipe")


def test_every_shipped_recipe_validates_and_round_trips(tmp_path):
    shipped = shipped_recipes()
    assert len(shipped) >= 7
    for name, path in shipped.items():
        r = load_recipe(path)
        again = load_recipe(write(tmp_path, r.to_toml()))
        assert again.steps == r.steps and again.goals == r.goals, name
        assert r.description, name

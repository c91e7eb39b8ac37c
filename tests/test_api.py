"""The Python API as a user meets it: `dir(optimize)`, the docstring's examples (run as a doctest),
records that print short, and a script without a main guard that finishes instead of hanging (issue 17)."""

from __future__ import annotations

import ast
import doctest
import os
import subprocess
import sys
import textwrap

import pytest
from study_fixtures import full_study

import optimize


def test_dir_lists_the_lazily_loaded_api():
    names = dir(optimize)
    for name in optimize.__all__:
        assert name in names
    assert {"sweep", "run", "evaluate", "check_delegates", "recommend", "load_recipe"} <= set(names)
    assert "annotations" not in names


#: `dir(optimize)` in a fresh interpreter before the round-4 layout (issue 25): the packages moved, the public
#: names did not.
PUBLIC_BEFORE_LAYOUT = [
    "Candidate", "Goals", "OptimizeError", "Recipe", "Study", "_LAZY", "__all__", "__builtins__", "__cached__",
    "__dir__", "__doc__", "__file__", "__getattr__", "__loader__", "__name__", "__package__", "__path__",
    "__spec__", "__version__", "advise", "check_delegates", "debug_model", "evaluate", "load_recipe",
    "load_study", "recommend", "run", "sweep",
]  # fmt: skip


def test_dir_is_what_it_was_before_the_layout():
    out = subprocess.run(
        [sys.executable, "-c", "import optimize; print(repr(dir(optimize)))"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert ast.literal_eval(out.stdout.strip()) == PUBLIC_BEFORE_LAYOUT
    for name in optimize.__all__:  # and each public name resolves (a package must never shadow one: `run`)
        assert not isinstance(getattr(optimize, name), type(optimize)), name


@pytest.mark.slow
def test_the_module_docstring_examples_run(tmp_path, keras_model, data_npz, monkeypatch):
    """Every `>>>` line of optimize's docstring, on the fixture model and data under the names it uses."""
    (tmp_path / "model.keras").symlink_to(keras_model)
    (tmp_path / "data.npz").symlink_to(data_npz)
    monkeypatch.chdir(tmp_path)
    examples = doctest.DocTestParser().get_examples(optimize.__doc__)
    assert len(examples) >= 8
    result = doctest.testmod(optimize, optionflags=doctest.ELLIPSIS, raise_on_error=False, verbose=False)
    assert result.attempted == len(examples) and result.failed == 0, result


def test_records_print_short_and_readable():
    from optimize.decide.choose import recommend

    study = full_study()
    rec = recommend(study, "gpu")
    for record in (study, rec, study.candidates[3], study.candidates[3].metrics):
        text = repr(record)
        assert "\n" not in text and len(text) < 700, text
        assert text.startswith(type(record).__name__ + "(")
        assert str(record) == text
    assert "candidates=[8 Candidate]" in repr(study)
    assert f"chosen={rec.chosen!r}" in repr(rec)
    # the whole record is still one call away
    assert len(rec.model_dump_json()) > len(repr(rec))


def _main_guard(source: str) -> bool:
    from optimize.engine.executors import _is_main_guard

    return _is_main_guard(ast.parse(textwrap.dedent(source)).body[0])


def test_main_guard_is_recognised_either_way_round():
    assert _main_guard('if __name__ == "__main__":\n    main()')
    assert _main_guard("if '__main__' == __name__:\n    main()")
    assert not _main_guard('if __name__ != "__main__":\n    main()')
    assert not _main_guard("if True:\n    main()")
    assert not _main_guard("main()")


SCRIPT = """\
import optimize

recipe = optimize.load_recipe("mobile-gpu")
study = optimize.sweep({model!r}, output="out", recipes=[recipe], cache=False)
cand = optimize.run(recipe, {model!r}, output="one")
print("RESULT", [c.name for c in study.candidates], cand.name, cand.ok)
"""


@pytest.mark.slow
def test_a_script_without_a_main_guard_finishes(tmp_path, float_tflite):
    """Spawned workers would re-run the script's top level and die bootstrapping (the parent waited
    forever): the calls run in this process, with one line saying what to add for worker processes."""
    script = tmp_path / "plain.py"
    script.write_text(SCRIPT.format(model=str(float_tflite)))
    r = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300, env=os.environ
    )
    assert r.returncode == 0, r.stderr[-3000:]
    # the fixture CNN's Flatten fits Core ML: the fit round adds fit-float32 and fit-mobile-gpu (issue 45)
    assert "RESULT ['float32', 'mobile-gpu', 'fit-float32', 'fit-mobile-gpu'] mobile-gpu True" in r.stdout, r.stdout
    said = [line for line in r.stderr.splitlines() if "__main__" in line]
    assert said and all("put the call under" in line for line in said), r.stderr
    assert "Traceback" not in r.stderr


def test_unguarded_main_is_false_under_pytest_and_in_a_guard(tmp_path):
    from optimize.engine.executors import unguarded_main

    assert not unguarded_main()  # called from a test function, not a script's top level
    script = tmp_path / "guarded.py"
    script.write_text(
        "from optimize.engine.executors import unguarded_main\n"
        "print('top', unguarded_main())\n"
        "def main():\n    print('guarded', unguarded_main())\n"
        "if __name__ == '__main__':\n    main()\n"
    )
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60, env=os.environ)
    assert r.stdout.split("\n")[:2] == ["top True", "guarded False"], r.stdout + r.stderr

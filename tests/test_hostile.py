"""The hostile-input corpus (issue 11), one test per class: every bad input is one `error:` line, exit 2,
no traceback, nothing written. Cases that need a model use the session fixtures; the rest are cheap."""

from __future__ import annotations

import pytest


def one_line_error(r, *fragments) -> str:
    assert r.returncode == 2, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout, r.stderr
    lines = [ln for ln in r.stderr.strip().splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, r.stderr
    for f in fragments:
        assert f in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize(
    "field, expected",
    [
        ("technique = 5\n", "technique must be a technique's name"),
        ('technique = ["convert"]\n', "technique must be a technique's name"),
        ('technique = "convert"\nscheme = "int8"\nio = 5\n', "convert.io"),
    ],
)
def test_recipe_steps_of_the_wrong_type(cli, tmp_path, field, expected):
    r = tmp_path / "r.toml"
    r.write_text("[[steps]]\n" + field)
    one_line_error(cli("recipes", "validate", str(r)), "r.toml: step 1", expected)


@pytest.mark.parametrize(
    "head, expected",
    [
        ("name = 123\n", "name"),
        ("description = {a = 1}\n", "description"),
        ("model = 5\n", "model"),
        ('name = "/abs/path"\n', "name"),
        ('name = "../../x"\n', "name"),
        ('name = ""\n', "name"),
        ('name = ".hidden"\n', "name"),
        ('backend = "tpu"\n', "backend"),
    ],
)
def test_recipe_fields_of_the_wrong_type_or_unsafe_names(cli, tmp_path, head, expected):
    r = tmp_path / "r.toml"
    r.write_text(head + '[[steps]]\ntechnique = "convert"\n')
    one_line_error(cli("recipes", "validate", str(r)), "r.toml", expected)


def test_recipe_names_are_file_name_tokens():
    from optimize.errors import RecipeError
    from optimize.recipe import build

    assert build("int8-int8io.v2", [{"technique": "convert"}]).name == "int8-int8io.v2"
    for bad in ("a/b", "..", "x y", "", ".x", "a\\b"):
        with pytest.raises(RecipeError, match="name"):
            build(bad, [{"technique": "convert"}])


@pytest.mark.parametrize(
    "args, expected",
    [
        (("sweep", "--target", "tpu"), "'tpu' is not one of"),
        (("sweep", "--max-accuracy-drop", "-3"), "max_accuracy_drop"),
        (("sweep", "--threads", "100000"), "--threads"),
        (("sweep", "--threads", "0"), "--threads"),
        (("compat", "x.tflite", "--coreml-version", "9"), "--coreml-version"),
        (("recommend", "--objective", "speed"), "'speed' is not one of"),
        (("quantize", "m.keras", "--scheme", "int4"), "'int4' is not one of"),
        (("quantize", "m.keras", "--io", "int4"), "'int4' is not one of"),
    ],
)
def test_bad_options_are_refused_before_any_work(cli, tmp_path, args, expected):
    extra = ("-o", str(tmp_path / "out")) if args[0] == "sweep" else ()
    one_line_error(cli(*args, *extra, cwd=tmp_path), expected)
    assert not (tmp_path / "out").exists()


def test_qat_must_end_in_an_8bit_conversion():
    from optimize.errors import RecipeError
    from optimize.recipe import chain

    with pytest.raises(RecipeError, match="QAT then float16"):
        chain({"technique": "qat"}, "float16")
    assert chain({"technique": "qat"}, "int8")[-1] == {"technique": "convert", "scheme": "int8"}


def test_usage_errors_are_one_line(cli):
    one_line_error(cli("bogus"), "No such command 'bogus'")
    one_line_error(cli("quantize"), "Missing argument")
    assert cli().returncode == 0  # `optimize` alone prints its help

"""The hostile-input corpus (issue 11), one test per class: every bad input is one `error:` line, exit 2,
no traceback, nothing written. Cases that need a model use the session fixtures; the rest are cheap."""

from __future__ import annotations

import pytest
from tests_support import one_line_error


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


def test_fifos_devices_and_huge_files_are_refused_without_reading(cli, tmp_path, keras_model):
    import os

    fifo = tmp_path / "model.tflite"
    os.mkfifo(fifo)
    one_line_error(cli("quantize", str(fifo), "--scheme", "dynamic", timeout=60), "is a FIFO, not a model file")
    one_line_error(cli("quantize", "/dev/zero", "--scheme", "dynamic", timeout=60), "is a character device")
    one_line_error(
        cli("quantize", str(keras_model), "--scheme", "float16", "--data", str(fifo), timeout=60), "not a data file"
    )
    one_line_error(cli("evaluate", "/dev/zero", timeout=60), "is a character device")


def test_input_size_is_bounded(tmp_path, monkeypatch):
    from optimize import paths
    from optimize.errors import ModelError
    from optimize.models import open_model

    big = tmp_path / "big.tflite"
    big.write_bytes(b"\0" * 2048)
    monkeypatch.setattr(paths, "MAX_INPUT_BYTES", 1024)
    with pytest.raises(ModelError, match="optimize reads model files up to"):
        open_model(big)


@pytest.mark.parametrize("bad", ["afile", "afile/sub", "/sys/optimize-out", "/proc/optimize-out"])
def test_unwritable_outputs_are_refused_before_any_work(cli, tmp_path, keras_model, bad):
    (tmp_path / "afile").write_text("x")
    r = cli("quantize", str(keras_model), "--scheme", "float16", "-o", bad, cwd=tmp_path, timeout=120)
    one_line_error(r, "Cannot write into")


def test_a_full_stdout_is_one_line_not_a_traceback():
    import subprocess
    import sys

    with open("/dev/full", "w") as full:
        r = subprocess.run(
            [sys.executable, "-c", "from optimize.cli import main; main()", "recipes", "list"],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("error: cannot write")


def test_a_shared_recipe_cannot_write_anywhere(tmp_path):
    from optimize.errors import RecipeError
    from optimize.recipe import load_recipe

    for bad in ("/etc/x", "../../x", "out/../../x"):
        r = tmp_path / "r.toml"
        r.write_text(f'output = "{bad}"\n[[steps]]\ntechnique = "convert"\n')
        with pytest.raises(RecipeError, match="must be a relative folder"):
            load_recipe(r)


def test_a_full_disk_leaves_no_half_written_artifact(tmp_path, monkeypatch, keras_model, data_npz):
    import shutil

    import optimize
    from optimize.recipe import build

    real = shutil.copyfile

    def full(src, dst, *a, **k):
        if str(dst).endswith(".tflite.tmp"):
            with open(dst, "wb") as f:
                f.write(b"half")
            raise OSError(28, "No space left on device", str(dst))
        return real(src, dst, *a, **k)

    monkeypatch.setattr(shutil, "copyfile", full)
    from optimize.errors import OptimizeError

    recipe = build("f16", [{"technique": "convert", "scheme": "float16"}])
    with pytest.raises(OptimizeError, match="No space left on device"):
        optimize.run(recipe, keras_model, data_npz, tmp_path, jobs=0)
    assert not list(tmp_path.glob("*.tflite*")) and not list(tmp_path.glob(".*.tmp"))

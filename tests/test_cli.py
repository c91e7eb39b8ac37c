"""The command line: thin over the API; every bad input is one line, exit code 2, no traceback, no output."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from tests_support import one_line_error

from optimize.cli import commands


def assert_one_line_error(r, *fragments):
    """One `error:` message (wrapped to 80 columns, joined back here), exit 2, no traceback."""
    one_line_error(r, *fragments)


def test_help_lists_every_command_with_an_example(cli):
    r = cli("--help")
    assert r.returncode == 0
    for cmd in [c for c in commands() if c and " " not in c]:
        assert cmd in r.stdout
        if cmd != "recipes":
            sub = cli(cmd, "--help")
            assert "Example:" in sub.stdout, cmd


def test_version_and_what_the_help_says_it_takes(cli):
    import optimize

    r = cli("--version")
    assert r.returncode == 0 and r.stdout == f"optimize {optimize.__version__}\n", r.stdout + r.stderr
    top = " ".join(cli("--help").stdout.split())
    for kind in ("TensorFlow", "Keras", "SavedModel", ".tflite", "PyTorch", ".pt2", "ONNX"):
        assert kind in top, kind


def test_evaluate_reference_without_data_is_refused_before_any_work(cli, float_tflite):
    """Fidelity is measured on inputs: --reference without --data was dropped in silence (exit 0)."""
    r = cli("evaluate", str(float_tflite), "--reference", str(float_tflite))
    assert_one_line_error(r, "--reference needs inputs", "--data")
    assert r.stdout == ""


@pytest.fixture
def bad_files(tmp_path):
    truncated = tmp_path / "truncated.tflite"
    text = tmp_path / "notes.txt"
    rand = tmp_path / "random.bin"
    text.write_text("just some text\n")
    rand.write_bytes(os.urandom(256))
    return truncated, text, rand


@pytest.mark.parametrize("which", [0, 1, 2])
def test_quantize_rejects_bad_models(cli, bad_files, float_tflite, data_npz, tmp_path, which):
    bad_files[0].write_bytes(float_tflite.read_bytes()[:300])
    out = tmp_path / "out"
    r = cli("quantize", str(bad_files[which]), "--scheme", "dynamic", "-o", str(out))
    assert_one_line_error(r)
    assert not out.exists() or not any(out.glob("*.tflite"))


def test_missing_model_and_plain_directory(cli, tmp_path):
    assert_one_line_error(cli("quantize", str(tmp_path / "nope.keras")), "No model at")
    assert_one_line_error(cli("quantize", str(tmp_path), "--scheme", "float16"), "not a SavedModel")


def test_int8_without_calibration(cli, keras_model, tmp_path):
    assert_one_line_error(
        cli("quantize", str(keras_model), "--scheme", "int8", "-o", str(tmp_path / "o")),
        "int8 needs calibration data",
        "--calibration",
    )
    assert not (tmp_path / "o").exists()


def test_wrong_data_shape_and_dtype(cli, keras_model, tmp_path):
    bad = tmp_path / "bad.npz"
    np.savez(bad, x=np.zeros((5, 28, 28), np.float32))
    assert_one_line_error(
        cli("quantize", str(keras_model), "--calibration", str(bad), "-o", str(tmp_path / "o")), "[28, 28]", "[8, 8, 1]"
    )
    strings = tmp_path / "s.npz"
    np.savez(strings, x=np.array([[["a"] * 1] * 8] * 8 * 2).reshape(2, 8, 8, 1))
    assert_one_line_error(cli("quantize", str(keras_model), "--calibration", str(strings)), "dtype")


def test_keras3_where_tfmot_needs_keras2(cli, tmp_path, data_npz):
    from optimize.models import _tf

    k3 = _tf.keras3()
    inp = k3.layers.Input((8, 8, 1))
    # an operation outside any layer with no TensorFlow twin (elementwise ones like `inp * 2.0` rebuild: issue 42)
    m = k3.Model(inp, k3.layers.Dense(10)(k3.layers.Flatten()(k3.ops.cumsum(inp, axis=1))))
    p = tmp_path / "k3.keras"
    m.save(p)
    r = cli("prune", str(p), "--data", str(data_npz))
    assert_one_line_error(r, "Keras 2 (tf_keras)", "cannot be rebuilt in tf_keras exactly", "outside any layer")


def test_bad_params(cli, keras_model, data_npz):
    assert_one_line_error(
        cli("prune", str(keras_model), "--data", str(data_npz), "--sparsity", "1.5"), "target_sparsity"
    )
    assert_one_line_error(cli("cluster", str(keras_model), "--data", str(data_npz), "--clusters", "1"), "clusters")
    assert_one_line_error(cli("prune", str(keras_model), "--data", str(data_npz), "--then", "int3"), "--then")


def test_recipe_errors(cli, tmp_path):
    r = tmp_path / "typo.toml"
    r.write_text('[[steps]]\ntechnique = "convert"\nschem = "int8"\n')
    assert_one_line_error(cli("run", str(r)), "typo.toml: step 1: convert: unknown key 'schem'")
    assert_one_line_error(cli("recipes", "validate", str(r)), "unknown key 'schem'")
    ok = cli("recipes", "validate", "mobile-gpu", "smallest-download")
    assert ok.returncode == 0 and ok.stdout.count("ok") == 2


def test_study_and_target_errors(cli, tmp_path):
    bad = tmp_path / "study.json"
    bad.write_text('{"schema_version": 0}')
    assert_one_line_error(cli("recommend", str(bad), "--target", "gpu"), "schema_version")
    assert_one_line_error(cli("recommend", "--target", "toaster"), "toaster")
    assert_one_line_error(cli("report", str(tmp_path / "none.json")), "No study")


def test_quantize_float16_then_evaluate_json(cli, keras_model, data_npz, tmp_path):
    out = tmp_path / "m_fp16.tflite"
    r = cli(
        "quantize",
        str(keras_model),
        "--scheme",
        "float16",
        "--data",
        str(data_npz),
        "-o",
        str(out),
        "--json",
        "--no-delegates",
    )
    assert r.returncode == 0, r.stderr
    cand = json.loads(r.stdout)
    # the candidate keeps the recipe's name; the file is the one asked for (issue 17)
    assert cand["name"] == "float16" and cand["artifact"] == "m_fp16.tflite" and out.is_file()
    assert cand["scheme"] == "float16" and [p.name for p in tmp_path.iterdir()] == ["m_fp16.tflite"]
    assert cand["metrics"]["fidelity"]["top1_agreement"] > 0.95
    r = cli("evaluate", str(out), "--data", str(data_npz), "--json", "--runs", "5")
    assert r.returncode == 0, r.stderr
    m = json.loads(r.stdout)
    assert m["size"]["bytes"] == out.stat().st_size and m["latency"]["runs"] == 5


def test_quantize_with_integer_io_is_named_as_the_sweep_names_it(cli, keras_model, data_npz, tmp_path):
    """Issue 29: `quantize --io int8` named its row `int8`, where the sweep says `int8-int8io`."""
    out = tmp_path / "q"
    r = cli(
        "quantize", str(keras_model), "-c", str(data_npz), "--io", "int8", "-o", str(out), "--json", "--no-delegates"
    )
    assert r.returncode == 0, r.stderr
    cand = json.loads(r.stdout)
    assert cand["name"] == "int8-int8io" and cand["artifact"] == "int8-int8io.tflite"
    assert (out / "int8-int8io.tflite").is_file()


def test_advice_without_a_study(cli):
    r = cli("recommend", "--target", "coreml")
    assert r.returncode == 0, r.stderr
    assert "float16" in r.stdout


def test_recipes_show_shows_what_run_does(cli):
    """mobile-gpu is written as convert(float16); run makes it as float32 then LiteRT Quantizer's float16."""
    import tomllib

    from optimize.core.recipe import load_recipe

    r = cli("recipes", "show", "mobile-gpu")
    assert r.returncode == 0, r.stderr
    said = tomllib.loads(r.stdout)
    assert [(s["technique"], s["scheme"]) for s in said["steps"]] == [("convert", "float32"), ("quantize", "float16")]
    assert "# As written: convert(float16)" in r.stdout and "LiteRT Quantizer" in r.stdout
    assert load_recipe("mobile-gpu").with_backend().to_toml() in r.stdout


def test_recommend_prints_no_recipe_unless_asked(cli, tmp_path):
    from study_fixtures import full_study

    full_study().save(tmp_path / "study.json")
    plain = cli("recommend", str(tmp_path / "study.json"), "--target", "gpu")
    asked = cli("recommend", str(tmp_path / "study.json"), "--target", "gpu", "--recipe")
    tree = cli("recommend", "--target", "gpu")
    assert plain.returncode == asked.returncode == tree.returncode == 0, plain.stderr + asked.stderr
    assert "[[steps]]" not in plain.stdout and "[[steps]]" not in tree.stdout
    assert "--recipe" in plain.stdout and "[[steps]]" in asked.stdout

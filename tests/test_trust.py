"""No code runs from a model file unless the user trusts it; corrupt models are one line, exit 2, up front
(issue 11 items 1, 10 and 12)."""

from __future__ import annotations

import json
import zipfile

import numpy as np
import pytest
from tests_support import one_line_error


@pytest.fixture(scope="module")
def lambda_files(tmp_path_factory):
    """A Sequential model whose Lambda layer writes a marker file when it is called (as loading does)."""
    from optimize.models import _tf

    keras = _tf.keras()
    folder = tmp_path_factory.mktemp("lambda")
    marker = folder / "code-ran"
    path = str(marker)

    def tag(x):
        open(path, "w").close()  # noqa: SIM115 - the side effect a hostile Lambda would have
        return x * 2

    inner = keras.Sequential([keras.layers.Input((4,)), keras.layers.Lambda(tag, name="lam")], name="inner")
    model = keras.Sequential([keras.layers.Input((4,)), inner, keras.layers.Dense(1)])
    model.save(folder / "lambda.h5")
    marker.unlink(missing_ok=True)
    data = folder / "d.npz"
    np.savez(data, x=np.ones((10, 4), np.float32), y=np.ones((10, 1), np.float32))
    return folder / "lambda.h5", data, marker


def test_a_lambda_layer_in_an_h5_is_refused_and_never_runs(cli, lambda_files, tmp_path):
    model, data, marker = lambda_files
    for cmd in (("quantize", str(model), "--scheme", "dynamic"), ("prune", str(model), "--data", str(data))):
        one_line_error(cli(*cmd, "-o", str(tmp_path / "o")), "holds Python code", "lam (Lambda)", "--trust-model-code")
    assert not marker.exists()
    assert not (tmp_path / "o").exists()


def test_a_recipe_cannot_smuggle_the_model_in(cli, lambda_files, tmp_path):
    model, data, marker = lambda_files
    recipe = tmp_path / "r.toml"
    recipe.write_text(f'model = "{model}"\n[[steps]]\ntechnique = "convert"\nscheme = "float16"\n')
    one_line_error(cli("run", str(recipe), "-o", str(tmp_path / "o")), "holds Python code")
    assert not marker.exists()


def test_trusting_the_model_loads_it(lambda_files, tmp_path):
    import optimize
    from optimize.core.recipe import build

    model, data, marker = lambda_files
    cand = optimize.run(
        build("f16", [{"technique": "convert", "scheme": "float16"}]),
        model,
        data,
        tmp_path,
        delegates=False,
        jobs=0,
        trust_model_code=True,
    )
    assert cand.ok, cand.error
    assert marker.exists()  # the code did run: the user asked for it


def test_code_layers_finds_marshalled_functions_anywhere():
    from optimize.models.source import code_layers

    config = {
        "class_name": "Functional",
        "config": {
            "layers": [
                {"class_name": "Dense", "config": {"name": "d"}},
                {"class_name": "MyLayer", "config": {"name": "m", "function": ["4wEA..."], "function_type": "lambda"}},
                {"class_name": "Model", "config": {"layers": [{"class_name": "Lambda", "config": {"name": "deep"}}]}},
            ]
        },
    }
    assert code_layers(config) == ["m (MyLayer)", "deep (Lambda)"]


def test_bogus_keras_files_are_one_line_up_front(cli, tmp_path, keras_model):
    import h5py

    bogus = tmp_path / "bogus.h5"
    with h5py.File(bogus, "w") as f:
        f.attrs["keras_version"] = "2.15.0"
        f.attrs["model_config"] = "{not json"
    one_line_error(cli("quantize", str(bogus), "--scheme", "dynamic"), "readable Keras model config")

    listed = tmp_path / "listed.keras"
    with zipfile.ZipFile(keras_model) as src, zipfile.ZipFile(listed, "w") as dst:
        for item in src.infolist():
            data = src.read(item.filename)
            dst.writestr(item, json.dumps(["not", "a", "dict"]) if item.filename == "metadata.json" else data)
    one_line_error(cli("quantize", str(listed), "--scheme", "dynamic"), "metadata.json is not a Keras metadata object")


def test_corrupt_savedmodels_are_one_line_up_front(cli, tmp_path, keras_model):
    import shutil

    from optimize.convert.keras import export_saved_model
    from optimize.models import source as models

    sm = export_saved_model(models.load_keras2(models.open_model(keras_model)), tmp_path / "sm")
    garbage = tmp_path / "garbage"
    shutil.copytree(sm, garbage)
    (garbage / "saved_model.pb").write_bytes(b"\x00garbage" * 10)
    one_line_error(cli("quantize", str(garbage), "--scheme", "dynamic", "-o", str(tmp_path / "o")), "SavedModel")
    novars = tmp_path / "novars"
    shutil.copytree(sm, novars)
    shutil.rmtree(novars / "variables")
    one_line_error(cli("quantize", str(novars), "--scheme", "dynamic", "-o", str(tmp_path / "o")), "SavedModel")
    assert not (tmp_path / "o").exists()

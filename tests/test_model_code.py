"""A model's own code failing says why, once, before any candidate (issue 42 item 5): a Lambda layer saved in a
.keras file keeps its bytecode but not the module globals it uses, so a lambda naming `tf` fails with
"name 'tf' is not defined". Loaded with --trust-model-code, with or without output_shape, that is one line and
exit 2 with the lambda's own message (not Keras's wrapper line) and the remedy, never "Pass a Keras .keras/.h5
file" about a .keras file, and never six failed candidates. A lambda that runs is taken as before.
"""

from __future__ import annotations

import numpy as np
import pytest
from tests_support import one_line_error

from optimize.core.errors import reason
from optimize.models import _tf

RNG = np.random.default_rng(0)
tf = None  # bound by the fixture below


def _save_lambda(path, body, output_shape=None):
    k = _tf.keras3()
    inp = k.Input((4,))
    kw = {"output_shape": output_shape} if output_shape else {}
    h = k.layers.Lambda(body, **kw)(k.layers.Dense(8)(inp))
    k.Model(inp, k.layers.Dense(3, activation="softmax")(h)).save(path)


@pytest.fixture(scope="module")
def lambdas(tmp_path_factory):
    global tf  # the module global the lambdas name, as a user's script imports it: not saved with them
    tf = _tf.tf()
    d = tmp_path_factory.mktemp("lambdas")
    _save_lambda(d / "no_shape.keras", lambda t: tf.nn.relu(t) * 2.0)
    _save_lambda(d / "with_shape.keras", lambda t: tf.nn.relu(t) * 2.0, output_shape=(8,))
    _save_lambda(d / "plain.keras", lambda t: t * 2.0, output_shape=(8,))
    np.savez(d / "d.npz", x=RNG.normal(size=(40, 4)).astype(np.float32), y=RNG.integers(0, 3, 40))
    return d


@pytest.mark.parametrize("name", ["no_shape", "with_shape"])
def test_a_lambda_whose_globals_were_not_saved_is_one_line(lambdas, name, cli, tmp_path):
    r = cli("quantize", str(lambdas / f"{name}.keras"), "--trust-model-code", "-c", str(lambdas / "d.npz"),
            "-o", str(tmp_path / "q.tflite"), env={"NO_COLOR": "1"})  # fmt: skip
    msg = one_line_error(r, "name 'tf' is not defined", "register_keras_serializable", "module globals")
    assert "Pass a Keras .keras/.h5 file" not in msg and "Exception encountered" not in msg
    assert "failed" not in r.stdout and not (tmp_path / "q.tflite").exists()  # no candidate ran


def test_a_lambda_that_runs_is_taken(lambdas, cli, tmp_path):
    r = cli("quantize", str(lambdas / "plain.keras"), "--trust-model-code", "--scheme", "float16",
            "-c", str(lambdas / "d.npz"), "-o", str(tmp_path / "q.tflite"), env={"NO_COLOR": "1"})  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    assert (tmp_path / "q.tflite").is_file()


def test_the_reason_is_the_exception_under_a_frameworks_wrapper():
    try:
        raise NameError("Exception encountered when calling Lambda.call().\n\n\x1b[1mname 'tf' is not defined\x1b[0m\n")
    except NameError as e:
        assert reason(e) == "name 'tf' is not defined"
    try:
        try:
            raise NameError("name 'np' is not defined")
        except NameError as inner:
            raise NotImplementedError("We could not infer the shape. Please specify `output_shape`.") from inner
    except NotImplementedError as e:
        said = reason(e)
        assert said.startswith("We could not infer the shape") and "NameError: name 'np' is not defined" in said

"""Issue 26: a warm re-run decides "everything is cached" without importing TensorFlow where the model's
fingerprint allows it: what loading the model found is kept in the cache beside the candidates
(optimize.models.known), validated like every entry. benchmarks/bench_warm.py measures the time it saves."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from optimize.convert.keras import export_saved_model
from optimize.core.recipe import build
from optimize.engine import sweeps

RECIPES = [build("float16", [{"technique": "convert", "scheme": "float16"}])]
WARM = r"""
import json, sys
import optimize
from optimize.core.recipe import build
model, data, out, cache, steps = sys.argv[1:6]
study = optimize.sweep(model, data if data != "-" else None, out, cache=cache, jobs=0, runs=3,
                       recipes=[build(n, s) for n, s in json.loads(steps)])
print(json.dumps({"cached": [c.cached for c in study.candidates], "tf": "tensorflow" in sys.modules}))
"""


def _warm(model: Path, data: Path | None, out: Path, cache: Path, recipes=RECIPES) -> dict:
    steps = json.dumps([[r.name, [s.flat() for s in r.steps]] for r in recipes])
    r = subprocess.run(
        [sys.executable, "-c", WARM, str(model), str(data or "-"), str(out), str(cache), steps],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_a_warm_rerun_of_a_keras_model_imports_no_tensorflow(keras_model, data_npz, tmp_path):
    cache = tmp_path / "cache"
    cold = sweeps.sweep(keras_model, data_npz, tmp_path / "a", RECIPES, jobs=0, runs=3, cache=str(cache))
    assert not any(c.cached for c in cold.candidates)
    warm = _warm(keras_model, data_npz, tmp_path / "b", cache)
    assert warm == {"cached": [True] * 4, "tf": False}  # the fit round's fit-float32, fit-float16 (Core ML) too
    # what was known is validated like every entry: a corrupt record means checking again, never a traceback
    for record in cache.rglob("known/*/*.json"):
        record.write_text('{"format": 1, "fingerprint": 5}')
    again = _warm(keras_model, data_npz, tmp_path / "c", cache)
    assert again == {"cached": [True] * 4, "tf": True}
    assert _warm(keras_model, data_npz, tmp_path / "d", cache)["tf"] is False  # and it is kept again


def test_a_warm_rerun_of_a_savedmodel_and_a_keras3_model_imports_no_tensorflow(tmp_path, digits, keras_model):
    from optimize.models import _tf
    from optimize.models import source as models

    sm = export_saved_model(models.load_keras2(models.open_model(keras_model)), tmp_path / "sm")
    k = _tf.keras3()
    k.utils.set_random_seed(0)
    m3 = k.Sequential([k.Input((8, 8, 1)), k.layers.Flatten(), k.layers.Dense(10)])
    m3.save(tmp_path / "m3.keras")
    np.savez(tmp_path / "d.npz", **{k_: v[:120] for k_, v in digits.items()})
    prune = [build("prune-f16", [{"technique": "prune", "epochs": 1}, {"technique": "convert", "scheme": "float16"}])]
    for model, recipes in ((sm, RECIPES), (tmp_path / "m3.keras", prune)):
        cache = tmp_path / f"cache-{model.name}"
        sweeps.sweep(model, tmp_path / "d.npz", tmp_path / f"a-{model.name}", recipes, jobs=0, runs=3, cache=str(cache))
        warm = _warm(model, tmp_path / "d.npz", tmp_path / f"b-{model.name}", cache, recipes)
        fine_tunes = model.name == "m3.keras"  # the baseline, prune-f16 and its training control (issue 43)
        fitted = 2 if model == sm else 0  # the CNN's Flatten fits Core ML; m3's feeds its output layer: no fit
        assert warm == {"cached": [True] * ((3 if fine_tunes else 2) + fitted), "tf": False}, model.name


@pytest.mark.parametrize("change", ["bytes", "trust"])
def test_what_is_known_follows_the_bytes_and_the_trust(keras_model, tmp_path, change):
    """Another file (one byte differs), or the same file with its code trusted, is checked again."""
    from optimize.convert.front import open_inputs
    from optimize.engine.cache import result_cache

    cache = result_cache(str(tmp_path / "cache"))
    known = cache.known(False)
    src, _ = open_inputs(keras_model, None, check=True, known=known)
    record = known.model(src.fingerprint)
    assert record is not None and record.kind == "keras2" and record.heads[0].shape == (-1, 10)
    if change == "trust":
        assert cache.known(True).model(src.fingerprint) is None
    else:
        other = tmp_path / "other.keras"
        data = bytearray(keras_model.read_bytes())
        other.write_bytes(bytes(data) + b"\0")  # a zip with a trailing byte: still a model, another fingerprint
        src2, _ = open_inputs(other, None, check=False)
        assert src2.fingerprint != src.fingerprint and known.model(src2.fingerprint) is None

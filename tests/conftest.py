"""Shared fixtures: a tiny seeded CNN trained on scikit-learn's bundled digits, its data, its conversions.

No downloads: the digits ship inside scikit-learn. Everything is session-scoped and built once.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")


@pytest.fixture(autouse=True, scope="session")
def _isolated_cache(tmp_path_factory):
    """Results cached by the tests never leak into (or come from) the user's ~/.cache/optimize.

    The trained demo model is shared with the user's cache when present, to save the training time.
    """
    import secrets
    import shutil

    from optimize.convert.demo import DEMO_VERSION, cache_dir

    user = cache_dir()
    root = tmp_path_factory.mktemp("optimize-cache")
    demo = user / f"demo-v{DEMO_VERSION}"
    if demo.is_dir():
        shutil.copytree(demo, root / demo.name)
    old = {k: os.environ.get(k) for k in ("OPTIMIZE_CACHE", "OPTIMIZE_CACHE_KEY")}
    os.environ["OPTIMIZE_CACHE"] = str(root)
    os.environ["OPTIMIZE_CACHE_KEY"] = secrets.token_hex(16)  # entries signed: no key file in the user's ~/.config
    yield root
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="session")
def digits() -> dict[str, np.ndarray]:
    from sklearn.datasets import load_digits

    d = load_digits()
    x = (d.images / 16.0).astype(np.float32)[..., None]
    y = d.target.astype(np.int64)
    order = np.random.default_rng(0).permutation(len(x))[:600]
    x, y = x[order], y[order]
    return {"x_train": x[:480], "y_train": y[:480], "x_test": x[480:], "y_test": y[480:]}


@pytest.fixture(scope="session")
def data_npz(tmp_path_factory, digits) -> Path:
    p = tmp_path_factory.mktemp("data") / "digits.npz"
    np.savez(p, **digits)
    return p


@pytest.fixture(scope="session")
def keras_model(tmp_path_factory, digits) -> Path:
    """A small tf_keras CNN (Keras 2), trained for a few seconds, saved as .keras."""
    from optimize.models import _tf

    keras = _tf.keras()
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.layers.Input((8, 8, 1)),
            keras.layers.Conv2D(8, 3, padding="same", activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dense(32, activation="relu"),
            keras.layers.Dense(10),
        ]
    )
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True), ["accuracy"])
    model.fit(digits["x_train"], digits["y_train"], epochs=30, batch_size=32, verbose=0)
    p = tmp_path_factory.mktemp("model") / "cnn.keras"
    model.save(p)
    return p


@pytest.fixture(scope="session")
def float_tflite(tmp_path_factory, keras_model) -> Path:
    from optimize.convert.keras import export_saved_model
    from optimize.core.registry import Context, get
    from optimize.models import source as models

    src = models.open_model(keras_model)
    folder = tmp_path_factory.mktemp("float")
    sm = export_saved_model(models.load_keras2(src), folder / "sm")
    tech = get("convert")
    return tech.fn(sm, tech.params(scheme="float32"), Context(workdir=folder))


def run_cli(
    *args: str, cwd: Path | None = None, timeout: int = 600, env: dict | None = None
) -> subprocess.CompletedProcess:
    """Run the real console entry point in a subprocess (so tracebacks and exit codes are real); `env`:
    variables set over this process's environment."""
    return subprocess.run(
        [sys.executable, "-c", "from optimize.cli import main; main()", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=timeout,
        env={**os.environ, **env} if env else None,
    )


@pytest.fixture
def cli():
    return run_cli

"""The built-in demo: a small CNN trained deterministically on scikit-learn's bundled digits, cached.

It lets a newcomer see the whole value of optimize in one command, offline. The split is fixed:
train (fine-tuning), calibration (drawn from train), test (accuracy and fidelity).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np

from optimize.core import trust
from optimize.core.results import write_atomic
from optimize.models import _tf

DEMO_VERSION = 1
SEED = 0


def cache_dir() -> Path:
    """The local cache folder: $OPTIMIZE_CACHE when it is a folder (or file:// URL), else ~/.cache/optimize.
    (A remote $OPTIMIZE_CACHE, s3://..., holds the result cache; the demo model stays local.)"""
    from optimize.core.paths import default_root, local_path

    root = local_path(default_root())
    if root is None:
        root = Path(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "optimize")
    return root


def demo_data_arrays() -> dict[str, np.ndarray]:
    """Digits (1,797 8x8 grey images, 10 classes) scaled to 0..1, shuffled with a fixed seed, split 80/20."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)[..., None]
    y = digits.target.astype(np.int64)
    order = np.random.default_rng(SEED).permutation(len(x))
    x, y = x[order], y[order]
    n_test = 360
    return {"x_train": x[:-n_test], "y_train": y[:-n_test], "x_test": x[-n_test:], "y_test": y[-n_test:]}


def build_demo_model():
    """A CNN sized so weights dominate the file (~190k parameters), as in a real mobile model."""
    keras = _tf.keras()
    layers = keras.layers
    return keras.Sequential(
        [
            layers.Input((8, 8, 1), name="image"),
            layers.Conv2D(32, 3, padding="same", activation="relu"),
            layers.Conv2D(64, 3, padding="same", activation="relu"),
            layers.MaxPooling2D(),
            layers.Conv2D(64, 3, padding="same", activation="relu"),
            layers.Flatten(),
            layers.Dense(128, activation="relu"),
            layers.Dense(10, name="logits"),
        ],
        name="digits_cnn",
    )


def _intact(model_path: Path, data_path: Path) -> bool:
    """Both cached files present and readable (a truncated file is trained again, not reported)."""
    import zipfile

    try:
        with zipfile.ZipFile(model_path) as z:
            if z.testzip() is not None:
                return False
        with np.load(data_path, allow_pickle=False) as d:
            return {"x_train", "y_train", "x_test", "y_test"} <= set(d.files) and len(d["x_test"]) > 0
    except (OSError, ValueError, EOFError, zipfile.BadZipFile):
        return False


def demo() -> tuple[Path, Path]:
    """Paths of the demo model (.keras, Keras 2) and its data (.npz); trained on first use (~20 s)."""
    folder = trust.or_private(cache_dir() / f"demo-v{DEMO_VERSION}", "The demo model's cache")
    model_path, data_path = folder / "digits_cnn.keras", folder / "digits.npz"
    if _intact(model_path, data_path):
        return model_path, data_path
    logging.getLogger(__name__).warning("Training the built-in demo model (digits CNN, once; cached in %s)...", folder)
    folder.mkdir(parents=True, exist_ok=True)
    arrays = demo_data_arrays()
    keras = _tf.keras()
    tf = _tf.tf()
    keras.utils.set_random_seed(SEED)
    tf.config.experimental.enable_op_determinism()
    model = build_demo_model()
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    from optimize.models.runtime import captured_stderr

    with captured_stderr():  # TF's C++ graph warnings during fit are noise to a newcomer
        model.fit(arrays["x_train"], arrays["y_train"], epochs=12, batch_size=32, verbose=0, shuffle=True)
    tmp = folder / "digits_cnn.tmp.keras"
    model.save(tmp)
    os.replace(tmp, model_path)
    import io

    buf = io.BytesIO()
    np.savez(buf, **arrays)
    write_atomic(data_path, buf.getvalue())
    return model_path, data_path

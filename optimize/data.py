"""Datasets: `.npz` files checked against the model's input before any work starts; calibration samples.

An `.npz` holds `x`/`y`, or `x_train`/`y_train`/`x_test`/`y_test` (optionally `x_cal`). Labels are
optional: without them, accuracy is not measured, but calibration and fidelity still work.
"""

from __future__ import annotations

import hashlib
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import DataError

KNOWN_KEYS = ("x", "y", "x_train", "y_train", "x_test", "y_test", "x_cal")


@dataclass(frozen=True)
class Dataset:
    """Train (for fine-tuning), calibration (for int8 ranges) and test (for accuracy, fidelity) splits."""

    x_train: np.ndarray | None
    y_train: np.ndarray | None
    x_cal: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray | None
    source: str

    @property
    def fingerprint(self) -> str:
        """Content hash of every array: the cache key part that says 'same data'."""
        h = hashlib.sha256()
        for a in (self.x_train, self.y_train, self.x_cal, self.x_test, self.y_test):
            if a is not None:
                h.update(str(a.shape).encode() + str(a.dtype).encode())
                h.update(np.ascontiguousarray(a).tobytes())
        return h.hexdigest()[:16]

    @property
    def sample_shape(self) -> tuple[int, ...]:
        return tuple(self.x_cal.shape[1:])

    def calibration(self, n: int) -> np.ndarray:
        """The first n calibration samples (deterministic), as float32."""
        return self.x_cal[:n].astype(np.float32)

    def require_training(self, technique: str) -> None:
        if self.x_train is None or self.y_train is None:
            raise DataError(
                f"{technique} fine-tunes the model and needs labelled training data.",
                "Pass an .npz with x/y or x_train/y_train.",
            )

    def check_input(self, shape: tuple, dtype: str = "float32", name: str = "input") -> None:
        """Raise one clear DataError when samples do not fit the model input (batch dim ignored)."""
        want = tuple(int(d) if d is not None and d != -1 else -1 for d in shape[1:])
        got = self.sample_shape
        if len(want) != len(got) or any(w not in (-1, g) for w, g in zip(want, got)):
            raise DataError(
                f"Data samples have shape {list(got)} but the model's {name} takes {list(want)} (batch excluded).",
                "Reshape the arrays in the .npz to match the model input.",
            )
        if not np.issubdtype(self.x_cal.dtype, np.number) or self.x_cal.dtype == np.bool_:
            raise DataError(f"Data x has dtype {self.x_cal.dtype}; the model takes {dtype}.", "Store x as float32.")


def _split(x: np.ndarray, y: np.ndarray | None, test_fraction: float = 0.2):
    n_test = max(1, int(len(x) * test_fraction))
    return x[:-n_test], (y[:-n_test] if y is not None else None), x[-n_test:], (y[-n_test:] if y is not None else None)


def load_data(path: str | Path) -> Dataset:
    """Read an .npz dataset; one clear error for anything that is not one."""
    p = Path(path)
    if not p.exists():
        raise DataError(f"No data file at {p}.", "Pass an .npz with arrays x and y (or x_train/y_train/x_test/y_test).")
    try:
        with np.load(p, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except (ValueError, OSError, zipfile.BadZipFile, EOFError) as e:
        raise DataError(
            f"{p} is not a readable .npz file ({e.__class__.__name__}).", "Save arrays with numpy.savez."
        ) from None
    unknown = sorted(set(arrays) - set(KNOWN_KEYS))
    if unknown:
        raise DataError(f"{p} has unknown array {unknown[0]!r}.", f"Use the keys {', '.join(KNOWN_KEYS)}.")
    return from_arrays(source=str(p), **arrays)


def from_arrays(
    x=None, y=None, x_train=None, y_train=None, x_test=None, y_test=None, x_cal=None, source="arrays"
) -> Dataset:
    """Build a Dataset from arrays, splitting x/y 80/20 into train/test when no split is given."""
    if x is not None:
        if x_train is not None or x_test is not None:
            raise DataError(f"{source} has both x and x_train/x_test.", "Give either x/y or an explicit split.")
        x_train, y_train, x_test, y_test = _split(np.asarray(x), None if y is None else np.asarray(y))
    if x_test is None and x_train is None and x_cal is None:
        raise DataError(f"{source} has no x, x_train, x_test or x_cal array.", "Add the model inputs as array x.")
    for name, xs, ys in (("train", x_train, y_train), ("test", x_test, y_test)):
        if xs is not None and ys is not None and len(xs) != len(ys):
            raise DataError(
                f"{source}: x_{name} has {len(xs)} samples but y_{name} has {len(ys)}.", "Give one label per sample."
            )
    if x_cal is None:
        x_cal = x_train if x_train is not None else x_test
    if x_test is None:
        x_test = x_cal
    if len(x_cal) == 0:
        raise DataError(f"{source} has no samples.", "Add at least one sample.")
    return Dataset(x_train, y_train, np.asarray(x_cal), np.asarray(x_test), y_test, source)


def combine(data: Dataset | None, calibration: Dataset | None) -> Dataset | None:
    """Test/train data from one file and calibration samples from another; either alone serves both."""
    if calibration is None:
        return data
    if data is None:
        return calibration
    from dataclasses import replace

    return replace(data, x_cal=calibration.x_cal, source=f"{data.source} (calibration: {calibration.source})")

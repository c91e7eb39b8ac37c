"""Datasets: .npz layouts, splits, and one clear error for data that does not fit."""

from __future__ import annotations

import numpy as np
import pytest

from optimize.core.errors import DataError
from optimize.models.data import from_arrays, load_data


def test_x_y_is_split_80_20(tmp_path):
    p = tmp_path / "d.npz"
    np.savez(p, x=np.zeros((100, 4), np.float32), y=np.arange(100))
    d = load_data(p)
    assert len(d.x_train) == 80 and len(d.x_test) == 20 and len(d.x_cal) == 80
    assert d.sample_shape == (4,)
    assert d.fingerprint == load_data(p).fingerprint


def test_explicit_split_and_calibration_only():
    d = from_arrays(x_train=np.ones((5, 3)), y_train=np.arange(5), x_test=np.ones((2, 3)), y_test=np.arange(2))
    assert len(d.x_test) == 2
    c = from_arrays(x_cal=np.ones((7, 3)))
    assert c.y_test is None and len(c.calibration(3)) == 3 and c.calibration(3).dtype == np.float32
    with pytest.raises(DataError, match="needs training inputs"):
        c.require_training("prune")


@pytest.mark.parametrize(
    "arrays, match",
    [
        ({"x": np.ones((4, 3)), "x_train": np.ones((4, 3))}, "both x and x_train"),
        ({"x_train": np.ones((4, 3)), "y_train": np.arange(3)}, "x_train has 4 samples but y_train has 3"),
        ({"y": np.arange(3)}, "no x"),
        ({"x": np.ones((4, 3)), "targets": np.arange(4)}, "unknown array 'targets'"),
        ({"x": np.ones((4, 3)), "labels": np.arange(4)}, "labels must be a 1-D array of class names"),
    ],
)
def test_bad_npz(tmp_path, arrays, match):
    p = tmp_path / "d.npz"
    np.savez(p, **arrays)
    with pytest.raises(DataError, match=match):
        load_data(p)


def test_not_an_npz(tmp_path):
    p = tmp_path / "d.npz"
    p.write_text("hello")
    with pytest.raises(DataError, match="not a readable .npz"):
        load_data(p)
    with pytest.raises(DataError, match="No data file"):
        load_data(tmp_path / "missing.npz")


def test_shape_and_dtype_checks():
    d = from_arrays(x=np.ones((10, 8, 8, 1), np.float32))
    d.check_input((None, 8, 8, 1))
    d.check_input((1, 8, 8, 1))
    with pytest.raises(DataError, match=r"shape \[8, 8, 1\] but the model's input takes \[28, 28, 1\]"):
        d.check_input((None, 28, 28, 1))
    with pytest.raises(DataError, match=r"x holds text \(dtype <U1\); optimize takes real numbers"):
        from_arrays(x=np.array([["a", "b"]] * 4))  # refused by name, on load


def test_a_sorted_data_set_splits_with_both_classes_in_the_test_part():
    """Issue 29: faces first, non-faces last; the last 20% held 40 non-faces and top-1 was one class's."""
    x = np.arange(200, dtype=np.float32)[:, None]
    y = np.r_[np.ones(160, np.int64), np.zeros(40, np.int64)]
    d = from_arrays(x=x, y=y)
    assert d.split.method == "stratified" and d.split.seed == 0 and not d.split.warnings
    assert d.split.test_classes == {"0": 8, "1": 32} and (d.split.train, d.split.test) == (160, 40)
    assert np.bincount(d.y_test).tolist() == [8, 32] and np.bincount(d.y_train).tolist() == [32, 128]
    assert sorted(np.r_[d.x_train[:, 0], d.x_test[:, 0]].tolist()) == x[:, 0].tolist()  # a partition
    again = from_arrays(x=x, y=y)  # seeded: the same split every run
    assert np.array_equal(again.x_test, d.x_test)
    unlabelled = from_arrays(x=x)
    assert unlabelled.split.method == "shuffled" and unlabelled.x_test[:, 0].tolist() != x[-40:, 0].tolist()


def test_a_test_split_of_one_class_or_a_few_per_class_is_warned_about(tmp_path, caplog):
    import logging

    from optimize.models.data import warn_split

    x = np.arange(200, dtype=np.float32)[:, None]
    y = np.r_[np.ones(160, np.int64), np.zeros(40, np.int64)]
    given = from_arrays(x_train=x[:160], y_train=y[:160], x_test=x[160:], y_test=y[160:], source=str(tmp_path / "d"))
    (w,) = given.split.warnings
    assert w == "test split of one class (0; 40 samples): accuracy measures it alone"
    with caplog.at_level(logging.WARNING):
        warn_split(given)
        warn_split(given)  # once per data set
    assert [r.getMessage() for r in caplog.records] == [f"d: {w}."]
    few = from_arrays(x=np.ones((30, 2)), y=np.repeat(np.arange(10), 3))
    assert any("under 5 samples of 6 of its 6 classes" in w for w in few.split.warnings), few.split.warnings
    assert any("lacks 4 class(es)" in w for w in few.split.warnings)


def test_a_cap_on_the_test_split_is_a_stratified_sample_never_the_head():
    """Issue 43: accuracy on the first 500 of 600 test samples sorted by class held 150/150/150/50."""
    from optimize.models.data import test_sample

    y = np.repeat(np.arange(4), 150)  # sorted by class, as many test splits are
    x = np.arange(600, dtype=np.float32)[:, None]
    ds = from_arrays(x_train=x, y_train=y, x_test=x, y_test=y)
    whole, t = test_sample(ds, None)
    assert whole is ds and (t.samples, t.of, t.method) == (600, 600, "whole") and t.words() == "all 600 test samples"
    cut, t = test_sample(ds, 500, "--test-samples 500")
    assert (t.samples, t.of, t.method) == (500, 600, "stratified")
    assert sorted(np.bincount(cut.y_test).tolist()) == [125, 125, 125, 125]  # every class at its share
    assert np.array_equal(cut.x_test[:, 0].astype(int), np.sort(cut.x_test[:, 0]).astype(int))  # kept in order
    assert not np.array_equal(cut.x_test[:, 0], x[:500, 0])  # not the head
    assert t.words() == "500 of 600 test samples (a stratified sample: --test-samples 500)"
    again, _ = test_sample(ds, 500)
    assert np.array_equal(again.x_test, cut.x_test)  # seeded: every candidate gets the same samples
    free = from_arrays(x_train=x, x_test=x)  # no labels: a random sample
    cut, t = test_sample(free, 100)
    assert t.method == "shuffled" and len(cut.x_test) == 100 and cut.y_test is None
    assert test_sample(ds, 600)[1].method == "whole" and test_sample(ds, 10_000)[0] is ds

"""Model inputs: each kind is recognised; anything else is one clear ModelError line."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from optimize.convert.keras import export_saved_model
from optimize.core.errors import ModelError
from optimize.models import source as models


def test_kinds(keras_model, float_tflite, tmp_path):
    assert models.open_model(keras_model).kind == "keras2"
    assert models.open_model(float_tflite).kind == "tflite"
    sm = export_saved_model(models.load_keras2(models.open_model(keras_model)), tmp_path / "sm")
    src = models.open_model(sm)
    assert src.kind == "savedmodel" and models.input_shape(src) == (-1, 8, 8, 1)
    assert [s.name for s in models.input_specs(models.open_model(keras_model))] == [
        s.name for s in models.input_specs(src)
    ]
    assert models.open_model(keras_model).fingerprint == models.open_model(keras_model).fingerprint


@pytest.fixture(scope="module")
def keras3_model(tmp_path_factory):
    from optimize.models import _tf

    k3 = _tf.keras3()
    m = k3.Sequential([k3.layers.Input((8, 8, 1)), k3.layers.Flatten(), k3.layers.Dense(10)])
    p = tmp_path_factory.mktemp("k3") / "m3.keras"
    m.save(p)
    return p


def test_keras3_is_recognised_and_refused_for_tfmot(keras3_model):
    src = models.open_model(keras3_model)
    assert src.kind == "keras3"
    with pytest.raises(ModelError, match="need a Keras 2 \\(tf_keras\\) model; m3.keras is keras3"):
        models.load_keras2(src)


@pytest.mark.parametrize(
    "name, content, match",
    [
        ("random.tflite", os.urandom(64), "not a TFLite flatbuffer"),
        ("random.bin", os.urandom(64), "not a model optimize can read"),
        ("notes.txt", b"hello world\n", "not a model optimize can read"),
        ("broken.keras", b"PK\x03\x04garbage", "not a model optimize can read"),
    ],
)
def test_bad_files(tmp_path, name, content, match):
    p = tmp_path / name
    p.write_bytes(content)
    with pytest.raises(ModelError, match=match):
        models.open_model(p)


def test_missing_and_plain_directory(tmp_path):
    with pytest.raises(ModelError, match="No model at"):
        models.open_model(tmp_path / "nope.keras")
    with pytest.raises(ModelError, match="not a SavedModel"):
        models.open_model(tmp_path)


def _counting(fn, counts, key):
    def wrapped(*a, **k):
        counts[key] += 1
        return fn(*a, **k)

    return wrapped


def test_a_tflite_is_read_parsed_and_validated_once_when_a_sweep_opens_it(
    float_tflite, data_npz, tmp_path, monkeypatch
):
    """Issue 25: opening a sweep (recognise, normalise, describe, plan, check the data against the model)
    reads the file once and parses and validates its flatbuffer once; every later step gets what was read."""
    from collections import Counter

    from optimize.engine.runs import open_run
    from optimize.models import source, tflite

    counts: Counter = Counter()
    monkeypatch.setattr(tflite, "_parse", _counting(tflite._parse, counts, "parse"))
    monkeypatch.setattr(tflite, "validate", _counting(tflite.validate, counts, "validate"))
    real_read = source.read_bounded
    monkeypatch.setattr(
        source,
        "read_bounded",
        lambda p, *a, **k: (counts.update(["read"]) if Path(p) == float_tflite else None) or real_read(p, *a, **k),
    )
    tflite._PARSED.clear()
    run = open_run(float_tflite, data_npz, tmp_path / "out", cache=False)
    assert [r.name for r in run.recipes][:1] == ["float32"]
    assert counts == {"read": 1, "parse": 1, "validate": 1}, counts


def test_parsed_models_are_remembered_within_a_byte_bound_the_newest_always(float_tflite, monkeypatch):
    """A parsed model holds views of its file's bytes: remembering four of a 437 MB model kept 1.7 GB alive in a
    worker after it moved on (issue 44). Past KEEP_BYTES the oldest go; the newest is kept whatever its size."""
    from optimize.models import tflite

    content = float_tflite.read_bytes()
    copies = [content + bytes(i + 1) for i in range(3)]  # three contents (trailing bytes: the same model)
    monkeypatch.setattr(tflite, "KEEP_BYTES", 2 * len(content) + 10)
    tflite._PARSED.clear()
    for c in copies:
        tflite.read_model(c)
    kept = list(tflite._PARSED)
    assert len(kept) == 2 and kept[-1][1] == len(copies[-1])  # the two newest fit; the first went
    monkeypatch.setattr(tflite, "KEEP_BYTES", 1)
    tflite.read_model(copies[0])
    assert [k[1] for k in tflite._PARSED] == [len(copies[0])]  # over the bound alone: kept, being the newest

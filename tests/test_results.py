"""Study records: JSON round trip, atomic writes, one clear error for foreign or broken files."""

from __future__ import annotations

import json

import pytest

from optimize.core.errors import StudyError
from optimize.core.results import Candidate, Environment, Metrics, Size, Step, Study, load_study, write_atomic


def make_study() -> Study:
    env = Environment(
        python="3.11", platform="linux", host="h", cpu_count=2, versions={"tensorflow": "2.21"}, threads=2
    )
    good = Candidate(
        name="float32",
        steps=[Step(technique="convert", params={"scheme": "float32"})],
        recipe_hash="h",
        scheme="float32",
        artifact="float32.tflite",
        metrics=Metrics(size=Size(bytes=100, gzip_bytes=90)),
    )
    bad = Candidate(name="int16x8", steps=[], recipe_hash="g", scheme="int16x8", error="conversion failed: HARD_SWISH")
    return Study(
        created="2026-01-01T00:00:00+00:00",
        model="demo",
        model_fingerprint="f",
        environment=env,
        candidates=[good, bad],
    )


def test_round_trip(tmp_path):
    s = make_study()
    p = s.save(tmp_path / "study.json")
    again = load_study(p)
    assert again == s
    assert again.candidate("float32").ok and not again.candidate("int16x8").ok
    assert load_study(tmp_path) == s  # a folder means its study.json


@pytest.mark.parametrize(
    "content, match",
    [
        ("not json", "is not a JSON study"),
        ('{"schema_version": 99}', "schema_version 99"),
        ("[1, 2]", "schema_version None"),
    ],
)
def test_foreign_files(tmp_path, content, match):
    p = tmp_path / "study.json"
    p.write_text(content)
    with pytest.raises(StudyError, match=match):
        load_study(p)


def test_hand_edited_nonsense(tmp_path):
    raw = json.loads(make_study().to_json())
    raw["candidates"][0]["metrics"]["size"]["bytes"] = "big"
    p = tmp_path / "study.json"
    p.write_text(json.dumps(raw))
    with pytest.raises(StudyError, match="candidate 1.metrics.size.bytes"):
        load_study(p)
    raw["candidates"][0]["metrics"]["size"] = {"bytes": 1, "gzip_bytes": 1, "colour": 2}
    p.write_text(json.dumps(raw))
    with pytest.raises(StudyError, match="colour"):
        load_study(p)


def test_missing_study(tmp_path):
    with pytest.raises(StudyError, match="Run `optimize sweep` first"):
        load_study(tmp_path / "nope.json")


def test_write_atomic_leaves_nothing_on_failure(tmp_path, monkeypatch):
    import os

    target = tmp_path / "out.bin"
    write_atomic(target, b"old")

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        write_atomic(target, b"new")
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.bin"]


def _edited(tmp_path, edit) -> object:
    raw = json.loads(make_study().to_json())
    edit(raw)
    p = tmp_path / "study.json"
    p.write_text(json.dumps(raw))
    return p


def _metric(path: str, value):
    def edit(raw):
        node = raw["candidates"][0]["metrics"]
        *head, leaf = path.split(".")
        for k in head:
            node = node.setdefault(k, {})
        node[leaf] = value

    return edit


@pytest.mark.parametrize(
    "edit, match",
    [
        (_metric("size.bytes", -5), "size.bytes is -5 bytes"),
        (_metric("size.gzip_bytes", 1e18), "gzip_bytes is 1e\\+18 bytes"),
        (_metric("accuracy", {"samples": 10, "top1": 57.0}), "top1 is 57, outside 0..1"),
        (_metric("accuracy_delta", float("nan")), "accuracy_delta is nan"),
        (_metric("accuracy_delta", -3.0), "accuracy_delta is -3"),
        (lambda raw: raw.update(baseline="float64"), "baseline 'float64' is not among its candidates"),
        (lambda raw: raw.update(calibration_outside={"x": 7}), "calibration_outside.x is 7"),
        (lambda raw: raw["candidates"][0].update(seconds=float("inf")), "seconds is inf"),
    ],
    ids=["negative-size", "huge-size", "top1-57", "nan", "delta", "no-baseline", "coverage", "inf"],
)
def test_impossible_measurements_refused_on_load(tmp_path, edit, match):
    with pytest.raises(StudyError, match=f"not a real measurement: .*{match}"):
        load_study(_edited(tmp_path, edit))


@pytest.mark.parametrize(
    "content, match",
    [
        ("[" * 200_000 + "]" * 200_000, "nested too deeply"),
        ('{"schema_version": ' + "9" * 5000 + "}", "thousands of digits"),
        (b"\xff\xfe junk", "UnicodeDecodeError"),
    ],
    ids=["deep", "digits", "bytes"],
)
def test_hostile_json(tmp_path, content, match):
    p = tmp_path / "study.json"
    p.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(StudyError, match=match):
        load_study(p)


def test_report_on_an_impossible_study_is_one_line(tmp_path, cli):
    from tests_support import one_line_error

    p = _edited(tmp_path, _metric("size.bytes", -1))
    one_line_error(cli("report", str(p)), "not a real measurement", "size.bytes is -1")
    one_line_error(cli("recommend", str(p)), "not a real measurement")

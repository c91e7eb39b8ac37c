"""The result cache's store: atomic, conditional publishing under concurrent writers; zoo manifests refused
in one line. (The same store on a real S3 API is tested in test_zoo_distributed.py.)"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from tests_support import one_line_error

from optimize.core.paths import local_path
from optimize.engine.storage import LocalStore, open_store


def concurrent_creates(store, key: str, n: int = 16) -> list[bool]:
    """n writers publishing different bytes under one key at once; what each was told."""
    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(lambda i: store.create(key, f"writer {i} ".encode() * 1000), range(n)))


def test_concurrent_writers_leave_one_complete_object(tmp_path):
    store = open_store(tmp_path / "c")
    assert isinstance(store, LocalStore)
    won = concurrent_creates(store, "v4/entries/ab/abc.json")
    assert won.count(True) == 1
    data = store.read("v4/entries/ab/abc.json", 1 << 20)
    writer = won.index(True)
    assert data == f"writer {writer} ".encode() * 1000  # the winner's bytes, whole
    assert not list((tmp_path / "c" / "tmp").iterdir())  # no temporary left behind
    with pytest.raises(ValueError, match="larger than any entry"):
        store.read("v4/entries/ab/abc.json", 100)  # reads are bounded
    assert store.read("v4/entries/ab/missing.json", 100) is None


def test_cache_locations_are_folders_or_urls(tmp_path):
    assert local_path(f"file://{tmp_path}") == tmp_path
    assert local_path(str(tmp_path)) == tmp_path
    assert local_path("s3://bucket/prefix") is None


@pytest.mark.parametrize(
    "manifest, expected",
    [
        ("[[models]]\npath = 'nowhere.keras'\n", "models[0]: no model at nowhere.keras"),
        ("[[models]]\npaht = 'm.keras'\n", "zoo.toml: model 1.path: missing"),
        ("models = []\n", "zoo.toml: models"),
        ("[[models]\n", "zoo.toml: not valid TOML"),
        ("[[models]]\npath = 'm.keras'\ntarget = 'toaster'\n", "target"),
    ],
)
def test_bad_zoo_manifests_are_one_line_and_exit_2(tmp_path, cli, manifest, expected):
    (tmp_path / "m.keras").write_bytes(b"not a model")
    (tmp_path / "zoo.toml").write_text(manifest)
    out = cli("zoo", str(tmp_path / "zoo.toml"), "-o", str(tmp_path / "out"))
    assert out.returncode == 2, out.stderr
    assert out.stderr.startswith("error:")
    one_line_error(out, expected)
    assert not (tmp_path / "out").exists()


def test_a_bad_model_in_a_zoo_names_it_and_writes_nothing(tmp_path, cli):
    (tmp_path / "m.keras").write_bytes(b"not a model")
    (tmp_path / "zoo.toml").write_text("[[models]]\npath = 'm.keras'\nname = 'broken'\n")
    out = cli("zoo", str(tmp_path / "zoo.toml"), "-o", str(tmp_path / "out"))
    assert out.returncode == 2
    assert "models[0] (broken)" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "out" / "broken").exists()


def test_mlflow_alone_means_a_local_store_and_a_uri_is_kept():
    from optimize.cli import optional_values
    from optimize.present.tracking import resolve

    assert optional_values(["zoo", "z.toml", "--mlflow"]) == ["zoo", "z.toml", "--mlflow", "./mlruns"]
    assert optional_values(["zoo", "--mlflow", "--executor", "ray"])[:3] == ["zoo", "--mlflow", "./mlruns"]
    assert optional_values(["zoo", "--mlflow", "http://127.0.0.1:5000"]) == ["zoo", "--mlflow", "http://127.0.0.1:5000"]
    assert resolve("http://127.0.0.1:5000") == ("http://127.0.0.1:5000", None)

"""A three-model zoo on a real Ray cluster, its result cache on a real S3 API (moto's server), every candidate
logged to an MLflow store; and the Ray executor's crash isolation. Every server listens on 127.0.0.1 only."""

from __future__ import annotations

import dataclasses
import json
import shutil

import numpy as np
import pytest
from crash_fixtures import CrashingData
from servers import listeners, moto_s3, ray_cluster

pytest.importorskip("ray")
pytest.importorskip("mlflow")
pytest.importorskip("s3fs")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def s3():
    with moto_s3() as bucket:
        yield bucket


@pytest.fixture(scope="module")
def cluster():
    with ray_cluster(num_cpus=2) as c:
        yield c


@pytest.fixture(scope="module")
def regressor(tmp_path_factory):
    """A tiny tf_keras regression MLP and its data (the zoo's third model: another task, another shape)."""
    from optimize.models import _tf

    keras = _tf.keras()
    keras.utils.set_random_seed(1)
    rng = np.random.default_rng(1)
    x = rng.normal(size=(300, 6)).astype(np.float32)
    y = (x @ rng.normal(size=(6, 1))).astype(np.float32)
    model = keras.Sequential(
        [keras.layers.Input((6,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)]
    )
    model.compile("adam", "mse")
    model.fit(x, y, epochs=20, verbose=0)
    folder = tmp_path_factory.mktemp("regressor")
    model.save(folder / "reg.keras")
    np.savez(folder / "reg.npz", x=x, y=y)
    return folder / "reg.keras", folder / "reg.npz"


@pytest.fixture(scope="module")
def manifest(tmp_path_factory, keras_model, data_npz, float_tflite, regressor):
    folder = tmp_path_factory.mktemp("zoo")
    for p in (keras_model, data_npz, float_tflite, *regressor):
        shutil.copy(p, folder / p.name)
    (folder / "zoo.toml").write_text(
        f"""
[[models]]
path = "{keras_model.name}"
data = "{data_npz.name}"
target = "gpu"
recipes = ["float16", "dynamic"]

[[models]]
path = "{float_tflite.name}"
name = "digits-tflite"
data = "{data_npz.name}"
recipes = ["float16"]

[[models]]
path = "{regressor[0].name}"
data = "{regressor[1].name}"
recipes = ["float16"]
"""
    )
    return folder / "zoo.toml"


def _ray_pids(cluster) -> set[int]:
    return {p.process.pid for infos in cluster.head_node.all_processes.values() for p in infos}


def test_zoo_on_ray_shares_its_cache_through_s3_and_logs_every_candidate_to_mlflow(
    manifest, s3, cluster, tmp_path, monkeypatch
):
    from mlflow.tracking import MlflowClient

    from optimize.core.results import load_study
    from optimize.engine.zoo import run_zoo
    from optimize.present import tracking

    cache = f"{s3}/zoo-cache"
    mlruns = tmp_path / "mlruns"
    monkeypatch.setenv("OPTIMIZE_CACHE", str(tmp_path / "local-a"))
    cold = run_zoo(
        manifest, tmp_path / "a", executor="ray", ray_address=cluster.address, cache=cache, runs=5, mlflow=str(mlruns)
    )
    assert [e.name for e in cold.models] == ["cnn", "digits-tflite", "reg"]
    assert cold.executor == "ray"
    for e in cold.models:
        study = load_study(tmp_path / "a" / e.study)
        assert study.executor == "ray"
        assert all(c.ok and not c.cached for c in study.candidates), e.failed
        assert all(c.node and ":" in c.node for c in study.candidates)  # timed on a Ray node, which is named
        assert len({c.node for c in study.candidates}) == 1  # one model's latencies from one node
        assert (tmp_path / "a" / e.name / "report.md").is_file()
        assert e.picks and e.picks[0].candidate is not None
    assert (tmp_path / "a" / "zoo.json").is_file()
    # every server this test started listens on 127.0.0.1 only
    bound = listeners(_ray_pids(cluster))
    assert bound and all("127.0.0.1" in a for a in bound), bound

    # MLflow: one parent run per model, one child run per kept candidate, with its figures and artifact
    client = MlflowClient(tracking_uri=tracking.resolve(str(mlruns))[0])
    exp = client.get_experiment_by_name("optimize").experiment_id
    runs = client.search_runs([exp], max_results=1000)
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert sorted(r.info.run_name for r in parents) == ["cnn", "digits-tflite", "reg"]
    for parent in parents:
        study = load_study(tmp_path / "a" / parent.info.run_name / "study.json")
        children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
        assert sorted(r.info.run_name for r in children) == sorted(c.name for c in study.candidates)
        for r in children:
            cand = study.candidate(r.info.run_name)
            assert r.data.metrics["size_bytes"] == cand.metrics.size.bytes
            assert r.data.metrics["p50_ms"] == pytest.approx(cand.p50_ms)
            if cand.steps:  # a .tflite's float32 baseline is the file as given: no step
                assert r.data.params["step0.technique"] in ("convert", "quantize", "fit")  # fit-*: fit first
            assert r.data.params["executor"] == "ray" and r.data.params["node"] == cand.node
            assert [a.path for a in client.list_artifacts(r.info.run_id)] == [cand.artifact]
    cnn_int = [r for r in runs if r.info.run_name == "dynamic" and "delegate.gpu" in r.data.tags]
    assert cnn_int  # delegate verdicts as tags

    # a second run from a fresh output folder and a fresh local cache, sharing only S3, reuses everything
    monkeypatch.setenv("OPTIMIZE_CACHE", str(tmp_path / "local-b"))
    warm = run_zoo(manifest, tmp_path / "b", executor="ray", ray_address=cluster.address, cache=cache, runs=5)
    for e in warm.models:
        study = load_study(tmp_path / "b" / e.study)
        assert study.executor == "ray"
        assert all(c.cached for c in study.candidates)
        for c in study.candidates:
            assert (tmp_path / "b" / e.name / c.artifact).read_bytes() == (
                tmp_path / "a" / e.name / c.artifact
            ).read_bytes()
    assert json.loads((tmp_path / "b" / "zoo.json").read_text())["cache"].startswith("s3://")
    assert not (tmp_path / "local-b" / "results").exists()  # nothing came from (or went to) a local cache


def test_a_crash_on_ray_fails_only_its_candidate_and_is_cached_as_the_techniques(
    keras_model, data_npz, cluster, s3, tmp_path, capfd
):
    from optimize.core.recipe import build
    from optimize.engine import sweeps
    from optimize.models.data import load_data

    ds = load_data(data_npz)
    crashing = CrashingData(**{f.name: getattr(ds, f.name) for f in dataclasses.fields(ds)})
    recipes = [
        build("float32", [{"technique": "convert"}]),
        build("int8", [{"technique": "convert", "scheme": "int8"}]),
        build("float16", [{"technique": "convert", "scheme": "float16"}]),
    ]
    kw = {"recipes": recipes, "delegates": False, "runs": 5, "executor": "ray", "ray_address": cluster.address}
    study = sweeps.sweep(keras_model, crashing, tmp_path / "o", cache=f"{s3}/crash", **kw)
    c = {x.name: x for x in study.candidates}
    assert c["int8"].error == "worker process killed by SIGSEGV while producing or measuring this candidate"
    assert c["float32"].ok and c["float16"].ok and c["float16"].metrics.fidelity is not None
    assert not (tmp_path / "o" / "int8.tflite").exists()
    assert "worker died" not in capfd.readouterr().out  # Ray's notice goes to the log, never stdout (issue 26)
    again = sweeps.sweep(keras_model, crashing, tmp_path / "p", cache=f"{s3}/crash", **kw)
    assert all(x.cached for x in again.candidates)  # the segfault is the technique's: it would happen again


def test_concurrent_writers_on_s3_leave_one_complete_object(s3):
    from test_storage import concurrent_creates

    from optimize.engine.storage import FsspecStore, open_store

    store = open_store(f"{s3}/race")
    assert isinstance(store, FsspecStore) and store.conditional
    won = concurrent_creates(store, "v4/entries/ab/abc.json", n=8)
    assert won.count(True) == 1  # S3's conditional put: one writer wins, the others are told
    assert store.read("v4/entries/ab/abc.json", 1 << 20) == f"writer {won.index(True)} ".encode() * 1000

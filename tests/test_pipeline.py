"""The pipeline: recipes become measured candidates; chains share work; failures stay candidates."""

from __future__ import annotations

import numpy as np
import pytest

from optimize.core import registry
from optimize.core.errors import DataError, ModelError, OptimizeError
from optimize.core.recipe import build
from optimize.core.results import load_study
from optimize.engine import single, sweeps


def test_int8_run_is_measured_against_float(keras_model, data_npz, tmp_path):
    c = single.run(
        build("int8", [{"technique": "convert", "scheme": "int8"}]),
        keras_model,
        data_npz,
        tmp_path,
        delegates=False,
        jobs=0,
    )
    assert c.ok, c.error
    m = c.metrics
    assert (tmp_path / "int8.tflite").is_file() and not (tmp_path / ".work").exists()
    assert m.accuracy.top1 > 0.8 and m.accuracy.samples == 120
    assert abs(m.accuracy_delta) < 0.05
    assert m.fidelity.top1_agreement > 0.9 and m.fidelity.reference == "float32.tflite"
    assert m.latency.threads == 2 and m.latency.runs == 50 and m.latency.p50_ms > 0
    assert m.memory.peak_rss_bytes > 0
    assert m.size.gzip_bytes < m.size.bytes


def test_integer_io_model_is_fed_quantized_inputs(keras_model, data_npz, tmp_path):
    c = single.run(
        build("int8io", [{"technique": "convert", "scheme": "int8", "io": "uint8"}]),
        keras_model,
        data_npz,
        tmp_path,
        delegates=False,
        jobs=0,
    )
    assert c.ok, c.error
    assert c.metrics.fidelity.top1_agreement > 0.9


def test_prune_cluster_int8_chain_shrinks_gzip(keras_model, data_npz, tmp_path):
    recipe = build(
        "pci",
        [
            {"technique": "prune", "target_sparsity": 0.5},
            {"technique": "cluster", "clusters": 8, "preserve_sparsity": True},
            {"technique": "convert", "scheme": "int8"},
        ],
    )
    c = single.run(recipe, keras_model, data_npz, tmp_path, delegates=False, jobs=0)
    plain = single.run(
        build("i8", [{"technique": "convert", "scheme": "int8"}]),
        keras_model,
        data_npz,
        tmp_path,
        delegates=False,
        jobs=0,
    )
    assert c.ok, c.error
    assert c.metrics.size.gzip_bytes < 0.8 * plain.metrics.size.gzip_bytes


def test_keras_only_recipe_gets_an_implicit_float32_conversion(keras_model, data_npz, tmp_path):
    c = single.run(
        build("p", [{"technique": "prune", "epochs": 1}]), keras_model, data_npz, tmp_path, delegates=False, jobs=0
    )
    assert c.ok and c.scheme == "float32"
    assert [s.technique for s in c.steps] == ["prune", "convert"]


def test_failed_technique_is_a_failed_candidate(keras_model, data_npz, tmp_path, monkeypatch):
    tech = registry.get("cluster")
    from optimize.core.errors import TechniqueFailed

    def broken(model, params, ctx):
        raise TechniqueFailed("cluster: nothing to cluster here")

    monkeypatch.setitem(
        registry._REGISTRY, "cluster", tech.__class__(tech.name, tech.stage, tech.params, broken, tech.summary)
    )
    recipes = [
        build("float32", [{"technique": "convert"}]),
        build("cluster-int8", [{"technique": "cluster"}, {"technique": "convert", "scheme": "int8"}]),
        build("float16", [{"technique": "convert", "scheme": "float16"}]),
    ]
    study = sweeps.sweep(keras_model, data_npz, tmp_path, recipes=recipes, delegates=False, runs=5, jobs=0, cache=False)
    names = {c.name: c for c in study.candidates}
    assert names["float32"].metrics.accuracy_delta == 0.0
    assert names["cluster-int8"].error == "cluster: nothing to cluster here"
    assert names["float16"].ok and names["float32"].ok
    assert load_study(tmp_path / "study.json") == study
    # a sweep that fine-tunes measures the training control beside it (issue 43)
    assert names["float32-finetuned"].ok and names["float32-finetuned"].control
    assert sorted(p.name for p in tmp_path.glob("*.tflite")) == [
        "float16.tflite", "float32-finetuned.tflite", "float32.tflite"
    ]  # fmt: skip


def test_data_that_does_not_fit_is_refused_before_work(keras_model, tmp_path):
    bad = tmp_path / "bad.npz"
    np.savez(bad, x=np.zeros((10, 28, 28, 1), np.float32), y=np.zeros(10, np.int64))
    with pytest.raises(DataError, match=r"\[28, 28, 1\].*\[8, 8, 1\]"):
        single.run(
            build("int8", [{"technique": "convert", "scheme": "int8"}]), keras_model, bad, tmp_path / "o", jobs=0
        )
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").glob("*.tflite"))


def test_int8_without_calibration_data(keras_model, tmp_path):
    with pytest.raises(DataError, match="int8 needs calibration data"):
        single.run(build("int8", [{"technique": "convert", "scheme": "int8"}]), keras_model, None, tmp_path, jobs=0)


def test_keras_steps_on_a_tflite_are_refused(float_tflite, tmp_path):
    with pytest.raises(ModelError, match="already a .tflite"):
        single.run(build("p", [{"technique": "prune"}]), float_tflite, None, tmp_path, jobs=0)


def test_litert_backend_rewrites_ptq_steps():
    r = build("int8", [{"technique": "convert", "scheme": "int8"}]).with_backend("litert")
    assert [(s.technique, s.params.scheme) for s in r.steps] == [("convert", "float32"), ("quantize", "int8")]
    assert r.made_by == "litert"
    back = r.with_backend("converter")
    assert [(s.technique, s.params.scheme) for s in back.steps] == [("convert", "int8")]
    io = build("x", [{"technique": "convert", "scheme": "int8", "io": "int8"}]).with_backend("litert")
    assert io.steps[-1].params.io == "int8" and io.made_by == "litert"
    auto = [
        build(s, [{"technique": "convert", "scheme": s}]).with_backend("auto").made_by
        for s in ("float16", "dynamic", "int8", "int16x8")
    ]
    assert auto == ["litert", "litert", "litert", "litert"]
    qat = build("q", [{"technique": "qat"}, {"technique": "convert", "scheme": "int8"}]).with_backend("auto")
    assert qat.made_by == "converter"  # fake-quant ranges are read by the converter only


def test_cli_and_api_use_the_same_backend_default():
    """One default: a recipe written with a converter step runs the same whether the CLI or run() takes it."""
    from optimize.core.vocab import DEFAULT_BACKEND

    r = build("int8", [{"technique": "convert", "scheme": "int8"}])
    assert r.backend == "auto" and r.with_backend().made_by == DEFAULT_BACKEND["int8"]
    assert r.with_backend("converter").made_by == "converter"


@pytest.mark.slow
def test_demo_sweep_meets_the_size_and_accuracy_targets(tmp_path):
    study = sweeps.sweep(None, None, tmp_path, delegates=False, runs=10, jobs=0)
    c = {x.name: x for x in study.candidates}
    assert all(x.ok for x in study.candidates), [(x.name, x.error) for x in study.candidates if x.error]
    base = c["float32"].metrics.size
    assert c["int8"].metrics.size.bytes <= 0.30 * base.bytes
    assert c["float16"].metrics.size.bytes <= 0.55 * base.bytes
    assert c["prune-cluster-int8"].metrics.size.gzip_bytes <= 0.15 * base.gzip_bytes
    for name in ("float16", "dynamic", "int8", "int8-int8io", "int16x8"):
        assert c[name].metrics.accuracy_delta >= -0.01, name


@pytest.mark.slow
def test_real_architecture_skips_layers_tfmot_cannot_wrap(tmp_path):
    """MobileNetV3Small has Rescaling and TFOpLambda layers: pruning wraps the rest and lists them."""
    from optimize.models import _tf
    from optimize.models.data import from_arrays

    keras = _tf.keras()
    keras.utils.set_random_seed(0)
    path = tmp_path / "mnv3.keras"
    keras.applications.MobileNetV3Small(weights=None, input_shape=(96, 96, 3), classes=4).save(path)
    rng = np.random.default_rng(0)
    ds = from_arrays(x=rng.uniform(0, 255, (40, 96, 96, 3)).astype(np.float32), y=rng.integers(0, 4, 40))
    c = single.run(
        build("prune", [{"technique": "prune", "epochs": 1}, {"technique": "convert", "scheme": "dynamic"}]),
        path,
        ds,
        tmp_path / "out",
        delegates=False,
        jobs=0,
    )
    assert c.ok, c.error
    assert any(s.endswith("(Rescaling)") for s in c.skipped_layers)  # names get _N suffixes in a session
    assert any("TFOpLambda" in s for s in c.skipped_layers)
    assert any("left as they were" in n for n in c.notes)


def test_a_study_of_another_model_in_the_output_folder_is_replaced_whole(float_tflite, tmp_path, caplog):
    """-o held another model's study: its .tflite files went on beside the new study.json. Refused unless told to
    replace it (--replace); then said before the run, removed when the new study is published; files the old
    study does not list stay."""
    import logging

    from study_fixtures import full_study

    old = full_study()
    old = old.model_copy(
        update={"candidates": [c.model_copy(update={"artifact": f"{c.name}.tflite"}) for c in old.candidates]}
    )
    old.save(tmp_path / "study.json")
    for c in old.candidates:
        (tmp_path / f"{c.name}.tflite").write_bytes(b"old")
    (tmp_path / "mine.txt").write_text("not optimize's")
    f16 = build("float16", [{"technique": "convert", "scheme": "float16"}])
    with pytest.raises(OptimizeError, match="holds the study of another model"):  # unless told to replace it
        sweeps.sweep(float_tflite, None, tmp_path, recipes=[f16], delegates=False, runs=3, jobs=0, cache=False)
    assert (tmp_path / "float32.tflite").read_bytes() == b"old"
    with caplog.at_level(logging.WARNING, logger="optimize"):
        study = sweeps.sweep(
            float_tflite, None, tmp_path, recipes=[f16], delegates=False, runs=3, jobs=0, cache=False, replace=True
        )
    said = [r.getMessage() for r in caplog.records if "holds the study of another model" in r.getMessage()]
    assert said and "(demo)" in said[0], caplog.text
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted(["study.json", "mine.txt", *(f"{c.name}.tflite" for c in study.candidates)]), left
    assert (tmp_path / "float32.tflite").read_bytes() != b"old"

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


@pytest.fixture(autouse=True)
def _optimize_logger_restored():
    """A CLI run in this process (typer's CliRunner) points the `optimize` logger at its own stderr, which it
    closes after: the logger is put back as it was, so a later test's log lines never meet a closed stream."""
    import logging

    log = logging.getLogger("optimize")
    kept = (list(log.handlers), log.propagate, log.level)
    yield
    log.handlers[:], log.propagate = kept[0], kept[1]
    log.setLevel(kept[2])


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


#: The quick tier, `python -m pytest -m smoke`: every package's core path, in a few minutes on two cores (issue
#: 43). Per test file, "*" (the whole file) or the tests taken from it; tests/test_structure.py checks that each
#: name still exists, so a renamed test cannot drop out unseen. The rest of the suite goes deeper; this tier says
#: whether recipes, records, opening and validating models, conversion, quantization, measuring, the delegate
#: rules, the recommender, the report, the shipped file's metadata and the command line work at all.
SMOKE: dict[str, str | tuple[str, ...]] = {
    # core: recipes, the registry, the typed records
    "test_recipe.py": "*",
    "test_results.py": "*",
    # models: data, recognising and validating a model file
    "test_data.py": "*",
    "test_models.py": ("test_kinds", "test_bad_files", "test_missing_and_plain_directory"),
    # convert + transforms: Keras to float .tflite, LiteRT Quantizer's schemes
    "test_litert_quantize.py": (
        "test_each_scheme_is_smaller_and_runs",
        "test_float_io_by_default_and_integer_io_on_request",
        "test_bad_params_are_recipe_errors",
        "test_calibrated_scheme_without_data",
    ),
    # engine: a recipe run and measured against float, a failed technique as a failed candidate
    "test_pipeline.py": (
        "test_int8_run_is_measured_against_float",
        "test_failed_technique_is_a_failed_candidate",
        "test_data_that_does_not_fit_is_refused_before_work",
        "test_litert_backend_rewrites_ptq_steps",
    ),
    # measure: accuracy, fidelity, tasks
    "test_measure.py": (
        "test_two_inputs_two_outputs_are_fed_and_scored_by_name",
        "test_one_sample_serves_every_split",
        "test_task_detection",
        "test_binary_scores_accuracy_at_half_and_auc",
    ),
    # delegates: each delegate's rules on float, int8, int16x8 and dynamic models
    "test_delegates.py": (
        "test_float32_convnet",
        "test_int8_convnet",
        "test_int16x8_stays_on_cpu",
        "test_dynamic_range",
        "test_bad_models",
    ),
    # decide: the guard, the choice, the advice
    "test_recommend.py": "*",
    "test_advice_guard.py": "*",
    # present: tables, report, plots
    "test_report_text.py": "*",
    "test_report.py": "*",
    "test_plots.py": "*",
    # the shipped file: I/O contract and TFLite metadata read back with the schema's reader
    "test_ship.py": (
        "test_metadata_replaces_the_entry_a_quantized_copy_inherits",
        "test_normalisation_maps_pixels_onto_the_range",
        "test_labels_in_the_data_must_be_one_line_names",
        "test_files_packed_after_a_model_are_read_bounded",
    ),
    # the command line: help, bad input as one line, a quantize then evaluate
    "test_cli.py": (
        "test_help_lists_every_command_with_an_example",
        "test_missing_model_and_plain_directory",
        "test_int8_without_calibration",
        "test_quantize_float16_then_evaluate_json",
    ),
    # PyTorch/ONNX absent: one line, no traceback; the layers and docs promises
    "test_torch_absent.py": "*",
    "test_docs.py": "*",
    "test_structure.py": (
        "test_packages_import_only_from_the_layers_below",
        "test_module_level_imports_have_no_cycle",
        "test_the_smoke_tier_names_tests_that_exist",
    ),
}


def pytest_collection_modifyitems(config, items):
    """Mark the quick tier's tests `smoke` (the SMOKE list above)."""
    for item in items:
        chosen = SMOKE.get(item.path.name)
        if chosen == "*" or (chosen and getattr(item, "originalname", item.name) in chosen):
            item.add_marker(pytest.mark.smoke)

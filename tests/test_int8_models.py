"""Every input kind gets every scheme: control flow (tf.cond), a Keras 3 model taking 0..255 pixels through
Rescaling(1/255), an LSTM with recurrent dropout, and a .tflite without a signature through `debug` and
through the sweep's integer-only int8. Seeded small models built here; no downloads.
"""

from __future__ import annotations

import numpy as np
import pytest

from optimize.core.recipe import build
from optimize.engine import sweeps
from optimize.models import _tf, runtime
from optimize.models.tflite import read_model


def _recipes(*specs):
    return [build(name, [{"technique": "quantize", **params}]) for name, params in specs]


@pytest.fixture(scope="module")
def cond(tmp_path_factory):
    """y = tf.cond(mean(x) > 0, dense stack A, dense stack B): an IF op whose branches hold weights of
    4,096 elements each."""
    tf = _tf.tf()
    rng = np.random.default_rng(0)
    wa, wb = (tf.constant(rng.normal(size=(64, 64)).astype(np.float32) / 8) for _ in range(2))
    w0 = tf.constant(rng.normal(size=(32, 64)).astype(np.float32) / 6)

    class M(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([1, 32], tf.float32, name="x")])
        def serve(self, x):
            h = tf.nn.relu(tf.matmul(x, w0))
            y = tf.cond(tf.reduce_mean(x) > 0.0, lambda: tf.tanh(tf.matmul(h, wa)), lambda: tf.tanh(tf.matmul(h, wb)))
            return {"y": y}

    m = M()
    content = tf.lite.TFLiteConverter.from_concrete_functions([m.serve.get_concrete_function()], m).convert()
    folder = tmp_path_factory.mktemp("cond")
    (folder / "cond.tflite").write_bytes(content)
    np.savez(folder / "d.npz", x=np.random.default_rng(1).normal(size=(80, 32)).astype(np.float32))
    return folder


def test_a_tf_cond_model_gets_float16_dynamic_and_int8_around_the_if(cond, tmp_path):
    assert "IF" in {op.name for sg in read_model((cond / "cond.tflite").read_bytes()).subgraphs for op in sg.ops}
    recipes = _recipes(
        ("float16", {"scheme": "float16"}), ("dynamic", {"scheme": "dynamic"}), ("int8", {"scheme": "int8"})
    )
    study = sweeps.sweep(
        cond / "cond.tflite", cond / "d.npz", tmp_path, recipes=recipes, delegates=False, runs=3, jobs=0
    )
    f16, dyn, int8 = (study.candidate(n) for n in ("float16", "dynamic", "int8"))
    for c in (f16, dyn, int8):
        assert c.ok and c.probe.ok, (c.name, c.error)
    assert f16.composition.shrink <= 0.55 and dyn.composition.shrink <= 0.30  # branch weights included
    assert any("does not reach" in n and "IF" in n for n in f16.notes), f16.notes
    assert int8.composition.shrink <= 0.30
    assert any("kept float with the subgraphs it runs" in n for n in int8.notes), int8.notes
    (flow,) = [i for i in int8.islands if i.op == "IF"]
    assert "control flow" in flow.reason and flow.precision == "float"
    main = read_model((tmp_path / int8.artifact).read_bytes()).main
    fc = [op for op in main.ops if op.name == "FULLY_CONNECTED"]
    assert fc and all(main.tensors[op.outputs[0]].dtype == "int8" for op in fc)  # around the IF: integer
    assert int8.metrics.fidelity.relative_error < 0.05


@pytest.mark.slow
def test_int8_quantizes_around_the_while_loop_of_a_gru(tmp_path):
    keras = _tf.keras()
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((12, 4)), keras.layers.GRU(32), keras.layers.Dense(3)])
    model.save(tmp_path / "gru.keras")
    np.savez(tmp_path / "d.npz", x=np.random.default_rng(0).normal(size=(60, 12, 4)).astype(np.float32))
    recipes = [build("int8", [{"technique": "convert", "scheme": "int8"}])]
    study = sweeps.sweep(
        tmp_path / "gru.keras", tmp_path / "d.npz", tmp_path / "out", recipes=recipes, delegates=False, runs=3, jobs=0
    )
    int8 = study.candidate("int8")
    assert int8.ok and int8.probe.ok, int8.error
    (loop,) = [i for i in int8.islands if i.op == "WHILE"]
    assert "control flow" in loop.reason
    ops = {
        op.name: read_model((tmp_path / "out" / int8.artifact).read_bytes()).main.tensors[op.outputs[0]].dtype
        for op in read_model((tmp_path / "out" / int8.artifact).read_bytes()).main.ops
        if op.name == "FULLY_CONNECTED"
    }
    assert ops == {"FULLY_CONNECTED": "int8"}  # the Dense head after the loop is integer
    assert int8.metrics.fidelity.relative_error < 0.05


@pytest.mark.slow
def test_a_rescaling_model_fed_0_to_255_gets_every_int8_variant(tmp_path):
    """Keras 3, Rescaling(1/255) first: data 0..255 is the float model's own range; int8 I/O takes it through
    the input's scale and zero point. No data check assumes -128..127, and no candidate ends the sweep."""
    keras = _tf.keras3()
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((16, 16, 3)),
            keras.layers.Rescaling(1 / 255),
            keras.layers.Conv2D(8, 3, activation="relu"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(3),
        ]
    )
    model.save(tmp_path / "pixels.keras")
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "d.npz", x=rng.integers(0, 256, (60, 16, 16, 3)).astype(np.float32), y=rng.integers(0, 3, 60))
    recipes = [
        build("int8", [{"technique": "convert", "scheme": "int8"}]),
        build("int8-int8io", [{"technique": "convert", "scheme": "int8", "io": "int8"}]),
    ]
    study = sweeps.sweep(
        tmp_path / "pixels.keras",
        tmp_path / "d.npz",
        tmp_path / "out",
        recipes=recipes,
        delegates=False,
        runs=3,
        jobs=0,
    )
    int8, io8 = study.candidate("int8"), study.candidate("int8-int8io")
    assert int8.ok and io8.ok, (int8.error, io8.error)
    assert io8.composition.float_compute_ops == []
    assert abs(io8.metrics.fidelity.relative_error - int8.metrics.fidelity.relative_error) < 0.01
    it = runtime.load(tmp_path / "out" / io8.artifact, threads=1).interpreter
    scale, zero = it.get_input_details()[0]["quantization"]
    assert 0.99 < scale < 1.01 and zero == -128  # the input's own 0..255 range: one step per pixel value


@pytest.mark.slow
def test_an_lstm_with_recurrent_dropout_converts_to_its_fused_op_and_quantizes(tmp_path):
    keras = _tf.keras()
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((10,)),
            keras.layers.Embedding(50, 16),
            keras.layers.LSTM(64, dropout=0.2, recurrent_dropout=0.2),
            keras.layers.Dense(4, activation="softmax"),
        ]
    )
    model.save(tmp_path / "lstm.h5")
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "d.npz", x=rng.integers(0, 50, (60, 10)).astype(np.float32))
    recipes = [
        build("dynamic", [{"technique": "convert", "scheme": "dynamic"}]),
        build("int8", [{"technique": "convert", "scheme": "int8"}]),
    ]
    study = sweeps.sweep(
        tmp_path / "lstm.h5", tmp_path / "d.npz", tmp_path / "out", recipes=recipes, delegates=False, runs=3, jobs=0
    )
    base, dyn, int8 = (study.candidate(n) for n in ("float32", "dynamic", "int8"))
    for c in (base, dyn, int8):
        assert c.ok, (c.name, c.error)
        ops = {op.name for sg in read_model((tmp_path / "out" / c.artifact).read_bytes()).subgraphs for op in sg.ops}
        assert "UNIDIRECTIONAL_SEQUENCE_LSTM" in ops and "WHILE" not in ops, (c.name, ops)
    assert any("recurrent_dropout" in n and "cleared" in n for n in base.notes), base.notes
    assert int8.probe.ok and int8.composition.shrink <= 0.5 and dyn.composition.shrink <= 0.5
    # its GPU emulation would leave the LSTM's integer state as it is (a float kernel writing into int8 buffers
    # corrupted the interpreter's memory): not emulated, said
    assert "UNIDIRECTIONAL_SEQUENCE_LSTM keeps integer state" in int8.metrics.on_target.gpu.how


@pytest.fixture(scope="module")
def unsigned(tmp_path_factory):
    """A float .tflite with its SignatureDef removed (as MediaPipe and other converters ship them)."""
    from delegate_fixtures import load_t, save_t

    tf = _tf.tf()
    rng = np.random.default_rng(0)
    w1 = tf.constant(rng.normal(size=(3, 3, 3, 8)).astype(np.float32) / 3)
    w2 = tf.constant(rng.normal(size=(8, 4)).astype(np.float32))

    class M(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([1, 8, 8, 3], tf.float32)])
        def serve(self, x):
            h = tf.nn.relu(tf.nn.conv2d(x, w1, 1, "SAME"))
            return tf.matmul(tf.reduce_mean(h, [1, 2]), w2)

    m = M()
    content = tf.lite.TFLiteConverter.from_concrete_functions([m.serve.get_concrete_function()], m).convert()
    model = load_t(content)
    model.signatureDefs = []
    folder = tmp_path_factory.mktemp("unsigned")
    (folder / "bare.tflite").write_bytes(save_t(model))
    assert not read_model((folder / "bare.tflite").read_bytes()).signatures
    np.savez(folder / "d.npz", x=np.random.default_rng(1).random((40, 8, 8, 3)).astype(np.float32))
    return folder


def test_debug_takes_a_tflite_without_a_signature(unsigned, cli):
    r = cli("debug", str(unsigned / "bare.tflite"), "--data", str(unsigned / "d.npz"), "--samples", "4")
    assert r.returncode == 0, r.stderr
    assert "int8: output error" in r.stdout and "CONV_2D" in r.stdout


def test_a_tflite_sweep_plans_integer_only_int8(unsigned, tmp_path):
    from optimize.convert.front import open_inputs
    from optimize.engine.plan import plan

    src, ds = open_inputs(unsigned / "bare.tflite", unsigned / "d.npz")
    names = [r.name for r in plan(src, ds, None, None)]
    assert "int8-int8io" in names and "int8" in names
    recipes = _recipes(("int8-int8io", {"scheme": "int8", "io": "int8"}))
    study = sweeps.sweep(
        unsigned / "bare.tflite", unsigned / "d.npz", tmp_path, recipes=recipes, delegates=False, runs=3, jobs=0
    )
    io8 = study.candidate("int8-int8io")
    assert io8.ok and io8.composition.float_compute_ops == [], io8.error
    it = runtime.load(tmp_path / io8.artifact, threads=1).interpreter
    assert it.get_input_details()[0]["dtype"] == np.int8

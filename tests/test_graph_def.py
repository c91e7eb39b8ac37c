"""TF1 frozen graphs in (issue 42 item 3): a GraphDef `.pb` is recognised by the door, read once and checked,
converted by the TF1 converter (placeholders in, the nodes nothing reads out, or named), measured against
TensorFlow running the graph, and swept like any model converted at the door. Every bad file is one line and
exit 2. The graphs are built here: a TF1-style graph with variables frozen by graph_util, and a tf_keras model
frozen by convert_variables_to_constants_v2.
"""

from __future__ import annotations

import numpy as np
import pytest
from tests_support import one_line_error

from optimize.convert.front import open_inputs
from optimize.convert.graph_def import GraphIO
from optimize.core.errors import ModelError
from optimize.models import _tf

RNG = np.random.default_rng(0)


def _tf1_graph(two_heads: bool = False):
    """A TF1 graph (placeholders, variables, a session) frozen with graph_util: images -> conv -> probs."""
    tf = _tf.tf()
    tf1 = tf.compat.v1
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [None, 8, 8, 3], name="images")
        w = tf1.get_variable("w", [3, 3, 3, 4], initializer=tf1.random_normal_initializer(seed=0))
        pooled = tf.reduce_mean(tf.nn.relu(tf.nn.conv2d(x, w, 1, "SAME")), [1, 2])
        d = tf1.get_variable("d", [4, 5], initializer=tf1.random_normal_initializer(seed=1))
        logits = tf.matmul(pooled, d)
        tf.nn.softmax(logits, name="probs")
        outputs = ["probs"]
        if two_heads:
            tf.identity(pooled * 2.0, name="features")
            outputs.append("features")
        with tf1.Session(graph=g) as s:
            s.run(tf1.global_variables_initializer())
            return tf1.graph_util.convert_variables_to_constants(s, g.as_graph_def(), outputs), g.as_graph_def()


@pytest.fixture(scope="module")
def graphs(tmp_path_factory):
    d = tmp_path_factory.mktemp("tf1")
    frozen, unfrozen = _tf1_graph()
    (d / "small.pb").write_bytes(frozen.SerializeToString())
    (d / "unfrozen.pb").write_bytes(unfrozen.SerializeToString())
    (d / "two.pb").write_bytes(_tf1_graph(two_heads=True)[0].SerializeToString())
    np.savez(d / "img.npz", x=RNG.normal(size=(24, 8, 8, 3)).astype(np.float32))
    return d


def test_a_frozen_graph_converts_with_its_own_error_against_tensorflow(graphs):
    from optimize.convert import fidelity

    src, ds = open_inputs(graphs / "small.pb", graphs / "img.npz", check=True)
    assert src.kind == "graphdef" and src.flat and src.converted and not src.torch
    assert [(i.name, i.shape) for i in src.inputs] == [("images", (1, 8, 8, 3))] and src.outputs == ("probs",)
    c = fidelity.measure(src, ds).conversion
    assert c.source == "graphdef" and "from_frozen_graph" in c.route and c.inputs[0].layout == ""
    assert "TensorFlow" in c.fidelity.reference and c.fidelity.relative_error < 1e-5
    assert c.fidelity.top1_agreement == 1.0
    again, _ = open_inputs(graphs / "small.pb", graphs / "img.npz")
    assert again.conversion.cached and again.content == src.content and again.fingerprint == src.fingerprint


def test_every_unconsumed_output_is_an_output_unless_named(graphs):
    src, _ = open_inputs(graphs / "two.pb", graphs / "img.npz")
    assert sorted(src.outputs) == ["features", "probs"]
    one, _ = open_inputs(graphs / "two.pb", graphs / "img.npz", graph=GraphIO(outputs=("probs",)))
    assert one.outputs == ("probs",) and one.fingerprint != src.fingerprint
    with pytest.raises(ModelError, match="has no node nope"):
        open_inputs(graphs / "two.pb", graphs / "img.npz", graph=GraphIO(outputs=("nope",)))


def test_a_keras_model_frozen_as_a_concrete_function(tmp_path):
    """What a TF2 user freezes: a Keras model's concrete function, variables folded (convert_to_constants)."""
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

    tf, keras = _tf.tf(), _tf.keras()
    keras.utils.set_random_seed(0)
    inp = keras.Input((6,))
    model = keras.Model(inp, keras.layers.Dense(3, activation="softmax")(keras.layers.Dense(8, activation="relu")(inp)))
    fn = tf.function(lambda t: model(t, training=False)).get_concrete_function(
        tf.TensorSpec([None, 6], tf.float32, name="x")
    )
    (tmp_path / "mlp.pb").write_bytes(convert_variables_to_constants_v2(fn).graph.as_graph_def().SerializeToString())
    np.savez(tmp_path / "d.npz", x=RNG.normal(size=(10, 6)).astype(np.float32))
    src, ds = open_inputs(tmp_path / "mlp.pb", tmp_path / "d.npz", check=True, threads=1)
    assert src.inputs[0].name == "x" and src.outputs == ("Identity",)
    assert src.conversion.fidelity.relative_error < 1e-5
    x = ds.x_test[:4]
    want = model(x).numpy()
    from optimize.models import runtime

    got = runtime.Runner(runtime.load(src.content, threads=1)).predict(x)[0]
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_bad_graphs_are_one_line_each(graphs, tmp_path, cli):
    (tmp_path / "junk.pb").write_bytes(b"\x08\x96\x01 not a graph at all" * 3)
    one_line_error(cli("evaluate", str(tmp_path / "junk.pb")), "junk.pb is not a TensorFlow GraphDef")
    one_line_error(cli("evaluate", str(graphs / "unfrozen.pb"), "-d", str(graphs / "img.npz")), "is not frozen")
    tf = _tf.tf()
    tf1 = tf.compat.v1
    g = tf.Graph()
    with g.as_default():
        tf1.placeholder(tf.float32, [None, 4], name="x")
        tf.fill([2**20, 2**20], 1.0, name="huge")  # a splat constant folded: a terabyte declared in a few bytes
        big = g.as_graph_def()
    huge = [n for n in big.node if n.op == "Const"]
    for n in huge:
        n.attr["value"].tensor.tensor_shape.dim.add(size=2**40)
    (tmp_path / "bomb.pb").write_bytes(big.SerializeToString())
    one_line_error(cli("evaluate", str(tmp_path / "bomb.pb")), "declares")
    saved = tmp_path / "sm"
    module = tf.Module()
    module.f = tf.function(lambda v: v * 2.0, input_signature=[tf.TensorSpec([None, 2], tf.float32)])
    tf.saved_model.save(module, str(saved), signatures=module.f)
    one_line_error(cli("evaluate", str(saved / "saved_model.pb")), "is a SavedModel's saved_model.pb")


def test_a_frozen_graph_sweeps(graphs, tmp_path, cli):
    r = cli("sweep", str(graphs / "small.pb"), "-d", str(graphs / "img.npz"), "-o", str(tmp_path / "out"),
            "--no-cache", "-j", "0", env={"NO_COLOR": "1"})  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    from optimize.core.results import load_study

    study = load_study(tmp_path / "out" / "study.json")
    made = {c.name for c in study.candidates if c.ok}
    assert {"float32", "float16", "int8", "int8-int8io"} <= made
    assert "int8-pt2e" not in {c.name for c in study.candidates}  # PT2E is for a torch graph
    assert study.conversion is not None and study.conversion.source == "graphdef"

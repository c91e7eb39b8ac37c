"""End to end on real architectures (random weights): every delegate column, no crash, sane verdicts."""

from __future__ import annotations

import pytest
from delegate_fixtures import convert

from optimize.delegates import DELEGATES, check_delegates, format_report
from optimize.models import _tf
from optimize.models.tflite import read_model

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def mobilenet_v2():
    keras = _tf.keras()
    tf = _tf.tf()
    model = keras.applications.MobileNetV2(weights=None, input_shape=(96, 96, 3))
    return {
        s: convert(lambda: tf.lite.TFLiteConverter.from_keras_model(model), s, (1, 96, 96, 3))
        for s in ("float32", "float16", "int8")
    }


def test_mobilenet_v2_matrix(mobilenet_v2):
    r32 = check_delegates(mobilenet_v2["float32"])
    assert tuple(r32) == DELEGATES
    assert r32["gpu"].verdict == "full"  # CONV/DWCONV/ADD/PAD/MEAN/FC/SOFTMAX are all GPU ops
    assert r32["hexagon"].verdict == "none"
    assert r32["xnnpack"].source == "runtime" and r32["xnnpack"].nodes_delegated > 0
    assert r32["xnnpack"].nodes_total == len(read_model(mobilenet_v2["float32"]).main.ops)
    r16 = check_delegates(mobilenet_v2["float16"], ["gpu", "coreml"])
    assert r16["gpu"].verdict == "full"
    r8 = check_delegates(mobilenet_v2["int8"])
    assert r8["coreml"].verdict == "none"
    assert r8["gpu"].verdict == "full"
    assert "XNNPACK" in format_report(r8)


def test_mobilenet_v3_small_runs():
    keras = _tf.keras()
    tf = _tf.tf()
    model = keras.applications.MobileNetV3Small(weights=None, input_shape=(96, 96, 3))
    data = convert(lambda: tf.lite.TFLiteConverter.from_keras_model(model), "float32", (1, 96, 96, 3))
    r = check_delegates(data)
    assert tuple(r) == DELEGATES
    for rep in r.values():
        assert 0 <= rep.nodes_delegated <= rep.nodes_total
        assert (rep.verdict == "full") == (rep.nodes_delegated == rep.nodes_total)
    assert r["xnnpack"].nodes_total == len(read_model(data).main.ops)

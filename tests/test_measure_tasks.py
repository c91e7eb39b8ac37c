"""Fidelity that sees slices, detection and segmentation as tasks, and the GPU's arithmetic: seeded models
with a YOLO-style head, a segmentation head and dense weights, measured as a sweep measures them."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from study_fixtures import study as study_of

from optimize.measure import detection, metrics, slices
from optimize.measure.gpu_arithmetic import INT16X8, NotEmulated, gpu_copy
from optimize.models.data import from_arrays

CLASSES, SIDE = 3, 32


def _tflite(model, folder, name: str, xs: np.ndarray | None = None, whole_int8: bool = False):
    """The tf_keras model converted by the TFLite converter: float32, or (xs given) full int8 calibrated on xs."""
    from optimize.models import _tf

    tf = _tf.tf()
    conv = tf.lite.TFLiteConverter.from_keras_model(model)
    if xs is not None:
        conv.optimizations = [tf.lite.Optimize.DEFAULT]
        conv.representative_dataset = lambda: ([xs[i : i + 1]] for i in range(len(xs)))
        if whole_int8:
            conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    path = folder / f"{name}.tflite"
    path.write_bytes(conv.convert())
    return path


@pytest.fixture(scope="module")
def yolo(tmp_path_factory):
    """A YOLO-style detector: [1, 4+C, N] with pixel boxes (cx, cy, w, h: -150..550) beside C sigmoid scores,
    float32 and int8 (one scale for the whole head, as the converter makes it)."""
    from optimize.models import _tf

    keras = _tf.keras()
    keras.utils.set_random_seed(0)
    inp = keras.Input((SIDE, SIDE, 3))
    h = keras.layers.Conv2D(16, 3, strides=2, padding="same", activation="relu")(inp)
    h = keras.layers.Conv2D(16, 3, padding="same", activation="relu")(h)
    wide = keras.initializers.RandomNormal(stddev=6.0, seed=0)
    centres = keras.layers.Rescaling(40.0, offset=160.0)(keras.layers.Conv2D(2, 1, kernel_initializer=wide)(h))
    sizes = keras.layers.Rescaling(10.0, offset=30.0)(keras.layers.Conv2D(2, 1, activation="relu")(h))
    init = keras.initializers.Constant(-2.0)
    scores = keras.layers.Conv2D(CLASSES, 1, activation="sigmoid", kernel_initializer=wide, bias_initializer=init)(h)
    head = keras.layers.Concatenate()([centres, sizes, scores])
    n = (SIDE // 2) ** 2
    out = keras.layers.Permute((2, 1))(keras.layers.Reshape((n, 4 + CLASSES))(head))
    model = keras.Model(inp, out)
    xs = np.random.default_rng(1).random((48, SIDE, SIDE, 3)).astype(np.float32)
    folder = tmp_path_factory.mktemp("yolo")
    f32 = _tflite(model, folder, "float32")
    int8 = _tflite(model, folder, "int8", xs[:24], whole_int8=True)
    model.save(folder / "yolo.keras")
    np.savez(folder / "images.npz", x_train=xs[:24], x_test=xs[24:])
    return f32, int8, from_arrays(x_train=xs[:24], x_test=xs[24:])


def test_a_yolo_head_is_recognised_and_its_scores_measured_as_a_slice(yolo):
    f32, int8, ds = yolo
    m = metrics.evaluate(int8, ds, reference=f32, timing=False)
    det = m.fidelity.detection
    assert det is not None and det.layout == "yolo" and det.score_threshold == detection.DEFAULT_SCORE
    assert det.reference_detections > 10
    out = m.fidelity.outputs[0]
    assert [s.name for s in out.slices] == ["boxes", "scores"]
    boxes, scores = out.slices
    # one int8 scale for the head: the boxes keep well, the scores do not, and the tensor-wide figure hides it
    assert scores.relative_error > 5 * out.tensor_relative_error
    assert out.relative_error == max(boxes.relative_error, scores.relative_error, out.tensor_relative_error)
    assert det.kept_fraction < 0.9  # detections are lost
    same = metrics.evaluate(f32, ds, reference=f32, timing=False).fidelity
    assert same.detection.kept_fraction == 1.0 and same.detection.extra == 0 and same.detection.mean_iou == 1.0


def test_detections_kept_counts_class_and_overlap():
    rng = np.random.default_rng(0)
    ref = np.zeros((2, 4 + CLASSES, 64), np.float32)
    ref[:, :4] = rng.uniform(20, 40, (2, 4, 64))
    ref[:, 0] += np.arange(64) * 50  # anchors far apart: no suppression between them
    ref[:, 4:] = 0.01
    ref[:, 4, :5] = 0.9  # five class-0 detections per sample
    lay = detection.recognise([ref.shape], [ref])
    assert lay is not None and lay.kind == "yolo" and lay.axis == 1
    same = detection.compare([ref], [ref], ["out"], lay)
    assert (same.reference_detections, same.kept, same.extra) == (10, 10, 0)
    moved = ref.copy()
    moved[0, 0, :2] += 1000  # two boxes moved away: lost there, and two detections float32 does not make
    other = moved.copy()
    other[1, 4, 0], other[1, 5, 0] = 0.0, 0.9  # one detection of another class
    got = detection.compare([other], [ref], ["out"], lay)
    assert (got.kept, got.extra) == (7, 3) and got.kept_fraction == pytest.approx(0.7)
    transposed = np.swapaxes(ref, 1, 2)  # [1, N, 4+C] is the same head
    assert detection.recognise([transposed.shape], [transposed]).axis == 2


def test_a_pair_of_boxes_and_logit_scores_is_an_anchor_head():
    rng = np.random.default_rng(0)
    boxes = rng.normal(0, 20, (2, 896, 16)).astype(np.float32)  # offsets, not corners
    logits = rng.normal(-4, 3, (2, 896, 1)).astype(np.float32)
    lay = detection.recognise([boxes.shape, logits.shape], [boxes, logits])
    assert lay is not None and (lay.kind, lay.outputs, lay.logits) == ("anchors", (0, 1), True)
    got = detection.compare([boxes, logits], [boxes, logits], ["box", "score"], lay)
    assert got.kept == got.reference_detections > 0
    assert detection.recognise([(1, 10)], [np.zeros((2, 10))]) is None  # a classifier is no detector


def test_scale_slices_cut_only_outputs_of_several_scales():
    rng = np.random.default_rng(0)
    one = rng.normal(size=(8, 20)).astype(np.float32)
    assert slices.scale_slices(one) == []
    spread = rng.normal(size=(8, 1000)) * np.geomspace(0.02, 1.0, 1000)  # logits: quiet classes at the bottom
    assert slices.scale_slices(spread.astype(np.float32)) == []  # a continuum of ranges is one quantity
    mixed = np.concatenate([rng.uniform(0, 224, (8, 21, 2)), rng.uniform(0, 1, (8, 21, 1))], axis=2)
    got = slices.scale_slices(mixed)
    assert [s.channels for s in got] == [(0, 1), (2,)] and got[0].axis == 2
    q = np.round(mixed / (224 / 255)) * (224 / 255)  # one int8 scale for the tensor
    f = metrics.fidelity_of([q.astype(np.float32)], [mixed.astype(np.float32)], ["landmarks"], "float32")
    out = f.outputs[0]
    assert out.slices[1].name == "channels 2" and out.slices[1].relative_error > 0.1
    assert out.tensor_relative_error < 0.01 and out.relative_error == out.slices[1].relative_error
    assert f.worst().relative_error > 0.1  # what the guard and the table read


def test_a_segmentation_head_gets_mask_iou(tmp_path):
    from optimize.models import _tf

    keras = _tf.keras()
    keras.utils.set_random_seed(0)
    inp = keras.Input((16, 16, 3))
    h = keras.layers.Conv2D(8, 3, padding="same", activation="relu")(inp)
    out = keras.layers.Conv2D(4, 1, activation="softmax")(h)
    model = keras.Model(inp, out)
    xs = np.random.default_rng(2).random((24, 16, 16, 3)).astype(np.float32)
    f32 = _tflite(model, tmp_path, "float32")
    int8 = _tflite(model, tmp_path, "int8", xs[:12])
    ds = replace(from_arrays(x_train=xs[:12], x_test=xs[12:]), task="segment")
    fid = metrics.evaluate(int8, ds, reference=f32, timing=False).fidelity
    o = fid.outputs[0]
    assert o.iou is not None and 0.5 < o.iou <= 1.0
    assert metrics.evaluate(f32, ds, reference=f32, timing=False).fidelity.outputs[0].iou == 1.0
    # a rejection says the figure that judges a mask (a real OCR text detector: IoU 62.8% at 0.91% output error)
    from types import SimpleNamespace

    from optimize.decide.guard import fidelity_words

    words = fidelity_words(SimpleNamespace(name="int8", metrics=SimpleNamespace(fidelity=fid)))
    assert words.startswith(f"mask IoU {o.iou * 100:.1f}% with float32's, output error"), words


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    """A model with weights big enough for dynamic range (>= 1024 elements), float32 and its quantized files."""
    from optimize.models import _tf

    keras = _tf.keras()
    tf = _tf.tf()
    keras.utils.set_random_seed(0)
    inp = keras.Input((64,))
    h = keras.layers.Dense(128, activation="relu")(inp)
    out = keras.layers.Dense(8)(keras.layers.Dense(64, activation="tanh")(h))
    model = keras.Model(inp, out)
    xs = np.random.default_rng(3).normal(size=(64, 64)).astype(np.float32)
    folder = tmp_path_factory.mktemp("dense")
    files = {"float32": _tflite(model, folder, "float32"), "int8": _tflite(model, folder, "int8", xs[:32])}
    for name, types in (("dynamic", None), ("float16", [tf.float16])):
        conv = tf.lite.TFLiteConverter.from_keras_model(model)
        conv.optimizations = [tf.lite.Optimize.DEFAULT]
        if types:
            conv.target_spec.supported_types = types
        files[name] = folder / f"{name}.tflite"
        files[name].write_bytes(conv.convert())
    return files, from_arrays(x_train=xs[:32], x_test=xs[32:])


def test_every_candidate_has_its_figures_in_the_gpus_arithmetic(dense):
    files, ds = dense
    got = {n: metrics.evaluate(p, ds, reference=files["float32"], timing=False) for n, p in files.items()}
    for name, m in got.items():
        gpu = m.on_target.gpu
        assert gpu.method == "emulated" and gpu.outputs[0].relative_error is not None, name
    cpu = {n: m.fidelity.outputs[0].relative_error for n, m in got.items()}
    gpu = {n: m.on_target.gpu.outputs[0].relative_error for n, m in got.items()}
    assert gpu["float32"] == cpu["float32"] == 0.0
    assert gpu["dynamic"] != cpu["dynamic"]  # weights dequantized and float math, not hybrid kernels
    assert gpu["dynamic"] < cpu["dynamic"]  # activations are not quantized on the fly there
    assert "dequantized" in got["dynamic"].on_target.gpu.how
    assert "float16" in got["float16"].on_target.gpu.how and gpu["float16"] < 0.01
    assert "rounded to their scales" in got["int8"].on_target.gpu.how
    assert abs(gpu["int8"] - cpu["int8"]) < 0.5 * cpu["int8"]  # the same int8 grid, float accumulation


def test_the_gpu_copy_computes_in_float(dense):
    from optimize.models.tflite import read_model

    files, _ = dense
    for name in ("dynamic", "int8"):
        content, _ = gpu_copy(files[name].read_bytes())
        ops = {op.name for op in read_model(content).main.ops}
        assert {"QUANTIZE", "DEQUANTIZE"} >= ops - {"FULLY_CONNECTED", "RELU", "TANH"}, ops
    with pytest.raises(NotEmulated, match="as on the CPU"):
        gpu_copy(files["float32"].read_bytes())
    assert "int16x8" in INT16X8


def test_the_int8_rescue_keeps_a_detectors_output_stage_and_its_detections(yolo, tmp_path):
    import optimize
    from optimize.core.recipe import build

    f32, _, _ = yolo
    folder = f32.parent
    steps = [{"technique": "convert"}, {"technique": "selective", "min_detections_kept": 0.95}]
    cand = optimize.run(build("mixed-int8", steps), folder / "yolo.keras", folder / "images.npz", tmp_path, jobs=0)
    assert cand.ok, cand.error
    det = cand.metrics.fidelity.detection
    assert det is not None and det.kept_fraction >= 0.9, det
    assert cand.search and cand.search[-1].kept  # the output stage, raised
    assert any("detections kept" in n for n in cand.notes), cand.notes


def _device():
    """This machine's Vulkan device the GPU accelerator accepts, or skip (fail where CI set lavapipe up)."""
    import os

    from optimize.delegates import observe

    icd = observe.gpu_device()
    if icd is None:
        why = "no Vulkan device the LiteRT GPU accelerator accepts (Mesa's lavapipe 25: see .ci/run)"
        if os.environ.get("OPTIMIZE_REQUIRE_GPU_DEVICE"):
            pytest.fail(f"{why}, although .ci/run set it up")
        pytest.skip(why)
    return icd


def test_the_gpu_emulation_matches_the_observed_gpu(dense, tmp_path):
    """Each candidate's emulated GPU figure against the GPU accelerator's own numbers on the same samples: they
    agree within the float16 arithmetic the device adds to every float model (its float32 candidate's error)."""
    from optimize.engine.on_gpu import observe_arithmetic

    icd = _device()
    files, ds = dense
    cands = []
    for name, path in files.items():
        m = metrics.evaluate(path, ds, reference=files["float32"], timing=False)
        cands.append(_candidate(name, path.name, m))
    folder = files["float32"].parent
    study = observe_arithmetic(study_of(cands), folder, ds)
    got = {c.name: c.metrics.on_target.gpu for c in study.candidates}
    assert all(g.method == "observed" and icd.name in g.how for g in got.values())
    emulated = {c.name: c.metrics.on_target.gpu for c in cands}
    floor = got["float32"].outputs[0].relative_error  # the device's float16 arithmetic on a float32 model
    for name in ("dynamic", "int8"):
        obs, emu = got[name].outputs[0].relative_error, emulated[name].outputs[0].relative_error
        assert abs(obs - emu) <= max(0.2 * obs, 2 * floor), (name, obs, emu, floor)
        assert got[name].flagged is None


def _candidate(name: str, artifact: str, metrics_):
    from optimize.core.recipe import build
    from optimize.core.results import Candidate

    recipe = build(name, [{"technique": "convert", "scheme": "float32"}])
    return Candidate(
        name=name,
        steps=list(recipe.steps),
        recipe_hash=recipe.hash,
        scheme="float32",
        artifact=artifact,
        metrics=metrics_,
    )


def test_recommend_for_the_gpu_judges_the_gpus_arithmetic(dense):
    from optimize.core.results import TargetFidelity
    from optimize.decide.choose import recommend

    files, ds = dense
    cands = []
    for name, path in files.items():
        m = metrics.evaluate(path, ds, reference=files["float32"], timing=False)
        cands.append(
            _candidate(name, path.name, m.model_copy(update={"fidelity": None if name == "float32" else m.fidelity}))
        )
    study = study_of(cands)
    gpu = recommend(study, "gpu")
    assert any("as the gpu computes each candidate" in f for f in gpu.facts)
    assert not any("as the gpu computes" in f for f in recommend(study, "cpu").facts)
    # a candidate the observed GPU computes badly is named, and judged by those figures
    bad = cands[1].metrics.on_target.gpu.model_copy(update={"flagged": "the GPU computes it badly: test"})
    bad = TargetFidelity(**{**dict(bad), "method": "observed"})
    broken = [
        c
        if i != 1
        else c.model_copy(
            update={
                "metrics": c.metrics.model_copy(
                    update={"on_target": c.metrics.on_target.model_copy(update={"gpu": bad})}
                )
            }
        )
        for i, c in enumerate(cands)
    ]
    facts = recommend(study_of(broken), "gpu").facts
    assert any(f.startswith(f"{cands[1].name}: the GPU computes it badly") for f in facts)


def test_debug_names_the_output_stage_of_a_detector(yolo):
    from optimize.engine.debug import debug_model

    f32, _, _ = yolo
    report = debug_model(f32.parent / "yolo.keras", f32.parent / "images.npz", samples=12, leave_out=1)
    st = report.output_stage
    assert st is not None and st.op == "CONCATENATION"
    assert st.detections.kept_fraction < 0.5 < st.detections_float.kept_fraction
    assert report.fixes[0].startswith("Cause: the output stage: CONCATENATION")
    assert report.fixes[1].startswith("Fix to try: the output stage (CONCATENATION"), report.fixes
    assert not any("Nothing to fix" in f for f in report.fixes)


def _detector(name: str, scheme: str, size: int, kept: int, rel: float):
    """A detector candidate measured without labels: its head's detections kept of float32's 200."""
    from study_fixtures import candidate

    from optimize.core.results import DetectionFidelity, Fidelity, OutputFidelity

    c = candidate(name, scheme, size=size, delta=None)
    det = DetectionFidelity(
        layout="yolo", outputs=["output0"], score_threshold=0.25, reference_detections=200, kept=kept
    )
    out = OutputFidelity(
        name="output0", mean_abs_diff=rel, std_abs_diff=0.0, max_abs_diff=rel, relative_error=rel, detection=det
    )
    fid = Fidelity(reference="float32.tflite", samples=40, outputs=[out])
    return c.model_copy(update={"metrics": c.metrics.model_copy(update={"fidelity": fid})})


def test_a_detector_is_guarded_by_the_detections_it_keeps():
    from optimize.decide.choose import recommend
    from optimize.decide.guard import accept_hint, default_guard
    from optimize.present.report_text import format_recommendation

    cands = [
        _detector("float32", "float32", 12_000_000, 200, 0.0),
        _detector("float16", "float16", 6_000_000, 200, 0.0001),
        _detector("int8", "int8", 3_200_000, 0, 0.0015),  # 0.15% off over the tensor, no detection left
        _detector("mixed-int8", "int8", 3_300_000, 196, 0.09),  # a slice 9% off, 98% of the detections kept
    ]
    s = study_of(cands, data=None)
    guard = default_guard(recommend(s, "cpu").goals, s)
    assert "at least 95% of float32's detections kept" in guard.words
    rec = recommend(s, "cpu")
    assert rec.chosen == "mixed-int8"  # the output error of its score slice is not what judges a detector
    why = {r.candidate: r.reason for r in rec.rejected}
    assert "keeps 0 of float32's 200 detections" in why["int8"]
    assert accept_hint(guard, cands[2]) == "--min-detections-kept 0"
    assert "at least 95% of float32's detections kept" in format_recommendation(rec)

"""Detectors as they ship (issue 40): an SSD ending in the real TFLite_Detection_PostProcess op, end-to-end
[1, K, 6] heads, split post-processed outputs, class ids and counts, the CPU tail on accelerators, one count of
detections and the worst samples' figures. Seeded models and photos built here (tests/detector_fixtures.py)."""

from __future__ import annotations

import numpy as np
import pytest
from detector_fixtures import photos, ssd_postprocessed

from optimize.core.errors import DataError
from optimize.measure import detection, layouts, metrics
from optimize.models import runtime
from optimize.models.data import from_arrays

SIDE = 64


@pytest.fixture(scope="module")
def ssd(tmp_path_factory):
    """The SSD (float32), its float16 and int8 files (LiteRT Quantizer via optimize), and held-out photos."""
    import optimize
    from optimize.core.recipe import build

    folder = tmp_path_factory.mktemp("ssd")
    f32 = ssd_postprocessed(folder, side=SIDE)
    ds = from_arrays(x_train=photos(32, SIDE, 0), x_test=photos(32, SIDE, 1))
    np.savez(folder / "d.npz", x_train=ds.x_train, x_test=ds.x_test)
    recipes = [build(s, [{"technique": "quantize", "scheme": s}]) for s in ("float16", "int8")]
    recipes.append(build("int8-int8io", [{"technique": "quantize", "scheme": "int8", "io": "int8"}]))
    study = optimize.sweep(f32, folder / "d.npz", folder / "out", recipes=recipes, runs=3, cache=False, jobs=0)
    made = {c.name: folder / "out" / c.artifact for c in study.candidates if c.ok}
    assert {"float16", "int8", "int8-int8io"} <= made.keys(), [c.error for c in study.candidates]
    return f32, made, ds, study


def test_rows_past_the_count_read_zero_and_float16_passes_the_all_zero_probe(ssd):
    f32, made, ds, _ = ssd
    from optimize.measure import probe

    for path in (f32, made["float16"]):
        runner = runtime.Runner(runtime.load(path))
        boxes, classes, scores, count = runner.run(np.zeros((1, SIDE, SIDE, 3), np.float32))
        n = int(count)
        assert n < len(scores)  # the op fills fewer rows than it has on a blank image
        assert not scores[n:].any() and not boxes[n:].any() and not classes[n:].any()
        assert probe.run(runner, ds, reference=f32).ok


def test_a_post_processed_ssd_is_judged_by_its_detections_not_by_slots(ssd):
    f32, made, ds, _ = ssd
    m = metrics.evaluate(made["int8"], ds, reference=f32, timing=False)
    det = m.fidelity.detection
    assert det.layout == "postprocessed" and det.reference_detections > 100
    assert 0.9 <= det.kept_fraction <= 1.0 and det.mean_iou > 0.8
    assert det.sample_kept is not None and det.sample_kept <= det.kept_fraction
    # the classes and the count are no values: they carry no mean |difference| to be judged by
    by_name = {o.name: o for o in m.fidelity.outputs}
    assert all(o.relative_error is None for o in by_name.values())
    assert all(o.detection is not None for o in by_name.values())
    same = metrics.evaluate(f32, ds, reference=f32, timing=False).fidelity.detection
    assert same.kept_fraction == 1.0 and same.extra == 0 and same.sample_kept == 1.0


def test_the_ops_roles_recognise_the_layout_whatever_the_order(ssd):
    f32, _, ds, _ = ssd
    from optimize.models.tasks import heads

    runner = runtime.Runner(runtime.load(f32))
    hs = heads(f32, runner)
    assert [h.role for h in hs] == ["boxes", "classes", "scores", "count"]
    assert [h.index for h in hs] == [False, True, False, True]
    ref = runner.predict(ds.x_test[:4])
    order = [3, 2, 0, 1]  # the outputs shuffled: the roles still find each
    lay = detection.recognise(
        detection.shapes_of([ref[i] for i in order]), [ref[i] for i in order], None, [hs[i].role for i in order]
    )
    assert lay.kind == "postprocessed" and lay.outputs == (2, 3, 1, 0)


def _split(n: int = 6, rows: int = 10, seed: int = 0):
    """Split post-processed outputs (boxes, scores, classes, a count), as an end-to-end export splits them."""
    rng = np.random.default_rng(seed)
    lo = rng.random((n, rows, 2)) * 0.5
    boxes = np.concatenate([lo, lo + 0.2 + rng.random((n, rows, 2)) * 0.3], -1).astype(np.float32)
    scores = np.sort(rng.uniform(0.3, 0.95, (n, rows)), 1)[:, ::-1].astype(np.float32)
    classes = rng.integers(0, 5, (n, rows)).astype(np.float32)
    count = rng.integers(3, rows + 1, (n, 1)).astype(np.float32)
    return [boxes, scores, classes, count]


def test_split_post_processed_outputs_are_recognised_by_shape_and_the_count_respected():
    ref = _split()
    lay = detection.recognise(detection.shapes_of(ref), ref)
    assert lay.kind == "postprocessed" and lay.outputs == (0, 2, 1, 3)  # classes: the whole-numbered one
    fid = detection.compare(ref, ref, ["b", "s", "c", "n"], lay)
    assert fid.reference_detections == int(ref[3].sum())  # rows past each count are not detections
    moved = [a.copy() for a in ref]
    for k in range(len(ref[0])):  # one detection moves a slot: every row after it shifts
        order = np.r_[1, 0, np.arange(2, ref[0].shape[1])]
        moved[0][k], moved[1][k], moved[2][k] = ref[0][k][order], ref[1][k][order], ref[2][k][order]
    assert detection.compare(moved, ref, ["b", "s", "c", "n"], lay).kept_fraction == 1.0
    fewer = [a.copy() for a in ref]
    fewer[3] = np.maximum(ref[3] - 1, 0)  # the candidate's count drops one row per sample
    kept = detection.compare(fewer, ref, ["b", "s", "c", "n"], lay)
    assert kept.kept == fid.reference_detections - len(ref[0])


def test_boxes_and_scores_only_post_processed_outputs_are_recognised():
    """A one-class post-processed head (boxes, scores, a count; no classes): recognised with its count, and
    without a count when every sample's scores come sorted as selected rows do; raw unsorted scores are not."""
    boxes, scores, _, count = _split()
    ref = [boxes, scores, count]
    lay = detection.recognise(detection.shapes_of(ref), ref)
    assert lay.kind == "scored" and lay.outputs == (0, 1, 2)
    fid = detection.compare(ref, ref, ["b", "s", "n"], lay)
    assert fid.reference_detections == int(count.sum()) and fid.kept_fraction == 1.0
    lay = detection.recognise(detection.shapes_of(ref[:2]), ref[:2])
    assert lay.kind == "scored" and lay.outputs == (0, 1)
    raw = [boxes, np.random.default_rng(1).permutation(scores.T).T.copy()]
    assert detection.head_of(raw) is None or detection.head_of(raw).kind != "scored"


def test_a_copy_scoring_just_under_the_threshold_is_lost_no_margin():
    """One rule, the plain one: float32's detection is kept when the candidate's copy scores at least the same
    threshold; 0.24 against 0.25 is a detection not shipped. Checked against a count written here apart."""
    ref = [_end2end(n=8, k=20, seed=3)]
    out = ref[0].copy()
    rng = np.random.default_rng(4)
    above = np.argwhere(ref[0][..., 4] >= detection.DEFAULT_SCORE)
    under = above[rng.choice(len(above), 5, replace=False)]
    out[under[:, 0], under[:, 1], 4] = detection.DEFAULT_SCORE - 0.01
    out[..., :4] += rng.normal(0, 2, out[..., :4].shape).astype(np.float32)  # boxes move a little, IoU stays high
    lay = layouts.Layout("end2end", (0,))
    fid = detection.compare([out], ref, ["dets"], lay)
    assert fid.reference_detections == len(above) and fid.kept == len(above) - 5
    plain = 0
    for k in range(len(out)):  # apart from the tool: greedy in float32's score order, same class, IoU >= 0.5
        r = ref[0][k][ref[0][k][:, 4] >= 0.25]
        c = out[k][out[k][:, 4] >= 0.25]
        used = np.zeros(len(c), bool)
        for row in r[np.argsort(-r[:, 4])]:
            ok = np.flatnonzero((c[:, 5] == row[5]) & ~used)
            over = [_iou(row[:4], c[j, :4]) for j in ok]
            if over and max(over) >= 0.5:
                used[ok[int(np.argmax(over))]] = True
                plain += 1
    assert fid.kept == plain


def _iou(a: np.ndarray, b: np.ndarray) -> float:
    w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - w * h
    return float(w * h / union)


def _end2end(n: int = 6, k: int = 20, seed: int = 0) -> np.ndarray:
    """[n, K, 6] rows: pixel corners, a score, a class id, selected by the model (scores falling)."""
    rng = np.random.default_rng(seed)
    xy = rng.uniform(0, 500, (n, k, 2))
    wh = rng.uniform(20, 120, (n, k, 2))
    score = np.sort(rng.uniform(0.05, 0.95, (n, k, 1)), 1)[:, ::-1]
    cls = rng.integers(0, 80, (n, k, 1))
    return np.concatenate([xy, xy + wh, score, cls], -1).astype(np.float32)


def test_an_end_to_end_head_is_not_read_as_a_raw_yolo_head():
    ref = [_end2end()]
    for declared in (None, ""):  # recognised, and under --task detect
        lay = detection.recognise(detection.shapes_of(ref), ref, declared)
        assert lay.kind == "end2end"
    lay = detection.recognise(detection.shapes_of(ref), ref)
    fid = detection.compare(ref, ref, ["dets"], lay)
    expected = int((ref[0][..., 4] >= detection.DEFAULT_SCORE).sum())
    assert fid.reference_detections == expected  # every selected row above the threshold; no NMS again
    worse = ref[0].copy()
    worse[:, ::4, 4] = 0.01  # a quarter of the rows fall under the threshold
    lost = detection.compare([worse], ref, ["dets"], lay)
    assert lost.kept == expected - int((ref[0][:, ::4, 4] >= detection.DEFAULT_SCORE).sum())


def test_no_head_under_task_detect_lists_the_known_layouts_with_the_real_shapes():
    ref = [np.zeros((4, 7), np.float32), np.zeros((4, 3, 5), np.float32)]
    with pytest.raises(DataError) as e:
        detection.recognise(detection.shapes_of(ref), ref, "")
    text = str(e.value) + (e.value.fix or "")
    assert "[1, 7], [1, 3, 5]" in text
    for name in layouts.LAYOUTS:
        assert name in text


def test_class_ids_and_counts_are_judged_by_exact_agreement():
    from optimize.decide import kinds
    from optimize.models.tasks import Head

    ref = np.array([[3.0], [1.0], [2.0], [0.0]], np.float32)
    out = np.array([[3.0], [2.0], [2.0], [0.0]], np.float32)
    f = metrics.fidelity_of([out], [ref], ["argmax"], "f.tflite", hs=[Head((1, 1), "linear", None, True)])
    o = f.outputs[0]
    assert o.exact_agreement == 0.75 and o.relative_error is None
    assert kinds.of_output(o) is kinds.INDICES and o.agreement == 0.75


def test_a_split_where_float32_detects_nothing_keeps_no_share():
    ref = [_end2end()]
    ref[0][..., 4] = 0.01
    lay = layouts.Layout("end2end", (0,))
    fid = detection.compare(ref, ref, ["dets"], lay)
    assert fid.reference_detections == 0 and fid.kept_fraction is None and fid.few and fid.sample_kept is None


def test_the_post_processing_op_is_an_expected_cpu_tail(ssd):
    f32, made, _, _ = ssd
    from optimize.delegates import check_delegates

    for path in (f32, made["int8"]):
        reports = check_delegates(path, ["gpu", "nnapi", "xnnpack"])
        for name in ("gpu", "nnapi"):
            r = reports[name]
            assert r.verdict == "partial" and r.cpu_tail == ["TFLite_Detection_PostProcess"] and r.runs_with_tail
        assert reports["xnnpack"].cpu_tail == []


def test_gpu_and_nnapi_get_a_pick_for_the_ssd_with_its_tail_named(ssd):
    from optimize.decide.choose import recommend

    study = ssd[3]
    for target in ("gpu", "nnapi"):
        rec = recommend(study, target)
        assert rec.chosen is not None, rec.headline
        assert any("post-processing tail (TFLite_Detection_PostProcess)" in f for f in rec.facts)
        det = study.candidate(rec.chosen).metrics.fidelity.detection if rec.chosen != "float32" else None
        assert det is None or det.kept_fraction >= 0.95


def test_hexagon_gets_an_integer_ssd_whose_post_processing_is_its_cpu_tail(ssd):
    """Integer I/O on a post-processed SSD: the int8 input feeds an integer body, the op's outputs stay float (as
    shipped SSDs give them), the op is the expected CPU tail, and hexagon picks it with the tail named."""
    from ai_edge_litert.interpreter import Interpreter

    from optimize.decide.choose import recommend

    _, made, _, study = ssd
    it = Interpreter(model_path=str(made["int8-int8io"]))
    assert it.get_input_details()[0]["dtype"] == np.int8
    assert all(d["dtype"] == np.float32 for d in it.get_output_details())
    c = study.candidate("int8-int8io")
    assert c.composition.float_compute_ops == [] and c.composition.tail_ops == ["TFLite_Detection_PostProcess"]
    assert "TFLite_Detection_PostProcess" in c.delegates["hexagon"].cpu_tail
    assert c.metrics.fidelity.detection.kept_fraction >= 0.9
    rec = recommend(study, "hexagon")
    assert rec.chosen == "int8-int8io", rec.headline
    assert any("hexagon delegate runs every node but the post-processing tail" in f for f in rec.facts)


def test_the_worst_samples_are_shown_beside_the_pooled_figure_and_can_be_bounded():
    from optimize.core.results import Goals
    from optimize.decide import kinds
    from optimize.models.tasks import Head

    rng = np.random.default_rng(0)
    ref = (rng.random((20, 8, 8, 1)) > 0.5).astype(np.float32)
    out = ref.copy()
    out[3] = 1 - out[3]  # one frame's mask inverted: pooled IoU still high, that frame's IoU 0
    f = metrics.fidelity_of([out], [ref], ["mask"], "f.tflite", hs=[Head((1, 8, 8, 1), "sigmoid")])
    o = f.outputs[0]
    assert o.iou > 0.85 and o.sample_iou == 0.0
    check = next(c for c in kinds.CHECKS if c.bound is kinds.SAMPLE_KEPT)
    assert check.read(o) == 0.0 and check.broken(check.read(o), Goals(min_sample_kept=0.5).min_sample_kept)
    assert kinds.SAMPLE_KEPT.goal not in __import__("optimize.decide.guard", fromlist=["x"]).OUTPUT_GOALS


def test_a_segmenter_whose_int8_masks_fall_under_the_guard_gets_the_mask_rescue():
    from optimize.core.results import Fidelity, Metrics, OutputFidelity, Size
    from optimize.engine.runs import _lost

    def cand(iou):
        o = OutputFidelity(
            name="mask", mean_abs_diff=0.01, std_abs_diff=0, max_abs_diff=0.2, relative_error=0.01, iou=iou
        )
        m = Metrics(size=Size(bytes=1, gzip_bytes=1), fidelity=Fidelity(reference="f", samples=32, outputs=[o]))
        return type("C", (), {"metrics": m})()

    words, budget = _lost(cand(0.62))
    assert "mask IoU of 62.0%" in words and budget == {"min_mask_iou": 0.95}
    assert _lost(cand(0.97)) is None


def _pixel_yolo(folder, side: int = 32, classes: int = 3):
    """A seeded raw YOLO head [1, 4+C, N] with boxes in pixels of the input (centres 0..side, sizes 4..12)."""
    from optimize.models import _tf

    keras, tf = _tf.keras(), _tf.tf()
    keras.utils.set_random_seed(0)
    inp = keras.Input((side, side, 3))
    h = keras.layers.Conv2D(16, 3, strides=2, padding="same", activation="relu")(inp)
    h = keras.layers.Conv2D(16, 3, padding="same", activation="relu")(h)
    centres = keras.layers.Rescaling(side / 2, offset=side / 2)(keras.layers.Conv2D(2, 1, activation="tanh")(h))
    sizes = keras.layers.Rescaling(8.0, offset=4.0)(keras.layers.Conv2D(2, 1, activation="sigmoid")(h))
    wide = keras.initializers.RandomNormal(stddev=6.0, seed=0)
    init = keras.initializers.Constant(-2.0)
    scores = keras.layers.Conv2D(classes, 1, activation="sigmoid", kernel_initializer=wide, bias_initializer=init)(h)
    n = (side // 2) ** 2
    head = keras.layers.Reshape((n, 4 + classes))(keras.layers.Concatenate()([centres, sizes, scores]))
    model = keras.Model(inp, keras.layers.Permute((2, 1))(head))
    path = folder / "yolo.tflite"
    path.write_bytes(tf.lite.TFLiteConverter.from_keras_model(model).convert())
    return path


def test_the_yolo_head_rewrite_keeps_the_function_and_says_the_contract(tmp_path):
    from optimize.transforms.tflite.yolo_head import normalise_boxes

    path = _pixel_yolo(tmp_path)
    made, contract = normalise_boxes(path.read_bytes())
    assert contract.multiply_by == [32.0] * 4 and contract.axis == 1 and contract.channels == [0, 1, 2, 3]
    xs = np.random.default_rng(1).random((4, 32, 32, 3)).astype(np.float32)
    before = runtime.Runner(runtime.load(path)).predict(xs)
    after = runtime.Runner(runtime.load(made)).predict(xs)
    assert float(np.abs(after[0][:, :4]).max()) <= 1.5 < float(np.abs(before[0][:, :4]).max())
    np.testing.assert_allclose(contract.restore(after)[0], before[0], rtol=1e-5, atol=1e-4)


@pytest.mark.slow
def test_an_integer_file_for_integer_targets_keeps_a_yolo_heads_detections(tmp_path):
    import optimize
    from optimize.decide.choose import recommend

    path = _pixel_yolo(tmp_path)
    xs = np.random.default_rng(1).random((64, 32, 32, 3)).astype(np.float32)
    np.savez(tmp_path / "d.npz", x_cal=xs[:32], x_test=xs[32:])
    recipes = [optimize.load_recipe("yolo-int8")]
    from optimize.core.recipe import build

    recipes.append(build("int8-int8io", [{"technique": "quantize", "scheme": "int8", "io": "int8"}]))
    study = optimize.sweep(path, tmp_path / "d.npz", tmp_path / "out", recipes=recipes, jobs=0, cache=False, runs=3)
    plain, boxes = study.candidate("int8-int8io"), study.candidate("yolo-int8")
    assert boxes.ok and boxes.output_contract is not None and "normalised" in boxes.output_contract.words
    assert any("output contract changes" in n for n in boxes.notes)
    kept = boxes.metrics.fidelity.detection.kept_fraction
    assert kept >= 0.9 and kept > plain.metrics.fidelity.detection.kept_fraction
    rec = recommend(study, "mcu")
    assert rec.chosen == "yolo-int8" and "normalised" in rec.headline


@pytest.mark.slow
def test_an_end_to_end_head_exported_as_pt2_is_judged_by_its_rows(tmp_path):
    import torch
    from detector_fixtures import end2end_module

    import optimize
    from optimize.core.recipe import build

    m = end2end_module()
    cal, test = photos(24, SIDE, 0).transpose(0, 3, 1, 2), photos(24, SIDE, 1).transpose(0, 3, 1, 2)
    torch.export.save(torch.export.export(m, (torch.from_numpy(test[:1].copy()),)), str(tmp_path / "e2e.pt2"))
    np.savez(tmp_path / "d.npz", x_cal=cal, x_test=test)
    recipes = [build("int8", [{"technique": "quantize", "scheme": "int8"}])]
    study = optimize.sweep(tmp_path / "e2e.pt2", tmp_path / "d.npz", tmp_path / "o", recipes=recipes, jobs=0, runs=3)
    det = study.candidate("int8").metrics.fidelity.detection
    assert det.layout == "end2end" and det.reference_detections > 0 and det.kept_fraction is not None


def _softplus_end2end(folder, side: int = 32, k: int = 8, classes: int = 3):
    """A seeded end-to-end head as torch exports convert: box sizes through softplus (SELECT(x > 20, x,
    LOG(EXP(x) + 1))), the top K cells by best score gathered, rows [x1, y1, x2, y2, score, class] in pixels."""
    import tensorflow as tf

    rng = np.random.default_rng(3)
    w1 = tf.constant(rng.normal(0, 0.4, (3, 3, 3, 8)).astype(np.float32))
    wb = tf.constant(rng.normal(0, 0.5, (1, 1, 8, 4)).astype(np.float32))
    wc = tf.constant(rng.normal(0, 0.5, (1, 1, 8, classes)).astype(np.float32))
    cells = side // 4
    g = (np.arange(cells, dtype=np.float32) * 4 + 2)[None]
    centres = tf.constant(np.stack(np.meshgrid(g, g), -1).reshape(1, cells * cells, 2))

    @tf.function(input_signature=[tf.TensorSpec([1, side, side, 3], tf.float32)])
    def head(x):
        f = tf.nn.relu(tf.nn.conv2d(x, w1, 4, "SAME"))
        d = tf.reshape(tf.nn.conv2d(f, wb, 1, "SAME") * 3, [1, -1, 4])
        d = tf.where(d > 20.0, d, tf.math.log(tf.exp(d) + 1.0)) * 4  # softplus as converted from torch
        p = tf.reshape(tf.sigmoid(tf.nn.conv2d(f, wc, 1, "SAME") - 1), [1, -1, classes])
        boxes = tf.concat([centres - d[..., :2], centres + d[..., 2:]], -1)
        top, idx = tf.math.top_k(tf.reduce_max(p, -1), k)
        label = tf.cast(tf.gather(tf.argmax(p, -1), idx, batch_dims=1), tf.float32)
        return tf.concat([tf.gather(boxes, idx, batch_dims=1), top[..., None], label[..., None]], -1)

    module = tf.Module()
    module.head = head
    tf.saved_model.save(module, str(folder / "saved"), signatures=head.get_concrete_function())
    path = folder / "softplus_e2e.tflite"
    path.write_bytes(tf.lite.TFLiteConverter.from_saved_model(str(folder / "saved")).convert())
    return path


def _rows(content: bytes, xs: np.ndarray) -> list[np.ndarray]:
    r = runtime.Runner(runtime.load(content))
    return [np.stack([r.run(x[None])[0] for x in xs])]


def test_an_end_to_end_heads_int8_keeps_its_box_sizes_and_row_scales(tmp_path):
    """Softplus's ADD between float EXP and LOG was quantized on EXP's range (every box size read 0) and the head's
    rows shared one scale (scores read 0 or one pixel step): int8 kept 0% of float32's detections (the routes
    detector, benchmarks/route_models.py). Both ops are kept float now, each an island with its reason, and the
    rows keep float32's values."""
    from optimize.core.registry import Context
    from optimize.models.tflite import read_model
    from optimize.transforms.tflite import kept_float
    from optimize.transforms.tflite.quantize import QuantizeParams, quantize

    path = _softplus_end2end(tmp_path)
    xs = photos(32, 32, 0)
    ds = from_arrays(x_cal=xs[:16], x_test=xs[16:])
    ctx = Context(workdir=tmp_path, data=ds)
    made = quantize(path, QuantizeParams(scheme="int8", samples=16, integer_kernels=False), ctx)
    made = made.read_bytes()
    sg = read_model(made).main
    assert not kept_float.between(sg) and not kept_float.mixed_rows(sg)
    reasons = {i.reason for i in ctx.records["islands"]}
    assert {kept_float.WHY_BETWEEN, kept_float.WHY_ROWS} <= reasons
    assert {sg.ops[i].name for i in range(len(sg.ops)) if sg.tensors[sg.ops[i].outputs[0]].dtype == "float32"} >= {
        "ADD",
        "CONCATENATION",
    }
    ref, outs = _rows(path.read_bytes(), xs[16:])[0], _rows(made, xs[16:])[0]
    assert np.median(np.abs(outs - ref)[..., :4]) < 0.5  # box corners within half a pixel (all 0 before)
    assert np.median(np.abs(outs - ref)[..., 4]) < 0.02  # scores at their own scale (steps of ~0.2 before)
    lay = detection.head_of([ref])
    fid = detection.compare([outs], [ref], ["rows"], lay)  # class ids read 0.996 are class 1 (truncated: 1/128 kept)
    assert lay.kind == "end2end" and fid.kept >= 0.9 * fid.reference_detections > 0

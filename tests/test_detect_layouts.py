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
    study = optimize.sweep(f32, folder / "d.npz", folder / "out", recipes=recipes, runs=3, cache=False, jobs=0)
    made = {c.name: folder / "out" / c.artifact for c in study.candidates if c.ok}
    assert {"float16", "int8"} <= made.keys(), [c.error for c in study.candidates]
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

"""The report's plots: labels that do not sit on each other, one caption per plot (issue 17)."""

from __future__ import annotations

import re

import pytest
from study_fixtures import candidate, full_study, study

pytest.importorskip("matplotlib")


def _crowded():
    """Candidates of equal accuracy and near-equal size (prune-int8 and cluster-int8 of the same file),
    plus some close by: the case where labels used to pile up."""
    cands = [candidate("float32", size=152_000, delta=0.0, p50=1.0)]
    for i, name in enumerate(("int8", "prune-int8", "cluster-int8", "prune-cluster-int8", "qat-int8")):
        cands.append(candidate(name, "int8", size=42_000 + 40 * i, delta=0.0, p50=0.6))
    cands += [
        candidate("dynamic", "dynamic", size=41_000, delta=-0.001, p50=0.62),
        candidate("int8-int8io", "int8", io="int8", size=41_500, delta=-0.0005, p50=0.61),
        candidate("float16", "float16", size=78_000, delta=0.0, p50=1.05),
        candidate("int4", "int4", size=30_000, delta=-0.004, p50=0.7),
    ]
    return study(cands)


def _label_boxes(st, axis: str):
    """The labels' boxes as drawn (display units), and their texts."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from optimize.present import plots

    points = plots._points(st, axis)
    fig = Figure(figsize=plots.FIGSIZE, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    plots._scatter(ax, points, set(), None)
    plots._label(ax, points)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    texts = [t for t in ax.texts]
    return [t.get_window_extent(renderer) for t in texts], [t.get_text() for t in texts]


@pytest.mark.parametrize("st", [_crowded(), full_study()], ids=["crowded", "full"])
@pytest.mark.parametrize("axis", ["size", "latency"])
def test_labels_do_not_overlap_and_name_every_candidate(st, axis):
    boxes, texts = _label_boxes(st, axis)
    for i, a in enumerate(boxes):
        for b in boxes[i + 1 :]:
            assert not a.overlaps(b), (texts, a, b)
    named = re.split(r"[,\s]+", " ".join(texts))
    plotted = {c.name for c in st.candidates if c.ok and c.metrics.accuracy_delta is not None}
    assert plotted <= set(named), (plotted, texts)


def test_candidates_at_one_point_share_a_label():
    _, texts = _label_boxes(_crowded(), "latency")
    shared = [t for t in texts if "prune-int8" in t]
    assert shared and "cluster-int8" in shared[0] and "qat-int8" in shared[0], texts


def test_each_plot_has_one_caption_and_no_title():
    from optimize.present.plots import captions, scatter_svg
    from optimize.present.report import render_html, render_markdown

    st = full_study()
    CAPTIONS = captions(st)
    svg = scatter_svg(st, "size")
    assert "Size vs accuracy" not in svg  # no title inside the figure: the caption says it
    page = render_html(st)
    for key, caption in CAPTIONS.items():
        assert page.count("<figcaption>" + caption.split(":")[0]) == 1, key
    md = render_markdown(st, images={"size_vs_accuracy": "size_vs_accuracy.svg"})
    assert md.count(CAPTIONS["size_vs_accuracy"].split(":")[0] + ":") == 1


def test_a_study_without_labels_plots_the_output_error():
    """No labels: the plots show each candidate's relative output error (the baseline at 0), axis inverted
    so better is up, and the caption says so; nothing is left unplotted."""
    from optimize.core.results import Fidelity, OutputFidelity
    from optimize.present.plots import captions, quality, scatter_svg, unplotted

    def unlabelled(c, rel):
        fid = Fidelity(
            reference="float32.tflite",
            samples=20,
            outputs=[OutputFidelity(name="y", mean_abs_diff=rel, std_abs_diff=0, max_abs_diff=rel, relative_error=rel)],
        )
        m = c.metrics.model_copy(update={"accuracy": None, "accuracy_delta": None, "fidelity": fid})
        return c.model_copy(update={"metrics": m})

    st = study(
        [
            unlabelled(candidate("float32"), 0.0),
            unlabelled(candidate("float16", "float16", size=78_000), 0.0002),
            unlabelled(candidate("int8", "int8", size=42_000), 0.128),
        ]
    )
    label, error = quality(st)
    assert "Output error" in label and error(st.candidates[2]) == pytest.approx(12.8)
    assert unplotted(st) == [] and "no labels" in captions(st)["size_vs_accuracy"]
    svg = scatter_svg(st, "size")
    assert svg is not None and "Output error vs float32" in svg and "int8" in svg


def test_a_partly_scored_study_plots_the_scored_and_names_the_rest():
    """Labels reach some candidates only (a zoo model's float16 reused without a score, say): the plot shows
    the scored ones, and the rest are listed as unplotted, never a crash."""
    from optimize.present.plots import scatter_svg, unplotted

    unscored = candidate("float16", "float16", size=78_000)
    unscored = unscored.model_copy(update={"metrics": unscored.metrics.model_copy(update={"accuracy_delta": None})})
    st = study([candidate("float32"), unscored, candidate("int8", "int8", size=42_000, delta=-0.01)])
    svg = scatter_svg(st, "size")
    assert svg is not None and "int8" in svg
    assert unplotted(st) == ["float16"]

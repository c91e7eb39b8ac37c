"""Study plots as SVG text: size vs accuracy and latency vs accuracy, Pareto front and choice marked.

matplotlib is imported inside the functions, and only its object-oriented `Figure` is used (no
pyplot, no backend switch), so a report never changes the plotting state of the caller's notebook.
"""

from __future__ import annotations

import io
import re
import textwrap

from optimize.core.results import Goals, Study, labelled

AXES = {
    "size": ("Size (kB, raw .tflite)", lambda c: c.metrics.size.bytes / 1000),
    "latency": ("Host-CPU latency p50 (ms)", lambda c: c.metrics.latency.p50_ms if c.metrics.latency else None),
}
FIGSIZE = (6.4, 4.2)  # inches
FONT = 8  # label font size, points


def _points_of_accuracy(c) -> float | None:
    """The accuracy change in points; None where this candidate has none (a study can be partly scored)."""
    d = c.metrics.accuracy_delta
    return None if d is None else d * 100


def quality(study: Study):
    """The y axis: the accuracy change in points where there are labels; without them, the worst output's
    relative error against the float32 baseline in % of its range (the baseline at 0), or None."""
    if labelled(study.candidates):
        return f"Accuracy change vs {study.baseline} (points)", _points_of_accuracy

    def error(c):
        if c.name == study.baseline:
            return 0.0
        f = c.metrics.fidelity
        return None if f is None or f.relative_error is None else f.relative_error * 100

    if all(error(c) is None for c in study.candidates if c.ok and c.name != study.baseline):
        return None
    return f"Output error vs {study.baseline} (% of its range; up is better)", error


def _marks(study: Study, rec) -> str:
    """What the plots mark, as drawn (`report.make_plots`): the Pareto front in orange where it has a point, and a
    red star only where a recommendation's choice is drawn."""
    from optimize.decide.choose import pareto_front

    drawn = {n for n, _, _ in _points(study, "size")}
    chosen = rec.chosen if rec is not None else None
    front = set(rec.pareto if rec is not None else pareto_front(study.candidates)) - {chosen}
    said = ["orange: the Pareto front"] if front & drawn else []
    if chosen in drawn:
        said.append(f"red star: {chosen}, the choice for {rec.target}")
    said.append("candidates at the same point share one label.")
    text = "; ".join(said)
    return text[0].upper() + text[1:]


def captions(study: Study, rec=None) -> dict[str, str]:
    """The one caption of each plot (the figure itself carries no title), for report.md and report.html: it says
    what is drawn (a red star only when a recommendation `rec` is marked: `report --target`)."""
    what = (
        "its accuracy change from the baseline, in points"
        if labelled(study.candidates)
        else "its worst output's mean |difference| from the float32 baseline, in % of that output's range "
        "(no labels; the axis points down so that better is up)"
    )
    marks = _marks(study, rec)
    return {
        "size_vs_accuracy": f"Size vs accuracy: each candidate's raw .tflite size against {what}. {marks}",
        "latency_vs_accuracy": f"Latency vs accuracy: host-CPU p50 latency against {what}. {marks}",
    }


def _points(study: Study, axis: str) -> list[tuple[str, float, float]]:
    """(name, x, y) for ok candidates that have both measurements (y: `quality`)."""
    pick, q = AXES[axis][1], quality(study)
    if q is None:
        return []
    out = []
    for c in study.candidates:
        if not c.ok:
            continue
        x, y = pick(c), q[1](c)
        if x is not None and y is not None:
            out.append((c.name, float(x), float(y)))
    return out


def unplotted(study: Study) -> list[str]:
    """Candidates that worked but have no quality figure to plot."""
    shown = {n for n, _, _ in _points(study, "size")}
    return [c.name for c in study.candidates if c.ok and c.name not in shown]


def scatter_svg(
    study: Study,
    axis: str,
    *,
    pareto: list[str] = (),
    chosen: str | None = None,
    goals: Goals | None = None,
) -> str | None:
    """One scatter plot as an inline-ready `<svg>` element, or None when nothing has both measurements."""
    points = _points(study, axis)
    if not points:
        return None
    import matplotlib
    from matplotlib.figure import Figure

    fig = Figure(figsize=FIGSIZE, layout="constrained")
    ax = fig.add_subplot()
    _scatter(ax, points, set(pareto), chosen)
    by_labels = labelled(study.candidates)
    _goal_lines(ax, axis, goals, by_labels)
    ax.set_xlabel(AXES[axis][0])
    ax.set_ylabel(quality(study)[0])
    if not by_labels:
        ax.invert_yaxis()  # less error is better: up, as on the accuracy plots
    ax.grid(True, alpha=0.3)
    _label(ax, points)
    ax.legend(fontsize=8, loc="best")
    buf = io.StringIO()
    # Distinct salt per plot keeps element ids unique when several SVGs share one HTML page.
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": f"optimize-{axis}"}):
        fig.savefig(buf, format="svg", metadata={"Date": None})
    svg = buf.getvalue()
    return _prefix_ids(svg[svg.index("<svg") :], axis)


def _scatter(ax, points: list[tuple[str, float, float]], front: set[str], chosen: str | None) -> None:
    """The candidates: other, Pareto front, chosen; labelled; log x when sizes span more than 20x."""
    from matplotlib.ticker import FuncFormatter

    groups = [
        ("other candidates", lambda n: n not in front and n != chosen, dict(marker="o", s=36, c="#90a4ae")),
        (
            "Pareto front",
            lambda n: n in front and n != chosen,
            dict(marker="o", s=70, c="#fb8c00", edgecolors="#6d3a00"),
        ),
        ("chosen", lambda n: n == chosen, dict(marker="*", s=260, c="#d32f2f", edgecolors="#4a0000")),
    ]
    for label, member, style in groups:
        pts = [p for p in points if member(p[0])]
        if pts:
            ax.scatter([p[1] for p in pts], [p[2] for p in pts], label=label, zorder=3, **style)
    xs = [p[1] for p in points]
    if min(xs) > 0 and max(xs) / min(xs) > 20:
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))


def _label(ax, points: list[tuple[str, float, float]]) -> None:
    """One label per group of candidates at (nearly) the same point, each placed where it covers no other
    label and no marker: the first free spot of a few around its point, else the least covered one."""
    ax.margins(x=0.12, y=0.15)  # room for labels at the edges
    ax.autoscale_view()
    frac = _to_axes(ax)
    groups = _groups([(n, *frac(x, y)) for n, x, y in points])
    w_pt, h_pt = FIGSIZE[0] * 72 * 0.8, FIGSIZE[1] * 72 * 0.75  # the axes' rough size in points
    markers = [(fx - 0.01, fy - 0.015, fx + 0.01, fy + 0.015) for _, fx, fy in groups]
    placed: list[tuple[float, float, float, float]] = []
    for names, fx, fy in sorted(groups, key=lambda g: (g[1], g[2])):
        text = textwrap.fill(names, 34, break_long_words=False)
        lines = text.split("\n")
        w, h = max(map(len, lines)) * FONT * 0.55 / w_pt, len(lines) * FONT * 1.3 / h_pt
        spots = [(dx, dy) for dy in (0.02, -0.02 - h, 0.06, -0.06 - h) for dx in (0.015, -0.015 - w, -w / 2)]
        best = min(
            spots, key=lambda d: _covered((fx + d[0], fy + d[1], fx + d[0] + w, fy + d[1] + h), placed + markers)
        )
        box = (fx + best[0], fy + best[1], fx + best[0] + w, fy + best[1] + h)
        placed.append(box)
        ax.annotate(text, (box[0], box[1]), xycoords="axes fraction", fontsize=FONT, va="bottom", ha="left")


def _to_axes(ax):
    """(x, y) in data units to the fraction of the axes (log x where the axis is logarithmic)."""
    import math

    (x0, x1), (y0, y1) = ax.get_xlim(), ax.get_ylim()
    log = ax.get_xscale() == "log"
    fx = (lambda v: math.log10(v)) if log else (lambda v: v)
    span_x, span_y = (fx(x1) - fx(x0)) or 1.0, (y1 - y0) or 1.0
    return lambda x, y: ((fx(x) - fx(x0)) / span_x, (y - y0) / span_y)


def _groups(points: list[tuple[str, float, float]], near: float = 0.02) -> list[tuple[str, float, float]]:
    """Candidates within `near` of each other (axes fraction, both ways) as one label: `int8, prune-int8`."""
    groups: list[list[tuple[str, float, float]]] = []
    for p in sorted(points, key=lambda p: (p[1], p[2])):
        g = next((g for g in groups if abs(g[0][1] - p[1]) < near and abs(g[0][2] - p[2]) < near), None)
        if g is None:
            groups.append([p])
        else:
            g.append(p)
    return [(", ".join(n for n, _, _ in g), g[0][1], g[0][2]) for g in groups]


def _covered(box: tuple[float, float, float, float], others: list[tuple[float, float, float, float]]) -> float:
    """How much of `box` other boxes cover, plus how far it sticks out of the axes (both in area)."""
    x0, y0, x1, y1 = box
    area = sum(max(0.0, min(x1, b[2]) - max(x0, b[0])) * max(0.0, min(y1, b[3]) - max(y0, b[1])) for b in others)
    out = (x1 - x0) * (y1 - y0) - max(0.0, min(x1, 1) - max(x0, 0)) * max(0.0, min(y1, 1) - max(y0, 0))
    return area + 2 * out


def _goal_lines(ax, axis: str, goals: Goals | None, labelled: bool = True) -> None:
    if goals is None:
        return
    if labelled and goals.max_accuracy_drop is not None:
        ax.axhline(-goals.max_accuracy_drop * 100, ls="--", c="#7b1fa2", lw=1, label="max accuracy drop")
    output_error = getattr(goals, "max_output_error", None)
    if not labelled and output_error is not None:
        ax.axhline(output_error * 100, ls="--", c="#7b1fa2", lw=1, label="max output error")
    limit = goals.max_size_bytes / 1000 if axis == "size" and goals.max_size_bytes else None
    limit = goals.max_latency_ms if axis == "latency" and goals.max_latency_ms else limit
    if limit is not None:
        ax.axvline(limit, ls=":", c="#7b1fa2", lw=1, label=f"max {axis}")


def _prefix_ids(svg: str, prefix: str) -> str:
    """Make every id (and every reference to one) unique to this plot, so two SVGs can share a page."""
    ids = set(re.findall(r'\bid="([^"]+)"', svg))
    return re.sub(
        r'(\bid="|url\(#|href="#)([^")]+)',
        lambda m: f"{m.group(1)}{prefix}-{m.group(2)}" if m.group(2) in ids else m.group(0),
        svg,
    )


def study_plots(
    study: Study, *, pareto: list[str] = (), chosen: str | None = None, goals: Goals | None = None
) -> dict[str, str]:
    """{'size_vs_accuracy': svg, 'latency_vs_accuracy': svg}, leaving out plots with nothing to draw."""
    out = {}
    for axis in AXES:
        svg = scatter_svg(study, axis, pareto=pareto, chosen=chosen, goals=goals)
        if svg is not None:
            out[f"{axis}_vs_accuracy"] = svg
    return out


def layer_chart(report, name: str, top: int = 15) -> str | None:
    """Horizontal bars: the error each op adds (and, where measured, the model's error with only that op
    kept float), for the worst `top` ops of a per-layer analysis. An inline-ready `<svg>`."""
    layers = report.layers[:top]
    if not layers:
        return None
    import matplotlib
    from matplotlib.figure import Figure

    labels = [f"#{le.op_index} {le.op}" for le in layers][::-1]
    added = [max(le.error_added, 0.0) for le in layers][::-1]
    fig = Figure(figsize=(6.4, 0.3 * len(layers) + 1.2), layout="constrained")
    ax = fig.add_subplot()
    ys = range(len(layers))
    ax.barh([y + 0.2 for y in ys], added, height=0.4, color="#fb8c00", label="error this op adds (relative)")
    measured = [(le.output_error_without if le.output_error_without is not None else 0.0) for le in layers][::-1]
    if any(measured):
        ax.barh(
            [y - 0.2 for y in ys], measured, height=0.4, color="#1565c0", label="model error if only this op is float"
        )
    ax.set_yticks(list(ys), labels, fontsize=8)
    ax.set_xlabel("error / output range")
    ax.legend(fontsize=8, loc="lower right")
    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": f"optimize-layers-{name}"}):
        fig.savefig(buf, format="svg", metadata={"Date": None})
    svg = buf.getvalue()
    return _prefix_ids(svg[svg.index("<svg") :], f"layers-{re.sub(r'[^A-Za-z0-9_-]', '_', name)}")

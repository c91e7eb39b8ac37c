"""Study plots as SVG text: size vs accuracy and latency vs accuracy, Pareto front and choice marked.

matplotlib is imported inside the functions, and only its object-oriented `Figure` is used (no
pyplot, no backend switch), so a report never changes the plotting state of the caller's notebook.
"""

from __future__ import annotations

import io
import re

from .results import Goals, Study

AXES = {
    "size": ("Size (kB, raw .tflite)", lambda c: c.metrics.size.bytes / 1000),
    "latency": ("Host-CPU latency p50 (ms)", lambda c: c.metrics.latency.p50_ms if c.metrics.latency else None),
}


def _points(study: Study, axis: str) -> list[tuple[str, float, float]]:
    """(name, x, accuracy change in points) for ok candidates that have both measurements."""
    pick = AXES[axis][1]
    out = []
    for c in study.candidates:
        if not c.ok or c.metrics.accuracy_delta is None:
            continue
        x = pick(c)
        if x is not None:
            out.append((c.name, float(x), c.metrics.accuracy_delta * 100))
    return out


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

    fig = Figure(figsize=(6.4, 4.2), layout="constrained")
    ax = fig.add_subplot()
    _scatter(ax, points, set(pareto), chosen)
    _goal_lines(ax, axis, goals)
    ax.set_xlabel(AXES[axis][0])
    ax.set_ylabel(f"Accuracy change vs {study.baseline} (points)")
    ax.set_title(f"{axis.capitalize()} vs accuracy")
    ax.grid(True, alpha=0.3)
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
    for i, (name, x, y) in enumerate(sorted(points, key=lambda p: p[1])):
        # Alternate above/below so neighbours with equal accuracy do not print over each other.
        ax.annotate(name, (x, y), textcoords="offset points", xytext=(5, 5 if i % 2 == 0 else -12), fontsize=8)
    xs = [p[1] for p in points]
    if min(xs) > 0 and max(xs) / min(xs) > 20:
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))


def _goal_lines(ax, axis: str, goals: Goals | None) -> None:
    if goals is None:
        return
    if goals.max_accuracy_drop is not None:
        ax.axhline(-goals.max_accuracy_drop * 100, ls="--", c="#7b1fa2", lw=1, label="max accuracy drop")
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

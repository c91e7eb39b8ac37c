"""A study as a report: Markdown beside SVG plots, and one self-contained HTML page.

The page holds the candidates table, the plots (size vs accuracy, latency vs accuracy, the Pareto
front highlighted, the chosen candidate marked), the delegate matrix as a coloured grid whose cells
carry the fallback reasons, and, given a recommendation, the decision path, the choice, every
rejection and the facts. Everything taken from the study is HTML-escaped; the page loads nothing
from outside (plots are inline SVG, styles inline). Pure Python apart from matplotlib, imported lazily.
"""

from __future__ import annotations

from pathlib import Path

from optimize.core.results import PHASES, Candidate, DelegateReport, Study, write_atomic
from optimize.core.vocab import Delegate
from optimize.decide import retrained
from optimize.decide.choose import Recommendation, pareto_front
from optimize.decide.explain import measured_on
from optimize.decide.retrained import MARK
from optimize.delegates.observe import OBSERVED
from optimize.present.lines import conversion_line, fmt_bytes, island_cost, island_groups

DELEGATE_COLUMNS = tuple(Delegate)
PLOT_TITLES = {"size_vs_accuracy": "Size vs accuracy", "latency_vs_accuracy": "Latency vs accuracy"}
HOST_NOTE = "Latency is host-CPU latency in the LiteRT interpreter, not a device figure."


# ------------------------------------------------------------------------------------ formatting
def _accuracy(c: Candidate) -> str:
    m = c.metrics
    if m is None or m.accuracy is None:
        return ""
    a = m.accuracy
    value = f"top-1 {a.top1 * 100:.2f}%" if a.top1 is not None else (f"MAE {a.mae:.4g}" if a.mae is not None else "")
    if m.accuracy_delta is not None:
        value += f" ({m.accuracy_delta * 100:+.2f} pt)"
    return value.strip()


def _fidelity(c: Candidate) -> str:
    """The worst output's figures against float32 (named when the model has several outputs)."""
    f = c.metrics.fidelity if c.metrics else None
    if f is None:
        return ""
    parts = []
    worst, least = f.worst(), f.least_agreeing()
    several = len(f.outputs) > 1
    if worst is not None:
        parts.append(f"rel err {worst.relative_error * 100:.2f}%" + (f" ({worst.name})" if several else ""))
    if least is not None:
        parts.append(f"agree {least.agreement * 100:.1f}%" + (f" ({least.name})" if several else ""))
    if f.outputs:
        parts.append(f"max |Δ| {max(o.max_abs_diff for o in f.outputs):.3g}")
    return ", ".join(parts)


def _latency(c: Candidate) -> str:
    lat = c.metrics.latency if c.metrics else None
    if lat is None:
        return ""
    return f"{lat.p50_ms:.3g} ms ({lat.threads} thr{', XNNPACK' if lat.xnnpack else ', no XNNPACK'})"


def _status(c: Candidate, rec: Recommendation | None, front: set[str]) -> str:
    if c.error:
        return "failed"
    if rec is not None and c.name == rec.chosen:
        return "chosen"
    reason = next((r.reason for r in rec.rejected if r.candidate == c.name), None) if rec else None
    if reason:
        return f"rejected: {reason}"
    return "Pareto front" if c.name in front else ""


def _rows(study: Study, rec: Recommendation | None) -> list[tuple[str, ...]]:
    """One tuple of display strings per candidate, shared by the Markdown and HTML tables."""
    front = set(rec.pareto if rec else pareto_front(study.candidates))
    rows = []
    for c in study.candidates:
        size = c.metrics.size if c.metrics else None
        scheme = c.scheme if c.io == "float" else f"{c.scheme} ({c.io} I/O)"
        rows.append(
            (
                c.name + (MARK if c.retrained else ""),
                scheme,
                c.backend or "",
                fmt_bytes(size.bytes) if size else "",
                fmt_bytes(size.gzip_bytes) if size else "",
                _accuracy(c),
                _fidelity(c),
                _latency(c),
                _status(c, rec, front),
                c.error or "",
            )
        )
    return rows


HEADERS = (
    "Candidate",
    "Scheme",
    "Backend",
    "Size",
    "Gzip",
    "Accuracy (Δ vs baseline)",
    "Fidelity",
    "Latency p50",
    "Status",
    "Error",
)


def _cell_text(r: DelegateReport) -> str:
    built = " (build fails: the whole model on the CPU)" if r.veto_code == "build-failure" else ""
    parts = f"{r.partitions} partition{'s' if r.partitions != 1 else ''}"
    return f"{r.verdict}{built}: {r.nodes_delegated}/{r.nodes_total} nodes, {parts}"


def _reasons(r: DelegateReport) -> list[str]:
    """Why nodes stay on the CPU: the veto, or the node that blocks (`delegates.blocking`), each CPU node with
    its reason, then the hints."""
    from optimize.delegates.blocking import blocker, words

    out = [f"vetoed: {r.vetoed}"] if r.vetoed else []
    node = None if r.vetoed else blocker(r)
    if node is not None and node is not r.cpu_nodes[0]:  # the first listed is only a consequence of it
        out.append(words(r))
    out += [f"#{n.index} {n.op} v{n.version}: {n.reason}" for n in r.cpu_nodes]
    out += [f"hint: {h}" for h in r.hints]
    return out


# -------------------------------------------------------------------------------------- Markdown
def _md(text: str) -> str:
    """One Markdown table cell or list item: no pipes, newlines or raw HTML tags from the study."""
    text = str(text).replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _md_candidates(study: Study, rec: Recommendation | None) -> list[str]:
    lines = ["## Candidates", "", "| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    lines += ["| " + " | ".join(_md(x) for x in row) + " |" for row in _rows(study, rec)]
    for said in (measured_on(study.candidates), retrained.legend(study.candidates)):
        lines += ["", _md(said)] if said else []
    return lines + (["", "The study has no candidates."] if not study.candidates else [])


def delegate_columns(study: Study) -> tuple[str, ...]:
    """The delegate columns, plus the GPU observed in the runtime when the sweep observed it (--observe gpu)."""
    observed = tuple(k for k in OBSERVED.values() if any(k in c.delegates for c in study.candidates))
    return DELEGATE_COLUMNS + observed


def _md_matrix(study: Study) -> list[str]:
    columns = delegate_columns(study)
    lines = ["## Delegate matrix", "", "| Candidate | " + " | ".join(columns) + " |"]
    lines.append("|---|" + "---|" * len(columns))
    for c in study.candidates:
        cells = []
        for d in columns:
            r = c.delegates.get(d)
            why = "; ".join(_reasons(r)) if r else ""
            cells.append("-" if r is None else _md(f"{_cell_text(r)} ({r.source})" + (f": {why}" if why else "")))
        lines.append(f"| {_md(c.name)} | " + " | ".join(cells) + " |")
    return lines


def _md_names(names: list[str]) -> str:
    return ", ".join(_md(n) for n in names) or "none"


def _md_answer(rec: Recommendation) -> list[str]:
    """The choice (or why there is none), why, the default guard's warnings and what to try."""
    if rec.chosen:
        keep = f": keep the float32 file ({_md(rec.keep_float32)})" if rec.keep_float32 else ""
        lines = [f"**Chosen: {_md(rec.chosen)}**{keep}"]
    else:
        lines = [f"**{_md(rec.headline or 'No candidate meets the goals.')}**"]
    lines += [""] + [f"Why: {_md(w)}" for w in rec.why] if rec.why else []
    lines += [""] + [f"- **WARNING:** {_md(w)}" for w in rec.warnings] if rec.warnings else []
    lines += ["", "What to try:", ""] + [f"- {_md(t)}" for t in rec.to_try] if rec.to_try else []
    return lines


def _md_recommendation(rec: Recommendation) -> list[str]:
    lines = [f"## Recommendation for {rec.target}", "", *_md_answer(rec)]
    lines += [x for said in (rec.retrained, rec.measured_on) if said for x in ("", _md(said))]
    lines += ["", "Decision path (rule of thumb):", ""]
    lines += [f"{i}. {_md(q.question)} {_md(q.answer)} → {_md(q.decided)}" for i, q in enumerate(rec.advice.path, 1)]
    if rec.chosen_recipe_toml:
        fence = "~~~~" if "```" in rec.chosen_recipe_toml else "```"
        lines += ["", "Recipe:", "", fence + "toml", rec.chosen_recipe_toml.rstrip(), fence]
    lines += ["", f"Ranked: {_md_names(rec.ranked)}.", "", f"Pareto front: {_md_names(rec.pareto)}."]
    if rec.rejected:
        lines += ["", "Rejected:", ""] + [f"- {_md(r.candidate)}: {_md(r.reason)}" for r in rec.rejected]
    if rec.facts:
        lines += ["", "Good to know:", ""] + [f"- {_md(f)}" for f in rec.facts]
    return lines


def ship_rows(study: Study) -> tuple[str, list[tuple[str, str]], list[str]]:
    """Per common target, the file to ship (what `sweep` ends with): shown whether or not --target was given."""
    from optimize.present.report_text import ship_summary

    within, answers, warnings = ship_summary(study, None)
    return within, [(str(t), a) for t, a in answers], warnings


def _md_ship(study: Study) -> list[str]:
    within, answers, warnings = ship_rows(study)
    lines = ["## What to ship", "", f"The smallest file each target runs fully, {_md(within)}; `--target` marks", ""]
    lines[-2] += " one target's choice here, and `optimize recommend` says why."
    lines += ["| Target | File |", "|---|---|", *(f"| {t} | {_md(a)} |" for t, a in answers)]
    return lines + ([""] + [f"- WARNING: {_md(w)}" for w in warnings] if warnings else [])


def contract_rows(study: Study) -> list[dict]:
    """Per working candidate, how to feed its file and read its answers, and its TFLite metadata (read from it)."""
    from optimize.models.contract import feed_line

    return [
        {
            "name": c.name,
            "inputs": [feed_line(t) for t in c.contract.inputs],
            "outputs": [feed_line(t) for t in c.contract.outputs],
            "metadata": c.contract.metadata or "none",
        }
        for c in study.candidates
        if c.ok and c.contract is not None
    ]


def _md_contracts(rows: list[dict]) -> list[str]:
    lines = ["## How to feed each file", "", CONTRACT_NOTE, ""]
    lines += ["| Candidate | Inputs | Outputs | TFLite metadata |", "|---|---|---|---|"]
    for r in rows:
        ins, outs = "<br>".join(_md(x) for x in r["inputs"]), "<br>".join(_md(x) for x in r["outputs"])
        lines.append(f"| {_md(r['name'])} | {ins} | {outs} | {_md(r['metadata'])} |")
    return lines


def _md_shipping(study: Study) -> list[list[str]]:
    """What to ship per target, and how to feed each file (when the study has what they need)."""
    out = [_md_ship(study)] if any(c.ok for c in study.candidates) else []
    rows = contract_rows(study)
    return out + ([_md_contracts(rows)] if rows else [])


CONTRACT_NOTE = (
    "Read from each file: an integer tensor is fed q = round(x / scale) + zero point and read back as "
    "x = (q - zero point) * scale; the float range is what scale and zero point represent, or for a float "
    "input the range of the data it was measured on."
)


def conversion_rows(c) -> list[tuple[str, str, str, str]]:
    """Per output of a PyTorch or ONNX model's float .tflite against the source runtime: name, relative error,
    max |diff|, top-1 agreement (what converting cost, before any quantization)."""
    fid = c.fidelity
    if fid is None:
        return []
    return [
        (o.name, f"{o.relative_error:.1e}" if o.relative_error is not None else "-", f"{o.max_abs_diff:.1e}",
         f"{o.top1_agreement:.1%}" if o.top1_agreement is not None else "-")
        for o in fid.outputs
    ]  # fmt: skip


def _md_conversion(c) -> list[str]:
    """The conversion of a PyTorch or ONNX model: its own error, apart from quantization's."""

    lines = ["## Conversion", "", _md(conversion_line(c)), ""]
    rows = conversion_rows(c)
    if rows:
        lines += ["| output | rel err | max abs diff | agree |", "|---|---|---|---|"]
        lines += ["| " + " | ".join(_md(x) for x in r) + " |" for r in rows]
    if c.facts:
        lines += ["", "What converting changed: " + _md("; ".join(c.facts)) + "."]
    return lines


def _md_environment(study: Study) -> list[str]:
    env = study.environment
    versions = ", ".join(f"{k} {v}" for k, v in sorted(env.versions.items()))
    where = f"{_md(env.host)}, {_md(env.platform)}, Python {_md(env.python)}"
    return ["## Environment", "", f"{where}, {env.cpu_count} CPUs, {env.threads} threads; {_md(versions)}."]


def _md_rescue(study: Study) -> list[str]:
    """Each candidate's accuracy-rescue steps: the transform, whether it was kept, the layers it moved."""
    lines = [
        "## Accuracy rescue at 8 bits",
        "",
        "| Candidate | Step | Kept | What it did | Layers: int8 error before -> after |",
    ]
    lines.append("|---|---|---|---|---|")
    for c in study.candidates:
        for r in c.rescue:
            moved = "; ".join(f"{_md(lc.op)} {lc.before:.4f} -> {lc.after:.4f}" for lc in r.layers[:3]) or "-"
            kept = "yes" if r.kept else "no"
            lines.append(f"| {_md(c.name)} | {_md(r.transform)} | {kept} | {_md(r.detail)} | {moved} |")
    return lines


def phase_table(study: Study) -> tuple[list[str], list[list[str]]]:
    """Where the time went: (headers, rows) of seconds per candidate and phase (results.PHASES, the phases
    any candidate spent time in), a total row last; no rows when no candidate recorded phases."""
    spent = [c for c in study.candidates if c.phases]
    used = [p for p in PHASES if any(p in c.phases for c in spent)]
    rows = [
        [c.name + (" (cached)" if c.cached else ""), f"{c.seconds:.2f}"] + [f"{c.phases.get(p, 0.0):.2f}" for p in used]
        for c in spent
    ]
    if rows:
        rows.append(
            ["all", f"{sum(c.seconds for c in spent):.2f}"]
            + [f"{sum(c.phases.get(p, 0.0) for c in spent):.2f}" for p in used]
        )
    return ["candidate", "total"] + used, rows


def _md_phases(study: Study) -> list[str]:
    headers, rows = phase_table(study)
    wall = (
        f"The sweep took {study.seconds:.1f} s of wall time (opening the model and data and planning: "
        f"{study.open_seconds or 0:.1f} s); candidates produced in parallel overlap."
        if study.seconds is not None
        else ""
    )
    lines = ["## Where the time went", "", f"Seconds per candidate and phase. {wall}".strip(), ""]
    lines.append("| " + " | ".join(headers) + " |")
    lines.append("|" + "---|" * len(headers))
    lines += ["| " + " | ".join(_md(x) for x in r) + " |" for r in rows]
    return lines


def _md_islands(study: Study) -> list[str]:
    """Each quantized candidate's float islands: why each is there, and what they cost."""
    base = study.candidate(study.baseline) if any(c.name == study.baseline for c in study.candidates) else None
    lines = ["## Float islands", "", "| Candidate | Cost | Islands (why) |", "|---|---|---|"]
    for c in study.candidates:
        if c.ok and c.islands:
            groups = "<br>".join(_md(g) for g in island_groups(c))
            lines.append(f"| {_md(c.name)} | {_md(island_cost(c, base))} | {groups} |")
    return lines


def _html_islands(study: Study) -> list[dict]:
    base = study.candidate(study.baseline) if any(c.name == study.baseline for c in study.candidates) else None
    return [
        {"name": c.name, "cost": island_cost(c, base), "islands": c.islands}
        for c in study.candidates
        if c.ok and c.islands
    ]


def _md_per_candidate(study: Study) -> list[list[str]]:
    """The sections a study has only when its candidates did such work: the graph fitted to its targets, the
    accuracy rescue's steps, the float islands, output contracts that changed."""
    out = []
    if any(c.ok and c.fit is not None and c.fit.kept for c in study.candidates):
        out.append(_md_fit(study))
    if any(c.rescue for c in study.candidates):
        out.append(_md_rescue(study))
    if any(c.ok and c.islands for c in study.candidates):
        out.append(_md_islands(study))
    if any(c.ok and c.output_contract for c in study.candidates):
        out.append(_md_changed_outputs(study))
    return out


def _md_changed_outputs(study: Study) -> list[str]:
    """The candidates whose outputs differ from float32's by design, and how to read them as before."""
    lines = ["## Output contracts that changed", "", "| Candidate | Output | What changed |", "|---|---|---|"]
    for c in study.candidates:
        if c.ok and c.output_contract is not None:
            k = c.output_contract
            lines.append(f"| {_md(c.name)} | {_md(k.output)} | {_md(k.words)} |")
    return lines


def _md_fit(study: Study) -> list[str]:
    """Which rewrite of the float graph bought which target, each with how far the outputs moved (issue 45)."""
    fitted = [c for c in study.candidates if c.ok and c.fit is not None and c.fit.kept]
    rec = next((c.fit for c in fitted if c.name == "fit-float32"), fitted[0].fit)
    lines = ["## The graph fitted to its targets", "", f"Made from it: {', '.join(_md(c.name) for c in fitted)}."]
    lines += ["", f"Targets it bought: {_md(', '.join(rec.bought) or 'none')}.", ""]
    lines += [r"| Rewrite | Node | For | Max \|diff\| (of range) | What it did |", "|---|---|---|---|---|"]
    for s in rec.kept:
        moved = "-" if s.max_abs_diff is None else f"{s.max_abs_diff:.1e} ({(s.relative_diff or 0):.1e})"
        lines.append(f"| {_md(s.rewrite)} | {_md(s.node)} | {_md(', '.join(s.targets))} | {moved} | {_md(s.detail)} |")
    return lines


def render_markdown(study: Study, rec: Recommendation | None = None, images: dict[str, str] | None = None) -> str:
    """The report as Markdown. `images` maps plot keys to relative file paths (write_report writes them).
    Everything that comes from a study is escaped (names, reasons, facts)."""
    head = f"Study created {_md(study.created)}; data: {_md(study.data or 'none')}; baseline: {_md(study.baseline)}."
    sections = [[f"# Optimization report: {_md(study.model)}", "", head, "", f"_{HOST_NOTE}_"]]
    if study.conversion is not None:
        sections.append(_md_conversion(study.conversion))
    sections.append(_md_candidates(study, rec))
    sections += _md_shipping(study)
    if images:
        from optimize.present.plots import captions

        said = captions(study, rec)
        figures = [f"![{PLOT_TITLES.get(k, k)}]({_md(v)})\n\n_{_md(said.get(k, k))}_" for k, v in images.items()]
        sections.append(["## Plots", "", "\n\n".join(figures)])
    sections.append(_md_matrix(study))
    sections += _md_per_candidate(study)
    if rec is not None:
        sections.append(_md_recommendation(rec))
    if phase_table(study)[1]:
        sections.append(_md_phases(study))
    sections.append(_md_environment(study))
    return "\n\n".join("\n".join(sec) for sec in sections) + "\n"


# ------------------------------------------------------------------------------------------ HTML
CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:2em;color:#212121;max-width:1400px}
table{border-collapse:collapse;margin:1em 0;font-size:14px}
th,td{border:1px solid #cfd8dc;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#eceff1}
tr.chosen td{background:#fff8e1;font-weight:600}
tr.failed td{color:#b71c1c}
td.full{background:#c8e6c9} td.partial{background:#ffe0b2} td.none{background:#ffcdd2} td.missing{background:#f5f5f5;color:#9e9e9e}
th.target{outline:3px solid #1565c0}
td.num{text-align:right;white-space:nowrap}
figure{display:inline-block;margin:0 1em 1em 0} figure svg{width:560px;height:auto}
.note{color:#546e7a;font-size:13px} details{font-size:12px} code,pre{background:#f5f5f5}
"""


def make_plots(study: Study, rec: Recommendation | None = None) -> dict[str, str]:
    """The study's plots as SVG text, keyed by name (matplotlib is imported here, not before)."""
    from optimize.present.plots import study_plots

    pareto = rec.pareto if rec else pareto_front(study.candidates)
    return study_plots(study, pareto=pareto, chosen=rec.chosen if rec else None, goals=rec.goals if rec else None)


def _matrix(study: Study) -> list[dict]:
    """Per candidate, per delegate: verdict, text, source and reasons (None where not checked)."""
    rows = []
    for c in study.candidates:
        cells = []
        for d in delegate_columns(study):
            r = c.delegates.get(d)
            if r is None:
                cells.append(None)
                continue
            summary = f"{len(r.cpu_nodes)} op(s) on CPU" if r.cpu_nodes else "why"
            cells.append(
                {
                    "verdict": r.verdict,
                    "text": _cell_text(r),
                    "source": r.source,
                    "reasons": _reasons(r),
                    "summary": summary,
                }
            )
        rows.append({"name": c.name, "cells": cells})
    return rows


def _debug_sections(study: Study, charts: bool) -> list[dict]:
    """One section per candidate that carries a per-layer analysis (a selective search, a debug run)."""
    from optimize.present.plots import layer_chart

    out = []
    for c in study.candidates:
        if c.debug is None:
            continue
        chart = layer_chart(c.debug, c.name) if charts else None
        out.append(
            {"name": c.name, "report": c.debug, "layers": c.debug.layers[:25], "search": c.search, "chart": chart}
        )
    return out


def _goals_text(rec: Recommendation | None) -> str:
    return ", ".join(f"{k}={v}" for k, v in rec.goals.model_dump().items() if v is not None) if rec else ""


def _html_rows(study: Study, rec: Recommendation | None) -> list[dict]:
    def cls(c: Candidate) -> str:
        return "chosen" if rec and c.name == rec.chosen else ("failed" if c.error else "")

    return [
        {"name": c.name, "cls": cls(c), "cells": r} for c, r in zip(study.candidates, _rows(study, rec), strict=True)
    ]


def _captions(study: Study, rec: Recommendation | None) -> dict[str, str]:
    from optimize.present.plots import captions

    return captions(study, rec)


def _unplotted(study: Study) -> list[str]:
    from optimize.present.plots import unplotted

    return unplotted(study)


def _template():
    from jinja2 import Environment, PackageLoader, select_autoescape

    env = Environment(
        loader=PackageLoader("optimize.present", "templates"), autoescape=select_autoescape(["html", "j2"])
    )
    return env.get_template("report.html.j2")


def render_html(study: Study, rec: Recommendation | None = None, plots: dict[str, str] | None = None) -> str:
    """The report as one self-contained HTML page (inline CSS and SVG; nothing loaded from outside),
    rendered from templates/report.html.j2 with every study string escaped."""
    from markupsafe import Markup

    from optimize.core.vocab import TARGET_DELEGATE

    charts = plots is None or bool(plots)
    plots = make_plots(study, rec) if plots is None else plots
    debug = [{**d, "chart": Markup(d["chart"]) if d["chart"] else None} for d in _debug_sections(study, charts)]
    env = study.environment
    return _template().render(
        study=study,
        rec=rec,
        css=Markup(CSS),
        host_note=" ".join(
            x for x in (HOST_NOTE, measured_on(study.candidates), retrained.legend(study.candidates)) if x
        ),
        goals=_goals_text(rec),
        headers=HEADERS,
        rows=_html_rows(study, rec),
        plots={k: Markup(v) for k, v in plots.items()},  # our own SVG, made by matplotlib from escaped text
        plot_titles=_captions(study, rec),
        ship=ship_rows(study) if any(c.ok for c in study.candidates) else None,
        contracts=contract_rows(study),
        contract_note=CONTRACT_NOTE,
        unplotted=_unplotted(study),
        debug=debug,
        rescued=[c for c in study.candidates if c.rescue],
        islands=_html_islands(study),
        delegates=delegate_columns(study),
        target_col=TARGET_DELEGATE[rec.target] if rec else None,
        matrix=_matrix(study),
        phases=phase_table(study),
        conversion=_html_conversion(study),
        env=env,
        versions=", ".join(f"{k} {v}" for k, v in sorted(env.versions.items())),
    )


def _html_conversion(study: Study) -> dict | None:
    if study.conversion is None:
        return None

    c = study.conversion
    return {"line": conversion_line(c), "rows": conversion_rows(c), "facts": "; ".join(c.facts)}


def write_report(study: Study, out_dir: Path, recommendation: Recommendation | None = None) -> dict[str, Path]:
    """Write report.md (with its SVG plots beside it) and a self-contained report.html, atomically.

    Returns {"markdown": path, "html": path, <plot name>: path, ...}.
    """
    from optimize.core.paths import output_dir

    out_dir = output_dir(out_dir)
    plots = make_plots(study, recommendation)
    paths: dict[str, Path] = {}
    for key, svg in plots.items():
        paths[key] = write_atomic(out_dir / f"{key}.svg", svg.encode())
    images = {k: f"{k}.svg" for k in plots}
    paths["markdown"] = write_atomic(out_dir / "report.md", render_markdown(study, recommendation, images).encode())
    paths["html"] = write_atomic(out_dir / "report.html", render_html(study, recommendation, plots).encode())
    return paths


def write_report_for(study_path: Path, out_dir: Path | None = None, target: str | None = None) -> dict[str, Path]:
    """Load a study, recommend for `target` if given, and write its report (beside the study by default)."""
    from optimize.core.results import load_study
    from optimize.decide.choose import recommend

    study_path = Path(study_path)
    st = load_study(study_path)
    rec = recommend(st, target) if target else None
    folder = out_dir or (study_path if study_path.is_dir() else study_path.parent)
    return write_report(st, folder, rec)

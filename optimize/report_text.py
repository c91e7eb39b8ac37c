"""Terminal rendering of candidates, studies, metrics, advice and recommendations. Pure presentation."""

from __future__ import annotations

from pathlib import Path

from .advice import describe
from .results import Candidate, Metrics, Study
from .vocab import Delegate

DELEGATE_COLS = tuple(Delegate)


def _console():
    from rich.console import Console

    return Console(width=160)


def _kb(n: int | None) -> str:
    return "-" if n is None else f"{n / 1024:,.1f} KB"


def _pct(x: float | None, signed: bool = False) -> str:
    if x is None:
        return "-"
    return f"{x * 100:+.2f}" if signed else f"{x * 100:.2f}%"


def _delegate_cell(c: Candidate, name: str) -> str:
    r = c.delegates.get(name)
    if r is None:
        return "-"
    color = {"full": "green", "partial": "yellow", "none": "red"}[r.verdict]
    return f"[{color}]{r.nodes_delegated}/{r.nodes_total}[/{color}]" + (f" p{r.partitions}" if r.partitions > 1 else "")


def candidates_table(cands: list[Candidate], baseline: Candidate | None = None, title: str = ""):
    from rich.table import Table

    base_size = baseline.metrics.size if baseline and baseline.ok else None
    base_lat = baseline.metrics.latency.p50_ms if baseline and baseline.ok and baseline.metrics.latency else None
    t = Table(title=title or None, show_lines=False)
    for col in ("candidate", "size", "x", "gzip", "x", "top-1", "Δ pts", "agree", "p50 ms", "x", "mem"):
        t.add_column(col, justify="left" if col == "candidate" else "right")
    show_delegates = any(c.delegates for c in cands)
    if show_delegates:
        for d in DELEGATE_COLS:
            t.add_column(d, justify="right")
    for c in cands:
        if not c.ok:
            row = [c.name, "[red]failed[/red]"] + [""] * 9
            t.add_row(*row, *([""] * len(DELEGATE_COLS) if show_delegates else []))
            continue
        m = c.metrics
        lat = m.latency.p50_ms if m.latency else None
        row = [
            c.name,
            _kb(m.size.bytes),
            f"{m.size.bytes / base_size.bytes:.2f}" if base_size else "",
            _kb(m.size.gzip_bytes),
            f"{m.size.gzip_bytes / base_size.gzip_bytes:.2f}" if base_size else "",
            _pct(m.accuracy.top1) if m.accuracy and m.accuracy.top1 is not None else "-",
            _pct(m.accuracy_delta, signed=True),
            _pct(m.fidelity.top1_agreement) if m.fidelity and m.fidelity.top1_agreement is not None else "-",
            f"{lat:.3f}" if lat is not None else "-",
            f"{lat / base_lat:.2f}" if lat and base_lat else "",
            _kb(m.memory.peak_rss_bytes) if m.memory else "-",
        ]
        if show_delegates:
            row += [_delegate_cell(c, d) for d in DELEGATE_COLS]
        t.add_row(*row)
    return t


def print_study(study: Study, folder: Path | None = None) -> None:
    con = _console()
    base = next((c for c in study.candidates if c.name == study.baseline), None)
    lat = base.metrics.latency if base and base.ok and base.metrics.latency else None
    title = f"{study.model}: {len(study.candidates)} candidates"
    con.print(candidates_table(study.candidates, base, title))
    if lat:
        con.print(
            f"Latency: {lat.runtime}, {lat.threads} threads, p50 of {lat.runs} runs after {lat.warmup_runs} "
            "warm-up. x = ratio to float32. Delegates: nodes delegated/total (p = partitions); "
            "xnnpack is observed in the runtime, the others predicted from each delegate's rules."
        )
    for c in study.candidates:
        if c.error:
            con.print(f"[red]{c.name} failed:[/red] {c.error}")
        for note in c.notes:
            con.print(f"[dim]{c.name}: {note}[/dim]")
    if folder:
        con.print(f"Wrote {len(study.candidates)} artifacts and {Path(folder) / 'study.json'}")


def print_candidates(cands: list[Candidate], folder: Path | None = None) -> None:
    con = _console()
    con.print(candidates_table(cands))
    for c in cands:
        if c.error:
            con.print(f"[red]{c.name} failed:[/red] {c.error}")
        if c.skipped_layers:
            con.print(f"{c.name}: layers left as they were: {', '.join(c.skipped_layers)}")
        for note in c.notes:
            con.print(f"[dim]{c.name}: {note}[/dim]")
        if c.artifact and folder:
            con.print(f"Wrote {Path(folder) / c.artifact}")


def print_metrics(name: str, m: Metrics) -> None:
    con = _console()
    con.print(f"[bold]{name}[/bold]")
    con.print(f"  size      {m.size.bytes:,} bytes ({m.size.gzip_bytes:,} gzipped)")
    if m.accuracy:
        a = m.accuracy
        if a.top1 is not None:
            con.print(f"  accuracy  top-1 {_pct(a.top1)}, top-{a.k} {_pct(a.topk)} on {a.samples} samples")
        else:
            con.print(f"  accuracy  MAE {a.mae:.5g} on {a.samples} samples")
    if m.fidelity:
        for o in m.fidelity.outputs:
            con.print(
                f"  fidelity  {o.name}: |diff| mean {o.mean_abs_diff:.4g}, std {o.std_abs_diff:.4g}, "
                f"max {o.max_abs_diff:.4g} vs {m.fidelity.reference}"
            )
        if m.fidelity.top1_agreement is not None:
            con.print(f"            top-1 agreement {_pct(m.fidelity.top1_agreement)}")
    if m.latency:
        lt = m.latency
        con.print(
            f"  latency   p50 {lt.p50_ms:.3f} ms, p90 {lt.p90_ms:.3f}, mean {lt.mean_ms:.3f} ± {lt.std_ms:.3f} "
            f"({lt.runs} runs, {lt.threads} threads, XNNPACK {'on' if lt.xnnpack else 'off'}); "
            f"init {lt.init_ms:.1f} ms, first {lt.first_ms:.2f} ms [{lt.runtime}]"
        )
    if m.memory:
        con.print(f"  memory    peak {_kb(m.memory.peak_rss_bytes)} ({m.memory.method})")


def print_debug(report) -> None:
    """The per-layer error table: worst first, with what keeping each op in float buys where measured."""
    from rich.table import Table

    t = Table(title=f"{report.scheme}: output error {report.output_error:.4f} over {report.samples} samples")
    for col in ("#", "op", "tensor", "rmse/scale", "rel rmse", "added", "weights", "if float"):
        t.add_column(col, justify="left" if col in ("op", "tensor") else "right")
    for le in report.layers[:25]:
        t.add_row(
            str(le.op_index),
            le.op,
            le.tensor,
            "-" if le.rmse_over_scale is None else f"{le.rmse_over_scale:.2f}",
            f"{le.relative_rmse:.4f}",
            f"{le.error_added:+.4f}",
            f"{le.weight_share * 100:.1f}%",
            "-" if le.output_error_without is None else f"{le.output_error_without:.4f}",
        )
    con = _console()
    con.print(t)
    if len(report.layers) > 25:
        con.print(f"... and {len(report.layers) - 25} more op(s) (use --json for all)")
    if report.kept_float:
        con.print("Left in float by the quantizer (unsupported): " + ", ".join(report.kept_float))
    con.print(
        "rmse/scale ~0.29 is pure rounding; above ~0.7 points at clipping or a poor range. 'if float': the model's "
        "output error with everything quantized except that op."
    )


def format_advice(advice) -> str:
    """The decision tree's answer as terminal text."""
    lines = [f"Target: {advice.target}", "", "Decision path:"]
    for i, q in enumerate(advice.path, 1):
        lines.append(f"  {i}. {q.question} {q.answer} -> {q.decided}")
    lines += ["", f"Recommended pipeline: {describe(advice.pipeline)}", "", advice.recipe_toml.rstrip()]
    if advice.alternatives:
        lines += ["", "Alternatives:"] + [f"  - {a}" for a in advice.alternatives]
    if advice.facts:
        lines += ["", "Good to know:"] + [f"  - {f}" for f in advice.facts]
    return "\n".join(lines) + "\n"


def format_recommendation(rec) -> str:
    """A recommendation (or bare advice) as terminal text: path, pipeline, choice, ranking, rejections, facts."""
    from .advice import Advice

    if isinstance(rec, Advice):
        return format_advice(rec)
    goals = ", ".join(f"{k}={v}" for k, v in rec.goals.model_dump().items() if v is not None)
    adv = rec.advice
    lines = [f"Target: {rec.target}    Goals: {goals}", "", "Decision path (rule of thumb):"]
    lines += [f"  {i}. {q.question} {q.answer} -> {q.decided}" for i, q in enumerate(adv.path, 1)]
    lines.append(f"  Rule-of-thumb pipeline: {describe(adv.pipeline)}")
    lines.append("")
    if rec.chosen:
        lines.append(f"Chosen from measurements: {rec.chosen}")
        lines += ["", rec.chosen_recipe_toml.rstrip()] if rec.chosen_recipe_toml else []
    else:
        lines.append("No measured candidate meets the goals.")
    if len(rec.ranked) > 1:
        lines += ["", "Also eligible, in order: " + ", ".join(rec.ranked[1:])]
    lines += ["", "Pareto front (size, latency, accuracy): " + (", ".join(rec.pareto) or "none")]
    if rec.rejected:
        lines += ["", "Rejected:"] + [f"  - {r.candidate}: {r.reason}" for r in rec.rejected]
    if adv.alternatives:
        lines += ["", "Alternatives to try:"] + [f"  - {a}" for a in adv.alternatives]
    if rec.facts:
        lines += ["", "Good to know:"] + [f"  - {f}" for f in rec.facts]
    return "\n".join(lines) + "\n"

"""Terminal rendering of candidates, studies, metrics, advice and recommendations. Pure presentation."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .advice import describe
from .delegates.observe import OBSERVED
from .results import Candidate, Metrics, Study
from .vocab import Delegate, Target


def esc(text: str) -> str:
    """Study text (names, errors, notes, tensor names) printed as it is: never read as rich markup, and
    never obeyed by the terminal (a newline or escape sequence in it is shown: optimize.shown)."""
    from rich.markup import escape

    from .shown import escape as shown

    return escape(shown(text))


DELEGATE_COLS = tuple(Delegate)
OBSERVED_GPU = OBSERVED[Delegate.GPU]


def _console(width: int | None = None):
    """A console at the terminal's width (COLUMNS, else 80 when not a terminal), or the width asked."""
    from rich.console import Console

    return Console(width=width, soft_wrap=False)


def _kb(n: int | None) -> str:
    return "-" if n is None else f"{n / 1024:,.1f} KB"


def _pct(x: float | None, signed: bool = False) -> str:
    if x is None:
        return "-"
    return f"{x * 100:+.2f}" if signed else f"{x * 100:.2f}%"


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}" if a is not None and b else ""


_COLOR = {"full": "green", "partial": "yellow", "none": "red"}
_LETTER = {d: ("C" if d is Delegate.COREML else str(d)[0].upper()) for d in Delegate}  # G N H C X


def _delegate_cell(c: Candidate, name: str) -> str:
    r = c.delegates.get(name)
    if r is None:
        return "-"
    color = _COLOR[r.verdict]
    built = "!" if r.veto_code == "build-failure" else ""  # the delegate would fail building its graph
    cell = f"[{color}]{r.nodes_delegated}/{r.nodes_total}{built}[/{color}]"
    return cell + (f" p{r.partitions}" if r.partitions > 1 else "")


def _delegates_compact(c: Candidate) -> str:
    """All delegates in one cell: a letter each, green full, yellow partial, red none (G N H C X)."""
    cells = []
    for d in DELEGATE_COLS:
        r = c.delegates.get(d)
        cells.append("·" if r is None else f"[{_COLOR[r.verdict]}]{_LETTER[d]}[/{_COLOR[r.verdict]}]")
    return "".join(cells)


@dataclass(frozen=True)
class _Base:
    """What each row is compared with: the baseline's size, latency and error."""

    size: object = None
    p50: float | None = None
    mae: float | None = None

    @classmethod
    def of(cls, baseline: Candidate | None) -> _Base:
        if baseline is None or not baseline.ok:
            return cls()
        m = baseline.metrics
        return cls(m.size, baseline.p50_ms, m.accuracy.mae if m.accuracy else None)


def _accuracy(c: Candidate, base: _Base) -> str:
    a = c.metrics.accuracy
    if a is None:
        return "-"
    return _pct(a.top1) if a.top1 is not None else (f"MAE {a.mae:.4g}" if a.mae is not None else "-")


def _delta(c: Candidate, base: _Base) -> str:
    """Classification: the top-1 change in points; regression: the error as a multiple of float32's."""
    m = c.metrics
    if m.error_ratio is not None:
        return f"x{m.error_ratio:.2f}"
    if m.accuracy is not None and m.accuracy.mae is not None:
        return f"x{m.accuracy.mae / base.mae:.2f}" if base.mae else "-"
    return _pct(m.accuracy_delta, signed=True)


def _agree(c: Candidate, base: _Base) -> str:
    f = c.metrics.fidelity
    return _pct(f.top1_agreement) if f and f.top1_agreement is not None else "-"


@dataclass(frozen=True)
class _Col:
    header: str
    cell: Callable[[Candidate, _Base], str]
    drop: int  # 0: always shown; higher numbers are dropped first when the terminal is narrow


#: The sweep table's columns. Drop order when narrow (highest first): the ratio columns, the gzip size,
#: top-1 agreement, peak memory, then the accuracy value (its change stays); the five delegate columns
#: merge into one compact cell first of all. The candidate name is never cut.
COLUMNS: tuple[_Col, ...] = (
    _Col("candidate", lambda c, b: c.name, 0),
    _Col("size", lambda c, b: _kb(c.metrics.size.bytes), 0),
    _Col("x", lambda c, b: _ratio(c.metrics.size.bytes, b.size.bytes if b.size else None), 3),
    _Col("gzip", lambda c, b: _kb(c.metrics.size.gzip_bytes), 5),
    _Col("x", lambda c, b: _ratio(c.metrics.size.gzip_bytes, b.size.gzip_bytes if b.size else None), 7),
    _Col("acc", _accuracy, 2),
    _Col("Δ", _delta, 0),
    _Col("agree", _agree, 4),
    _Col("p50 ms", lambda c, b: "-" if c.p50_ms is None else f"{c.p50_ms:.3f}", 0),
    _Col("x", lambda c, b: _ratio(c.p50_ms, b.p50), 6),
    _Col("mem", lambda c, b: _kb(c.metrics.memory.peak_rss_bytes) if c.metrics.memory else "-", 3),
)


def _plain(text: str) -> int:
    import re

    return len(re.sub(r"\[/?[a-z ]+\]", "", text))


def _fit(columns: list[_Col], cells: list[list[str]], width: int) -> list[int]:
    """Indices of the columns kept so the table fits `width` (rich: 3 characters per column + 1)."""
    keep = list(range(len(columns)))

    def need(idx: list[int]) -> int:
        return sum(max(_plain(columns[i].header), *(_plain(r[i]) for r in cells)) + 3 for i in idx) + 1

    for level in sorted({c.drop for c in columns if c.drop}, reverse=True):
        if need(keep) <= width:
            break
        keep = [i for i in keep if columns[i].drop != level]
    return keep


def _columns(cands: list[Candidate], width: int | None, wide: bool) -> list[_Col]:
    """The columns to offer: the delegates as five columns when there is room, else one compact cell."""
    columns = list(COLUMNS)
    if not any(c.delegates for c in cands):
        return columns
    # The GPU observed in the runtime (sweep --observe gpu), beside the rules' prediction.
    seen = [_Col("gpu seen", lambda c, b: _delegate_cell(c, OBSERVED_GPU), 0)] if _observed(cands) else []
    if wide or width is None or width >= 150:
        return columns + [_Col(d, lambda c, b, d=d: _delegate_cell(c, d), 0) for d in DELEGATE_COLS] + seen
    return columns + [_Col("GNHCX", lambda c, b: _delegates_compact(c), 0)] + seen


def _observed(cands: list[Candidate]) -> bool:
    return any(OBSERVED_GPU in c.delegates for c in cands)


def _cells(cands: list[Candidate], columns: list[_Col], base: _Base) -> list[list[str]]:
    rows = []
    for c in cands:
        if c.ok:
            rows.append([col.cell(c, base) for col in columns])
        else:
            rows.append([c.name, "[red]failed[/red]"] + [""] * (len(columns) - 2))
    return rows


def candidates_table(
    cands: list[Candidate],
    baseline: Candidate | None = None,
    title: str = "",
    width: int | None = None,
    wide: bool = False,
):
    """The candidates as a rich Table that fits `width` columns (all columns with `wide`)."""
    from rich.table import Table

    columns = _columns(cands, width, wide)
    cells = _cells(cands, columns, _Base.of(baseline))
    keep = list(range(len(columns))) if wide or width is None else _fit(columns, cells, width)
    t = Table(title=title or None, show_lines=False)
    longest = max((len(c.name) for c in cands), default=9)
    for i in keep:
        if i == 0:  # names are never cut
            t.add_column(columns[i].header, no_wrap=True, min_width=max(longest, 9))
        else:
            t.add_column(columns[i].header, justify="right", no_wrap=True, overflow="ellipsis")
    for row in cells:
        t.add_row(*(row[i] for i in keep))
    return t


def next_steps(study: Study, folder: Path | None) -> list[str]:
    """What to do after a sweep: the best candidate per common target (within the default guard, whose
    warnings are red and start with WARNING), and the commands that go further. Lines are rich markup."""
    from .choose import recommend

    where = str(Path(folder) / "study.json") if folder else "study.json"
    lines, warnings, guard = [], [], None
    for target in (Target.CPU, Target.GPU, Target.COREML, Target.NNAPI, Target.HEXAGON, Target.MCU):
        rec = recommend(study, target, folder=folder)
        guard = guard or rec.guard
        if rec.chosen:
            keep = " (keep the float32 file)" if rec.keep_float32 else ""
            lines.append(f"  {target:8} {esc(rec.chosen)}{keep}")
        elif rec.guard and rec.warnings:
            lines.append(f"  {target:8} none passes the default guard")
        warnings += [w for w in rec.warnings if w not in warnings]
    lines += [f"[red]WARNING: {esc(w)}[/red]" for w in warnings]
    lines.append(f"Next: optimize recommend {esc(where)} --target T [--max-accuracy-drop 0.01]   (why, and what else)")
    lines.append(f"      optimize report {esc(where)}   (report.md + report.html with plots)")
    if len(lines) <= 2:
        return lines
    within = f"within the default guard ({guard}; no accuracy goal given)" if guard else "no accuracy goal given"
    return [f"Smallest candidate each target runs fully, {within}:"] + lines


def _legend(study: Study) -> str | None:
    base = next((c for c in study.candidates if c.name == study.baseline and c.ok), None)
    lat = base.metrics.latency if base is not None else None
    if lat is None:
        return None
    return (
        f"Latency: {lat.runtime}, {lat.threads} threads, p50 of {lat.runs} runs after {lat.warmup_runs} "
        "warm-up. x = ratio to float32. Delegates: nodes delegated/total (p = partitions), or G N H C X = "
        "GPU, NNAPI, Hexagon, Core ML, XNNPACK (green full, yellow partial, red none; ! = the delegate would "
        "fail while building its graph, so the whole model runs on the CPU); xnnpack is observed in the "
        "runtime, the others predicted from each delegate's rules"
        + (
            "; gpu seen: LiteRT's GPU accelerator (ML Drift) observed on this machine, beside the classic GPU "
            "delegate's predicted column."
            if _observed(study.candidates)
            else "."
        )
    )


def _print_outcome(con, c: Candidate) -> None:
    if c.error:
        con.print(f"[red]{esc(c.name)} failed:[/red] {esc(c.error)}")
    for note in c.notes:
        con.print(f"[dim]{esc(c.name)}: {esc(note)}[/dim]")


def print_study(study: Study, folder: Path | None = None, wide: bool = False, width: int | None = None) -> None:
    """The sweep table (fitted to the terminal), its legend, failures and notes, and what to do next."""
    con = _console(width)
    base = next((c for c in study.candidates if c.name == study.baseline), None)
    title = f"{esc(study.model)}: {len(study.candidates)} candidates"
    con.print(candidates_table(study.candidates, base, title, width=con.width, wide=wide))
    legend = _legend(study)
    if legend:
        con.print(legend)
    for c in study.candidates:
        _print_outcome(con, c)
    if folder:
        written = [c for c in study.candidates if c.artifact and (Path(folder) / c.artifact).is_file()]
        con.print(f"Wrote {len(written)} artifact(s) and {Path(folder) / 'study.json'}")
    if any(c.ok for c in study.candidates):
        for line in next_steps(study, folder):
            con.print(line)


def print_candidates(cands: list[Candidate], folder: Path | None = None, wide: bool = False) -> None:
    con = _console()
    con.print(candidates_table(cands, width=con.width, wide=wide))
    for c in cands:
        _print_outcome(con, c)
        if c.skipped_layers:
            con.print(f"{esc(c.name)}: layers left as they were: {esc(', '.join(c.skipped_layers))}")
        if c.artifact and folder:
            con.print(f"Wrote {Path(folder) / c.artifact}")


def print_metrics(name: str, m: Metrics) -> None:
    con = _console()
    con.print(f"[bold]{esc(name)}[/bold]")
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
            esc(le.tensor),
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
        con.print("Left in float by the quantizer (unsupported): " + esc(", ".join(report.kept_float)))
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


def _answer(rec) -> list[str]:
    """The measured answer: the choice (or why there is none), its recipe or the float32 file to keep, why
    it differs from the rule of thumb, the default guard's warnings (in words: `WARNING:`), what to try."""
    lines = [rec.headline or (f"Chosen from measurements: {rec.chosen}" if rec.chosen else "No choice.")]
    lines += ["", rec.chosen_recipe_toml.rstrip()] if rec.chosen_recipe_toml and not rec.keep_float32 else []
    lines += [""] + [f"Why: {w}" for w in rec.why] if rec.why else []
    lines += [""] + [f"WARNING: {w}" for w in rec.warnings] if rec.warnings else []
    lines += ["", "What to try:"] + [f"  - {t}" for t in rec.to_try] if rec.to_try else []
    return lines


def format_recommendation(rec) -> str:
    """A recommendation (or bare advice) as terminal text: path, pipeline, choice, ranking, rejections, facts."""
    from .advice import Advice

    if isinstance(rec, Advice):
        return format_advice(rec)
    goals = ", ".join(f"{k}={v}" for k, v in rec.goals.model_dump().items() if v is not None)
    adv = rec.advice
    lines = [f"Target: {rec.target}    Goals: {goals}"]
    if rec.guard:
        lines.append(f"No accuracy goal given: the default guard applies ({rec.guard}).")
    lines += ["", "Decision path (rule of thumb):"]
    lines += [f"  {i}. {q.question} {q.answer} -> {q.decided}" for i, q in enumerate(adv.path, 1)]
    lines.append(f"  Rule-of-thumb pipeline: {describe(adv.pipeline)}")
    lines += ["", *_answer(rec)]
    if len(rec.ranked) > 1:
        lines += ["", "Also eligible, in order: " + ", ".join(rec.ranked[1:])]
    lines += ["", "Pareto front (size, latency, accuracy): " + (", ".join(rec.pareto) or "none")]
    if rec.rejected:
        lines += ["", "Rejected:"] + [f"  - {r.candidate}: {r.reason}" for r in rec.rejected]
    if rec.alternatives:
        lines += ["", "Alternatives:"] + [f"  - {a}" for a in rec.alternatives]
    if rec.facts:
        lines += ["", "Good to know:"] + [f"  - {f}" for f in rec.facts]
    return "\n".join(lines) + "\n"


def print_zoo(result, folder: Path | None = None, width: int | None = None) -> None:
    """The zoo table: per model and target, the pick with its size, latency and accuracy against the
    model's float32 baseline; then what failed, one line each."""
    from rich.table import Table

    con = _console(width)
    table = Table(title=f"zoo: {len(result.models)} models ({esc(result.executor)})", title_justify="left")
    for col, just in (("model", "left"), ("target", "left"), ("pick", "left"), ("size x", "right")):
        table.add_column(col, justify=just, overflow="fold")
    for col in ("p50 x", "acc Δ", "failed"):
        table.add_column(col, justify="right")
    for e in result.models:
        for i, p in enumerate(e.picks):
            table.add_row(
                esc(e.name) if i == 0 else "",
                str(p.target),
                esc(p.candidate or f"none ({p.why_none})"),
                f"{p.size_ratio:.2f}" if p.size_ratio is not None else "-",
                f"{p.latency_ratio:.2f}" if p.latency_ratio is not None else "-",
                _pct(p.accuracy_delta, signed=True),
                f"{len(e.failed)}/{e.candidates}" if i == 0 else "",
            )
    con.print(table)
    for e in result.models:
        for name, why in e.failed.items():
            con.print(f"{esc(e.name)}/{esc(name)}: {esc(why[:160])}", highlight=False)
        if len(e.timing_nodes) > 1:
            con.print(f"{esc(e.name)}: latencies from {len(e.timing_nodes)} machines: {esc(', '.join(e.timing_nodes))}")
    if folder:
        con.print(f"Wrote {len(result.models)} studies and {Path(folder) / 'zoo.json'}")

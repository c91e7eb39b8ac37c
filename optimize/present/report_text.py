"""Terminal rendering of candidates, studies, metrics, advice and recommendations. Pure presentation."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from optimize.core.results import FEW_SAMPLES, PHASES, Candidate, Metrics, Study, labelled
from optimize.core.shown import clip
from optimize.core.vocab import TARGET_DELEGATE, Delegate, Target
from optimize.decide import retrained
from optimize.decide.advice import describe
from optimize.decide.explain import measured_on
from optimize.decide.guard import has_labelled_goal, unlabelled_outputs
from optimize.decide.retrained import MARK
from optimize.decide.speed import SLOWER
from optimize.delegates.observe import OBSERVED
from optimize.measure.noise import ratio
from optimize.present.lines import conversion_line, fmt_bytes, island_cost, island_groups, samples_of
from optimize.present.usage import contract_lines, integer_edges


def esc(text: str) -> str:
    """Study text (names, errors, notes, tensor names) printed as it is: never read as rich markup, and
    never obeyed by the terminal (a newline or escape sequence in it is shown: optimize.core.shown)."""
    from rich.markup import escape

    from optimize.core.shown import escape as shown

    return escape(shown(text))


DELEGATE_COLS = tuple(Delegate)
REASON_CHARS = 240  # a zoo's failure reason, cut at a word (study.json keeps it whole)
OBSERVED_GPU = OBSERVED[Delegate.GPU]


class _Trimmed:
    """stdout as a rich console writes to it, less the blanks rich leaves at the end of a line (a centred
    title's padding, the space a wrapped line broke at): nothing a reader sees, and noise in a pipe or a diff."""

    _END = re.compile(r"[ \t]+((?:\x1b\[[0-9;]*m)*)(?=\n)")

    def __init__(self, stream) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(self._END.sub(r"\1", text))
        return len(text)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def _console(width: int | None = None):
    """A console at the terminal's width (COLUMNS, else 80 when not a terminal), or the width asked."""
    import sys

    from rich.console import Console

    return Console(width=width, soft_wrap=False, file=_Trimmed(sys.stdout))


def _lines(con, text: str, hang: int = 0, style: str = "") -> None:
    """Plain program text (names in it shown, never obeyed), wrapped at spaces to the console's width with
    its continuation lines `hang` columns in (rich would start them at column 0); `style` colours it where
    colour shows."""
    from rich.text import Text

    from optimize.core.shown import escape, wrap

    lines = wrap(escape(text), con.width, hang=hang).split("\n")
    # a path is never split: one too long to stand indented stands at column 0, where it fits if anything does
    text = "\n".join(line.lstrip() if len(line) > con.width else line for line in lines)
    con.print(Text(text, style=style), soft_wrap=True, highlight=False)


def _wrote(con, text: str) -> None:
    """A "Wrote <path>" line: wrapped at spaces to the console's width, a path never split (a path longer than a
    line stands whole on its own line, to be copied; optimize.core.shown.wrap), never read as markup."""
    from optimize.core.shown import escape, wrap

    con.print(wrap(escape(text), con.width), soft_wrap=True, markup=False, highlight=False)


def _kb(n: int | None) -> str:
    return "-" if n is None else fmt_bytes(n)


def _pct(x: float | None, signed: bool = False) -> str:
    if x is None:
        return "-"
    return f"{x * 100:+.2f}" if signed else f"{x * 100:.2f}%"


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}" if a is not None and b else "-"


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


def verdict_glyph(c: Candidate, delegate: str) -> str:
    """One character per delegate that reads without colour: its letter in capitals when it takes the
    whole model, in small letters when part of it, `-` for none, `!` when it would fail while building
    its graph (everything on the CPU), `.` when not checked."""
    r = c.delegates.get(delegate)
    if r is None:
        return "."
    if r.veto_code == "build-failure":
        return "!"
    letter = _LETTER.get(delegate, str(delegate)[0].upper())
    return {"full": letter, "partial": letter.lower()}.get(r.verdict, "-")


def _delegates_compact(c: Candidate) -> str:
    """All delegates in one cell, a glyph each (verdict_glyph), coloured as well where colour shows."""
    cells = []
    for d in DELEGATE_COLS:
        r = c.delegates.get(d)
        glyph = verdict_glyph(c, d)
        cells.append(glyph if r is None else f"[{_COLOR[r.verdict]}]{glyph}[/{_COLOR[r.verdict]}]")
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


def _thin(c: Candidate) -> str:
    """A star on accuracy measured on fewer than FEW_SAMPLES test samples (a 5-sample file tests on one)."""
    a = c.metrics.accuracy
    return "*" if a is not None and a.samples < FEW_SAMPLES else ""


def _accuracy(c: Candidate, base: _Base) -> str:
    a = c.metrics.accuracy
    if a is None:
        return "-"
    shown = _pct(a.top1) if a.top1 is not None else (f"MAE {a.mae:.4g}" if a.mae is not None else "-")
    return shown + _thin(c) if shown != "-" else shown


def _delta(c: Candidate, base: _Base) -> str:
    """Classification: the top-1 change in points; regression: the error as a multiple of float32's."""
    m = c.metrics
    if m.error_ratio is not None:
        return f"x{m.error_ratio:.2f}" + _thin(c)
    if m.accuracy is not None and m.accuracy.mae is not None:
        return f"x{m.accuracy.mae / base.mae:.2f}" + _thin(c) if base.mae else "-"
    shown = _pct(m.accuracy_delta, signed=True)
    return shown + _thin(c) if shown != "-" else shown


def _few(c: Candidate) -> str:
    f = c.metrics.fidelity
    return "*" if f is not None and f.few_samples else ""  # a rough figure: the legend says so


def _others(f) -> bool:
    """Whether fidelity judges only the outputs the labels do not score (labels on one, none on others)."""
    return any(o.labelled for o in f.outputs) and any(not o.labelled for o in f.outputs)


def _agree(c: Candidate, base: _Base) -> str:
    """The lowest agreement among the outputs fidelity judges (top-1 for classes, decisions at 0.5 for sigmoid
    outputs): what an agreement goal, the default guard's included, decides on."""
    f = c.metrics.fidelity
    least = f.least_agreeing(_others(f)) if f else None
    return _pct(least.agreement) + _few(c) if least is not None else "-"


def _rel_err(c: Candidate, base: _Base) -> str:
    """The worst relative error against the float reference among the outputs fidelity judges (what a
    label-free goal, the default guard's included, decides on)."""
    f = c.metrics.fidelity
    worst = f.worst(_others(f)) if f is not None else None
    return "-" if worst is None else f"{worst.relative_error * 100:.2f}%{_few(c)}"


def _kept(c: Candidate, base: _Base) -> str:
    """A detector's share of float32's detections kept (what its guard judges), or a mask's IoU with float32's."""
    f = c.metrics.fidelity
    det = f.detection if f is not None else None
    if det is not None and det.kept_fraction is not None:
        return f"{det.kept_fraction * 100:.1f}%{_few(c) or ('*' if det.few else '')}"
    ious = [o.iou for o in f.outputs if o.iou is not None] if f is not None else []
    return f"{min(ious) * 100:.1f}%{_few(c)}" if ious else "-"


def _size_x(c: Candidate, base: _Base) -> str:
    """Size over the baseline's; without a baseline (one quantize run), weight bytes over their float32."""
    if base.size is not None:
        return _ratio(c.metrics.size.bytes, base.size.bytes)
    comp = c.composition
    return f"{comp.shrink:.2f}" if comp is not None and comp.float32_equivalent_bytes else "-"


def _float_ops(c: Candidate, base: _Base) -> str:
    """A quantized candidate's ops computing in float, of all its ops (its float islands)."""
    comp = c.composition
    if comp is None or not comp.compute_ops or c.scheme not in ("int8", "int16x8"):
        return "-"
    return f"{comp.float_compute_count}/{comp.compute_ops}"


@dataclass(frozen=True)
class _Col:
    header: str
    cell: Callable[[Candidate, _Base], str]
    drop: int  # 0: always shown; higher numbers are dropped first when the terminal is narrow
    name: str = ""  # how the note on dropped columns names it (default: the header)

    @property
    def label(self) -> str:
        return self.name or self.header


def _sparse(c: Candidate) -> bool:
    return any(s.technique in ("prune", "cluster") for s in c.steps)


def _study_has(cands: list[Candidate]) -> dict[str, bool]:
    """What the columns depend on: labels, outputs the labels do not score, class outputs, pruned/clustered
    candidates, peak memory."""
    ok = [c for c in cands if c.ok]
    return {
        "labels": labelled(ok) or not ok,
        "unlabelled": bool(unlabelled_outputs(ok)[0]),
        "classes": any(c.metrics.fidelity and c.metrics.fidelity.least_agreeing() is not None for c in ok),
        "sparse": any(map(_sparse, cands)),
        "memory": any(c.metrics.memory for c in ok),
        "islands": any(c.islands for c in ok),
        "detections": any(c.metrics.fidelity and c.metrics.fidelity.detection for c in ok),
        "masks": any(c.metrics.fidelity and any(o.iou is not None for o in c.metrics.fidelity.outputs) for c in ok),
    }


def table_columns(cands: list[Candidate], every: bool = False) -> list[_Col]:
    """The columns this study needs (`every`: all of them), each with its drop order when the terminal is
    narrow (highest goes first). Chosen by what matters here: the gzip size is never dropped when a
    pruned or clustered candidate exists (its whole benefit is there), unless the figures that decide (the
    agreement beside the relative error) need its room; without labels, or for outputs the labels do not
    score, the fidelity to float32 (rel err, and agreement where an output decides) is what the guard
    judges, and is never dropped. The candidate name is never cut."""
    found = _study_has(cands)
    has = {k: v or every for k, v in found.items()}
    # without labels, or with outputs the labels do not score, fidelity (the worst output's) is the only word
    # on some output's quality: kept, so a candidate that breaks an output nobody labelled shows it
    fidelity = 4 if has["labels"] and not found["unlabelled"] else 0
    deciding = fidelity == 0 and has["classes"]  # agreement judges some output: it keeps its column
    gzip = (1 if deciding else 0) if has["sparse"] else 5
    cols = [
        _Col("candidate", lambda c, b: esc(c.name) + (MARK if c.retrained else ""), 0),
        _Col("size", lambda c, b: _kb(c.metrics.size.bytes), 0),
        _Col("x", _size_x, 3, "size x"),
        _Col("gzip", lambda c, b: _kb(c.metrics.size.gzip_bytes), gzip),
        _Col("x", lambda c, b: _ratio(c.metrics.size.gzip_bytes, b.size.gzip_bytes if b.size else None), 7, "gzip x"),
    ]
    cols += [_Col("acc", _accuracy, 2), _Col("Δ", _delta, 0)] if has["labels"] else []
    # agreement decides as much as rel err does (a 5.55% rel err beside 34% top-1 agreement): kept as long as it is
    cols += [_Col("rel err", _rel_err, fidelity)] + ([_Col("agree", _agree, fidelity)] if has["classes"] else [])
    cols += _task_columns(found)
    cols += [_Col("float", _float_ops, 4, "float ops")] if has["islands"] else []
    cols += _latency_columns()
    if has["memory"]:
        cols.append(_Col("mem", lambda c, b: _kb(c.metrics.memory.peak_rss_bytes) if c.metrics.memory else "-", 3))
    return cols


def _latency_columns() -> list[_Col]:
    """Host-CPU p50, its spread (dropped before accuracy when the terminal is narrow: the legend says its
    range), and its ratio to float32's."""
    return [
        _Col("p50 ms", lambda c, b: "-" if c.p50_ms is None else f"{c.p50_ms:.3f}", 0),
        _Col("±", _spread, 3, "p50 ±"),
        _Col("x", lambda c, b: _ratio(c.p50_ms, b.p50), 6, "p50 x"),
    ]


def _spread(c: Candidate, base: _Base) -> str:
    """The host-CPU p50's spread: `4%`, the half-width of its ~95% interval over the rounds (the legend says
    the range when the column has no room)."""
    lat = c.metrics.latency
    spread = lat.spread if lat is not None else None
    return "-" if spread is None else f"{spread * 100:.0f}%"


def _task_columns(found: dict[str, bool]) -> list[_Col]:
    """A detector's detections kept (a mask's IoU): what its guard judges, never dropped."""
    if not (found["detections"] or found["masks"]):
        return []
    return [_Col("kept" if found["detections"] else "IoU", _kept, 0, "detections kept")]


def _plain(text: str) -> int:
    import re

    return len(re.sub(r"\[/?[a-z ]+\]", "", text).replace("\\[", "["))


def _need(columns: list[_Col], cells: list[list[str]], idx: list[int]) -> int:
    """Columns the table takes with these columns (rich: 3 characters per column + 1)."""
    return sum(max(_plain(columns[i].header), *(_plain(r[i]) for r in cells)) + 3 for i in idx) + 1


def _fit(columns: list[_Col], cells: list[list[str]], width: int, skip: set[int] = frozenset()) -> list[int]:
    """Indices of the columns kept so the table fits `width` (those in `skip` are not shown anyway)."""
    keep = [i for i in range(len(columns)) if i not in skip]
    for level in sorted({c.drop for c in columns if c.drop}, reverse=True):
        if _need(columns, cells, keep) <= width:
            break
        keep = [i for i in keep if columns[i].drop != level]
    return keep


def _columns(cands: list[Candidate], width: int | None, wide: bool) -> list[_Col]:
    """The columns to offer: the delegates as five columns when there is room, else one compact cell."""
    columns = table_columns(cands, every=wide)
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
            rows.append([esc(c.name), "[red]failed[/red]"] + [""] * (len(columns) - 2))
    return rows


def _table(cands: list[Candidate], columns: list[_Col], cells: list[list[str]], keep: list[int], title: str):
    from rich.table import Table

    t = Table(title=title or None, show_lines=False)
    longest = max((len(esc(c.name)) for c in cands), default=9)
    for i in keep:
        if i == 0:  # names are never cut
            t.add_column(columns[i].header, no_wrap=True, min_width=max(longest, 9))
        else:
            t.add_column(columns[i].header, justify="right", no_wrap=True)
    for row in cells:
        t.add_row(*(row[i] for i in keep))
    return t


def _chunks(columns: list[_Col], cells: list[list[str]], width: int) -> list[list[int]]:
    """Every column, in as many tables as it takes to fit `width`, each starting with the candidate."""
    groups: list[list[int]] = [[0]]
    for i in range(1, len(columns)):
        if len(groups[-1]) > 1 and _need(columns, cells, [*groups[-1], i]) > width:
            groups.append([0])
        groups[-1].append(i)
    return groups


def _unmeasured(cands: list[Candidate], cells: list[list[str]]) -> set[int]:
    """Columns where no candidate that worked has a figure (no data, no baseline): not shown at all."""
    rows = [r for r, c in zip(cells, cands, strict=True) if c.ok]
    return {i for i in range(1, len(cells[0]) if cells else 0) if rows and all(r[i] == "-" for r in rows)}


def candidates_tables(
    cands: list[Candidate],
    baseline: Candidate | None = None,
    title: str = "",
    width: int | None = None,
    wide: bool = False,
) -> tuple[list, list[str]]:
    """The candidates as rich Tables that fit `width` columns, and the names of the columns left out.
    With `wide` every column is shown, in as many tables as it takes to fit."""
    columns = _columns(cands, width, wide)
    if baseline is None:  # one run's candidate: its size ratio is of weight bytes, named apart from "x"
        columns = [replace(c, header="w x", name="weights x") if c.label == "size x" else c for c in columns]
    cells = _cells(cands, columns, _Base.of(baseline))
    if width is None:
        return [_table(cands, columns, cells, list(range(len(columns))), title)], []
    if wide:
        groups = _chunks(columns, cells, width)
        return [_table(cands, columns, cells, g, title if i == 0 else "") for i, g in enumerate(groups)], []
    empty = _unmeasured(cands, cells)
    keep = [i for i in _fit(columns, cells, width, skip=empty) if i not in empty]
    dropped = [columns[i].label for i in range(len(columns)) if i not in keep and i not in empty]
    return [_table(cands, columns, cells, keep, title)], dropped


def candidates_table(cands: list[Candidate], baseline=None, title: str = "", width: int | None = None, wide=False):
    """The candidates as one rich Table: fitted to `width` columns, or every column with `wide`."""
    return candidates_tables(cands, baseline, title, width=None if wide else width)[0][0]


def _print_tables(con, cands: list[Candidate], baseline: Candidate | None, title: str, wide: bool) -> None:
    tables, dropped = candidates_tables(cands, baseline, title, width=con.width, wide=wide)
    for t in tables:
        con.print(t)
    if dropped:
        con.print(f"Left out at {con.width} columns: {', '.join(dropped)}; --wide shows every column.")


#: The targets the sweep's closing summary answers for, in the order it lists them.
SHIP_TARGETS = (Target.CPU, Target.GPU, Target.COREML, Target.NNAPI, Target.HEXAGON, Target.MCU)
#: An output folder longer than this is said once above the files, which are then named alone.
SHORT_FOLDER = 24


def next_steps(study: Study, folder: Path | None) -> list[str]:
    """What to do after a sweep, as plain lines: the commands that go further, then the file to ship for
    every common target (the smallest candidate it runs fully, within the default guard), or what keeps
    each candidate off it; then the guard's warnings (lines that start with WARNING)."""
    where = str(Path(folder) / "study.json") if folder else "study.json"
    # files by their path while it is short enough to copy from the line, else by name, the folder said once
    by_name = folder is not None and len(str(folder)) > SHORT_FOLDER
    within, answers, warnings = ship_summary(study, None if by_name else folder, folder)
    speed = (
        "the cpu's no slower than float32, the others on size and quality (host-CPU latency predicts no accelerator)"
    )
    return [
        f"Next: optimize recommend {where} --target T   (why, and what else)",
        f"      optimize report {where}   (report.md, report.html, plots)",
        f"What to ship{f' (in {folder})' if by_name else ''}: the smallest file each target runs fully, {within}; "
        f"{speed}:",
        *(f"  {target:8} {answer}" for target, answer in answers),
        *fit_lines(study),
        *(f"WARNING: {w}" for w in warnings),
    ]


def ship_summary(study: Study, shown: Path | None, folder: Path | None = None):
    """What `sweep` ends with and `report` shows: (the guard in words, [(target, the file to ship and why, or
    what keeps every candidate off it)], the guard's warnings). `shown`: the folder the files are named in."""
    from optimize.decide.choose import recommend

    answers, warnings, guard = [], [], None
    for target in SHIP_TARGETS:
        rec = recommend(study, target, folder=folder)
        guard = guard or rec.guard
        answers.append((target, _ship(study, target, rec, shown)))
        warnings += [w for w in rec.warnings if w not in warnings]
    within = f"within the default guard ({guard}; no accuracy goal given)" if guard else "no accuracy goal given"
    return within, answers, warnings


def fit_lines(study: Study) -> list[str]:
    """Which rewrite of the float graph bought which target (`fit-*` candidates), and how far the outputs
    moved: one line, or none when the sweep fitted nothing."""
    fitted = [c for c in study.candidates if c.ok and c.fit is not None and c.fit.bought]
    if not fitted:
        return []
    rec = next((c.fit for c in fitted if c.name == "fit-float32"), fitted[0].fit)
    per = [f"{t} by {', '.join(f'{s.rewrite} ({s.node})' for s in rec.kept if t in s.targets)}" for t in rec.bought]
    worst = max((s.max_abs_diff or 0.0 for s in rec.kept), default=0.0)
    moved = "bit for bit" if worst == 0 else f"max |diff| {worst:.1e}"
    named = f"; named option {', '.join(rec.options)}: the model's inputs change" if rec.options else ""
    return [
        f"  fitted   {'; '.join(per)}: the fit-* files, from the float graph rewritten for it "
        f"(outputs as float32's, {moved}, on {rec.samples} samples{named})"
    ]


def _ship(study: Study, target: Target, rec, folder: Path | None) -> str:
    """One target's answer: the file and why in a few words, or why nothing is (the default guard, or the
    blocker of the candidate that comes closest to running fully)."""
    if rec.keep_float32:
        keep = rec.keep_float32 if folder is not None else Path(rec.keep_float32).name
        return f"{keep} (keep the float32 file: nothing smaller passes)"
    if rec.chosen:
        return _chosen(study, rec, target, folder)
    if rec.guard and rec.warnings:
        return "none passes the default guard (see WARNING below)"
    return f"nothing runs fully on {target}: {_blocker(study, target, rec)}"


def _chosen(study: Study, rec, target: Target, folder: Path | None) -> str:
    """The file to ship and why in a few words: its size, its quality (a detector's detections kept) on how many
    samples, the retrained mark, the CPU tail the target leaves, an output contract that changed, what size cost in
    speed, and for an integer-I/O pick the scale and zero point its caller quantizes with."""
    c = study.candidate(rec.chosen)
    base = next((b for b in study.candidates if b.name == study.baseline), None)
    path = Path(folder) / c.artifact if folder and c.artifact else Path(c.artifact or f"{c.name}.tflite")
    b = _Base.of(base)
    ratio = f"{_ratio(c.metrics.size.bytes, b.size.bytes if b.size else None)}x float32's size"
    n = samples_of(c)
    quality = _quality(c, b) + (f" on {n:,}" if n is not None else "")
    mark = MARK if c.retrained else ""
    report = c.delegates.get(TARGET_DELEGATE.get(target) or "")
    tail = f"; {', '.join(report.cpu_tail)} on the CPU" if report is not None and report.runs_with_tail else ""
    contract = f"; NOTE {c.output_contract.words}" if c.output_contract is not None else ""
    feed = integer_edges(c)
    line = f"{path} ({c.name}{mark}: {ratio}, {quality}{tail}{contract}){_speed_note(study, rec)}"
    return line + (f"; {feed}" if feed else "")


def _quality(c: Candidate, b: _Base) -> str:
    """A pick's quality in a few words: Δ with labels, else a detector's detections kept, else the output error."""
    if c.metrics.accuracy is not None:
        return f"Δ {_delta(c, b)}"
    det = c.metrics.fidelity.detection if c.metrics.fidelity is not None else None
    if det is not None and det.kept_fraction is not None:
        return f"{det.kept_fraction * 100:.1f}% of detections kept{'*' if det.few else ''}"
    return f"rel err {_rel_err(c, b)}"


def _speed_note(study: Study, rec) -> str:
    """`; dynamic is smaller but 1.79x float32's p50`: what size would have cost in speed on the cpu target."""
    chosen = study.candidate(rec.chosen)
    slow = [study.candidate(r.candidate) for r in rec.rejected if r.reason.startswith(SLOWER)]
    smaller = [c for c in slow if c.metrics.size.bytes < chosen.metrics.size.bytes]
    base = study.float_reference
    if not smaller or base is None:
        return ""
    c = min(smaller, key=lambda c: c.metrics.size.bytes)
    r = ratio(c, base)
    return f"; {c.name} is smaller but {r[0]:.2f}x float32's p50" if r else ""


def _blocker(study: Study, target: Target, rec) -> str:
    """Why no candidate runs fully on the target: for a delegate's target, the candidate it would run most of
    (a build failure counts what the delegate accepted) and the node that blocks it, a dropped partition
    named only as that node's consequence (`delegates.blocking`); else the first rejection."""
    from optimize.decide.choose import fitted_elsewhere
    from optimize.delegates import blocking

    reasons = {r.candidate: r.reason for r in rec.rejected}
    delegate = TARGET_DELEGATE.get(target)
    fitted = {c.name for c in study.candidates if fitted_elsewhere(c, target)}
    reports = [(c, c.delegates[delegate]) for c in study.candidates if c.ok and delegate in c.delegates]
    reports = [(c, r) for c, r in reports if c.name not in fitted]
    if reports:
        c, r = max(reports, key=lambda cr: blocking.closeness(cr[1]))
        if r.verdict != "full" or c.name not in reasons:
            took = "accepted" if r.veto_code == blocking.BUILD_FAILURE else "nodes"
            return f"{c.name} comes closest ({blocking.accepted(r)}/{r.nodes_total} {took}); {blocking.words(r)}"
        return f"{c.name}: {reasons[c.name]}"
    if rec.rejected:
        return f"{rec.rejected[0].candidate}: {rec.rejected[0].reason}"
    return rec.headline or "no candidate was measured"


def legend(cands: list[Candidate], baseline: Candidate | None) -> list[str]:
    """What the table's columns mean, in plain words (nothing in the table depends on colour)."""
    lines = [measured_on(cands), retrained.legend(cands), _latency_legend(cands, baseline), _fidelity_legend(cands)]
    lines += [_samples_legend(cands), _thin_legend(cands)]
    if any(c.ok and c.islands for c in cands):
        lines.append("float = ops computing on float tensors, of all ops (float islands: each listed below, with why).")
    if any(c.delegates for c in cands):
        lines.append(
            "Delegates G N H C X = GPU, NNAPI, Hexagon, Core ML, XNNPACK: capital = runs the whole model, "
            "small = part of it, - = none, ! = fails while building its graph (all on the CPU), . = not "
            "checked; as n/total when wide (p = partitions). XNNPACK is observed in the runtime, the others "
            "predicted from each delegate's rules"
            + (
                "; gpu seen: LiteRT's GPU accelerator (ML Drift) observed on this machine, beside the classic "
                "GPU delegate's predicted column."
                if _observed(cands)
                else "."
            )
        )
    return [line for line in lines if line]


def _thin_legend(cands: list[Candidate]) -> str:
    """What a star on acc and Δ means, when a candidate's accuracy comes from a thin test split."""
    thin = sorted({c.metrics.accuracy.samples for c in cands if c.ok and _thin(c)})
    if not thin:
        return ""
    n = f"{thin[0]}" if len(thin) == 1 else f"{thin[0]}-{thin[-1]}"
    return f"* on acc and Δ = measured on {n} test sample(s), fewer than {FEW_SAMPLES}: a rough figure."


def _latency_legend(cands: list[Candidate], baseline: Candidate | None) -> str:
    lat = baseline.metrics.latency if baseline is not None and baseline.ok else None
    if lat is not None:
        rounds = f" in {lat.rounds} rounds" if lat.rounds else ""
        return (
            f"Latency: {lat.runtime}, {lat.threads} threads, p50 of {lat.runs} runs{rounds} after {lat.warmup_runs} "
            f"warm-up{_spread_words(cands)}. x = the figure to its left over {baseline.name}'s." + _cached_legend(cands)
        )
    if any(c.ok and c.composition for c in cands):
        return "w x = the weights' bytes over the same weights in float32 (0.25: a quarter)."
    return ""


def _spread_words(cands: list[Candidate]) -> str:
    """`, ± = the half-width of each p50's ~95% interval: 1%-15%, int16x8 319% (timed in 3 rounds)`: the spread
    of every latency, said in the legend whether or not the ± column has room; one far wider than the rest is
    named."""
    timed = sorted(
        ((c, c.metrics.latency.spread) for c in cands if c.ok and c.metrics.latency is not None),
        key=lambda cs: cs[1] if cs[1] is not None else -1.0,
    )
    timed = [(c, v) for c, v in timed if v is not None]
    if not timed:
        return ""
    pct = [round(v * 100) for _, v in timed]
    alone = ""
    if len(timed) > 2 and pct[-1] > 2 * max(pct[-2], 1):
        c = timed[-1][0]
        rounds = f" (timed in {c.metrics.latency.rounds} rounds)" if c.metrics.latency.rounds else ""
        alone, pct = f", {c.name} {pct[-1]}%{rounds}", pct[:-1]
    span = f"{pct[0]}%" if pct[0] == pct[-1] else f"{pct[0]}%-{pct[-1]}%"
    return f", ± = the half-width of each p50's ~95% interval: {span}{alone}"


def _cached_legend(cands: list[Candidate]) -> str:
    """Latencies replayed from the cache are said to be so, with when they were timed: never shown as fresh."""
    cached = [c for c in cands if c.ok and c.cached and c.metrics.latency is not None]
    if not cached:
        return ""
    when = sorted({c.metrics.latency.timed[:16].replace("T", " ") for c in cached if c.metrics.latency.timed})
    at = f" (timed {when[0]}{' to ' + when[-1] if len(when) > 1 else ''} UTC)" if when else ""
    every = "every candidate" if len(cached) == sum(c.ok for c in cands) else f"{len(cached)} cached candidate(s)"
    return f" The p50 of {every} comes from the cache: the run that made it{at}, not re-timed (--no-cache)."


def _fidelity_legend(cands: list[Candidate]) -> str:
    """Without labels, or with outputs the labels do not score: what rel err and agree are, on how many
    samples, and what a star means."""
    ok = [c for c in cands if c.ok]
    fid = [c.metrics.fidelity for c in ok if c.metrics.fidelity is not None]
    others = unlabelled_outputs(ok)[0]
    if fid and others:
        return _others_legend(fid, others)
    if not fid or labelled(ok):
        return ""
    counts = sorted({f.samples for f in fid})
    n = f"{counts[0]}" if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
    few = f"; * = from fewer than {FEW_SAMPLES} samples, a rough figure" if counts[0] < FEW_SAMPLES else ""
    agree = ", agree = the lowest agreement with it" + _agree_kinds(fid) if _agreeing(fid) else ""
    kept = _kept_words(fid)
    sliced = " (its worst slice's, where it holds quantities of different scales)" if _sliced(fid) else ""
    return (
        f"No labels: rel err = the worst output's mean |difference| from float32 over its range{sliced}{agree}"
        f"{kept}, on {n} samples{few}."
    )


def _kept_words(fid: list) -> str:
    det = next((f.detection for f in fid if f.detection is not None), None)
    if det is None:
        return ""
    few = (
        "; * = float32 made fewer than 20 detections: a rough figure"
        if any(f.detection is not None and f.detection.few for f in fid)
        else ""
    )
    return (
        f", kept = float32's detections kept (score >= {det.score_threshold:g}, same class, IoU >= "
        f"{det.iou_threshold:g}{few})"
    )


def _samples_legend(cands: list[Candidate]) -> str:
    """The worst samples' figure beside the pooled one: detections kept (or mask IoU) on the 5th-percentile
    sample, per candidate (a pooled share can hide a frame that lost most of what it had)."""
    shown = []
    for c in cands:
        f = c.metrics.fidelity if c.ok and c.metrics else None
        if f is None or c.name == "float32":
            continue
        det = f.detection
        low = (
            det.sample_kept
            if det is not None
            else min((o.sample_iou for o in f.outputs if o.sample_iou is not None), default=None)
        )
        if low is not None:
            shown.append(f"{c.name} {low * 100:.0f}%")
    if not shown:
        return ""
    what = (
        "detections kept"
        if any(c.ok and c.metrics.fidelity and c.metrics.fidelity.detection for c in cands)
        else "mask IoU"
    )
    return f"Worst samples (5th percentile of the per-sample {what}; --min-sample-kept bounds it): {', '.join(shown)}."


def _sliced(fid: list) -> bool:
    return any(o.slices for f in fid for o in f.outputs)


def _agreeing(fid: list) -> bool:
    return any(f.least_agreeing() is not None for f in fid)


def _agree_kinds(fid: list) -> str:
    """` (top-1)`, ` (decisions at 0.5)` or both: what the agree column holds."""
    top1 = any(f.top1_agreement is not None or any(o.top1_agreement is not None for o in f.outputs) for f in fid)
    decisions = any(o.decision_agreement is not None for f in fid for o in f.outputs)
    kinds = [k for k, on in (("top-1", top1), ("decisions at 0.5", decisions)) if on]
    return f" ({', '.join(kinds)})" if kinds else ""


def _others_legend(fid: list, others: list[str]) -> str:
    """With labels on one output and none on others: rel err is what judges those others."""
    agree = ", agree = the lowest agreement with it" + _agree_kinds(fid) if _agreeing(fid) else ""
    return (
        f"rel err = the worst output's mean |difference| from float32 over its range{agree}: acc and Δ score "
        f"the labelled output, and {', '.join(others)} (no labels) is judged by this alone."
    )


def _print_outcome(con, c: Candidate, baseline: Candidate | None = None, notes: bool = True) -> None:
    if c.error:
        _lines(con, f"{c.name} failed: {c.error}", hang=2, style="red")
    for note in dict.fromkeys(c.notes) if notes else ():  # each once (a candidate and its reference may say it)
        _lines(con, f"{c.name}: {note}", hang=2, style="dim")
    if c.ok and c.islands:
        con.print(f"{esc(c.name)}: float islands: {esc(island_cost(c, baseline))}")
        for group in island_groups(c)[:6]:
            con.print(f"  {esc(group)}")


def _grouped_notes(cands: list[Candidate]) -> list[tuple[list[str], str]]:
    """Each note once, with every candidate that says it (four int8 chains quantized alike say the same)."""
    said: dict[str, list[str]] = {}
    for c in cands:
        for note in dict.fromkeys(c.notes):
            said.setdefault(note, []).append(c.name)
    return [(names, note) for note, names in said.items()]


def print_study(study: Study, folder: Path | None = None, wide: bool = False, width: int | None = None) -> None:
    """The sweep table (fitted to the terminal), its legend, failures and notes, and what to do next. A
    PyTorch or ONNX model's conversion is a line of its own under the table: what converting cost, apart
    from what each scheme costs."""
    con = _console(width)
    base = next((c for c in study.candidates if c.name == study.baseline), None)
    title = f"{esc(study.model)}: {len(study.candidates)} candidates"
    _print_tables(con, study.candidates, base, title, wide)
    if study.conversion is not None:
        con.print(esc(conversion_line(study.conversion)))
    for line in legend(study.candidates, base):
        con.print(esc(line))
    for c in study.candidates:
        _print_outcome(con, c, base, notes=False)
    for names, note in _grouped_notes(study.candidates):
        _lines(con, f"{', '.join(names)}: {note}", hang=2, style="dim")
    if folder:
        written = [c for c in study.candidates if c.artifact and (Path(folder) / c.artifact).is_file()]
        _wrote(con, f"Wrote {len(written)} artifact(s) and {Path(folder) / 'study.json'}")
    if any(c.ok for c in study.candidates):
        _print_next_steps(con, study, folder)


def _print_next_steps(con, study: Study, folder: Path | None) -> None:
    """next_steps, each line wrapped under its own text; the guard's warnings red where colour shows."""
    for line in next_steps(study, folder):
        warning = line.startswith("WARNING:")
        hang = len("WARNING: ") if warning else 11 if line.startswith("  ") else 6
        _lines(con, line, hang=hang, style="red" if warning else "")


def phase_lines(cands: list[Candidate], study: Study | None = None) -> list[str]:
    """Where the time went (`--verbose`): each phase summed over the candidates, with its share and the
    candidate that spent most in it, then each candidate's total and its three largest phases. Figures
    from the cache are the run that made them; a study adds its wall time and the opening of its inputs."""
    spent = [c for c in cands if c.phases]
    if not spent:
        return ["Where the time went: no phase timings recorded (candidates from an older optimize)."]
    return _phase_totals(spent, study) + _phase_per_candidate(spent)


def _phase_totals(spent: list[Candidate], study: Study | None) -> list[str]:
    totals = {p: sum(c.phases.get(p, 0.0) for c in spent) for p in PHASES}
    work = sum(totals.values())
    head = f"Where the time went: {work:.1f} s of candidate work"
    if study is not None and study.seconds is not None:
        head += f" in a {study.seconds:.1f} s sweep (opening and planning {study.open_seconds or 0:.1f} s)"
    cached = sum(c.cached for c in spent)
    lines = [head + (f"; {cached} cached candidate(s) show the run that made them" if cached else "") + ":"]
    lines.append(f"  {'phase':10} {'seconds':>8} {'share':>6}  most in")
    for p, s in totals.items():
        if s > 0:
            top = max(spent, key=lambda c: c.phases.get(p, 0.0))
            lines.append(f"  {p:10} {s:8.2f} {s / work:6.0%}  {top.name} ({top.phases[p]:.2f})")
    return lines


def _phase_per_candidate(spent: list[Candidate]) -> list[str]:
    lines = ["Per candidate (seconds, the three largest phases):"]
    width = min(max(len(c.name) for c in spent), 24)
    for c in spent:
        big = sorted(c.phases.items(), key=lambda kv: -kv[1])[:3]
        lines.append(f"  {c.name:{width}} {c.seconds:7.2f}  " + ", ".join(f"{k} {v:.2f}" for k, v in big))
    return lines


def print_candidates(
    cands: list[Candidate], folder: Path | None = None, wide: bool = False, width: int | None = None
) -> None:
    """One run's candidate (quantize, prune, run, ...): its table, what the columns mean, notes, the file."""
    con = _console(width)
    _print_tables(con, cands, None, "", wide)
    for line in legend(cands, None):
        con.print(esc(line))
    for c in cands:
        _print_outcome(con, c)
        if c.skipped_layers:
            con.print(f"{esc(c.name)}: layers left as they were: {esc(', '.join(c.skipped_layers))}")
        if c.ok and c.contract is not None:  # how to feed the file, read from it (issue 43)
            con.print(f"{esc(c.name)}: how to feed it")
            for line in contract_lines(c.contract):
                _lines(con, line, hang=11)
        if c.artifact and folder:
            _wrote(con, f"Wrote {Path(folder) / c.artifact}")


def print_metrics(name: str, m: Metrics) -> None:
    con = _console()

    def say(text: str) -> None:  # a wrapped line continues under the figures, not at column 0
        _lines(con, text, hang=len("  accuracy  "))

    con.print(f"[bold]{esc(name)}[/bold]")
    say(f"  size      {m.size.bytes:,} bytes ({m.size.gzip_bytes:,} gzipped)")
    if m.accuracy:
        a = m.accuracy
        on = _on(m, a.samples)
        if a.top1 is not None:
            say(f"  accuracy  top-1 {_pct(a.top1)}, top-{a.k} {_pct(a.topk)} on {on}")
        else:
            say(f"  accuracy  MAE {a.mae:.5g} on {on}")
    if m.fidelity:
        _print_fidelity(con, say, m)
        _print_task(con, m)
        if m.fidelity.top1_agreement is not None and not any(o.top1_agreement is not None for o in m.fidelity.outputs):
            say(f"            top-1 agreement {_pct(m.fidelity.top1_agreement)}")
        if m.accuracy is None:  # the samples the fidelity stands on (with labels, the accuracy line says them)
            say(f"            on {_on(m, m.fidelity.samples)}")
    if m.latency:
        lt = m.latency
        say(
            f"  latency   p50 {lt.p50_ms:.3f} ms, p90 {lt.p90_ms:.3f}, mean {lt.mean_ms:.3f} ± {lt.std_ms:.3f} "
            f"({lt.runs} runs, {lt.threads} threads, XNNPACK {'on' if lt.xnnpack else 'off'}); "
            f"init {lt.init_ms:.1f} ms, first {lt.first_ms:.2f} ms [{lt.runtime}]"
        )
    if m.memory:
        say(f"  memory    peak {_kb(m.memory.peak_rss_bytes)} ({m.memory.method})")


def _print_fidelity(con, say, m: Metrics) -> None:
    """Each output against the reference: |diff|, relative error (per slice where it has slices), agreement."""
    for o in m.fidelity.outputs:
        rel = f", rel err {_pct(o.relative_error)}" if o.relative_error is not None else ""
        agree = f", top-1 agreement {_pct(o.top1_agreement)}" if o.top1_agreement is not None else ""
        agree += f", decisions at 0.5 agree {_pct(o.decision_agreement)}" if o.decision_agreement is not None else ""
        say(
            f"  fidelity  {o.name}: |diff| mean {o.mean_abs_diff:.4g}, std {o.std_abs_diff:.4g}, "
            f"max {o.max_abs_diff:.4g}{rel}{agree} vs {m.fidelity.reference}"
        )
        for sl in o.slices:  # an output of several scales: each part over its own range
            con.print(f"            {esc(sl.name)} (range {sl.range:.4g}): rel err {_pct(sl.relative_error)}")


def _on(m: Metrics, samples: int) -> str:
    """`all 600 test samples`, or a sample of them (`TestSample.words`); an older record: `600 samples`."""
    return m.test.words() if m.test is not None else f"{samples} samples"


def print_contract(contract) -> None:
    """How to feed a file and read its answers, and the TFLite metadata it carries (`optimize evaluate`)."""
    con = _console()
    for line in contract_lines(contract):
        _lines(con, line, hang=11)


def _print_task(con, m) -> None:
    """A detector's detections kept, and the figures as the GPU computes the candidate."""
    det = m.fidelity.detection
    if det is not None:
        con.print(
            f"            detections kept {det.kept} of float32's {det.reference_detections} ({det.layout} head, "
            f"score >= {det.score_threshold:g}, IoU >= {det.iou_threshold:g}), {det.extra} extra"
            + (f"; worst samples {det.sample_kept * 100:.0f}%" if det.sample_kept is not None else "")
        )
    gpu = m.on_target.gpu if m.on_target else None
    if gpu is not None and gpu.outputs:
        worst = gpu.worst()
        err = f"rel err {_pct(worst.relative_error)}" if worst and worst.relative_error is not None else ""
        flag = f"; {esc(gpu.flagged)}" if gpu.flagged else ""
        con.print(f"  on gpu    {err} ({gpu.method}: {esc(gpu.how)}){flag}")


def debug_lines(report, width: int = 80, top: int = 25) -> list[str]:
    """The per-layer error table as plain lines that fit `width`: one line of figures per op, its output
    tensor's whole name on the line below (folded, never cut), rows in the report's ranking."""
    head = f"{'rank':>4}  {'op (#index)':22}  {'added':>8}  {'rel rmse':>8}  {'rmse/scale':>10}  {'weights':>7}  {'if float':>8}"
    import textwrap

    over = report.held_out or f"{report.samples} samples"
    title = f"{report.scheme}: output error {report.output_error:.4f} (the worst output's, as a sweep measures it) over {over}"
    lines = [*textwrap.wrap(title, width, subsequent_indent="  "), head]
    room = max(20, width - 6)
    for rank, le in enumerate(report.layers[:top], 1):
        step = "-" if le.rmse_over_scale is None else f"{le.rmse_over_scale:.2f}"
        float_err = "-" if le.output_error_without is None else f"{le.output_error_without:.4f}"
        op, name = f"{le.op} #{le.op_index}", esc(le.tensor)
        if len(op) > 22:  # a long op name goes whole onto the name line
            op, name = f"#{le.op_index}", f"{le.op}: {name}"
        lines.append(
            f"{rank:>4}  {op:22}  {le.error_added:>+8.4f}  {le.relative_rmse:>8.4f}  {step:>10}  "
            f"{le.weight_share * 100:>6.1f}%  {float_err:>8}"
        )
        lines += [f"      {part}" for part in fold(name, room)]
    return lines


def fold(name: str, room: int) -> list[str]:
    """A long name in pieces of at most `room` characters, each ending after a `;` or `/` where one is
    near the end (TFLite's fused tensor names join several paths with `;`)."""
    pieces = []
    while len(name) > room:
        cut = max(name.rfind(";", 0, room), name.rfind("/", 0, room)) + 1
        cut = cut if cut > room * 0.6 else room
        pieces.append(name[:cut])
        name = name[cut:]
    return [*pieces, name] if name or not pieces else pieces


def print_debug(report, width: int | None = None) -> None:
    """The per-layer error table: ranked, with what keeping each op in float buys where measured."""
    con = _console(width)
    for line in debug_lines(report, con.width):
        con.print(line, highlight=False)
    if len(report.layers) > 25:
        con.print(f"... and {len(report.layers) - 25} more op(s) (use --json for all)")
    if report.repaired:
        con.print(
            f"Kept out of {report.scheme} first, so the quantized model runs where the float model does "
            "(the ops below are not ranked):"
        )
        for i in report.repaired:
            con.print(f"  {esc(i.op)} {esc(i.tensor)} at {i.precision}: {esc(i.reason)}")
    if report.kept_float:
        con.print("Left in float by the quantizer (unsupported): " + esc(", ".join(report.kept_float)))
    con.print(
        "Ranked: ops measured with only them kept float first (lowest 'if float', the model's output error "
        "then, first), the rest by 'added' (the relative error the op adds to its inputs'), highest first. "
        "rmse/scale ~0.29 is pure rounding; above ~0.7 points at clipping or a poor range."
    )
    for line in report.fixes:
        con.print(esc(line), highlight=False, soft_wrap=False)


def _recipe_lines(toml: str | None, recipe: bool) -> list[str]:
    """The chosen pipeline's recipe as TOML where asked for (`--recipe`), else one line saying how to get it:
    the advice reads on without 25 lines of TOML in the middle."""
    if not toml:
        return []
    if recipe:
        return ["", "Recipe (save it as a .toml file: `optimize run FILE MODEL` runs it):", "", toml.rstrip()]
    return ["", "Its recipe, as TOML for `optimize run`: add --recipe."]


def format_advice(advice, recipe: bool = False) -> str:
    """The decision tree's answer as terminal text (`recipe`: with the pipeline's TOML recipe, at the end)."""
    lines = [f"Target: {advice.target}", "", "Decision path:"]
    for i, q in enumerate(advice.path, 1):
        lines.append(f"  {i}. {q.question} {q.answer} -> {q.decided}")
    lines += ["", f"Recommended pipeline: {describe(advice.pipeline)}"]
    if advice.alternatives:
        lines += ["", "Alternatives:"] + [f"  - {a}" for a in advice.alternatives]
    if advice.facts:
        lines += ["", "Good to know:"] + [f"  - {f}" for f in advice.facts]
    lines += _recipe_lines(advice.recipe_toml, recipe)
    return "\n".join(lines) + "\n"


def _answer(rec) -> list[str]:
    """The measured answer: the choice (or why there is none) or the float32 file to keep, why it differs
    from the rule of thumb, the default guard's warnings (in words: `WARNING:`), what to try."""
    lines = [rec.headline or (f"Chosen from measurements: {rec.chosen}" if rec.chosen else "No choice.")]
    lines += [""] + [f"Why: {w}" for w in rec.why] if rec.why else []
    lines += [""] + [f"WARNING: {w}" for w in rec.warnings] if rec.warnings else []
    lines += ["", "What to try:"] + [f"  - {t}" for t in rec.to_try] if rec.to_try else []
    return lines


def _heading(rec) -> list[str]:
    """The target and goals, and the default guard in force with what the user left unstated."""
    goals = ", ".join(f"{k}={v}" for k, v in rec.goals.model_dump().items() if v is not None)
    lines = [f"Target: {rec.target}    Goals: {goals}"]
    if rec.guard:
        unstated = "No accuracy goal given"
        if has_labelled_goal(rec.goals):
            unstated = "No goal for the outputs without labels given"
        lines.append(f"{unstated}: the default guard applies ({rec.guard}).")
    return lines + [x for x in (rec.retrained, rec.measured_on) if x]


def format_recommendation(rec, recipe: bool = False) -> str:
    """A recommendation (or bare advice) as terminal text: path, pipeline, choice, ranking, rejections, facts;
    the chosen recipe's TOML only with `recipe` (else a line saying how to ask for it)."""
    from optimize.decide.advice import Advice

    if isinstance(rec, Advice):
        return format_advice(rec, recipe)
    adv = rec.advice
    lines = _heading(rec) + ["", "Decision path (rule of thumb):"]
    lines += [f"  {i}. {q.question} {q.answer} -> {q.decided}" for i, q in enumerate(adv.path, 1)]
    lines.append(f"  Rule-of-thumb pipeline: {describe(adv.pipeline)}")
    lines += [f"  {rec.path_update}"] if rec.path_update else []
    lines += ["", *_answer(rec)]
    if len(rec.ranked) > 1:
        lines += ["", "Also eligible, in order: " + ", ".join(rec.ranked[1:])]
    if rec.pareto:
        lines += ["", f"Pareto front of what runs on {rec.target} (size, latency, accuracy): " + ", ".join(rec.pareto)]
    if rec.rejected:
        lines += ["", "Rejected:"] + [f"  - {r.candidate}: {r.reason}" for r in rec.rejected]
    if rec.alternatives:
        lines += ["", "Alternatives:"] + [f"  - {a}" for a in rec.alternatives]
    if rec.facts:
        lines += ["", "Good to know:"] + [f"  - {f}" for f in rec.facts]
    lines += _recipe_lines(None if rec.keep_float32 else rec.chosen_recipe_toml, recipe)
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
            con.print(f"{esc(e.name)}/{esc(name)}: {esc(clip(why, REASON_CHARS))}", highlight=False)
        if len(e.timing_nodes) > 1:
            con.print(f"{esc(e.name)}: latencies from {len(e.timing_nodes)} machines: {esc(', '.join(e.timing_nodes))}")
    if folder:
        _wrote(con, f"Wrote {len(result.models)} studies and {Path(folder) / 'zoo.json'}")

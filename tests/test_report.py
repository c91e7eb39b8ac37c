"""The report: Markdown and self-contained HTML from a hand-built study, checked in headless Chromium."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from study_fixtures import candidate, empty_study, full_study, report, study

from optimize.core.results import Goals
from optimize.decide.choose import recommend
from optimize.present.report import render_html, render_markdown, write_report

CHROMIUM = shutil.which("chromium")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="headless Chromium not installed (apt-get install chromium)"
)


@pytest.fixture(scope="module")
def gpu_rec():
    return recommend(full_study(), "gpu", Goals(max_accuracy_drop=0.01))


@pytest.fixture(scope="module")
def html_page(gpu_rec):
    return render_html(full_study(), gpu_rec)


def test_markdown_has_table_matrix_and_recommendation(gpu_rec):
    md = render_markdown(full_study(), gpu_rec, images={"size_vs_accuracy": "size_vs_accuracy.svg"})
    for c in full_study().candidates:
        assert f"| `{c.name}` |" in md
    assert "| Candidate | Scheme | Backend | Size | Gzip |" in md
    assert (
        "## Delegate matrix" in md
        and "partial: 10/12 nodes, 1 partition (rules): #0 QUANTIZE v1: float input is rejected" in md
    )
    assert "**Chosen: `int8`**" in md and "![Size vs accuracy](size_vs_accuracy.svg)" in md
    assert "```toml" in md and "Rejected:" in md
    assert "152.0 kB" in md and "86.0 kB" in md and "(-0.84 pt)" in md and "0.6 ms (2 thr, XNNPACK)" in md


def test_markdown_escapes_table_breakers():
    s = study([candidate("a-b", error="bad | worse\nline <two>")])
    md = render_markdown(s)
    assert "| `a-b` |" in md and "bad \\| worse line &lt;two&gt;" in md


def test_html_structure_and_content(html_page, gpu_rec):
    assert html_page.startswith("<!DOCTYPE html>")
    assert 'id="candidates"' in html_page and 'id="delegates"' in html_page and 'id="plots"' in html_page
    assert html_page.count("<svg") == 2
    assert html_page.count('data-candidate="') == len(full_study().candidates)
    assert '<strong id="chosen">int8</strong>' in html_page
    assert 'tr class="chosen" data-candidate="int8"' in html_page
    assert (
        html_page.count('class="full"') and html_page.count('class="partial"') == 2 and html_page.count('class="none"')
    )
    assert "#0 QUANTIZE v1: float input is rejected" in html_page  # fallback reasons in the cell
    assert "vetoed: model type not supported" in html_page
    assert '<th class="target">gpu</th>' in html_page
    for r in gpu_rec.rejected:
        assert r.candidate in html_page
    ids = re.findall(r'\sid="([^"]+)"', html_page)
    assert len(ids) == len(set(ids)), "two plots must not share element ids"


def test_html_is_self_contained(html_page):
    assert not re.search(r"<script|<link|src=\"http|href=\"http|@import|url\(http", html_page)


def test_html_escapes_everything_from_the_study():
    evil = "<script>alert('x')</script>"
    bad_report = report("gpu", "partial", reason='<img src=x onerror="alert(1)">')
    s = study(
        [
            candidate("float32"),  # a name a study no longer holds (the reader refuses it), rendered all the same
            candidate("int8", "int8", size=40_000, delegates={"gpu": bad_report}).model_copy(update={"name": evil}),
        ],
        data="<b>data</b>",
    )
    page = render_html(s, recommend(s, "gpu"))
    assert "<script" not in page and "<img" not in page and "<b>data</b>" not in page
    assert "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;" in page
    assert "&lt;img src=x onerror=&#34;alert(1)&#34;&gt;" in page


def test_empty_study_renders():
    page = render_html(empty_study(), recommend(empty_study(), "cpu"))
    assert (
        "The study has no candidates." in page
        and "Nothing to plot" in page
        and "No measured candidate to choose from" in page
        and "meets the goals" not in page  # no goals were given
    )
    assert "The study has no candidates." in render_markdown(empty_study())


def test_candidates_without_accuracy_are_listed_not_plotted():
    s = study([candidate("float32", delta=None), candidate("int8", "int8", delta=None)])
    page = render_html(s, plots={})
    assert "Not plotted (no accuracy): float32, int8" in page


def test_write_report_writes_markdown_html_and_plots(tmp_path, gpu_rec):
    paths = write_report(full_study(), tmp_path / "out", gpu_rec)
    assert set(paths) == {"markdown", "html", "size_vs_accuracy", "latency_vs_accuracy"}
    md = paths["markdown"].read_text()
    for key in ("size_vs_accuracy", "latency_vs_accuracy"):
        assert paths[key].read_text().startswith("<svg") and f"]({key}.svg)" in md
    assert paths["html"].read_text().count("<svg") == 2
    assert not [p for p in (tmp_path / "out").iterdir() if p.name.endswith(".tmp")]


def test_write_report_without_recommendation(tmp_path):
    paths = write_report(full_study(), tmp_path)
    page = paths["html"].read_text()
    assert 'id="recommendation"' not in page and "Pareto front" in page


# ------------------------------------------------------------------------------ headless Chromium
def _chromium(*args: str, tmp: Path) -> subprocess.CompletedProcess:
    # Chromium's profile and TMPDIR hold a unix socket, whose path must stay under ~100 bytes: under a long
    # TMPDIR both go in a short folder of its own (removed after).
    short = Path(tempfile.mkdtemp(prefix="chr-", dir="/tmp")) if len(str(tmp)) > 40 and Path("/tmp").is_dir() else tmp
    try:
        return _run_chromium(args, short)
    finally:
        if short != tmp:
            shutil.rmtree(short, ignore_errors=True)


def _run_chromium(args: tuple[str, ...], tmp: Path) -> subprocess.CompletedProcess:
    cmd = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        f"--user-data-dir={tmp / 'profile'}",
        *args,
    ]
    env = {**os.environ, "TMPDIR": str(tmp)}  # its singleton socket goes under TMPDIR too
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)


# Appended to a copy of the page in the test only (the report itself has no script): it writes the
# rendered size of every plot and table into the DOM, which --dump-dom then prints.
MEASURE = """<script>
const box = e => { const r = e.getBoundingClientRect(); return `${e.tagName.toLowerCase()}#${e.closest('[id]').id}:${Math.round(r.width)}x${Math.round(r.height)}`; };
document.body.setAttribute('data-measured', [...document.querySelectorAll('#plots svg, table')].map(box).join(' '));
</script>"""


@needs_chromium
def test_html_renders_in_headless_chromium(tmp_path, gpu_rec):
    paths = write_report(full_study(), tmp_path / "report", gpu_rec)
    probe = tmp_path / "probe.html"
    probe.write_text(paths["html"].read_text().replace("</body>", MEASURE + "</body>"))
    shot = tmp_path / "page.png"
    # One browser run: the DOM after layout (with the measurements) and a screenshot of the page.
    out = _chromium(
        "--window-size=1400,4200",
        "--hide-scrollbars",
        f"--screenshot={shot}",
        "--dump-dom",
        probe.as_uri(),
        tmp=tmp_path,
    )
    dom = out.stdout
    assert "</html>" in dom, out.stderr[-2000:]
    measured = re.search(r'data-measured="([^"]*)"', dom).group(1)
    sizes = dict(m.groups() for m in re.finditer(r"(\w+#\w+):(\d+x\d+)", measured))
    for key in ("svg#size_vs_accuracy", "svg#latency_vs_accuracy", "table#candidates", "table#delegates"):
        w, h = map(int, sizes[key].split("x"))
        assert w >= 300 and h >= 150, f"{key} rendered at {w}x{h}"
    assert dom.count('data-candidate="') == len(full_study().candidates)
    assert dom.count('<td class="full"') >= 20 and "<details>" in dom

    assert shot.is_file() and shot.stat().st_size > 50_000, out.stderr[-2000:]
    from matplotlib.image import imread

    rgb = (imread(shot)[..., :3] * 255).round().astype(int)
    colours = {tuple(c) for c in rgb.reshape(-1, 3)[::7]}
    assert (0xC8, 0xE6, 0xC9) in colours, "green 'full' cells of the delegate matrix are not on screen"
    assert (0xFF, 0xCD, 0xD2) in colours, "red 'none' cells of the delegate matrix are not on screen"
    assert (0xFB, 0x8C, 0x00) in colours, "orange Pareto markers of the plots are not on screen"


@pytest.mark.parametrize("width", [80, 110, 160])
def test_sweep_table_fits_the_terminal(width, capsys):
    """Every line of the sweep table, its legend and the next steps fits the terminal; names stay whole."""
    from optimize.present.report_text import print_study

    st = full_study()
    print_study(st, Path("out"), width=width)
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= width, out
    for c in st.candidates:
        assert c.name in out
    assert "optimize recommend out/study.json" in out


def test_wide_table_shows_every_column(capsys):
    from optimize.present.report_text import print_study

    print_study(full_study(), None, width=300, wide=True)
    out = capsys.readouterr().out
    for col in ("gzip", "agree", "mem", "gpu", "nnapi", "hexagon", "coreml", "xnnpack"):
        assert col in out

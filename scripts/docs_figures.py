"""The figures README.md and docs/getting-started.md quote, generated from one run, so they cannot go stale.

    python scripts/docs_figures.py            # run the demo sweep cold and warm, record, rewrite the blocks
    python scripts/docs_figures.py --check    # the blocks as docs/figures.json renders them? (exit 1 if not)

What it runs, as a newcomer does after `pip install -e .`: `optimize sweep` on the built-in demo, in a fresh
folder with a fresh result cache (the cold run trains the demo model first), at 80 columns without colour,
then the same command again unchanged (the warm run). It records in docs/figures.json what the sweep printed
(its table and its "What to ship" lines), the ratios read from the study it wrote (int8 size / float32's,
prune -> cluster -> int8 gzip / float32 gzip, the points each post-training scheme lost) and the two wall
times, with the commit and the machine; then rewrites each block between `<!-- figures:NAME -->` and
`<!-- /figures:NAME -->` in the two pages from that record. tests/test_docs.py renders the blocks from the
record and fails when a page's block differs: a figure edited by hand, or a block left behind.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RECORD = ROOT / "docs" / "figures.json"
PAGES = {"sweep": "README.md", "measured": "README.md", "ship": "docs/getting-started.md"}
#: The table rows the README shows (the rest is "... (N candidates)"), and the targets of its "What to ship".
SHOWN_ROWS = ("float32", "float16", "int8", "prune-cluster-int8", "int4", "fit-float16")
SHOWN_TARGETS = 3
PTQ = ("float16", "dynamic", "int8", "int16x8")
COMMAND = "python scripts/docs_figures.py"


def _sweep(folder: Path, cache: Path) -> tuple[str, float]:
    """`optimize sweep` on the demo in `folder`, as a user's terminal at 80 columns shows it; (stdout, seconds)."""
    env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "80", "OPTIMIZE_CACHE": str(cache), "TERM": "dumb"}
    t0 = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", "from optimize.cli import main; main()", "sweep"],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    if done.returncode != 0:
        raise SystemExit(f"optimize sweep failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return done.stdout, time.perf_counter() - t0


def _table_rows(out: str) -> list[str]:
    """The table's header row and each candidate's row, as printed."""
    return [line for line in out.splitlines() if line.startswith(("┃", "│"))]


def _ship_lines(out: str) -> list[str]:
    """The "What to ship" block as printed: its heading and every line under it."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("What to ship"))
    block = [lines[start]]
    for line in lines[start + 1 :]:
        if not line.startswith((" ", "WARNING")):
            break
        block.append(line)
    return block


def _ratios(study: dict) -> dict:
    """The ratios the README's table quotes, read from the study the sweep wrote."""
    by = {c["name"]: c for c in study["candidates"] if c.get("error") is None and c.get("metrics")}
    size = {n: c["metrics"]["size"] for n, c in by.items()}
    base = size["float32"]
    lost = {n: -100 * (by[n]["metrics"].get("accuracy_delta") or 0.0) for n in PTQ if n in by}
    return {
        "int8_size": round(size["int8"]["bytes"] / base["bytes"], 3),
        "chain_gzip": round(size["prune-cluster-int8"]["gzip_bytes"] / base["gzip_bytes"], 3),
        "points_lost": {n: round(v, 2) + 0.0 for n, v in lost.items()},
        "candidates": len(study["candidates"]),
    }


def measure() -> dict:
    """Run the demo sweep cold, then warm, and return the record."""
    with tempfile.TemporaryDirectory(prefix="docs-figures-") as tmp:
        folder, cache = Path(tmp) / "work", Path(tmp) / "cache"
        folder.mkdir()
        cold_out, cold = _sweep(folder, cache)
        _, warm = _sweep(folder, cache)
        study = json.loads((folder / "optimize-out" / "study.json").read_text())
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return {
        "command": "optimize sweep (the demo), fresh cache, then again unchanged; NO_COLOR=1 COLUMNS=80",
        "commit": commit.stdout.strip(),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "date": time.strftime("%Y-%m-%d"),
        "table": _table_rows(cold_out),
        "ship": _ship_lines(cold_out),
        "ratios": _ratios(study),
        "seconds": {"cold": round(cold, 1), "warm": round(warm, 1)},
    }


def _sweep_block(rec: dict) -> list[str]:
    rows = rec["table"]
    shown = [rows[0]] + [r for r in rows[1:] if r.split("│")[1].strip().rstrip("†") in SHOWN_ROWS]  # † retrained
    ship = rec["ship"]
    ends = [i for i, line in enumerate(ship) if re.match(r"  \S", line)]  # each target's first line
    cut = ends[SHOWN_TARGETS] if len(ends) > SHOWN_TARGETS else len(ship)
    more = ["  ..."] if cut < len(ship) else []
    return ["```text", *shown, f"  ... ({rec['ratios']['candidates']} candidates)", *ship[:cut], *more, "```"]


def _measured_block(rec: dict) -> list[str]:
    r, s = rec["ratios"], rec["seconds"]
    lost = " / ".join(f"{v:.2f}" for v in r["points_lost"].values())
    names = " / ".join(r["points_lost"])
    return [
        "| what | figure |",
        "|---|---|",
        f"| demo int8 size / float32 | {r['int8_size']:.3f} |",
        f"| demo prune 50% -> cluster 16 -> int8, gzip / float32 gzip | {r['chain_gzip']:.3f} |",
        f"| demo accuracy lost, {names} (points) | {lost} |",
        f"| demo sweep from a fresh cache, cold / warm | {s['cold']:.1f} s / {s['warm']:.1f} s |",
        "",
        *textwrap.wrap(
            f"Generated by `{COMMAND}` at commit {rec['commit']} on {rec['date']} ({rec['machine']}, shared: wall "
            f"times drift with the load, ratios less): {rec['command']}.",
            110,
        ),
    ]


def blocks(rec: dict) -> dict[str, list[str]]:
    """Each marked block's lines, rendered from the record."""
    return {"sweep": _sweep_block(rec), "measured": _measured_block(rec), "ship": ["```text", *rec["ship"], "```"]}


def _span(text: str, name: str) -> tuple[int, int]:
    start, end = f"<!-- figures:{name} -->\n", f"<!-- /figures:{name} -->"
    i = text.index(start) + len(start)
    return i, text.index(end, i)


def on_page(text: str, name: str) -> list[str]:
    """A marked block's lines as the page holds them."""
    i, j = _span(text, name)
    return text[i:j].rstrip("\n").split("\n")


def rewrite(rec: dict) -> None:
    for name, lines in blocks(rec).items():
        page = ROOT / PAGES[name]
        text = page.read_text()
        i, j = _span(text, name)
        page.write_text(text[:i] + "\n".join(lines) + "\n" + text[j:])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare the pages with docs/figures.json; run nothing")
    args = ap.parse_args()
    if args.check:
        rec = json.loads(RECORD.read_text())
        stale = [n for n, lines in blocks(rec).items() if on_page((ROOT / PAGES[n]).read_text(), n) != lines]
        print("stale: " + ", ".join(stale) if stale else "every block is as generated")
        return 1 if stale else 0
    rec = measure()
    RECORD.write_text(json.dumps(rec, indent=2, ensure_ascii=False) + "\n")
    rewrite(rec)
    print(f"wrote {RECORD.relative_to(ROOT)} and the blocks in " + ", ".join(sorted(set(PAGES.values()))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

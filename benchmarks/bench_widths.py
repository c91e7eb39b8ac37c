"""Lines wider than 80 columns, per command, with NO_COLOR=1 and COLUMNS=80 (issue 17).

Runs every command a user meets on the built-in demo (a sweep into a temporary folder, then compat,
recommend, report, debug, quantize, run, evaluate and the recipes commands on what it wrote, and
`--help` of every command) and prints, per command: lines, lines over 80, the widest line, and the
option names `--help` cut short (an ellipsis). Point PYTHONPATH at another checkout to measure it the
same way (the figures in the final report of issue 17 compare the code before and after).

    python benchmarks/bench_widths.py [--keep DIR]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from optimize.cli import commands

WIDTH = 80
ENV = {**os.environ, "COLUMNS": str(WIDTH), "NO_COLOR": "1", "TERM": "dumb"}
HELP = list(commands())  # every command path, read from the app


def run(args: list[str], cwd: Path) -> tuple[int, int, int, int, int]:
    r = subprocess.run(
        [sys.executable, "-c", "from optimize.cli import main; main()", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=ENV,
        timeout=1800,
    )
    lines = (r.stdout + r.stderr).splitlines()
    over = [line for line in lines if len(line) > WIDTH]
    cut = sum(line.count("…") for line in lines)
    return r.returncode, len(lines), len(over), max(map(len, lines), default=0), cut


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keep", type=Path, help="Work in this folder (kept) instead of a temporary one.")
    args = ap.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="bench-widths-"))
    work.mkdir(parents=True, exist_ok=True)
    from optimize.convert.demo import cache_dir

    demo = cache_dir() / "demo-v1"
    runs = [(f"{h} --help".strip(), [*h.split(), "--help"]) for h in HELP]
    runs += [
        ("sweep (demo)", ["sweep", "-o", "out"]),
        ("sweep --wide", ["sweep", "-o", "out", "--wide"]),
        ("quantize -o m.tflite", ["quantize", "out/float32.tflite", "--scheme", "float16", "-o", "q/m.tflite"]),
        ("compat int8", ["compat", "out/int8.tflite"]),
        ("compat int16x8", ["compat", "out/int16x8.tflite"]),
        ("recommend (tree)", ["recommend", "--target", "gpu"]),
        ("recommend study gpu", ["recommend", "out/study.json", "--target", "gpu"]),
        ("recommend study mcu", ["recommend", "out/study.json", "--target", "mcu"]),
        ("report", ["report", "out/study.json"]),
        ("debug", ["debug", str(demo / "digits_cnn.keras"), "-d", str(demo / "digits.npz")]),
        ("run mobile-gpu", ["run", "mobile-gpu", "out/float32.tflite", "-o", "r"]),
        ("evaluate", ["evaluate", "out/int8.tflite"]),
        ("recipes list", ["recipes", "list"]),
        ("recipes techniques", ["recipes", "techniques"]),
        ("recipes show", ["recipes", "show", "mobile-gpu"]),
    ]
    print(f"{'command':28} {'exit':>4} {'lines':>6} {'>80':>5} {'widest':>7} {'cut':>4}")
    total = [0, 0]
    for what, argv in runs:
        code, n, over, widest, cut = run(argv, work)
        total[0] += over
        total[1] += cut
        print(f"{what:28} {code:>4} {n:>6} {over:>5} {widest:>7} {cut:>4}")
    print(f"{'all':28} {'':>4} {'':>6} {total[0]:>5} {'':>7} {total[1]:>4}")


if __name__ == "__main__":
    main()

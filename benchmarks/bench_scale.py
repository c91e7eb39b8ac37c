"""How a sweep's cost grows with the model (issue 44): seeded Keras attention encoders at four sizes up to BERT-base's
110M parameters, and a ResNet-50-sized CNN; each swept as a user runs it (`optimize sweep`, a fresh process).

    python benchmarks/bench_scale.py                         # the four encoders and ResNet-50
    python benchmarks/bench_scale.py --models enc-2x128,enc-4x256
    python benchmarks/bench_scale.py --budget free           # the default budget (what is free), not the target's

Per model: its bytes (the .keras file), the sweep's wall seconds, the peak resident memory of the sweep's whole
process tree (sampled here with psutil every 0.2 s, independently of what the sweep records in study.json, which
is printed beside it), the seconds of each phase (summed over candidates; `open` is opening and planning), and
the ratios between consecutive encoder sizes, beside those of the bytes and of the multiply-adds per sample. Targets: the BERT-base-sized sweep's tree peak <= 4 GB plus 4x the
model's bytes, and no phase's seconds growing faster than the model's bytes (phases under MIN_PHASE_S seconds in
both runs are noise, not growth). By default each sweep is given `--max-memory` = that same bound (4 GB + 4x its
bytes): the sweep must keep within what it is told; `--budget free` leaves it the machine's free memory.

The models (benchmarks/scale_models.py) are built once into --work (default: the system's temp folder) and
reused. Sweeps run under `nice -n 10`. Before each sweep the free memory is checked: a model whose bound needs
more than is free is skipped, and said so. The machine's load (`uptime`) is printed before and after: figures
from a loaded machine are slower, and the ratios between sizes are what to read.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))

from scale_models import ENCODERS, encoder, encoder_macs, resnet50  # noqa: E402

GB = 10**9
RESNET50_MACS = 4_100_000_000  # one 224x224 image (He et al., 2015: 3.8-4.1 G multiply-adds)
MIN_PHASE_S = 2.0  # a phase this short in both runs is noise, not growth
PHASES = ("open", "convert", "train", "quantize", "rescue", "verify", "load", "probe", "accuracy", "delegates",
          "latency", "memory")  # fmt: skip


def bound(model_bytes: int) -> int:
    """The issue's memory target for a model: 4 GB plus 4x its bytes."""
    return 4 * GB + 4 * model_bytes


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


class TreePeak:
    """The peak of a process tree's summed RSS, sampled from a thread (independent of what optimize records)."""

    def __init__(self, pid: int, every: float = 0.2):
        self.root, self.every, self.peak = psutil.Process(pid), every, 0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.done.wait(self.every):
            try:
                procs = [self.root, *self.root.children(recursive=True)]
            except psutil.Error:
                return
            total = 0
            for p in procs:
                try:
                    total += p.memory_info().rss
                except psutil.Error:
                    pass
            self.peak = max(self.peak, total)

    def stop(self) -> int:
        self.done.set()
        self.thread.join()
        return self.peak


def sweep(name: str, model: Path, data: Path, out: Path, budget: str) -> dict:
    """One `optimize sweep` process, its tree sampled; its figures (or why it was skipped)."""
    size = model.stat().st_size
    need = bound(size)
    free = psutil.virtual_memory().available
    if budget == "target" and need > free - 2 * GB:
        return {"name": name, "bytes": size, "skipped": f"needs up to {need / GB:.1f} GB, {free / GB:.1f} GB free"}
    args = ["nice", "-n", "10", sys.executable, "-c", "from optimize.cli import main; main()", "sweep", str(model)]
    args += ["-d", str(data), "-o", str(out), "--no-cache", "-v"]
    if budget == "target":
        args += ["--max-memory", str(need)]
    t0 = time.perf_counter()
    log = out.with_suffix(".log")
    with open(log, "w") as f:
        p = subprocess.Popen(args, stdout=f, stderr=subprocess.STDOUT)
        tree = TreePeak(p.pid)
        try:
            p.wait()
        finally:  # this benchmark stopped (Ctrl-C): the sweep stops too, its whole tree within seconds
            if p.poll() is None:
                p.terminate()
                p.wait()
    seconds, peak = time.perf_counter() - t0, tree.stop()
    if p.returncode != 0:
        return {"name": name, "bytes": size, "skipped": f"the sweep failed ({p.returncode}); see {log}"}
    study = json.loads((out / "study.json").read_text())
    phases = {"open": study["open_seconds"]}
    for c in study["candidates"]:
        for k, v in (c.get("phases") or {}).items():
            phases[k] = phases.get(k, 0.0) + v
    failed = [c["name"] for c in study["candidates"] if c["error"]]
    recorded = study.get("memory") or {}
    return {
        "name": name, "bytes": size, "seconds": seconds, "peak": peak, "recorded": recorded.get("peak_bytes"),
        "recorded_pss": recorded.get("peak_pss_bytes"), "budget": recorded.get("budget_bytes"), "phases": phases,
        "failed": failed, "candidates": len(study["candidates"]),
    }  # fmt: skip


def _table(rows: list[dict]) -> None:
    print(f"  {'model':12} {'bytes':>9} {'sweep s':>8} {'tree peak':>10} {'recorded':>9} {'(PSS)':>7} {'budget':>8}")
    for r in rows:
        if "skipped" in r:
            print(f"  {r['name']:12} {r['bytes'] / 1e6:7.0f}MB  SKIPPED: {r['skipped']}")
            continue
        rec = f"{r['recorded'] / GB:7.2f}GB" if r["recorded"] else "      -"
        pss = f"{r['recorded_pss'] / GB:5.2f}GB" if r["recorded_pss"] else "    -"
        bud = f"{r['budget'] / GB:6.2f}GB" if r["budget"] else "     -"
        print(
            f"  {r['name']:12} {r['bytes'] / 1e6:7.0f}MB {r['seconds']:8.0f} {r['peak'] / GB:8.2f}GB {rec} {pss} {bud}"
        )
        if r["failed"]:
            print(f"  {'':12} failed candidates: {', '.join(r['failed'])}")


def _phases(rows: list[dict]) -> None:
    done = [r for r in rows if "skipped" not in r]
    if not done:
        return
    print("  seconds per phase (summed over candidates):")
    print("  " + f"{'phase':10}" + "".join(f"{r['name']:>12}" for r in done))
    for p in PHASES:
        if any(r["phases"].get(p) for r in done):
            print("  " + f"{p:10}" + "".join(f"{r['phases'].get(p, 0.0):12.1f}" for r in done))


def _ratios(rows: list[dict]) -> bool:
    """Each consecutive pair of encoder sizes: the bytes' ratio, the work per sample's (multiply-adds), the sweep's
    and each phase's; False when a phase grows faster than the bytes (the issue's target). A phase that does so
    but no faster than the work per sample is said so: a phase that runs samples through the model (calibration,
    accuracy, timing) costs the model's multiply-adds per sample, and those grow faster than the bytes while the
    embedding table is most of them (2x128 -> 4x256: bytes x2.5, multiply-adds x7.4)."""
    done = [r for r in rows if "skipped" not in r and r["name"].startswith("enc-")]
    ok = True
    for a, b in zip(done, done[1:]):
        grow, work = b["bytes"] / a["bytes"], b["macs"] / a["macs"]
        print(f"  {a['name']} -> {b['name']}: bytes x{grow:.2f}, multiply-adds per sample x{work:.2f}, "
              f"sweep seconds x{b['seconds'] / a['seconds']:.2f}, tree peak x{b['peak'] / a['peak']:.2f}")  # fmt: skip
        for p in PHASES:
            sa, sb = a["phases"].get(p, 0.0), b["phases"].get(p, 0.0)
            if max(sa, sb) < MIN_PHASE_S or sa <= 0:
                continue
            r = sb / sa
            ok &= r <= grow
            verdict = (
                "ok"
                if r <= grow
                else "FASTER THAN THE BYTES"
                + (", not than the multiply-adds" if r <= work else ", AND THAN THE MULTIPLY-ADDS")
            )
            print(f"    {p:10} {sa:8.1f} -> {sb:8.1f} s  x{r:6.2f}  {verdict}")
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    names = [n for n, _, _ in ENCODERS] + ["resnet50"]
    ap.add_argument("--models", default=",".join(names), help=f"comma-separated, of {', '.join(names)}")
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "optimize-bench-scale")
    ap.add_argument("--budget", choices=("target", "free"), default="target")
    args = ap.parse_args()
    wanted = args.models.split(",")
    print(f"load average before: {_load()}; {psutil.virtual_memory().available / GB:.1f} GB free")
    rows = []
    for name in wanted:
        spec = next(((n, layers, width) for n, layers, width in ENCODERS if n == name), None)
        model, data = encoder(spec[1], spec[2], args.work / "models", name) if spec else resnet50(args.work / "models")
        macs = encoder_macs(spec[1], spec[2]) if spec else RESNET50_MACS
        os.environ.setdefault("OPTIMIZE_CACHE", str(args.work / "cache"))
        out = args.work / f"out-{name}"
        if out.exists():
            import shutil

            shutil.rmtree(out)
        print(f"sweeping {name} ({model.stat().st_size / 1e6:.0f} MB)...", flush=True)
        rows.append({**sweep(name, model, data, out, args.budget), "macs": macs})
    print(f"load average after: {_load()}")
    _table(rows)
    _phases(rows)
    ok = _ratios(rows)
    big = next((r for r in rows if r["name"] == "enc-12x768" and "skipped" not in r), None)
    if big is not None:
        good = big["peak"] <= bound(big["bytes"])
        ok &= good
        print(f"  BERT-base-sized tree peak {big['peak'] / GB:.2f} GB, target <= 4 GB + 4 x {big['bytes'] / 1e6:.0f} MB "
              f"= {bound(big['bytes']) / GB:.2f} GB   {'PASS' if good else 'FAIL'}")  # fmt: skip
    print("ALL TARGETS MET" if ok else "SOME TARGETS MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""Issue 26, item 8: benchmarks/soak.py runs many sweeps against one S3 cache (moto's server on 127.0.0.1) from
concurrent writers while sweeps and workers are SIGKILLed and cache objects corrupted. A short version runs
here; its detector (what counts as served corrupt) is tested on its own first, so a clean report means
something."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
REQUIRED = (
    "sweeps",
    "served_corrupt",
    "tracebacks",
    "hangs",
    "leaked_temp",
    "leaked_processes",
    "leaked_fds",
    "rss_growth",
)


def _soak():
    spec = importlib.util.spec_from_file_location("soak", ROOT / "benchmarks" / "soak.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_soak_detects_what_it_injects(float_tflite, tmp_path):
    """The audit of a finished study flags a corrupted artifact, an artifact of another size than its record,
    a forged record and a swapped entry (another recipe under the name); a clean study passes."""
    from optimize.engine import sweeps

    soak = _soak()
    out = tmp_path / "out"
    study = sweeps.sweep(float_tflite, None, out, jobs=0, runs=3, cache=False)
    ledger = soak.Ledger()
    soak.audit(ledger, "m", out)
    assert ledger.served_corrupt == 0, ledger.problems
    c = next(c for c in study.candidates if c.ok and c.artifact and c.name != "float32")
    art = out / c.artifact
    good = art.read_bytes()
    ledger.injected.add(hashlib.sha256(good).hexdigest())  # as if the chaos had written these bytes
    soak.audit(ledger, "m", out)
    assert ledger.served_corrupt == 1 and "a corrupted artifact" in ledger.problems[-1]
    ledger.injected.clear()
    art.write_bytes(good[:-10])
    soak.audit(ledger, "m", out)
    assert ledger.served_corrupt == 2 and "record says" in ledger.problems[-1]
    art.write_bytes(good)
    forged = study.model_copy(
        update={
            "candidates": [
                x.model_copy(update={"notes": [*x.notes, f"{soak.FORGED} 1"]}) if x.name == c.name else x
                for x in study.candidates
            ]
        }
    )
    forged.save(out / "study.json")
    soak.audit(ledger, "m", out)
    assert ledger.served_corrupt == 3 and "forged" in ledger.problems[-1]
    swapped = study.model_copy(
        update={
            "candidates": [
                x.model_copy(update={"recipe_hash": "0" * len(x.recipe_hash)}) if x.name == c.name else x
                for x in study.candidates
            ]
        }
    )
    swapped.save(out / "study.json")
    soak.audit(ledger, "m", out)
    assert ledger.served_corrupt == 4 and "another key's entry" in ledger.problems[-1]


@pytest.mark.slow
def test_a_short_soak_is_clean():
    """Sweeps of a .tflite, a SavedModel and two kinds of bad input from two writers against moto's S3 while
    faults are injected: nothing served corrupt, no traceback, no hang, nothing leaked."""
    pytest.importorskip("s3fs")
    pytest.importorskip("moto")
    pytest.importorskip("psutil")
    args = ["--sweeps", "8", "--writers", "2", "--models", "tflite,savedmodel,truncated,wrong-data"]
    args += ["--minutes", "10", "--min-gap", "2", "--max-gap", "5", "--json"]
    r = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "soak.py"), *args], capture_output=True, text=True, timeout=1800
    )
    report = json.loads(r.stdout.strip().splitlines()[-1])
    assert set(REQUIRED) <= set(report), report
    clean = {k: report[k] for k in REQUIRED if k not in ("sweeps", "rss_growth")}
    assert clean == dict.fromkeys(clean, 0), report["problems"]
    assert report["rss_growth"] < 0.10 and report["sweeps"] >= 4, report
    assert report["killed_workers"] + report["killed_sweeps"] + sum(report["corruptions"].values()) > 0, report
    assert r.returncode == 0, r.stderr[-2000:]

"""A soak: many sweeps against one S3 cache from concurrent processes, with faults injected while it runs.

    python benchmarks/soak.py --sweeps 200 --writers 3 --json
    python benchmarks/soak.py --sweeps 40 --writers 3 --minutes 30 --json

What runs (issue 26): `--sweeps` sweeps of a mix of models, seeded and built here (a Keras 2 CNN with labels,
so pruning, clustering and QAT run; a Keras 3 model with labels, so it is rebuilt in tf_keras; a SavedModel and
a float .tflite of the CNN; with the torch extra, a PyTorch MLP as a .pt2 and as an .onnx, converted once by the
front door and then from its cache; and sweeps that fail: a truncated .tflite and data of the wrong shape), all against
one result cache on moto's S3 server (started here, on 127.0.0.1 only), from `--writers` concurrent writers.
Writer 0 is one long-lived process calling `optimize.sweep` in a loop (the API: its open files and memory are
what a leak would grow); the others run each sweep as its own `optimize sweep ... --json` process (the CLI: its
stdout must stay one JSON record). Every sweep has 1 worker process. While they run, a chaos thread:

- SIGKILLs running sweep processes (a CLI sweep, workers and all) and single worker processes (any writer's);
- corrupts cache objects in S3: entries truncated, replaced by garbage, by JSON of the wrong types
  (`{"format": 6, "record": 5}`), by another key's entry, or edited without their digest; artifacts with bytes
  flipped, truncated or deleted; what is known about a model replaced by garbage or another model's record.

Bounded: no sweep starts after `--minutes`; a sweep that runs past `--hang-seconds` is a hang (killed, counted).
Output folders are reused (one per writer and model), so a run killed mid-sweep leaves its staging folder for
the next run into the same folder to clear; at the end every output folder still holding one gets that next run.

Reported as one JSON object (`--json`; a table otherwise):
    sweeps            sweeps that finished (any exit but a kill), of `requested`
    served_corrupt    candidates in a finished study whose artifact is a corrupted object (or not a valid
                      .tflite, or not the size its record says), whose record carries an injected forgery, or
                      whose recipe is another candidate's (a swapped entry)
    tracebacks        sweeps with a Python traceback on stdout or stderr (CLI) or an unexpected exception (API);
                      plus CLI sweeps whose --json stdout was not one JSON record
    hangs             sweeps that ran past --hang-seconds
    leaked_temp       files left in the sweeps' temp folder, staging or work folders left in output folders
                      after their next run, temporaries left in the S3 cache
    leaked_processes  processes of the sweeps (marked by an environment variable) alive at the end
    leaked_fds        how much the API writer's floor of open descriptors rose from its warm-up (every kind of
                      model swept once) to its last sweeps: the lowest count over its last 3 sweeps less the
                      lowest over its first 3 (after a garbage collection; bounded caches, such as the 4 parsed
                      models optimize keeps mapped, move the count between sweeps, a leak raises its floor)
    rss_growth        the API writer's resident memory growth over the same span (a fraction)
plus what was injected (`killed_sweeps`, `killed_workers`, `corruptions` by kind), `exit_codes`, `seconds`.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve()
ROOT = HERE.parent.parent
LOOPBACK = "127.0.0.1"
MARK = "OPTIMIZE_SOAK_ID"  # every process the soak starts carries it (its children inherit it)
FORGED = "SOAK-FORGED"
CLI = [sys.executable, "-c", "from optimize.cli import main; main()"]


# ------------------------------------------------------------------------------------------ the models
def build_models(folder: Path) -> dict[str, dict]:
    """Seeded, small, made here: label -> {model, data, expect (exit code of a good run)}."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import numpy as np
    from sklearn.datasets import load_digits

    from optimize.convert.keras import export_saved_model
    from optimize.core.registry import Context, get
    from optimize.models import _tf
    from optimize.models import source as models

    folder.mkdir(parents=True, exist_ok=True)
    d = load_digits()
    order = np.random.default_rng(0).permutation(len(d.images))[:300]
    x = (d.images[order] / 16.0).astype(np.float32)[..., None]
    y = d.target[order].astype(np.int64)
    np.savez(folder / "digits.npz", x=x, y=y)
    np.savez(folder / "x_only.npz", x=x[:120])
    np.savez(folder / "wrong_shape.npz", x=np.zeros((40, 5, 5, 1), np.float32))

    keras = _tf.keras()
    keras.utils.set_random_seed(0)
    cnn = keras.Sequential(
        [
            keras.layers.Input((8, 8, 1)),
            keras.layers.Conv2D(8, 3, padding="same", activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dense(16, activation="relu"),
            keras.layers.Dense(10),
        ]
    )
    cnn.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True), ["accuracy"])
    cnn.fit(x, y, epochs=10, batch_size=32, verbose=0)
    cnn.save(folder / "cnn.keras")

    k3 = _tf.keras3()
    k3.utils.set_random_seed(0)
    m3 = k3.Sequential(
        [k3.Input((8, 8, 1)), k3.layers.Flatten(), k3.layers.Dense(16, activation="relu"), k3.layers.Dense(10)]
    )
    m3.compile("adam", k3.losses.SparseCategoricalCrossentropy(from_logits=True))
    m3.fit(x, y, epochs=5, verbose=0)
    m3.save(folder / "mlp3.keras")

    sm = export_saved_model(models.load_keras2(models.open_model(folder / "cnn.keras")), folder / "cnn_savedmodel")
    tech = get("convert")
    tfl = tech.fn(sm, tech.params(scheme="float32"), Context(workdir=folder / "conv"))
    shutil.copy(tfl, folder / "cnn.tflite")
    data = (folder / "cnn.tflite").read_bytes()
    (folder / "truncated.tflite").write_bytes(data[: len(data) // 3])
    return {
        "keras2": {"model": folder / "cnn.keras", "data": folder / "digits.npz", "expect": 0, "weight": 2},
        "keras3": {"model": folder / "mlp3.keras", "data": folder / "digits.npz", "expect": 0, "weight": 2},
        "savedmodel": {"model": folder / "cnn_savedmodel", "data": folder / "x_only.npz", "expect": 0, "weight": 2},
        "tflite": {"model": folder / "cnn.tflite", "data": folder / "digits.npz", "expect": 0, "weight": 3},
        "truncated": {"model": folder / "truncated.tflite", "data": None, "expect": 2, "weight": 1},
        "wrong-data": {"model": folder / "cnn.tflite", "data": folder / "wrong_shape.npz", "expect": 2, "weight": 1},
        **torch_models(folder, x, y),
    }


def torch_models(folder: Path, x, y) -> dict[str, dict]:
    """A seeded PyTorch MLP on the same digits (NHWC rows, as the data holds them), trained for a moment, as a
    torch.export program (.pt2) and as ONNX (the TorchScript exporter: offline); none without the torch extra."""
    import importlib.util
    import warnings

    if not all(importlib.util.find_spec(m) for m in ("torch", "litert_torch", "onnx", "onnxruntime", "onnx2torch")):
        return {}
    import torch

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    opt = torch.optim.Adam(net.parameters(), 1e-2)
    xs, ys = torch.from_numpy(x), torch.from_numpy(y)
    for _ in range(60):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(xs), ys).backward()
        opt.step()
    net.eval()
    sample = (xs[:1],)
    torch.export.save(torch.export.export(net, sample), str(folder / "mlp.pt2"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation: it is the one that works offline
        torch.onnx.export(
            net, sample, str(folder / "mlp.onnx"), dynamo=False, input_names=["x"], output_names=["logits"],
            dynamic_axes={"x": {0: "batch"}},
        )  # fmt: skip
    return {
        "pt2": {"model": folder / "mlp.pt2", "data": folder / "digits.npz", "expect": 0, "weight": 1},
        "onnx": {"model": folder / "mlp.onnx", "data": folder / "digits.npz", "expect": 0, "weight": 1},
    }


# ------------------------------------------------------------------------------------------ moto's S3
def free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def moto_server(bucket: str, env: dict):
    port = free_port()
    exe = Path(sys.executable).with_name("moto_server")
    cmd = [str(exe)] if exe.is_file() else [sys.executable, "-m", "moto.server"]
    proc = subprocess.Popen(
        [*cmd, "-H", LOOPBACK, "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    env.update(
        {
            "AWS_ENDPOINT_URL": f"http://{LOOPBACK}:{port}",
            "AWS_ACCESS_KEY_ID": "soak",
            "AWS_SECRET_ACCESS_KEY": "soak",
            "AWS_DEFAULT_REGION": "us-east-1",
        }
    )
    os.environ.update({k: v for k, v in env.items() if k.startswith("AWS_")})
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with socket.create_connection((LOOPBACK, port), timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("moto's server did not start") from None
                time.sleep(0.2)
        import fsspec

        fs = fsspec.filesystem("s3", skip_instance_cache=True)
        fs.mkdir(bucket)
        yield fs, proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


# ------------------------------------------------------------------------------------------ bookkeeping
class Ledger:
    """What was injected and what was seen, shared by the threads."""

    def __init__(self):
        self.lock = threading.Lock()
        self.injected: set[str] = set()  # sha256 of every corrupted object written
        self.corruptions: Counter = Counter()
        self.killed_sweeps = 0
        self.killed_workers = 0
        self.finished = 0
        self.started = 0
        self.served_corrupt = 0
        self.tracebacks = 0
        self.hangs = 0
        self.exit_codes: Counter = Counter()
        self.problems: list[str] = []
        self.recipes: dict[tuple[str, str], str] = {}  # (model, candidate) -> recipe hash first seen
        self.outputs: set[Path] = set()

    def note(self, what: str) -> None:
        """A problem, kept short: its head (what) and its tail (a traceback's last lines say why)."""
        with self.lock:
            if len(self.problems) < 50:
                self.problems.append(what if len(what) <= 1600 else f"{what[:300]} [...] {what[-1300:]}")


def audit(ledger: Ledger, label: str, out: Path) -> None:
    """Every candidate of a finished study: its artifact a valid, uncorrupted .tflite of the size its record
    says, its record free of injected forgeries, its recipe the one that name had before."""
    from optimize.core.results import load_study
    from optimize.models.tflite import read_model

    try:
        study = load_study(out / "study.json")
    except Exception as e:  # noqa: BLE001 - a finished sweep's study must load
        ledger.note(f"{label}: study.json does not load: {e}")
        with ledger.lock:
            ledger.served_corrupt += 1
        return
    bad = 0
    for c in study.candidates:
        why = None
        if any(FORGED in n for n in c.notes) or (c.error and FORGED in c.error):
            why = "a forged record"
        elif c.ok and c.artifact:
            try:
                data = (out / c.artifact).read_bytes()
                if hashlib.sha256(data).hexdigest() in ledger.injected:
                    why = "a corrupted artifact"
                elif c.metrics.size.bytes != len(data):
                    why = f"artifact of {len(data)} bytes, record says {c.metrics.size.bytes}"
                else:
                    read_model(data)
            except Exception as e:  # noqa: BLE001 - unreadable or invalid
                why = f"artifact unusable ({type(e).__name__}: {str(e)[:120]})"
        with ledger.lock:
            first = ledger.recipes.setdefault((label, c.name), c.recipe_hash)
        if why is None and first != c.recipe_hash:
            why = f"recipe {c.recipe_hash} where {c.name} was {first} (another key's entry)"
        if why:
            bad += 1
            ledger.note(f"{label}/{c.name} served corrupt: {why} (cached={c.cached})")
    with ledger.lock:
        ledger.served_corrupt += bad


# ------------------------------------------------------------------------------------------ writers
def cli_writer(wid: int, jobs, cfg: dict, ledger: Ledger, running: dict, stop: threading.Event) -> None:
    """Each sweep its own `optimize sweep --json` process."""
    while not stop.is_set():
        job = jobs()
        if job is None:
            return
        label = job
        m = cfg["models"][label]
        out = cfg["work"] / "out" / f"w{wid}" / label
        with ledger.lock:
            ledger.outputs.add(out)
        args = [*CLI, "sweep", str(m["model"]), "-o", str(out), "--cache", cfg["cache"], "--jobs", "1", "--json"]
        if m["data"]:
            args += ["--data", str(m["data"])]
        err_path = cfg["work"] / "logs" / f"w{wid}-{uuid.uuid4().hex[:8]}.err"
        with open(err_path, "w") as err:
            p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=err, env=cfg["env"], text=True)
            with ledger.lock:
                running[p.pid] = ("cli", p)
            try:
                stdout, _ = p.communicate(timeout=cfg["hang"])
            except subprocess.TimeoutExpired:
                with ledger.lock:
                    ledger.hangs += 1
                ledger.note(f"{label}: sweep hung past {cfg['hang']} s")
                p.kill()
                stdout, _ = p.communicate()
            finally:
                with ledger.lock:
                    running.pop(p.pid, None)
        stderr = err_path.read_text(errors="replace")
        code = p.returncode
        with ledger.lock:
            ledger.exit_codes[str(code)] += 1
        if code == -signal.SIGKILL:
            continue  # killed by the chaos (or as a hang): not a finished sweep
        with ledger.lock:
            ledger.finished += 1
        if "Traceback" in stderr or "Traceback" in stdout:
            with ledger.lock:
                ledger.tracebacks += 1
            ledger.note(f"{label}: traceback: {stderr[-1500:]}")
        if code != m["expect"] and code != 1:
            ledger.note(f"{label}: exit {code} (expected {m['expect']}): {stderr[-600:]}")
        if code in (0, 1) and m["expect"] == 0:
            try:
                json.loads(stdout)
            except ValueError:
                with ledger.lock:
                    ledger.tracebacks += 1
                ledger.note(f"{label}: --json stdout is not JSON: {stdout[:300]!r}")
            if code == 0:
                audit(ledger, label, out)


API_WRITER = r"""
import gc, json, os, sys, traceback
sys.path.insert(0, sys.argv[1])
import optimize
from optimize.core.errors import OptimizeError, NothingWorked
from optimize.engine.sweeps import refuse_if_nothing_worked
import psutil
me = psutil.Process()
for line in sys.stdin:
    job = json.loads(line)
    code, tb = 0, None
    try:
        study = optimize.sweep(job["model"], job["data"], job["out"], cache=job["cache"], jobs=1)
        refuse_if_nothing_worked(study)
    except NothingWorked:
        code = 1
    except OptimizeError:
        code = 2
    except BaseException:
        code, tb = 3, traceback.format_exc()[-3000:]
    gc.collect()
    print(json.dumps({"code": code, "traceback": tb, "fds": me.num_fds(), "rss": me.memory_info().rss}), flush=True)
"""


def api_writer(jobs, cfg: dict, ledger: Ledger, running: dict, stop: threading.Event, stats: dict) -> None:
    """One long-lived process calling optimize.sweep in a loop (its descriptors and memory are measured)."""
    err = open(cfg["work"] / "logs" / "api.err", "w")
    p = subprocess.Popen(
        [sys.executable, "-c", API_WRITER, str(ROOT)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
        env=cfg["env"], text=True,
    )  # fmt: skip
    with ledger.lock:
        running[p.pid] = ("api", p)
    samples: list[tuple[int, int]] = []
    warmup = [lb for lb, m in cfg["models"].items() if m["expect"] == 0]  # every kind once before measuring
    try:
        while not stop.is_set():
            label = jobs(warmup.pop(0) if warmup else None)
            if label is None:
                break
            m = cfg["models"][label]
            out = cfg["work"] / "out" / "w0" / label
            with ledger.lock:
                ledger.outputs.add(out)
            job = {"model": str(m["model"]), "data": str(m["data"]) if m["data"] else None, "out": str(out)}
            p.stdin.write(json.dumps({**job, "cache": cfg["cache"]}) + "\n")
            p.stdin.flush()
            answer = _read_line(p, cfg["hang"])
            if answer is None:
                with ledger.lock:
                    ledger.hangs += 1
                ledger.note(f"api/{label}: sweep hung past {cfg['hang']} s (or the writer died)")
                break
            r = json.loads(answer)
            with ledger.lock:
                ledger.exit_codes[str(r["code"])] += 1
                ledger.finished += 1
            samples.append((r["fds"], r["rss"]))
            if warmup == [] and "base" not in stats:
                stats["base"] = len(samples) - 1  # warmed up: every kind of model swept once in this process
            if r["traceback"]:
                with ledger.lock:
                    ledger.tracebacks += 1
                ledger.note(f"api/{label}: {r['traceback']}")
            elif r["code"] != m["expect"] and r["code"] != 1:
                ledger.note(f"api/{label}: code {r['code']} (expected {m['expect']})")
            if r["code"] == 0:
                audit(ledger, label, out)
    finally:
        with ledger.lock:
            running.pop(p.pid, None)
        p.stdin.close()
        try:
            p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        err.close()
        text = (cfg["work"] / "logs" / "api.err").read_text(errors="replace")
        if "Traceback" in text:
            with ledger.lock:
                ledger.tracebacks += 1
            ledger.note(f"api writer's stderr holds a traceback: {text[-1500:]}")
    stats["samples"] = samples


def _read_line(p: subprocess.Popen, timeout: float) -> str | None:
    out: list[str] = []
    t = threading.Thread(target=lambda: out.append(p.stdout.readline()), daemon=True)
    t.start()
    t.join(timeout)
    if not out or not out[0]:
        p.kill()
        return None
    return out[0]


# ------------------------------------------------------------------------------------------ chaos
def _workers(pid: int) -> list:
    import psutil

    try:
        kids = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []
    out = []
    for k in kids:
        with contextlib.suppress(psutil.Error):
            if "multiprocessing" in " ".join(k.cmdline()):
                out.append(k)
    return [k for k in out if "resource_tracker" not in " ".join(k.cmdline())]


def chaos(cfg: dict, ledger: Ledger, running: dict, fs, stop: threading.Event, rng: random.Random) -> None:
    """Kill sweeps and workers, corrupt cache objects, at random intervals, until stopped."""
    while not stop.wait(rng.uniform(*cfg["interval"])):
        roll = rng.random()
        with ledger.lock:
            procs = list(running.values())
        try:
            if roll < 0.25:
                cli = [p for kind, p in procs if kind == "cli" and p.poll() is None]
                if cli:
                    victim = rng.choice(cli)
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(victim.pid, signal.SIGKILL)
                        with ledger.lock:
                            ledger.killed_sweeps += 1
            elif roll < 0.5:
                workers = [w for _, p in procs for w in _workers(p.pid)]
                if workers:
                    victim = rng.choice(workers)
                    with contextlib.suppress(Exception):
                        victim.kill()
                        with ledger.lock:
                            ledger.killed_workers += 1
            else:
                corrupt(fs, cfg["prefix"], ledger, rng)
        except Exception as e:  # noqa: BLE001 - the chaos itself must not end the soak
            ledger.note(f"chaos: {type(e).__name__}: {e}")


def corrupt(fs, prefix: str, ledger: Ledger, rng: random.Random) -> None:
    """One cache object replaced by a corrupted one (its kind picked at random)."""
    fs.invalidate_cache()  # s3fs keeps listings: the writers add objects all the time
    try:
        keys = [k for k in fs.find(prefix) if "/v" in k and not k.endswith("/writable")]
    except FileNotFoundError:
        return
    if not keys:
        return
    key = rng.choice(keys)
    try:
        raw = fs.cat_file(key)
    except FileNotFoundError:
        return
    if "/artifacts/" in key:
        kind = rng.choice(["flip", "truncate", "delete"])
        if kind == "delete":
            fs.rm(key)
            new = None
        elif kind == "flip":
            b = bytearray(raw)
            for i in rng.sample(range(len(b)), min(16, len(b))):
                b[i] ^= 0xFF
            new = bytes(b)
        else:
            new = raw[: len(raw) // 2]
    elif "/known/" in key:
        kind = rng.choice(["garbage", "wrong-types", "swap"])
        new = {
            "garbage": os.urandom(64),
            "wrong-types": b'{"format": 1, "fingerprint": 5}',
            "swap": fs.cat_file(rng.choice([k for k in keys if "/known/" in k])),
        }[kind]
    else:
        kind = rng.choice(["truncate", "garbage", "wrong-types", "swap", "forged"])
        try:
            doc = json.loads(raw)
        except ValueError:  # corrupted already: garbage over garbage
            kind, doc = "garbage", None
        record = None
        if kind == "forged" and isinstance(doc, dict) and isinstance(doc.get("record"), str):
            with contextlib.suppress(ValueError):
                record = json.loads(doc["record"])
        if kind == "forged" and isinstance(record, dict):
            record["notes"] = [*(record.get("notes") or []), f"{FORGED} {uuid.uuid4().hex[:6]}"]
            doc["record"] = json.dumps(record)  # its digest left as it was
            new = json.dumps(doc).encode()
        elif kind == "swap":
            new = fs.cat_file(rng.choice([k for k in keys if "/entries/" in k]))
        else:
            kind = "garbage" if kind == "forged" else kind
            new = {
                "truncate": raw[: len(raw) // 2],
                "garbage": os.urandom(200),
                "wrong-types": b'{"format": 6, "record": 5}',
            }[kind]
    if new is not None:
        fs.pipe_file(key, new)
        with ledger.lock:
            ledger.injected.add(hashlib.sha256(new).hexdigest())
    with ledger.lock:
        what = next((p for p in key.split("/") if p in ("entries", "known", "artifacts")), "object")
        ledger.corruptions[f"{what}:{kind}"] += 1


# ------------------------------------------------------------------------------------------ leaks
def leftovers(cfg: dict, ledger: Ledger, fs) -> tuple[int, list[str]]:
    """Temporaries left: the sweeps' temp folder, staging and work folders in output folders after each
    folder's next run, temporaries in the S3 cache."""
    found: list[str] = []
    for out in sorted(ledger.outputs):
        if any(out.glob(".optimize-staging-*")) or (out / ".work").exists():
            m = cfg["models"][out.name]
            args = [*CLI, "sweep", str(m["model"]), "-o", str(out), "--cache", cfg["cache"], "--jobs", "1"]
            args += ["--data", str(m["data"])] if m["data"] else []
            subprocess.run(args, env=cfg["env"], capture_output=True, timeout=cfg["hang"])  # the next run
        found += [str(p) for p in out.glob(".optimize-staging-*")] + [str(p) for p in out.glob(".work")]
    # the next command (any: its supervisor clears the scratch folders of supervisors that were SIGKILLed)
    subprocess.run([*CLI, "--version"], env=cfg["env"], capture_output=True, timeout=cfg["hang"])
    found += [str(p) for p in Path(cfg["tmp"]).iterdir()]
    fs.invalidate_cache()
    with contextlib.suppress(FileNotFoundError):
        found += [k for k in fs.find(cfg["prefix"]) if "/tmp/" in k and not k.endswith("/writable")]
    return len(found), found


def marked_processes(mark: str) -> list[int]:
    import psutil

    alive = []
    for p in psutil.process_iter(["pid"]):
        with contextlib.suppress(psutil.Error):
            if p.pid != os.getpid() and p.environ().get(MARK) == mark:
                alive.append(p.pid)
    return alive


# ------------------------------------------------------------------------------------------ the run
def run(args) -> dict:
    rng = random.Random(args.seed)
    t0 = time.monotonic()
    work = Path(args.keep or tempfile.mkdtemp(prefix="optimize-soak-"))
    (work / "logs").mkdir(parents=True, exist_ok=True)
    tmp = work / "tmp"
    tmp.mkdir(exist_ok=True)
    mark = uuid.uuid4().hex
    env = {k: v for k, v in os.environ.items() if k not in ("OPTIMIZE_CACHE",)}
    env.update({MARK: mark, "TMPDIR": str(tmp), "NO_COLOR": "1", "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "2"})
    env["OPTIMIZE_CACHE"] = str(work / "local-cache")  # the demo's and nothing else: results go to S3
    bucket = f"soak-{mark[:8]}"
    models = build_models(work / "models")
    if args.models:
        wanted = [m.strip() for m in args.models.split(",") if m.strip()]
        unknown = sorted(set(wanted) - set(models))
        if unknown:
            raise SystemExit(f"unknown models {unknown}: pick from {sorted(models)}")
        models = {k: v for k, v in models.items() if k in wanted}
    ledger = Ledger()
    stats: dict = {}
    with moto_server(bucket, env) as (fs, _moto):
        cfg = {
            "work": work, "tmp": tmp, "env": env, "models": models, "hang": args.hang_seconds,
            "cache": f"s3://{bucket}/cache", "prefix": f"{bucket}/cache", "interval": (args.min_gap, args.max_gap),
        }  # fmt: skip
        labels = [label for label, m in models.items() for _ in range(m["weight"])]
        cfg["models"] = models
        deadline = t0 + args.minutes * 60
        lock = threading.Lock()
        firsts = [lb for lb in models if models[lb]["expect"] == 0][: args.sweeps]  # each good model cold first
        order = firsts + [rng.choice(labels) for _ in range(args.sweeps - len(firsts))]

        def jobs(wanted: str | None = None):
            """The next sweep's model (`wanted`, if that is still to run), or None when done."""
            with lock:
                if not order or time.monotonic() > deadline:
                    return None
                with ledger.lock:
                    ledger.started += 1
                return order.pop(order.index(wanted) if wanted in order else 0)

        stop = threading.Event()
        running: dict = {}
        threads = [threading.Thread(target=api_writer, args=(jobs, cfg, ledger, running, stop, stats), daemon=True)]
        threads += [
            threading.Thread(target=cli_writer, args=(w, jobs, cfg, ledger, running, stop), daemon=True)
            for w in range(1, args.writers)
        ]
        for t in threads:
            t.start()
        chaos_stop = threading.Event()
        chaos_rng = random.Random(args.seed + 1)
        chaos_thread = threading.Thread(
            target=chaos, args=(cfg, ledger, running, fs, chaos_stop, chaos_rng), daemon=True
        )
        chaos_thread.start()
        for t in threads:
            t.join()
        chaos_stop.set()
        chaos_thread.join(timeout=60)
        leaked_temp, where = leftovers(cfg, ledger, fs)
        for w in where[:10]:
            ledger.note(f"leftover: {w}")
    time.sleep(2)  # processes killed last need a moment to be reaped
    leaked = marked_processes(mark)
    samples = stats.get("samples", [])
    at = min(stats.get("base", len(samples) - 1), len(samples) - 1)
    base = samples[at] if samples else (0, 0)  # once every kind of model was swept in the API writer
    last = samples[-1] if samples else (0, 0)
    measured = samples[at:]
    fd_floor = (min(f for f, _ in measured[-3:]) - min(f for f, _ in measured[:3])) if measured else 0
    report = {
        "sweeps": ledger.finished,
        "served_corrupt": ledger.served_corrupt,
        "tracebacks": ledger.tracebacks,
        "hangs": ledger.hangs,
        "leaked_temp": leaked_temp,
        "leaked_processes": len(leaked),
        "leaked_fds": max(0, fd_floor),
        "rss_growth": round((last[1] - base[1]) / base[1], 4) if base[1] else 0.0,
        "requested": args.sweeps,
        "started": ledger.started,
        "writers": args.writers,
        "killed_sweeps": ledger.killed_sweeps,
        "killed_workers": ledger.killed_workers,
        "corruptions": dict(sorted(ledger.corruptions.items())),
        "exit_codes": dict(sorted(ledger.exit_codes.items())),
        "api_sweeps_measured": len(samples) - at - 1 if samples else 0,
        "api_fds": [f for f, _ in measured],
        "seconds": round(time.monotonic() - t0, 1),
        "problems": ledger.problems,
    }
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return report


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sweeps", type=int, default=200, help="sweeps to run in all (default 200)")
    ap.add_argument("--writers", type=int, default=3, help="concurrent writers (default 3; writer 0 is the API)")
    ap.add_argument("--minutes", type=float, default=30, help="no sweep starts after this (default 30)")
    ap.add_argument("--hang-seconds", type=float, default=900, help="a sweep running longer is a hang (default 900)")
    ap.add_argument("--min-gap", type=float, default=4, help="shortest pause between two faults, s (default 4)")
    ap.add_argument("--max-gap", type=float, default=15, help="longest pause between two faults, s (default 15)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--models",
        help="a subset, comma-separated: keras2, keras3, savedmodel, tflite, truncated, wrong-data, pt2, onnx "
        "(default: all; pt2 and onnx need the torch extra)",
    )
    ap.add_argument("--keep", help="work in this folder and keep it (logs, outputs)")
    ap.add_argument("--json", action="store_true", help="print the report as one JSON object")
    args = ap.parse_args()
    if args.writers < 1 or args.sweeps < 1:
        ap.error("--writers and --sweeps must be at least 1")
    report = run(args)
    if args.json:
        print(json.dumps(report))
    else:
        for k, v in report.items():
            print(f"{k:18} {v}")
    bad = any(report[k] for k in ("served_corrupt", "tracebacks", "hangs", "leaked_temp", "leaked_processes"))
    return 1 if bad or report["leaked_fds"] > 0 or report["rss_growth"] >= 0.10 else 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Issue 26: what a team finds after weeks in production. Each defect has its test here (the cache schema's is
in test_workers_cache.py, the .tflite buffer's in test_delegates_validate.py, the GPU-device skip in
test_delegates_gpu_accelerator.py, the long-TMPDIR path in test_report_text.py, the soak in test_soak.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from tests_support import error_messages, one_line_error

from optimize.core import paths
from optimize.core.shown import clip

CLI = [sys.executable, "-c", "from optimize.cli import main; main()"]


# ---- error: lines fit 80 columns, one message ------------------------------------------------------------
def test_error_lines_wrap_to_80_columns_as_one_message(cli, tmp_path):
    """`error:` lines ran 106-370 columns; they wrap at spaces like everything else, continuation lines
    indented under the message, a path kept whole."""
    deep = tmp_path / ("a-folder-with-a-long-name-" * 3) / "model.keras"
    for args, fragment in (
        (["recipes", "show", "nosuch"], "Shipped recipes: android-npu, coreml"),
        (["sweep", str(deep)], f"No model at {deep}."),
        (["sweep", "--executor", "slurm"], "Unknown executor 'slurm'. Use one of: local, ray."),
    ):
        r = cli(*args, env={"COLUMNS": "80"})
        message = one_line_error(r, fragment)
        lines = r.stderr.strip().splitlines()
        assert len(lines) > 1 or len(message) <= 80, args
        assert all(len(line) <= 80 for line in lines if str(deep) not in line), r.stderr
        assert all(line.startswith(("error: ", " " * 7)) for line in lines), r.stderr


def test_error_messages_joins_wrapped_lines():
    text = "error: first part\n       second part\nDropped x: y\nerror: other"
    assert error_messages(text) == ["error: first part second part", "error: other"]


# ---- a closed stdout -----------------------------------------------------------------------------------
def _closed_stdout(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """The CLI with descriptor 1 closed, as `optimize ... >&-` runs it."""
    return subprocess.run(
        [*CLI, *args], stderr=subprocess.PIPE, text=True, cwd=cwd, timeout=600, preexec_fn=lambda: os.close(1)
    )


def test_a_closed_stdout_is_no_traceback(tmp_path, float_tflite):
    """`optimize ... >&-` ended in a traceback ('NoneType' object has no attribute 'flush'). Output to a closed
    stdout is discarded (as with > /dev/null); errors still reach stderr; the exit code says how it went."""
    r = _closed_stdout("recipes", "list")
    assert r.returncode == 0 and r.stderr == "", r.stderr
    r = _closed_stdout("recipes", "show", "nosuch")
    assert r.returncode == 2 and "Traceback" not in r.stderr and "error: No recipe at nosuch" in r.stderr
    r = _closed_stdout("sweep", str(float_tflite), "-o", str(tmp_path / "out"), "--jobs", "0", "--no-cache")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert json.loads((tmp_path / "out" / "study.json").read_text())["candidates"]


# ---- a zoo failure reason is cut at a word --------------------------------------------------------------
def test_clip_cuts_at_a_word_and_says_so():
    text = "the converter failed: " + " ".join(f"word{i}" for i in range(80))
    cut = clip(text, 100)
    assert len(cut) <= 100 and cut.endswith(" ...") and cut[:-4] == text[: len(cut) - 4]
    assert text.startswith(cut[:-4]) and text[len(cut) - 4] == " "  # the cut falls between two words
    assert clip("short", 100) == "short"


def test_zoo_table_cuts_a_failure_reason_at_a_word(capsys):
    from optimize.engine.zoo import ZooEntry, ZooResult
    from optimize.present.report_text import REASON_CHARS, print_zoo

    why = "conversion failed: " + " ".join(["averyveryverylongword"] * 30)
    entry = ZooEntry(name="m", model="m.keras", study="m/study.json", candidates=2, failed={"int8": why})
    print_zoo(ZooResult(created="now", manifest="z.toml", executor="local", cache=None, models=[entry]), width=80)
    out = " ".join(capsys.readouterr().out.split())
    shown = out[out.index("m/int8: ") + len("m/int8: ") :]
    assert shown.startswith(why[:100]) and " ..." in shown
    kept = shown[: shown.index(" ...")]
    assert why.startswith(kept) and why[len(kept)] == " " and len(kept) <= REASON_CHARS  # whole words only


# ---- report refuses what recommend refuses --------------------------------------------------------------
def test_report_refuses_a_study_with_two_candidates_of_one_name(tmp_path, cli):
    from study_fixtures import full_study

    study = full_study()
    twice = study.model_copy(update={"candidates": [*study.candidates, study.candidates[-1]]})
    twice.save(tmp_path / "study.json")
    name = study.candidates[-1].name
    for args in (["report", str(tmp_path / "study.json"), "-o", str(tmp_path / "rep")], ["recommend", "study.json"]):
        r = cli(*args, cwd=tmp_path)
        one_line_error(r, f"two candidates named {name!r}")
    assert not (tmp_path / "rep").exists()


# ---- labels that name no class ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def zero_labels(tmp_path_factory, digits) -> Path:
    """2-D float labels, one column per class of the digits CNN, every row all zeros."""
    p = tmp_path_factory.mktemp("zeros") / "zeros.npz"
    n = len(digits["x_train"])
    np.savez(p, x=digits["x_train"], y=np.zeros((n, 10), np.float32))
    return p


def test_all_zero_2d_labels_are_refused_before_training(keras_model, zero_labels, tmp_path, cli):
    """All-zero 2-D float labels (no class in any row) were trained on. One line, exit 2, nothing written;
    --task regression says zeros are the values and is taken."""
    r = cli("prune", str(keras_model), "--data", str(zero_labels), "-o", str(tmp_path / "p"))
    one_line_error(r, "has no class in any row", "--task regression")
    r = cli("sweep", str(keras_model), "--data", str(zero_labels), "-o", str(tmp_path / "s"))
    one_line_error(r, "has no class in any row")
    assert not (tmp_path / "p").exists() and not (tmp_path / "s").exists()


def test_zero_rows_are_fine_where_some_row_names_a_class():
    from optimize.core.errors import DataError
    from optimize.models.tasks import Head, check_some_class

    head = Head((1, 3), "sigmoid")
    y = np.zeros((4, 3), np.float32)
    with pytest.raises(DataError, match="no class in any row"):
        check_some_class(y, head, "y_train")
    check_some_class(y, head, "y_train", task="regression")
    y[2, 1] = 1.0
    check_some_class(y, head, "y_train")  # multi-label rows may be empty; not all of them


# ---- staging folders of a killed run --------------------------------------------------------------------
def test_a_staging_folder_left_by_a_killed_run_is_cleared_by_the_next_run(tmp_path):
    """A run killed with SIGKILL leaves its staging folder in -o (24 MB in the issue); the next run into the
    same folder removes it. A live run's staging folder (its lock held) is never touched."""
    out = tmp_path / "out"
    code = (
        f"from optimize.core import paths; import time; print(paths.staging({str(out)!r}), flush=True); time.sleep(60)"
    )
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    stage = Path(p.stdout.readline().strip())
    (stage / "int8.tflite").write_bytes(b"x" * 1000)
    try:
        live = paths.staging(out)  # another run while the first lives: its folder stays
        assert stage.is_dir() and live.is_dir()
        paths.discard(live)
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=30)
    again = paths.staging(out)
    assert not stage.exists() and again.is_dir()
    paths.discard(again)
    assert not list(out.glob(".optimize-staging-*"))


def test_a_sweep_killed_with_sigkill_leaves_nothing_after_the_next_run(float_tflite, tmp_path):
    """SIGKILL mid-sweep (its workers die with it): the next sweep into the same -o clears the staging folder,
    and no temporary of either run is left in the temp folder."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp)}
    out = tmp_path / "out"
    args = [*CLI, "sweep", str(float_tflite), "-o", str(out), "--no-cache", "--jobs", "1"]
    p = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not any(out.glob(".optimize-staging-*/*.tflite")):
        time.sleep(0.2)
    p.kill()
    p.wait(timeout=30)
    assert list(out.glob(".optimize-staging-*")), "the sweep was killed before it staged anything"
    time.sleep(1)  # its worker dies with it (PR_SET_PDEATHSIG)
    r = subprocess.run(args, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert not list(out.glob(".optimize-staging-*")) and (out / "study.json").is_file()
    assert sorted(os.listdir(tmp)) == []


# ---- temporaries ---------------------------------------------------------------------------------------
def test_temporaries_in_puts_this_process_and_its_children_in_the_folder(tmp_path):
    import tempfile

    before = tempfile.gettempdir()
    with paths.temporaries_in(tmp_path / "t") as folder:
        assert tempfile.gettempdir() == str(folder) and os.environ["TMPDIR"] == str(folder)
        child = subprocess.run(
            [sys.executable, "-c", "import tempfile; print(tempfile.gettempdir())"], capture_output=True, text=True
        )
        assert child.stdout.strip() == str(folder)
        assert paths.system_tempdir() == Path(before)
    assert tempfile.gettempdir() == before


@pytest.fixture(scope="module")
def keras3_model(tmp_path_factory, digits) -> Path:
    from optimize.models import _tf

    k = _tf.keras3()
    k.utils.set_random_seed(0)
    model = k.Sequential(
        [k.Input((8, 8, 1)), k.layers.Flatten(), k.layers.Dense(16, activation="relu"), k.layers.Dense(10)]
    )
    folder = tmp_path_factory.mktemp("k3tmp")
    model.save(folder / "m3.keras")
    np.savez(folder / "d.npz", **{k_: v[:120] for k_, v in digits.items()})
    return folder


PRUNE3 = [{"technique": "prune", "epochs": 1}, {"technique": "convert", "scheme": "int8"}]


def test_a_keras3_sweep_that_fails_leaves_no_temporary(keras3_model, tmp_path, monkeypatch):
    """A sweep that fails after its workers made the rebuild (here: timing raises) leaves nothing behind."""
    import tempfile

    from optimize.core.recipe import build
    from optimize.engine import schedule, sweeps

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    monkeypatch.setenv("TMPDIR", str(tmp))

    def broken(*a, **kw):
        assert list((tmp_path / "out").glob(".optimize-staging-*/.work/*/*/keras2/*.keras")), "no rebuild made"
        raise RuntimeError("the timing failed")

    monkeypatch.setattr(schedule, "time_and_store", broken)
    with pytest.raises(RuntimeError, match="the timing failed"):
        sweeps.sweep(
            keras3_model / "m3.keras", keras3_model / "d.npz", tmp_path / "out", [build("prune-int8", PRUNE3)],
            jobs=1, cache=False, runs=3,
        )  # fmt: skip
    out = tmp_path / "out"  # made by the sweep: removed again, or left empty
    assert sorted(os.listdir(tmp)) == [] and (not out.exists() or sorted(os.listdir(out)) == [])
    assert tempfile.tempdir == str(tmp) and os.environ["TMPDIR"] == str(tmp)  # restored


@pytest.mark.parametrize("ending", ["success", "SIGTERM", "SIGINT"])
def test_a_keras3_sweep_leaves_no_temporary_however_it_ends(keras3_model, tmp_path, ending):
    """Every Keras 3 sweep left an `optimize-keras2-*` folder (a copy of the model) in the temp folder. The
    rebuild now lives in the run's staging folder, with every other temporary of the run and its workers:
    gone on success, on SIGTERM and on Ctrl-C (and on a failure: the test above)."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    out = tmp_path / "out"
    sweep = [*CLI, "sweep", str(keras3_model / "m3.keras"), "-d", str(keras3_model / "d.npz"), "-o", str(out)]
    sweep += ["--no-cache", "--jobs", "1"]
    env = {**os.environ, "TMPDIR": str(tmp)}
    if ending == "success":
        r = subprocess.run(sweep, env=env, capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, r.stderr[-2000:]
        study = json.loads((out / "study.json").read_text())
        assert any(c["name"] == "prune-int8" and c["error"] is None for c in study["candidates"])
    else:
        p = subprocess.Popen(sweep, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not list(out.glob(".optimize-staging-*/.tmp")):
            time.sleep(0.2)
        time.sleep(3)  # into the work
        p.send_signal(signal.SIGTERM if ending == "SIGTERM" else signal.SIGINT)
        err = p.communicate(timeout=120)[1]
        assert p.returncode == (143 if ending == "SIGTERM" else 130) and "Traceback" not in err, err[-2000:]
        assert not list(out.glob(".optimize-staging-*"))
    time.sleep(1)
    assert sorted(os.listdir(tmp)) == [], ending


def test_a_single_run_keeps_its_temporaries_in_its_work_folder(float_tflite, tmp_path):
    """quantize (and prune, cluster, qat, run) produce in a worker process: its temporaries go into the run's
    .work folder, removed at the end (a worker killed on Ctrl-C cannot clean up after itself)."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    out = tmp_path / "out"
    args = [*CLI, "quantize", str(float_tflite), "--scheme", "dynamic", "-o", str(out / "q.tflite")]
    r = subprocess.run(args, env={**os.environ, "TMPDIR": str(tmp)}, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert sorted(os.listdir(tmp)) == [] and sorted(os.listdir(out)) == ["q.tflite"]


def test_a_run_killed_while_removing_its_staging_folder_leaves_it_to_the_next_run(tmp_path, monkeypatch):
    """The lock file goes last: a run killed while removing its `.work` (seconds, for a big model) left a staging
    folder with no lock file, judged by its age for an hour (benchmarks/soak.py found one)."""
    import shutil

    stage = paths.staging(tmp_path / "out")
    (stage / ".work" / "w").mkdir(parents=True)
    (stage / ".work" / "w" / "x.tflite").write_bytes(b"x" * 1000)
    real = shutil.rmtree

    def killed(path, *a, **k):
        raise SystemExit("killed")  # the process dies here, its lock file still in place

    monkeypatch.setattr(shutil, "rmtree", killed)
    with pytest.raises(SystemExit):
        paths.discard(stage)
    monkeypatch.setattr(shutil, "rmtree", real)
    paths._release(stage)  # what the kernel does for a killed process: its flock is gone
    assert (stage / paths.LOCK).exists()
    assert paths.clear_stale(tmp_path / "out") == [stage] and not stage.exists()

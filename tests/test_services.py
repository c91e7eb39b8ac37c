"""Issue 26: external services checked before the work starts (one line, exit 2, nothing written) and
failures to log after it are warnings; a Ray head on loopback works with the address the user gives, a
stale ~/.ray/auth_token included; Ray's own output never reaches stdout. Servers on 127.0.0.1 only."""

from __future__ import annotations

import json
import logging
import os
import secrets

import pytest
from servers import free_port, moto_s3, ray_head
from tests_support import one_line_error

pytestmark = pytest.mark.slow


# ---- MLflow -------------------------------------------------------------------------------------------
def test_an_mlflow_file_store_is_used_not_a_traceback_after_the_work(float_tflite, tmp_path, cli):
    """MLflow 3.17 refuses `file://` stores unless MLFLOW_ALLOW_FILE_STORE=true: the sweep ran, then ended in a
    traceback. A user who names a file store wants the runs there: optimize opts its own client in."""
    pytest.importorskip("mlflow")
    store = (tmp_path / "mlruns").as_uri()
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_ALLOW_FILE_STORE"}
    r = cli("sweep", str(float_tflite), "-o", str(tmp_path / "out"), "--jobs", "0", "--mlflow", store, env=env)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-3000:]
    from mlflow.tracking import MlflowClient

    os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"  # for reading it back here
    try:
        client = MlflowClient(tracking_uri=store)
        runs = client.search_runs([client.get_experiment_by_name("optimize").experiment_id])
    finally:
        os.environ.pop("MLFLOW_ALLOW_FILE_STORE")
    study = json.loads((tmp_path / "out" / "study.json").read_text())
    assert len(runs) == 1 + len(study["candidates"])  # the parent and one child per candidate


def test_an_mlflow_store_that_is_refused_or_unreachable_is_one_line_before_any_work(float_tflite, tmp_path, cli):
    pytest.importorskip("mlflow")
    store = (tmp_path / "mlruns").as_uri()
    r = cli(
        "sweep",
        str(float_tflite),
        "-o",
        str(tmp_path / "a"),
        "--mlflow",
        store,
        env={"MLFLOW_ALLOW_FILE_STORE": "false"},
    )
    one_line_error(r, "MLflow refuses the plain-file store", "sqlite:///")
    port = free_port()  # nothing listens there
    r = cli("sweep", str(float_tflite), "-o", str(tmp_path / "b"), "--mlflow", f"http://127.0.0.1:{port}", timeout=120)
    one_line_error(r, f"No MLflow tracking server answers at http://127.0.0.1:{port}")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_a_failure_to_log_after_the_work_is_a_warning(caplog):
    from optimize.present.tracking import log_safely

    def refuses(*_):
        raise RuntimeError("the tracking server went away\nwith a long story")

    with caplog.at_level(logging.WARNING):
        assert log_safely(refuses, "uri") is False
    (rec,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert (
        rec.getMessage()
        == "Could not log to MLflow (the tracking server went away with a long story); the results are kept."
    )


# ---- S3 -----------------------------------------------------------------------------------------------
def test_an_s3_cache_whose_bucket_does_not_exist_is_one_line_before_any_work(float_tflite, tmp_path, cli):
    pytest.importorskip("s3fs")
    with moto_s3() as bucket:
        env = {k: os.environ[k] for k in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
        r = cli("sweep", str(float_tflite), "-o", str(tmp_path / "a"), "--cache", "s3://no-such-bucket/opt", env=env)
        one_line_error(r, "Cannot use the cache s3://no-such-bucket/opt", "does not exist")
        ok = cli(
            "sweep", str(float_tflite), "-o", str(tmp_path / "b"), "--jobs", "0", "--cache", f"{bucket}/c", env=env
        )
        assert ok.returncode == 0, ok.stderr[-2000:]
    assert not (tmp_path / "a").exists()
    port = free_port()  # an S3 endpoint where nothing listens: bounded, one line
    env = {**env, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_MAX_ATTEMPTS": "2"}
    r = cli("sweep", str(float_tflite), "-o", str(tmp_path / "c"), "--cache", "s3://bucket/opt", env=env, timeout=180)
    one_line_error(r, "Cannot use the cache s3://bucket/opt")


def test_an_s3_cache_whose_bucket_refuses_writes_is_one_line_before_any_work(float_tflite, tmp_path, cli):
    """A real refusal: moto checks every request against its IAM once the bucket, a user allowed only to read
    and that user's key are made; the CLI runs with that key."""
    pytest.importorskip("s3fs")
    import boto3

    with moto_s3("read-only", unchecked=3) as bucket:
        iam = boto3.client("iam")
        iam.create_user(UserName="reader")
        read_only = {"Effect": "Allow", "Action": ["s3:GetObject", "s3:ListBucket"], "Resource": "*"}
        iam.put_user_policy(
            UserName="reader",
            PolicyName="read-only",
            PolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": [read_only]}),
        )
        key = iam.create_access_key(UserName="reader")["AccessKey"]
        env = {
            "AWS_ENDPOINT_URL": os.environ["AWS_ENDPOINT_URL"],
            "AWS_ACCESS_KEY_ID": key["AccessKeyId"],
            "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"],
        }
        r = cli("sweep", str(float_tflite), "-o", str(tmp_path / "a"), "--cache", f"{bucket}/opt", env=env)
        one_line_error(r, f"Cannot use the cache {bucket}/opt", "permission denied")
        reader = boto3.client(
            "s3", aws_access_key_id=key["AccessKeyId"], aws_secret_access_key=key["SecretAccessKey"]
        )  # the bucket is there and readable with that key, and the probe was refused, not written
        assert reader.list_objects_v2(Bucket="read-only")["KeyCount"] == 0
    assert not (tmp_path / "a").exists()


def test_an_s3_cache_uses_the_endpoint_and_credentials_of_now_not_of_an_earlier_store():
    """One process (an API caller, a notebook, a zoo) opens an s3:// cache, then the endpoint changes: the next
    store talks to the new one. fsspec's instance cache alone would hand back the first filesystem, still aimed
    at the old endpoint (stopped here), and every request would fail to connect."""
    pytest.importorskip("s3fs")
    from optimize.engine.storage import open_store

    with moto_s3("first") as bucket:
        assert open_store(f"{bucket}/c").create("k", b"one")
    with moto_s3("second") as bucket:  # another server, on another port; the first one is gone
        store = open_store(f"{bucket}/c")
        assert store.create("k", b"two") and store.read("k", 10) == b"two"


# ---- Ray ----------------------------------------------------------------------------------------------
def test_an_unreachable_ray_address_is_one_line_in_bounded_time(float_tflite, tmp_path, cli):
    pytest.importorskip("ray")
    port = free_port()
    r = cli(
        "sweep",
        str(float_tflite),
        "-o",
        str(tmp_path / "a"),
        "--executor",
        "ray",
        "--ray-address",
        f"127.0.0.1:{port}",
        timeout=120,
    )
    one_line_error(r, f"Nothing answers at the Ray address 127.0.0.1:{port}", "ray start --head")
    assert not (tmp_path / "a").exists()


def test_a_loopback_address_keeps_ray_on_loopback(monkeypatch):
    pytest.importorskip("ray")
    from optimize.core.errors import OptimizeError
    from optimize.engine import executors
    from optimize.engine.ray_executor import is_loopback

    assert is_loopback("127.0.0.1:6379") and is_loopback("localhost:1") and is_loopback("[::1]:6379")
    assert not is_loopback("10.1.2.3:6379") and not is_loopback(None)
    monkeypatch.delenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", raising=False)
    with pytest.raises(OptimizeError):
        executors.check("ray", f"127.0.0.1:{free_port()}")
    assert os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0"  # set before Ray could rewrite the address


def test_a_ray_head_with_a_stale_auth_token_takes_the_address_given_and_json_stays_json(float_tflite, tmp_path, cli):
    """The head was started as the README says on a machine where an earlier session left ~/.ray/auth_token
    (so it requires the token); optimize's client presents it. stdout under --json is the record alone."""
    pytest.importorskip("ray")
    home = tmp_path / "home"
    (home / ".ray").mkdir(parents=True)
    (home / ".ray" / "auth_token").write_text(secrets.token_hex(16))
    with ray_head(home) as (address, mode):
        assert mode == "token"
        env = {"HOME": str(home)}
        args = ["sweep", str(float_tflite), "-o", str(tmp_path / "out"), "--executor", "ray", "--ray-address", address]
        r = cli(*args, "--json", "--no-cache", env=env, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    study = json.loads(r.stdout)  # nothing but the record on stdout
    assert study["executor"] == "ray" and all(c["error"] is None for c in study["candidates"])


def test_ray_notices_go_to_the_log_never_stdout(capsys, caplog):
    """Ray prints raylet notices (`A worker died ...`, coloured) on the driver's stdout; optimize sends them to
    the log, plain and on one line."""
    pytest.importorskip("ray")
    import ray._private.worker as worker

    from optimize.engine.ray_executor import _ray_output_to_log

    before = worker.print_to_stdstream
    try:
        _ray_output_to_log()
        with caplog.at_level(logging.INFO, logger="optimize"):
            worker.print_to_stdstream(
                {
                    "lines": ["\x1b[31mA worker died or was killed\x1b[0m while\n executing a task."],
                    "pid": "raylet",
                    "is_err": False,
                },
                ignore_prefix=False,
            )
    finally:
        worker.print_to_stdstream = before
    assert capsys.readouterr().out == ""
    assert "(raylet) A worker died or was killed while executing a task." in [r.getMessage() for r in caplog.records]


def test_a_local_ray_for_the_run_leaves_no_process_and_no_temporary(float_tflite, tmp_path, cli):
    """`--executor ray` without an address starts a local Ray for the run: its processes end with the run, its
    session folder (logs, sockets) and the run's node folders are removed, and stdout is the JSON record."""
    pytest.importorskip("ray")
    psutil = pytest.importorskip("psutil")
    import glob

    tmp, home = tmp_path / "t", tmp_path / "home"
    tmp.mkdir()
    home.mkdir()
    mark = secrets.token_hex(8)
    before = set(glob.glob("/tmp/optimize-ray-*"))
    args = ["sweep", str(float_tflite), "-o", str(tmp_path / "out"), "--executor", "ray", "--json", "--no-cache"]
    r = cli(*args, env={"TMPDIR": str(tmp), "OPTIMIZE_TEST_MARK": mark, "HOME": str(home)}, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout)["executor"] == "ray"
    assert sorted(os.listdir(tmp)) == [] and set(glob.glob("/tmp/optimize-ray-*")) == before
    # Ray 2.60 writes ~/.ray/auth_token for every new local cluster unless a token is in the environment: the
    # stale token that later makes `ray start --head` demand it. The run's Ray used a private one.
    assert not (home / ".ray").exists()
    alive = []
    for p in psutil.process_iter(["pid"]):
        try:
            if p.environ().get("OPTIMIZE_TEST_MARK") == mark:
                alive.append(" ".join(p.cmdline())[:120])
        except psutil.Error:
            continue
    assert alive == []


def test_two_local_rays_in_one_process_both_start(tmp_path):
    """Ray's client keeps the first token it read for the life of the process: a second local Ray for a second
    run in the same Python session (two zoos, or a benchmark's start-up probe and then its zoo) was refused its
    own GCS ("InvalidAuthToken") when each run had a token of its own. Both start now, and the environment is
    left as it was."""
    pytest.importorskip("ray")
    import subprocess
    import sys

    script = (
        "import os\n"
        "from optimize.engine.ray_executor import RayExecutor\n"
        "for i in range(2):\n"
        "    ex = RayExecutor(); ex._connect(); ex.close(); print('started', i, flush=True)\n"
        "print('token left', 'RAY_AUTH_TOKEN' in os.environ)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    env["HOME"] = str(tmp_path)  # no ~/.ray/auth_token of the machine's
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split("\n")[:3] == ["started 0", "started 1", "token left False"], r.stdout


def test_a_client_the_workers_cannot_answer_is_one_line_not_a_hang(float_tflite, tmp_path, cli):
    """A head started without token authentication while this user has a Ray token (so optimize, like
    `ray start`, presents it): the workers' replies are refused and the client would wait for ever. A first
    streaming reply is awaited for a bounded time; then one line, exit 2."""
    pytest.importorskip("ray")
    home = tmp_path / "home"
    (home / ".ray").mkdir(parents=True)
    (home / ".ray" / "auth_token").write_text(secrets.token_hex(16))
    with ray_head(home, RAY_AUTH_MODE="disabled") as (address, mode):
        assert mode == "disabled"
        args = ["sweep", str(float_tflite), "-o", str(tmp_path / "out"), "--executor", "ray", "--ray-address", address]
        env = {"HOME": str(home), "OPTIMIZE_RAY_REPLY_TIMEOUT_S": "20"}
        r = cli(*args, "--no-cache", env=env, timeout=600)
    one_line_error(r, "cannot answer this client", "RAY_AUTH_MODE")
    assert not list((tmp_path / "out").glob("*.tflite"))

"""Real servers for the distributed tests, each listening on 127.0.0.1 only: moto's S3 API and a Ray cluster.

Each is started by the test session and stopped by the process id it started (never by name).
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

LOOPBACK = "127.0.0.1"
TESTS = str(Path(__file__).resolve().parent)
os.environ.update({"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"})  # before Ray is imported: see ray_executor


def free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def _wait_for(port: int, proc: subprocess.Popen, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection((LOOPBACK, port), timeout=1):
            return
        time.sleep(0.2)
    raise TimeoutError(f"nothing listens on {LOOPBACK}:{port}")


@contextlib.contextmanager
def moto_s3(bucket: str = "optimize-test", unchecked: int | None = None):
    """moto's S3 server on 127.0.0.1, the AWS environment pointing at it, and a bucket.

    `unchecked`: after making the bucket (one request), moto lets that many more requests through (e.g. to
    set up IAM users), then authenticates and authorizes every request against its own IAM
    (INITIAL_NO_AUTH_ACTION_COUNT). None: nothing is ever checked.
    """
    port = free_port()
    exe = Path(sys.executable).with_name("moto_server")
    cmd = [str(exe)] if exe.is_file() else [sys.executable, "-m", "moto.server"]
    server_env = {**os.environ}
    if unchecked is not None:
        server_env["INITIAL_NO_AUTH_ACTION_COUNT"] = str(1 + unchecked)
    proc = subprocess.Popen(
        [*cmd, "-H", LOOPBACK, "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=server_env
    )
    env = {
        "AWS_ENDPOINT_URL": f"http://{LOOPBACK}:{port}",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        _wait_for(port, proc)
        import boto3

        boto3.client("s3").create_bucket(Bucket=bucket)  # exactly one request (s3fs's mkdir makes more)
        yield f"s3://{bucket}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def ray_cluster(num_cpus: int = 2):
    """A Ray head (with `num_cpus` CPUs) started by this process on 127.0.0.1; yields its address.

    Workers import the test fixtures (tests/ on their path). `ray.cluster_utils.Cluster` stops exactly
    the processes it started.
    """
    from optimize.engine.ray_executor import loopback_only

    loopback_only()
    # the head without token authentication, and the client told so: a ~/.ray/auth_token left on the machine
    # would otherwise turn the client's on alone (as `ray start --head` does for a head started after it)
    auth = os.environ.get("RAY_AUTH_MODE")
    os.environ["RAY_AUTH_MODE"] = "disabled"
    paths = [TESTS, *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]]
    old_path = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": num_cpus,
            "include_dashboard": False,
            "node_ip_address": LOOPBACK,
            "object_store_memory": 200 * 2**20,
        },
    )
    try:
        yield cluster
    finally:
        cluster.shutdown()
        if auth is None:
            os.environ.pop("RAY_AUTH_MODE", None)
        else:
            os.environ["RAY_AUTH_MODE"] = auth
        if old_path is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old_path


def listeners(pids: set[int]) -> list[str]:
    """Listening TCP addresses of the given processes (from `ss`), to check nothing is off loopback."""
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True).stdout
    return [line.split()[3] for line in out.splitlines() if any(f"pid={p}," in line for p in pids)]


HEAD = r"""
import os, sys
from ray._private.authentication.authentication_token_setup import maybe_enable_token_auth_if_token_available
maybe_enable_token_auth_if_token_available(warn_if_disabled=False)  # what `ray start --head` does
from ray.cluster_utils import Cluster
cluster = Cluster(initialize_head=True, head_node_args={
    "num_cpus": 1, "include_dashboard": False, "node_ip_address": "127.0.0.1", "object_store_memory": 200 * 2**20})
print(cluster.address, os.environ.get("RAY_AUTH_MODE"), flush=True)
sys.stdin.readline()
cluster.shutdown()
"""


@contextlib.contextmanager
def ray_head(home: Path, **head_env: str):
    """A Ray head on 127.0.0.1 started as `ray start --head` would be on a machine whose user has `home`
    (a ~/.ray/auth_token there turns token authentication on), in its own process; yields (address, auth mode).
    Stopped by closing its stdin: it shuts down exactly the processes it started."""
    env = {**os.environ, "HOME": str(home), "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    env.pop("RAY_AUTH_MODE", None)
    env.update(head_env)
    proc = subprocess.Popen(
        [sys.executable, "-c", HEAD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        env=env, text=True,
    )  # fmt: skip
    try:
        address, mode = proc.stdout.readline().split()
        yield address, mode
    finally:
        proc.stdin.close()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)

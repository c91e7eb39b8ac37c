"""MLflow tracking: one parent run per model, one child run per candidate, through MLflow's client API.

Each child run carries the recipe's steps as params (`step0.technique = convert`, `step0.scheme = int8`,
...), the backend, the library versions, the executor and the node that timed it; metrics `size_bytes`,
`gzip_bytes`, `p50_ms`, accuracy (`top1`, `accuracy_delta`, or `mae` and `error_ratio`) and fidelity
(`top1_agreement`, `decision_agreement` for sigmoid outputs, `relative_error`); the `.tflite` as an artifact;
delegate verdicts as tags (`delegate.gpu = full 12/12`). A failed candidate is a FAILED run with its reason as a tag. The parent
run carries the study and the model's report as artifacts.

`--mlflow` alone means `./mlruns`: a folder holding MLflow's SQLite store (`mlflow.db`, the backend
MLflow recommends; view it with `mlflow ui --backend-store-uri sqlite:///mlruns/mlflow.db`) and its
artifacts. Any tracking URI (`http://127.0.0.1:5000`, `sqlite:///...`, `postgresql://...`) is used as is.
A `file://` URI is an MLflow 2 plain-file store: MLflow 3 keeps those in maintenance mode and refuses them
unless `MLFLOW_ALLOW_FILE_STORE=true`; a user who names one wants the runs there, so optimize opts its own
client in (one note says so, and that `sqlite:///...` is MLflow's supported local store), unless the variable
is set to something else (then one line refuses it before any work).

The store is checked before any work (`check`: reachable within CHECK_TIMEOUT_S, accepted, the experiment
made or found): a store that cannot be used is one line and exit 2. Logging after the work (`log_study`,
`log_zoo`) never ends the run: a failure is one warning, and the study and its files are kept.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from optimize.core.errors import OptimizeError
from optimize.core.paths import environment, is_url
from optimize.core.results import Candidate, Study

log = logging.getLogger(__name__)
DEFAULT = "./mlruns"
EXPERIMENT = "optimize"
CHECK_TIMEOUT_S = 10.0
FILE_STORE = "MLFLOW_ALLOW_FILE_STORE"


def _client(uri: str):
    try:
        from mlflow.tracking import MlflowClient
    except ImportError:
        raise OptimizeError(
            "--mlflow needs MLflow.", 'Install the distributed extra: pip install -e ".[distributed]".'
        ) from None
    tracking, artifacts = resolve(uri)
    return MlflowClient(tracking_uri=tracking), artifacts


def _file_store(tracking: str) -> None:
    """Opt this process's MLflow client into a plain-file store the user named (MLflow 3 refuses it otherwise),
    or refuse it in one line when the user set MLFLOW_ALLOW_FILE_STORE to something other than true."""
    if not tracking.startswith("file:"):
        return
    value = os.environ.get(FILE_STORE)
    if value is None:
        os.environ[FILE_STORE] = "true"
        log.info(
            "MLflow: %s is a plain-file store (MLflow 3 keeps those in maintenance mode): logging to it with "
            "%s=true; sqlite:///<folder>/mlflow.db is MLflow's supported local store.",
            tracking,
            FILE_STORE,
        )
    elif value.strip().lower() not in ("true", "1"):
        raise OptimizeError(
            f"MLflow refuses the plain-file store {tracking} ({FILE_STORE}={value}).",
            f"Use a database store (--mlflow sqlite:///path/mlflow.db; `mlflow migrate-filestore` moves old runs), "
            f"or set {FILE_STORE}=true.",
        )


def _reachable(tracking: str) -> None:
    """An HTTP tracking server answers (TCP) within CHECK_TIMEOUT_S: MLflow's own client retries for minutes."""
    import socket
    from urllib.parse import urlparse

    u = urlparse(tracking)
    if u.scheme not in ("http", "https") or not u.hostname:
        return
    port = u.port or (443 if u.scheme == "https" else 80)
    try:
        with socket.create_connection((u.hostname, port), timeout=CHECK_TIMEOUT_S):
            pass
    except OSError as e:
        why = "no answer" if isinstance(e, TimeoutError) else (e.strerror or type(e).__name__)
        raise OptimizeError(
            f"No MLflow tracking server answers at {tracking} ({why}).",
            "Start it (mlflow server --host 127.0.0.1 --port PORT), or pass --mlflow with a local folder.",
        ) from None


def check(uri: str | None) -> None:
    """Before any work: the MLflow store can be used (reachable, accepted by MLflow, its experiment made or
    found), else one OptimizeError line (exit 2). HTTP requests are made without MLflow's long retries."""
    tracking, artifacts = resolve(uri)
    _file_store(tracking)
    _reachable(tracking)
    quick = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": str(int(CHECK_TIMEOUT_S))}
    try:
        with environment(quick):
            client, artifacts = _client(uri)
            _experiment(client, artifacts)
    except OptimizeError:
        raise
    except Exception as e:  # noqa: BLE001 - MLflow's many refusals: one line, before the work
        raise OptimizeError(
            f"MLflow cannot use the tracking store {tracking}: {_first(e)}",
            "Pass --mlflow with a folder (a local SQLite store), sqlite:///path/mlflow.db or a running server.",
        ) from None


def _first(e: BaseException) -> str:
    from optimize.core.shown import clip

    return clip(str(e), 200) or type(e).__name__


def resolve(uri: str | None) -> tuple[str, str | None]:
    """(tracking URI, artifact location for a new experiment): a folder becomes a SQLite store in it."""
    uri = uri or DEFAULT
    if is_url(uri):
        return uri, None
    folder = Path(uri).expanduser().resolve()
    folder.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{folder / 'mlflow.db'}", (folder / "artifacts").as_uri()


def _experiment(client, artifacts: str | None, name: str = EXPERIMENT) -> str:
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    return client.create_experiment(name, artifact_location=artifacts)


def params(c: Candidate, study: Study, executor: str) -> dict[str, str]:
    """Everything that made the candidate: its steps with their params, backend, versions, where it ran."""
    out = {"recipe": c.name, "scheme": str(c.scheme), "backend": str(c.backend or ""), "executor": executor}
    for i, step in enumerate(c.steps):
        for k, v in step.flat().items():
            if v is not None:
                out[f"step{i}.{k}"] = str(v)[:500]
    for lib, version in study.environment.versions.items():
        out[f"version.{lib}"] = str(version)
    out["threads"] = str(study.environment.threads)
    if c.node:
        out["node"] = c.node
    return out


def metrics(c: Candidate) -> dict[str, float]:
    m = c.metrics
    if m is None:
        return {}
    out: dict[str, float] = {"size_bytes": m.size.bytes, "gzip_bytes": m.size.gzip_bytes}
    if m.latency is not None:
        out["p50_ms"] = m.latency.p50_ms
    if m.accuracy is not None:
        for k in ("top1", "topk", "auc", "mae", "rmse"):
            v = getattr(m.accuracy, k)
            if v is not None:
                out[k] = v
    for k in ("accuracy_delta", "error_ratio"):
        if getattr(m, k) is not None:
            out[k] = getattr(m, k)
    if m.fidelity is not None:
        if m.fidelity.top1_agreement is not None:
            out["top1_agreement"] = m.fidelity.top1_agreement
        decisions = [o.decision_agreement for o in m.fidelity.outputs if o.decision_agreement is not None]
        if decisions:
            out["decision_agreement"] = min(decisions)
        if m.fidelity.relative_error is not None:
            out["relative_error"] = m.fidelity.relative_error
    if m.memory is not None:
        out["peak_rss_bytes"] = m.memory.peak_rss_bytes
    return out


def tags(c: Candidate) -> dict[str, str]:
    out = {f"delegate.{name}": f"{r.verdict} {r.nodes_delegated}/{r.nodes_total}" for name, r in c.delegates.items()}
    if c.cached:
        out["cached"] = "true"
    if c.error:
        out["error"] = c.error[:4000]
        out["error_kind"] = c.error_kind or ""
    return out


def _log_candidate(client, exp: str, parent: str, c: Candidate, study: Study, folder: Path) -> str:
    from mlflow.entities import Metric, Param

    run = client.create_run(exp, run_name=c.name, tags={"mlflow.parentRunId": parent, **tags(c)})
    rid = run.info.run_id
    now = int(time.time() * 1000)
    client.log_batch(
        rid,
        metrics=[Metric(k, float(v), now, 0) for k, v in metrics(c).items()],
        params=[Param(k, v) for k, v in params(c, study, study.executor).items()],
    )
    if c.artifact and (folder / c.artifact).is_file():
        client.log_artifact(rid, str(folder / c.artifact))
    client.set_terminated(rid, status="FINISHED" if c.ok else "FAILED")
    return rid


def log_study(uri: str | None, study: Study, folder: Path, name: str | None = None, extra: dict | None = None) -> str:
    """One parent run for the model, one child per candidate; returns the parent's run id."""
    _file_store(resolve(uri)[0])
    client, artifacts = _client(uri)
    exp = _experiment(client, artifacts)
    model_tags = {"model": study.model, "model_fingerprint": study.model_fingerprint, "executor": study.executor}
    parent = client.create_run(exp, run_name=name or Path(study.model).stem, tags={**model_tags, **(extra or {})})
    pid = parent.info.run_id
    for c in study.candidates:
        _log_candidate(client, exp, pid, c, study, folder)
    for report in ("study.json", "report.md", "report.html"):
        if (folder / report).is_file():
            client.log_artifact(pid, str(folder / report))
    client.set_terminated(pid)
    log.info("MLflow: %s, %d candidate runs under %s", name or study.model, len(study.candidates), pid)
    return pid


def log_safely(log_fn, *args) -> bool:
    """Log after the work: a failure is one warning (the results are kept, the exit code unchanged)."""
    try:
        log_fn(*args)
        return True
    except Exception as e:  # noqa: BLE001 - the store went away, refused a write, ran out of space
        log.warning("Could not log to MLflow (%s); the results are kept.", _first(e))
        return False


def log_zoo(uri: str | None, result, out: Path) -> list[str]:
    """A parent run per model of a zoo (tagged with the zoo's manifest), children per candidate."""
    from optimize.core.results import load_study

    ids = []
    for e in result.models:
        study = load_study(out / e.study)
        ids.append(log_study(uri, study, out / e.name, e.name, {"zoo": result.manifest}))
    return ids

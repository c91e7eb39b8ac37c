"""A model zoo: many models swept through one executor, one study each, and one zoo.json over them all.

    [[models]]
    path = "models/detector.keras"   # relative to the manifest
    data = "data/detector.npz"       # optional
    target = "gpu"                   # optional (or targets = ["gpu", "cpu"]); recipes = [...] optional
    name = "detector"                # optional: the model's folder (default: the file's stem)

Each model gets `DIR/<name>/study.json`, its artifacts and a report; `DIR/zoo.json` holds per model the
pick per target with its size, latency and accuracy against the model's float32 baseline, and what
failed. Every model is planned and checked before any work, so a bad manifest or model is one line.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
import tomllib
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from optimize.core.errors import OptimizeError, from_validation
from optimize.core.recipe import load_recipe
from optimize.core.results import Study, write_atomic
from optimize.core.shown import clip
from optimize.core.vocab import Layout, Target
from optimize.present.progress import Progress

log = logging.getLogger(__name__)
FIX = "See the zoo manifest format: `optimize zoo --help`."
MAX_MANIFEST_BYTES = 1 << 20


class ZooError(OptimizeError):
    """A zoo manifest that cannot be used."""


class ZooModel(BaseModel):
    """One model of a zoo manifest."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str = Field(
        description="The model (Keras, SavedModel folder, float .tflite, .pt2 or .onnx), relative to the manifest."
    )
    data: str | None = Field(None, description="Its .npz data, relative to the manifest.")
    target: Target | None = Field(None, description="The target to pick for.")
    targets: list[Target] | None = Field(None, description="Several targets to pick for.")
    recipes: list[str] | None = Field(
        None, description="Recipe files, shipped recipes or default-sweep names (int8, ...); default: the full sweep."
    )
    name: str | None = Field(None, description="The model's folder under the output (default: the file's stem).")
    layout: Layout = Field(
        Layout.SOURCE, description="A PyTorch or ONNX model's image I/O: source (NCHW) or channels-last (NHWC)."
    )

    @field_validator("name")
    @classmethod
    def _plain_name(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}", v):
            raise ValueError("use letters, digits, '.', '_' and '-' (it names a folder)")
        return v

    def all_targets(self) -> list[Target]:
        return list(dict.fromkeys([*([self.target] if self.target else []), *(self.targets or [])]))


class Manifest(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    models: list[ZooModel] = Field(min_length=1, description="The models, as [[models]] tables.")


class Pick(BaseModel):
    """What the recommender picks for one target, against the model's float32 baseline."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    target: Target
    candidate: str | None = Field(description="The pick, or None when no candidate fits.")
    size_ratio: float | None = Field(None, description="Pick's .tflite size over the float32 baseline's.")
    latency_ratio: float | None = Field(
        None, description="Pick's host-CPU p50 over the baseline's (same node); the cpu target only."
    )
    accuracy_delta: float | None = Field(None, description="Top-1 (or score) change against the baseline.")
    why_none: str | None = None


class ZooEntry(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    model: str
    study: str = Field(description="The model's study.json, relative to zoo.json.")
    candidates: int
    failed: dict[str, str] = Field(default_factory=dict, description="Failed candidate -> its reason.")
    picks: list[Pick] = Field(default_factory=list)
    timing_nodes: list[str] = Field(default_factory=list, description="Where the latencies were measured.")


class ZooResult(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    created: str
    manifest: str
    executor: str
    cache: str | None
    models: list[ZooEntry]

    def save(self, path: Path) -> Path:
        return write_atomic(path, self.model_dump_json(indent=2).encode())


def load_manifest(path: str | Path) -> tuple[Path, list[ZooModel]]:
    """The manifest's models, with paths resolved against its folder; one ZooError line for any problem."""
    p = Path(path)
    if not p.is_file():
        raise ZooError(f"No zoo manifest at {p}.", "Pass a TOML file with [[models]] tables.")
    if p.stat().st_size > MAX_MANIFEST_BYTES:
        raise ZooError(f"{p.name} is larger than any zoo manifest ({MAX_MANIFEST_BYTES:,} bytes).", FIX)
    try:
        raw = tomllib.loads(p.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError, RecursionError) as e:
        raise ZooError(f"{p.name}: not valid TOML ({clip(str(e), 120)}).", FIX) from None
    try:
        manifest = Manifest.model_validate(raw)
    except ValidationError as e:
        raise from_validation(e, Manifest, where=f"{p.name}: ", kind=ZooError, fix=FIX) from None
    models = [_resolved(m, p.parent, i) for i, m in enumerate(manifest.models)]
    names = [m.name for m in models]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup:
        raise ZooError(f"{p.name}: two models are named {dup!r}.", 'Give one of them its own name = "...".')
    return p, models


def _resolved(m: ZooModel, base: Path, i: int) -> ZooModel:
    path = (base / m.path).resolve()
    if not path.exists():
        raise ZooError(f"models[{i}]: no model at {m.path} (relative to the manifest).", "Fix the path.")
    data = None
    if m.data is not None:
        data = (base / m.data).resolve()
        if not data.is_file():
            raise ZooError(f"models[{i}]: no data at {m.data} (relative to the manifest).", "Fix the path.")
    recipes = None
    if m.recipes is not None:
        recipes = [str((base / r).resolve()) if (base / r).is_file() else r for r in m.recipes]
    name = m.name or (path.stem if path.is_file() else path.name)
    return m.model_copy(
        update={"path": str(path), "data": str(data) if data else None, "recipes": recipes, "name": name}
    )


def run_zoo(
    manifest: str | Path,
    output: str | Path,
    executor: str = "local",
    ray_address: str | None = None,
    cache: bool | str = True,
    jobs: int | None = None,
    threads: int = 2,
    delegates: bool = True,
    runs: int = 50,
    progress: Progress | None = None,
    mlflow: str | None = None,
) -> ZooResult:
    """Sweep every model of a manifest through one executor; write each study, report and zoo.json."""
    from optimize.engine.schedule import run_all

    path, models = load_manifest(manifest)
    out = Path(output)
    from optimize.engine.executors import check

    check(executor, ray_address)  # Ray installed, its address answering: one line, before any work
    if mlflow:
        from optimize.present.tracking import check

        check(mlflow)  # before any work: one line when the store cannot be used
    settings = {"threads": threads, "delegates": delegates, "runs": runs, "cache": cache}
    opened = _open_all(path, models, out, settings)
    studies = run_all(opened, jobs, progress, executor, ray_address)
    entries = [_entry(m, s, out) for m, s in zip(models, studies)]
    for m, s in zip(models, studies):
        _report(s, out / m.name, m.all_targets())
    result = ZooResult(
        created=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        manifest=str(path),
        executor=studies[0].executor if studies else executor,
        cache=opened[0].cache.url if opened else None,
        models=entries,
    )
    result.save(out / "zoo.json")
    if mlflow:
        from optimize.present.tracking import log_safely, log_zoo

        log_safely(log_zoo, mlflow, result, out)
    return result


def _open_all(path: Path, models: list[ZooModel], out: Path, settings: dict) -> list:
    """Every model's sweep planned and checked before any work; a bad one is one line naming it, and the
    folders this call made are removed (nothing half-written)."""
    from optimize.engine.runs import open_run

    opened = []
    fresh = [out / m.name for m in models if not (out / m.name).exists()]
    for i, m in enumerate(models):
        try:
            recipes = [_recipe(r) for r in m.recipes] if m.recipes is not None else None
            targets = m.all_targets()
            target = targets[0] if targets else None
            opened.append(
                open_run(m.path, m.data, out / m.name, recipes, target=target, tag=m.name, layout=m.layout, **settings)
            )
        except OptimizeError as e:
            for folder in fresh:
                if folder.is_dir() and not any(folder.iterdir()):
                    folder.rmdir()
            raise type(e)(f"{path.name}: models[{i}] ({m.name}): {e.problem}", e.fix) from None
    return opened


def _recipe(name: str):
    """A recipe file, a shipped recipe, or one of the default sweep's (float16, int8, prune-int8, ...)."""
    from optimize.engine.plan import DEFAULT_SWEEP, build

    steps = dict(DEFAULT_SWEEP).get(name)
    return build(name, steps) if steps is not None and not Path(name).is_file() else load_recipe(name)


def _report(study: Study, folder: Path, targets: list[Target]) -> None:
    from optimize.decide.choose import recommend
    from optimize.present.report import write_report

    rec = recommend(study, targets[0]) if targets and any(c.ok for c in study.candidates) else None
    write_report(study, folder, rec)


def _entry(m: ZooModel, study: Study, out: Path) -> ZooEntry:
    failed = {c.name: c.error or "failed" for c in study.candidates if not c.ok}
    nodes = sorted({c.node for c in study.candidates if c.node})
    if len(nodes) > 1:
        log.warning("%s: latencies come from %d machines (%s); compare them with care", m.name, len(nodes), nodes)
    return ZooEntry(
        name=m.name,
        model=m.path,
        study=f"{m.name}/study.json",
        candidates=len(study.candidates),
        failed=failed,
        picks=[_pick(study, t) for t in (m.all_targets() or [Target.CPU])],
        timing_nodes=nodes,
    )


def _latency_ratio(c, base, target: Target) -> float | None:
    """The pick's host-CPU p50 over the baseline's: the cpu target's only (issue 43: host-CPU latency describes
    no other target)."""
    if target is not Target.CPU or base is None or not c.p50_ms or not base.p50_ms:
        return None
    return c.p50_ms / base.p50_ms


def _pick(study: Study, target: Target) -> Pick:
    from optimize.decide.choose import recommend

    if not any(c.ok for c in study.candidates):
        return Pick(target=target, candidate=None, why_none="every candidate failed")
    try:
        rec = recommend(study, target)
    except OptimizeError as e:
        return Pick(target=target, candidate=None, why_none=clip(e.problem, 160))
    if rec.chosen is None:
        why = "nothing passes the default guard" if rec.warnings else "no candidate fits the target"
        return Pick(target=target, candidate=None, why_none=why)
    c, base = study.candidate(rec.chosen), study.float_reference
    size = c.metrics.size.bytes if c.metrics else None
    base_size = base.metrics.size.bytes if base and base.metrics else None
    m = c.metrics
    return Pick(
        target=target,
        candidate=c.name,
        size_ratio=size / base_size if size and base_size else None,
        latency_ratio=_latency_ratio(c, base, target),
        accuracy_delta=m.accuracy_delta if m else None,
    )

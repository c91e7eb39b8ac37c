"""Typed result records shared by every part of optimize: one candidate record, one study document.

These are pure pydantic models (no TensorFlow). A study is what `sweep` writes as `study.json`, what
the recommender ranks, what the report draws and what the notebooks load.
Units are in the field names; fractions are 0..1.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .errors import StudyError

SCHEMA_VERSION = 1

Scheme = Literal["float32", "float16", "dynamic", "int8", "int16x8"]
SCHEMES: tuple[str, ...] = ("float32", "float16", "dynamic", "int8", "int16x8")


class Record(BaseModel):
    """Base for every record: frozen, and unknown fields are errors (hand-edited nonsense is caught)."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class Size(Record):
    bytes: int = Field(description="Raw .tflite file size.")
    gzip_bytes: int = Field(description="Size after gzip -9: what a download or app bundle costs.")


class Latency(Record):
    """Host-CPU latency in the LiteRT interpreter. Not a device figure: it says where it came from."""

    runtime: str = Field(description="Interpreter and version, e.g. 'ai-edge-litert 2.3.0 (host CPU)'.")
    threads: int
    xnnpack: bool = Field(description="Whether the default XNNPACK delegate was applied.")
    warmup_runs: int
    runs: int
    init_ms: float = Field(description="Interpreter construction + allocate_tensors.")
    first_ms: float = Field(description="First invoke (includes lazy kernel preparation).")
    mean_ms: float
    std_ms: float
    p50_ms: float
    p90_ms: float
    min_ms: float


class Memory(Record):
    """Peak resident memory of a fresh process that loads, allocates and runs the model once."""

    peak_rss_bytes: int = Field(description="Peak RSS growth over the bare runtime import.")
    method: str = Field(default="child process: VmHWM after one run minus VmRSS after importing the runtime")


class OutputFidelity(Record):
    """Per-output difference from the float reference, as TFLite's inference_diff reports it."""

    name: str
    mean_abs_diff: float
    std_abs_diff: float
    max_abs_diff: float


class Fidelity(Record):
    reference: str = Field(description="Artifact the outputs were compared with (the float32 baseline).")
    samples: int
    outputs: list[OutputFidelity]
    top1_agreement: float | None = Field(None, description="Fraction of samples whose argmax matches.")


class Accuracy(Record):
    samples: int
    top1: float | None = None
    topk: float | None = None
    k: int | None = None
    mae: float | None = Field(None, description="Mean absolute error, for regression outputs.")


class Metrics(Record):
    size: Size
    accuracy: Accuracy | None = None
    accuracy_delta: float | None = Field(
        None, description="top-1 (or -MAE) minus the float baseline's; negative is worse."
    )
    fidelity: Fidelity | None = None
    latency: Latency | None = None
    memory: Memory | None = None


class NodeVerdict(Record):
    """One operator that a delegate does not take, with the delegate's own reason."""

    subgraph: int = 0
    index: int
    op: str
    version: int
    reason: str


class DelegateReport(Record):
    """What one delegate would do with one model."""

    delegate: Literal["gpu", "nnapi", "hexagon", "coreml", "xnnpack"]
    source: Literal["rules", "runtime", "rules+runtime"] = Field(
        description="'rules': predicted from the delegate's acceptance rules; 'runtime': observed."
    )
    rules_version: str = Field("", description="Which source the rules follow (file and release).")
    params: dict[str, str | int | float | bool | None] = Field(default_factory=dict)
    nodes_total: int
    nodes_delegated: int
    partitions: int
    verdict: Literal["full", "partial", "none"]
    cpu_nodes: list[NodeVerdict] = Field(default_factory=list)
    hints: list[str] = Field(default_factory=list)
    vetoed: str | None = Field(None, description="Why the whole model stays on the CPU, if it does.")


Target = Literal["cpu", "gpu", "nnapi", "hexagon", "coreml", "edgetpu", "mcu"]
TARGETS: tuple[str, ...] = ("cpu", "gpu", "nnapi", "hexagon", "coreml", "edgetpu", "mcu")


class Goals(Record):
    """What a user will accept. Accuracy drop is a fraction: 0.01 is one point of top-1."""

    max_accuracy_drop: float | None = Field(None, ge=0, le=1)
    max_size_bytes: int | None = Field(None, gt=0)
    max_latency_ms: float | None = Field(None, gt=0)
    objective: Literal["size", "latency", "accuracy"] = "size"


class Step(Record):
    """One resolved pipeline step: a technique name and its params with defaults filled in."""

    technique: str
    params: dict = Field(default_factory=dict)


class Candidate(Record):
    """One optimized variant (or the float baseline): what was done, what it produced, what it measured."""

    name: str
    steps: list[Step]
    recipe_hash: str
    scheme: str = Field(description="Numeric scheme of the final artifact: float32, float16, ...")
    backend: str | None = Field(None, description="What made the .tflite: 'converter' or 'litert'.")
    artifact: str | None = Field(None, description="Path of the .tflite, relative to the study file.")
    metrics: Metrics | None = None
    delegates: dict[str, DelegateReport] = Field(default_factory=dict)
    skipped_layers: list[str] = Field(
        default_factory=list, description="Layers a Keras technique could not wrap and left as they were."
    )
    notes: list[str] = Field(default_factory=list)
    seconds: float = Field(0.0, description="Wall time to produce and measure this candidate.")
    cached: bool = False
    error: str | None = Field(None, description="Why this candidate failed; the rest of the study stands.")

    @property
    def ok(self) -> bool:
        return self.error is None and self.metrics is not None


class Environment(Record):
    python: str
    platform: str
    host: str
    cpu_count: int
    versions: dict[str, str]
    threads: int


class Study(Record):
    """One baseline plus candidates: the single JSON document every part of optimize reads."""

    schema_version: int = SCHEMA_VERSION
    created: str
    model: str = Field(description="Model path or 'demo'.")
    model_fingerprint: str
    data: str | None = None
    baseline: str = Field("float32", description="Name of the baseline candidate.")
    environment: Environment
    candidates: list[Candidate]

    def candidate(self, name: str) -> Candidate:
        for c in self.candidates:
            if c.name == name:
                return c
        raise KeyError(name)

    def to_json(self) -> str:
        return self.model_dump_json(indent=2)

    def save(self, path: str | os.PathLike) -> Path:
        return write_atomic(Path(path), self.to_json().encode())


def load_study(path: str | os.PathLike) -> Study:
    """Read a study.json, with one clear error for a missing, foreign or hand-broken file."""
    p = Path(path)
    if p.is_dir():
        p = p / "study.json"
    if not p.is_file():
        raise StudyError(f"No study at {p}.", "Run `optimize sweep` first, or pass the study.json it wrote.")
    try:
        raw = json.loads(p.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise StudyError(
            f"{p} is not JSON ({e.__class__.__name__}).", "Pass a study.json written by `optimize sweep`."
        ) from None
    if not isinstance(raw, dict) or raw.get("schema_version") != SCHEMA_VERSION:
        found = raw.get("schema_version") if isinstance(raw, dict) else None
        raise StudyError(
            f"{p} has schema_version {found!r}; this optimize reads {SCHEMA_VERSION}.",
            "Re-run `optimize sweep` with this version.",
        )
    try:
        return Study.model_validate(raw)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(x) for x in err["loc"])
        raise StudyError(f"{p} is not a valid study: {where}: {err['msg']}.", "Re-run `optimize sweep`.") from None


def write_atomic(path: Path, data: bytes) -> Path:
    """Write a file so that a crash never leaves half of it: temp file in the same folder, then rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; an output file should read like any other
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path

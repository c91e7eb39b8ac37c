"""The conversion cache: a model converted at the door (PyTorch, ONNX, a TF1 graph) is converted once per source,
input plan and route, then served from `<cache>/converted/` (validated as a .tflite again when it is read), beside
the conversion's own error (`fidelity`) and the folders libraries keep between runs (torch's inductor cache,
ONNX Runtime's telemetry file), which would otherwise land in the temp folder.

The key is the source's fingerprint, the plan (`plan.Plan.key`) and the route: ROUTE_VERSION, the text of the
modules that convert, and the converting libraries' versions, so a change to any of them converts again.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path

from optimize.core import trust
from optimize.core.errors import ModelError
from optimize.core.results import Conversion

ROUTE_VERSION = "1"  # bump when a route changes what it makes (also keyed by the converting modules' text)
#: The modules whose text makes a conversion what it is.
ROUTE_MODULES = (
    "onnx_ops.py", "onnx_graph.py", "names.py", "plan.py", "torch_export.py", "torch_route.py", "onnx_file.py",
    "pt2_file.py", "torch_module.py", "graph_def.py", "route.py", "onnx_base.py", "onnx_dense.py", "onnx_select.py",
    "tflite_fold.py",
)  # fmt: skip
#: The distributions whose versions make a conversion what it is.
ROUTE_LIBRARIES = ("torch", "litert-torch", "onnx", "onnx2torch", "ai-edge-litert", "tensorflow")


def cache_dir() -> Path:
    """`<cache>/converted`: beside the result cache when that is a folder, else ~/.cache/optimize."""
    from optimize.core.paths import default_root, local_path

    root = local_path(default_root())
    if root is None:
        root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "optimize"
    return trust.or_private(root / "converted", "The conversion cache")  # another user's folder: not used


def library_folder(name: str) -> Path | None:
    """A folder of ours in `<cache>/converted` for what a library keeps between runs (torch's inductor cache,
    ONNX Runtime's telemetry session file), which would otherwise land in the temp folder before a run's
    staging folder exists; None when it cannot be made (the library keeps its default)."""
    folder = cache_dir() / name
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return folder


def _route_digest() -> str:
    """What makes a conversion: our converting modules' text and the libraries' versions."""
    from importlib import metadata

    h = hashlib.sha256(ROUTE_VERSION.encode())
    for f in ROUTE_MODULES:
        h.update((Path(__file__).parent / f).read_bytes())
    for dist in ROUTE_LIBRARIES:
        with contextlib.suppress(metadata.PackageNotFoundError):
            h.update(f"{dist}={metadata.version(dist)}".encode())
    return h.hexdigest()


def key(fingerprint: str, plan_key: str) -> str:
    """The cache entry of a source (its fingerprint) converted with an input plan (`Plan.key`) by today's route."""
    return hashlib.sha256(f"{fingerprint}|{plan_key}|{_route_digest()}".encode()).hexdigest()[:24]


def cached(key: str) -> tuple[bytes, Conversion] | None:
    """A conversion made before (bytes validated as a .tflite, its record), or None."""
    from optimize.core.bounded import loads_json
    from optimize.core.paths import read_below
    from optimize.models.tflite import read_model

    root = cache_dir()
    try:
        content = read_below(root, root / f"{key}.tflite", 2**31, "converted model")
        record = read_below(root, root / f"{key}.json", 2**24, "conversion record")
        if content is None or record is None:
            return None
        read_model(content)
        return content, Conversion.model_validate(loads_json(record, key, ModelError, "", "a conversion record"))
    except Exception:  # noqa: BLE001 - a damaged entry is made again
        return None


def store(key: str, content: bytes, record: Conversion) -> None:
    """A conversion kept for the next run (served again only if it validates, `cached`)."""
    from optimize.core.paths import write_atomic

    root = cache_dir()
    with contextlib.suppress(OSError):
        root.mkdir(parents=True, exist_ok=True)
        write_atomic(root / f"{key}.tflite", content, root=root)
        write_atomic(root / f"{key}.json", record.model_dump_json().encode(), root=root)

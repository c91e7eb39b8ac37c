"""PyTorch files read without running code from them, and named in one line when they are not a model we take.

Every torch file is read weights-only. `torch.export.load` (torch 2.13) is not weights-only by itself:

* a pickled member that the safe unpickler refuses is loaded again with `weights_only=False` (sample
  inputs, pickled weights or constants): a crafted pickle there runs its payload;
* constants whose file name starts with `opaque_obj_` are read with plain `pickle.loads`, and `custom_obj_`
  ones with the TorchScript unpickler: `TORCH_FORCE_WEIGHTS_ONLY_LOAD=1` does not reach either.

So `load_pt2` first inspects the archive without unpickling anything: a zip whose `archive_format` says
`pt2`, sane member names and sizes, every constant a tensor, and every pickled member loadable by torch's
weights-only unpickler (which refuses any global outside its allowlist and never calls one). Only then is
`torch.export.load` called, with `TORCH_FORCE_WEIGHTS_ONLY_LOAD=1` set for the call, so none of its
fallbacks can unpickle freely either. TorchScript is never loaded, not even to be inspected: its member
names say what it is. `describe` names what any other torch file is (a state dict, a training checkpoint,
a whole pickled module), reading it weights-only.

torch is imported inside the functions: this module imports without it.
"""

from __future__ import annotations

import contextlib
import io
import os
import zipfile
from pathlib import Path, PurePosixPath

from optimize.convert.pt2_checks import (  # noqa: F401 - known here too (the .pt2 inspection's names)
    EXPORT_PT2,
    MAX_MEMBERS,
    Pt2Facts,
    blocked_global,
    describe_zip,
    inspect_pt2,
    safe_torch_load,
    weights_only_everywhere,
)
from optimize.core.errors import ModelError
from optimize.core.paths import read_bounded


def load_pt2(path: str | os.PathLike):
    """A torch.export.ExportedProgram from a .pt2, read without running code from the file, and its facts."""
    import torch
    from torch._export.serde.schema import SCHEMA_VERSION

    path = Path(path)
    facts = inspect_pt2(path)
    who = f"torch {facts.torch_version}" if facts.torch_version else "an unknown torch"
    if facts.schema is not None and facts.schema[0] != SCHEMA_VERSION[0]:
        raise ModelError(
            f"{path.name} was written by {who} (export schema {facts.schema[0]}.{facts.schema[1]}); torch "
            f"{torch.__version__} reads schema {SCHEMA_VERSION[0]}.x.",
            "Export it again with this torch (torch.export.save).",
        )
    try:
        with weights_only_everywhere(), contextlib.redirect_stderr(io.StringIO()):
            ep = torch.export.load(os.fspath(path))
    except Exception as e:  # noqa: BLE001 - any failure to deserialize is one line naming the writer's torch
        first = (str(e).strip().splitlines() or [e.__class__.__name__])[0][:200]
        raise ModelError(
            f"{path.name} (written by {who}) cannot be read by torch {torch.__version__}: {first}.",
            "Export it again with this torch (torch.export.save).",
        ) from None
    return ep, facts


def is_pt2(path: Path) -> bool:
    """A zip whose members include an `archive_format` file: what torch.export.save writes."""
    try:
        with zipfile.ZipFile(path) as z:
            return any(PurePosixPath(n).name == "archive_format" for n in z.namelist()[:MAX_MEMBERS])
    except (zipfile.BadZipFile, OSError, NotImplementedError, RuntimeError, EOFError):
        return False


def refuse(path: Path) -> ModelError:
    """The one line for a torch file that is not a .pt2 program: what it is, and how to export a .pt2.
    TorchScript is named from its member names and never loaded; anything else is read weights-only."""
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as z:
            kind = describe_zip(z.namelist()[:MAX_MEMBERS])
        if "TorchScript" in kind:
            return ModelError(
                f"{path.name} is {kind}: TorchScript is not read (loading it runs code from the file).", EXPORT_PT2
            )
        if "2.0-2.6" in kind:
            return ModelError(f"{path.name} is {kind}, which this torch does not read.", EXPORT_PT2)
    return ModelError(f"{path.name} is {describe_object(path)}.", EXPORT_PT2)


def describe_object(path: Path) -> str:
    """What a torch.save file holds, read weights-only (nothing in it runs)."""
    import pickle

    data = read_bounded(path, "model", ModelError)
    try:
        obj = safe_torch_load_quiet(data)
    except pickle.UnpicklingError as e:
        return (
            f"a pickled Python object (it needs {blocked_global(e)}): loading it would run code from the file, "
            "so it is not loaded"
        )
    except Exception as e:  # noqa: BLE001 - not a torch file at all
        return f"not a readable torch file ({e.__class__.__name__})"
    return _describe(obj)


def safe_torch_load_quiet(data: bytes):
    import torch

    with weights_only_everywhere():
        return torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")


def _describe(obj) -> str:
    import torch

    def tensors(d) -> bool:
        return isinstance(d, dict) and bool(d) and all(isinstance(v, torch.Tensor) for v in d.values())

    if tensors(obj):
        n = sum(v.numel() for v in obj.values())
        return (
            f"a state dict ({len(obj)} tensors, {n:,} values): weights without the model's code; build the "
            "nn.Module in Python, load them and pass it to the Python API, or export a .pt2"
        )
    if isinstance(obj, dict):
        inner = [k for k, v in obj.items() if tensors(v)]
        if inner:
            keys = ", ".join(str(k)[:20] for k in list(obj)[:5])
            return (
                f"a training checkpoint (keys {keys}) whose {str(inner[0])[:40]!r} is a state dict: weights without "
                "the model's code; build the nn.Module, load them and pass it to the Python API, or export a .pt2"
            )
    return f"a torch.save file holding a {type(obj).__name__}, not a model"

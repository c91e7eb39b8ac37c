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
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from optimize.convert import pt2_checks
from optimize.convert.limits import shown
from optimize.convert.pt2_checks import EXPORT_PT2, MAX_MEMBER_BYTES, MAX_MEMBERS
from optimize.core.bounded import loads_json, read_member
from optimize.core.errors import ModelError
from optimize.core.paths import read_bounded

MAX_JSON_BYTES = 256 << 20  # a program's JSON (its graph) is a few MB; this bounds what is parsed
#: Where pickles sit in a .pt2 that `torch.export.load` unpickles (each is checked weights-only first).
PICKLED_PREFIXES = ("data/sample_inputs/", "data/weights/", "data/constants/")


@dataclass
class Pt2Facts:
    """What the inspection of a .pt2 found: who wrote it, and what it holds that was checked."""

    root: str
    members: int
    pickled: list[str] = field(default_factory=list)  # members the weights-only unpickler accepted
    torch_version: str | None = None
    schema: tuple[int, int] | None = None
    notes: list[str] = field(default_factory=list)
    nodes: int = 0  # the program's graph nodes (what conversion takes)


@contextlib.contextmanager
def weights_only_everywhere():
    """Every torch.load in this block is weights-only, whatever its call site asks for."""
    old = os.environ.get("TORCH_FORCE_WEIGHTS_ONLY_LOAD")
    os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] = "1"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TORCH_FORCE_WEIGHTS_ONLY_LOAD", None)
        else:
            os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] = old


def safe_torch_load(data: bytes, what: str):
    """torch.load with the weights-only unpickler; a refusal is one ModelError naming the member and the
    global it would have needed."""
    import pickle

    import torch

    try:
        with weights_only_everywhere():
            return torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as e:
        raise ModelError(
            f"{what} holds a pickle that needs {blocked_global(e)} to load; refused: loading it could run code "
            "from the file.",
            "Save the model again with torch.export.save from plain tensors.",
        ) from None
    except Exception as e:  # noqa: BLE001 - a damaged pickle: any error of the unpickler is one line
        raise ModelError(
            f"{what} holds a pickle that cannot be read ({e.__class__.__name__}): a damaged or forged file.",
            "Save the model again with torch.export.save from plain tensors.",
        ) from None


def blocked_global(e: Exception) -> str:
    """'the global builtins.exec' from the weights-only unpickler's message, or a general phrase."""
    text = str(e)
    marker = "Unsupported global: GLOBAL "
    if marker in text:
        return "the global " + text.split(marker, 1)[1].split()[0]
    for line in text.splitlines():
        if "WeightsUnpickler error:" in line:
            return line.split("WeightsUnpickler error:", 1)[1].strip().rstrip(".")[:120]
    return "objects outside plain tensors"


def _json(z: zipfile.ZipFile, name: str, path: Path):
    """A member parsed as JSON: its size, compression ratio and nesting bounded before it is parsed."""
    data = read_member(z, name, MAX_JSON_BYTES, path.name, ModelError)
    return loads_json(data, f"{path.name}: {shown(name)}", ModelError, EXPORT_PT2, "valid JSON (a damaged .pt2)")


def _read_writer(z: zipfile.ZipFile, names: list[str], root: str, facts: Pt2Facts, path: Path) -> None:
    """Who wrote the program (torch version, export schema), from its models/*.json."""
    for n in names:
        rel = n[len(root) :]
        if rel.startswith("models/") and rel.endswith(".json"):
            meta = _json(z, n, path)
            facts.nodes += pt2_checks.check_program(meta, path, rel)
            sv = meta.get("schema_version") or {} if isinstance(meta, dict) else {}
            with contextlib.suppress(TypeError, ValueError):
                facts.schema = (int(sv.get("major", -1)), int(sv.get("minor", -1)))
            facts.torch_version = str(meta.get("torch_version")) if isinstance(meta, dict) else None
    if any(n[len(root) :].startswith("data/aotinductor/") for n in names):
        facts.notes.append("holds AOTInductor-compiled code, which is never loaded")


def _check_entries(z: zipfile.ZipFile, names: list[str], root: str, facts: Pt2Facts, path: Path) -> None:
    """Constants must be tensors (an opaque or TorchScript object constant runs code when read); stored ones
    must lie inside their storage (`pt2_checks.check_stored`); pickled weights and constants must load
    weights-only, within the bounds."""
    sizes = {i.filename: i.file_size for i in z.infolist()}
    for kind, suffix, folder in (
        ("constants", "_constants_config.json", "data/constants/"),
        ("weights", "_weights_config.json", "data/weights/"),
    ):
        for n in names:
            rel = n[len(root) :]
            if rel.startswith(folder) and rel.endswith(suffix):
                config = _json(z, n, path)
                entries = config.get("config", {}) if isinstance(config, dict) else {}
                entries = entries if isinstance(entries, dict) else {}
                pt2_checks.check_stored(entries, root + folder, sizes, path, kind[:-1])
                for fqn, meta in entries.items():
                    _check_entry(z, root, folder, kind, str(fqn), meta if isinstance(meta, dict) else {}, facts, path)


def _check_entry(z, root: str, folder: str, kind: str, fqn: str, meta: dict, facts: Pt2Facts, path: Path) -> None:
    member = str(meta.get("path_name", ""))
    if kind == "constants" and not member.startswith("tensor_"):
        what = "a TorchScript object" if member.startswith("custom_obj_") else "a pickled Python object"
        raise ModelError(
            f"{path.name}: constant {shown(fqn)} is {what} ({shown(folder + member)}); refused: loading it runs "
            "code from the file.",
            "Export a model whose constants are tensors.",
        )
    if meta.get("use_pickle"):
        try:
            data = read_member(z, root + folder + member, MAX_MEMBER_BYTES, path.name, ModelError)
        except KeyError:
            raise ModelError(
                f"{path.name}: {kind} entry {shown(fqn)} points to a missing member.", EXPORT_PT2
            ) from None
        where = f"{folder}{member}"
        pt2_checks.check_loaded(safe_torch_load(data, f"{path.name}: {shown(where)}"), path, shown(where))
        facts.pickled.append(folder + member)


def _check_pickles(z: zipfile.ZipFile, names: list[str], root: str, facts: Pt2Facts, path: Path) -> None:
    """Every other member torch.export.load would unpickle, checked with the weights-only unpickler."""
    for n in names:
        rel = n[len(root) :]
        pickled = rel.startswith("data/sample_inputs/") or (
            rel.startswith(PICKLED_PREFIXES[1:]) and rel.endswith(".pt")
        )
        pickled = pickled or (rel.startswith("serialized_") and rel.endswith(".pt"))
        if pickled and rel not in facts.pickled:
            data = read_member(z, n, MAX_MEMBER_BYTES, path.name, ModelError)
            pt2_checks.check_loaded(safe_torch_load(data, f"{path.name}: {shown(rel)}"), path, shown(rel))
            facts.pickled.append(rel)


def inspect_pt2(path: str | os.PathLike) -> Pt2Facts:
    """Check a .pt2 archive without running anything from it (see the module docstring)."""
    path = Path(path)
    if not zipfile.is_zipfile(path):
        raise ModelError(f"{path.name} is not a .pt2 archive (not a zip file).", EXPORT_PT2)
    try:
        with zipfile.ZipFile(path) as z:
            infos = z.infolist()
            root = pt2_checks.check_archive(path, infos)
            names = [i.filename for i in infos]
            fmt = (
                read_member(z, root + "archive_format", 1 << 10, path.name, ModelError)[:64]
                .decode(errors="replace")
                .strip()
                if root + "archive_format" in names
                else None
            )
            if fmt != "pt2":
                raise ModelError(
                    f"{path.name} is {describe_zip(names)}, not a torch.export program (.pt2).", EXPORT_PT2
                )
            facts = Pt2Facts(root=root, members=len(names))
            _read_writer(z, names, root, facts, path)
            _check_entries(z, names, root, facts, path)
            _check_pickles(z, names, root, facts, path)
            return facts
    except (zipfile.BadZipFile, NotImplementedError, RuntimeError, EOFError, OSError) as e:
        raise ModelError(f"{path.name} is a damaged .pt2 archive ({e.__class__.__name__}).", EXPORT_PT2) from None


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


def describe_zip(names: list[str]) -> str:
    """What a zip-format torch file is, from its member names alone (nothing in it is read)."""
    tops = {PurePosixPath(n).parts[1] if len(PurePosixPath(n).parts) > 1 else n for n in names}
    if "constants.pkl" in tops or "code" in tops:
        return "a TorchScript archive (torch.jit.save)"
    if any(n.endswith("serialized_exported_program.json") for n in names):
        return "a torch.export file from torch 2.0-2.6"
    if "data.pkl" in tops:
        return "a torch.save file"
    return "a zip archive of unknown content"


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

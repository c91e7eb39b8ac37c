"""A .pt2 archive checked by us, before torch is asked to read any of it (`inspect_pt2`): the zip's members,
the program's JSON and every tensor's declared layout, then every member `torch.export.load` would unpickle
through torch's weights-only unpickler (which refuses any global outside its allowlist and never calls one).
Nothing here evaluates anything from the file; torch is imported only for that weights-only load.

* **The archive**: at most MAX_MEMBERS members, no name twice (Python's zipfile reads the last copy, torch's
  reader may read another), every member under the one root folder that holds `archive_format` (torch's
  reader takes its root from the first member), no absolute or `..` name, each member's declared size
  within MAX_MEMBER_BYTES at a compression ratio real files have (`core.bounded.check_member`), and all of
  them together within MAX_ARCHIVE_BYTES (many members just under the per-member cap are refused as one).
* **The program** (`models/*.json`): every node's target one torch.export emits (`torch.ops.<ns>.<op>[.<overload>]`,
  the symbolic-size helpers of `_operator`, `math` and `torch.sym_*`), never an attribute path to anything
  else (torch's deserializer walks `torch.serialization.os.system` to the function); at most `max_nodes()`
  nodes (what litert-torch is asked to convert).
* **Every tensor** (weights, constants, the graph's values): a known dtype and the strided layout, no
  negative size or stride, its elements' bytes within MAX_TENSOR_BYTES (a stride-0 view of [2**33, 1024]
  would ask the allocator for 32 GiB), and, for stored weights and constants, every element it addresses
  (offset + sum((size - 1) * stride)) inside its storage member; all stored tensors together within
  MAX_MODEL_BYTES.

Each refusal is one ModelError line; names from the file are shown `repr`-style, so none can forge a line.
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import re
import zipfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from optimize.convert.limits import MAX_MODEL_BYTES, MAX_TENSOR_BYTES, NODES_ENV, max_nodes, shown
from optimize.core.bounded import check_member, loads_json, read_member
from optimize.core.errors import ModelError
from optimize.core.paths import environment

MAX_MEMBERS = 100_000
MAX_MEMBER_BYTES = 4 << 30  # one member's declared uncompressed size
MAX_ARCHIVE_BYTES = 6 << 30  # every member's together: weights (<= 2 GiB), the program's JSON, sample inputs
MAX_JSON_BYTES = 256 << 20  # a program's JSON (its graph) is a few MB; this bounds what is parsed
#: Where pickles sit in a .pt2 that `torch.export.load` unpickles (each is checked weights-only first).
PICKLED_PREFIXES = ("data/sample_inputs/", "data/weights/", "data/constants/")
EXPORT_PT2 = (
    "Export the model as a .pt2: ep = torch.export.export(model.eval(), (sample,)); torch.export.save(ep, 'model.pt2')."
)

#: Bytes per element of each torch.export serde ScalarType (torch._export.serde.schema.ScalarType).
ITEMSIZE = {
    1: 1, 2: 1, 3: 2, 4: 4, 5: 8, 6: 2, 7: 4, 8: 8, 9: 4, 10: 8, 11: 16, 12: 1, 13: 2,
    28: 2, 29: 1, 30: 1, 31: 1, 32: 1, 33: 1, 34: 4, 35: 8,
}  # fmt: skip
STRIDED = 7  # serde Layout.Strided: the only layout a stored tensor may have

_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
#: What torch.export writes as a node's target: an operator overload, a higher-order op, or a symbolic-size
#: helper (torch._export.serde.serialize._SYM_OPS and getitem).
TARGET = re.compile(
    rf"torch\.ops\.{_IDENT}\.{_IDENT}(\.[A-Za-z][A-Za-z0-9_]*)?"
    r"|_operator\.(getitem|eq|ne|le|ge|lt|gt|neg|pos|mul|add|sub|floordiv|mod|pow|truediv|and_|or_|lshift|rshift)"
    r"|math\.(trunc|ceil|floor)"
    r"|torch\.sym_(not|int|float|ite|max|min|sqrt|sum)"
)
#: Attributes of torch.ops itself, which a target path must not name as an operator namespace.
_NOT_NAMESPACES = {"load_library", "import_module", "loaded_libraries"}
#: The aten operators whose names are Python's bitwise dunders (a BertModel's mask writes aten.__and__.Tensor):
#: the only dunder names a target may hold, and only as an operator of torch.ops.aten.
_DUNDER_OPS = {f"__{i}{n}__" for n in ("and", "or", "xor", "lshift", "rshift") for i in ("", "i")}


def _refuse(path: Path, what: str) -> ModelError:
    return ModelError(f"{path.name}: {what}", EXPORT_PT2)


# ------------------------------------------------------------------------------------------- the archive


def check_archive(path: Path, infos: list[zipfile.ZipInfo]) -> str:
    """The archive's root folder ('model/' for torch.export.save's), after the member checks of the module
    docstring; one ModelError line for the first that fails."""
    if len(infos) > MAX_MEMBERS:
        raise _refuse(path, f"{len(infos):,} archive members, more than a model has.")
    names = _check_members(path, infos)
    formats = [n for n in names if PurePosixPath(n).name == "archive_format"]
    if len(formats) > 1:
        raise _refuse(path, f"{len(formats)} archive_format members (one program per archive).")
    if not formats:
        return ""  # not a program: said by the caller, from the member names
    root = formats[0].rsplit("/", 1)[0] + "/" if "/" in formats[0] else ""
    stray = next((n for n in sorted(names) if not n.startswith(root)), None)
    if stray is not None:
        raise _refuse(path, f"archive member {shown(stray)} lies outside the archive's root {shown(root)}.")
    if root.count("/") > 1:
        raise _refuse(path, f"its root {shown(root)} is not one folder.")
    return root


def _check_members(path: Path, infos: list[zipfile.ZipInfo]) -> set[str]:
    """Every member's name (inside the archive, never twice) and declared size (alone and together)."""
    seen: set[str] = set()
    total = 0
    for i in infos:
        name = i.filename
        if name.startswith("/") or ".." in PurePosixPath(name).parts or "\\" in name or "\0" in name:
            raise _refuse(path, f"archive member {shown(name)} has a path outside the archive.")
        if name in seen:
            raise _refuse(
                path, f"archive member {shown(name)} appears twice (which copy is read depends on the reader)."
            )
        seen.add(name)
        check_member(i, MAX_MEMBER_BYTES, error=ModelError)
        total += i.file_size
        if total > MAX_ARCHIVE_BYTES:
            raise _refuse(path, f"its members expand to more than {MAX_ARCHIVE_BYTES:,} bytes together.")
    return seen


# ------------------------------------------------------------------------------------------- the program


def _walk(doc):
    """Every dict in a JSON document, iteratively (its depth is bounded when parsed: core.bounded)."""
    stack = [doc]
    while stack:
        x = stack.pop()
        if isinstance(x, dict):
            yield x
            stack.extend(x.values())
        elif isinstance(x, list):
            stack.extend(x)


def _is_tensor_meta(d: dict) -> bool:
    return "dtype" in d and "sizes" in d and "strides" in d


def check_program(doc, path: Path, member: str) -> int:
    """A program's JSON: every node's target one torch.export emits, at most `max_nodes()` nodes, every
    tensor value within MAX_TENSOR_BYTES. Its node count."""
    nodes = 0
    for d in _walk(doc):
        if "target" in d and "inputs" in d:
            nodes += 1
            target = d["target"]
            if not isinstance(target, str) or not allowed_target(target):
                raise ModelError(
                    f"{path.name}: {member} calls {shown(str(target))}, which is not an operator torch.export "
                    "writes; refused: reading it would look up that name.",
                    EXPORT_PT2,
                )
        elif _is_tensor_meta(d):
            tensor_meta(d, path, f"a value in {member}", storage=None)
    limit = max_nodes()
    if nodes > limit:
        raise ModelError(
            f"{path.name}: its program is {nodes:,} nodes, more than the {limit:,} optimize converts (converting "
            "takes minutes per thousand nodes).",
            f"Export a smaller model, or raise the limit with {NODES_ENV}=<nodes>.",
        )
    return nodes


def allowed_target(target: str) -> bool:
    """Whether a node target is one torch.export writes (see TARGET), naming no dunder attribute but aten's
    bitwise operators (`_DUNDER_OPS`)."""
    if not TARGET.fullmatch(target):
        return False
    parts = target.split(".")
    if parts[:3] == ["torch", "ops", "aten"] and len(parts) > 3 and parts[3] in _DUNDER_OPS:
        parts = parts[:3] + parts[4:]
    if "__" in ".".join(parts):
        return False
    return not (parts[:2] == ["torch", "ops"] and parts[2] in _NOT_NAMESPACES)


# ------------------------------------------------------------------------------------------- tensors


def _ints(values, what: str, path: Path, where: str) -> list[int] | None:
    """The plain integers of a serialized size list, or None when one is symbolic ({"as_expr": ...})."""
    if not isinstance(values, list):
        raise _refuse(path, f"{where} has malformed {what}.")
    out = []
    for v in values:
        n = v.get("as_int") if isinstance(v, dict) else None
        if n is None:
            return None
        if not isinstance(n, int) or isinstance(n, bool):
            raise _refuse(path, f"{where} has malformed {what}.")
        out.append(n)
    return out


def tensor_meta(meta: dict, path: Path, where: str, storage: int | None) -> int:
    """The bytes a serialized tensor's elements take, after checking its dtype, layout, sizes and strides
    (and, with `storage` bytes, that every element it addresses lies inside them)."""
    item = ITEMSIZE.get(meta.get("dtype")) if isinstance(meta.get("dtype"), int) else None
    if item is None:
        raise _refuse(path, f"{where} has dtype {shown(str(meta.get('dtype')))}, which optimize does not read.")
    if meta.get("layout", STRIDED) != STRIDED:
        raise _refuse(path, f"{where} is not a dense (strided) tensor.")
    sizes = _ints(meta.get("sizes"), "sizes", path, where)
    strides = _ints(meta.get("strides", []), "strides", path, where)
    if sizes is None:
        return 0  # a symbolic size: a value of the graph, fixed by the inputs at conversion
    if any(s < 0 for s in sizes) or (strides is not None and any(s < 0 for s in strides)):
        raise _refuse(path, f"{where} has a negative size or stride ({sizes[:8]}, {(strides or [])[:8]}).")
    size = math.prod(sizes) * item
    if size > MAX_TENSOR_BYTES:
        raise _refuse(
            path, f"{where} is {sizes[:8]} ({size:,} bytes), more than the {MAX_TENSOR_BYTES:,} one tensor may hold."
        )
    if storage is not None and math.prod(sizes):
        _inside(meta, sizes, strides, item, storage, path, where)
    return size


def _inside(meta: dict, sizes: list[int], strides, item: int, storage: int, path: Path, where: str) -> None:
    """Every element a stored tensor addresses (offset + sum((size - 1) * stride)) inside its storage."""
    offset = meta.get("storage_offset", {"as_int": 0})
    off = offset.get("as_int") if isinstance(offset, dict) else None
    if strides is None or len(strides) != len(sizes) or not isinstance(off, int) or off < 0:
        raise _refuse(path, f"{where} has malformed strides or offset.")
    last = off + sum((s - 1) * st for s, st in zip(sizes, strides))
    if (last + 1) * item > storage:
        raise _refuse(path, f"{where} addresses element {last:,} of a storage of {storage // item:,}: a forged tensor.")


def check_stored(config: dict, folder: str, sizes: dict[str, int], path: Path, kind: str) -> int:
    """Every stored (not pickled) tensor of a weights or constants config against its storage member's size;
    the bytes they take together."""
    total = 0
    for fqn, meta in config.items():
        if not isinstance(meta, dict) or meta.get("use_pickle") or not isinstance(meta.get("tensor_meta"), dict):
            continue
        member = folder + str(meta.get("path_name", ""))
        where = f"{kind} {shown(str(fqn))}"
        if member not in sizes:
            raise _refuse(path, f"{where} points to a missing member {shown(member)}.")
        total += tensor_meta(meta["tensor_meta"], path, where, storage=sizes[member])
        if total > MAX_MODEL_BYTES:
            raise _refuse(path, f"its tensors take more than {MAX_MODEL_BYTES:,} bytes together.")
    return total


def check_loaded(obj, path: Path, where: str) -> None:
    """Every tensor a weights-only unpickler gave back (a pickled weight, the sample inputs) within
    MAX_TENSOR_BYTES (a stride-0 view is cheap to load and huge to use)."""
    stack, seen = [obj], 0
    while stack and seen < 100_000:
        x = stack.pop()
        seen += 1
        if isinstance(x, dict):
            stack.extend(x.values())
        elif isinstance(x, (list, tuple)):
            stack.extend(x)
        elif hasattr(x, "numel") and hasattr(x, "element_size"):
            size = int(x.numel()) * int(x.element_size())
            if size > MAX_TENSOR_BYTES:
                raise _refuse(
                    path,
                    f"{where} holds a tensor of {list(x.shape)[:8]} ({size:,} bytes), more than the "
                    f"{MAX_TENSOR_BYTES:,} one tensor may hold.",
                )


# ------------------------------------------------------------------------------------------- the inspection


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


def inspect_pt2(path: str | os.PathLike) -> Pt2Facts:
    """Check a .pt2 archive without running anything from it: the archive (`check_archive`), then its JSON
    documents read in one pass (`_documents`) and checked (`_check_documents`), then every pickled member
    loaded weights-only (`_check_pickled`). One ModelError line for the first that fails, naming the file
    (the member checks of `core.bounded` name only the member: the file's name is put on here)."""
    path = Path(path)
    if not zipfile.is_zipfile(path):
        raise ModelError(f"{path.name} is not a .pt2 archive (not a zip file).", EXPORT_PT2)
    try:
        with zipfile.ZipFile(path) as z:
            infos = z.infolist()
            root = check_archive(path, infos)
            names = [i.filename for i in infos]
            fmt, docs = _documents(z, names, root, path)
            if fmt != "pt2":
                raise ModelError(
                    f"{path.name} is {describe_zip(names)}, not a torch.export program (.pt2).", EXPORT_PT2
                )
            facts = Pt2Facts(root=root, members=len(names))
            unpickle = _check_documents(docs, {i.filename: i.file_size for i in infos}, names, facts, path)
            _check_pickled(z, unpickle, facts, path)
            return facts
    except ModelError as e:
        if e.problem.startswith(f"{path.name}:") or e.problem.startswith(f"{path.name} "):
            raise
        raise ModelError(f"{path.name}: {e.problem}", e.fix) from None
    except (zipfile.BadZipFile, NotImplementedError, RuntimeError, EOFError, OSError) as e:
        raise ModelError(f"{path.name} is a damaged .pt2 archive ({e.__class__.__name__}).", EXPORT_PT2) from None


def _documents(z: zipfile.ZipFile, names: list[str], root: str, path: Path) -> tuple[str | None, dict]:
    """The archive's format (its archive_format member) and every JSON document the checks read (the programs
    and the weights and constants configs), by name inside the root: each read bounded in size, compression
    ratio and nesting before it is parsed."""
    fmt = None
    if root + "archive_format" in names:
        fmt = read_member(z, root + "archive_format", 1 << 10, error=ModelError)[:64].decode(errors="replace")
    wanted = [n for n in names if _is_document(n[len(root) :])] if fmt is not None and fmt.strip() == "pt2" else []
    docs = {}
    for n in wanted:
        data = read_member(z, n, MAX_JSON_BYTES, error=ModelError)
        docs[n[len(root) :]] = loads_json(
            data, f"{path.name}: {shown(n)}", ModelError, EXPORT_PT2, "valid JSON (a damaged .pt2)"
        )
    return (fmt.strip() if fmt is not None else None), docs


def _is_document(rel: str) -> bool:
    return (rel.startswith("models/") and rel.endswith(".json")) or any(
        rel.startswith(folder) and rel.endswith(suffix) for _, suffix, folder in CONFIGS
    )


#: The weights and constants configs: (kind, file name suffix, folder).
CONFIGS = (
    ("constants", "_constants_config.json", "data/constants/"),
    ("weights", "_weights_config.json", "data/weights/"),
)


def _check_documents(docs: dict, sizes: dict[str, int], names: list[str], facts: Pt2Facts, path: Path) -> list:
    """Who wrote the program and its graph (`check_program`), constants that are tensors, stored tensors inside
    their storage (`check_stored`); the members to unpickle weights-only, as (member, where, what)."""
    root = facts.root
    for rel, meta in docs.items():
        if rel.startswith("models/"):
            _writer(meta, path, rel, facts)
    if any(n[len(root) :].startswith("data/aotinductor/") for n in names):
        facts.notes.append("holds AOTInductor-compiled code, which is never loaded")
    unpickle = _configured(docs, sizes, root, path)
    listed = {member for member, _, _ in unpickle}
    return unpickle + [
        (n, n[len(root) :], shown(n[len(root) :])) for n in names if n not in listed and _pickled(n[len(root) :])
    ]


def _configured(docs: dict, sizes: dict[str, int], root: str, path: Path) -> list:
    """The weights and constants configs checked (`check_stored`, `_entry`); their pickled entries to unpickle."""
    unpickle = []
    for kind, suffix, folder in CONFIGS:
        for rel, config in docs.items():
            if not (rel.startswith(folder) and rel.endswith(suffix)):
                continue
            entries = config.get("config", {}) if isinstance(config, dict) else {}
            entries = entries if isinstance(entries, dict) else {}
            check_stored(entries, root + folder, sizes, path, kind[:-1])
            for fqn, meta in entries.items():
                entry = _entry(root, folder, kind, str(fqn), meta if isinstance(meta, dict) else {}, path)
                if entry is not None:
                    unpickle.append(entry)
    return unpickle


def _pickled(rel: str) -> bool:
    """A member `torch.export.load` unpickles besides the configs' entries (sample inputs, pickled weights)."""
    if rel.startswith("data/sample_inputs/"):
        return True
    return rel.endswith(".pt") and (rel.startswith(PICKLED_PREFIXES[1:]) or rel.startswith("serialized_"))


def _writer(meta, path: Path, rel: str, facts: Pt2Facts) -> None:
    """Who wrote the program (torch version, export schema), and its graph checked."""
    facts.nodes += check_program(meta, path, rel)
    sv = meta.get("schema_version") or {} if isinstance(meta, dict) else {}
    with contextlib.suppress(TypeError, ValueError, AttributeError):
        facts.schema = (int(sv.get("major", -1)), int(sv.get("minor", -1)))
    facts.torch_version = str(meta.get("torch_version")) if isinstance(meta, dict) else None


def _entry(root: str, folder: str, kind: str, fqn: str, meta: dict, path: Path) -> tuple[str, str, str] | None:
    """A weights or constants entry: a constant must be a tensor (an opaque or TorchScript object runs code
    when read); a pickled one is (member, where, what) to unpickle weights-only."""
    member = str(meta.get("path_name", ""))
    if kind == "constants" and not member.startswith("tensor_"):
        what = "a TorchScript object" if member.startswith("custom_obj_") else "a pickled Python object"
        raise ModelError(
            f"{path.name}: constant {shown(fqn)} is {what} ({shown(folder + member)}); refused: loading it runs "
            "code from the file.",
            "Export a model whose constants are tensors.",
        )
    if not meta.get("use_pickle"):
        return None
    return root + folder + member, folder + member, f"{kind} entry {shown(fqn)}"


def _check_pickled(z: zipfile.ZipFile, unpickle: list, facts: Pt2Facts, path: Path) -> None:
    """Every member `torch.export.load` would unpickle, read bounded and loaded with the weights-only
    unpickler, each tensor it gives back within MAX_TENSOR_BYTES (`check_loaded`)."""
    for member, where, what in unpickle:
        try:
            data = read_member(z, member, MAX_MEMBER_BYTES, error=ModelError)
        except KeyError:
            raise ModelError(f"{path.name}: {what} points to a missing member.", EXPORT_PT2) from None
        check_loaded(safe_torch_load(data, f"{path.name}: {shown(where)}"), path, shown(where))
        facts.pickled.append(where)


# ------------------------------------------------------------------------------------------- loading weights-only


@contextlib.contextmanager
def weights_only_everywhere():
    """Every torch.load in this block is weights-only, whatever its call site asks for."""
    with environment({"TORCH_FORCE_WEIGHTS_ONLY_LOAD": "1"}):
        yield


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

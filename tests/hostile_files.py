"""A crafted-file corpus for the PyTorch and ONNX front door (issue 37), built here from seeded models: every
case is a file an attacker could hand the tool, and what it must end in. Shared by test_hostile_onnx.py,
test_hostile_pt2.py and the fuzz suite (tests/ is on sys.path, as for the other fixture modules).

Secrets: `plant_secrets` writes a file of recognisable bytes in the working folder and beside the models;
`leaks` says where any of them (or any marker) turned up: stdout, stderr, the output folder, the cache.
`run_limited` runs the CLI in a child under a time limit and an 8 GiB address-space limit.
"""

from __future__ import annotations

import io
import json
import os
import resource
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper

CWD_SECRET = b"CWD-SECRET-7f3a!" * 64  # 1 KiB: any window of 16 bytes or more holds a marker
MODEL_SECRET = b"MOD-SECRET-9c1e!" * 64
MARKERS = (b"CWD-SECRET-7f3a!", b"MOD-SECRET-9c1e!", b"ECRET-7f3a!CWD-S", b"ECRET-9c1e!MOD-S")
ADDRESS_SPACE = 8 << 30
FORGED = "error: all good, exit 0"


def plant_secrets(work: Path, models: Path) -> None:
    """secret.bin in the working folder and beside the models, and a FIFO in the working folder (a reader
    that opened it would block)."""
    work.mkdir(parents=True, exist_ok=True)
    models.mkdir(parents=True, exist_ok=True)
    (work / "secret.bin").write_bytes(CWD_SECRET)
    (models / "secret.bin").write_bytes(MODEL_SECRET)
    if not (work / "fifo").exists():
        os.mkfifo(work / "fifo")


def _limits() -> None:  # pragma: no cover - runs in the child
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


def run_limited(*args: str, cwd: Path, cache: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    """The CLI in a child process with at most 8 GiB of address space and `timeout` seconds."""
    env = {**os.environ, "OPTIMIZE_CACHE": str(cache), "NO_COLOR": "1", "COLUMNS": "80"}
    return subprocess.run(
        [sys.executable, "-c", "from optimize.cli import main; main()", *args],
        capture_output=True, text=True, cwd=cwd, timeout=timeout, env=env, preexec_fn=_limits,
    )  # fmt: skip


def leaks(texts: list[str], *folders: Path) -> list[str]:
    """Where a secret's bytes appear: in any of `texts`, or any file below `folders`."""
    found = [f"output {k}" for k, t in enumerate(texts) for m in MARKERS if m.decode() in t]
    for folder in folders:
        for p in Path(folder).rglob("*") if Path(folder).exists() else []:
            if p.is_file() and not p.is_symlink() and p.name != "secret.bin":
                data = p.read_bytes()
                found += [str(p) for m in MARKERS if m in data]
    return found


# ------------------------------------------------------------------------------------------------ ONNX

F = TensorProto.FLOAT


def _vi(name: str, shape, dtype=F):
    return helper.make_tensor_value_info(name, dtype, shape)


def onnx_model(nodes, inits=(), inputs=None, outputs=None, opset: int = 17, **graph_fields):
    """x [1, 4] -> nodes -> y, as a ModelProto (IR 8)."""
    g = helper.make_graph(
        nodes, "g", inputs or [_vi("x", [1, 4])], outputs or [_vi("y", [1, 4])], list(inits), **graph_fields
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def external(name: str, location: str, dims=(4,), offset: int = 0, flag: bool = True) -> TensorProto:
    """A float tensor whose bytes are said to live at `location` (ONNX external data)."""
    t = TensorProto(name=name, data_type=F, dims=list(dims))
    if flag:
        t.data_location = TensorProto.EXTERNAL
    for k, v in (("location", location), ("offset", str(offset)), ("length", str(4 * int(np.prod(dims))))):
        e = t.external_data.add()
        e.key, e.value = k, v
    return t


def _const(out: str, tensor: TensorProto):
    return helper.make_node("Constant", [], [out], value=tensor)


def _add(c: str = "C"):
    return helper.make_node("Add", ["x", c], ["y"])


def _branch(nodes, inits=(), out="b"):
    return helper.make_graph(nodes, "branch", [], [_vi(out, [4])], list(inits))


def _true():
    return numpy_helper.from_array(np.array(True), "cond")


def _plain(name: str = "C"):
    return numpy_helper.from_array(np.ones(4, np.float32), name)


def onnx_external_cases(work: Path) -> dict:
    """External data in every place a tensor can sit: name -> (ModelProto, what the one line names)."""
    rel = "secret.bin"
    cases = {
        "initializer": (onnx_model([_add()], [external("C", rel)]), "initializer C"),
        "constant": (onnx_model([_const("C", external("v", rel)), _add()]), "Constant node C"),
        "constant_absolute": (onnx_model([_const("C", external("v", str(work / "secret.bin"))), _add()]), "Constant"),
        "constant_dotdot": (onnx_model([_const("C", external("v", f"../{work.name}/secret.bin")), _add()]), "Constant"),
        "constant_fifo": (onnx_model([_const("C", external("v", "fifo")), _add()]), "Constant"),
        "constant_proc": (onnx_model([_const("C", external("v", "/proc/self/environ")), _add()]), "Constant"),
        "location_without_flag": (onnx_model([_add()], [external("C", rel, flag=False)]), "initializer C"),
        "offset_into_secret": (onnx_model([_add()], [external("C", rel, offset=40)]), "initializer C"),
    }
    then = _branch([helper.make_node("Identity", ["t"], ["b"])], [external("t", rel)])
    other = _branch([helper.make_node("Identity", ["e"], ["b"])], [_plain("e")])
    if_node = helper.make_node("If", ["cond"], ["C"], then_branch=then, else_branch=other, name="if0")
    cases["if_branch"] = (onnx_model([if_node, _add()], [_true()]), "then_branch: initializer t")
    inner = helper.make_node(
        "If", ["cond"], ["b"], name="inner",
        then_branch=_branch([_const("b", external("v", str(work / "secret.bin")))]), else_branch=other,
    )  # fmt: skip
    outer = helper.make_node("If", ["cond"], ["C"], then_branch=other, else_branch=_branch([inner]), name="outer")
    cases["nested_if"] = (onnx_model([outer, _add()], [_true()]), "else_branch: If node inner then_branch")
    body = helper.make_graph(
        [_const("w", external("v", rel)), helper.make_node("Add", ["s", "w"], ["s2"]),
         helper.make_node("Identity", ["c"], ["c2"])],
        "body", [_vi("i", [], TensorProto.INT64), _vi("c", [], TensorProto.BOOL), _vi("s", [4])],
        [_vi("c2", [], TensorProto.BOOL), _vi("s2", [4])],
    )  # fmt: skip
    trip = numpy_helper.from_array(np.array(1, np.int64), "M")
    loop = helper.make_node("Loop", ["M", "cond", "s0"], ["C"], body=body, name="loop")
    cases["loop_body"] = (onnx_model([loop, _add()], [trip, _true(), _plain("s0")]), "Loop node loop body")
    scan_body = helper.make_graph(
        [helper.make_node("Add", ["s", "w"], ["s2"]), helper.make_node("Identity", ["s2"], ["o"])], "scan",
        [_vi("s", [4]), _vi("e", [4])], [_vi("s2", [4]), _vi("o", [4])], [external("w", rel)],
    )  # fmt: skip
    scan = helper.make_node("Scan", ["s0", "seq"], ["C", "outs"], body=scan_body, num_scan_inputs=1, name="scan")
    seq = numpy_helper.from_array(np.ones((1, 4), np.float32), "seq")
    cases["scan_body"] = (onnx_model([scan, _add()], [_plain("s0"), seq]), "Scan node scan body: initializer w")
    sparse = helper.make_sparse_tensor(external("C", rel, dims=(2,)), numpy_helper.from_array(np.array([0, 2])), [4])
    cases["sparse_initializer"] = (onnx_model([_add()], sparse_initializer=[sparse]), "sparse initializer C")
    sparse_const = helper.make_node("Constant", [], ["C"], sparse_value=sparse)
    cases["sparse_constant"] = (onnx_model([sparse_const, _add()]), "Constant node C attribute sparse_value")
    fn = helper.make_function(
        "local", "f", ["a"], ["b"], [_const("k", external("v", rel)), helper.make_node("Add", ["a", "k"], ["b"])],
        [helper.make_opsetid("", 17)],
    )  # fmt: skip
    m = onnx_model([helper.make_node("f", ["x"], ["y"], domain="local")])
    m.functions.append(fn)
    m.opset_import.append(helper.make_opsetid("local", 1))
    cases["function"] = (m, "function f: Constant node k")
    attr = helper.make_node("Custom", ["x"], ["y"], domain="evil", name="custom")
    attr.attribute.append(helper.make_attribute("tables", [_plain("p"), external("q", rel)]))
    cases["tensors_attribute"] = (onnx_model([attr]), "Custom node custom attribute tables")
    m = onnx_model([_add()], [_plain()])
    info = m.training_info.add()
    info.initialization.CopyFrom(helper.make_graph([], "init", [], [], [external("w", rel)]))
    cases["training_info"] = (m, "training info 0 initialization: initializer w")
    cases["newline_name"] = (
        onnx_model([_add("C\n" + FORGED)], [external("C\n" + FORGED, rel)]),
        "initializer 'C\\nerror: all good",
    )
    return cases


def _raw(name: str, dims, data: bytes, dtype=F) -> TensorProto:
    t = TensorProto(name=name, data_type=dtype, dims=list(dims))
    t.raw_data = data
    return t


def onnx_tensor_cases() -> dict:
    """Tensors that do not hold what they declare, and values too big to allocate: name -> (model, fragment)."""
    typed = TensorProto(name="C", data_type=F, dims=[4], float_data=[1.0, 2.0, 3.0])
    string = helper.make_tensor("s", TensorProto.STRING, [1], [b"hello"])
    shape = numpy_helper.from_array(np.array([2**16, 2**16, 4], np.int64), "shape")
    big = [helper.make_node("ConstantOfShape", ["shape"], ["big"]), helper.make_node("ReduceSum", ["big"], ["r"])]
    expand_to = numpy_helper.from_array(np.array([2**31, 4], np.int64), "to")
    sparse = helper.make_sparse_tensor(_raw("C", [2], np.ones(2, np.float32).tobytes()), _raw("i", [2], b"", 7), [4])
    sparse.indices.raw_data = np.array([0, 2], np.int64).tobytes()
    return {
        "dims_2_40": (onnx_model([_add()], [_raw("C", [2**40], b"\0" * 20)]), "declares [1099511627776]"),
        "short_raw": (onnx_model([_add()], [_raw("C", [4], b"\0" * 8)]), "holds 8 bytes"),
        "typed_short": (onnx_model([_add()], [typed]), "holds 3 float_data entries"),
        "negative_dim": (onnx_model([_add()], [_raw("C", [-4], b"")]), "negative dimension"),
        "undefined_dtype": (onnx_model([_add()], [_raw("C", [4], b"\0" * 16, 0)]), "tensor of UNDEFINED"),
        "unknown_dtype": (onnx_model([_add()], [_raw("C", [4], b"\0" * 16, 99)]), "tensor of type 99"),
        "string_output": (
            onnx_model([_add()], [_plain(), string], outputs=[_vi("y", [1, 4]), _vi("s", [1], TensorProto.STRING)]),
            "string tensor",
        ),
        "sparse_plain": (onnx_model([_add()], sparse_initializer=[sparse]), "sparse tensor"),
        "huge_input": (onnx_model([_add()], [_plain()], inputs=[_vi("x", [2**33, 1024])]), "input x is"),
        "constant_of_shape": (
            onnx_model([*big, helper.make_node("Add", ["x", "r"], ["y"])], [shape]),
            "value big is [65536, 65536, 4]",
        ),
        "expand": (
            onnx_model(
                [
                    helper.make_node("Expand", ["C", "to"], ["big"]),
                    helper.make_node("ReduceSum", ["big"], ["r"]),
                    helper.make_node("Add", ["x", "r"], ["y"]),
                ],
                [_plain(), expand_to],
            ),  # fmt: skip
            "value big is [2147483648, 4]",
        ),
        "range": (
            onnx_model(
                [
                    helper.make_node("Range", ["a", "b", "c"], ["big"]),
                    helper.make_node("ReduceSum", ["big"], ["r"]),
                    helper.make_node("Add", ["x", "r"], ["y"]),
                ],
                [numpy_helper.from_array(np.array(v, np.float32), k) for k, v in (("a", 0), ("b", 2**40), ("c", 1))],
            ),  # fmt: skip
            "value big is [1099511627776]",
        ),
        "nested_too_deep": (_deep_if(60), "not a readable ONNX file"),
    }


def _field(number: int, payload: bytes) -> bytes:
    """One length-delimited protobuf field (written by hand: the protobuf library will not build what it
    refuses to parse)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append(n & 0x7F | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def _deep_if(depth: int) -> bytes:
    """A model whose If nests `depth` levels (three protobuf levels each): deeper than protobuf parses."""
    graph = _field(2, b"leaf")
    for _ in range(depth):
        attr = _field(1, b"then_branch") + _field(6, graph) + _varint(20 << 3) + _varint(5)
        node = _field(1, b"cond") + _field(2, b"b") + _field(4, b"If") + _field(5, attr)
        graph = _field(1, node) + _field(2, b"branch")
    return _varint(1 << 3) + _varint(8) + _field(7, graph) + _field(8, _varint(2 << 3) + _varint(17))


def onnx_size_cases() -> dict:
    """Graphs that would take hours: name -> (model, fragment)."""
    w = numpy_helper.from_array(np.full((1, 4), 0.5, np.float32), "W")
    chain = [helper.make_node("Add", ["x" if k == 0 else f"a{k - 1}", "W"], [f"a{k}" if k < 9_999 else "y"])
             for k in range(10_000)]  # fmt: skip
    wide = [helper.make_node("Identity", ["x"], [f"i{k}"]) for k in range(200_000)]
    wide.append(helper.make_node("Identity", ["x"], ["y"]))
    return {
        "add_10k_shared_initializer": (onnx_model(chain, [w]), "10,000 nodes once normalised"),
        "nodes_200k": (onnx_model(wide), "200,001 nodes, more than the 100,000"),
    }


def onnx_name_cases() -> dict:
    """Names from the file that try to forge a line: name -> (model, fragment)."""
    node = helper.make_node("Foo\n" + FORGED, ["x"], ["y"], domain="evil\n" + FORGED, name="n\n" + FORGED)
    return {"newline_op": (onnx_model([node]), "'evil\\nerror: all good, exit 0.Foo\\nerror: all good, exit 0'")}


def save_onnx(model, path: Path) -> Path:
    path.write_bytes(model if isinstance(model, bytes) else model.SerializeToString())
    return path


# ------------------------------------------------------------------------------------------------ .pt2


def rewrite_zip(src: Path, dst: Path, edit=None, extra: dict | None = None, forged: dict | None = None) -> Path:
    """A copy of a zip with each member's bytes passed through `edit(name, data)` (None drops it), `extra`
    members added ({name: bytes}, a list of bytes for the same name several times) and the declared sizes
    of `forged` members ({name: (file_size, compress_size)}) set in the central directory."""
    with zipfile.ZipFile(src) as z, zipfile.ZipFile(dst, "w") as out:
        infos = []
        for info in z.infolist():
            data = z.read(info)
            data = edit(info.filename, data) if edit else data
            if data is not None:
                infos.append(_write(out, info.filename, data))
        for name, data in (extra or {}).items():
            for d in data if isinstance(data, list) else [data]:
                infos.append(_write(out, name, d))
        for info in infos:
            if forged and info.filename in forged:
                info.file_size, info.compress_size = forged[info.filename]
    return dst


def _write(out: zipfile.ZipFile, name: str, data: bytes) -> zipfile.ZipInfo:
    import warnings

    info = zipfile.ZipInfo(name, date_time=(2024, 1, 1, 0, 0, 0))
    info.compress_type = zipfile.ZIP_DEFLATED if len(data) > 1 << 20 else zipfile.ZIP_STORED
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a duplicate name, on purpose
        out.writestr(info, data)
    return info


def _json_edit(suffix: str, change):
    """An `edit` that parses the member ending in `suffix`, lets `change(doc)` alter it, and writes it back."""

    def edit(name: str, data: bytes):
        if not name.endswith(suffix):
            return data
        doc = json.loads(data)
        change(doc)
        return json.dumps(doc).encode()

    return edit


def _meta(sizes, strides, offset=0, dtype=7, layout=7):
    return {
        "dtype": dtype, "sizes": [{"as_int": s} for s in sizes], "requires_grad": False,
        "device": {"type": "cpu", "index": None}, "strides": [{"as_int": s} for s in strides],
        "storage_offset": {"as_int": offset}, "layout": layout,
    }  # fmt: skip


def _weight(key: str = "l.weight", **meta):
    def change(doc):
        doc["config"][key]["tensor_meta"] = _meta(**meta)

    return _json_edit("model_weights_config.json", change)


def _renamed_weight(new: str):
    def change(doc):
        entry = doc["config"].pop("l.weight")
        entry["tensor_meta"] = _meta([3, 4], [40, 1])
        doc["config"][new] = entry

    return _json_edit("model_weights_config.json", change)


def _target(target: str):
    def change(doc):
        doc["graph_module"]["graph"]["nodes"][0]["target"] = target

    return _json_edit("models/model.json", change)


def _many_nodes(n: int):
    def change(doc):
        nodes = doc["graph_module"]["graph"]["nodes"]
        doc["graph_module"]["graph"]["nodes"] = (nodes * (n // len(nodes) + 1))[:n]

    return _json_edit("models/model.json", change)


def pt2_cases(base: Path, folder: Path) -> dict:
    """Crafted .pt2 archives from `base` (torch.export.save of a Linear(4, 3) with a buffer `c`): name ->
    (path, what the one line names)."""
    import torch

    with zipfile.ZipFile(base) as z:
        root = z.namelist()[0].split("/")[0]
        model_json = z.read(f"{root}/models/model.json")
    huge = io.BytesIO()
    torch.save((torch.zeros(1).expand(2**33, 1024),), huge)
    cases = {
        "stride0_weight": (_weight(sizes=[2**33, 1024], strides=[0, 0]), "is [8589934592, 1024]"),
        "offset_beyond_storage": (_weight(sizes=[3, 4], strides=[4, 1], offset=100), "addresses element 111"),
        "strides_beyond_storage": (_weight(sizes=[3, 4], strides=[40, 1]), "addresses element 83"),
        "negative_stride": (_weight(sizes=[3, 4], strides=[-4, 1]), "negative size or stride"),
        "unknown_dtype": (_weight(sizes=[3, 4], strides=[4, 1], dtype=99), "dtype 99"),
        "sparse_layout": (_weight(sizes=[3, 4], strides=[4, 1], layout=1), "not a dense"),
        "target_os_system": (_target("torch.serialization.os.system"), "calls torch.serialization.os.system"),
        "target_builtins_eval": (_target("builtins.eval"), "calls builtins.eval"),
        "target_dunder": (_target("torch.ops.aten.add.__call__"), "calls torch.ops.aten.add.__call__"),
        "target_load_library": (_target("torch.ops.load_library.x"), "calls torch.ops.load_library.x"),
        "target_extension": (_target("#evil"), "calls #evil,"),
        "nodes_6000": (_many_nodes(6000), "6,000 nodes"),
        "newline_weight_name": (_renamed_weight("l.weight\n" + FORGED), "weight 'l.weight\\nerror: all good"),
        "deep_json": (lambda n, d: b"[" * 100_000 if n.endswith("models/model.json") else d, "nested too deeply"),
        "pickled_stride0_sample": (
            lambda n, d: huge.getvalue() if n.endswith("sample_inputs/model.pt") else d,
            "holds a tensor of",
        ),
    }
    out = {}
    for name, (edit, fragment) in cases.items():
        out[name] = (rewrite_zip(base, folder / f"{name}.pt2", edit), fragment)
    out["duplicate_member"] = (
        rewrite_zip(base, folder / "duplicate_member.pt2", lambda n, d: None if n.endswith("model.json") else d,
                    extra={f"{root}/models/model.json": [model_json, model_json.replace(b"aten.linear", b"aten.mul")]}),
        "appears twice",
    )  # fmt: skip
    out["member_under_other_root"] = (
        rewrite_zip(base, folder / "member_under_other_root.pt2", extra={"other/data/weights/weight_0": b"\0" * 48}),
        "lies outside the archive's root",
    )
    out["two_archive_formats"] = (
        rewrite_zip(base, folder / "two_archive_formats.pt2", extra={"other/archive_format": b"pt2"}),
        "2 archive_format members",
    )
    out["absolute_member"] = (
        rewrite_zip(base, folder / "absolute_member.pt2", extra={"/etc/evil": b"x"}),
        "path outside the archive",
    )
    near = 2**31 + 2**29  # 2.5 GiB each, declared stored (ratio 1): three of them pass the per-member cap
    out["members_just_under_the_cap"] = (
        rewrite_zip(base, folder / "members_just_under_the_cap.pt2",
                    extra={f"{root}/data/pad{k}": b"\0" * 64 for k in range(3)},
                    forged={f"{root}/data/pad{k}": (near, near) for k in range(3)}),
        "expand to more than 6,442,450,944 bytes together",
    )  # fmt: skip
    out["one_10gib_member"] = (
        rewrite_zip(base, folder / "one_10gib_member.pt2", extra={f"{root}/data/big": b"\0" * 64},
                    forged={f"{root}/data/big": (10 << 30, 10 << 30)}),
        "expands to 10,737,418,240 bytes",
    )  # fmt: skip
    out["zip_bomb"] = (
        rewrite_zip(base, folder / "zip_bomb.pt2", extra={f"{root}/data/bomb": b"\0" * (64 << 20)}),
        "a zip bomb",
    )
    return out

"""Property-based fuzzing (issue 18, item 8): random mutations of small valid files never raise anything but
the project's own error type, never crash the process, never hang.

Three readers: the flatbuffer validator (`models.tflite.read_model`, shared by compat and every
other reader), the .tflite normaliser, and the .npz data reader; and the PyTorch and ONNX front door
(issue 37: mutated ONNX graphs and .pt2 archives through `open_inputs`, see below). Mutations are byte flips, truncations
and, for the flatbuffer, edits of the fields a crafted file aims at (tensor, buffer, opcode and subgraph
indices, signature maps, shapes, quantization). Every mutant the validator accepts is then loaded,
allocated and invoked by the LiteRT interpreter in a child process, which must not die of a signal.

Fixed seed (derandomized), a bounded number of examples and a per-example deadline: the suite's time
is bounded and a failure reproduces.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
import zipfile

import numpy as np
import pytest
from delegate_fixtures import load_t, op, save_t, tensor, tiny
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from optimize.core.errors import OptimizeError

FUZZ = settings(
    derandomize=True,
    max_examples=400,
    deadline=2000,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    database=None,
)


def _base_tflite() -> bytes:
    """FULLY_CONNECTED(x, DEQUANTIZE(float16 weights), bias) -> ADD: a signature, a float16 weight for the
    normaliser to fold, constants, a per-tensor quantized tensor."""
    w = np.arange(12, dtype=np.float16).reshape(3, 4) / 8
    tensors = [
        tensor([1, 4], name="x"),
        tensor([3, 4], "float16", w, name="w16"),
        tensor([3, 4], name="w"),
        tensor([3], "float32", np.ones(3, np.float32), name="b"),
        tensor([1, 3], name="fc"),
        tensor([1, 3], "float32", np.full((1, 3), 0.5, np.float32), name="c"),
        tensor([1, 3], name="y"),
    ]
    ops = [op("DEQUANTIZE", [1], [2]), op("FULLY_CONNECTED", [0, 2, 3], [4]), op("ADD", [4, 5], [6])]
    m = load_t(tiny(tensors, ops, [0], [6]))
    from ai_edge_litert import schema_py_generated as s

    sig = s.SignatureDefT()
    sig.signatureKey, sig.subgraphIndex = "serving_default", 0
    for attr, name, index in (("inputs", "x", 0), ("outputs", "y", 6)):
        tm = s.TensorMapT()
        tm.name, tm.tensorIndex = name, index
        setattr(sig, attr, [tm])
    m.signatureDefs = [sig]
    return save_t(m)


BASE = _base_tflite()
INDEX = st.one_of(st.integers(-3, 12), st.sampled_from([2**31 - 1, -(2**31), 2**16, 1000]))


def _edit(m, field: int, which: int, value: int) -> None:
    """Set one index-like field of the object model to `value` (what crafted files aim at)."""
    sg = m.subgraphs[0]
    t = sg.tensors[which % len(sg.tensors)]
    o = sg.operators[which % len(sg.operators)]
    sig = m.signatureDefs[0]
    if field == 0:
        o.inputs[which % len(o.inputs)] = value
    elif field == 1:
        o.outputs[0] = value
    elif field == 2:
        sg.inputs[0] = value
    elif field == 3:
        sg.outputs[0] = value
    elif field == 4:
        sig.inputs[0].tensorIndex = value % 2**32
    elif field == 5:
        sig.subgraphIndex = value % 2**32
    elif field == 6:
        t.buffer = value % 2**32
    elif field == 7:
        o.opcodeIndex = value % 2**32
    elif field == 8:
        t.shape = [value, *list(t.shape)[1:]] if len(t.shape) else [value]
    elif field == 9:
        t.type = value % 128
    elif field == 10:
        m.operatorCodes[which % len(m.operatorCodes)].builtinCode = value % 256
    elif field == 11:
        sg.outputs = []
    elif field == 12:
        m.signatureDefs[0].outputs[0].tensorIndex = value % 2**32


@st.composite
def tflite_mutants(draw) -> bytes:
    kind = draw(st.sampled_from(["fields", "bytes", "truncate"]))
    if kind == "fields":
        m = load_t(BASE)
        for _ in range(draw(st.integers(1, 3))):
            try:
                _edit(m, draw(st.integers(0, 12)), draw(st.integers(0, 50)), draw(INDEX))
            except IndexError:  # an earlier edit emptied the list this one sets
                pass
        return save_t(m)
    data = bytearray(BASE)
    if kind == "truncate":
        return bytes(data[: draw(st.integers(0, len(data) - 1))])
    for _ in range(draw(st.integers(1, 8))):
        data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
    return bytes(data)


@contextlib.contextmanager
def _no_hang(seconds: int = 10):
    """A reader that loops forever fails the example instead of hanging the suite."""

    def hung(*_):
        raise TimeoutError(f"no answer within {seconds} s")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _read(data: bytes):
    from optimize.models.tflite import read_model

    try:
        with _no_hang():
            return read_model(data)
    except OptimizeError:
        return None


@FUZZ
@given(tflite_mutants())
def test_the_flatbuffer_validator_raises_only_model_errors(data):
    _read(data)  # anything but an OptimizeError fails the test


@FUZZ
@given(tflite_mutants())
def test_the_normaliser_raises_only_model_errors(data):
    from optimize.models.normalize import normalize

    try:
        with _no_hang():
            out = normalize(data)
    except OptimizeError:
        return
    assert _read(out.content) is not None  # what it makes, it makes valid


_RUN_ALL = """
import sys, numpy as np
from ai_edge_litert.interpreter import Interpreter
blobs = np.load(sys.argv[1], allow_pickle=False)
for k in blobs.files:
    try:
        it = Interpreter(model_content=blobs[k].tobytes())
        it.allocate_tensors()
        for d in it.get_input_details():
            it.set_tensor(d["index"], np.zeros(d["shape"], d["dtype"]))
        it.invoke()
    except Exception:
        pass
print("survived", len(blobs.files))
"""


def test_the_interpreter_survives_every_model_the_validator_accepts(tmp_path):
    """Every mutant the validator lets through is loaded, allocated and invoked, in one child process: it
    must not die of a signal (a crash there is what the validator exists to prevent)."""
    accepted: list[bytes] = []

    @FUZZ
    @given(tflite_mutants())
    def collect(data):
        if _read(data) is not None:
            accepted.append(data)

    collect()
    assert accepted, "no mutant passed validation: the fuzzing would test nothing"
    blobs = tmp_path / "accepted.npz"
    np.savez(blobs, **{f"m{i}": np.frombuffer(b, np.uint8) for i, b in enumerate(accepted)})
    r = subprocess.run([sys.executable, "-c", _RUN_ALL, str(blobs)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    assert f"survived {len(accepted)}" in r.stdout


# ---------------------------------------------------------------------------------------------- .npz
def _base_npz() -> bytes:
    rng = np.random.default_rng(0)
    buf = io.BytesIO()
    np.savez(buf, x=rng.random((6, 4), np.float32), y=np.arange(6) % 3)
    return buf.getvalue()


NPZ = _base_npz()


@st.composite
def npz_mutants(draw) -> bytes:
    kind = draw(st.sampled_from(["bytes", "truncate", "header"]))
    data = bytearray(NPZ)
    if kind == "truncate":
        return bytes(data[: draw(st.integers(0, len(data) - 1))])
    if kind == "header":  # rewrite the first array's .npy header: a forged shape or dtype
        z = zipfile.ZipFile(io.BytesIO(NPZ))
        out = io.BytesIO()
        with zipfile.ZipFile(out, "w") as w:
            for info in z.infolist():
                body = z.read(info)
                if info.filename == "x.npy":
                    shape = tuple(draw(st.lists(st.integers(0, 2**40), min_size=0, max_size=4)))
                    descr = draw(st.sampled_from(["<f4", "<c8", "|O", "<U3", "|V8", "<M8[s]", "<f2", "|b1"]))
                    h = io.BytesIO()
                    np.lib.format.write_array_header_1_0(h, {"descr": descr, "fortran_order": False, "shape": shape})
                    body = h.getvalue() + body[128:]
                w.writestr(info.filename, body)
        return out.getvalue()
    for _ in range(draw(st.integers(1, 8))):
        data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
    return bytes(data)


@FUZZ
@given(npz_mutants())
def test_the_data_reader_raises_only_data_errors(tmp_path_factory, data):
    from optimize.models.data import load_data

    p = tmp_path_factory.mktemp("npz") / "d.npz"
    p.write_bytes(data)
    try:
        with _no_hang():
            load_data(p)
    except OptimizeError:
        pass


# ---------------------------------------------------------------------------------------------- the front door
# Issue 37, item 7: ONNX graphs and .pt2 archives mutated from seeded models (dims, dtypes, external data,
# attributes, subgraphs; members, JSON, pickles) through the whole front door (`open_inputs`), with torch.export
# and litert-torch stubbed (every failure of theirs is already one line, and they take seconds each): only
# OptimizeError or a result, never another exception, never a payload, never a read outside the model (an audit
# hook watches every open of the planted secret and FIFO). A seeded, bounded run here; a longer one is slow.

DOOR = settings(FUZZ, max_examples=60, deadline=None)
DOOR_LONG = settings(FUZZ, max_examples=400, deadline=None)
_OPENED: list[str] = []
_WATCHING: list[bool] = []


def _audit(event: str, args) -> None:
    if _WATCHING and event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
        name = os.fsdecode(args[0])
        if name.endswith(("secret.bin", "fifo", "environ")):
            _OPENED.append(name)


sys.addaudithook(_audit)


@pytest.fixture(scope="module")
def door(tmp_path_factory):
    """A folder with a secret and a FIFO (the working folder while the targets run), the data, and a canned
    .tflite the stubbed converter returns."""
    import importlib.util

    pytest.importorskip("torch", reason="the torch extra is not installed")
    if importlib.util.find_spec("onnx2torch") is None:  # not imported here: onnx_ops imports it
        pytest.skip("the torch extra is not installed")
    root = tmp_path_factory.mktemp("door")
    (root / "secret.bin").write_bytes(b"DOOR-SECRET-0000" * 64)
    os.mkfifo(root / "fifo")
    np.savez(root / "d.npz", x=np.random.default_rng(0).random((4, 4)).astype(np.float32))
    old = os.getcwd()
    os.chdir(root)
    try:
        yield root
    finally:
        os.chdir(old)


def _through_the_door(path, data) -> None:
    """`open_inputs` on a crafted file, converters stubbed; OptimizeError is the only way out but a result."""
    from unittest import mock

    from optimize.convert import torch_export
    from optimize.convert.front import open_inputs

    _WATCHING.append(True)
    try:
        with (
            mock.patch.object(torch_export, "export", lambda *a, **k: None),
            mock.patch.object(torch_export, "to_tflite", lambda *a, **k: BASE),
            _no_hang(60),
        ):
            open_inputs(path, data)
        event("converted")
    except OptimizeError as e:
        event(f"refused: {' '.join(e.problem.split(':', 1)[-1].split()[:3])}")  # --hypothesis-show-statistics
    finally:
        _WATCHING.clear()
    assert _OPENED == [], _OPENED


def _onnx_base() -> bytes:
    """x [1, 4] -> MatMul(W) -> Add(a Constant) -> If(cond: Identity | Mul by an initializer of its own) -> Relu."""
    from onnx import TensorProto, helper, numpy_helper

    def vi(name, shape):
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)

    rng = np.random.default_rng(0)
    then = helper.make_graph([helper.make_node("Identity", ["a"], ["b"])], "then", [], [vi("b", [1, 4])])
    other = helper.make_graph(
        [helper.make_node("Mul", ["a", "k"], ["b"])], "else", [], [vi("b", [1, 4])],
        [numpy_helper.from_array(np.full(4, 0.5, np.float32), "k")],
    )  # fmt: skip
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["m"]),
        helper.make_node("Constant", [], ["C"], value=numpy_helper.from_array(rng.random(4).astype(np.float32))),
        helper.make_node("Add", ["m", "C"], ["a"]),
        helper.make_node("If", ["cond"], ["i"], then_branch=then, else_branch=other),
        helper.make_node("Relu", ["i"], ["y"]),
    ]
    inits = [numpy_helper.from_array(rng.random((4, 4)).astype(np.float32), "W"), numpy_helper.from_array(
        np.array(False), "cond")]  # fmt: skip
    g = helper.make_graph(nodes, "g", [vi("x", [1, 4])], [vi("y", [1, 4])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m.SerializeToString()


def _onnx_tensors(m) -> list:
    """Every tensor of the seeded graph: initializers, the Constant's value, the else branch's initializer."""
    out = list(m.graph.initializer)
    for n in m.graph.node:
        for a in n.attribute:
            if a.HasField("t"):
                out.append(a.t)
            if a.HasField("g"):
                out.extend(a.g.initializer)
    return out


LOCATIONS = st.sampled_from(["secret.bin", "../secret.bin", "fifo", "/proc/self/environ", "./secret.bin"])


@st.composite
def onnx_mutants(draw) -> bytes:
    import onnx
    from onnx import AttributeProto, TensorProto

    data = _ONNX_BASE()
    kind = draw(st.sampled_from(["dims", "dtype", "external", "attribute", "subgraph", "bytes", "truncate"]))
    if kind in ("bytes", "truncate"):
        raw = bytearray(data)
        if kind == "truncate":
            return bytes(raw[: draw(st.integers(0, len(raw) - 1))])
        for _ in range(draw(st.integers(1, 8))):
            raw[draw(st.integers(0, len(raw) - 1))] = draw(st.integers(0, 255))
        return bytes(raw)
    m = onnx.load_from_string(data)
    tensors = _onnx_tensors(m)
    t = tensors[draw(st.integers(0, len(tensors) - 1))]
    if kind == "dims":
        dims = st.one_of(st.integers(-2, 8), st.sampled_from([2**31, 2**40, 2**62]))
        t.dims[:] = draw(st.lists(dims, max_size=4))
    elif kind == "dtype":
        t.data_type = draw(st.integers(0, 40))
    elif kind == "external":
        t.data_location = draw(st.sampled_from([TensorProto.EXTERNAL, TensorProto.DEFAULT]))
        for key, value in (("location", draw(LOCATIONS)), ("offset", str(draw(st.integers(0, 64)))), ("length", "16")):
            e = t.external_data.add()
            e.key, e.value = key, value
    elif kind == "attribute":
        node = m.graph.node[draw(st.integers(0, len(m.graph.node) - 1))]
        if node.attribute and draw(st.booleans()):
            a = node.attribute[draw(st.integers(0, len(node.attribute) - 1))]
            a.type = draw(st.sampled_from(list(AttributeProto.AttributeType.values())))
            a.name = draw(st.sampled_from([a.name, "value_float", "value_ints", "sparse_value", "x\nerror: forged"]))
        else:
            extra = node.attribute.add()
            extra.name, extra.type = draw(st.sampled_from(["axis", "perm", "to", "value"])), AttributeProto.INT
            extra.i = draw(st.integers(-(2**40), 2**40))
    else:  # subgraph: a branch loses or gains a node, or points at the graph it sits in
        which = draw(st.sampled_from(["then_branch", "else_branch"]))
        branch = next(a.g for n in m.graph.node for a in n.attribute if a.name == which)
        choice = draw(st.integers(0, 2))
        if choice == 0 and branch.node:
            del branch.node[0]
        elif choice == 1:
            branch.node.extend(m.graph.node[:2])
        else:
            branch.output[0].name = draw(st.sampled_from(["y", "W", "", "missing"]))
    return m.SerializeToString()


def _ONNX_BASE(_cache: list = []) -> bytes:  # noqa: B006, N802 - built once, on first use (needs onnx)
    if not _cache:
        _cache.append(_onnx_base())
    return _cache[0]


def _onnx_target(door, data: bytes) -> None:
    path = door / "m.onnx"
    path.write_bytes(data)
    _through_the_door(path, door / "d.npz")


@DOOR
@given(data=onnx_mutants())
def test_mutated_onnx_graphs_are_one_line_or_a_result(door, data):
    _onnx_target(door, data)


@pytest.mark.slow
@DOOR_LONG
@given(data=onnx_mutants())
def test_mutated_onnx_graphs_at_length(door, data):
    _onnx_target(door, data)


def test_the_onnx_base_goes_through(door):
    """The unmutated seed converts (the stubbed converter's .tflite comes back): the fuzzing starts from a
    file the door accepts."""
    from unittest import mock

    from optimize.convert import torch_export
    from optimize.convert.front import open_inputs

    path = door / "base.onnx"
    path.write_bytes(_ONNX_BASE())
    with mock.patch.object(torch_export, "export", lambda *a, **k: None), mock.patch.object(
        torch_export, "to_tflite", lambda *a, **k: BASE
    ):  # fmt: skip
        src, _ = open_inputs(path, door / "d.npz")
    assert src.conversion is not None and src.conversion.source == "onnx"


# .pt2 archives


def _pt2_base(_cache: list = []) -> bytes:  # noqa: B006 - built once, on first use (needs torch)
    if not _cache:
        import tempfile

        import torch

        class Small(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.l = torch.nn.Linear(4, 4)
                self.register_buffer("c", torch.ones(4))

            def forward(self, x):
                return torch.relu(self.l(x) + self.c)

        torch.manual_seed(0)
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "base.pt2")
            torch.export.save(torch.export.export(Small().eval(), (torch.zeros(1, 4),)), path)
            _cache.append(open(path, "rb").read())  # noqa: SIM115
    return _cache[0]


def _payload() -> bytes:
    """A pickle that would create a marker file if anything unpickled it freely."""
    import pickle

    class Run:
        def __reduce__(self):
            return (exec, ("open('PAYLOAD-RAN', 'w').close()",))

    return pickle.dumps(Run(), protocol=2)


TARGETS = st.sampled_from([
    "torch.serialization.os.system", "builtins.eval", "torch.ops.aten.add.__call__", "#x", "math.sqrt",
    "torch.ops.aten.relu.default", "torch.ops.aten.linear.default", "_operator.getitem", "torch.ops.load_library.x",
])  # fmt: skip


def _edit_json(draw, doc) -> None:
    """One edit of a .pt2's JSON: a tensor's sizes, strides, offset or dtype, a node's target, a key dropped."""
    dicts = [d for d in _dicts(doc)]
    metas = [d for d in dicts if "sizes" in d and "strides" in d]
    nodes = [d for d in dicts if "target" in d and "inputs" in d]
    kind = draw(st.integers(0, 3))
    value = st.one_of(st.integers(-3, 8), st.sampled_from([2**31, 2**33, 2**62]))
    if kind == 0 and metas:
        meta = metas[draw(st.integers(0, len(metas) - 1))]
        field = draw(st.sampled_from(["sizes", "strides"]))
        meta[field] = [{"as_int": draw(value)} for _ in range(draw(st.integers(0, 3)))]
    elif kind == 1 and metas:
        meta = metas[draw(st.integers(0, len(metas) - 1))]
        meta[draw(st.sampled_from(["storage_offset", "dtype", "layout"]))] = draw(
            st.one_of(value, st.just({"as_int": 2**40}), st.just(None))
        )
    elif kind == 2 and nodes:
        nodes[draw(st.integers(0, len(nodes) - 1))]["target"] = draw(TARGETS)
    elif dicts:
        d = dicts[draw(st.integers(0, len(dicts) - 1))]
        if d:
            d.pop(draw(st.sampled_from(sorted(d))))


def _dicts(doc):
    """Every dict in a JSON document, as the .pt2 checks walk it."""
    from optimize.convert.pt2_checks import _walk

    return _walk(doc)


@st.composite
def pt2_mutants(draw) -> bytes:
    import json

    base = _pt2_base()
    kind = draw(st.sampled_from(["json", "member bytes", "pickle", "payload", "truncate", "rename", "duplicate"]))
    if kind == "truncate":
        return base[: draw(st.integers(0, len(base) - 1))]
    z = zipfile.ZipFile(io.BytesIO(base))
    members = {i.filename: z.read(i) for i in z.infolist()}
    names = sorted(members)
    out: list[tuple[str, bytes]] = list(members.items())
    if kind == "json":
        name = draw(st.sampled_from([n for n in names if n.endswith(".json")]))
        doc = json.loads(members[name])
        _edit_json(draw, doc)
        out = [(n, json.dumps(doc).encode() if n == name else d) for n, d in out]
    elif kind in ("member bytes", "pickle"):
        pool = [n for n in names if n.endswith(".pt")] if kind == "pickle" else names
        name = draw(st.sampled_from(pool))
        data = bytearray(members[name])
        for _ in range(draw(st.integers(1, 4))):
            if data:
                data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
        out = [(n, bytes(data) if n == name else d) for n, d in out]
    elif kind == "payload":
        name = draw(st.sampled_from([n for n in names if n.endswith(".pt") or "/data/" in n]))
        out = [(n, _payload() if n == name else d) for n, d in out]
    elif kind == "rename":
        name = draw(st.sampled_from(names))
        new = draw(st.sampled_from(["other/" + name.split("/", 1)[1], "../" + name, "/" + name, name + "\nx"]))
        out = [(new if n == name else n, d) for n, d in out]
    else:
        name = draw(st.sampled_from(names))
        out.append((name, members[name]))
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as w, __import__("warnings").catch_warnings():
        __import__("warnings").simplefilter("ignore")
        for n, d in out:
            w.writestr(zipfile.ZipInfo(n, date_time=(2024, 1, 1, 0, 0, 0)), d)
    return buf.getvalue()


def _pt2_target(door, data: bytes) -> None:
    path = door / "m.pt2"
    path.write_bytes(data)
    _through_the_door(path, door / "d.npz")
    assert not (door / "PAYLOAD-RAN").exists()


@DOOR
@given(data=pt2_mutants())
def test_mutated_pt2_archives_are_one_line_or_a_result(door, data):
    _pt2_target(door, data)


@pytest.mark.slow
@DOOR_LONG
@given(data=pt2_mutants())
def test_mutated_pt2_archives_at_length(door, data):
    _pt2_target(door, data)

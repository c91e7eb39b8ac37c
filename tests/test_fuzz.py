"""Property-based fuzzing (issue 18, item 8): random mutations of small valid files never raise anything but
the project's own error type, never crash the process, never hang.

Three readers: the flatbuffer validator (`models.tflite.read_model`, shared by compat and every
other reader), the .tflite normaliser, and the .npz data reader. Mutations are byte flips, truncations
and, for the flatbuffer, edits of the fields a crafted file aims at (tensor, buffer, opcode and subgraph
indices, signature maps, shapes, quantization). Every mutant the validator accepts is then loaded,
allocated and invoked by the LiteRT interpreter in a child process, which must not die of a signal.

Fixed seed (derandomized), a bounded number of examples and a per-example deadline: the suite's time
is bounded and a failure reproduces.
"""

from __future__ import annotations

import contextlib
import io
import signal
import subprocess
import sys
import zipfile

import numpy as np
from delegate_fixtures import load_t, op, save_t, tensor, tiny
from hypothesis import HealthCheck, given, settings
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

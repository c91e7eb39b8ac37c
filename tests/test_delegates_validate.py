"""Issue 11, item 11: `compat` must not give verdicts for models the runtime would refuse.

Each class of corruption is made by editing one field of a small valid model. Where the LiteRT runtime
refuses the edited model too, the test checks that (so the validation follows the runtime, not a guess);
every case must be one ModelError line (exit code 2 from the CLI), never a verdict.
"""

from __future__ import annotations

import numpy as np
import pytest
from delegate_fixtures import load_t, op, save_t, tensor, tiny
from tests_support import one_line_error

from optimize.core.errors import ModelError
from optimize.delegates import check_delegates
from optimize.models import runtime
from optimize.models.tflite import read_model


@pytest.fixture(scope="module")
def base() -> bytes:
    """x[1,4] + constant[4] -> ADD -> RELU: valid, and the runtime runs it."""
    tensors = [tensor([1, 4]), tensor([4], data=np.ones(4, np.float32)), tensor([1, 4]), tensor([1, 4])]
    ops = [op("ADD", [0, 1], [2], ("AddOptions", {})), op("RELU", [2], [3])]
    return tiny(tensors, ops, [0], [3])


def edit(data: bytes, change) -> bytes:
    m = load_t(data)
    change(m.subgraphs[0])
    return save_t(m)


CASES = {
    # core/interpreter_builder.cc:749-754
    "buffer index out of range": (lambda g: setattr(g.tensors[1], "buffer", 57), "refers to buffer 57", True),
    # core/subgraph.cc:916-937 (node inputs, 1116-1120)
    "operator input out of range": (lambda g: setattr(g.operators[1], "inputs", [99]), "refers to tensor 99", True),
    "negative operator input": (lambda g: setattr(g.operators[1], "inputs", [-5]), "refers to tensor -5", True),
    # core/subgraph.cc:843-851
    "graph input out of range": (lambda g: setattr(g, "inputs", [42]), "input list refers to tensor 42", True),
    "graph output out of range": (lambda g: setattr(g, "outputs", [42]), "output list refers to tensor 42", True),
    # graph_info.cc:124-127: partitioning fails; the runtime alone runs the ops in file order on garbage
    "cycle": (lambda g: setattr(g.operators[0], "inputs", [3, 1]), "has a cycle: operator 0 (ADD)", False),
    # util.cc:243-258 (BytesRequired overflows): 2^62 elements
    "huge shape": (lambda g: setattr(g.tensors[2], "shape", [2**31 - 1, 2**31 - 1, 2]), "more than any device", True),
    "negative dimension": (lambda g: setattr(g.tensors[2], "shape", [1, -4]), "negative dimension", True),
    # core/subgraph.cc:1955-1966: a constant's buffer must hold its shape
    "constant buffer too small": (lambda g: setattr(g.tensors[1], "shape", [1000]), "needs 4000 bytes", True),
}


def test_the_base_model_is_valid(base):
    runtime.load(base).interpreter.invoke()
    assert check_delegates(base, ["gpu"])["gpu"].verdict == "full"


@pytest.mark.parametrize("case", sorted(CASES))
def test_corrupt_structure_is_one_model_error(base, case):
    change, message, runtime_refuses = CASES[case]
    data = edit(base, change)
    with pytest.raises(ModelError, match="corrupt or hand-edited") as e:
        check_delegates(data)
    assert message in str(e.value) and "\n" not in str(e.value) and e.value.exit_code == 2
    if runtime_refuses:  # the interpreter itself (runtime.load validates first, as every reader does)
        from ai_edge_litert.interpreter import Interpreter

        with pytest.raises((ValueError, RuntimeError)):
            Interpreter(model_content=data).allocate_tensors()
        with pytest.raises(ModelError, match="corrupt or hand-edited"):
            runtime.load(data)


def test_buffer_of_2_to_the_62_bytes(base):
    """A buffer stored by offset/size (the >2 GB layout) claiming 2^62 bytes runs past the file: refused
    (interpreter_builder.cc:762-768)."""
    m = load_t(base)
    buf = m.buffers[m.subgraphs[0].tensors[1].buffer]
    buf.data, buf.offset, buf.size = None, 64, 2**62
    with pytest.raises(ModelError, match="runs past the end of the file"):
        read_model(save_t(m))


@pytest.mark.parametrize("offset", [0, 1])
def test_a_buffer_of_2_to_the_62_bytes_at_offset_0_or_1_is_refused(base, offset, tmp_path, cli):
    """Issue 26: offset 1 (the converter's placeholder) with a size of 2^62 passed validation (compat exit 0,
    quantize exit 1). Offset 0 or 1 means no data outside the flatbuffer: any size then names bytes that are
    nowhere. Every reader refuses it in one line, exit 2; the same buffer with size 0 stays valid."""
    m = load_t(base)
    extra = len(m.buffers)
    from ai_edge_litert import schema_py_generated as s

    b = s.BufferT()
    b.offset, b.size = offset, 2**62
    m.buffers.append(b)
    m.subgraphs[0].tensors[2].buffer = extra  # an activation tensor pointing at it, as a crafted file would
    data = save_t(m)
    with pytest.raises(ModelError, match=f"buffer {extra} claims 4,611,686,018,427,387,904 bytes at offset {offset}"):
        read_model(data)
    bad = tmp_path / "offset.tflite"
    bad.write_bytes(data)
    for args in (["compat", str(bad)], ["quantize", str(bad), "--scheme", "dynamic", "-o", str(tmp_path / "q")]):
        r = cli(*args)
        assert r.stdout == "", args
        one_line_error(r, "outside the file")
    b.size = 0
    read_model(save_t(m))  # a placeholder with no size: nothing is claimed


def test_compat_exits_2_with_one_line(base, tmp_path, cli):
    bad = tmp_path / "cycle.tflite"
    bad.write_bytes(edit(base, CASES["cycle"][0]))
    r = cli("compat", str(bad))
    assert r.returncode == 2 and r.stdout == ""
    one_line_error(r, "has a cycle")


# ---- issue 18: what the runtime copies unchecked, checked by the one validator every reader shares ----
def _signed(m, *signatures) -> None:
    m.signatureDefs = [*(m.signatureDefs or []), *signatures]


def _signature(m, key="serving_default", subgraph=0, inputs=((b"x", 0),), outputs=((b"y", 3),)):
    from ai_edge_litert import schema_py_generated as s

    sig = s.SignatureDefT()
    sig.signatureKey, sig.subgraphIndex = key, subgraph
    for attr, maps in (("inputs", inputs), ("outputs", outputs)):
        out = []
        for name, index in maps:
            tm = s.TensorMapT()
            tm.name, tm.tensorIndex = name, index
            out.append(tm)
        setattr(sig, attr, out)
    return sig


def _call_once(m, subgraph: int):
    """A CALL_ONCE running `subgraph`, first in the main graph."""
    from ai_edge_litert import schema_py_generated as s

    code = s.OperatorCodeT()
    code.builtinCode, code.deprecatedBuiltinCode, code.version = s.BuiltinOperator.CALL_ONCE, 127, 1
    m.operatorCodes.append(code)
    o = s.OperatorT()
    o.opcodeIndex, o.inputs, o.outputs = len(m.operatorCodes) - 1, [], []
    o.builtinOptionsType = s.BuiltinOptions.CallOnceOptions
    o.builtinOptions = s.CallOnceOptionsT()
    o.builtinOptions.initSubgraphIndex = subgraph
    m.subgraphs[0].operators.insert(0, o)


def _per_channel(m, scales: int, zero_points: int, dim: int):
    from ai_edge_litert import schema_py_generated as s

    q = s.QuantizationParametersT()
    q.scale, q.zeroPoint, q.quantizedDimension = [0.1] * scales, [0] * zero_points, dim
    m.subgraphs[0].tensors[1].quantization = q


MODEL_CASES = {
    # interpreter_builder.cc ParseSignatureDefs copies these unchecked; the signature runner indexes with them
    "signature runs a missing subgraph": (lambda m: _signed(m, _signature(m, subgraph=5)), "runs subgraph 5"),
    "signature input out of range": (
        lambda m: _signed(m, _signature(m, inputs=((b"x", 300),))),
        "input 'x' is tensor 300",
    ),
    "signature output not an output": (
        lambda m: _signed(m, _signature(m, outputs=((b"y", 1),))),
        "output 'y' is tensor 1",
    ),
    "two signatures with one key": (
        lambda m: _signed(m, _signature(m), _signature(m)),
        "share the key 'serving_default'",
    ),
    "no outputs": (lambda m: setattr(m.subgraphs[0], "outputs", []), "has no outputs"),
    # found by tests/test_fuzz.py: the interpreter died of SIGSEGV on both (kernels use them unchecked)
    "an operator output omitted": (lambda m: setattr(m.subgraphs[0].operators[1], "outputs", [-1]), "tensor -1"),
    "a required input omitted": (
        lambda m: setattr(m.subgraphs[0].operators[0], "inputs", [0, -1]),
        "omits its input 1, which the ADD kernel requires",
    ),
    "control flow runs a missing subgraph": (lambda m: _call_once(m, 9), "runs subgraph 9, but the model has 1"),
    "a subgraph that calls itself": (lambda m: _call_once(m, 0), "subgraph 0 calls itself"),
    # interpreter_builder.cc ParseQuantization
    "scales without zero points": (lambda m: _per_channel(m, 4, 1, 0), "4 quantization scales but 1 zero points"),
    "quantized dimension outside the shape": (lambda m: _per_channel(m, 4, 4, 3), "along dimension 3 of a rank-1"),
    "one scale per channel, not 2": (lambda m: _per_channel(m, 2, 2, 0), "2 scales for 4 channels"),
}


@pytest.mark.parametrize("case", sorted(MODEL_CASES))
def test_what_the_runtime_copies_unchecked_is_refused_by_every_reader(base, case):
    """One validator for compat, the normaliser and the model reader (issue 18, item 3)."""
    from optimize.models.normalize import normalize

    change, message = MODEL_CASES[case]
    m = load_t(base)
    change(m)
    data = save_t(m)
    for reader in (read_model, normalize, check_delegates):
        with pytest.raises(ModelError, match="corrupt or hand-edited") as e:
            reader(data)
        assert message in str(e.value) and "\n" not in str(e.value)


def test_a_valid_signature_and_control_flow_pass(base):
    m = load_t(base)
    m.signatureDefs = [_signature(m)]
    model = read_model(save_t(m))
    assert model.signatures[0].key == "serving_default" and model.signatures[0].inputs == (("x", 0),)

"""An integer model that runs where its float model runs: the failure rescue, both backends, the stale
signature LiteRT Quantizer writes, crashes contained, non-finite calibration samples, and `debug` and
`mixed-int8` on a model whose plain int8 cannot run. Seeded small models built here; no downloads.
"""

from __future__ import annotations

import json
import os
import signal

import numpy as np
import pytest

from optimize.core.errors import TechniqueFailed
from optimize.core.recipe import build
from optimize.core.registry import Context, get
from optimize.models import _tf, runtime
from optimize.models.data import load_data
from optimize.models.tflite import read_model


def _convert(fn, spec) -> bytes:
    tf = _tf.tf()

    class M(tf.Module):
        @tf.function(input_signature=[spec])
        def serve(self, x):
            return fn(x)

    m = M()
    return tf.lite.TFLiteConverter.from_concrete_functions([m.serve.get_concrete_function()], m).convert()


def _weights(shape, seed=0):
    return _tf.tf().constant(np.random.default_rng(seed).normal(size=shape).astype(np.float32))


@pytest.fixture(scope="module")
def div(tmp_path_factory):
    """x @ w1 / (mean|x| + 1e-3) @ w2: the divisor is input-derived and non-negative (a loudness
    normalisation); silence makes it round to its int8 zero point. And the same divided by mean(x) + 1e-3,
    whose divisor can be negative (no clamp is exact there: kept float)."""
    tf = _tf.tf()
    w1, w2 = _weights((64, 16)), _weights((16, 4), 1)
    spec = tf.TensorSpec([1, 64], tf.float32, name="x")
    folder = tmp_path_factory.mktemp("div")
    loud = _convert(
        lambda x: {"y": tf.matmul(tf.matmul(x, w1) / (tf.reduce_mean(tf.abs(x), -1, True) + 1e-3), w2)}, spec
    )
    signed = _convert(lambda x: {"y": tf.matmul(tf.matmul(x, w1) / (tf.reduce_mean(x, -1, True) + 1e-3), w2)}, spec)
    (folder / "loud.tflite").write_bytes(loud)
    (folder / "signed.tflite").write_bytes(signed)
    np.savez(folder / "d.npz", x=np.random.default_rng(1).normal(size=(120, 64)).astype(np.float32))
    return folder


def _quantize(folder, model: str, tmp_path, **params):
    tech = get("quantize")
    ctx = Context(workdir=tmp_path, data=load_data(folder / "d.npz"), source_kind="tflite")
    out = tech.fn(folder / model, tech.params(**{"scheme": "int8", **params}), ctx)
    return out, ctx


def _runs_on_zeros(path) -> bool:
    runner = runtime.Runner(runtime.load(path, threads=1))
    out = runner.run_fresh(np.zeros((1, 64), np.float32))
    return all(np.all(np.isfinite(o)) for o in out)


def test_a_div_by_an_input_derived_value_is_clamped_in_integer(div, tmp_path):
    """The non-negative divisor: clamped to one step inside the int8 graph (fully integer), said so."""
    with pytest.raises(runtime.InvokeError, match="DIV"):  # what the quantizer makes on its own
        _runs_on_zeros(_quantize(div, "loud.tflite", tmp_path / "raw", repair=False)[0])
    out, ctx = _quantize(div, "loud.tflite", tmp_path)
    assert _runs_on_zeros(out)
    repair = ctx.records["repair"]
    (fix,) = repair.islands
    assert fix.op == "DIV" and fix.precision == "int8" and "divisor clamped" in fix.reason
    assert "fails on all-zero input" in fix.reason and "zero_point" in fix.reason
    ops = [op.name for op in read_model(out.read_bytes()).main.ops]
    assert "MAXIMUM" in ops and ops.count("DEQUANTIZE") == 1  # only the float output at the edge
    assert any("kept int8 (divisor clamped)" in n for n in ctx.notes), ctx.notes


def test_a_divisor_that_can_be_negative_is_kept_float(div, tmp_path):
    out, ctx = _quantize(div, "signed.tflite", tmp_path)
    assert _runs_on_zeros(out)
    (island,) = ctx.records["repair"].islands
    assert island.op == "DIV" and island.precision == "float"
    div_op = next(op for op in read_model(out.read_bytes()).main.ops if op.name == "DIV")
    assert read_model(out.read_bytes()).main.tensors[div_op.outputs[0]].dtype == "float32"
    assert any(i.op == "DIV" and i.precision == "float" for i in ctx.records["islands"])


def test_the_sweep_keeps_a_working_int8_and_says_why(div, tmp_path):
    from optimize.engine import sweeps

    recipes = [
        build("int8", [{"technique": "quantize", "scheme": "int8"}]),
        build("int8-int8io", [{"technique": "quantize", "scheme": "int8", "io": "int8"}]),
    ]
    study = sweeps.sweep(
        div / "signed.tflite", div / "d.npz", tmp_path / "s", recipes=recipes, delegates=False, runs=3, jobs=0
    )
    int8 = study.candidate("int8")
    assert int8.ok and int8.probe.ok, int8.error
    assert int8.repair is not None and int8.repair.rounds == 1 and int8.repair.seconds > 0
    assert [i.op for i in int8.islands if i.precision == "float"] == ["DIV"]
    assert int8.composition.float_compute_count == 1 and int8.composition.compute_ops >= 4
    saved = json.loads((tmp_path / "s" / "study.json").read_text())["candidates"][1]
    assert saved["repair"]["islands"][0]["op"] == "DIV" and saved["islands"]
    io8 = study.candidate("int8-int8io")  # integer-only cannot keep a float DIV: an honest failure
    assert not io8.ok and "DIV" in io8.error


def test_mixed_int8_and_debug_work_on_a_model_whose_plain_int8_cannot_run(div, tmp_path, cli):
    from optimize.engine.debug import debug_model
    from optimize.engine.single import run

    report = debug_model(div / "signed.tflite", div / "d.npz", samples=8, leave_out=1)
    assert report.layers and [i.op for i in report.repaired] == ["DIV"]
    assert all(le.op != "DIV" for le in report.layers)  # the float island is not ranked as an int8 op
    cand = run(
        build("mixed-int8", [{"technique": "selective"}]),
        div / "signed.tflite",
        div / "d.npz",
        tmp_path / "m",
        jobs=0,
        delegates=False,
    )
    assert cand.ok and cand.probe.ok, cand.error
    assert cand.repair is not None and any(i.op == "DIV" for i in cand.islands)
    r = cli("debug", str(div / "signed.tflite"), "--data", str(div / "d.npz"), "--samples", "4", "--leave-out", "1")
    assert r.returncode == 0, r.stderr
    assert "Kept out of int8 first" in r.stdout and "DIV" in r.stdout


def _session(content: bytes, tmp_path, width: int, scheme: str):
    """A calibrated LiteRT Quantizer session on `content` (seeded normal samples of `width` features) and the
    failure check the repair runs, as the quantize technique builds them."""
    from optimize.transforms.tflite import repair
    from optimize.transforms.tflite.quantize import _calibration_data, _inspect
    from optimize.transforms.tflite.session import Session

    model = tmp_path / "model.tflite"
    model.write_bytes(content)
    np.savez(tmp_path / "d.npz", x=np.random.default_rng(0).normal(size=(64, width)).astype(np.float32))
    ds = load_data(tmp_path / "d.npz")
    params = get("quantize").params(scheme=scheme)
    ctx = Context(workdir=tmp_path, data=ds)
    sig, inputs = _inspect(content, model)
    session = Session(content, params, ctx, _calibration_data(params, ctx, sig, inputs, model))
    return session, repair.Check.build(content, ds, 1)


def test_no_node_named_is_bisected(tmp_path):
    """LOG of an int8 value that silence makes exactly 0 (float: log(1e-6)): NaN/inf with no node named.
    LiteRT Quantizer leaves LOG float; bisecting finds the op whose int8 output feeds it the zero."""
    from optimize.transforms.tflite import repair

    tf = _tf.tf()
    w = _weights((16, 8))
    content = _convert(lambda x: {"y": tf.math.log(tf.matmul(x, w) ** 2 + 1e-6)}, tf.TensorSpec([1, 16], tf.float32))
    session, check = _session(content, tmp_path, 16, "int8")
    assert check.first_failure(session.quantize()).kind == "non-finite"
    fixer = repair.Repairer(session.quantize, content, check, "LiteRT Quantizer")
    fixed = fixer.run()
    assert check.first_failure(fixed) is None
    assert fixer.islands and all("(bisected)" in i.reason for i in fixer.islands)


def test_a_slow_variant_is_checked_on_two_interpreters_and_fails_where_one_would(tmp_path, monkeypatch):
    """A variant slower than SLOW_SECONDS an invoke (int16x8 on reference kernels) shares its check's inputs
    between two interpreters at once; the failure named is the first in the inputs' order, as on one."""
    from optimize.transforms.tflite import repair

    tf = _tf.tf()
    w = _weights((16, 8))
    content = _convert(lambda x: {"y": tf.math.log(tf.matmul(x, w) ** 2 + 1e-6)}, tf.TensorSpec([1, 16], tf.float32))
    session, check = _session(content, tmp_path, 16, "int8")
    broken = session.quantize()
    keep = [i for i, (label, _) in enumerate(check.inputs) if "input" not in label]  # zeros, a constant: fail
    check.inputs, check.reference = [check.inputs[i] for i in keep], [check.reference[i] for i in keep]
    on_one = check.first_failure(broken)
    assert on_one is not None and [label for label, _ in check.inputs].index(on_one.input) >= 2
    used: list[int] = []
    in_two = repair.Check._in_two
    monkeypatch.setattr(repair.Check, "_in_two", lambda self, *a: used.append(len(a[-1])) or in_two(self, *a))
    monkeypatch.setattr(repair, "SLOW_SECONDS", -1.0)  # every variant counts as slow
    on_two = check.first_failure(broken)
    assert used and used[0] > 1
    assert on_two is not None and (on_two.input, on_two.kind, on_two.message) == (
        on_one.input,
        on_one.kind,
        on_one.message,
    )
    fixed = repair.Repairer(session.quantize, content, check, "LiteRT Quantizer").run()
    assert check.first_failure(fixed) is None


def test_every_collapsed_clamp_bound_is_kept_float_in_one_round(tmp_path):
    """Layers whose outputs are all but zero (dead weights: ranges that collapsed) get, at 16-bit activations, an
    output scale at which their fused RELU6 bound does not fit int32: the model does not load, and the runtime names
    only the first such op. The repair keeps every one of them float in one round, read from the flatbuffer's scales."""
    from optimize.transforms.tflite import repair

    tf = _tf.tf()
    dead1, dead2 = _weights((32, 32)) * 1e-30, _weights((32, 32), 2) * 1e-30
    live, head = _weights((32, 32), 3), _weights((32, 4), 4)

    def net(x):
        h = tf.nn.relu6(tf.matmul(x, dead1))
        h = tf.nn.relu6(tf.matmul(h, dead2) + tf.matmul(x, live))
        return {"y": tf.matmul(tf.nn.relu6(tf.matmul(x, live)) + h, head)}

    session, check = _session(_convert(net, tf.TensorSpec([1, 32], tf.float32)), tmp_path, 32, "int16x8")
    content = session.content
    plain = session.quantize()
    failure = check.first_failure(plain)
    assert failure is not None and failure.kind == "load" and repair.OVERFLOW in failure.message
    bad = repair.overflowing(plain)
    assert bad and all(op == "FULLY_CONNECTED" for _, op in bad)
    fixer = repair.Repairer(session.quantize, content, check, "LiteRT Quantizer")
    fixed = fixer.run()
    assert check.first_failure(fixed) is None and repair.overflowing(fixed) == []
    assert fixer.rounds == 1 and {i.tensor for i in fixer.islands} == {t for t, _ in bad}


def test_a_leaky_relu_net_gets_the_int8_kernels_and_says_what_it_costs(tmp_path):
    tf = _tf.tf()
    w1, w2 = _weights((32, 32)), _weights((32, 4), 1)
    content = _convert(
        lambda x: {"y": tf.matmul(tf.nn.leaky_relu(tf.matmul(x, w1), 0.1), w2)}, tf.TensorSpec([1, 32], tf.float32)
    )
    (tmp_path / "leaky.tflite").write_bytes(content)
    np.savez(tmp_path / "d.npz", x=np.random.default_rng(0).normal(size=(64, 32)).astype(np.float32))
    folder = tmp_path
    tech = get("quantize")
    ctx = Context(workdir=tmp_path, data=load_data(folder / "d.npz"), source_kind="tflite")
    out = tech.fn(folder / "leaky.tflite", tech.params(scheme="int8"), ctx)
    sg = read_model(out.read_bytes()).main
    leaky = next(op for op in sg.ops if op.name == "LEAKY_RELU")
    assert sg.tensors[leaky.outputs[0]].dtype == "int8" and ctx.records["backend"] == "calibrator"
    assert any("LEAKY_RELU" in n and "Quick p50 here" in n for n in ctx.notes), ctx.notes
    ctx2 = Context(workdir=tmp_path / "b", data=load_data(folder / "d.npz"), source_kind="tflite")
    (tmp_path / "b").mkdir()
    out2 = tech.fn(folder / "leaky.tflite", tech.params(scheme="int8", integer_kernels=False), ctx2)
    sg2 = read_model(out2.read_bytes()).main
    leaky2 = next(op for op in sg2.ops if op.name == "LEAKY_RELU")
    assert sg2.tensors[leaky2.outputs[0]].dtype == "float32"
    assert [i.op for i in ctx2.records["islands"]] == ["LEAKY_RELU"]


def test_an_output_read_inside_the_graph_gets_a_valid_integer_signature(tmp_path):
    """LiteRT Quantizer with int8 I/O leaves the SignatureDef at a tensor that is no longer an output when
    that output is also read inside the graph: split before quantizing, re-pointed after. Never blamed on
    the user's model."""
    from optimize.transforms.tflite import graphfix

    tf = _tf.tf()
    w = _weights((16, 8))
    content = _convert(
        lambda x: {"a": tf.nn.relu(tf.matmul(x, w)), "b": tf.nn.relu(tf.matmul(x, w)) * 2.0},
        tf.TensorSpec([1, 16], tf.float32),
    )
    assert graphfix.shared_outputs(content) == 1
    (tmp_path / "shared.tflite").write_bytes(content)
    np.savez(tmp_path / "d.npz", x=np.random.default_rng(0).normal(size=(64, 16)).astype(np.float32))
    tech = get("quantize")
    ctx = Context(workdir=tmp_path, data=load_data(tmp_path / "d.npz"), source_kind="tflite")
    out = tech.fn(tmp_path / "shared.tflite", tech.params(scheme="int8", io="int8"), ctx)
    m = read_model(out.read_bytes())
    assert [m.main.tensors[i].dtype for i in m.main.outputs] == ["int8", "int8"]
    assert {t for _, t in m.signatures[0].outputs} == set(m.main.outputs)
    assert any("given their own tensor" in n for n in ctx.notes)


def test_a_model_a_quantizer_wrote_that_does_not_validate_is_its_fault(tmp_path):
    from optimize.transforms.tflite import graphfix
    from optimize.transforms.tflite.session import made_by

    tf = _tf.tf()
    content = _convert(lambda x: {"y": x * 2.0}, tf.TensorSpec([1, 4], tf.float32))
    from delegate_fixtures import load_t, save_t

    m = load_t(content)
    m.subgraphs[0].outputs = [0]  # the graph's output moved (as a quantizer's DEQUANTIZE moves it); the
    stale = save_t(m)  # signature still names the old tensor
    assert graphfix.stale_signature(stale)
    with pytest.raises(TechniqueFailed) as e:
        made_by("LiteRT Quantizer", stale)
    assert "LiteRT Quantizer wrote a model that does not validate" in str(e.value)
    assert "re-export" not in str(e.value).lower()
    fixed = graphfix.fix_signature_if_stale(stale, content)
    assert read_model(fixed).signatures[0].outputs[0][1] == read_model(fixed).main.outputs[0] == 0


def test_a_quantizer_crash_is_a_failed_attempt_not_a_dead_process():
    from optimize.transforms.tflite.isolate import QuantizerCrashed, isolated

    with pytest.raises(QuantizerCrashed, match=r"LiteRT Quantizer crashed \(SIGSEGV\)"):
        isolated(_segfault, what="LiteRT Quantizer")
    assert isolated(lambda a, b: a + b, 2, 3, what="x") == 5
    with pytest.raises(TechniqueFailed, match="nope"):
        isolated(_raise, what="x")


def _segfault():
    os.kill(os.getpid(), signal.SIGSEGV)  # in the child: its own pid


def _raise():
    raise TechniqueFailed("nope")


def test_calibration_samples_with_non_finite_outputs_are_dropped(tmp_path):
    """log(x) is NaN for x < 0 in float too: those samples are dropped from calibration (with a note), so
    no NaN range reaches the quantizer."""
    tf = _tf.tf()
    w = _weights((8, 4))
    content = _convert(lambda x: {"y": tf.matmul(tf.math.log(x), w)}, tf.TensorSpec([1, 8], tf.float32))
    (tmp_path / "log.tflite").write_bytes(content)
    x = np.random.default_rng(0).random((80, 8)).astype(np.float32) + 0.1
    x[::4, 0] = -1.0  # a quarter of the samples give NaN in float32
    np.savez(tmp_path / "d.npz", x=x)
    tech = get("quantize")
    ctx = Context(workdir=tmp_path, data=load_data(tmp_path / "d.npz"), source_kind="tflite")
    tech.fn(tmp_path / "log.tflite", tech.params(scheme="int8"), ctx)
    assert any("calibration sample(s) dropped" in n for n in ctx.notes), ctx.notes


def test_a_crashing_quantizer_means_the_other_backend_makes_it(div, tmp_path, monkeypatch):
    """LiteRT Quantizer dying with SIGSEGV (in its forked child) is a failed attempt: the TFLite calibrator
    makes the int8 model, and the candidate says which route and why."""
    from optimize.transforms.tflite import session

    monkeypatch.setattr(session, "_quantize_in_child", lambda *a: _segfault())
    out, ctx = _quantize(div, "loud.tflite", tmp_path)
    assert _runs_on_zeros(out)
    assert ctx.records["backend"] == "calibrator"
    said = " ".join(ctx.notes)
    assert "LiteRT Quantizer" in said and "crashed (SIGSEGV)" in said and "the TFLite calibrator made it" in said

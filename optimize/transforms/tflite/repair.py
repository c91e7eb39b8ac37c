"""The failure rescue: make a quantized model run wherever its float model runs.

A quantized model can fail where its float model does not: an int8 DIV whose divisor rounds to its zero
point on digital silence refuses to invoke (div.cc: `data[i] != zero_point`), an int16 SUB refuses to
load (sub.cc: `input1_shift <= 0`), a float op left after an int8 one takes LOG(0). Measuring on real
samples never sees most of it; the robustness probe (optimize.measure.probe) does, and fails the
candidate. Here the candidate is made to run instead:

1. run it on the inputs its float model runs on (`Check`: the probe's edge inputs, calibration and test
   samples) until one fails, and read which node the runtime names;
2. fix that op: in integer where an exact fix exists (an int8 DIV's non-negative divisor clamped to one
   step, optimize.transforms.tflite.graphfix.clamp_divisors, kept when its output error is no worse than
   keeping the DIV float), else keep the op at 16 bits where it holds weights and a 16-bit kernel runs
   it, else float (an island, with QUANTIZE/DEQUANTIZE around it);
3. where the runtime names no node (NaN outputs, a node inside a delegate or a branch), bisect: the
   shortest prefix of ops kept float that makes the failing input run, then just its last op;
4. quantize again and repeat, bounded in rounds.

A route (`make(overrides)`: LiteRT Quantizer per-op overrides, or the TFLite converter's quantizer with a
node denylist) makes each variant; every island and fix is recorded with why it is there (`Island`).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from optimize.core.errors import ModelError, TechniqueFailed
from optimize.core.results import FloatIsland, Repair
from optimize.measure import probe
from optimize.measure.layer_error import output_error
from optimize.models import runtime
from optimize.models.data import Dataset, count, take
from optimize.models.tflite import read_model
from optimize.transforms.tflite import graphfix, kept_float

MAX_ROUNDS = 12
MAX_SECONDS = 600.0  # a repair that has not made the model run by then gives up (bisecting a big model is slow)
CAL_SAMPLES = 16  # calibration samples every variant must run on (besides the probe's edge inputs)
TEST_SAMPLES = 16  # and test samples (what measuring will feed it first)
ERROR_SAMPLES = 8  # real samples the output error of a fix is judged on
NOT_QUANTIZED = ("QUANTIZE", "DEQUANTIZE")
INT16_WEIGHTS = 1024  # an op whose weights are at least this large tries 16-bit activations before float
#: A variant slower than this per invoke (int16x8 on reference kernels: ~0.15 s on MobileNetV2) runs every edge
#: input but only the first SLOW_SAMPLES calibration and test samples; what the rest would show, measuring
#: shows (a candidate with non-finite outputs there is refused, not kept).
SLOW_SECONDS = 0.05
SLOW_SAMPLES = 4


@dataclass
class Failure:
    """Where a quantized variant fails: the input, what happened, and the node the runtime named."""

    input: str
    kind: str  # "load" | "invoke" | "non-finite"
    node: int | None
    op: str | None
    message: str

    def __str__(self) -> str:
        where = f"{self.op} node {self.node}" if self.op and self.node is not None else ""
        what = {"load": "does not load", "invoke": f"fails on {self.input}", "non-finite": f"NaN/inf on {self.input}"}
        text = f"{what[self.kind]}: {where}" if where else what[self.kind]
        return f"{text} ({self.message})" if self.message else text


@dataclass
class Check:
    """The inputs every variant must run on, where the float model runs and answers finitely."""

    inputs: list[tuple[str, object]]
    reference: list[list[np.ndarray]]  # the float model's outputs on `inputs`
    like: object  # a sample (batch of 1): free input dimensions take its shape
    threads: int = 2
    dropped: list[str] = field(default_factory=list)  # inputs the float model fails on (or answers NaN/inf)

    @classmethod
    def build(cls, float_model: bytes, data: Dataset, threads: int = 2, extra=()) -> Check:
        """The probe's edge inputs, calibration and test samples (and `extra`, (label, sample) pairs) on which
        the float model runs and answers finitely, with its outputs."""
        like = take(data.x_test, slice(0, 1))
        runner = runtime.Runner(runtime.load(float_model, threads=threads, like=like))
        inputs = list(probe.inputs_for(runner, data))
        cal = data.calibration(CAL_SAMPLES)
        inputs += [(f"calibration sample {i}", take(cal, slice(i, i + 1))) for i in range(count(cal))]
        n = min(TEST_SAMPLES, count(data.x_test))
        inputs += [(f"test sample {i}", take(data.x_test, slice(i, i + 1))) for i in range(probe.REAL_SAMPLES, n)]
        inputs += list(extra)
        kept, outs, dropped = [], [], []
        for label, sample in inputs:
            try:
                out = runner.run_fresh(sample)
            except runtime.InvokeError:
                dropped.append(label)
                continue
            if all(np.all(np.isfinite(o)) for o in out):
                kept.append((label, sample))
                outs.append(out)
            else:
                dropped.append(label)
        return cls(kept, outs, like, threads, dropped)

    def real(self) -> list[int]:
        """Indices of the real samples (calibration and test), for judging output error."""
        return [i for i, (label, _) in enumerate(self.inputs) if "sample" in label][:ERROR_SAMPLES]

    def first_failure(self, content: bytes, only: str | None = None) -> Failure | None:
        """The first input `content` fails on (or None); `only`: just that input."""
        digest = hashlib.sha256(content).hexdigest()
        runner = self._runner(content, digest)
        if isinstance(runner, Failure):
            return runner
        inputs = [(label, sample) for label, sample in self.inputs if only is None or label == only]
        for label, sample in inputs[:2]:
            t0 = time.perf_counter()
            bad = probe.outcome(runner, label, sample)
            if bad is not None:
                return Failure(label, bad.kind, bad.node, bad.op, bad.message)
        slow = len(inputs) > 2 and time.perf_counter() - t0 > SLOW_SECONDS  # the second invoke, past allocation
        rest = [inputs[i] for i in (_slow_few(inputs) if slow else range(len(inputs))) if i >= 2]
        if slow and len(rest) > 1:  # two interpreters at once: the runtime releases the GIL while it invokes
            return self._in_two(content, digest, runner, rest)
        for label, sample in rest:
            bad = probe.outcome(runner, label, sample)
            if bad is not None:
                return Failure(label, bad.kind, bad.node, bad.op, bad.message)
        return None

    def _runner(self, content: bytes, digest: str) -> runtime.Runner | Failure:
        """A runner of `content` (its outputs kept by `digest`: measuring reads them again), or why it does not
        load."""
        try:
            loaded = runtime.load(content, threads=self.threads, like=self.like)
        except runtime.LoadError as e:
            f = e.failure
            return Failure("loading", "load", f.node, f.op, f.message)
        except ModelError as e:
            return Failure("loading", "load", None, None, e.problem)
        return runtime.Runner(loaded, digest=digest)

    def _in_two(self, content: bytes, digest: str, runner: runtime.Runner, inputs: list) -> Failure | None:
        """The first failure (in the inputs' order) of a slow variant, its inputs shared between `runner` and a
        second interpreter of the same bytes, each in a thread of its own."""
        from concurrent.futures import ThreadPoolExecutor

        other = runtime.Runner(runtime.load(content, threads=1, like=self.like), digest=digest)
        order = list(range(len(inputs)))
        halves = [order[0::2], order[1::2]]

        def run(r: runtime.Runner, part: list[int]):
            return [(i, probe.outcome(r, *inputs[i])) for i in part]

        with ThreadPoolExecutor(2) as pool:
            outcomes = dict(pair for got in pool.map(run, (runner, other), halves) for pair in got)
        for i in order:
            if (bad := outcomes[i]) is not None:
                return Failure(inputs[i][0], bad.kind, bad.node, bad.op, bad.message)
        return None

    def error(self, content: bytes) -> float:
        """Mean output error vs float (optimize.measure.layer_error.output_error) on the real samples."""
        runner = runtime.Runner(runtime.load(content, threads=self.threads, like=self.like))
        pick = self.real()
        if not pick:
            return 0.0
        outs = [(self.reference[i], runner.run_fresh(self.inputs[i][1])) for i in pick]
        return output_error(outs)


def _slow_few(inputs: list) -> list[int]:
    """Which of a slow variant's inputs it runs: every edge input, the first SLOW_SAMPLES calibration and test
    samples."""
    seen: dict[str, int] = {}
    kept = []
    for i, (label, _) in enumerate(inputs):
        kind = label.rsplit(" ", 1)[0] if label.startswith(("calibration sample", "test sample")) else ""
        seen[kind] = seen.get(kind, 0) + 1
        if not kind or seen[kind] <= SLOW_SAMPLES:
            kept.append(i)
    return kept


Make = Callable[[dict[str, str]], bytes]  # overrides {op output tensor: "float" | "int16"} -> quantized model


@dataclass
class Repairer:
    """One route's repair: `make` quantizes with overrides; `clamps` are DIVs fixed in integer."""

    make: Make
    float_model: bytes
    check: Check
    route: str  # who makes the variants, for the records: "LiteRT Quantizer", "the TFLite calibrator"
    int16: bool = False  # the route can keep an op at 16-bit activations (LiteRT Quantizer, int8)
    overrides: dict[str, str] = field(default_factory=dict)
    clamps: set[str] = field(default_factory=set)
    islands: list[FloatIsland] = field(default_factory=list)
    log: list[str] = field(default_factory=list)
    rounds: int = 0
    seconds: float = 0.0
    passed: str | None = None  # sha256 of the variant that ran on every input of the check

    def build(self, overrides: dict[str, str] | None = None, clamps: set[str] | None = None) -> bytes:
        made = self.make(dict(self.overrides if overrides is None else overrides))
        made, _ = graphfix.clamp_divisors(made, frozenset(self.clamps if clamps is None else clamps))
        return made

    def run(self, content: bytes | None = None, max_rounds: int = MAX_ROUNDS) -> bytes:
        """The variant once every failure is fixed; TechniqueFailed when one cannot be."""
        t0 = time.perf_counter()
        try:
            current = self._kept_float(self.build()) if content is None else content
            for _ in range(max_rounds):
                failure = self.check.first_failure(current)
                if failure is None:
                    self.passed = hashlib.sha256(current).hexdigest()
                    return current
                if self.seconds + time.perf_counter() - t0 > MAX_SECONDS:
                    raise TechniqueFailed(
                        f"{self.route}: still {failure} after {self.rounds} round(s) of repair and {MAX_SECONDS:.0f} s"
                    )
                self.rounds += 1
                self.log.append(str(failure))
                current = self._fix(current, failure)
            failure = self.check.first_failure(current)
            if failure is None:
                self.passed = hashlib.sha256(current).hexdigest()
                return current
            raise TechniqueFailed(f"{self.route}: still {failure} after {max_rounds} rounds of repair")
        finally:
            self.seconds += time.perf_counter() - t0

    def record(self) -> Repair:
        return Repair(
            route=self.route,
            rounds=self.rounds,
            seconds=round(self.seconds, 3),
            failures=self.log,
            islands=self.islands,
        )

    def _kept_float(self, first: bytes) -> bytes:
        """The first variant with the ops integer only loses on kept float (`kept_float.found`), each an island
        with its reason."""
        keep = kept_float.found(first, set(_op_outputs(self.float_model))) if self.check is not None else {}
        keep = {t: w for t, w in keep.items() if t not in self.overrides}
        if not keep:
            return first
        for tensor, (op, why) in keep.items():
            self.overrides[tensor] = "float"
            self.islands.append(FloatIsland(op=op, tensor=tensor, precision="float", reason=why))
        return self.build()

    # -------------------------------------------------------------------------------------- one fix
    def _fix(self, current: bytes, failure: Failure) -> bytes:
        if failure.kind == "load" and OVERFLOW in failure.message:
            fixed = self._fix_overflows(current, failure)
            if fixed is not None:
                return fixed
        tensor, op = _located(current, self.float_model, failure)
        if tensor is None or tensor in self.overrides or tensor in self.clamps:
            return self._bisect(failure)
        why = _why(failure)
        if op == "DIV" and graphfix.clampable(current, tensor):
            fixed = self._try_clamp(tensor, op, why, failure)
            if fixed is not None:
                return fixed
        if self.int16 and _weights(self.float_model, tensor) >= INT16_WEIGHTS:
            trial = self.build({**self.overrides, tensor: "int16"})
            if self.check.first_failure(trial, only=failure.input if failure.kind != "load" else None) is None:
                self.overrides[tensor] = "int16"
                self.islands.append(FloatIsland(op=op, tensor=tensor, precision="int16", reason=why))
                return trial
        self.overrides[tensor] = "float"
        self.islands.append(FloatIsland(op=op, tensor=tensor, precision="float", reason=why))
        return self.build()

    def _fix_overflows(self, current: bytes, failure: Failure) -> bytes | None:
        """Every op whose clamp bound cannot be quantized at its output's scale kept float in one round (the
        runtime names only the first it meets: a model whose ranges collapsed has many), or None when the
        flatbuffer shows none of them."""
        ours = set(_op_outputs(self.float_model))
        found = [(t, op) for t, op in overflowing(current) if t in ours and t not in self.overrides]
        if not found:
            return None
        why = _why(failure)
        for tensor, op in found:
            self.overrides[tensor] = "float"
            self.islands.append(FloatIsland(op=op, tensor=tensor, precision="float", reason=why))
        self.log.append(f"{len(found)} op(s) whose fused activation bound overflows int32 at their output scale")
        return self.build()

    def _try_clamp(self, tensor: str, op: str, why: str, failure: Failure) -> bytes | None:
        """The divisor clamped in integer, kept when it runs and its output error is no worse than keeping
        the DIV float (within a tenth, and 0.001 of the output range)."""
        clamped = self.build(clamps={*self.clamps, tensor})
        if self.check.first_failure(clamped, only=failure.input) is not None:
            return None
        floated = self.build({**self.overrides, tensor: "float"})
        try:
            e_int, e_float = self.check.error(clamped), self.check.error(floated)
        except ModelError:
            return None
        if e_int > e_float * 1.1 + 1e-3:
            self.log.append(f"{op} {tensor}: divisor clamp error {e_int:.4f} vs {e_float:.4f} with it float")
            return None
        self.clamps.add(tensor)
        self.islands.append(
            FloatIsland(
                op=op,
                tensor=tensor,
                precision="int8",
                reason=f"{why}; kept int8: divisor clamped to one step above its zero point "
                f"(output error {e_int:.4f}, {e_float:.4f} with it float)",
            )
        )
        return clamped

    def _bisect(self, failure: Failure) -> bytes:
        """No node to blame (or the one named is already fixed): the shortest prefix of quantized ops kept
        float that makes the failing input run, and then only its last op."""
        order = [t for t in _op_outputs(self.float_model) if t not in self.overrides and t not in self.clamps]
        only = failure.input if failure.kind != "load" else None

        def runs(k: int) -> bool:
            trial = self.build({**self.overrides, **dict.fromkeys(order[:k], "float")})
            return self.check.first_failure(trial, only=only) is None

        if not order or not runs(len(order)):
            raise TechniqueFailed(f"{self.route}: {failure}, and keeping every op float does not fix it")
        lo, hi = 0, len(order)  # runs(lo) is False (the failure), runs(hi) is True
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if runs(mid):
                hi = mid
            else:
                lo = mid
        tensor = order[hi - 1]
        op = _op_of(self.float_model, tensor)
        self.overrides[tensor] = "float"
        self.islands.append(FloatIsland(op=op, tensor=tensor, precision="float", reason=f"{_why(failure)} (bisected)"))
        return self.build()


#: The runtime's words when a fused activation's bound does not fit int32 at the output's scale
#: (kernel_util's Quantize: round(bound / scale) must be an int32).
OVERFLOW = "no_integer_overflow_from_quantization"
#: The bounds a fused activation quantizes when the op is prepared (RELU's 0 always fits).
_BOUNDS = {"RELU6": 6.0, "RELU_N1_TO_1": 1.0}
_INT32 = 2**31 - 1


def overflowing(content: bytes) -> list[tuple[str, str]]:
    """(output tensor, op) of every quantized op whose fused activation bound does not fit int32 at its
    output's scale: each fails to load with `OVERFLOW` (a scale that collapsed to ~0 on dead ranges)."""
    sg = read_model(content).main
    out = []
    for op in sg.ops:
        bound = _BOUNDS.get(op.options.get("fused_activation_function", "")) if op.outputs else None
        t = sg.tensors[op.outputs[0]] if bound and op.outputs[0] >= 0 else None
        q = t.quant if t is not None else None
        if q is None or not q.count:
            continue
        scale = float(q.scales[0])
        if not scale > 0 or not abs(np.float32(bound) / np.float32(scale)) <= _INT32:
            out.append((t.name, op.name))
    return out


def _why(f: Failure) -> str:
    what = {"load": "does not load", "invoke": f"fails on {f.input}", "non-finite": f"NaN/inf on {f.input}"}
    return f"{what[f.kind]} quantized" + (f" ({f.message[:120]})" if f.message else "")


def _op_outputs(float_model: bytes) -> list[str]:
    """Output tensor names of the float model's main-graph ops that compute, in order."""
    sg = read_model(float_model).main
    return [sg.tensors[op.outputs[0]].name for op in sg.ops if op.outputs and op.outputs[0] >= 0]


def _op_of(float_model: bytes, tensor: str) -> str:
    sg = read_model(float_model).main
    return next((op.name for op in sg.ops if op.outputs and sg.tensors[op.outputs[0]].name == tensor), "?")


def _weights(float_model: bytes, tensor: str) -> int:
    """Elements of the largest constant the op writing `tensor` reads."""
    sg = read_model(float_model).main
    for op in sg.ops:
        if op.outputs and op.outputs[0] >= 0 and sg.tensors[op.outputs[0]].name == tensor:
            return max((sg.tensors[i].numel for i in op.inputs if i >= 0 and sg.tensors[i].is_const), default=0)
    return 0


def _located(quantized: bytes, float_model: bytes, f: Failure) -> tuple[str | None, str | None]:
    """(the float model's op output tensor to fix, its op) for the node the runtime named, or (None, None).

    The node number is the op's index in the main subgraph (delegated nodes keep theirs); the op there
    must be the one named. A QUANTIZE or DEQUANTIZE a quantizer inserted is traced to the op it serves."""
    if f.node is None or f.op is None:
        return None, None
    sg = read_model(quantized).main
    if not 0 <= f.node < len(sg.ops) or sg.ops[f.node].name != f.op:
        return None, None
    known = set(_op_outputs(float_model))
    op = sg.ops[f.node]
    seen = [op]
    if op.name in NOT_QUANTIZED:  # the op it converts for: its producer, else its consumer
        src = sg.producer.get(op.inputs[0]) if op.inputs else None
        seen = [sg.ops[src]] if src is not None else []
        seen += [sg.ops[c] for c in sg.consumers.get(op.outputs[0], [])]
    for o in seen:
        name = sg.tensors[o.outputs[0]].name if o.outputs and o.outputs[0] >= 0 else None
        if name in known and o.name not in NOT_QUANTIZED:
            return name, o.name
    return None, None


def islands_of(quantized: bytes, repaired: list[FloatIsland], why_left) -> list[FloatIsland]:
    """Every op of a quantized model's main graph not at the scheme's precision, as islands: those a repair
    made (with its reason) and the ops computing on float tensors the quantizer left (`why_left`: a reason,
    or a function of the op type giving one), each with the float weight bytes it keeps (a control-flow
    op: its branches')."""
    from optimize.measure.verify import computes_on_float

    model = read_model(quantized)
    sg = model.main
    by_tensor = {}
    for op in sg.ops:
        if op.outputs and op.outputs[0] >= 0:
            by_tensor[sg.tensors[op.outputs[0]].name] = op
    out = []
    for i in repaired:
        op = by_tensor.get(i.tensor)
        out.append(i.model_copy(update={"weight_bytes": _float_weights(model, sg, op) if op is not None else 0}))
    named = {i.tensor for i in out}
    for op in sg.ops:
        if op.name in NOT_QUANTIZED or not op.outputs or op.outputs[0] < 0:
            continue
        name = sg.tensors[op.outputs[0]].name
        if name in named or not computes_on_float(sg, op):
            continue
        why = why_left(op.name) if callable(why_left) else why_left
        out.append(
            FloatIsland(
                op=op.name, tensor=name, precision="float", reason=why, weight_bytes=_float_weights(model, sg, op)
            )
        )
        named.add(name)
    return out


def _float_weights(model, sg, op) -> int:
    """Bytes of float32 constants an op reads (a control-flow op: also those inside the subgraphs it runs)."""
    total = sum(
        len(sg.tensors[i].data)
        for i in op.inputs
        if i >= 0 and sg.tensors[i].is_const and sg.tensors[i].dtype == "float32" and sg.tensors[i].data is not None
    )
    if op.name in graphfix.CONTROL_FLOW:
        for sub in _called(op):
            if 0 < sub < len(model.subgraphs):
                g = model.subgraphs[sub]
                total += sum(
                    len(t.data) for t in g.tensors if t.is_const and t.dtype == "float32" and t.data is not None
                )
    return total


def _called(op) -> list[int]:
    """The subgraphs a control-flow op runs (IF: then/else; WHILE: cond/body)."""
    o = op.options
    return [int(v) for k, v in o.items() if k.endswith("subgraph_index") and isinstance(v, int)]

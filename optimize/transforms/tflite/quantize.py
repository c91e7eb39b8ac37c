"""quantize: quantize a float32 .tflite with LiteRT Quantizer (`litert-quantizer`), no TensorFlow needed.

Convert once to float32, then quantize the flatbuffer as often as you like: LiteRT Quantizer rewrites
the .tflite directly, an order of magnitude faster than one converter run per scheme. Schemes map to
the quantizer's recipes:

    float16  -> weight-only float16 (its `float_casting` algorithm; it has no named float16 recipe)
    dynamic  -> dynamic_wi8_afp32  (int8 weights, float activations quantized on the fly)
    int8     -> static_wi8_ai8     (int8 weights and activations, calibrated)
    int16x8  -> static_wi8_ai16    (int8 weights, int16 activations, calibrated)
    int4     -> dynamic_wi4_afp32  (4-bit Dense/MatMul weights, channel-wise or blockwise (dynamic_wi4b{N}_afp32);
                                    convolution weights int8, which XNNPACK runs; float activations)
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import Field, field_validator, model_validator

from optimize.core.errors import DataError, ModelError, OptimizeError, TechniqueFailed
from optimize.core.registry import Context, SchemeParams, Stage, technique
from optimize.core.results import write_atomic
from optimize.core.vocab import CALIBRATED_SCHEMES, IO, PTQ_SCHEMES, Backend, Scheme
from optimize.models import runtime
from optimize.models.data import take
from optimize.models.source import FLAT_KINDS
from optimize.models.spec import integer_io_note
from optimize.models.tflite import not_float
from optimize.transforms.tflite import calibrator, float_tail, graphfix, islands, repair, tables
from optimize.transforms.tflite.isolate import isolated
from optimize.transforms.tflite.quantizer_setup import quiet as _quiet
from optimize.transforms.tflite.quantizer_setup import recipe as _recipe
from optimize.transforms.tflite.session import Session

RECIPES = {
    Scheme.FLOAT16: "weight-only float16 (float_casting)",
    Scheme.DYNAMIC: "dynamic_wi8_afp32",
    Scheme.INT8: "static_wi8_ai8",
    Scheme.INT16X8: "static_wi8_ai16",
    Scheme.INT4: "dynamic_wi4_afp32",
}
# int4 makes the Dense / MatMul / embedding family 4-bit (weights.INT4_OPS), whose 4-bit hybrid kernels XNNPACK
# has; convolutions get 8-bit weights (XNNPACK does not take a 4-bit CONV_2D; the reference kernel would run it).


class QuantizeParams(SchemeParams):
    scheme: Scheme = Field(
        description="float16 weights; dynamic (int8 weights); int8 (calibrated); int16x8 (int16 activations, "
        "calibrated); int4 (4-bit Dense/MatMul weights, float activations)."
    )
    io: IO = Field(
        IO.FLOAT,
        description="Model input/output type. 'float' keeps float I/O (QUANTIZE/DEQUANTIZE at the edges); "
        "int8 or uint8 with scheme int8, int16 with int16x8, for integer-only pipelines.",
    )
    samples: int = Field(200, ge=1, le=10000, description="Calibration samples for int8/int16x8.")
    min_weight_elements: int = Field(
        1024,
        ge=0,
        description="dynamic: weights with fewer elements stay float, as the TFLite converter does "
        "(more faithful, and small ops avoid on-the-fly quantization overhead); 0 quantizes every weight.",
    )
    granularity: Literal["channel", "tensor"] = Field(
        "channel",
        description="Weight scales per output channel (best accuracy) or one per tensor (for older NPUs/delegates).",
    )
    block_size: Literal[0, 32, 64, 128, 256] = Field(
        0,
        description="int4: 0 keeps one scale per output channel; 32, 64, 128 or 256 gives each block of that many "
        "input weights its own scale (blockwise: closer to float, a little bigger and slower).",
    )
    calibration: Literal["minmax", "moving_average", "percentile", "mse", "auto"] = Field(
        "minmax",
        description="Activation ranges: global min/max over all samples (as the converter does); the "
        "quantizer's own default, a moving average of per-sample ranges (clips outliers, depends on order); "
        "the 0.01-99.99th percentiles; the MSE-optimal clipping; or auto: per tensor, whichever of min/max, "
        "percentile and MSE quantizes its values best (optimize.transforms.tflite.ranges).",
    )

    repair: bool = Field(
        True,
        description="int8/int16x8: make the model run wherever its float model runs (all-zero input, the data's "
        "extremes, real samples): an op that fails quantized is fixed in integer where an exact fix exists, else "
        "kept float; false leaves the quantizer's output as it is (the robustness probe then fails it).",
    )
    integer_kernels: bool = Field(
        True,
        description="int8/int16x8: ops LiteRT Quantizer leaves float that the runtime has integer kernels for "
        "(LEAKY_RELU, PRELU, the fused LSTM ops, ...) are quantized by the TFLite calibrator instead; false keeps "
        "them float (integer PRELU can be slower than float on a CPU).",
    )

    @field_validator("scheme")
    @classmethod
    def _quantized(cls, scheme: Scheme) -> Scheme:
        if scheme not in PTQ_SCHEMES:
            raise ValueError(f"quantize makes {', '.join(PTQ_SCHEMES)}; {scheme} is what it starts from")
        return scheme

    @model_validator(mode="after")
    def _blocks_for_int4(self):
        if self.block_size and self.scheme != Scheme.INT4:
            raise ValueError(f"block_size applies to int4 weights, not {self.scheme}")
        return self

    @property
    def recipe_name(self) -> str:
        if self.scheme == Scheme.INT4 and self.block_size:
            return f"dynamic_wi4b{self.block_size}_afp32"
        return RECIPES[self.scheme]


@technique("quantize", stage=Stage.TFLITE, params=QuantizeParams)
def quantize(model: Path, params: QuantizeParams, ctx: Context) -> Path:
    """Quantize a float32 .tflite with LiteRT Quantizer (litert-quantizer): float16, dynamic, int8, int16x8 or
    int4 (4-bit Dense/MatMul weights, channel-wise or in blocks of `block_size`).

    Works on the converted flatbuffer, so any float .tflite qualifies, whatever framework made it.
    int8 and int16x8 are calibrated on the context's data, fed to the model's signature by input name, and
    made to run wherever the float model runs (optimize.transforms.tflite.repair): an op that fails
    quantized is fixed in integer where an exact fix exists, else kept float. Where LiteRT Quantizer fails,
    crashes, leaves the model unable to run, or leaves ops float that the runtime has integer kernels for,
    the TFLite calibrator (the converter's own quantizer) makes it; the candidate says which and why.
    Inputs and outputs stay float unless `io` asks for an integer type. Already-quantized models are
    refused: quantize the float32 model instead.
    """
    model = Path(model)
    content = _read_model(model)
    signature, inputs = _inspect(content, model)
    if params.scheme in CALIBRATED_SCHEMES:
        data = _calibrated_scheme(content, params, ctx, signature, inputs, model)
    else:
        data = _weights_only(content, params, ctx)
    blocks = f"-b{params.block_size}" if params.block_size else ""
    out = ctx.workdir / f"quantize-{params.scheme}{blocks}{'' if params.io == 'float' else '-' + params.io}.tflite"
    write_atomic(out, data)
    return out


def _weights_only(content: bytes, params: QuantizeParams, ctx: Context) -> bytes:
    """float16, dynamic and int4: LiteRT Quantizer's weight recipes; weights it does not reach (constants
    passed into IF/WHILE, and those inside their branches) stored at the scheme's width behind DEQUANTIZE."""
    data = _run_quantizer(content, params, ctx, None, None)
    flow = calibrator.control_flow(content)
    kind = "float16" if params.scheme == Scheme.FLOAT16 else "int8"
    floor = max(params.min_weight_elements if params.scheme == Scheme.DYNAMIC else 1024, 1)
    if flow:
        data, n = graphfix.weights_behind_dequantize(data, kind, floor)
        if n:
            ctx.notes.append(
                f"quantize: {n} weight tensor(s) LiteRT Quantizer does not reach (read by {', '.join(flow)} or "
                f"inside its branches) stored as {kind} behind DEQUANTIZE, which the runtime expands once at load."
            )
    readers = _float_weight_readers(data, floor)
    data, n = graphfix.weights_behind_dequantize(data, kind, floor, left_float=True)
    if n:
        ctx.notes.append(
            f"quantize: {n} weight tensor(s) of {floor:,}+ elements LiteRT Quantizer leaves float32 (read by "
            f"{', '.join(readers)}) stored as {kind} behind DEQUANTIZE, which the runtime expands once at load."
        )
    _check_loads(data, params, ctx, source=content)
    ctx.notes.append(f"quantize: LiteRT Quantizer recipe {params.recipe_name}, {_granularity(params)} weights.")
    return data


def _float_weight_readers(content: bytes, floor: int) -> list[str]:
    """The op types reading float32 constants of `floor`+ elements in the main graph (DEQUANTIZE aside)."""
    from optimize.models.tflite import read_model

    sg = read_model(content).main
    return sorted(
        {
            op.name
            for op in sg.ops
            if op.name != "DEQUANTIZE"
            and any(
                i >= 0 and sg.tensors[i].is_const and sg.tensors[i].dtype == "float32" and sg.tensors[i].numel >= floor
                for i in op.inputs
            )
        }
    )


@dataclass
class _Made:
    """One route's result: the model, who made it, its repair and what to say about it."""

    data: bytes
    backend: Backend
    fixer: repair.Repairer | None
    notes: list[str] = field(default_factory=list)

    @property
    def float_ops(self) -> int:
        from optimize.measure.verify import counts
        from optimize.models.tflite import read_model

        return counts(read_model(self.data))[1]


def _calibrated_scheme(content: bytes, params: QuantizeParams, ctx: Context, signature, inputs, model: Path) -> bytes:
    """int8 and int16x8: LiteRT Quantizer first, repaired until the model runs; the TFLite calibrator where
    LiteRT Quantizer fails, or leaves ops float (kept when the runtime's integer kernels take more of them),
    or, with integer I/O from a .tflite, leaves any float op at all."""
    calibration = _calibration_data(params, ctx, signature, inputs, model)
    work = _prepared(content, params, ctx, inputs)
    flow = calibrator.control_flow(content)
    if flow and params.io != IO.FLOAT:
        raise TechniqueFailed(
            f"{params.scheme} with {params.io} I/O cannot be integer-only: the model has {calibrator.describe_flow(flow)}, "
            "which no quantizer enters, so it stays float (float I/O quantizes the graph around it)."
        )
    like = take(ctx.data.x_test, slice(0, 1))
    check = repair.Check.build(content, ctx.data, max(1, ctx.threads)) if runtime.loads(content, like) else None
    if check is None:
        ctx.notes.append("quantize: not run here, as the float model is not (custom ops this runtime lacks).")
    tried: list[str] = []
    first = _attempt(lambda: _litert_route(work, params, ctx, calibration, check, flow), "LiteRT Quantizer", tried)
    chosen, why = first, None
    if first is None:
        why = "LiteRT Quantizer failed"
    else:
        left = _kernels_left(first, flow)
        integer_only = params.io != IO.FLOAT and ctx.source_kind in (None, *FLAT_KINDS)
        if integer_only and _float_compute(first.data):
            why = "integer-only"
        elif left and params.integer_kernels and not flow:  # the calibrator does not go through control flow
            why = "kernels"
    if why is not None:
        allow_float = why != "integer-only"
        second = _attempt(
            lambda: _calibrator_route(work, params, ctx, calibration, check, flow, allow_float),
            "the TFLite calibrator",
            tried,
        )
        chosen = _choose(first, second, why, params, tried, check, flow)
    if chosen is None:
        raise TechniqueFailed(f"{params.scheme}: " + "; ".join(tried))
    _float_tail(chosen, params)
    _record(chosen, params, ctx, calibration, flow)
    note = integer_io_note(chosen.data, params.io, "quantize")
    if note:
        ctx.notes.append(note)
    return chosen.data


def _float_tail(made: _Made, params: QuantizeParams) -> None:
    """With integer I/O, a post-processing op's outputs stay float, as shipped SSDs give them (`float_tail`)."""
    if params.io == IO.FLOAT:
        return
    made.data, n = float_tail.float_outputs(made.data)
    if n:
        made.notes.append(
            f"quantize: the integer input feeds an integer body; the {n} outputs of TFLite_Detection_PostProcess "
            "stay float, as shipped SSDs give them (the op runs on the CPU after the body)."
        )


def _attempt(route, who: str, tried: list[str]) -> _Made | None:
    try:
        return route()
    except TechniqueFailed as e:
        text = str(e)
        tried.append(text if text.startswith(who) else f"{who}: {text}")
        return None


def _choose(first: _Made | None, second: _Made | None, why: str, params, tried: list[str], check, flow) -> _Made | None:
    """Which route's model the candidate is, said in a note."""
    if first is None:
        if second is not None:
            why_not = tried[0] if tried else "LiteRT Quantizer failed"
            second.notes.append(f"quantize: {why_not}: the TFLite calibrator made it instead.")
        return second
    if why == "integer-only":
        if second is None:
            raise TechniqueFailed(
                _not_integer_only(first, params, tried[-1] if tried else "the TFLite calibrator failed")
            )
        left = ", ".join(_float_compute(first.data))
        second.notes.append(
            f"quantize: LiteRT Quantizer leaves {left} float in an integer-only model: the TFLite calibrator made "
            f"it, with no float fallback.{_timing(first, second, check)}"
        )
        return second
    left = _kernels_left(first, flow)
    if second is None or second.float_ops >= first.float_ops:
        first.notes.append(
            f"quantize: LiteRT Quantizer leaves {', '.join(left)} float; "
            + (
                "the TFLite calibrator leaves as many float (no integer kernels for them)"
                if second is not None
                else f"the TFLite calibrator, tried for them, failed ({tried[-1] if tried else 'no reason given'})"
            )
            + "."
        )
        return first
    second.notes.append(
        f"quantize: LiteRT Quantizer leaves {', '.join(left)} float; the runtime has integer kernels for them: "
        f"the TFLite calibrator made it ({second.float_ops} ops on float tensors instead of {first.float_ops})."
        f"{_timing(first, second, check)}"
    )
    return second


def _not_integer_only(first: _Made, params: QuantizeParams, calibrator_said: str) -> str:
    """Why integer I/O cannot be integer-only, naming the op that blocks it: one LiteRT Quantizer has no integer
    version of (RELU_0_TO_1 on a HardSigmoid model), not its neighbours, which are float only beside it."""
    left = _float_compute(first.data)
    blockers = [op for op in left if op not in litert_ops()]
    head = f"{params.scheme} with {params.io} I/O cannot be integer-only here: "
    if blockers:
        what = ", ".join(blockers)
        head += f"{what} {'has' if len(blockers) == 1 else 'have'} no integer version in LiteRT Quantizer"
        head += f" (it leaves {', '.join(left)} float)" if set(left) != set(blockers) else ""
    else:
        head += f"LiteRT Quantizer leaves {', '.join(left)} float"
    return f"{head}; {calibrator_said}"


def _timing(first: _Made, second: _Made, check) -> str:
    """` Quick p50 here: ...`: the latency consequence of integer kernels, measured, never hidden."""
    p_float, p_int = _quick_p50(first.data, check), _quick_p50(second.data, check)
    if not (p_float and p_int):
        return ""
    slower = p_int > 1.3 * p_float and p_int - p_float > 0.05
    return (
        f" Quick p50 here: {p_int:.3g} ms with them integer, {p_float:.3g} ms with them float"
        + (" (the integer kernels are slower on this CPU: integer_kernels = false keeps them float)" if slower else "")
        + "."
    )


def _quick_p50(data: bytes, check) -> float | None:
    """A quick p50 (ms) of one model here: enough to say which of two is slower, not to report as latency."""
    if check is None:
        return None
    from optimize.measure import timing

    try:
        runner = runtime.Runner(runtime.load(data, threads=check.threads, like=check.like))
        return timing.time_invoke(runner, check.like, warmup=3, runs=30, budget_s=0.5)["p50_ms"]
    except ModelError:
        return None


def _float_compute(data: bytes) -> list[str]:
    from optimize.measure.verify import float_compute
    from optimize.models.tflite import read_model

    return float_compute(read_model(data))


def _kernels_left(made: _Made, flow: list[str]) -> list[str]:
    """Op types LiteRT Quantizer left computing in float (islands a repair made, and control flow, aside):
    the TFLite calibrator is tried on them, and kept where the runtime's integer kernels take more of them."""
    from optimize.measure.verify import computes_on_float
    from optimize.models.tflite import read_model

    mine = {i.tensor for i in (made.fixer.islands if made.fixer else [])}
    sg = read_model(made.data).main
    left = {
        op.name
        for op in sg.ops
        if computes_on_float(sg, op) and op.outputs and sg.tensors[op.outputs[0]].name not in mine
    }
    if flow:
        left -= set(calibrator.CONTROL_FLOW)
    return sorted(left)


def _prepared(content: bytes, params: QuantizeParams, ctx: Context, inputs: dict) -> bytes:
    """The float model as the quantizers see it: inputs with free dimensions given the data's shape as their
    default (calibrators allocate at it: at 1 along a free dimension, a framed signal may not run), NEG as MUL by
    -1 (an integer kernel exists for it), and with integer I/O, outputs that ops also read given their own
    tensors (so each output is quantized)."""
    from optimize.models.data import take

    work = content
    free = {d["name"]: n for n, d in inputs.items() if any(int(v) < 0 for v in d["shape_signature"])}
    if free:
        sample = take(ctx.data.x_cal, slice(0, 1))
        named = sample if isinstance(sample, dict) else {next(iter(inputs)): sample}
        shapes = {t: tuple(int(v) for v in np.shape(named[n])) for t, n in free.items() if n in named}
        work, pinned = graphfix.pin_inputs(work, shapes)
        if pinned:
            ctx.notes.append(
                f"quantize: input {', '.join(free[t] for t in pinned)} has free dimensions: calibrated at the data's "
                f"shape {list(shapes[pinned[0]])} (the signature stays free)."
            )
    work = _integer_forms(_finite_masks(work, params, ctx), ctx)
    if params.io != IO.FLOAT and graphfix.shared_outputs(work):
        work, n = graphfix.split_outputs(work)
        if n:
            ctx.notes.append(
                f"quantize: {n} output(s) that the graph also reads inside given their own tensor (an identity "
                "RESHAPE), so integer I/O quantizes them."
            )
    return work


def _integer_forms(work: bytes, ctx: Context) -> bytes:
    """Ops the int8 quantizers leave float rewritten to the same results by ops they quantize: EMBEDDING_LOOKUP
    as GATHER (the table int8), NEG as MUL by -1."""
    work, lookups = tables.lookups_as_gather(work)
    if lookups:
        ctx.notes.append(
            f"quantize: {lookups} EMBEDDING_LOOKUP op(s) computed as GATHER (the same rows), which the static "
            "recipes quantize: the embedding table int8."
        )
    work, negs = graphfix.negations_as_mul(work)
    if negs:
        ctx.notes.append(
            f"quantize: {negs} NEG op(s) computed as MUL by -1 (the same float results), which the int8 quantizers "
            "make integer (NEG they leave float)."
        )
    return work


#: Calibration samples the mask fills' score range is read on, and held-out test samples it is checked on.
MASK_SAMPLES, MASK_HELD_OUT = 64, 16


def _finite_masks(content: bytes, params: QuantizeParams, ctx: Context) -> bytes:
    """Attention mask fills (-inf, -1e9, ...) made finite and just low enough, checked to change nothing in the
    float model (optimize.transforms.tflite.masks), so calibration gives the masked scores a usable range."""
    from optimize.models.data import count
    from optimize.transforms.tflite import masks

    if masks.find(content) is None:
        return content
    data = ctx.data
    cal = data.calibration(min(params.samples, MASK_SAMPLES))
    held = data.x_test
    samples = [take(cal, slice(i, i + 1)) for i in range(count(cal))]
    held_out = [take(held, slice(i, i + 1)) for i in range(min(MASK_HELD_OUT, count(held)))]
    made = masks.make_finite(content, samples, held_out, max(1, ctx.threads))
    if made.note:
        ctx.notes.append(f"quantize: {made.note}")
    return made.content


def _flow_overrides(content: bytes) -> dict[str, str]:
    """Control flow kept float: each IF/WHILE op, and every op of the subgraphs they run."""
    from optimize.models.tflite import read_model

    m = read_model(content)
    names = {}
    for si, sg in enumerate(m.subgraphs):
        for op in sg.ops:
            if (si > 0 or op.name in calibrator.CONTROL_FLOW) and op.outputs and op.outputs[0] >= 0:
                names[sg.tensors[op.outputs[0]].name] = "float"
    return names


def repaired_session(
    content: bytes, params: QuantizeParams, ctx: Context, calibration: dict, inputs: dict, extra=()
) -> tuple[Session, bytes, repair.Repairer]:
    """A LiteRT Quantizer session on a float model (inputs with free dimensions calibrated at the data's
    shape) whose every variant runs where the float model runs: control flow kept float, then whatever the
    failure rescue finds, as the session's base. For the per-op search (selective) and `debug`, which need
    LiteRT Quantizer's per-op overrides. `extra`: more (label, sample) inputs every variant must run on.
    Returns the session, its first working variant and the repair."""
    work = _prepared(content, params, ctx, inputs)
    flow = calibrator.control_flow(content)
    session = Session(work, params, ctx, calibration)
    if session.dropped:
        ctx.notes.append(_dropped(session.dropped))
    base = _flow_overrides(work) if flow else {}
    check = repair.Check.build(content, ctx.data, max(1, ctx.threads), extra=extra)
    fixer = repair.Repairer(
        lambda ov: session.quantize({**base, **ov}), work, check, "LiteRT Quantizer", int16=params.scheme == Scheme.INT8
    )
    first = fixer.run()
    return session.with_base({**base, **fixer.overrides}, fixer.clamps), first, fixer


def _litert_route(work: bytes, params: QuantizeParams, ctx: Context, calibration, check, flow) -> _Made:
    session = Session(work, params, ctx, calibration)
    notes = []
    if session.dropped:
        notes.append(_dropped(session.dropped))
    base = _flow_overrides(work) if flow else {}
    if flow:
        notes.append(
            f"quantize: {calibrator.describe_flow(flow)} kept float with the subgraphs it runs ({len(base) - len(flow)} ops): "
            "the graph around it is quantized."
        )
    said: list[str] = []
    fixer = repair.Repairer(
        lambda ov: _completed(session.quantize({**base, **ov}), said),
        work,
        check,
        "LiteRT Quantizer",
        int16=params.scheme == Scheme.INT8,
    )
    data = fixer.run() if check is not None and params.repair else fixer.build()
    notes += [f"quantize: {s}." for s in said]
    if flow:
        data, n = graphfix.weights_behind_dequantize(data, "int8")
        if n:
            notes.append(
                f"quantize: {n} weight tensor(s) of the float control flow stored as int8 behind DEQUANTIZE "
                "(expanded once at load)."
            )
    if check is None or not params.repair:
        _check_loads(data, params, ctx, source=work)
    return _Made(data, Backend.LITERT, fixer, notes)


def _calibrator_route(
    work: bytes, params: QuantizeParams, ctx: Context, calibration, check, flow, allow_float
) -> _Made:
    from optimize.transforms.tflite.session import finite_samples, made_by

    if flow:
        raise TechniqueFailed(f"the TFLite calibrator does not quantize through {calibrator.describe_flow(flow)}")
    notes = []
    kept, dropped = finite_samples(work, calibration, max(1, ctx.threads))
    if dropped and next(iter(kept.values())):
        calibration = kept
        notes.append(_dropped(dropped))
    cal = calibrator.Calibrated(work, params.scheme, calibration)
    per_tensor = params.granularity == "tensor"

    said: list[str] = []

    def make(ov: dict[str, str]) -> bytes:
        deny = [t for t, p in ov.items() if p == "float"]
        made = cal.quantize(params.io, per_tensor, deny)
        return _completed(made_by("the TFLite calibrator", graphfix.fix_signature_if_stale(made, work)), said)

    fixer = repair.Repairer(make, work, check, "the TFLite calibrator")
    data = fixer.run() if check is not None and params.repair else fixer.build()
    notes += [f"quantize: {s}." for s in said]
    if not allow_float:
        left = _float_compute(data)
        if left:
            kept = {i.op for i in fixer.islands if i.precision == "float"}
            why = " (kept float so the model runs)" if set(left) <= kept else ""
            raise TechniqueFailed(f"the TFLite calibrator leaves {', '.join(left[:4])} float{why}")
    if check is None or not params.repair:
        _check_loads(data, params, ctx, source=work)
    return _Made(data, Backend.CALIBRATOR, fixer, notes)


def _completed(data: bytes, said: list[str]) -> bytes:
    """A quantizer's int8 model with its float32 embedding tables made int8 (`tables.complete`) and the float
    islands that have an exact integer form made integer (`islands.complete`); `said` holds what was done to the
    latest one."""
    data, lines = tables.complete(data)
    data, more = islands.complete(data)
    said[:] = lines + more
    return data


def _dropped(n: int) -> str:
    return (
        f"quantize: {n} calibration sample(s) dropped: the float model's outputs on them are not finite (NaN/inf), "
        "and their ranges would be."
    )


def _record(made: _Made, params: QuantizeParams, ctx: Context, calibration, flow) -> None:
    """The chosen route on the candidate: backend, notes, the repair and every island with its reason."""
    if made.backend != Backend.LITERT:
        ctx.records["backend"] = made.backend
    ctx.notes.extend(made.notes)
    fixer = made.fixer
    if fixer is not None and fixer.passed:  # the model the check ran on every probe input: not probed again
        ctx.records["checked"] = {
            "sha256": fixer.passed,
            "float_sha256": hashlib.sha256(fixer.float_model).hexdigest(),  # what it was compared with
            "reference_failures": list(fixer.check.dropped),
        }
    if fixer is not None and fixer.rounds:
        ctx.records["repair"] = fixer.record()
        fixes = "; ".join(f"{i.op} {i.tensor} {_kept(i.precision)}" for i in fixer.islands)
        ctx.notes.append(
            f"quantize: made to run where the float model runs in {fixer.rounds} round(s), {fixer.seconds:.1f} s "
            f"({fixer.route}): {fixes}."
        )
    ctx.records["islands"] = repair.islands_of(made.data, fixer.islands if fixer else [], _why_left(made.backend))
    if made.backend == Backend.LITERT:
        ctx.notes.append(
            f"quantize: LiteRT Quantizer recipe {params.recipe_name}, {_granularity(params)} weights, {params.io} I/O, "
            f"{params.calibration} ranges{_picked(ctx)} from {_count(calibration, params)} samples."
        )
    else:
        ctx.notes.append(
            f"quantize: made by the TFLite calibrator (the TFLite converter's calibration and quantizer), "
            f"{_granularity(params)} weights, {params.io} I/O, from {_count(calibration, params)} samples."
        )


def _kept(precision: str) -> str:
    return {"int8": "kept int8 (divisor clamped)", "int16": "at 16-bit activations"}.get(precision, "kept float")


def _why_left(backend: Backend):
    """Why the quantizer left an op float, by op type: control flow, an op it has no integer version of, or
    (LiteRT Quantizer) an op it supports kept float beside a float neighbour."""
    supported = litert_ops() if backend == Backend.LITERT else frozenset()
    who = "LiteRT Quantizer" if backend == Backend.LITERT else "the TFLite calibrator"

    def why(op: str) -> str:
        if op in calibrator.CONTROL_FLOW:
            return f"{FLOW_REASON} (control flow)"
        if op in supported:
            return f"{who} keeps it float beside a float neighbour (its input or output is a float island's)"
        return f"{who} has no integer version of it"

    return why


def litert_ops() -> frozenset[str]:
    """The op types LiteRT Quantizer quantizes (its own list)."""
    from litert_quantizer import qtyping

    return frozenset(m.name for m in qtyping.TFLOperationName) - {"ALL_SUPPORTED", "INPUT", "OUTPUT", "CUSTOM_OP"}


FLOW_REASON = "LiteRT Quantizer does not quantize inside IF/WHILE branches: the op and its branches stay float"


def _picked(ctx: Context) -> str:
    """` (mse 4, minmax 2 tensors)`: what a chosen-ranges calibration picked per tensor."""
    picked = ctx.records.get("ranges") or {}
    return f" ({', '.join(f'{k} {v}' for k, v in sorted(picked.items()))} tensors)" if picked else ""


def _granularity(params: QuantizeParams) -> str:
    return f"{params.block_size}-blockwise" if params.block_size else f"{params.granularity}-wise"


def _left_float(data: bytes) -> list[str]:
    """Ops with float weights LiteRT Quantizer left behind that only the TFLite calibrator quantizes (the
    fused LSTM ops): a per-op search through LiteRT Quantizer cannot reach them."""
    from optimize.measure.verify import compose

    return sorted(set(compose(data).float_op_types) & calibrator.CALIBRATOR_OPS)


def _count(calibration: dict, params: QuantizeParams) -> str:
    n = sum(len(v) for v in calibration.values())
    return str(n) if n == params.samples else f"{n} (of {params.samples} asked)"


def _read_model(model: Path) -> bytes:
    if not model.is_file():
        raise ModelError(f"No .tflite at {model}.", "Pass the path of a float32 .tflite model.")
    return model.read_bytes()


def _inspect(content: bytes, model: Path) -> tuple[str | None, dict[str, dict]]:
    """The signature to calibrate and its input details; refuse models that are not float
    (tflite.not_float, the same check a run makes up front)."""

    try:
        it = runtime.describe(content)
    except ModelError as e:
        raise ModelError(f"{model.name}: {e.problem}", e.fix) from None
    why = not_float(content)
    if why:
        raise ModelError(
            f"{model.name}: {why}; pass the float32 model.",
            "Quantize the float32 .tflite it was made from (convert without quantization).",
        )
    key = runtime.signature_key(it)
    if key is None:
        return None, {}
    return key, it.get_signature_runner(key).get_input_details()


def _calibration_data(
    params: QuantizeParams, ctx: Context, signature: str | None, inputs: dict[str, dict], model: Path
) -> dict[str, list[dict[str, np.ndarray]]]:
    """Calibration samples keyed the way the quantizer wants them: {signature: [{input_name: batch_of_1}]}."""
    if ctx.data is None:
        raise DataError(f"{params.scheme} needs calibration data.", "Pass --calibration DATA (an .npz with x).")
    if signature is None:
        raise ModelError(
            f"{model.name} has no signature, which LiteRT Quantizer needs to feed calibration data.",
            "Convert from a SavedModel or Keras model (they export a serving_default signature).",
        )
    from optimize.models.data import check_inputs, count
    from optimize.models.source import InputSpec

    specs = [InputSpec(n, tuple(d["shape_signature"]), np.dtype(d["dtype"]).name) for n, d in inputs.items()]
    check_inputs(ctx.data, specs)
    xs = ctx.data.calibration(params.samples)
    named = xs if isinstance(xs, dict) else {specs[0].name: xs}
    typed = {s.name: named[s.name].astype(np.dtype(s.dtype), copy=False) for s in specs}
    return {signature: [{k: v[i : i + 1] for k, v in typed.items()} for i in range(count(xs))]}


def _run_quantizer(content: bytes, params: QuantizeParams, ctx: Context, signature, calibration) -> bytes:
    """Calibrate (if needed) and quantize; a failure inside the quantizer is a failed candidate."""
    from optimize.transforms.tflite.session import _quantize_in_child, made_by

    if calibration is not None:  # calibrated schemes go through a Session (optimize.transforms.tflite.session)
        return Session(content, params, ctx, calibration).quantize()
    try:
        with _quiet():
            recipe = _recipe(params, content).get_quantization_recipe()
        quantized = isolated(_quantize_in_child, content, recipe, None, what="LiteRT Quantizer")
    except OptimizeError:
        raise
    except Exception as e:  # the quantizer raises ValueError, RuntimeError, KeyError, ... on models it cannot handle
        reason = str(e).strip().splitlines()[0] if str(e).strip() else e.__class__.__name__
        raise TechniqueFailed(f"LiteRT Quantizer could not apply {params.recipe_name}: {reason}") from e
    if not quantized:
        raise TechniqueFailed(f"LiteRT Quantizer returned no model for {params.recipe_name}.")
    return made_by("LiteRT Quantizer", graphfix.fix_signature_if_stale(quantized, content))


def _check_loads(data: bytes, params: QuantizeParams, ctx: Context, source: bytes | None = None) -> None:
    """Fail the candidate now if the runtime cannot prepare the result (e.g. int16x8 kernels refusing a layer).

    When the float `source` does not load either (custom ops this runtime lacks, MediaPipe's for one), the
    result cannot be judged here: it is kept, with a note, and measured by size only."""
    from optimize.models.data import take

    like = take(ctx.data.x_test, slice(0, 1)) if ctx.data is not None else None  # free dimensions: the data's
    try:
        runtime.load(data, threads=max(1, ctx.threads), like=like)  # the default resolver: it has the custom kernels
    except ModelError as e:
        if source is not None and not runtime.loads(source, like):
            ctx.notes.append(f"quantize: not run here, as the float model is not: {e.problem}")
            return
        who = "the TFLite calibrator" if ctx.records.get("backend") == Backend.CALIBRATOR else "LiteRT Quantizer"
        raise TechniqueFailed(f"{params.scheme} model from {who} does not load: {e.problem}") from None

"""pt2e: int8 by litert-torch's PT2E quantizer, on the PyTorch graph of a PyTorch or ONNX model.

The other int8 route for these models: LiteRT Quantizer (`quantize`) works on the converted float .tflite;
this one works before conversion: torch.export -> torchao's `prepare_pt2e` with litert-torch's
`PT2EQuantizer` (symmetric int8, per-channel weights) -> the calibration samples run through the observed
graph -> `convert_pt2e` -> `litert_torch.convert(..., quant_config=QuantConfig(pt2e_quantizer=...))`. A sweep
makes both and the recommender picks on the measurements; each candidate records its route (`backend`:
`pt2e` or `litert`).

Defaults, and why: min/max activation observers (litert-torch's default, a histogram observer, took 22-175 s
to calibrate the real models of benchmarks/bench_torch.py, and min/max is what the TFLite calibrator and
LiteRT Quantizer use), on 32 calibration samples. PT2E quantizes the model's edges too: the result takes and
gives int8 tensors (the runtime quantizes float data with the input's scale), and it leaves what it does not
quantize (an LSTM) float, which verification then reports.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import Field

from optimize.core.errors import DataError, TechniqueFailed
from optimize.core.registry import Context, Params, Stage, technique
from optimize.core.results import write_atomic
from optimize.core.vocab import Backend, Scheme
from optimize.models.data import count, take
from optimize.models.spec import integer_io_note


class PT2EParams(Params):
    scheme: Literal[Scheme.INT8] = Field(
        Scheme.INT8, description="What PT2E makes: int8 (int8 weights and activations)."
    )
    observer: Literal["minmax", "histogram"] = Field(
        "minmax",
        description="Activation ranges: min/max (fast, as the TFLite calibrator) or litert-torch's histogram "
        "observer (clips outliers; 22-175 s of calibration on real models).",
    )
    per_channel: bool = Field(True, description="One weight scale per output channel (else one per tensor).")
    samples: int = Field(32, ge=1, le=2000, description="Calibration samples run through the observed graph.")


def _config(params: PT2EParams):
    """litert-torch's symmetric int8 config, with min/max activation observers unless histogram is asked."""
    import dataclasses

    from litert_torch.quantize import pt2e_quantizer

    cfg = pt2e_quantizer.get_symmetric_quantization_config(is_per_channel=params.per_channel)
    if params.observer == "histogram":
        return cfg
    from torchao.quantization.pt2e.observer import MinMaxObserver

    act = dataclasses.replace(cfg.input_activation, observer_or_fake_quant_ctr=MinMaxObserver.with_args(eps=2**-12))
    return dataclasses.replace(cfg, input_activation=act, output_activation=act)


def _samples(ctx: Context, params: PT2EParams) -> list[dict]:
    """Calibration samples as {input key: batch of 1}, as the converted .tflite (and the named module) take them."""
    if ctx.data is None:
        raise DataError("int8 by PT2E needs calibration data.", "Pass --data DATA.npz.")
    xs = ctx.data.calibration(params.samples)  # token ids stay integer: an embedding indexes with them
    inputs = ctx.source.conversion.inputs
    types = {i.key: np.dtype(i.dtype) for i in inputs if i.dtype}
    rows = []
    for k in range(count(xs)):
        one = take(xs, slice(k, k + 1))
        one = one if isinstance(one, dict) else {inputs[0].key: one}
        rows.append({n: v.astype(types[n], copy=False) if n in types else v for n, v in one.items()})
    return rows


@technique("pt2e", stage=Stage.TFLITE, params=PT2EParams)
def pt2e(model: Path, params: PT2EParams, ctx: Context) -> Path:
    """int8 by litert-torch's PT2E quantizer on a PyTorch or ONNX model's torch graph (the other int8 route:
    LiteRT Quantizer on its float .tflite); min/max observers; the note says what its input and output tensors
    hold (int8 where PT2E quantized the edge).

    Made from the source the float .tflite (`model`) was converted from, with the same names and layout.
    """
    src = ctx.source
    if src is None or not getattr(src, "torch", False) or src.conversion is None:
        raise TechniqueFailed("pt2e quantizes a PyTorch or ONNX model's torch graph; this model is not one.")
    from optimize.convert import formats, torch_route

    rows = _samples(ctx, params)
    named = torch_route.named_module(formats.source_of(src), src.conversion)
    t0 = time.perf_counter()
    content, graph_notes = _quantized(named, rows, params, src.path.name)
    content, fixes = _after(content)
    ctx.records["backend"] = Backend.PT2E
    ctx.notes.append(
        f"pt2e: litert-torch PT2E int8, {params.observer} observers, {'channel' if params.per_channel else 'tensor'}-wise "
        f"weights, calibrated on {len(rows)} samples in {time.perf_counter() - t0:.1f} s; {io_words(content)}."
    )
    ctx.notes.extend(graph_notes + [f"pt2e: {line}." for line in fixes])
    kept = integer_io_note(content, "int8", "pt2e")
    if kept:
        ctx.notes.append(kept)
    return write_atomic(ctx.workdir / "pt2e-int8.tflite", content)


def _after(content: bytes) -> tuple[bytes, list[str]]:
    """PT2E's .tflite made what LiteRT runs and an int8 candidate holds: SOFTMAX / LOGISTIC outputs at the scale
    their int8 kernels require (`kernel_params`), and the float32 embedding tables PT2E does not annotate made
    int8 (`tables.complete`)."""
    from optimize.transforms.tflite import kernel_params, tables

    said = []
    content, fixed = kernel_params.fixed_output_scales(content)
    if fixed:
        said.append(
            f"{', '.join(fixed[:3])}{' ...' if len(fixed) > 3 else ''}: output at the scale LiteRT's int8 kernel "
            "requires (1/256, zero point -128), requantized to the scale its readers were calibrated for"
        )
    content, lines = tables.complete(content)
    return content, said + lines


def io_words(content: bytes) -> str:
    """What the artifact's edges hold, read from it: 'int8 input and output tensors', or 'int8 input and
    float32 output tensors' (PT2E leaves an output float after an op it does not quantize)."""
    from optimize.models.tflite import read_model

    sg = read_model(content).main

    def kinds(tensors) -> str:
        return "/".join(sorted({sg.tensors[i].dtype for i in tensors if i >= 0})) or "no"

    ins, outs = kinds(sg.inputs), kinds(sg.outputs)
    return f"{ins} input and output tensors" if ins == outs else f"{ins} input and {outs} output tensors"


def _quantized(named, rows: list[dict], params: PT2EParams, name: str) -> bytes:
    import torch

    from optimize.convert import torch_export
    from optimize.core.errors import ModelError

    with torch_export.quiet():  # importing torchao and litert-torch's quantizer talks (torchao's .so, absl, pytree)
        from litert_torch.quantize import pt2e_quantizer, quant_config
        from torchao.quantization.pt2e import quantize_pt2e

        config = _config(params)

    plan_rows = [{k: torch.from_numpy(v.copy()) for k, v in r.items()} for r in rows]
    try:
        ep = torch_export.export(named, plan_rows[0], name)
        q = pt2e_quantizer.PT2EQuantizer().set_global(config)
        with torch_export.quiet(), torch.no_grad():
            module = ep.module()
            floats = float_scalars(module)
            m = quantize_pt2e.prepare_pt2e(module, q)
            for r in plan_rows:
                m(**r)
            m = quantize_pt2e.convert_pt2e(m, fold_quantize=False)
            kept = integers_kept(m)
        content = torch_export.to_tflite(m, plan_rows[0], name, quant_config=quant_config.QuantConfig(pt2e_quantizer=q))
    except ModelError as e:
        raise TechniqueFailed(f"PT2E: {e.problem}") from None
    except Exception as e:  # noqa: BLE001 - torchao and the converter raise many types; each fails this candidate
        first = next((ln.strip() for ln in str(e).strip().splitlines() if ln.strip()), e.__class__.__name__)
        raise TechniqueFailed(f"PT2E could not quantize the model: {first[:240]}") from None
    return content, _graph_notes(floats, kept)


def _graph_notes(floats: int, kept: list[str]) -> list[str]:
    notes = []
    if floats:
        notes.append(
            f"pt2e: {floats} integer constant(s) of float arithmetic written as floats before annotating (the same "
            "values; PT2E would quantize them as int64 tensors, which its own converter refuses)."
        )
    if kept:
        shown = ", ".join(kept[:4]) + (" ..." if len(kept) > 4 else "")
        notes.append(f"pt2e: {len(kept)} integer tensor(s) kept integer, not quantized (read by {shown}).")
    return notes


#: aten arithmetic whose Python-number operand PT2E turns into a tensor attribute (int64 for an int) and quantizes.
_ARITHMETIC = ("add.Tensor", "sub.Tensor", "mul.Tensor", "div.Tensor", "rsub.Scalar", "add.Scalar", "mul.Scalar")


def float_scalars(module) -> int:
    """Integer Python numbers in float arithmetic (`x * 8` in a detector's head) written as floats: the same
    result (the op's output is float either way), but PT2E makes each such number an int64 tensor attribute and
    annotates it like an activation, and its converter then fails "Expecting input to have dtype torch.float32,
    but got dtype: torch.int64". Returns how many were rewritten."""
    import torch

    done = 0
    for n in module.graph.nodes:
        if n.op != "call_function" or not any(str(n.target).endswith(a) for a in _ARITHMETIC):
            continue
        val = n.meta.get("val")
        if val is None or not getattr(val, "dtype", torch.int64).is_floating_point:
            continue
        ints = [isinstance(a, int) and not isinstance(a, bool) for a in n.args]
        if any(ints):
            n.args = tuple(float(a) if i else a for a, i in zip(n.args, ints))
            done += 1
    if done:
        module.recompile()
    return done


_QUANTIZE = ("quantize_per_tensor", "quantize_per_channel")


def integers_kept(m) -> list[str]:
    """Quantize -> dequantize pairs PT2E put on integer tensors (top-k indices, class ids, counts: its annotators
    propagate through gather and cat) removed, so those tensors stay integer; a pair on an integer tensor that
    cannot be removed is one sentence naming the op that reads it. Returns the ops that read them."""
    import torch

    kept = []
    for q in list(m.graph.nodes):
        if q.op != "call_function" or not any(k in str(q.target) for k in _QUANTIZE):
            continue
        src = q.args[0]
        if _dtype(m, src) in (None, torch.float32, torch.float16, torch.bfloat16, torch.float64):
            continue
        for dq in list(q.users):
            readers = [str(u.target).split(".")[-2] if "." in str(u.target) else str(u.target) for u in dq.users]
            dq.replace_all_uses_with(src)
            m.graph.erase_node(dq)
            kept.extend(readers)
        if q.users:
            raise TechniqueFailed(f"PT2E quantized an integer tensor ({src.name}) that {q.name} cannot be kept off.")
        m.graph.erase_node(q)
    if kept:
        m.graph.lint()
        m.recompile()
    return kept


def _dtype(m, node):
    """The dtype of a graph value: a tensor attribute's own, or the traced value's."""
    import torch

    if getattr(node, "op", None) == "get_attr":
        v = getattr(m, node.target, None)
        return v.dtype if isinstance(v, torch.Tensor) else None
    val = getattr(node, "meta", {}).get("val")
    return getattr(val, "dtype", None)

"""`optimize debug`: open the model and its data, take the plain float32 model a sweep starts from (converted
from Keras or a SavedModel; a .tflite normalised: a signature added, float16 weights folded), calibrate once,
make the quantized model run where the float model runs (the failure rescue keeps the ops that break it
out of the scheme, optimize.transforms.tflite.repair), then rank every op's int8 error
(`optimize.measure.layer_error`)."""

from __future__ import annotations

from optimize.core.results import DebugReport
from optimize.decide.debug_advice import debug_fixes, stage_tried
from optimize.engine import debug_fixes as debug_fixes_mod
from optimize.measure.layer_error import Samples, analyze


def debug_model(
    model,
    data=None,
    *,
    scheme: str = "int8",
    samples: int = 16,
    leave_out: int = 3,
    threads: int = 2,
    calibration=None,
    trust_model_code: bool = False,
    measuring=None,
    layout: str = "source",
    study=None,
    graph=None,
) -> DebugReport:
    """Per-layer error analysis of `model` quantized to `scheme` (int8 or int16x8), on samples the calibration
    never saw (held out of it as the selective search's are), and the fixes measured on them.

    `model` is anything `sweep` takes: a Keras/SavedModel (converted to float32 first), a float .tflite
    (normalised first, as a sweep does), or a PyTorch / ONNX model (converted once to its float .tflite;
    `layout` as in a sweep). Ops the quantized model fails on (to load, to invoke, or with NaN/inf where the
    float model is finite) are kept out of the scheme first and listed (`repaired`). `study`: a study.json
    (or its folder) of a sweep of this model, whose measured fixes are taken rather than suggested again
    (without it, one beside the model or in ./optimize-out is used when it is this model's). `graph`: a TF1 frozen
    graph's input and output nodes, when named.
    """
    import tempfile
    from pathlib import Path

    from optimize.convert.front import open_inputs
    from optimize.core.errors import DataError, NothingWorked, TechniqueFailed
    from optimize.core.recipe import build
    from optimize.core.registry import Context, get
    from optimize.engine.pipeline import Workspace
    from optimize.models.data import take
    from optimize.transforms.tflite.quantize import _calibration_data, _inspect, repaired_session
    from optimize.transforms.tflite.selective import held_out

    src, ds = open_inputs(
        model, data, calibration, measuring, trust=trust_model_code, check=True, layout=layout, graph=graph
    )
    if ds is None:
        raise DataError("debug compares the float and quantized models on real inputs.", "Pass --data DATA.npz.")
    found = debug_fixes_mod.find_study(study, model, src) if model is not None else None
    from optimize.core.paths import temporaries_in

    with tempfile.TemporaryDirectory(prefix="optimize-debug-") as tmp, temporaries_in(Path(tmp) / "tmp"):
        work = Path(tmp)
        ws = Workspace(src, ds, work, threads)
        if src.flat:  # a .tflite, or the float .tflite a PyTorch / ONNX model was converted to
            float_path = ws.source().path  # the normalised float32 model a sweep starts from
        else:
            float_path = ws.produce(build("float32", [{"technique": "convert"}]).steps, "float32").path
        content = float_path.read_bytes()
        params = get("quantize").parse({"scheme": scheme})
        where = held_out(ds, params.samples, samples, seed=0)
        ctx = Context(workdir=work, data=where.calibration, threads=threads)
        signature, inputs = _inspect(content, float_path)
        pool = ds.x_train if where.pool == "train" else ds.x_cal
        try:
            cal = _calibration_data(params, ctx, signature, inputs, float_path)
            picked = _finite(content, Samples.from_array(take(pool, where.pick), samples), threads)
            extra = [(f"debug sample {i}", s) for i, s in enumerate(picked.items)]
            session, _, fixer = repaired_session(content, params, ctx, cal, inputs, extra)
        except TechniqueFailed as e:  # one line, as every command ends: never a traceback
            raise NothingWorked(
                f"debug cannot compare the layers: {str(e).rstrip('.')}.",
                "`optimize sweep MODEL --data D.npz` records what each scheme does on this model.",
            ) from None
        report = analyze(session.content, session.quantize, picked, scheme=scheme, leave_out=leave_out, threads=threads)
        report = report.model_copy(update={"repaired": fixer.islands, "held_out": where.words})
        stage = output_stage(session.content, session.quantize, picked, threads, ds.task)
        if stage is not None:  # an output of several scales: its worst slice is the output's error
            report = report.model_copy(
                update={"output_stage": stage, "output_error": max(report.output_error, stage.worst)}
            )

        def make(update: dict) -> bytes:
            other = get("quantize").parse({"scheme": scheme, **update})
            made, _, _ = repaired_session(content, other, ctx, _calibration_data(other, ctx, signature, inputs,
                                          float_path), inputs, extra)  # fmt: skip
            return made.quantize()

        tried, cause = _tried(report, session, make, picked, content, threads, found, src, ds)
        return report.model_copy(update={"fixes": debug_fixes(report, tried, cause)})


def _tried(report, session, make, picked, content, threads, found, src, ds):
    """Every fix measured here or taken from the study, and the cause when one was found."""
    from optimize.decide.debug_advice import DEBUG_FINE

    if report.output_error < DEBUG_FINE:
        return [], ""
    staged, why = stage_tried(report.output_stage, str(report.scheme))
    if staged is not None and staged.helped:  # the output stage is the cause: its measured fix says it all
        return [staged], why
    fx = debug_fixes_mod
    bench = fx.Bench(picked, fx.reference(content, picked, threads), threads)
    full = session.quantize()
    tried = fx.leave_outs(report)
    more, cause = fx.together_and_front(report, session, full, bench)
    studied = fx.from_study(*found) if found else []
    kinds = {"int16x8" for t in studied if t.what.startswith("16-bit")}
    tried += more + fx.other_schemes(report, make, bench, kinds, str(report.scheme)) + studied
    tried += [staged] if staged is not None else []
    if not any(t.what == "quantization-aware training" for t in studied) and report.scheme == "int8":
        tried.append(fx.qat_offer(src, ds))
    return tried, cause


def _finite(float_model: bytes, picked: Samples, threads: int) -> Samples:
    """The samples on which the float model answers finitely (a log front end gives -inf on silence): the
    errors are measured against it, and a NaN reference measures nothing."""
    import numpy as np

    from optimize.models import runtime

    runner = runtime.Runner(runtime.load(float_model, threads=threads, like=picked.items[0] if picked.items else None))
    kept = []
    for s in picked.items:
        try:
            if all(np.all(np.isfinite(o)) for o in runner.run_fresh(s)):
                kept.append(s)
        except runtime.InvokeError:
            continue
    return Samples(kept or picked.items)


def _outputs(content: bytes, picked, threads: int):
    """The model's outputs on each sample, stacked per output."""
    import numpy as np

    from optimize.models import runtime

    runner = runtime.Runner(runtime.load(content, threads=threads, like=picked.items[0]))
    per = [runner.run_fresh(s) for s in picked.items]
    return [np.stack([p[i] for p in per]) for i in range(len(per[0]))]


def output_stage(float_model: bytes, quantize, picked, threads: int = 2, task=None):
    """Where the float model's outputs carry quantities of different scales (a detector's boxes beside its
    scores, recognised as a sweep does, or channels of another scale): each slice's error fully quantized and
    with the output stage kept float (one more quantization and pass), and a detector's detections kept in
    both; None for outputs of one scale."""
    from optimize.core.results import OutputStage
    from optimize.measure import detection, slices
    from optimize.transforms.tflite.selective import output_stage as stage_of

    if not picked.items:
        return None
    ref = _outputs(float_model, picked, threads)
    layout = detection.head_of(ref, task)
    cuts = layout.slices([r.shape for r in ref]) if layout else {}
    cuts.update({i: c for i, r in enumerate(ref) if i not in cuts and (c := slices.scale_slices(r))})
    full = quantize(None)
    found = stage_of(full)
    if not cuts or found is None:
        return None
    op, index, tensors = found
    kept = _outputs(quantize(dict.fromkeys(tensors, "float")), picked, threads)
    outs = _outputs(full, picked, threads)
    names = [str(i) for i in range(len(ref))]

    def errs(o):
        return [e for i, c in cuts.items() for e in slices.slice_errors(o[i], ref[i], c)]

    return OutputStage(
        op=op,
        op_index=index,
        tensors=tensors,
        slices=errs(outs),
        slices_float=errs(kept),
        detections=detection.compare(outs, ref, names, layout) if layout else None,
        detections_float=detection.compare(kept, ref, names, layout) if layout else None,
    )

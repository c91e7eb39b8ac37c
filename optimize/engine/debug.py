"""`optimize debug`: open the model and its data, take the plain float32 model a sweep starts from (converted
from Keras or a SavedModel; a .tflite normalised: a signature added, float16 weights folded), calibrate once,
make the quantized model run where the float model runs (the failure rescue keeps the ops that break it
out of the scheme, optimize.transforms.tflite.repair), then rank every op's int8 error
(`optimize.measure.layer_error`)."""

from __future__ import annotations

from optimize.core.results import DebugReport
from optimize.decide.explain import debug_fixes
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
) -> DebugReport:
    """Per-layer error analysis of `model` quantized to `scheme` (int8 or int16x8), on calibration samples.

    `model` is anything `sweep` takes: a Keras/SavedModel (converted to float32 first), a float .tflite
    (normalised first, as a sweep does), or a PyTorch / ONNX model (converted once to its float .tflite;
    `layout` as in a sweep). Ops the quantized model fails on (to load, to invoke, or with NaN/inf where the
    float model is finite) are kept out of the scheme first and listed (`repaired`).
    """
    import tempfile
    from pathlib import Path

    from optimize.convert.front import open_inputs
    from optimize.core.errors import DataError, NothingWorked, TechniqueFailed
    from optimize.core.recipe import build
    from optimize.core.registry import Context, get
    from optimize.engine.pipeline import Workspace
    from optimize.transforms.tflite.quantize import _calibration_data, _inspect, repaired_session

    src, ds = open_inputs(model, data, calibration, measuring, trust=trust_model_code, check=True, layout=layout)
    if ds is None:
        raise DataError("debug compares the float and quantized models on real inputs.", "Pass --data DATA.npz.")
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
        ctx = Context(workdir=work, data=ds, threads=threads)
        signature, inputs = _inspect(content, float_path)
        try:
            cal = _calibration_data(params, ctx, signature, inputs, float_path)
            picked = _finite(content, Samples.from_array(ds.x_cal, samples), threads)
            extra = [(f"debug sample {i}", s) for i, s in enumerate(picked.items)]
            session, _, fixer = repaired_session(content, params, ctx, cal, inputs, extra)
        except TechniqueFailed as e:  # one line, as every command ends: never a traceback
            raise NothingWorked(
                f"debug cannot compare the layers: {str(e).rstrip('.')}.",
                "`optimize sweep MODEL --data D.npz` records what each scheme does on this model.",
            ) from None
        report = analyze(session.content, session.quantize, picked, scheme=scheme, leave_out=leave_out, threads=threads)
        return report.model_copy(update={"repaired": fixer.islands, "fixes": debug_fixes(report)})


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

"""`optimize debug`: open the model and its data, convert to float32 where needed, calibrate once, then
rank every op's int8 error (`optimize.measure.layer_error`)."""

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

    `model` is a Keras/SavedModel (converted to float32 first), a float .tflite, or a PyTorch / ONNX model
    (converted once to its float .tflite; `layout` as in a sweep). The model and data are checked against
    each other first (`measuring`: what the labels are).
    """
    import tempfile
    from pathlib import Path

    from optimize.core.errors import DataError, NothingWorked, TechniqueFailed
    from optimize.core.recipe import build
    from optimize.core.registry import Context, get
    from optimize.engine.pipeline import Workspace
    from optimize.models.inputs import open_inputs
    from optimize.transforms.tflite.quantize import _calibration_data, _inspect
    from optimize.transforms.tflite.session import Session

    src, ds = open_inputs(model, data, calibration, measuring, trust=trust_model_code, check=True, layout=layout)
    if ds is None:
        raise DataError("debug compares the float and quantized models on real inputs.", "Pass --data DATA.npz.")
    with tempfile.TemporaryDirectory(prefix="optimize-debug-") as tmp:
        work = Path(tmp)
        if src.torch:  # a PyTorch or ONNX model: the float .tflite it was converted to
            float_path = work / f"{src.name}.tflite"
            float_path.write_bytes(src.content)
        elif src.kind == "tflite":
            float_path = src.path
        else:
            steps = build("float32", [{"technique": "convert"}]).steps
            float_path = Workspace(src, ds, work, threads).produce(steps).path
        content = float_path.read_bytes()
        params = get("quantize").parse({"scheme": scheme})
        ctx = Context(workdir=work, data=ds, threads=threads)
        signature, inputs = _inspect(content, float_path)
        try:
            session = Session(content, params, ctx, _calibration_data(params, ctx, signature, inputs, float_path))
        except TechniqueFailed as e:  # one line, as every command ends: never a traceback
            raise NothingWorked(
                f"debug cannot compare the layers: {str(e).rstrip('.')}.",
                "`optimize sweep MODEL --data D.npz` records what each scheme does on this model.",
            ) from None
        picked = Samples.from_array(ds.x_cal, samples)
        report = analyze(content, session.quantize, picked, scheme=scheme, leave_out=leave_out, threads=threads)
        return report.model_copy(update={"fixes": debug_fixes(report)})

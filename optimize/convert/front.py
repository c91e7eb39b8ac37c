"""The front door of every command: the model opened once (read, validated and, for a .tflite, normalised; a
PyTorch or ONNX model converted to its float .tflite), the data read and made to fit it, and both checked
against each other before any work starts: one clear line when they do not fit."""

from __future__ import annotations

from pathlib import Path

from optimize.convert import fidelity, formats
from optimize.convert.graph_def import GraphIO
from optimize.models.data import Dataset
from optimize.models.inputs import MeasureOptions, checked, read_data
from optimize.models.known import Memo


def open_inputs(
    model,
    data: str | Path | Dataset | None,
    calibration: str | Path | Dataset | None = None,
    measuring: MeasureOptions | None = None,
    trust: bool = False,
    check: bool = False,
    known: Memo | None = None,
    layout: str = "source",
    on_loaded=None,
    threads: int | None = None,
    graph: GraphIO | None = None,
):
    """The model source and dataset; the built-in demo (and its data) when no model is given.

    `calibration` supplies the calibration samples (its x); `data` the rest. Either alone serves both.
    The model is opened first, so a bad model file is named before missing or bad data. `measuring`
    says what the labels are and how calibration samples are drawn. `check`: the model and data are also
    checked against each other (`check_data`), for the commands that are about to work on them. `known`:
    what earlier runs' checks found about this model file (a warm re-run then needs no TensorFlow). A PyTorch
    or ONNX model (`model` may be an nn.Module from Python) is converted here, once, to its float .tflite,
    and the data made to fit it (`route.prepare`; `layout` "channels-last" makes image I/O NHWC); with
    `threads`, the conversion's own error against the source runtime is measured on the data too.
    `on_loaded` receives the Keras model the check loaded (`check_data`). `graph`: a TF1 frozen graph's input
    and output nodes, where its placeholders and unconsumed nodes are not them.
    """
    if model is None or str(model) == "demo":
        from optimize.convert.demo import demo

        model, data_path = demo()
        data = data if data is not None else data_path
    # the one read of the model: recognised and opened by its format's object, then (PyTorch, ONNX) converted
    opened = formats.opened(model, trust, known, graph)
    src, ds = formats.prepared(opened, read_data(data, calibration), layout)
    ds = checked(src, ds, measuring, check, known, on_loaded)  # ids as the model takes them; model and data fit
    if src.converted and threads is not None:
        src = fidelity.measure(src, ds, threads)  # before any write, as everything above
    return src, ds

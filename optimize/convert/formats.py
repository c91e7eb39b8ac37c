"""Which format a model is, and its object: one per format the door takes.

    .onnx                       onnx_file.OnnxFile          converted at the door (torch_route)
    .pt2                        pt2_file.Pt2File            converted at the door (torch_route)
    an nn.Module (Python)       torch_module.TorchModule    exported to a .pt2, then as one
    .pb (a TF1 frozen graph)    graph_def.FrozenGraph       converted at the door by the TF1 converter
    Keras 2 / 3, SavedModel,    models.source.open_model    opened as they are; the `convert` technique makes
    .tflite                                                 their float .tflite (convert.keras)

A file is recognised by its content first (a TFLite flatbuffer's `TFL3`, a zip's members, a pickle's
first bytes), then by its name; any other torch file (a state dict, a checkpoint, TorchScript) is refused in
one line. `source_of(src)` gives a converted ModelSource's object again (in a worker too), for what goes back
to the source: its own runtime (`fidelity`), its torch graph (PT2E).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from optimize.convert import graph_def, route
from optimize.convert.graph_def import FrozenGraph, GraphIO
from optimize.convert.onnx_file import OnnxFile
from optimize.convert.pt2_file import TORCH_FILE_SUFFIXES, Pt2File, refuse_torch_file
from optimize.convert.torch_module import TorchModule, is_module
from optimize.core.vocab import Layout
from optimize.models.data import Dataset
from optimize.models.source import file_fingerprint, is_tflite, open_model
from optimize.models.spec import ModelSource


def recognise(p: Path, head: bytes) -> str | None:
    """ "onnx", "pt2" or "torch-file" for a PyTorch or ONNX file (by content, then by name), "graphdef" for a
    `.pb`, else None."""
    if head.startswith(b"PK"):
        from optimize.convert.torch_files import describe_zip, is_pt2

        if is_pt2(p):
            return "pt2"
        if p.suffix == ".pt2" or p.suffix in TORCH_FILE_SUFFIXES:
            return "torch-file"
        import zipfile

        with contextlib.suppress(zipfile.BadZipFile, OSError):
            with zipfile.ZipFile(p) as z:
                if "TorchScript" in describe_zip(z.namelist()[:1000]):
                    return "torch-file"
        return None
    if p.suffix == ".onnx":
        return "onnx"
    if graph_def.is_graph_def(p):
        return "graphdef"
    if p.suffix == ".pt2" or p.suffix in TORCH_FILE_SUFFIXES:
        return "torch-file"
    if head[:1] == b"\x80" and head[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"):  # a pickle (torch.save's old format)
        return "torch-file"
    return None


def opened(model, trust: bool = False, known=None, graph: GraphIO | None = None):
    """The model recognised and opened by its format's object (a hostile file refused here, before anything
    else reads it): a `route.DoorSource` for a model converted at the door (`torch_route.TorchSource` for PyTorch
    and ONNX, `graph_def.FrozenGraph` for a
    TF1 graph (`graph`: its input and output nodes, when named), else the ModelSource
    `models.source.open_model` makes."""
    from optimize.core.errors import ModelError
    from optimize.core.paths import open_regular, regular_file

    if is_module(model):
        return TorchModule.open(model)
    p = Path(model)
    if not p.is_file():
        return open_model(p, trust, known)
    regular_file(p, "model", ModelError)
    with open_regular(p, "model", ModelError) as f:
        head = f.read(16)
    kind = None if is_tflite(head) else recognise(p, head)
    if kind == "onnx":
        return OnnxFile.open(p, file_fingerprint(p))
    if kind == "pt2":
        return Pt2File.open(p, file_fingerprint(p))
    if kind == "graphdef":
        return FrozenGraph.open(p, file_fingerprint(p), graph)
    if kind == "torch-file":
        raise refuse_torch_file(p)
    return open_model(p, trust, known)


def prepared(opened, ds: Dataset | None, layout: str = Layout.SOURCE) -> tuple[ModelSource, Dataset | None]:
    """(the source as the pipeline takes it, the data as that source takes it): a model converted at the door
    (PyTorch, ONNX, a TF1 graph) converted to its float .tflite (`route.prepare`), any other as it was opened."""
    if isinstance(opened, route.DoorSource):
        return route.prepare(opened, ds, layout)
    return opened, ds


def source_of(src: ModelSource):
    """A converted source's object again, read from its file (in a worker too): what goes back to the source
    (its own runtime: `outputs`; a PyTorch or ONNX model's torch graph)."""
    if src.kind == "graphdef":
        return FrozenGraph.of(src)
    return OnnxFile(src) if src.kind == "onnx" else Pt2File(src)

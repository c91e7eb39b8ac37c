"""An `.onnx` file on the PyTorch route (`torch_route`): its graph read once and checked (`onnx_checks`) before
anything else reads it, normalised for the data's shapes (`onnx_graph`: weights in Constant nodes, free
dimensions fixed, constants folded, If with a constant condition inlined), converted to an nn.Module by
onnx2torch with our export-friendly converters (`onnx_ops`), then torch.export and litert-torch as every
PyTorch model. Its conversion's error is measured against ONNX Runtime on the original file.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from optimize.convert import steps, torch_export, vocabulary
from optimize.convert.conversions import library_folder
from optimize.convert.plan import Declared, Plan
from optimize.convert.torch_route import TorchSource, require
from optimize.core.errors import ModelError
from optimize.core.results import Conversion
from optimize.models.spec import ModelSource

#: The ONNX opsets our converters (onnx2torch's and ours) are written for; a model of another opset is converted
#: into this range by onnx.version_converter first, when it has ops no converter takes at its own opset.
OPSETS = (9, 21)

_ORT_TYPES = {
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(float)": np.float32,
    "tensor(bool)": np.bool_,
}


class OnnxFile(TorchSource):
    """An .onnx file, its graph read and checked once (`open`)."""

    route = "onnx_graph + onnx2torch + "
    say_fixed = False  # the normaliser names each free dimension it fixes

    def __init__(self, src: ModelSource, graph=None):
        super().__init__(src)
        self._graph = graph

    @property
    def graph(self):
        """The checked ONNX graph (read from the file again when this object was made without it)."""
        if self._graph is None:
            self._graph = _read(self.src.path)
        return self._graph

    @classmethod
    def open(cls, p: Path, fingerprint: str) -> OnnxFile:
        """The file's graph parsed from its bytes and checked (`onnx_checks`): a file that does not parse, or
        that a check refuses, is one line now."""
        require("onnx", p.name)
        return cls(ModelSource(p, "onnx", fingerprint), _read(p))

    def declared(self) -> list[Declared]:
        from onnx import helper

        from optimize.convert.onnx_graph import declared_inputs

        out = []
        for vi in declared_inputs(self.graph):
            t = vi.type.tensor_type
            dims = tuple(d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None for d in t.shape.dim)
            out.append(Declared(vi.name, dims, np.dtype(helper.tensor_dtype_to_np_dtype(t.elem_type)).name))
        return out

    def bounds(self) -> list:
        return vocabulary.onnx_bounds(self.graph)

    def inner(self, plan: Plan) -> tuple[object, list[str], list[str], dict]:
        """The normalised ONNX graph as an nn.Module, its output names, what normalising did, and timings."""
        from optimize.convert import onnx_checks, onnx_ops
        from optimize.convert.onnx_graph import NormalizeError, normalize

        t0 = time.perf_counter()
        shapes = {i.name: tuple(i.source_shape) for i in plan.inputs}
        frozen = {k: np.asarray(v) for k, v in plan.frozen.items()}
        try:
            norm = normalize(self.graph, shapes, frozen)
        except NormalizeError as e:
            raise ModelError(f"{self.name}: {e}.", "Pass data whose samples fix every free dimension.") from None
        onnx_checks.check_normalised(norm.model, self.name)
        bad = onnx_ops.unsupported_ops(norm.model)
        if bad:
            norm = _other_opset(self.name, self.graph, shapes, frozen, bad)
        t1 = time.perf_counter()
        try:
            with torch_export.quiet(), steps.step("onnx2torch"):
                module = onnx_ops.convert(norm.model)
        except NotImplementedError as e:  # our ConversionError, or onnx2torch's own
            raise ModelError(
                f"{self.name}: {str(e).splitlines()[0][:300]}.", "Export the model without that op, or as a .pt2."
            ) from None
        outputs = [o.name for o in norm.model.graph.output]
        return module, outputs, list(norm.facts), {"normalize": t1 - t0, "onnx2torch": time.perf_counter() - t1}

    def reference(self, record: Conversion, feeds: list[dict]) -> tuple[str, list[list]]:
        """ONNX Runtime on the file's bytes, checked again as they are now (no external data for it to
        resolve), one sample at a time."""
        from optimize.convert.onnx_checks import read

        ort = import_onnxruntime()
        so = ort.SessionOptions()
        so.log_severity_level = 3
        _, checked = read(self.src.path)
        sess = ort.InferenceSession(checked, so, providers=["CPUExecutionProvider"])
        types = {i.name: i.type for i in sess.get_inputs()}
        names = [o.name for o in sess.get_outputs()]
        out = []
        for sample in feeds:
            typed = {
                k: np.asarray(v, _ORT_TYPES.get(types.get(k), np.float32)) for k, v in sample.items() if k in types
            }
            got = dict(zip(names, sess.run(None, typed)))
            out.append([got[n] for n in record.outputs])
        return f"ONNX Runtime {ort.__version__} on {self.name}", out


def _read(p: Path):
    """The ONNX graph, parsed from the file's bytes and checked (`onnx_checks`) before anything else reads it."""
    from optimize.convert.onnx_checks import read

    return read(p)[0]


def import_onnxruntime():
    """onnxruntime, imported (once) with TMPDIR at a folder of ours: its telemetry writes a `.ses` file into the
    temp folder it sees at import, whatever is asked of it later."""
    import sys

    if "onnxruntime" in sys.modules:
        return sys.modules["onnxruntime"]
    from optimize.core.paths import environment

    folder = library_folder("onnxruntime")
    with environment({"TMPDIR": str(folder)} if folder is not None else {}):
        import onnxruntime

        return onnxruntime


def _opset(model) -> int:
    return max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=1)


def _other_opset(name: str, model, shapes: dict, frozen: dict, bad: list[str]):
    """The model converted (onnx.version_converter) to the nearest opset in OPSETS whose converters take every
    op, normalised; a ModelError naming the ops and the supported range when none does."""
    from onnx import version_converter

    from optimize.convert import onnx_ops
    from optimize.convert.onnx_graph import NormalizeError, normalize

    lo, hi = OPSETS
    have = _opset(model)
    tried = []
    if not lo <= have <= hi:
        near = hi if have > hi else lo
        for target in sorted({near, 13 if have < lo else 17, 17 if have > hi else 11}, key=lambda t: abs(t - have)):
            try:
                converted = version_converter.convert_version(model, target)
                norm = normalize(converted, shapes, frozen)
            except (NormalizeError, Exception) as e:  # noqa: BLE001 - an adapter the converter lacks: the next opset
                tried.append(f"to {target}: {str(e).splitlines()[0][:120] if str(e) else e.__class__.__name__}")
                continue
            left = onnx_ops.unsupported_ops(norm.model)
            if not left:
                norm.facts.insert(0, f"opset {have} converted to opset {target} by onnx.version_converter")
                return norm
            tried.append(f"to {target}: {left[0]}")
    converted = f" (converting opset {have} {'; '.join(tried)})" if tried else ""
    raise ModelError(
        f"{name}: no converter for {len(bad)} ONNX op(s): {'; '.join(bad[:4])}"
        f"{' ...' if len(bad) > 4 else ''}{converted}. optimize converts ONNX opsets {lo} to {hi}.",
        "Export the model at an opset in that range without those ops (a float model, standard ops), or as a "
        "torch.export program (.pt2).",
    )

"""An nn.Module handed over in Python (optionally with sample inputs) on the PyTorch route (`torch_route`):
exported once to a `.pt2` of ours (torch.export, its inputs and outputs named, the data or the samples giving
the shapes), then converted as any `.pt2` (`pt2_file`). The module itself stays in this process as the eager
reference the conversion's error is measured against; the `.pt2` (what the run's workers read) is removed when
the process ends.
"""

from __future__ import annotations

import atexit
import hashlib
import inspect
import shutil
from dataclasses import replace
from pathlib import Path

from optimize.convert import torch_export
from optimize.convert.plan import Declared, sampled
from optimize.convert.pt2_file import EAGER, Pt2File
from optimize.convert.torch_route import TorchSource, require
from optimize.core.errors import DataError
from optimize.core.vocab import Layout
from optimize.models.data import Dataset
from optimize.models.spec import ModelSource


def is_module(model) -> bool:
    """An nn.Module, or (nn.Module, sample inputs): without importing torch unless the caller has."""
    import sys

    torch = sys.modules.get("torch")
    if torch is None:
        return False
    if isinstance(model, tuple) and len(model) == 2:
        model = model[0]
    return isinstance(model, torch.nn.Module)


class TorchModule(TorchSource):
    """An nn.Module and its sample inputs (None: the data gives the shapes), before it is exported."""

    @classmethod
    def open(cls, model) -> TorchModule:
        require("module", "the nn.Module")
        module, sample = model if isinstance(model, tuple) else (model, None)
        if sample is not None and not isinstance(sample, (tuple, list)):
            sample = (sample,)
        name = type(module).__name__
        return cls(
            ModelSource(Path(f"{name}.pt2"), "module", "", module=(module.eval(), tuple(sample) if sample else None))
        )

    def ready(self, ds: Dataset | None) -> Pt2File:
        """The module exported to a .pt2 of ours (torch.export), named after its class, then read back as any
        .pt2 is; the module, named, stays in this process as the eager reference (`pt2_file.EAGER`)."""
        import tempfile

        import torch

        module, sample = self.src.module
        stem = self.src.path.stem
        if ds is None and sample is None:
            raise DataError(
                f"{stem}: an nn.Module needs data or sample inputs to be traced.",
                "Pass data=..., or (module, (sample,)).",
            )
        declared = _declared(module, sample)
        plan = sampled(declared, ds, Layout.SOURCE, stem, sample=sample)
        named, ep = torch_export.traced(module, plan, stem)
        folder = Path(tempfile.mkdtemp(prefix="optimize-module-"))
        atexit.register(shutil.rmtree, folder, True)  # read again by this run's workers: removed when this process ends
        path = folder / self.src.path.name
        torch.export.save(ep, str(path))
        fp = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
        EAGER[fp] = named
        return Pt2File(replace(self.src, path=path, kind="pt2", fingerprint=fp, module=None))


def _declared(module, sample) -> list[Declared]:
    """An nn.Module's inputs: forward's parameter names, and the sample inputs' shapes when given."""
    params = [
        p.name for p in inspect.signature(module.forward).parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
    ]  # fmt: skip
    if sample is not None:
        names = params[: len(sample)] + [f"input_{k}" for k in range(len(params), len(sample))]
        return [Declared(n, tuple(s.shape), str(s.dtype).replace("torch.", "")) for n, s in zip(names, sample)]
    return [Declared(n, None) for n in params]

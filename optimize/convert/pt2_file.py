"""A `.pt2` (a torch.export program) on the PyTorch route (`torch_route`): inspected without running code from
the file (`pt2_checks`) when it is opened, read weights-only (`torch_files`) when it is converted, its program
unflattened into the module tree it was exported from (so the converted tensors are named after its modules),
then torch.export and litert-torch. Its conversion's error is measured against PyTorch running the program
(or, for an nn.Module handed over in Python, the module itself). Any other torch file (a state dict, a
checkpoint, TorchScript) is refused in one line that says what it is and how to export a .pt2.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from optimize.convert import steps, torch_export, vocabulary
from optimize.convert.plan import Declared, Plan
from optimize.convert.torch_route import INSTALL, TorchSource, installed, require
from optimize.core.errors import ModelError
from optimize.core.results import Conversion
from optimize.models.spec import ModelSource

#: torch.save and TorchScript files: refused in one line that says what they are and how to export a .pt2.
TORCH_FILE_SUFFIXES = (".pt", ".pth", ".ptl", ".jit", ".ckpt", ".torchscript")

#: fingerprint of a .pt2 an nn.Module was exported to -> that module, named (this process's eager reference).
EAGER: dict[str, object] = {}


class Pt2File(TorchSource):
    """A .pt2 file, inspected when it is opened (`open`) and read once when it is converted."""

    def __init__(self, src: ModelSource):
        super().__init__(src)
        self._read = None

    @classmethod
    def open(cls, p: Path, fingerprint: str) -> Pt2File:
        """Refused now (a pickle payload, a foreign constant), before anything else reads it."""
        from optimize.convert.torch_files import inspect_pt2

        require("pt2", p.name)
        inspect_pt2(p)
        return cls(ModelSource(p, "pt2", fingerprint))

    @property
    def program(self):
        """(the ExportedProgram, its Pt2Facts), read without running code from the file."""
        if self._read is None:
            from optimize.convert.torch_files import load_pt2

            self._read = load_pt2(self.src.path)
        return self._read

    def declared(self) -> list[Declared]:
        """The program's user inputs and their example shapes (a symbolic dimension is free)."""
        ep, _ = self.program
        nodes = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
        out = []
        for spec in ep.graph_signature.input_specs:
            if spec.kind.name != "USER_INPUT":
                continue
            val = nodes[spec.arg.name].meta.get("val") if spec.arg.name in nodes else None
            dims = tuple(int(s) if isinstance(s, int) else None for s in val.shape) if val is not None else None
            dtype = str(val.dtype).replace("torch.", "") if val is not None else "float32"
            out.append(Declared(spec.arg.name, dims, dtype))
        return out

    def bounds(self) -> list:
        return vocabulary.pt2_bounds(self.program[0])

    def inner(self, plan: Plan) -> tuple[object, list[str], list[str], dict]:
        """The program's module, taking its user inputs positionally; what reading it found."""
        from optimize.convert.onnx_ops import Program

        ep, facts = self.program
        torch_export.refuse_higher_order(ep, self.name)
        steps.begin(self.name, facts.nodes, "a program")
        notes = [f"written by torch {facts.torch_version}"] if facts.torch_version else []
        notes += facts.notes + ([f"{len(facts.pickled)} pickled member(s) read weights-only"] if facts.pickled else [])
        return Program(ep), [], notes, {}

    def reference(self, record: Conversion, feeds: list[dict]) -> tuple[str, list[list]]:
        """PyTorch on the same samples: the nn.Module itself where this process was handed one, else the
        program read from the file again."""
        import torch

        from optimize.convert.onnx_ops import NamedIO, Program, flatten_outputs

        named = EAGER.get(_fingerprint_file(self.src.path))
        what = "the nn.Module in PyTorch (eager)" if named is not None else f"the .pt2 program in PyTorch ({self.name})"
        if named is None:
            named = NamedIO(
                Program(self.program[0]), [(i.key, i.sample_axis == "whole") for i in record.inputs], record.outputs
            )
        out = []
        with torch.no_grad(), torch_export.quiet():
            for sample in feeds:
                got = named(**{i.key: _tensor(sample[i.name], i.sample_axis == "whole") for i in record.inputs})
                values = (
                    [got[n] for n in record.outputs]
                    if isinstance(got, dict) and all(n in got for n in record.outputs)
                    else flatten_outputs(got)
                )
                out.append([v.detach().numpy() for v in values])
        return f"{what}, torch {torch.__version__}", out


def _tensor(value: np.ndarray, whole: bool):
    import torch

    return torch.from_numpy(np.ascontiguousarray(value[None] if whole else value))


def _fingerprint_file(path: Path) -> str:
    import hashlib

    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    except OSError:
        return ""


def refuse_torch_file(p: Path) -> ModelError:
    """The one line for a torch file that is not a .pt2 program (what it is, and how to export a .pt2)."""
    if not installed("torch"):
        return ModelError(
            f"{p.name} is a PyTorch file, not a model optimize reads without torch.",
            f"Export a .pt2 with torch.export.save, and install the torch extra: {INSTALL}.",
        )
    from optimize.convert.torch_files import refuse

    return refuse(p)

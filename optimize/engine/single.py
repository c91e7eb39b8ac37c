"""One recipe on one model, measured: `optimize.run` (and the quantize/prune/cluster/qat/run commands).

The candidate is produced through an executor like any sweep's (`jobs=1`: a crash-isolated worker
process), so a converter or runtime crash fails the candidate instead of the caller.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from optimize.convert.front import open_inputs
from optimize.core import paths
from optimize.core.recipe import Recipe
from optimize.core.results import Candidate
from optimize.core.vocab import Backend
from optimize.engine import outputs
from optimize.engine.executors import executor
from optimize.engine.pipeline import prepare
from optimize.engine.work import Settings, Task
from optimize.measure import metrics as measure
from optimize.models.data import Dataset
from optimize.models.inputs import MeasureOptions
from optimize.present.progress import Progress


def run(
    recipe: Recipe,
    model: str | Path | None = None,
    data: str | Path | Dataset | None = None,
    output: str | Path | None = None,
    threads: int = 2,
    reference: str | Path | None = None,
    measure_it: bool = True,
    delegates: bool = True,
    backend: Backend | str | None = None,
    calibration: str | Path | Dataset | None = None,
    jobs: int = 1,
    progress: Progress | None = None,
    measuring: MeasureOptions | None = None,
    trust_model_code: bool = False,
    layout: str = "source",
    test_samples: int | None = measure.DEFAULT_SAMPLES,
    graph=None,
) -> Candidate:
    """Run one recipe on a model and measure the result. `reference` defaults to a float32 conversion.
    Accuracy and fidelity are measured on the whole test split, or on a stratified sample of `test_samples`.

    An output path ending in `.tflite` names the artifact; otherwise it is the folder, and the artifact
    is `<recipe name>.tflite` inside it. `jobs=1` (the default) produces it in a crash-isolated worker
    process, so a converter or runtime crash fails the candidate instead of the caller; `jobs=0` works
    in this process. `graph`: a TF1 frozen graph's input and output nodes (`convert.graph_def.GraphIO`), when named.
    """
    _refuse_training(recipe, model or recipe.model)  # before a PyTorch or ONNX model is converted for nothing
    _refuse_overwrite(recipe, output)  # before any work: never a file another study describes
    src, ds = open_inputs(
        model or recipe.model, data or recipe.data, calibration, measuring, trust_model_code, layout=layout,
        threads=threads, graph=graph,
    )  # fmt: skip
    recipe = prepare(recipe, src, ds, backend)
    out_dir, file_name = _target(recipe, output)  # a .tflite path names the artifact; the candidate keeps its name
    if file_name:
        paths.inside(out_dir, file_name)  # a plain file name, checked before any work
    _refuse_overwrite(recipe, output)
    created = paths.absent_folders(out_dir)
    paths.output_dir(out_dir)
    work = out_dir / ".work" / "result" if file_name else out_dir
    settings = Settings(threads, test_samples, delegates, timing=measure_it)
    compare = measure_it and ds is not None
    task = Task(
        src,
        ds,
        (recipe,),
        work,
        settings,
        reference=Path(reference) if reference else None,
        own_reference=compare and reference is None,
    )
    try:
        if file_name:
            paths.output_dir(work)
        # every temporary of the run and its worker in .work: removed below however the run ends
        with paths.temporaries_in(out_dir / ".work" / "tmp"), executor(jobs, progress) as ex:
            ex.submit(task)
            cand = next(iter(ex.results()))[1]
        if src.conversion is not None:
            from optimize.present.lines import conversion_line

            cand = cand.model_copy(update={"notes": [conversion_line(src.conversion), *cand.notes]})
        return _placed(cand, work, out_dir, file_name)
    finally:
        shutil.rmtree(out_dir / ".work", ignore_errors=True)
        paths.remove_if_empty(created)  # a folder made for a result that never came (failed, interrupted) goes again


def _refuse_training(recipe: Recipe, model) -> None:
    """Pruning, clustering and QAT asked for a PyTorch or ONNX model: the one line saying why not, at once."""
    from optimize.convert.torch_module import is_module
    from optimize.core.errors import ModelError
    from optimize.models.spec import TRAINING

    keras = recipe.trains
    if not keras or model is None:
        return
    if is_module(model) or Path(str(model)).suffix in (".pt2", ".onnx"):
        name = type(model).__name__ if is_module(model) else Path(str(model)).name
        raise ModelError(
            f"{name}: {TRAINING}.",
            "Use a post-training scheme (optimize quantize), or fine-tune in PyTorch and export again.",
        )


def _target(recipe: Recipe, output) -> tuple[Path, str | None]:
    """(the output folder, the artifact's own file name or None: `<recipe name>.tflite`)."""
    out_dir = Path(output or recipe.output or "optimize-out")
    return (out_dir.parent, out_dir.name) if out_dir.suffix == ".tflite" else (out_dir, None)


def _refuse_overwrite(recipe: Recipe, output) -> None:
    """A file the study in the output folder lists is never written over (issue 43): one line, exit 2, before
    the model is opened (checked again once the recipe is resolved, its name the same)."""
    out_dir, file_name = _target(recipe, output)
    name = file_name or f"{recipe.name}.tflite"
    outputs.refuse_overwrite(out_dir, [name], outputs.single_way_out(out_dir, name))


def _placed(cand: Candidate, work: Path, out_dir: Path, file_name: str | None) -> Candidate:
    """The artifact moved from the work folder to the file name asked for (`-o out/m.tflite`)."""
    if file_name is None or not cand.artifact:
        return cand
    os.replace(work / cand.artifact, paths.inside(out_dir, file_name))
    return cand.model_copy(update={"artifact": file_name})

"""Sweeps: the float32 baseline plus many recipes on one model, written as one study.json.

    plan -> cache lookup -> produce (executor) -> time -> store -> Study

`runs.open_run` plans one model's sweep (a `Run`); `schedule.run_all` drives one or many runs (a zoo)
through one executor (worker processes, this process, or Ray): the float32 baseline first because every
other candidate is compared with it, then timed together in rounds per node, then cached by content. A
sweep where nothing worked exits 1 with the causes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path

from optimize.core.errors import NothingWorked
from optimize.core.recipe import Recipe
from optimize.core.results import Candidate, Study
from optimize.core.vocab import Backend, Target
from optimize.engine.runs import open_run
from optimize.engine.schedule import run_all
from optimize.measure import metrics as measure
from optimize.models.data import Dataset
from optimize.models.inputs import MeasureOptions
from optimize.present.progress import Progress


def sweep(
    model: str | Path | None = None,
    data: str | Path | Dataset | None = None,
    output: str | Path = "optimize-out",
    recipes: list[Recipe] | None = None,
    threads: int = 2,
    backend: Backend | str | None = None,
    delegates: bool = True,
    runs: int = 50,
    on_candidate: Callable[[Candidate], None] | None = None,
    eval_samples: int | None = measure.DEFAULT_SAMPLES,
    jobs: int | None = None,
    cache: bool | str = True,
    target: Target | str | None = None,
    progress: Progress | None = None,
    measuring: MeasureOptions | None = None,
    calibration_samples: int | None = None,
    trust_model_code: bool = False,
    observe: tuple[str, ...] = (),
    executor: str = "local",
    ray_address: str | None = None,
    layout: str = "source",
    replace: bool = False,
    fit: bool = True,
    fit_options: tuple[str, ...] = (),
    graph=None,
) -> Study:
    """The float32 baseline plus every recipe, each measured against it; written to output/study.json.

    Unchanged candidates come from the result cache (`cache=False` forces work; a URL such as
    `s3://bucket/prefix` or `file:///path` puts it there). The rest run in `jobs` worker processes (0: in
    this process) or, with `executor="ray"`, as Ray tasks (`ray_address`; default a local Ray started for
    the run), then are timed together in rotating rounds. `target` adds the target's own shipped recipe.
    `observe=("gpu",)` adds the GPU accelerator's observed report to every candidate where this machine
    has a device it accepts. `refuse_if_nothing_worked(study)` turns a study where nothing worked into exit 1.
    A PyTorch or ONNX model (a .pt2, an .onnx, or an nn.Module) is converted once to a float .tflite;
    `layout="channels-last"` gives its image inputs and outputs NHWC. An `output` holding the study of another
    model is refused before any work (one line, exit 2) unless `replace`: then that study is replaced. `fit`: where rewriting the float graph lets
    a target's delegate take all of it (outputs unchanged), the schemes that target misses are made again from
    the fitted graph (`fit-*`; `fit_options` names rewrites beyond the model's contract: float-mask,
    non-negative-ids). `graph` (`convert.graph_def.GraphIO`) names a TF1 frozen graph's input and output nodes
    where its placeholders and unconsumed nodes are not them.
    """
    from optimize.delegates.observe import check as observable

    observable(observe)  # only what can be observed here: one line, before any work
    from optimize.engine.executors import check, spare

    check(executor, ray_address)  # Ray installed, its address answering: one line, before any work
    warm = spare(executor, jobs, model)  # a worker importing TensorFlow while the model is opened here
    try:
        run = open_run(
            model,
            data,
            output,
            recipes,
            threads,
            backend,
            delegates,
            runs,
            eval_samples,
            cache,
            target,
            measuring,
            calibration_samples,
            trust_model_code,
            observe=observe,
            layout=layout,
            keep_keras=True,
            replace=replace,
            fit=fit,
            fit_options=fit_options,
            graph=graph,
        )
        (study,) = run_all([run], jobs, progress, executor, ray_address, on_candidate, warm)
    finally:
        if warm is not None:
            warm.close()  # if never taken: a warm re-run, bad input, or no worker processes after all
    return study


def refuse_if_nothing_worked(study: Study) -> None:
    """Raise NothingWorked (exit 1) with the causes when no candidate of a study worked."""
    if not study.candidates or any(c.ok for c in study.candidates):
        return
    causes = Counter((c.error or "not measured")[:100] for c in study.candidates)
    summary = "; ".join(f"{n} x {why}" for why, n in causes.most_common(3))
    raise NothingWorked(
        f"All {len(study.candidates)} candidates failed: {summary}.",
        "See study.json for each candidate's error; fix the first cause and run again.",
    )

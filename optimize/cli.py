"""The `optimize` command line: a thin Typer shell. Each command parses options, calls one API function,
and renders the result (a table, or JSON with --json). User errors end in one line and exit code 2."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from optimize.core import streams  # isort: split

streams.reclaim()  # a closed stdout/stderr (`>&-`): /dev/null, before any import below opens a file

import typer  # noqa: E402

from optimize.core.errors import OptimizeError, RecipeError  # noqa: E402
from optimize.core.vocab import IO, Backend, Delegate, FitOption, Layout, Objective, Scheme, Target, Task  # noqa: E402

app = typer.Typer(
    help="Optimize TensorFlow (Keras, SavedModel, .tflite), PyTorch (.pt2) and ONNX models for LiteRT: "
    "quantize, prune, cluster, QAT; measure every variant; check GPU/NNAPI/Hexagon/Core ML/XNNPACK; "
    "recommend one.\n\nStart with: optimize sweep   (the built-in demo)",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
recipes_app = typer.Typer(help="List, show and validate recipes.", no_args_is_help=True, rich_markup_mode=None)
app.add_typer(recipes_app, name="recipes")


def _print_version(asked: bool) -> None:
    if asked:
        from optimize import __version__

        typer.echo(f"optimize {__version__}")
        raise typer.Exit()


@app.callback()
def _top(
    version: bool = typer.Option(
        False, "--version", callback=_print_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """The options before any command (the help text is the app's)."""


THREADS = typer.Option(
    2, "--threads", "-t", min=1, max=256, help="Interpreter threads for latency (recorded with it), 1..256."
)
OUTPUT_TFLITE = typer.Option(None, "--output", "-o", help="Output .tflite file or folder.")
KERAS_MODEL = typer.Argument(..., help="Keras 2 (tf_keras) .keras/.h5 model.")
TRAINING_DATA = typer.Option(
    ..., "--data", "-d", help=".npz with training inputs x (labels y optional: unlabelled outputs learn float32's)."
)
JSON = typer.Option(False, "--json", help="Print the result record as JSON instead of a table.")
VERBOSE = typer.Option(False, "--verbose", "-v", help="Also print where the time went, phase by phase.")
DELEGATES = typer.Option(True, "--delegates/--no-delegates", help="Check each result against the delegates.")
OBSERVE = typer.Option(
    "",
    "--observe",
    help="Also observe these delegates in the runtime where this machine can: gpu (LiteRT's GPU accelerator).",
)
TASK = typer.Option(
    None,
    "--task",
    help="What the labels are (default: guessed from the output and labels), or that the outputs are a detector's "
    "boxes and scores (detections kept against float32's) or a segmentation map (mask IoU).",
)
LABEL_OUTPUT = typer.Option(None, "--label-output", help="The output the labels belong to (default: the first).")
MAX_ERROR_INCREASE = typer.Option(
    None, help="Regression labels: MAE at most this much above float32's, e.g. 0.05 = 5% more."
)
MAX_OUTPUT_ERROR = typer.Option(
    None, help="Any output: worst output's mean |diff| from float32 over its range, e.g. 0.05."
)
MIN_AGREEMENT = typer.Option(
    None, help="Outputs that decide: top-1 (classes) or decisions at 0.5 (sigmoid) agreeing with float32, e.g. 0.98."
)
MIN_DETECTIONS_KEPT = typer.Option(
    None, help="Detectors: share of float32's detections kept (IoU >= 0.5, same class), e.g. 0.95."
)
MIN_MASK_IOU = typer.Option(None, help="Segmentation: mask IoU with float32's, e.g. 0.9.")
MAX_SLOWDOWN = typer.Option(
    None, help="cpu: the pick's p50 at most this many times float32's, e.g. 1.5 (default: not slower, within noise)."
)
MIN_SAMPLE_KEPT = typer.Option(
    None, help="Detectors, segmenters: the worst 5% of samples' detections kept or mask IoU, e.g. 0.5."
)
CAL_SEED = typer.Option(0, "--calibration-seed", help="Seeds the random choice of calibration samples.")
TEST_SAMPLES = typer.Option(
    None,
    "--test-samples",
    min=1,
    help="Measure accuracy and fidelity on this many test samples, a stratified sample (default: all of them).",
)
TRUST = typer.Option(
    False, "--trust-model-code", help="Load Keras files whose layers carry Python code (Lambda): it will run."
)
EXECUTOR = typer.Option(
    "local", "--executor", help="local (worker processes on this machine) or ray (a task per model and recipe group)."
)
RAY_ADDRESS = typer.Option(
    None, "--ray-address", help="Ray cluster to use with --executor ray (default: a local Ray for this run)."
)
CACHE = typer.Option(
    None, "--cache", help="Result cache: a folder or URL (s3://bucket/prefix, file://...; default $OPTIMIZE_CACHE)."
)
MLFLOW = typer.Option(
    None,
    "--mlflow",
    help="Log every candidate to MLflow: a tracking URI, or alone for ./mlruns (a local SQLite store).",
)
#: Options whose value may be left out (`--mlflow` alone), and what they mean then.
OPTIONAL_VALUES = {"--mlflow": "./mlruns"}
NO_CACHE = typer.Option(False, "--no-cache", help="Recompute every candidate (neither read nor write the cache).")
BACKEND_HELP = (
    "Who quantizes: converter (the TFLite converter), litert (LiteRT Quantizer) or auto (per scheme; the "
    "default). The TFLite calibrator is not a choice: it steps in by itself where LiteRT Quantizer leaves "
    "LSTMs float."
)


def _narrowed(allowed: list[str], why: str):
    """An enum option that takes only some of its values: the metavar lists them, a callback refuses the rest."""

    def check(value):
        if value is not None and str(value) not in allowed:
            raise typer.BadParameter(f"{str(value)!r} is not one of {', '.join(allowed)} ({why})")
        return value

    return {"metavar": "[" + "|".join(allowed) + "]", "callback": check}


#: What --backend takes: every backend but the calibrator, which is LiteRT Quantizer's own fallback, and PT2E,
#: which only `quantize` takes (a sweep of a PyTorch or ONNX model makes int8-pt2e by itself).
BACKEND = _narrowed(
    [str(b) for b in Backend if b not in (Backend.CALIBRATOR, Backend.PT2E)], "the calibrator steps in by itself"
)
QUANTIZE_BACKEND = _narrowed(
    [str(b) for b in Backend if b is not Backend.CALIBRATOR], "the calibrator steps in by itself"
)
#: What `optimize debug` compares per layer: the schemes with quantized activations.
DEBUG_SCHEMES = _narrowed([str(Scheme.INT8), str(Scheme.INT16X8)], "the schemes with quantized activations")


def _backend_option(help: str = BACKEND_HELP, allowed=None):
    return typer.Option(None, help=help, **(allowed or BACKEND))


LAYOUT = typer.Option(
    Layout.SOURCE,
    "--layout",
    help="A PyTorch or ONNX model's image inputs and outputs: source (NCHW, as the model takes them) or "
    "channels-last (NHWC, what GPU delegates and cameras feed). Data stays in the source's layout.",
)

GRAPH_INPUTS = typer.Option(
    None, "--graph-inputs", help="A TF1 frozen graph's input nodes, comma-separated (default: its placeholders)."
)
GRAPH_OUTPUTS = typer.Option(
    None,
    "--graph-outputs",
    help="A TF1 frozen graph's output nodes, comma-separated (default: the nodes nothing reads that depend on an input).",
)


def _graph(inputs: str | None, outputs: str | None):
    """The TF1 graph's nodes as named on the command line (None: found in the graph)."""
    from optimize.convert.graph_def import GraphIO

    def names(text: str | None):
        return tuple(n.strip() for n in text.split(",") if n.strip()) if text else None

    return GraphIO(names(inputs), names(outputs)) if inputs or outputs else None


DATA_HELP = (
    ".npz: x/y or x_train/y_train/x_test/y_test; several inputs as x:<input name> (x_train:<name>, ...); "
    "labels per output as y:<output name>."
)


def _measuring(task, label_output, seed):
    from optimize.models.inputs import MeasureOptions

    return MeasureOptions(task=task, label_output=label_output, calibration_seed=seed)


def _progress(as_json: bool):
    """Logging on stderr (warnings only under --json: stdout is the record), a live display on a terminal."""
    from optimize.present.progress import configure

    return configure(quiet=as_json)


def _print_json(record) -> None:
    typer.echo(record.model_dump_json(indent=2) if hasattr(record, "model_dump_json") else json.dumps(record, indent=2))


def _run_and_show(
    recipe,
    model,
    data,
    output,
    threads,
    as_json,
    delegates,
    backend: Backend | None = None,
    calibration=None,
    measuring=None,
    trust_model_code: bool = False,
    verbose: bool = False,
    layout: str = Layout.SOURCE,
    test_samples: int | None = None,
    graph=None,
):
    """Run one recipe, print its candidate (table or JSON), exit 1 if it failed; return the candidate."""
    from optimize.engine import single
    from optimize.present import report_text

    cand = single.run(
        recipe,
        model,
        data,
        output,
        threads=threads,
        delegates=delegates,
        backend=backend,
        calibration=calibration,
        progress=_progress(as_json),
        measuring=measuring,
        trust_model_code=trust_model_code,
        layout=layout,
        test_samples=test_samples,
        graph=graph,
    )
    if as_json:
        _print_json(cand)
    else:
        where = Path(output or recipe.output or "optimize-out")
        report_text.print_candidates([cand], where.parent if where.suffix == ".tflite" else where)
        if verbose:
            _show("\n".join(report_text.phase_lines([cand])))
    if cand.error:
        raise typer.Exit(1)
    return cand


def _cache_option(cache: str | None, no_cache: bool) -> bool | str:
    if cache is not None and no_cache:
        raise OptimizeError("--cache and --no-cache contradict each other.", "Pass one of them.")
    return False if no_cache else (cache or True)


def _executor_option(name: str) -> str:
    from optimize.engine.executors import EXECUTORS

    if name not in EXECUTORS:
        raise OptimizeError(f"Unknown executor {name!r}.", f"Use one of: {', '.join(EXECUTORS)}.")
    return name


def _chain(first: dict, name: str, then: str | None):
    from optimize.core.recipe import build, chain, name_for

    return build(name_for(name, then), chain(first, then))


@app.command()
def sweep(
    model: Path | None = typer.Argument(
        None, help="Keras .keras/.h5, SavedModel dir, float .tflite, .pt2, .onnx or a TF1 .pb. Omit for the demo."
    ),
    data: Path | None = typer.Option(None, "--data", "-d", help=DATA_HELP),
    output: Path = typer.Option(Path("optimize-out"), "--output", "-o", help="Folder for artifacts and study.json."),
    replace: bool = typer.Option(
        False, "--replace", help="Replace the study of another model in --output (refused otherwise)."
    ),
    backend: Backend | None = _backend_option(),
    target: Target | None = typer.Option(None, help="Recommend for this target at the end."),
    max_accuracy_drop: float | None = typer.Option(None, help="Goal for --target: e.g. 0.01 = one point."),
    max_error_increase: float | None = MAX_ERROR_INCREASE,
    max_output_error: float | None = MAX_OUTPUT_ERROR,
    min_agreement: float | None = MIN_AGREEMENT,
    min_detections_kept: float | None = MIN_DETECTIONS_KEPT,
    min_mask_iou: float | None = MIN_MASK_IOU,
    max_slowdown: float | None = MAX_SLOWDOWN,
    min_sample_kept: float | None = MIN_SAMPLE_KEPT,
    jobs: int | None = typer.Option(
        None, "--jobs", "-j", min=0, help="Worker processes (default: cores, memory permitting; 0: in-process)."
    ),
    cache: str | None = CACHE,
    no_cache: bool = NO_CACHE,
    executor: str = EXECUTOR,
    ray_address: str | None = RAY_ADDRESS,
    mlflow: str | None = MLFLOW,
    wide: bool = typer.Option(False, "--wide", help="Print every column, whatever the terminal's width."),
    task: Task | None = TASK,
    label_output: str | None = LABEL_OUTPUT,
    calibration_samples: int | None = typer.Option(
        None, "--calibration-samples", min=1, max=10000, help="Calibration samples per calibrated scheme (200)."
    ),
    calibration_seed: int = CAL_SEED,
    test_samples: int | None = TEST_SAMPLES,
    trust_model_code: bool = TRUST,
    threads: int = THREADS,
    delegates: bool = DELEGATES,
    observe: str = OBSERVE,
    layout: Layout = LAYOUT,
    graph_inputs: str | None = GRAPH_INPUTS,
    graph_outputs: str | None = GRAPH_OUTPUTS,
    fit: bool = typer.Option(
        True, help="Make the schemes a target misses again from the float graph rewritten for it (fit-*)."
    ),
    fit_option: list[FitOption] = typer.Option(
        [], "--fit-option", help="A fit rewrite that changes the model's contract, applied only when named."
    ),
    as_json: bool = JSON,
    verbose: bool = VERBOSE,
) -> None:
    """The float32 baseline and every scheme and chain, measured.

    Writes study.json and every .tflite to the output folder.

    \b
    Example:
      optimize sweep                  (the built-in demo, offline)
      optimize sweep m.keras --data d.npz -o out --target gpu
      optimize sweep m.keras -d d.npz --executor ray --cache s3://bucket/opt
      optimize sweep model.onnx -d d.npz --layout channels-last
      optimize sweep frozen.pb -d d.npz --graph-outputs probs   (a TF1 graph)
    """
    from optimize.decide.choose import make_goals, raise_if_unmet, recommend
    from optimize.engine import sweeps
    from optimize.present import report_text
    from optimize.present.report_text import format_recommendation

    goals = make_goals(  # checked before any work
        max_accuracy_drop,
        max_output_error=max_output_error,
        max_error_increase=max_error_increase,
        min_agreement=min_agreement,
        min_detections_kept=min_detections_kept,
        min_mask_iou=min_mask_iou,
        max_slowdown=max_slowdown,
        min_sample_kept=min_sample_kept,
    )
    if mlflow:
        from optimize.present.tracking import check

        check(mlflow)  # the store usable, before any work: one line otherwise
    study = sweeps.sweep(
        model,
        data,
        output,
        threads=threads,
        backend=backend,
        delegates=delegates,
        jobs=jobs,
        cache=_cache_option(cache, no_cache),
        target=target,
        progress=_progress(as_json),
        executor=_executor_option(executor),
        ray_address=ray_address,
        measuring=_measuring(task, label_output, calibration_seed),
        calibration_samples=calibration_samples,
        trust_model_code=trust_model_code,
        observe=tuple(o for o in observe.split(",") if o.strip()),
        layout=layout,
        replace=replace,
        eval_samples=test_samples,
        fit=fit,
        fit_options=tuple(str(o) for o in fit_option),
        graph=_graph(graph_inputs, graph_outputs),
    )
    if mlflow:
        from optimize.present.tracking import log_safely, log_study

        log_safely(log_study, mlflow, study, Path(output))
    rec = recommend(study, target, goals, folder=output) if target else None
    if as_json:
        _print_json(study)
    else:
        report_text.print_study(study, output, wide=wide)
        if verbose:
            _show("\n".join(report_text.phase_lines(study.candidates, study)))
        if rec is not None:
            _show(format_recommendation(rec))
    sweeps.refuse_if_nothing_worked(study)
    if rec is not None:
        raise_if_unmet(rec)


@app.command()
def zoo(
    manifest: Path = typer.Argument(..., help="TOML manifest: a table per model with path, data, target, recipes."),
    output: Path = typer.Option(Path("zoo-out"), "--output", "-o", help="Folder: one subfolder per model, zoo.json."),
    executor: str = EXECUTOR,
    ray_address: str | None = RAY_ADDRESS,
    cache: str | None = CACHE,
    no_cache: bool = NO_CACHE,
    mlflow: str | None = MLFLOW,
    jobs: int | None = typer.Option(None, "--jobs", "-j", min=0, help="Local worker processes (default: cores)."),
    threads: int = THREADS,
    delegates: bool = DELEGATES,
    as_json: bool = JSON,
) -> None:
    """Sweep every model of a zoo manifest through one executor.

    Writes a study per model, zoo.json and a table of each model's pick.
    Manifest (paths relative to it):

    \b
      [[models]]
      path = "models/detector.keras"
      data = "data/detector.npz"    # optional
      target = "gpu"                # optional; recipes = ["int8", ...] too
      layout = "channels-last"      # optional: a .pt2/.onnx model's image I/O

    \b
    Example:
      optimize zoo zoo.toml -o zoo-out
      optimize zoo zoo.toml --executor ray --cache s3://bucket/opt --mlflow
    """
    from optimize.engine.zoo import run_zoo
    from optimize.present import report_text

    result = run_zoo(
        manifest,
        output,
        executor=_executor_option(executor),
        ray_address=ray_address,
        cache=_cache_option(cache, no_cache),
        jobs=jobs,
        threads=threads,
        delegates=delegates,
        progress=_progress(as_json),
        mlflow=mlflow,
    )
    if as_json:
        _print_json(result)
    else:
        report_text.print_zoo(result, output)


@app.command()
def quantize(
    model: Path = typer.Argument(
        ..., help="Keras .keras/.h5, SavedModel dir, float .tflite, .pt2, .onnx or a TF1 frozen graph .pb."
    ),
    scheme: Scheme = typer.Option(Scheme.INT8, "--scheme", "-s", help="Post-training scheme."),
    calibration: Path | None = typer.Option(None, "--calibration", "-c", help=".npz of calibration samples (x)."),
    data: Path | None = typer.Option(None, "--data", "-d", help=".npz test data for accuracy (default: calibration)."),
    samples: int = typer.Option(200, min=1, help="Calibration samples for int8/int16x8."),
    io: IO = typer.Option(IO.FLOAT, "--io", help="Input/output type: float, int8/uint8 (int8), int16 (int16x8)."),
    float_fallback: bool = typer.Option(False, help="Keep ops that cannot be quantized in float."),
    block_size: int = typer.Option(
        0, "--block-size", help="int4: 0 = one scale per output channel; 32, 64, 128 or 256 = blockwise."
    ),
    backend: Backend | None = _backend_option(
        BACKEND_HELP + " pt2e: int8 of a PyTorch or ONNX model by litert-torch's PT2E quantizer.", QUANTIZE_BACKEND
    ),
    equalize: bool = typer.Option(False, "--equalize", help="Cross-layer equalization first (same float function)."),
    bias_correction: bool = typer.Option(False, "--bias-correction", help="Fold int8 weights' mean shift into biases."),
    adaround: bool = typer.Option(False, "--adaround", help="Learned rounding of the worst layers' int8 weights."),
    ranges: str = typer.Option("minmax", "--ranges", help="int8 activation ranges: minmax, percentile, mse or auto."),
    output: Path | None = OUTPUT_TFLITE,
    task: Task | None = TASK,
    label_output: str | None = LABEL_OUTPUT,
    calibration_seed: int = CAL_SEED,
    test_samples: int | None = TEST_SAMPLES,
    trust_model_code: bool = TRUST,
    layout: Layout = LAYOUT,
    graph_inputs: str | None = GRAPH_INPUTS,
    graph_outputs: str | None = GRAPH_OUTPUTS,
    threads: int = THREADS,
    delegates: bool = DELEGATES,
    as_json: bool = JSON,
    verbose: bool = VERBOSE,
) -> None:
    """Post-training quantization, measured against the float32 model.

    \b
    Example:
      optimize quantize m.keras --scheme int8 --calibration d.npz --io int8
      optimize quantize m.keras --scheme int4 --block-size 32 -o m_int4.tflite
      optimize quantize m.keras -c d.npz --equalize --bias-correction
      optimize quantize model.onnx -c d.npz --backend pt2e
    """
    from optimize.core.recipe import build, with_rescue

    step = {"technique": "convert", "scheme": scheme, "samples": samples, "io": io, "float_fallback": float_fallback}
    if block_size:  # only LiteRT Quantizer's step has blocks (it says so for schemes other than int4)
        step = {"technique": "quantize", "scheme": scheme, "block_size": block_size, "io": io}
    rescue = [
        n for n, on in (("equalize", equalize), ("bias_correction", bias_correction), ("adaround", adaround)) if on
    ]
    name = str(scheme) if io == IO.FLOAT else f"{scheme}-{io}io"  # the sweep's name for it: int8-int8io
    recipe = build(name, with_rescue(step, rescue, ranges))
    if backend == Backend.PT2E:
        recipe, backend = _pt2e_recipe(scheme, io, samples, rescue, ranges), None
    measuring = _measuring(task, label_output, calibration_seed)
    _run_and_show(
        recipe, model, data, output, threads, as_json, delegates, backend, calibration, measuring, trust_model_code,
        verbose=verbose, layout=layout, test_samples=test_samples, graph=_graph(graph_inputs, graph_outputs),
    )  # fmt: skip


def _pt2e_recipe(scheme, io, samples: int, rescue: list[str], ranges: str):
    """int8 by PT2E: the one scheme it makes; the flatbuffer rescue steps belong to LiteRT Quantizer's route."""
    from optimize.core.recipe import build

    if scheme != Scheme.INT8 or io != IO.FLOAT or rescue or ranges != "minmax":
        raise OptimizeError(
            "--backend pt2e makes int8 (with int8 input and output tensors) by PT2E's own observers.",
            "Drop --scheme/--io/--equalize/--bias-correction/--adaround/--ranges, or use --backend litert.",
        )
    return build("int8-pt2e", [{"technique": "pt2e", "samples": samples}])


@app.command()
def prune(
    model: Path = KERAS_MODEL,
    data: Path = TRAINING_DATA,
    sparsity: float = typer.Option(0.5, help="Final fraction of zero weights, in (0, 1)."),
    schedule: str = typer.Option("polynomial", help="constant or polynomial."),
    structured: str | None = typer.Option(None, help="'2:4' for structured sparsity."),
    epochs: int = typer.Option(2, min=1, help="Fine-tuning epochs."),
    then: str | None = typer.Option("float32", help="What follows: e.g. 'int8' or 'cluster,int8' or 'qat,int8'."),
    label_output: str | None = LABEL_OUTPUT,
    test_samples: int | None = TEST_SAMPLES,
    output: Path | None = OUTPUT_TFLITE,
    trust_model_code: bool = TRUST,
    threads: int = THREADS,
    delegates: bool = DELEGATES,
    as_json: bool = JSON,
    verbose: bool = VERBOSE,
) -> None:
    """Magnitude pruning (tfmot), fine-tuned, then converted.

    Pruning shrinks the gzip size, not the raw file.

    \b
    Example:
      optimize prune m.keras --data d.npz --sparsity 0.5 --then cluster,int8
    """
    first = {"technique": "prune", "target_sparsity": sparsity, "schedule": schedule, "structured": structured}
    recipe = _chain({**first, "epochs": epochs}, "prune", then)
    measuring = _measuring(None, label_output, 0)
    _run_and_show(
        recipe, model, data, output, threads, as_json, delegates, measuring=measuring, trust_model_code=trust_model_code,
        verbose=verbose, test_samples=test_samples,
    )  # fmt: skip


@app.command()
def cluster(
    model: Path = KERAS_MODEL,
    data: Path = TRAINING_DATA,
    clusters: int = typer.Option(16, help="Distinct weight values per layer (>= 2)."),
    init: str = typer.Option("kmeans++", help="kmeans++, density, linear or random."),
    preserve_sparsity: bool = typer.Option(False, help="Keep zeros from an earlier pruning at zero."),
    epochs: int = typer.Option(1, min=1, help="Fine-tuning epochs."),
    then: str | None = typer.Option("float32", help="What follows: e.g. 'int8' or 'qat,int8'."),
    label_output: str | None = LABEL_OUTPUT,
    test_samples: int | None = TEST_SAMPLES,
    output: Path | None = OUTPUT_TFLITE,
    trust_model_code: bool = TRUST,
    threads: int = THREADS,
    delegates: bool = DELEGATES,
    as_json: bool = JSON,
    verbose: bool = VERBOSE,
) -> None:
    """Weight clustering (tfmot), fine-tuned, then converted.

    \b
    Example:
      optimize cluster m.keras --data d.npz --clusters 16 --then int8
    """
    first = {"technique": "cluster", "clusters": clusters, "init": init, "preserve_sparsity": preserve_sparsity}
    recipe = _chain({**first, "epochs": epochs}, "cluster", then)
    measuring = _measuring(None, label_output, 0)
    _run_and_show(
        recipe, model, data, output, threads, as_json, delegates, measuring=measuring, trust_model_code=trust_model_code,
        verbose=verbose, test_samples=test_samples,
    )  # fmt: skip


@app.command()
def qat(
    model: Path = KERAS_MODEL,
    data: Path = TRAINING_DATA,
    epochs: int = typer.Option(2, min=1, help="Fine-tuning epochs."),
    preserve: str = typer.Option("none", help="none, sparsity, clusters or clusters+sparsity (after prune/cluster)."),
    then: str = typer.Option("int8", help="The conversion that follows: int8 or dynamic."),
    label_output: str | None = LABEL_OUTPUT,
    test_samples: int | None = TEST_SAMPLES,
    output: Path | None = OUTPUT_TFLITE,
    trust_model_code: bool = TRUST,
    threads: int = THREADS,
    delegates: bool = DELEGATES,
    as_json: bool = JSON,
    verbose: bool = VERBOSE,
) -> None:
    """Quantization-aware training (tfmot), then int8 conversion.

    \b
    Example:
      optimize qat m.keras --data d.npz --epochs 2
    """
    recipe = _chain({"technique": "qat", "epochs": epochs, "preserve": preserve}, "qat", then)
    measuring = _measuring(None, label_output, 0)
    _run_and_show(
        recipe, model, data, output, threads, as_json, delegates, measuring=measuring, trust_model_code=trust_model_code,
        verbose=verbose, test_samples=test_samples,
    )  # fmt: skip


@app.command()
def evaluate(
    model: Path = typer.Argument(..., help="A .tflite file, or a .pt2/.onnx/TF1 .pb (its float .tflite conversion)."),
    data: Path | None = typer.Option(None, "--data", "-d", help=DATA_HELP),
    reference: Path | None = typer.Option(None, "--reference", "-r", help="Float .tflite to compare outputs with."),
    runs: int = typer.Option(50, min=1, max=100000, help="Timed invocations after warm-up."),
    test_samples: int | None = TEST_SAMPLES,
    task: Task | None = TASK,
    label_output: str | None = LABEL_OUTPUT,
    layout: Layout = LAYOUT,
    graph_inputs: str | None = GRAPH_INPUTS,
    graph_outputs: str | None = GRAPH_OUTPUTS,
    threads: int = THREADS,
    as_json: bool = JSON,
) -> None:
    """Measure a .tflite: size, accuracy, fidelity, latency, memory.

    Size raw and gzipped; fidelity against a float reference.

    \b
    Example:
      optimize evaluate m_int8.tflite --data test.npz --reference m.tflite
      optimize evaluate model.onnx -d test.npz   (and the conversion's error)
    """
    import tempfile

    from optimize.convert.front import open_inputs
    from optimize.measure.metrics import evaluate as run_eval
    from optimize.present import report_text

    if reference is not None and data is None:  # fidelity is measured on inputs: none given, none invented
        raise OptimizeError("--reference needs inputs to compare outputs on:", "add --data D.npz.")
    src, ds = open_inputs(
        model, data, measuring=_measuring(task, label_output, 0), layout=layout, threads=threads,
        graph=_graph(graph_inputs, graph_outputs),
    )  # fmt: skip
    from optimize.engine.ship import contract_of

    with tempfile.TemporaryDirectory(prefix="optimize-evaluate-") as tmp:
        flat, converted = _converted(src, Path(tmp))
        metrics = run_eval(flat or model, ds, reference=reference, threads=threads, runs=runs, samples=test_samples)
        contract = contract_of(flat or model, ds)  # how to feed the file, read from it
    if as_json:
        _print_json({**metrics.model_dump(mode="json"), "contract": contract.model_dump(mode="json")})
    else:
        report_text.print_metrics(src.name, metrics)
        report_text.print_contract(contract)
        _show_conversion(converted)


def _compat_model(model: Path, data: Path | None, layout: str, threads: int, folder: Path, graph=None):
    """The .tflite `compat` checks: the file itself, or a PyTorch or ONNX model's float .tflite (converted
    with `data` fixing its shapes), and that conversion's record."""
    from optimize.convert.formats import recognise
    from optimize.models.source import is_tflite

    head = b""
    if model.is_file():
        with open(model, "rb") as f:
            head = f.read(16)
    if (head and is_tflite(head)) or recognise(model, head) is None:
        if data is not None:
            raise OptimizeError(
                "--data is for a PyTorch or ONNX model (it fixes the shapes it converts at).", "Leave it out."
            )
        return model, None
    from optimize.convert.front import open_inputs

    src, ds = open_inputs(model, data, layout=layout, threads=threads, graph=graph)
    flat, converted = _converted(src, folder)
    return flat or model, converted


def _converted(src, folder: Path):
    """(a PyTorch or ONNX model's float .tflite written to `folder`, its conversion record with the conversion's
    own error measured on the data, if given), or (None, None) for any other model."""
    if not src.converted:
        return None, None
    path = folder / f"{src.name}.tflite"
    path.write_bytes(src.content)
    return path, src.conversion


def _show_conversion(converted) -> None:
    if converted is not None:
        from optimize.present.lines import conversion_line

        _show(conversion_line(converted))


@app.command()
def compat(
    model: Path = typer.Argument(..., help="A .tflite file, or a .pt2/.onnx/TF1 .pb (its float .tflite conversion)."),
    data: Path | None = typer.Option(
        None, "--data", "-d", help="A PyTorch or ONNX model's data: fixes its free input dimensions."
    ),
    layout: Layout = LAYOUT,
    graph_inputs: str | None = GRAPH_INPUTS,
    graph_outputs: str | None = GRAPH_OUTPUTS,
    delegate: str = typer.Option(
        ",".join(Delegate), "--delegate", help="Comma-separated delegates: " + ", ".join(Delegate) + "."
    ),
    android_api: int = typer.Option(
        30, min=27, max=40, help="Android API level for NNAPI, 27..40 (35 and above: NNAPI feature level 8)."
    ),
    coreml_version: int = typer.Option(3, min=2, max=3, help="Core ML delegate version (2 or 3; iOS 13+ means 3)."),
    gpu_allow_quant: bool = typer.Option(True, help="GPU delegate's quantized-model flag (default on)."),
    gpu_opencl: bool = typer.Option(True, help="OpenCL available on the device (SPLIT/SPLIT_V need it)."),
    threads: int = THREADS,
    as_json: bool = JSON,
    model_explorer: Path | None = typer.Option(
        None,
        "--model-explorer",
        help="Also write the per-node verdicts as Model Explorer node data (one file per delegate when several).",
    ),
    observe: str = OBSERVE,
) -> None:
    """Which ops each delegate runs and why the rest falls to the CPU.

    Also how many partitions, and what to change.

    \b
    Example:
      optimize compat m_int8.tflite --delegate gpu,hexagon
      optimize compat m_int8.tflite --model-explorer overlay.json
      optimize compat m.tflite --observe gpu   (the GPU accelerator's verdict)
      optimize compat model.onnx --data d.npz --layout channels-last
    """
    import tempfile

    from optimize.delegates import TargetParams, check_delegates, format_report
    from optimize.delegates.observe import UNAVAILABLE, gpu_device

    target = TargetParams(
        android_api=android_api, coreml_version=coreml_version, gpu_allow_quant=gpu_allow_quant, gpu_opencl=gpu_opencl
    )
    watch = [o for o in observe.split(",") if o.strip()]
    from optimize.engine.fitting import compat_lines

    with tempfile.TemporaryDirectory(prefix="optimize-compat-") as tmp:
        flat, converted = _compat_model(model, data, layout, threads, Path(tmp), _graph(graph_inputs, graph_outputs))
        reports = check_delegates(flat, delegate.split(","), target=target, threads=threads, observe=watch)
        fits = compat_lines(Path(flat), reports) if not as_json else []
        if model_explorer is not None:
            from optimize.delegates.overlay import write_overlays

            written = write_overlays(model_explorer, reports, flat)
            typer.echo(f"Model Explorer node data: {', '.join(map(str, written))}", err=True)
    if as_json:
        typer.echo(json.dumps({k: v.model_dump(mode="json") for k, v in reports.items()}, indent=2))
    else:
        _show(format_report(reports) + "".join(f"{line}\n" for line in fits))
        _show_conversion(converted)
    if watch and gpu_device() is None:
        typer.echo(UNAVAILABLE, err=as_json)


@app.command()
def recommend(
    study: Path | None = typer.Argument(
        None, help="A study.json (or its folder) to choose from. Omit for the decision tree alone."
    ),
    target: Target = typer.Option(Target.CPU, help="Where the model will run."),
    have_calibration_data: bool = typer.Option(True, help="You have a few hundred representative inputs."),
    have_training_data: bool = typer.Option(False, help="You have labelled data to fine-tune with."),
    dense_weights: bool = typer.Option(
        False, help="Most weights are large Dense/attention matrices (4-bit int4 fits CPU targets)."
    ),
    max_accuracy_drop: float | None = typer.Option(None, help="e.g. 0.01 = at most one point of top-1."),
    max_error_increase: float | None = MAX_ERROR_INCREASE,
    max_output_error: float | None = MAX_OUTPUT_ERROR,
    min_agreement: float | None = MIN_AGREEMENT,
    min_detections_kept: float | None = MIN_DETECTIONS_KEPT,
    min_mask_iou: float | None = MIN_MASK_IOU,
    min_sample_kept: float | None = MIN_SAMPLE_KEPT,
    max_size_bytes: int | None = typer.Option(None, help="Largest acceptable .tflite."),
    max_latency_ms: float | None = typer.Option(None, help="Slowest acceptable p50 latency (host CPU)."),
    max_slowdown: float | None = MAX_SLOWDOWN,
    objective: Objective = typer.Option(Objective.SIZE, help="Rank by size, latency or accuracy."),
    recipe: bool = typer.Option(
        False, "--recipe", help="Also print the chosen pipeline as a TOML recipe (for optimize run)."
    ),
    as_json: bool = JSON,
) -> None:
    """Pick a scheme for a target and a budget.

    The decision path (rule of thumb), then the choice from measurements.

    \b
    Example:
      optimize recommend --target gpu             (the decision tree alone)
      optimize recommend out/study.json --target gpu --max-accuracy-drop 0.01
      optimize recommend out/study.json --target gpu --recipe
      optimize recommend out/study.json --max-error-increase 0.05   (regression)
    """
    from optimize.core.results import load_study
    from optimize.decide.advice import advise
    from optimize.decide.choose import make_goals, raise_if_unmet
    from optimize.decide.choose import recommend as choose
    from optimize.present.report_text import format_recommendation

    goals = make_goals(
        max_accuracy_drop,
        max_size_bytes,
        max_latency_ms,
        objective,
        max_output_error,
        max_error_increase,
        min_agreement,
        min_detections_kept,
        min_mask_iou,
        max_slowdown,
        min_sample_kept,
    )
    if study is None:
        advice = advise(
            target,
            have_calibration_data=have_calibration_data,
            have_training_data=have_training_data,
            goals=goals,
            dense_weights=dense_weights,
        )
        _show(advice.model_dump_json(indent=2) if as_json else format_recommendation(advice, recipe), fit=not as_json)
        return
    folder = study if study.is_dir() else study.parent
    st = load_study(study)
    rec = choose(st, target, goals, folder=folder)
    _show(
        rec.model_dump_json(indent=2) if as_json else format_recommendation(rec, recipe) + _usage(st, rec, folder),
        fit=not as_json,
    )
    raise_if_unmet(rec)


def _usage(study, rec, folder: Path) -> str:
    """How to run the chosen file on the target, and measure it on a phone (present.usage)."""
    from optimize.present.usage import usage_lines

    if not rec.chosen:
        return ""
    lines = usage_lines(study.candidate(rec.chosen), rec.target, folder)
    return "\n" + "\n".join(lines) + "\n" if lines else ""


@app.command()
def report(
    study: Path = typer.Argument(..., help="A study.json (or its folder)."),
    output: Path | None = typer.Option(None, "--output", "-o", help="Folder for report.md and report.html."),
    target: Target | None = typer.Option(None, help="Mark the recommended candidate for this target."),
) -> None:
    """Write report.md and a self-contained report.html.

    Table, plots, Pareto front and delegate matrix.

    \b
    Example:
      optimize report optimize-out/study.json --target gpu
    """
    from optimize.present.report import write_report_for

    for p in write_report_for(study, output, target).values():
        typer.echo(str(p))


@app.command()
def debug(
    model: Path = typer.Argument(
        ..., help="Keras .keras/.h5, SavedModel dir, float .tflite, .pt2, .onnx or a TF1 frozen graph .pb."
    ),
    data: Path = typer.Option(..., "--data", "-d", help=".npz whose calibration samples (x) are compared."),
    scheme: Scheme = typer.Option(Scheme.INT8, "--scheme", "-s", help="int8 or int16x8.", **DEBUG_SCHEMES),
    samples: int = typer.Option(16, min=1, max=10000, help="Samples run through both models (errors settle fast)."),
    leave_out: int = typer.Option(3, min=0, max=50, help="Worst ops also measured with only them kept float."),
    study: Path | None = typer.Option(
        None, "--study", help="A sweep's study.json of this model: its measured fixes are quoted, not suggested again."
    ),
    label_output: str | None = LABEL_OUTPUT,
    trust_model_code: bool = TRUST,
    layout: Layout = LAYOUT,
    graph_inputs: str | None = GRAPH_INPUTS,
    graph_outputs: str | None = GRAPH_OUTPUTS,
    threads: int = THREADS,
    as_json: bool = JSON,
) -> None:
    """Which ops break quantization: per-layer error vs float, ranked.

    With the fixes measured on held-out samples, and only those that helped offered.

    \b
    Example:
      optimize debug m.keras --data d.npz --scheme int8
    """
    from optimize.engine.debug import debug_model
    from optimize.present import report_text

    _progress(as_json)
    report = debug_model(  # checks the data and labels (--label-output) against the model first, in one line
        model,
        data,
        scheme=scheme,
        samples=samples,
        leave_out=leave_out,
        threads=threads,
        trust_model_code=trust_model_code,
        measuring=_measuring(None, label_output, 0),
        layout=layout,
        study=study,
        graph=_graph(graph_inputs, graph_outputs),
    )
    if as_json:
        _print_json(report)
    else:
        report_text.print_debug(report)


@app.command("run")
def run_recipe(
    recipe: str = typer.Argument(..., help="A recipe .toml, or a shipped recipe's name (optimize recipes list)."),
    model: Path | None = typer.Argument(None, help="Model (default: the recipe's, else the demo)."),
    data: Path | None = typer.Option(None, "--data", "-d", help=".npz data (default: the recipe's)."),
    output: Path | None = typer.Option(None, "--output", "-o", help="Folder (default: the recipe's)."),
    backend: Backend | None = _backend_option("Override the recipe's backend. " + BACKEND_HELP),
    test_samples: int | None = TEST_SAMPLES,
    trust_model_code: bool = TRUST,
    threads: int = THREADS,
    delegates: bool = DELEGATES,
    as_json: bool = JSON,
    verbose: bool = VERBOSE,
) -> None:
    """Run a recipe: its steps measured, checked and judged.

    The candidate is judged against the recipe's goals (exit 1 if unmet).

    \b
    Example:
      optimize run mobile-gpu m.keras --data d.npz
    """
    from optimize.core.recipe import load_recipe
    from optimize.decide.choose import judge_recipe

    r = load_recipe(recipe)
    cand = _run_and_show(
        r, model, data, output, threads, as_json, delegates, backend=backend, trust_model_code=trust_model_code,
        verbose=verbose, test_samples=test_samples,
    )  # fmt: skip
    verdicts = judge_recipe(cand, r)
    from optimize.core.shown import escape, wrap

    for t, problem in verdicts:
        line = f"{t}: {'meets the recipe goals' if problem is None else 'does not meet the goals: ' + problem}"
        typer.echo(wrap(escape(line)), err=as_json)
    if any(p for _, p in verdicts):
        raise typer.Exit(1)


@recipes_app.command("list")
def recipes_list() -> None:
    """The shipped recipes and what each is for.

    \b
    Example:
      optimize recipes list
    """
    from optimize.core.recipe import load_recipe, shipped_recipes
    from optimize.core.shown import escape, wrap

    recipes = {name: load_recipe(path) for name, path in shipped_recipes().items()}
    first = max(map(len, recipes), default=4) + 2
    second = max((len(", ".join(r.targets)) for r in recipes.values()), default=1) + 2
    typer.echo(f"{'recipe':{first}}{'targets':{second}}what it is for")
    for name, r in recipes.items():
        line = f"{name:{first}}{', '.join(r.targets) or '-':{second}}{r.description}"
        typer.echo(wrap(escape(line), hang=first + second))


@recipes_app.command("show")
def recipes_show(recipe: str = typer.Argument(..., help="Recipe name or path.")) -> None:
    """Print a recipe as `optimize run` runs it (defaults filled in).

    Its post-training schemes are shown made by the backend run uses.

    \b
    Example:
      optimize recipes show mobile-gpu
    """
    import textwrap

    from optimize.core.recipe import load_recipe

    def steps(r) -> str:
        return " -> ".join(
            s.technique + (f"({s.params.scheme})" if getattr(s.params, "scheme", None) else "") for s in r.steps
        )

    written = load_recipe(recipe)
    runs = written.with_backend()
    if runs.steps != written.steps:  # said as TOML comments, so the text still loads as the recipe
        who = {Backend.LITERT: "LiteRT Quantizer", Backend.CONVERTER: "the TFLite converter"}.get(runs.made_by)
        note = (
            f"As written: {steps(written)}. `optimize run` runs {steps(runs)}"
            + (f", quantized by {who}" if who else "")
            + f" (backend {runs.backend}), as below."
        )
        typer.echo("\n".join(f"# {line}" for line in textwrap.wrap(note, 76, break_on_hyphens=False)))
    typer.echo(runs.to_toml())


@recipes_app.command("validate")
def recipes_validate(recipes: list[str] = typer.Argument(..., help="Recipe files or names.")) -> None:
    """Check recipes without loading any model.

    \b
    Example:
      optimize recipes validate recipes/*.toml
    """
    from optimize.core.recipe import load_recipe

    bad = 0
    for r in recipes:
        try:
            load_recipe(r)
            _show(f"ok  {r}")
        except RecipeError as e:
            bad += 1
            _say(f"error: {e}")
    if bad:
        raise typer.Exit(2)


@recipes_app.command("techniques")
def recipes_techniques() -> None:
    """Every technique a step can name, with its params.

    \b
    Example:
      optimize recipes techniques
    """
    from enum import Enum

    from optimize.core.registry import techniques

    def shown(value) -> str:  # as a recipe would spell it: "int8", not <Scheme.INT8: 'int8'>
        value = value.value if isinstance(value, Enum) else value
        return json.dumps(value) if isinstance(value, str | bool) or value is None else str(value)

    from optimize.core.shown import escape, wrap

    for name, t in sorted(techniques().items()):
        typer.echo(wrap(escape(f"{name} ({t.stage.value}): {t.summary}"), hang=4))
        for fname, f in t.params.model_fields.items():
            default = "(required)" if f.is_required() else shown(f.default)
            typer.echo(wrap(escape(f"    {fname} = {default}"), hang=8))
            if f.description:
                typer.echo(wrap(escape(f"        {f.description}"), hang=8))


def commands() -> dict:
    """Every command path (`""` for `optimize` itself, `sweep`, `recipes list`, ...) and its Click command,
    in the app's order: read from the app, so a list of commands (the tests, the width benchmark) never
    drifts from it."""
    import typer.main

    top = typer.main.get_command(app)
    out = {"": top}
    for name, cmd in top.commands.items():
        out[name] = cmd
        for sub, c in getattr(cmd, "commands", {}).items():
            out[f"{name} {sub}"] = c
    return out


def _silence_stdout() -> None:
    """After stdout failed (e.g. /dev/full), keep Python's exit-time flush from failing on it again."""
    import os

    try:
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, sys.stdout.fileno())
    except OSError:
        pass


def optional_values(argv: list[str]) -> list[str]:
    """`--mlflow` alone (last, or before another option) takes its default value."""
    out = []
    for i, arg in enumerate(argv):
        out.append(arg)
        if arg in OPTIONAL_VALUES and (i + 1 == len(argv) or argv[i + 1].startswith("-")):
            out.append(OPTIONAL_VALUES[arg])
    return out


class Terminated(BaseException):
    """SIGTERM: stopped like Ctrl-C (workers killed, the staging folder removed), exit code 143. Not a
    KeyboardInterrupt, which Typer turns into a plain exit code of 130."""


def _on_sigterm(signum, frame) -> None:
    raise Terminated()


def _terminal_streams() -> None:
    """Streams that never fail on what they print: a C locale's ASCII or a non-UTF-8 file name shows as
    escapes instead of raising UnicodeEncodeError. (A stream the caller closed was given /dev/null on import:
    optimize.core.streams.)"""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(errors="backslashreplace")
        except (AttributeError, ValueError):
            pass


def _show(text: str, fit: bool = True) -> None:
    """Program-made text on stdout (a report, a recommendation): its lines kept, anything else a name or a
    message from outside could hold (an escape sequence, a bidi override) shown, never obeyed; lines
    wider than the terminal wrapped (`fit=False` for JSON, which is data)."""
    from optimize.core.shown import escape_lines, warning_style, wrap

    text = escape_lines(text)
    typer.echo(warning_style(wrap(text) if fit else text))


#: Where an `error:` message continues when it wraps: under its first word after "error: ".
ERROR_HANG = len("error: ")


def _say(text: str) -> None:
    """The one way a line reaches stderr from here: user text in it shown, never obeyed (optimize.core.shown),
    and wrapped at spaces to the terminal's width like everything else (80 columns in a pipe): an `error:`
    message stays one message, its continuation lines indented under its text; a path is never split."""
    from optimize.core.shown import escape, wrap

    typer.echo(wrap(escape(text), hang=ERROR_HANG), err=True)


def _usage_error(e) -> None:
    ctx = getattr(e, "ctx", None)
    if type(e).__name__ == "NoArgsIsHelpError":  # `optimize` alone: the help, as asked
        typer.echo(ctx.get_help() if ctx else e.format_message())
        sys.exit(0)
    msg = " ".join(e.format_message().replace("Value error, ", "").split()).rstrip(".") + "."
    where = f" See `{ctx.command_path} --help`." if ctx is not None else ""
    _say(f"error: {msg}{where}")
    sys.exit(getattr(e, "exit_code", 2))


def _reader_gone() -> None:
    """stdout's reader closed the pipe early: it has what it wanted, so this is success, quietly."""
    _silence_stdout()
    sys.exit(0)


def main() -> None:
    """Entry point: user errors (ours, and bad options or arguments) become one `error:` line and their
    exit code (2; 1 when the goals are not met), never a traceback or a usage box. Ctrl-C and SIGTERM end
    in one line (exit 130 and 143); a reader that closes the pipe early (`| head -1`) ends it quietly."""
    import signal

    _terminal_streams()
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        code = app(args=optional_values(sys.argv[1:]), standalone_mode=False, prog_name="optimize")
        sys.stdout.flush()
    except OptimizeError as e:
        _say(f"error: {e}")
        sys.exit(e.exit_code)
    except typer.TyperException as e:  # Click's usage errors, as Typer vendors them
        _usage_error(e)
    except (KeyboardInterrupt, typer.Abort, Terminated) as e:
        code = 143 if isinstance(e, Terminated) else 130
    except BrokenPipeError:  # the reader has what it wanted (`optimize recipes list | head -1`)
        _reader_gone()
    except SystemExit:
        if type(sys.stdout).__name__ == "PacifyFlushWrapper":  # Click met that closed pipe and exits 1
            _reader_gone()
        raise
    except OSError as e:  # a full disk, a read-only folder, a closed or full stdout
        _silence_stdout()
        where = f"{e.filename}: " if getattr(e, "filename", None) else ""
        _say(f"error: cannot write {where}{e.strerror or e}. Free space or pick another output.")
        sys.exit(2)
    if code in (130, 143):  # Typer returns 130 for the KeyboardInterrupt it caught (the clean-up has run)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not interrupt the last line
        _say("terminated" if code == 143 else "interrupted")
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()

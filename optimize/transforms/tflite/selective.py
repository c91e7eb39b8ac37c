"""selective: full int8, then the ops that break it moved up (kept float, or 16-bit activations) until an
accuracy budget is met. A bounded, seeded, greedy search over LiteRT Quantizer per-op configs.

1. Calibrate once (optimize.transforms.tflite.session.Session); quantize everything to int8; measure the budget's metric on a
   validation split of the training data (never the test split the candidate is reported on) that the calibration never
   saw: the training samples calibration did not draw, or, where it drew (nearly) all of them, a share held out of
   it (calibration, and the rescue's equalization and corrections, then use the rest).
   When it misses the budget, first the rescue that keeps 8 bits (optimize.transforms.tflite.rescue: equalize, bias
   correction, auto activation ranges, learned rounding; each kept only if it helps, one evaluation each).
2. Rank the quantized ops by the error each adds (optimize.measure.layer_error), preferring ops next to an island
   already raised (each island costs QUANTIZE/DEQUANTIZE pairs and can split delegate partitions).
3. Take the worst op up: try float and int16 activations (or the one `up` names), keep the better if it
   helps; repeat until the metric is within budget, the evaluation cap is spent or no op is left.
Every move is recorded on the candidate (`search`), and the decision in its notes.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import Field, model_validator

from optimize.core.errors import DataError, TechniqueFailed
from optimize.core.registry import Context, SchemeParams, Stage, technique
from optimize.core.results import FloatIsland, SearchStep, write_atomic
from optimize.core.vocab import IO, Backend, Scheme
from optimize.measure import detection, slices, timing
from optimize.measure import layer_error as debug
from optimize.models import runtime, tasks
from optimize.models.data import as_float, count, take
from optimize.transforms.tflite import repair, rescue
from optimize.transforms.tflite import session as litert

#: Fewer validation samples than this left beside the calibration samples, and a share of them is held out of it.
MIN_HELD_OUT = 20
HOLD_OUT_SHARE = 0.25  # of the samples, when calibration would take them all (at most half)

#: Budgets used when a recipe names none: what "int8 hurts" means in peers.md and issue 10.
DEFAULT_DROP = 0.005  # classification: at most half a point of top-1
DEFAULT_INCREASE = 0.10  # regression: error at most 1.10x float32
DEFAULT_OUTPUT_ERROR = 0.01  # no labels: mean |diff| at most 1% of the output's range
DEFAULT_DETECTIONS_KEPT = 0.95  # a detector: at most 5% of float32's detections lost
DEFAULT_MASK_IOU = 0.9  # a segmenter: its masks' IoU with float32's (the default guard's)


class SelectiveParams(SchemeParams):
    scheme: Scheme = Field(Scheme.INT8, description="The precision everything starts from (int8).")
    io: IO = Field(IO.FLOAT, description="Model input/output type: float, or int8/uint8 for integer pipelines.")
    samples: int = Field(200, ge=1, le=10000, description="Calibration samples.")
    max_accuracy_drop: float | None = Field(
        None, ge=0, le=1, description="Budget for classification: top-1 drop vs float32 (0.005 = half a point)."
    )
    max_error_increase: float | None = Field(
        None, ge=0, description="Budget for regression: relative MAE increase vs float32 (0.1 = 10% worse)."
    )
    max_output_error: float | None = Field(
        None, gt=0, le=1, description="Budget without labels: mean |diff| from float32 over the output range."
    )
    min_detections_kept: float | None = Field(
        None, ge=0, le=1, description="Budget for a detector: share of float32's detections kept (0.95)."
    )
    min_mask_iou: float | None = Field(
        None, ge=0, le=1, description="Budget for a segmenter: its masks' IoU with float32's (0.9)."
    )
    up: Literal["auto", "float", "int16"] = Field(
        "auto", description="How an op moves up: kept float, int16 activations, or auto (whichever helps more)."
    )
    max_evals: int = Field(25, ge=1, le=200, description="Cap on model evaluations (the search is bounded).")
    eval_samples: int = Field(500, ge=10, le=100000, description="Validation samples per evaluation.")
    seed: int = Field(0, description="Seeds the choice of validation samples.")
    granularity: Literal["channel", "tensor"] = Field("channel", description="Weight scales per channel or tensor.")
    calibration: Literal["minmax", "moving_average", "percentile", "mse", "auto"] = Field(
        "minmax", description="Activation ranges (see quantize); the rescue may try auto."
    )
    rescue: bool = Field(
        True,
        description="First try what keeps 8 bits (equalize, bias correction, auto ranges, learned rounding), "
        "keeping each that helps, before raising any op to int16 or float.",
    )

    @model_validator(mode="after")
    def _one_budget(self):
        if self.scheme != Scheme.INT8:
            raise ValueError(f"selective starts from int8, not {self.scheme}")
        budgets = (
            self.max_accuracy_drop,
            self.max_error_increase,
            self.max_output_error,
            self.min_detections_kept,
            self.min_mask_iou,
        )
        if len([b for b in budgets if b is not None]) > 1:
            raise ValueError(
                "give one budget: max_accuracy_drop, max_error_increase, max_output_error, min_detections_kept or "
                "min_mask_iou"
            )
        return self


@dataclass
class _Budget:
    """The metric a search drives down: the drop, the relative error increase or the output error."""

    kind: Literal["drop", "increase", "output", "detections", "masks"]
    limit: float
    xs: np.ndarray
    y: np.ndarray | None
    reference: list[np.ndarray]
    base: float
    float_ms: float = 0.0  # the float32 model's p50 here: islands that make the model slower lose ties
    task: object = None  # tasks.Task of the labelled output
    head: object = None  # tasks.Head of the labelled output
    output: int = 0  # which output the labels belong to
    layout: object = None  # a detector's head (measure.detection.Layout): the metric is detections lost
    cuts: dict = field(default_factory=dict)  # output index -> its slices (quantities of different scales)
    held_out: str = ""  # how the validation samples were kept from the calibration, in words
    few: bool = False  # a detector's float32 makes too few detections on these samples to judge by
    masks: list = field(default_factory=list)  # a segmenter's mask outputs, by index: the metric is their IoU

    def describe(self, value: float) -> str:
        if self.kind == "drop":
            return f"{value * 100:.2f} pt lost"
        if self.kind == "increase":
            return f"error x{1 + value:.2f}"
        if self.kind == "detections":
            return f"{(1 - value) * 100:.1f}% of float32's detections kept"
        if self.kind == "masks":
            return f"mask IoU {(1 - value) * 100:.1f}% with float32's"
        return f"output error {value:.4f}"

    def meets(self, value: float) -> bool:
        return value <= self.limit + 1e-12

    @property
    def noise(self) -> float:
        """The smallest change of the metric that is not noise: one sample for accuracy, else ~0."""
        return 0.5 / count(self.xs) if self.kind == "drop" else 1e-9


def _score(budget: _Budget, outs: list[np.ndarray]) -> float:
    """Top-1 (classes, yes/no) or MAE (values) of the labelled output."""
    figures = tasks.scores(budget.task, outs[budget.output], budget.y, budget.head)
    return figures["mae"] if budget.kind == "increase" else figures["top1"]


def _p50(content: bytes, sample, threads: int) -> float:
    """A quick p50 latency (ms) of one model on this machine: enough to rank islands, not to report."""
    runner = runtime.Runner(runtime.load(content, threads=threads, like=sample))
    return timing.time_invoke(runner, sample, warmup=3, runs=20, budget_s=0.3)["p50_ms"]


def _predict(content: bytes, xs, threads: int) -> list[np.ndarray]:
    """Outputs on every sample; inputs with free dimensions take the samples' shape."""
    return runtime.Runner(runtime.load(content, threads=threads, like=take(xs, slice(0, 1)))).predict(xs)


def _same(a, b) -> bool:
    """Whether two splits hold the same samples (the calibration split is the training split unless given)."""
    if a is b:
        return True
    if isinstance(a, dict) or isinstance(b, dict):
        return (
            isinstance(a, dict) and isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
        )
    return a.shape == b.shape and np.array_equal(a, b)


@dataclass(frozen=True)
class Validation:
    """Where the search judges: `pick`, indices into `pool` (the training split with labels, else the
    calibration split), none of which the calibration (`calibration`: the data it draws from) ever sees."""

    pool: str  # "train" or "cal"
    pick: np.ndarray
    calibration: object  # the Dataset calibration and the rescue's fitting draw from
    words: str


def held_out(ds, samples: int, eval_samples: int, seed: int, share: float = HOLD_OUT_SHARE) -> Validation:
    """Validation samples the calibration never saw. With a calibration split of its own, every training
    sample; else those the calibration does not draw (`ds.calibration_index(samples)`), or, where fewer than
    MIN_HELD_OUT are left, a seeded `share` held out of it (at most half): the calibration then draws from the
    rest."""
    from dataclasses import replace

    labelled = ds.x_train is not None and ds.y_train is not None
    pool, name = (ds.x_train, "train") if labelled else (ds.x_cal, "cal")
    n, rng = count(pool), np.random.default_rng(seed)
    if name == "train" and not _same(pool, ds.x_cal):
        pick = np.sort(rng.choice(n, min(eval_samples, n), replace=False))
        return Validation(name, pick, ds, f"{len(pick)} training samples (calibrated on a split of its own)")
    free = np.setdiff1d(np.arange(n), ds.calibration_index(samples))
    if len(free) >= MIN_HELD_OUT:
        pick = np.sort(rng.choice(free, min(eval_samples, len(free)), replace=False))
        words = f"{len(pick)} held-out samples (calibration draws from the other {n - len(pick)})"
    elif n >= 2:
        k = min(n // 2, max(MIN_HELD_OUT, int(np.ceil(n * share))))
        pick = np.sort(rng.choice(n, min(k, eval_samples), replace=False))
        words = f"{len(pick)} samples held out of the calibration (it draws from the other {n - len(pick)})"
    else:
        return Validation(name, np.arange(n), ds, f"{n} sample(s), the calibration's own: too few to hold any out")
    rest = np.setdiff1d(np.arange(n), pick)
    return Validation(name, pick, replace(ds, x_cal=take(ds.x_cal, rest)), words)


def _budget(
    float_model: bytes, params: SelectiveParams, ctx: Context, where: Validation, judged_few: bool = False
) -> _Budget:
    """Validation data (held out of the calibration: `where`) and the metric the budget is about; `judged_few`:
    these are the more samples drawn because float32 detected too little on the first ones, and a detector whose
    float32 still detects too little is judged by its output error, said so."""
    from optimize.measure.metrics import label_index, source_names
    from optimize.models.tasks import heads

    ds = ctx.data
    labelled = where.pool == "train"
    pick = where.pick
    xs = as_float(take(ds.x_train if labelled else ds.x_cal, pick))
    runner = runtime.Runner(runtime.load(float_model, threads=ctx.threads, like=take(xs, slice(0, 1))))
    reference = runner.predict(xs)
    finite = np.all([np.isfinite(r.reshape(len(r), -1)).all(axis=1) for r in reference], axis=0)
    if not finite.all() and finite.any():  # samples the float model itself answers NaN/inf on measure nothing
        pick, xs = pick[finite], take(xs, np.flatnonzero(finite))
        reference = [r[finite] for r in reference]
    unlabelled = _unlabelled_budget(float_model, runner, reference, xs, params, labelled, where, ds.task, judged_few)
    if unlabelled is not None:
        return unlabelled
    i = label_index(ds, runner)
    head = heads(float_model, runner)[i]
    y = np.asarray(ds.labels("train", source_names(ds, runner)[i] if ds.outputs else None))[pick]
    task = tasks.detect(head, y, ds.task)
    y = tasks.check_labels(task, head, y, "y_train")
    regression = task is tasks.Task.REGRESSION or params.max_error_increase is not None
    kind = "increase" if regression else "drop"
    limit = (
        _limit(params.max_error_increase, DEFAULT_INCREASE)
        if regression
        else _limit(params.max_accuracy_drop, DEFAULT_DROP)
    )
    budget = _Budget(kind, limit, xs, y, reference, 0.0, task=task, head=head, output=i, held_out=where.words)
    budget.base = _score(budget, reference)
    return budget


def _unlabelled_budget(
    float_model, runner, reference, xs, params, labelled: bool, where, task, judged_few: bool = False
) -> _Budget | None:
    """A budget against float32: a detector's detections kept (its default without labels, or asked for), else
    the output error (every slice of an output of several scales over its own range); None: the labels'. A
    detector whose float32 makes fewer than FEW_DETECTIONS detections on the samples is a `few` budget; on the
    more samples drawn for it (`judged_few`) its detections still judge, said to be a rough figure, unless float32
    makes none there: then its output error judges, and the words say why (a scores slice mostly zero reads as
    a small error while every detection is lost, so it is the last resort)."""
    layout, cuts = _detector(float_model, runner, reference, task)
    words = where.words
    masks = _mask_outputs(float_model, runner, reference, task)
    if masks and layout is None and (params.min_mask_iou is not None or (not labelled and not params.max_output_error)):
        limit = 1 - (params.min_mask_iou or DEFAULT_MASK_IOU)
        return _Budget("masks", limit, xs, None, reference, 0.0, cuts=cuts, held_out=words, masks=masks)
    if layout is not None and params.max_output_error is None and (not labelled or params.min_detections_kept):
        found = _detections_budget(layout, cuts, reference, xs, params, words, judged_few)
        if isinstance(found, _Budget):
            return found
        words = found
    if not labelled or params.max_output_error is not None:
        limit = params.max_output_error or DEFAULT_OUTPUT_ERROR
        return _Budget("output", limit, xs, None, reference, 0.0, cuts=cuts, held_out=words)
    return None


def _detections_budget(layout, cuts, reference, xs, params, words: str, judged_few: bool) -> _Budget | str:
    """A detector's budget on these samples, or (float32 makes no detection on the more samples drawn) the
    words that say the output error judges instead."""
    made = detection.compare(reference, reference, [str(i) for i in range(len(reference))], layout)
    if made.reference_detections and judged_few and made.few:  # a rough count is still the count to judge by
        words += f"; float32 makes only {made.reference_detections} detection(s) there: a rough figure"
    if made.reference_detections or not judged_few:
        limit = 1 - (params.min_detections_kept or DEFAULT_DETECTIONS_KEPT)
        budget = _Budget("detections", limit, xs, None, reference, 0.0, layout=layout, cuts=cuts, held_out=words)
        budget.few = made.few
        return budget
    return words + (
        "; float32 makes no detection there, so detections kept cannot judge: the output error of its boxes and "
        "scores does"
    )


def _mask_outputs(float_model: bytes, runner, reference: list[np.ndarray], task) -> list[int]:
    """The outputs that are masks (a one-channel sigmoid map, or every map under --task segment): a segmenter's
    search is judged by their IoU with float32's, as its guard is."""
    from optimize.models.tasks import heads

    hs = heads(float_model, runner)
    return [i for i, h in enumerate(hs) if h.is_mask or (task == tasks.Task.SEGMENT and len(h.shape) >= 3)]


def _detector(float_model: bytes, runner, reference: list[np.ndarray], task) -> tuple[object, dict]:
    """A detector head among the outputs (None), and each output's slices where its channels carry quantities
    of different scales (the head's boxes and scores): the search's error is the worst slice's."""
    from optimize.models.tasks import heads

    layout = detection.head_of(reference, task, [h.role for h in heads(float_model, runner)])
    cuts = layout.slices([r.shape for r in reference]) if layout else {}
    for i, r in enumerate(reference):
        if i not in cuts and (found := slices.scale_slices(r)):
            cuts[i] = found
    return layout, cuts


def _limit(value: float | None, default: float) -> float:
    return default if value is None else value


#: Ops that pass their input's quantization through (same scale in and out): raised together with the op
#: that feeds them, so an island does not requantize back to int8 right after it.
PASS_THROUGH = frozenset(
    {
        "RESHAPE",
        "SQUEEZE",
        "EXPAND_DIMS",
        "MAX_POOL_2D",
        "STRIDED_SLICE",
        "SLICE",
        "TRANSPOSE",
        "GATHER",
        "SPACE_TO_DEPTH",
        "DEPTH_TO_SPACE",
        "PAD",
        "SPLIT",
        "PACK",
        "UNPACK",
    }
)


@dataclass(frozen=True)
class _Move:
    """An island: one op and the pass-through ops right after it, raised together."""

    op: str
    tensors: tuple[str, ...]

    @property
    def head(self) -> str:
        return self.tensors[0]


def output_stage(content: bytes) -> tuple[str, int, list[str]] | None:
    """A quantized model's output stage: the last island's op, its index, and its tensors with every quantized
    tensor after it (the reshapes and transposes before the outputs); None when nothing is quantized."""
    from optimize.models.tflite import read_model

    moves = _moves(content)
    if not moves:
        return None
    head = moves[-1].head
    sg = read_model(content).main
    index = next(op.index for op in sg.ops for o in op.outputs if o >= 0 and sg.tensors[o].name == head)
    return moves[-1].op, index, tensors_after(content, head)


def _moves(content: bytes) -> list[_Move]:
    """Every island worth raising in a quantized model, in graph order."""
    from optimize.models.tflite import read_model

    sg = read_model(content).main
    consumers: dict[int, list] = {}
    for op in sg.ops:
        for i in op.inputs:
            consumers.setdefault(i, []).append(op)
    moves = []
    for op in sg.ops:
        if op.name in ("QUANTIZE", "DEQUANTIZE") or op.name in PASS_THROUGH or not op.outputs or op.outputs[0] < 0:
            continue
        out = sg.tensors[op.outputs[0]]
        if out.dtype not in debug.QUANT_DTYPES:
            continue
        island, t = [out.name], op.outputs[0]
        while len(consumers.get(t, [])) == 1 and consumers[t][0].name in PASS_THROUGH:
            nxt = consumers[t][0]
            t = nxt.outputs[0]
            island.append(sg.tensors[t].name)
        moves.append(_Move(op.name, tuple(island)))
    return moves


@dataclass
class _Result:
    value: float  # the budget's metric (lower is better)
    proxy: float  # output error vs float32 (smooth: ranks moves where the metric is too coarse)
    content: bytes


@dataclass
class _Search:
    """The search's state: evaluations spent, the ops raised so far, the moves recorded."""

    session: litert.Session
    budget: _Budget
    params: SelectiveParams
    threads: int
    evals: int = 0
    overrides: dict[str, str] = field(default_factory=dict)
    steps: list[SearchStep] = field(default_factory=list)
    report: object = None  # the DebugReport the search ranked by (results.DebugReport)

    @property
    def left(self) -> int:
        return self.params.max_evals - self.evals

    def evaluate(self, overrides: dict[str, str]) -> _Result:
        self.evals += 1
        content = self.session.quantize(overrides)
        try:
            outs = _predict(content, self.budget.xs, self.threads)
        except runtime.InvokeError as e:  # this variant fails on a validation sample: not an option
            raise TechniqueFailed(f"the variant fails on validation sample {e.sample}: {e.failure}") from None
        b = self.budget
        proxy = debug.output_error(list(zip(_per_sample(b.reference), _per_sample(outs), strict=True)))
        for i, cut in b.cuts.items():  # a slice of another scale is judged over its own range
            proxy = max([proxy, *(e.relative_error for e in slices.slice_errors(outs[i], b.reference[i], cut))])
        if b.kind == "output":
            value = proxy
        elif b.kind == "detections":  # float32 detecting nothing here judges nothing: never "everything kept"
            kept = detection.compare(outs, b.reference, [str(i) for i in range(len(outs))], b.layout).kept_fraction
            value = 1.0 - (0.0 if kept is None else kept)
        elif b.kind == "masks":  # the worst mask output's IoU with float32's
            ious = [tasks.segmentation_iou(outs[i], b.reference[i]) for i in b.masks]
            value = 1.0 - min((v for v in ious if v is not None), default=1.0)
        elif b.kind == "drop":
            value = b.base - _score(b, outs)
        else:
            value = _score(b, outs) / b.base - 1 if b.base > 0 else 0.0
        return _Result(value, proxy, content)

    def raised(self, move: _Move, way: str) -> dict[str, str]:
        return {**self.overrides, **dict.fromkeys(move.tensors, way)}

    def sensitivity(self, moves: list[_Move]) -> list[tuple[float, _Move]]:
        """Leave-one-out: the output error with everything int8 except each island (kept float)."""
        scored = []
        for move in moves:
            if self.left <= 1:
                break
            try:
                scored.append((self.evaluate(self.raised(move, "float")).proxy, move))
            except TechniqueFailed:
                continue
        return sorted(scored, key=lambda sm: sm[0])

    def better(self, new: _Result, cur: _Result) -> bool:
        """A real improvement: the metric beyond its noise floor, or the output error by a tenth at no cost."""
        floor = self.budget.noise
        return new.value < cur.value - floor or (new.value <= cur.value + floor and new.proxy < 0.9 * cur.proxy)

    def try_move(self, move: _Move, cur: _Result) -> _Result:
        """Raise one island (float and/or int16); keep the best option if it really helps."""
        ways = ("int16", "float") if self.params.up == "auto" else (self.params.up,)
        options: list[tuple[_Result, str]] = []
        for way in ways:
            if self.left <= 0:
                break
            try:
                options.append((self.evaluate(self.raised(move, way)), way))
            except TechniqueFailed:
                continue  # this precision is not possible for this op: try the other
        good = [(r, w) for r, w in options if self.better(r, cur)]
        best = min(good, key=lambda rw: self.cost(rw[0])) if good else None
        for r, w in options:
            self.steps.append(_step(move, w, r, kept=best is not None and r is best[0]))
        if best is None:
            return cur
        self.overrides = self.raised(move, best[1])
        return best[0]

    def cost(self, r: _Result) -> tuple:
        """Which of two helpful options to keep: one no slower than float32 on this CPU first (int16 ops
        run on reference kernels), then the better metric, then the smaller model."""
        slow = _p50(r.content, take(self.budget.xs, slice(0, 1)), self.threads) > self.budget.float_ms * 1.1
        return (slow, round(r.value, 9), r.proxy, len(r.content))

    def drop_unneeded(self, raised: list[_Move], cur: _Result) -> _Result:
        """Once the budget holds, take islands back down (float ones first: they cost the most bytes) while
        it still holds: to int8, else (from float) to int16 weights-int8. A move a later one made
        unnecessary is undone."""
        order = sorted(raised, key=lambda m: self.overrides.get(m.head) != "float")
        for move in order:
            downs = ["int8"] + (["int16"] if self.overrides.get(move.head) == "float" else [])
            for down in downs:
                if self.left <= 0:
                    return cur
                trial = {k: v for k, v in self.overrides.items() if k not in move.tensors}
                if down == "int16":
                    trial.update(dict.fromkeys(move.tensors, "int16"))
                try:
                    r = self.evaluate(trial)
                except TechniqueFailed:
                    continue
                ok = self.budget.meets(r.value) and not self.cost(r)[0]  # holds, and no slower than float32
                self.steps.append(_step(move, down, r, kept=ok))
                if ok:
                    self.overrides, cur = trial, r
                    break
        return cur


def _per_sample(outs: list[np.ndarray]) -> list[list[np.ndarray]]:
    return [[o[i] for o in outs] for i in range(len(outs[0]))]


def _step(move: _Move, way: str, r: _Result, kept: bool) -> SearchStep:
    from optimize.models.tflite import read_model

    ops = [op.name for op in read_model(r.content).main.ops]
    return SearchStep(
        op=move.op,
        tensor=move.head,
        precision=way,
        metric=r.value,
        size_bytes=len(r.content),
        qdq_ops=ops.count("QUANTIZE") + ops.count("DEQUANTIZE"),
        kept=kept,
    )


@technique("selective", stage=Stage.TFLITE, params=SelectiveParams)
def selective(model: Path, params: SelectiveParams, ctx: Context) -> Path:
    """int8 with the ops that break it kept float or at 16-bit activations, until an accuracy budget is met.

    A greedy, seeded search capped at `max_evals` model evaluations, ranked by per-layer error analysis;
    every move is recorded on the candidate. Needs calibration data, and labels for an accuracy budget.
    """
    from optimize.transforms.tflite.quantize import (
        QuantizeParams,
        _calibration_data,
        _inspect,
        _left_float,
        _read_model,
        _why_left,
        repaired_session,
    )

    if ctx.data is None:
        raise DataError("selective needs calibration data.", "Pass --calibration DATA.npz or --data DATA.npz.")
    content = _read_model(Path(model))
    where = held_out(ctx.data, params.samples, params.eval_samples, params.seed)
    budget = _budget(content, params, ctx, where)
    if budget.few:  # float32 detects too little on the held-out samples to judge by: hold out more (half)
        where = held_out(ctx.data, params.samples, params.eval_samples, params.seed, share=0.5)
        budget = _budget(content, params, ctx, where, judged_few=True)
    ctx = replace(ctx, data=where.calibration)  # calibration and the rescue's fitting never see the validation samples
    signature, inputs = _inspect(content, Path(model))
    qparams = QuantizeParams(
        scheme=params.scheme,
        io=params.io,
        samples=params.samples,
        granularity=params.granularity,
        calibration=params.calibration,
    )
    calibration = _calibration_data(qparams, ctx, signature, inputs, Path(model))
    extra = [(f"validation sample {i}", take(budget.xs, slice(i, i + 1))) for i in range(min(16, count(budget.xs)))]
    session, _, fixer = repaired_session(content, qparams, ctx, calibration, inputs, extra)
    content = session.content  # inputs with free dimensions pinned to the data's shape, if any
    budget.float_ms = _p50(content, take(budget.xs, slice(0, 1)), ctx.threads)
    search = _Search(session, budget, params, ctx.threads)
    start = search.evaluate({})
    left = _left_float(start.content)
    if left:
        raise TechniqueFailed(
            f"selective: LiteRT Quantizer, which the per-op search works through, leaves {', '.join(left)} float; "
            "the plain int8 candidate (made by the TFLite calibrator) is the int8 model for this one."
        )
    first = start.value
    if params.rescue and not search.budget.meets(start.value):
        calibration = search.session.calibration  # without the samples whose float outputs are not finite
        content, qparams, start, steps = rescue.keep_8_bits(search, content, qparams, calibration, ctx, start)
        ctx.records["rescue"] = [*ctx.records.get("rescue", []), *steps]
        ctx.notes.append(_rescued(steps, search.budget))
    final = start if search.budget.meets(start.value) else _climb(search, content, start)
    data = _runs(final.content, search, fixer, content)
    out = write_atomic(ctx.workdir / "selective-int8.tflite", data)
    ctx.notes.append(_summary(search, first, final.value, len(final.content), len(content)))
    ctx.records["search"] = search.steps
    if search.report is not None:
        ctx.records["debug"] = search.report
    if fixer.rounds:
        ctx.records["repair"] = fixer.record()
        ctx.notes.append(
            f"selective: {len(fixer.islands)} op(s) kept out of int8 first so the model runs where the float model "
            f"runs ({', '.join(f'{i.op} {i.precision}' for i in fixer.islands)}), {fixer.seconds:.1f} s."
        )
    raised = [
        FloatIsland(op=m.op, tensor=t, precision=w, reason="raised by the accuracy search")
        for m in _moves_of(search)
        for t, w in [(m.head, search.overrides[m.head])]
    ]
    ctx.records["islands"] = repair.islands_of(data, [*fixer.islands, *raised], _why_left(Backend.LITERT))
    return out


def _moves_of(search: _Search) -> list[_Move]:
    """The islands the accuracy search raised (by their head tensor), in the order recorded."""
    kept = [st for st in search.steps if st.kept and st.precision != "int8" and st.tensor in search.overrides]
    seen, out = set(), []
    for st in kept:
        if st.tensor not in seen:
            seen.add(st.tensor)
            out.append(_Move(st.op, (st.tensor,)))
    return out


def _runs(data: bytes, search: _Search, fixer, content: bytes) -> bytes:
    """The search's result, checked again where the float model runs (a raised op can move a failure): a
    failure is repaired with the search's choices as the base."""
    if fixer.check.first_failure(data) is None:
        return data
    again = repair.Repairer(
        lambda ov: search.session.quantize({**search.overrides, **ov}), content, fixer.check, "LiteRT Quantizer"
    )
    out = again.run(data)
    fixer.islands += again.islands
    fixer.rounds += again.rounds
    fixer.log += again.log
    return out


def _rescued(steps, budget: _Budget) -> str:
    kept = [s.transform for s in steps if s.kept]
    tried = ", ".join(
        f"{s.transform} ({budget.describe(s.metric) if s.metric is not None else 'n/a'}{', kept' if s.kept else ''})"
        for s in steps
    )
    return f"selective: rescue at 8 bits first: tried {tried or 'nothing'}; kept {', '.join(kept) or 'none'}."


def _climb(search: _Search, content: bytes, start: _Result) -> _Result:
    """Rank islands by leave-one-out sensitivity, then raise them in that order while the budget is unmet.

    Half the evaluations at most go to ranking; islands beyond that are pre-ranked by the error their op
    adds (per-layer analysis on 32 samples).
    """
    moves = _moves(start.content)
    layers, out_err = debug.layer_errors(content, start.content, debug.Samples.from_array(search.budget.xs, 32))
    front = _output_stage(search, moves, start) or _front_end(search, moves, start)
    if front is not None:
        search.report = _report(layers, out_err, [], content, start.content)
        return front
    if len(moves) > search.params.max_evals // 2:
        added = {le.tensor: le.error_added for le in layers}
        moves = sorted(moves, key=lambda m: -max(added.get(t, 0.0) for t in m.tensors))[: search.params.max_evals // 2]
    cur = start
    raised: list[_Move] = []
    ranked = search.sensitivity(moves)
    search.report = _report(layers, out_err, ranked, content, start.content)
    for _, move in ranked:
        if search.budget.meets(cur.value) or search.left <= 0:
            break
        new = search.try_move(move, cur)
        if new is not cur:
            raised.append(move)
        cur = new
    return search.drop_unneeded(raised, cur) if search.budget.meets(cur.value) else cur


OUTPUT_STAGE = (1, 2, 4)  # the last islands tried kept at a higher precision, in turn


def _output_stage(search: _Search, moves: list[_Move], start: _Result) -> _Result | None:
    """The output stage at a precision that holds every quantity of the output: where the output's channels
    carry quantities of different scales (a detector's boxes and scores in one head), one int8 scale for the
    tensor wipes the small ones. The last island (the concatenation that joins them), then the last 2 and 4,
    are measured at 16-bit activations and kept float; the better of those that meet the budget is taken (the
    smaller on a tie). None: not such an output, or the output stage is not what breaks it."""
    if not search.budget.cuts or not moves:
        return None
    for k in OUTPUT_STAGE:
        tail = moves[-k:]
        tensors = tensors_after(start.content, tail[0].head)  # and the reshapes and transposes after them
        tried = _both_ways(search, tensors)
        good = [(r, way) for r, way in tried if search.budget.meets(r.value)]
        best = min(good, key=lambda rw: (round(rw[0].value, 9), len(rw[0].content))) if good else None
        for r, way in tried:
            search.steps += [_step(m, way, r, kept=best is not None and r is best[0]) for m in tail]
        if best is not None:
            search.overrides = {**search.overrides, **dict.fromkeys(tensors, best[1])}
            return best[0]
        if k >= len(moves) or search.left <= 0:
            break
    return None


def _both_ways(search: _Search, tensors: list[str]) -> list[tuple[_Result, str]]:
    """The model with these tensors at 16-bit activations and kept float (those that can be made)."""
    tried = []
    for way in ("int16", "float"):
        if search.left <= 0:
            break
        try:
            tried.append((search.evaluate({**search.overrides, **dict.fromkeys(tensors, way)}), way))
        except TechniqueFailed:
            continue
    return tried


def tensors_after(content: bytes, head: str) -> list[str]:
    """The quantized output tensors of the op making `head` and of every op after it (graph order)."""
    from optimize.models.tflite import read_model

    sg = read_model(content).main
    names, seen = [], False
    for op in sg.ops:
        outs = [sg.tensors[o] for o in op.outputs if o >= 0]
        seen = seen or any(t.name == head for t in outs)
        if seen and op.name not in ("QUANTIZE", "DEQUANTIZE"):
            names += [t.name for t in outs if t.dtype in debug.QUANT_DTYPES]
    return names


FRONT_END_SHARE = 0.25  # a float front end may take at most this share of the islands


def _front_end(search: _Search, moves: list[_Move], start: _Result) -> _Result | None:
    """A float front end: the shortest run of leading islands kept float that meets the budget, found by
    bisection (a signal front end, STFT/mel/log, is where int8 loses most on audio models). Taken only when
    it is at most a quarter of the islands; otherwise the per-op search decides. Costs about log2 of the
    islands in evaluations."""
    cap = int(len(moves) * FRONT_END_SHARE)
    if cap < 2 or search.left < 8:
        return None

    def trial(k: int) -> _Result | None:
        try:
            return search.evaluate({**search.overrides, **{t: "float" for m in moves[:k] for t in m.tensors}})
        except TechniqueFailed:
            return None

    top = trial(cap)
    if top is None or not search.budget.meets(top.value):
        return None  # not a front-end problem (or more than a front end): op by op instead
    lo, hi, best = 0, cap, top
    while hi - lo > 1 and search.left > search.params.max_evals // 2:
        mid = (lo + hi) // 2
        r = trial(mid)
        if r is not None and search.budget.meets(r.value):
            hi, best = mid, r
        else:
            lo = mid
    search.overrides = {**search.overrides, **{t: "float" for m in moves[:hi] for t in m.tensors}}
    for m in moves[:hi]:
        search.steps.append(_step(m, "float", best, kept=True))
    return best


def _report(layers, out_err: float, ranked, content: bytes, quantized: bytes):
    """The per-layer analysis the search ranked by, with each island's measured leave-one-out error."""
    from optimize.core.results import DebugReport

    measured = {move.head: err for err, move in ranked}
    layers = [le.model_copy(update={"output_error_without": measured.get(le.tensor)}) for le in layers]
    return DebugReport(
        scheme="int8",
        samples=32,
        method=debug.METHOD + "; ranked by the selective search's own leave-one-out evaluations",
        output_error=out_err,
        layers=debug.rank(layers),
        kept_float=debug.kept_float(content, quantized),
    )


def _summary(search: _Search, first: float, final: float, size: int, float_size: int) -> str:
    b = search.budget
    shown = list(search.overrides.items())
    raised = ", ".join(f"{t} ({w})" for t, w in shown[:6]) or "none"
    raised += f", ... ({len(shown) - 6} more)" if len(shown) > 6 else ""
    verdict = "meets" if b.meets(final) else "does not meet"
    return (
        f"selective: on {b.held_out or f'{count(b.xs)} validation samples'} (not the test split the table "
        f"reports): full int8 {b.describe(first)}; raised {len(search.overrides)} op(s) [{raised}] -> "
        f"{b.describe(final)} at {size / float_size:.2f}x the float32 size; {verdict} the budget "
        f"({b.describe(b.limit)}) after {search.evals} evaluation(s)."
    )

"""Typed result records shared by every part of optimize: one candidate record, one study document.

These are pure pydantic models (no TensorFlow). A study is what `sweep` writes as `study.json`, what
the recommender ranks, what the report draws and what the notebooks load.
Units are in the field names; fractions are 0..1.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SerializeAsAny, ValidationError, model_validator

from optimize.core.bounded import loads_json
from optimize.core.errors import StudyError, from_validation
from optimize.core.paths import read_bounded, write_atomic
from optimize.core.registry import Params
from optimize.core.vocab import Backend, Delegate, Objective, Precision, Scheme, Task

SCHEMA_VERSION = 1
#: Fewer samples than this make a fidelity or accuracy figure rough: it is flagged wherever it is used.
FEW_SAMPLES = 32
#: The longest text any field of a record holds (a converter's log in `error_detail` is the longest a sweep
#: writes): a study from elsewhere with more in one string is refused, not drawn (issue 41).
MAX_TEXT = 1 << 20
#: Plain file-name tokens: a recipe's name becomes `<name>.tflite` inside the output folder, and names its
#: candidate; a study's candidate names are held to it too, at most 120 characters.
NAME_PATTERN = r"^[A-Za-z0-9_-][A-Za-z0-9._-]*$"


class Record(BaseModel):
    """Base for every record: frozen, and unknown fields are errors (hand-edited nonsense is caught).

    Its repr is short enough to read at a prompt: fields left at their default are left out, nested
    records, lists and dicts are summarised (`[11 Candidate]`), long text is cut. The whole record is
    `model_dump_json(indent=2)`; the terminal rendering is in `optimize.present.report_text`.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", str_max_length=MAX_TEXT)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={_brief(v, 1)}' for k, v in self._set_fields())})"

    __str__ = __repr__

    def _set_fields(self):
        for name, field in type(self).model_fields.items():
            value = getattr(self, name)
            if field.is_required() or value != field.default:
                yield name, value


def _brief(value, depth: int) -> str:
    """One field's value in a record's repr: nested records one level deep, collections counted."""
    from enum import Enum

    if isinstance(value, Record):
        return _brief_record(value, depth)
    if isinstance(value, Enum):
        return repr(value.value)
    if isinstance(value, list | tuple | dict):
        return _brief_collection(value)
    if isinstance(value, str) and len(value) > 60:
        return repr(value[:57] + "...")
    return f"{value:.6g}" if isinstance(value, float) else repr(value)


def _brief_record(value: Record, depth: int) -> str:
    if depth <= 0:
        return f"{type(value).__name__}(...)"
    parts: list[str] = []
    for k, v in value._set_fields():
        part = f"{k}={_brief(v, depth - 1)}"
        if parts and sum(len(p) + 2 for p in parts) + len(part) > 100:
            parts.append("...")
            break
        parts.append(part)
    return f"{type(value).__name__}({', '.join(parts)})"


def _brief_collection(value: list | tuple | dict) -> str:
    """Short plain collections as they are; others as a count and kind (`[11 Candidate]`), dicts with keys."""
    items = list(value.values() if isinstance(value, dict) else value)
    text = repr(value) if all(isinstance(v, str | int | float | bool) for v in items) else ""
    if text and len(text) <= 80:
        return text
    kinds = sorted({type(v).__name__ for v in items})
    what = f"{len(items)} {kinds[0]}" if len(kinds) == 1 else f"{len(items)} items"
    if isinstance(value, dict):
        keys = ", ".join(map(str, list(value)[:6])) + (", ..." if len(value) > 6 else "")
        return "{" + f"{what}: {keys}" + "}"
    return f"[{what}]"


class Size(Record):
    bytes: int = Field(description="Raw .tflite file size.")
    gzip_bytes: int = Field(description="Size after gzip -9: what a download or app bundle costs.")


class Latency(Record):
    """Host-CPU latency in the LiteRT interpreter. Not a device figure: it says where it came from."""

    runtime: str = Field(description="Interpreter and version, e.g. 'ai-edge-litert 2.3.0 (host CPU)'.")
    threads: int
    xnnpack: bool = Field(description="Whether the default XNNPACK delegate was applied.")
    warmup_runs: int
    runs: int
    init_ms: float = Field(description="Interpreter construction + allocate_tensors.")
    first_ms: float = Field(description="First invoke (includes lazy kernel preparation).")
    mean_ms: float
    std_ms: float
    p50_ms: float
    p25_ms: float | None = Field(None, description="Lower quartile of single runs.")
    p75_ms: float | None = None
    p90_ms: float
    min_ms: float
    rounds: int | None = Field(
        None,
        description="Timing rounds: each round times every candidate of the study in turn (round-robin), so "
        "machine drift hits all alike. None: the runs were timed one after another (an older record).",
    )
    round_p50s_ms: list[float] = Field(default_factory=list, description="The median of each round, in order.")
    p50_low_ms: float | None = Field(
        None,
        description="Interval for p50 over the rounds (about 95%): two candidates differ only when theirs separate.",
    )
    p50_high_ms: float | None = None
    session: str | None = Field(
        None,
        description="The timing session: candidates timed in the same rounds share it and are compared round by "
        "round (the ratio of their round medians), which cancels drift between rounds.",
    )
    seconds: float | None = Field(
        None, description="Wall time spent timing this model: its blocks, each interpreter's build included."
    )
    timed: str | None = Field(
        None, description="When it was timed (UTC, ISO 8601): a cached candidate's latency is its first run's."
    )

    @property
    def spread(self) -> float | None:
        """The half-width of the p50's interval over p50 (0.04: ±4%), or None without an interval."""
        lo, hi = self.interval
        return max(self.p50_ms - lo, hi - self.p50_ms) / self.p50_ms if self.p50_ms > 0 and hi > lo else None

    @property
    def interval(self) -> tuple[float, float]:
        """Where p50 lies: the interval over rounds, else the quartiles of single runs, else p50 alone."""
        if self.p50_low_ms is not None and self.p50_high_ms is not None:
            return self.p50_low_ms, self.p50_high_ms
        if self.p25_ms is not None and self.p75_ms is not None:
            return self.p25_ms, self.p75_ms
        return self.p50_ms, self.p50_ms


class Memory(Record):
    """Peak resident memory of a fresh process that loads, allocates and runs the model once."""

    peak_rss_bytes: int = Field(description="Peak RSS growth over the bare runtime import.")
    method: str = Field(default="child process: VmHWM after one run minus VmRSS after importing the runtime")


class SliceError(Record):
    """One slice of an output (channels along its feature axis) against the same slice of the reference: an
    output whose channels carry quantities of different scales (boxes beside scores) is measured per slice."""

    name: str = Field(description="What the slice holds: 'boxes', 'scores', or 'channels 4-14'.")
    axis: int = Field(description="The output's axis the channels are on (batch is 0).")
    channels: str = Field(description="The channels, in runs: '0-3', '4-14'.")
    range: float = Field(description="The slice's range in the reference (max - min).")
    mean_abs_diff: float
    max_abs_diff: float
    relative_error: float = Field(description="mean |diff| over the slice's own range in the reference (0..1).")


#: Fewer of float32's detections than this make a share kept rough (optimize.measure.detection.FEW_DETECTIONS).
FEW_DETECTIONS = 20


class DetectionFidelity(Record):
    """A detector's detections against float32's on the same inputs: each of float32's detections (score at
    least `score_threshold`, after per-class non-maximum suppression for decoded boxes) is kept when the
    candidate has one of the same class overlapping it at IoU >= `iou_threshold` (for a raw anchor head: at the
    same anchor) scoring at least the same threshold: no margin, a copy scoring just under it is not shipped."""

    layout: str = Field(
        description="The head (optimize.measure.layouts): postprocessed (boxes, classes, scores, count), scored "
        "(boxes, scores, count: one class), end2end "
        "([1, K, 6]), yolo ([1, 4+C, N] or [1, N, 4+C]), yolov5, ssd (boxes + scores) or anchors."
    )
    outputs: list[str] = Field(description="The outputs that hold the boxes and scores.")
    score_threshold: float
    iou_threshold: float = 0.5
    reference_detections: int = Field(description="Detections float32 makes on the samples.")
    kept: int = Field(description="Of those, the ones the candidate makes too (same class, IoU >= threshold).")
    extra: int = Field(0, description="The candidate's detections float32 does not make.")
    mean_iou: float | None = Field(None, description="Mean IoU of the kept detections with float32's.")
    samples_with_detections: int | None = Field(None, description="Samples on which float32 detects anything.")
    sample_kept: float | None = Field(
        None,
        description="The share kept on the worst samples: the 5th percentile of the per-sample shares, over the "
        "samples on which float32 detects anything (None: none).",
    )

    @property
    def kept_fraction(self) -> float | None:
        """Share of float32's detections kept (None when float32 detects nothing on the samples)."""
        return self.kept / self.reference_detections if self.reference_detections else None

    @property
    def few(self) -> bool:
        """Float32 detects too little on the samples (under 20) for the share kept to be more than rough."""
        return self.reference_detections < FEW_DETECTIONS


class OutputFidelity(Record):
    """Per-output difference from the float reference, as TFLite's inference_diff reports it."""

    name: str
    mean_abs_diff: float
    std_abs_diff: float
    max_abs_diff: float
    relative_error: float | None = Field(
        None,
        description="mean |diff| over the reference output's range (0..1); for an output measured in slices, the "
        "worst slice's (each over its own range).",
    )
    slices: list[SliceError] = Field(
        default_factory=list,
        description="The output's slices when its channels carry quantities of different scales (else none).",
    )
    tensor_relative_error: float | None = Field(
        None, description="With slices: mean |diff| over the whole output's range (one figure for the tensor)."
    )
    detection: DetectionFidelity | None = Field(
        None, description="On a detector head's outputs: its detections kept against float32's (judged by them)."
    )
    iou: float | None = Field(None, description="For mask outputs: IoU of the two masks thresholded at 0.5.")
    sample_iou: float | None = Field(
        None, description="For mask outputs: the worst samples' IoU (5th percentile of the per-sample IoUs)."
    )
    nonfinite_samples: int = Field(
        0, description="Samples where this output is NaN/inf and the reference's is not (left out of the figures)."
    )
    top1_agreement: float | None = Field(
        None, description="Fraction of samples whose argmax matches the reference's (class outputs only)."
    )
    decision_agreement: float | None = Field(
        None,
        description="Sigmoid (yes/no, multi-label) outputs: fraction of the decisions at 0.5, every unit of every "
        "sample, that match the reference's.",
    )
    exact_agreement: float | None = Field(
        None,
        description="Outputs of class ids or counts (an ArgMax, an integer output, a post-processing op's classes "
        "and count outside a recognised detector): share of values equal to the reference's (their only figure).",
    )
    labelled: bool = Field(
        False, description="The output the labels score: judged by its accuracy; every other output by fidelity."
    )

    @property
    def agreement(self) -> float | None:
        """What an agreement goal (min_agreement) reads: top-1 agreement of classes, else decisions at 0.5, else
        the exact agreement of class ids or counts."""
        if self.top1_agreement is not None:
            return self.top1_agreement
        return self.decision_agreement if self.decision_agreement is not None else self.exact_agreement


class Fidelity(Record):
    """Every output against the float reference. The figures a goal or the guard reads are the worst output's:
    a candidate is as good as the output it breaks most, labelled or not."""

    reference: str = Field(description="Artifact the outputs were compared with (the float32 baseline).")
    samples: int
    outputs: list[OutputFidelity]
    top1_agreement: float | None = Field(
        None, description="Fraction of samples whose argmax matches: the worst class output's (class outputs only)."
    )

    @property
    def detection(self) -> DetectionFidelity | None:
        """A detector's detections kept against float32's (on the outputs of its head), or None."""
        return next((o.detection for o in self.outputs if o.detection is not None), None)

    @property
    def few_samples(self) -> bool:
        """Compared on fewer than FEW_SAMPLES samples: a rough figure, and said so wherever it is shown."""
        return self.samples < FEW_SAMPLES

    @property
    def relative_error(self) -> float | None:
        """The worst output's relative error: what a label-free goal is judged on."""
        errs = [o.relative_error for o in self.outputs if o.relative_error is not None]
        return max(errs) if errs else None

    def judged(self, unlabelled_only: bool = False) -> list[OutputFidelity]:
        """The outputs judged by fidelity: every one, or (`unlabelled_only`) those the labels do not score."""
        return [o for o in self.outputs if not (unlabelled_only and o.labelled)]

    def worst(self, unlabelled_only: bool = False) -> OutputFidelity | None:
        """The judged output furthest from the reference (by relative error), or None when none was measured."""
        outs = [o for o in self.judged(unlabelled_only) if o.relative_error is not None]
        return max(outs, key=lambda o: o.relative_error) if outs else None

    def least_agreeing(self, unlabelled_only: bool = False) -> OutputFidelity | None:
        """The judged output with the lowest agreement (top-1 for classes, decisions at 0.5 for sigmoid
        outputs), or None when no judged output has one. (A study written before agreement was measured per
        output has it only on the first output.)"""
        outs = [o for o in self.judged(unlabelled_only) if o.agreement is not None]
        if not outs and self.top1_agreement is not None and self.outputs and not any(o.labelled for o in self.outputs):
            return self.outputs[0].model_copy(update={"top1_agreement": self.top1_agreement})
        return min(outs, key=lambda o: o.agreement) if outs else None


class Accuracy(Record):
    """The task's own figures on labelled data, for the output the labels belong to."""

    samples: int
    task: Task = Task.CLASSIFICATION
    output: str | None = Field(None, description="The output the labels belong to.")
    top1: float | None = Field(None, description="Classification: top-1; binary/multi-label: accuracy at 0.5.")
    topk: float | None = None
    k: int | None = None
    auc: float | None = Field(None, description="Binary: area under the ROC curve.")
    mae: float | None = Field(None, description="Regression: mean absolute error, in the target's units.")
    rmse: float | None = Field(None, description="Regression: root mean squared error, in the target's units.")


class TargetFidelity(Fidelity):
    """Fidelity to float32 (and accuracy, with labels) as a target's hardware computes the candidate, where its
    arithmetic differs from the CPU's: the GPU dequantizes weights and computes in float (float16 for a float16
    model), the CPU's hybrid kernels quantize activations on the fly. Emulated on the CPU, or observed on the
    device."""

    method: Literal["emulated", "observed"] = Field(
        description="emulated: a copy in the target's arithmetic run by the CPU interpreter; observed: run on it."
    )
    how: str = Field("", description="What was run, in a line (the emulation's rewrite, or the device).")
    accuracy: Accuracy | None = None
    accuracy_delta: float | None = Field(None, description="Top-1 minus the float baseline's (CPU float32).")
    error_ratio: float | None = Field(None, description="Regression: MAE over the float baseline's (CPU float32).")
    flagged: str | None = Field(None, description="Why the target computes this candidate badly, when it does.")
    latency: Latency | None = Field(
        None, description="Latency on the target, where it was timed there (observed: --observe gpu on a device)."
    )


class OnTarget(Record):
    """Per target whose arithmetic is not the CPU's, the candidate's quality as that target computes it."""

    gpu: TargetFidelity | None = None


class TestSample(Record):
    """Which test samples a candidate's accuracy and fidelity were measured on: the whole test split (the
    default), or a sample of it: stratified (random within each class, each class at its share of the split)
    where the labels are classes, else at random; seeded, so every candidate of a study gets the same one."""

    samples: int = Field(description="Test samples every figure of the candidate is measured on.")
    of: int = Field(description="Samples in the test split.")
    method: Literal["whole", "stratified", "shuffled"] = "whole"
    why: str = Field("", description="Why a sample and not the whole split: the cap asked for, or the memory bound.")

    def words(self) -> str:
        """`all 600 test samples`, `500 of 10,000 test samples (a stratified sample: --test-samples 500)`."""
        if self.method == "whole" or self.samples >= self.of:
            return f"all {self.of:,} test samples"
        how = "a stratified sample" if self.method == "stratified" else "a random sample"
        return f"{self.samples:,} of {self.of:,} test samples ({how}{': ' + self.why if self.why else ''})"


class Metrics(Record):
    size: Size
    accuracy: Accuracy | None = None
    accuracy_delta: float | None = Field(
        None, description="Classification/binary: top-1 minus the float baseline's (negative is worse)."
    )
    error_ratio: float | None = Field(None, description="Regression: MAE over the float baseline's MAE (1.0 = same).")
    fidelity: Fidelity | None = None
    latency: Latency | None = None
    memory: Memory | None = None
    memory_error: str | None = Field(None, description="Why peak memory could not be measured, when it could not.")
    on_target: OnTarget | None = Field(
        None, description="Quality as each target whose arithmetic differs from the CPU's computes it (gpu)."
    )
    test: TestSample | None = Field(
        None, description="The test samples accuracy and fidelity were measured on (None: no data, or an older study)."
    )


class ProbeFailure(Record):
    """One probe input a candidate fails on while its float model handles it."""

    input: str = Field(description="The probe input: 'all-zero input', 'calibrated maximum (0.98)', ...")
    kind: Literal["invoke", "non-finite"] = Field(description="It failed to invoke, or gave NaN/inf outputs.")
    node: int | None = Field(None, description="The node the runtime named (its index in the main subgraph).")
    op: str | None = Field(None, description="The op the runtime named (DIV, ...).")
    message: str = Field("", description="The kernel's own message, or which outputs were not finite.")

    @property
    def line(self) -> str:
        """`fails on all-zero input: DIV node 6 (div.cc:262 data[i] != zero_point was not true)`."""
        if self.kind == "non-finite":
            return f"gives non-finite outputs on {self.input} ({self.message})"
        where = f"{self.op} node {self.node}" if self.op is not None and self.node is not None else ""
        detail = f"{where} ({self.message})" if where and self.message else where or self.message
        return f"fails on {self.input}: {detail}" if detail else f"fails on {self.input}"


class Probe(Record):
    """The robustness probe (optimize.measure.probe): the candidate run on edge inputs its float model handles."""

    inputs: list[str] = Field(description="The probe inputs tried, in order.")
    reference: str | None = Field(None, description="The float model the outcomes were compared with.")
    failures: list[ProbeFailure] = Field(default_factory=list, description="Inputs it fails on where float does not.")
    reference_failures: list[str] = Field(
        default_factory=list, description="Inputs the float model itself fails on (not held against the candidate)."
    )

    @property
    def ok(self) -> bool:
        return not self.failures

    @property
    def line(self) -> str:
        """The first failure in one line, with how many more; `passed` when there is none."""
        if not self.failures:
            return f"passed ({len(self.inputs)} inputs)"
        more = len(self.failures) - 1
        rest = f" (and {more} more: {', '.join(f.input for f in self.failures[1:4])})" if more else ""
        return self.failures[0].line + rest


class NodeVerdict(Record):
    """One operator that a delegate does not take, with the delegate's own reason."""

    subgraph: int = 0
    index: int
    op: str
    version: int
    reason: str
    code: str | None = Field(None, description="The reason as a code (optimize.delegates.rules.Reason).")


class DelegateReport(Record):
    """What one delegate would do with one model."""

    delegate: Delegate
    source: Literal["rules", "runtime", "rules+runtime"] = Field(
        description="'rules': predicted from the delegate's acceptance rules; 'runtime': observed."
    )
    rules_version: str = Field("", description="Which source the rules follow (file and release).")
    params: dict[str, str | int | float | bool | None] = Field(default_factory=dict)
    nodes_total: int
    nodes_delegated: int
    partitions: int
    verdict: Literal["full", "partial", "none"]
    cpu_nodes: list[NodeVerdict] = Field(default_factory=list)
    hints: list[str] = Field(default_factory=list)
    transposes: int = Field(0, description="TRANSPOSE ops in the model, each a copy of its tensor.")
    layout_transposes: int = Field(
        0,
        description="Of them, layout changes (NCHW <-> NHWC) a converter left; the rest reorder other axes (the "
        "heads of multi-head attention, say): the model's own computation.",
    )
    vetoed: str | None = Field(None, description="Why the whole model stays on the CPU, if it does.")
    veto_code: str | None = Field(None, description="The veto as a code (optimize.delegates.rules.Reason).")
    cpu_tail: list[str] = Field(
        default_factory=list,
        description="When every node the delegate leaves is the model's trailing post-processing "
        "(TFLite_Detection_PostProcess, NMS and what follows it: optimize.delegates.tail), those ops: the body runs "
        "on the delegate, the tail on the CPU, as shipped detectors run.",
    )
    nodes_accepted: int | None = Field(
        None,
        description="When only the delegate's build fails: the nodes it accepted node by node, which it would run "
        "but for that failure (optimize.delegates.blocking).",
    )

    @property
    def runs_with_tail(self) -> bool:
        """The delegate runs every node but an expected CPU tail."""
        return self.verdict != "full" and bool(self.cpu_tail)


class OutputContract(Record):
    """How a candidate's outputs differ from float32's by design (optimize.transforms.tflite.yolo_head: a raw
    YOLO head's boxes normalised by the input's size, so one int8 output holds boxes and scores): what a user of
    the file must do to read them as before. The measure undoes it before comparing with float32."""

    output: str = Field(description="The output whose contract changed (its name, as the file's signature has it).")
    position: int = Field(0, description="Its position among the outputs, in signature order.")
    axis: int = Field(description="The axis its channels are on (batch first).")
    channels: list[int] = Field(description="The channels that changed (the boxes: 0-3).")
    multiply_by: list[float] = Field(description="Multiply each channel by this to read it as float32 gave it.")
    words: str = Field(description="The change in words, as the summary and the report say it.")

    def restore(self, outs: list, position: int | None = None) -> list:
        """The outputs (arrays, samples first) read as float32 gave them: the changed channels multiplied back."""
        import numpy as np

        i = self.position if position is None else position
        a = np.array(outs[i], dtype=np.float32, copy=True)
        where = [slice(None)] * a.ndim
        for c, m in zip(self.channels, self.multiply_by):
            where[self.axis] = c
            a[tuple(where)] *= m
        return [*outs[:i], a, *outs[i + 1 :]]


class Composition(Record):
    """What an artifact holds, read back from its flatbuffer (optimize.measure.verify)."""

    weight_bytes: dict[str, int] = Field(description="Constant weight bytes by dtype (float32, float16, int8, ...).")
    float32_equivalent_bytes: int = Field(description="The same weights stored as float32.")
    float_ops: int = Field(description="Ops that still compute in float with float weights.")
    float_op_types: list[str] = Field(default_factory=list)
    float_compute_ops: list[str] = Field(
        default_factory=list,
        description="Op types that compute on float tensors (any weights; QUANTIZE/DEQUANTIZE aside): what an "
        "integer-only target (microcontroller, Edge TPU, Hexagon, NNAPI's int path) cannot run; a detector's "
        "post-processing tail aside (`tail_ops`).",
    )
    tail_ops: list[str] = Field(
        default_factory=list,
        description="Op types of the detector's post-processing tail (TFLite_Detection_PostProcess, NMS, TopK and "
        "what only feeds or follows them) that compute in float: run on the CPU after the integer body, as "
        "shipped detectors run; not counted in `float_compute_ops`.",
    )
    sparsity: float | None = Field(None, description="Share of zeros across the big weight tensors.")
    sparsity_by_weight: dict[str, float] = Field(
        default_factory=dict, description="Share of zeros of each of the largest weight tensors, by tensor name."
    )
    float_weights: list[str] = Field(
        default_factory=list,
        description="The ops still computing with float weights, largest weights first: `OP 'tensor' (N weights)`.",
    )
    distinct_values: int | None = Field(
        None, description="Distinct values in the median big weight tensor (per output channel when quantized)."
    )
    largest_weight: int = Field(0, description="Elements of the largest weight tensor.")
    compute_ops: int = Field(
        0, description="Ops that compute (QUANTIZE, DEQUANTIZE and shape reads aside), all subgraphs."
    )
    float_compute_count: int = Field(
        0, description="Of those, the ops that read or write a float tensor (`float_compute_ops` counted per op)."
    )
    conversions: int = Field(0, description="QUANTIZE and DEQUANTIZE ops: the edges of the model and of its islands.")

    @property
    def shrink(self) -> float:
        """Weight bytes over their float32 equivalent: 0.5 is float16, 0.25 is int8."""
        return sum(self.weight_bytes.values()) / self.float32_equivalent_bytes if self.float32_equivalent_bytes else 1.0


class TensorContract(Record):
    """One input or output of a shipped .tflite as the caller must feed or read it, read from the file itself
    (issue 43): a tensor quantized to integers is fed `round(x / scale) + zero_point` and read back as
    `(q - zero_point) * scale`."""

    name: str = Field(description="The tensor's name in the file (the signature's key where it has one).")
    dtype: str = Field(description="What the caller hands over or gets back: float32, int8, uint8, int32, ...")
    shape: list[int] = Field(description="Its shape; -1 where the file leaves a dimension free (the batch).")
    scale: float | None = Field(None, description="Integer tensors: the float value of one step (per tensor).")
    zero_point: int | None = Field(None, description="Integer tensors: the integer that stands for 0.0.")
    range: list[float] | None = Field(
        None, description="The float values it stands for: [low, high] (for an input, what it expects)."
    )
    range_from: Literal["quantization", "data"] | None = Field(
        None,
        description="quantization: what scale and zero point can represent; data: the range of the data the "
        "model was measured on (a float tensor's file says no range).",
    )


class IOContract(Record):
    """How to feed a candidate's file and read its answers, read back from the artifact (never from what the
    recipe meant to make), and what TFLite metadata the file carries."""

    inputs: list[TensorContract]
    outputs: list[TensorContract]
    metadata: str | None = Field(
        None,
        description="The TFLite metadata in the file (a ModelMetadata flatbuffer named TFLITE_METADATA, as "
        "Android's Task Library and MediaPipe Tasks read it), in a line; None: none.",
    )


class FloatIsland(Record):
    """An op of a quantized candidate that does not run at the scheme's precision, and why it is there."""

    op: str
    tensor: str = Field(description="The op's output tensor (how per-op overrides address it).")
    precision: Precision = Field(
        description="float: kept float; int16: 16-bit activations; int8: kept integer by an exact fix (a DIV's "
        "divisor clamped to one step)."
    )
    reason: str = Field(description="Why: what failed quantized, or that the quantizer has no integer version of it.")
    weight_bytes: int = Field(0, description="Bytes of float weights the op keeps (its size cost).")


class Repair(Record):
    """How a quantized candidate that failed to run (to load, to invoke, or finitely) was made to run: the
    failure rescue (optimize.transforms.tflite.repair)."""

    route: str = Field(description="Who made the variants: LiteRT Quantizer or the TFLite calibrator.")
    rounds: int = Field(description="Failures fixed, one per round.")
    seconds: float = Field(description="Time spent on the rescue.")
    failures: list[str] = Field(default_factory=list, description="What failed, round by round.")
    islands: list[FloatIsland] = Field(default_factory=list, description="The fixes, in order.")


class LayerError(Record):
    """One quantized op's output compared with the float model's same tensor, on the same samples.

    The statistics TFLite's QuantizationDebugger reports per layer. `rmse_over_scale` near 0.289 is pure
    rounding (uniform noise of one step); well above ~0.7 points at clipping or a bad range.
    """

    op_index: int = Field(description="Index of the op in the quantized model's main subgraph.")
    op: str
    tensor: str = Field(description="The op's output tensor (its name is how recipes and overrides address it).")
    dtype: str = Field(description="The output's quantized type (int8, int16).")
    rmse: float
    rmse_over_scale: float | None = Field(None, description="RMSE in quantization steps of the output.")
    mean_abs_error: float
    max_abs_error: float
    relative_rmse: float = Field(description="RMSE over the float output's range (0..1 scale).")
    error_added: float = Field(
        description="relative_rmse minus the largest relative_rmse among the op's quantized inputs: what this op adds."
    )
    weight_share: float = Field(description="Fraction of the model's weight bytes held by this op.")
    output_error_without: float | None = Field(
        None, description="Model output error with everything quantized except this op (None: not tried)."
    )


class OutputStage(Record):
    """`optimize debug` on an output whose channels carry quantities of different scales (a detector's boxes and
    scores in one head): what quantizing the output stage (the last op that joins them, and the reshapes after
    it) costs, measured by keeping that stage float."""

    op: str = Field(description="The op that makes the output stage (CONCATENATION, ...).")
    op_index: int = Field(description="Its index in the quantized model's main subgraph.")
    tensors: list[str] = Field(description="The output stage's tensors kept float in the measurement.")
    slices: list[SliceError] = Field(description="Each slice of the output, fully quantized.")
    slices_float: list[SliceError] = Field(description="The same slices with the output stage kept float.")
    detections: DetectionFidelity | None = Field(None, description="A detector's detections kept, fully quantized.")
    detections_float: DetectionFidelity | None = Field(None, description="And with the output stage kept float.")

    @property
    def worst(self) -> float:
        return max((s.relative_error for s in self.slices), default=0.0)

    @property
    def worst_float(self) -> float:
        return max((s.relative_error for s in self.slices_float), default=0.0)


class DebugReport(Record):
    """Where a quantized model loses accuracy: every quantized op ranked, worst first."""

    scheme: Scheme
    samples: int
    method: str = Field(description="How the tensors were compared (which library facility).")
    output_error: float = Field(
        description="The worst output's mean |quantized - float| over the float output's range: the sweep's measure."
    )
    held_out: str = Field("", description="Which samples it was measured on, kept from the calibration.")
    layers: list[LayerError] = Field(description="Ranked: most harmful first.")
    kept_float: list[str] = Field(
        default_factory=list, description="Ops the quantizer left in float (unsupported), by op and tensor."
    )
    seconds: float = 0.0
    fixes: list[str] = Field(
        default_factory=list, description="The fix to try, from the ranking: what to change, and the command for it."
    )
    output_stage: OutputStage | None = Field(
        None, description="An output of several scales: its slices' error and what keeping its last stage float buys."
    )
    repaired: list[FloatIsland] = Field(
        default_factory=list,
        description="Ops kept out of the scheme before ranking, so the quantized model runs where the float model "
        "does (the failure rescue), each with why.",
    )


class SearchStep(Record):
    """One move of a selective-quantization search: an op taken up to a higher precision, and the result."""

    op: str
    tensor: str
    precision: Precision = Field(description="int8: an earlier move undone.")
    metric: float = Field(description="The budget's metric after this move (drop, error increase or output error).")
    size_bytes: int
    qdq_ops: int = Field(description="QUANTIZE and DEQUANTIZE ops in the model after this move (float-island cost).")
    kept: bool = Field(description="Whether the move was kept (it helped) or undone.")


class LayerChange(Record):
    """One layer's int8 error before and after a rescue step."""

    tensor: str = Field(description="The op's output tensor.")
    op: str
    before: float = Field(description="Error before the step (relative RMSE vs float, or the layer's output error).")
    after: float


class RescueStep(Record):
    """One accuracy-rescue step that keeps 8 bits: a function-preserving transform, a weight correction or an
    activation-range choice, tried before any op is raised to int16 or float (optimize.transforms.tflite.rescue)."""

    transform: str = Field(description="equalize, smooth, bias_correction, adaround or calibration:<method>.")
    detail: str = Field("", description="What it did, in a line.")
    metric: float | None = Field(None, description="The search budget's metric after it (None outside a search).")
    kept: bool = Field(True, description="Whether the step was kept (it helped) or undone.")
    layers: list[LayerChange] = Field(default_factory=list, description="Per-layer error before and after.")


class FitStep(Record):
    """One rewrite of the fit (optimize.transforms.tflite.fit) at one node a delegate refused: kept, or dropped
    with why."""

    rewrite: str = Field(description="The rewrite's name (mean-as-pool, flatten-into-dense, batch-axis, ...).")
    node: str = Field(description="The node it rewrote, as numbered when it ran ('#7 RESHAPE').")
    detail: str = Field("", description="What it did, in a few words.")
    targets: list[str] = Field(default_factory=list, description="The delegates that refused the node.")
    max_abs_diff: float | None = Field(None, description="The outputs' largest |change| on the samples after it.")
    relative_diff: float | None = Field(None, description="The same, as a fraction of each output's range.")
    kept: bool = True
    why: str | None = Field(None, description="Why it was dropped (None: kept).")


class FitRecord(Record):
    """What fitting the float graph to the targets did: each rewrite, and the targets it bought."""

    steps: list[FitStep] = Field(default_factory=list)
    bought: list[str] = Field(
        default_factory=list, description="Delegates that take all of the fitted float graph and not of the original."
    )
    samples: int = Field(0, description="Samples the outputs were compared on after each rewrite.")
    options: list[str] = Field(default_factory=list, description="Rewrites beyond the model's contract, as named.")

    @property
    def kept(self) -> list[FitStep]:
        return [s for s in self.steps if s.kept]


class Goals(Record):
    """What a user will accept. Accuracy drop is a fraction: 0.01 is one point of top-1. Finite numbers only."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    max_accuracy_drop: float | None = Field(None, ge=0, le=1, description="Classification: top-1 points, as 0..1.")
    max_error_increase: float | None = Field(
        None, ge=0, le=1000, description="Regression: at most this much worse MAE (0.05 = 5% worse)."
    )
    max_output_error: float | None = Field(
        None, gt=0, le=1, description="No labels needed: mean |diff| from float32 over the output range."
    )
    min_agreement: float | None = Field(None, ge=0, le=1, description="No labels needed: top-1 agreement.")
    min_detections_kept: float | None = Field(
        None, ge=0, le=1, description="Detectors: share of float32's detections kept (0.95 = at most 5% lost)."
    )
    min_mask_iou: float | None = Field(None, ge=0, le=1, description="Segmentation: mask IoU with float32's.")
    min_sample_kept: float | None = Field(
        None,
        ge=0,
        le=1,
        description="Detectors and segmenters, per sample: the worst samples' (5th percentile) detections kept or "
        "mask IoU with float32's, beside the pooled figure.",
    )
    max_size_bytes: int | None = Field(None, gt=0)
    max_latency_ms: float | None = Field(None, gt=0)
    max_slowdown: float | None = Field(
        None,
        ge=1,
        le=1000,
        description="cpu: the pick's p50 at most this many times float32's (None: not slower beyond the noise).",
    )
    objective: Objective = Objective.SIZE


class Step(Record):
    """One resolved pipeline step: a technique name and its own frozen params, defaults filled in.

    Raw params (a dict from TOML, the CLI or a study file) are parsed by the technique on the way in,
    so a step is typed from the recipe to `study.json` and back.
    """

    technique: str
    params: SerializeAsAny[Params]

    @model_validator(mode="before")
    @classmethod
    def _typed(cls, data):
        if not isinstance(data, dict):
            return data
        if "params" not in data:  # a flat TOML [[steps]] table: technique = "...", then its params
            data = {"technique": data.get("technique"), "params": {k: v for k, v in data.items() if k != "technique"}}
        name = data.get("technique")
        if not isinstance(name, str):
            raise ValueError(f"technique must be a technique's name, got {name!r}")
        from optimize.core import registry
        from optimize.core.errors import RecipeError

        try:
            params = registry.get(name).parse(data.get("params"))
        except RecipeError as e:
            raise ValueError(str(e)) from None  # located by the caller: "step 2: ..."
        return {**data, "params": params}

    @classmethod
    def of(cls, technique: str, **params) -> Step:
        """A step from a technique name and raw params: `Step.of("convert", scheme="int8")`."""
        return cls(technique=technique, params=params)

    @property
    def stage(self):
        """Where the step's technique works (`registry.Stage`: on the Keras model, converting, on the .tflite)."""
        from optimize.core import registry

        return registry.get(self.technique).stage

    def flat(self) -> dict:
        """`{"technique": ..., **params}`: the shape of a TOML [[steps]] table."""
        return {"technique": self.technique, **self.params.model_dump(mode="json")}


#: The phases a candidate's time is split into, in the order they run: fine-tuning (prune, cluster, QAT),
#: conversion, quantization, the accuracy and failure rescues (equalization, bias correction, learned rounding,
#: the selective search), reading the artifact back and copying it out, building its interpreter, the
#: robustness probe, accuracy and fidelity, the delegate checks, latency (its own timing blocks) and peak memory.
PHASES = (
    "train",
    "convert",
    "quantize",
    "rescue",
    "verify",
    "load",
    "probe",
    "accuracy",
    "delegates",
    "latency",
    "memory",
)


#: Techniques that fine-tune the model on the user's data: a candidate made with one is retrained.
RETRAINING = ("prune", "cluster", "qat", "finetune")
#: The sweep's training control: float32 fine-tuned the same way as its retrained candidates.
TRAINING_CONTROL = "float32-finetuned"


class Candidate(Record):
    """One optimized variant (or the float baseline): what was done, what it produced, what it measured."""

    name: str = Field(pattern=NAME_PATTERN, max_length=120)
    steps: list[Step]
    recipe_hash: str
    scheme: Scheme = Field(description="Numeric scheme of the final artifact: float32, float16, ...")
    backend: Backend | None = Field(None, description="What made the .tflite: 'converter' or 'litert'.")
    artifact: str | None = Field(None, description="Path of the .tflite, relative to the study file.")
    metrics: Metrics | None = None
    delegates: dict[str, DelegateReport] = Field(default_factory=dict)
    skipped_layers: list[str] = Field(
        default_factory=list, description="Layers a Keras technique could not wrap and left as they were."
    )
    notes: list[str] = Field(default_factory=list)
    composition: Composition | None = Field(None, description="What the artifact holds, read back from it.")
    debug: DebugReport | None = Field(None, description="Per-layer error analysis, when the candidate asked for it.")
    search: list[SearchStep] = Field(
        default_factory=list, description="A selective-quantization search's moves, in order."
    )
    rescue: list[RescueStep] = Field(
        default_factory=list,
        description="Accuracy-rescue steps that keep 8 bits (equalization, bias correction, learned rounding, "
        "ranges), in order.",
    )
    probe: Probe | None = Field(None, description="The robustness probe on edge inputs (None: not run).")
    islands: list[FloatIsland] = Field(
        default_factory=list,
        description="Ops of a quantized candidate not at its scheme's precision (float islands, 16-bit ops, exact "
        "integer fixes), each with why it is there and the float weights it keeps.",
    )
    repair: Repair | None = Field(
        None, description="The failure rescue, when the quantized model had to be made to run."
    )
    contract: IOContract | None = Field(
        None, description="How to feed the file and read its answers, and its TFLite metadata (read from the file)."
    )
    output_contract: OutputContract | None = Field(
        None,
        description="How this file's outputs differ from float32's by design (a YOLO head's boxes normalised by the "
        "input's size for an int8 output), and how to read them as before; its figures are after undoing it.",
    )
    fit: FitRecord | None = Field(
        None, description="The float graph's rewrites for its targets, when the candidate was made from a fitted graph."
    )
    seconds: float = Field(0.0, description="Wall time to produce and measure this candidate.")
    phases: dict[str, float] = Field(
        default_factory=dict,
        description="Where `seconds` went, per phase (PHASES, in that order; phases that did not run are left "
        "out): what each step and each measurement of this candidate cost.",
    )
    phase_bytes: dict[str, int] = Field(
        default_factory=dict,
        description="Peak resident memory of the process that ran each phase (bytes; the phases of `phases` it "
        "could read: production and measurement, not the timing after it).",
    )
    cached: bool = False
    node: str | None = Field(
        None, description="The machine (and cluster node) that timed this candidate: compare latencies within one."
    )
    error: str | None = Field(None, description="Why this candidate failed, in one line; the rest of the study stands.")
    error_kind: str | None = Field(
        None, description="The failure's class (TechniqueFailed, OSError, WorkerCrashed, ...): what the cache keys on."
    )
    error_detail: str | None = Field(None, description="The failure's full text (converter logs, ...), when longer.")

    @property
    def ok(self) -> bool:
        return self.error is None and self.metrics is not None

    @property
    def io(self) -> str:
        """The I/O type of the artifact: the last step that sets `io`, else float."""
        io = "float"
        for s in self.steps:
            io = getattr(s.params, "io", None) or io
        return str(io)

    @property
    def p50_ms(self) -> float | None:
        """Host-CPU p50 latency, when measured."""
        return self.metrics.latency.p50_ms if self.metrics and self.metrics.latency else None

    @property
    def accuracy_score(self) -> float | None:
        """Higher is better: the delta to the baseline when known, else top-1, else -MAE."""
        m = self.metrics
        if m is None:
            return None
        if m.accuracy_delta is not None:
            return m.accuracy_delta
        if m.error_ratio is not None:
            return 1 - m.error_ratio  # regression: 0 at float32's error, -0.1 at 10% worse
        if m.accuracy is not None and m.accuracy.top1 is not None:
            return m.accuracy.top1
        if m.accuracy is not None and m.accuracy.mae is not None:
            return -m.accuracy.mae
        return None

    def uses(self, *techniques: str) -> bool:
        return any(s.technique in techniques for s in self.steps)

    @property
    def retrained(self) -> bool:
        """Fine-tuned on the user's data (prune, cluster, QAT, finetune): its figures are a retrained model's, not
        the user's model compressed (issue 43), and it is judged by how far it moved from float32."""
        return self.uses(*RETRAINING)

    @property
    def control(self) -> bool:
        """The sweep's training control: the float model fine-tuned as the retrained candidates were, without
        compression (`TRAINING_CONTROL`): measured to tell training's gain from compression's, never shipped."""
        return self.name == TRAINING_CONTROL and self.uses("finetune") and not self.uses("prune", "cluster", "qat")

    @classmethod
    def failed(
        cls,
        recipe,
        error: BaseException | str,
        *,
        kind: str | None = None,
        detail: str | None = None,
        seconds: float = 0.0,
    ) -> Candidate:
        """The record of a recipe that produced nothing: the one place a failed candidate is built."""
        if isinstance(error, BaseException):
            kind = kind or type(error).__name__
            text = error_line(error)
            full = str(error).strip()
            detail = detail or (full if full and full != text else None)
        else:
            text = error
        text, detail = text[:MAX_TEXT], detail[:MAX_TEXT] if detail else detail
        return cls(
            name=recipe.name,
            steps=list(recipe.steps),
            recipe_hash=recipe.hash,
            scheme=recipe.scheme,
            backend=recipe.made_by,
            error=text,
            error_kind=kind,
            error_detail=detail,
            seconds=seconds,
        )


def labelled(cands: list[Candidate]) -> bool:
    """Whether any working candidate was scored against labels: the one test of "has this study labels?"
    (the guard, the table's columns, the legend and the plots' axis all ask it)."""
    return any(c.ok and c.metrics.accuracy is not None for c in cands)


def error_line(e: BaseException) -> str:
    """One line for a failure: the message of our own errors, else the class, its own message (under a framework's
    wrapper, what it wraps: `errors.reason`) and where."""
    import traceback

    from optimize.core.errors import OptimizeError, TechniqueFailed, reason

    if isinstance(e, (TechniqueFailed, OptimizeError)):
        return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    last = traceback.extract_tb(e.__traceback__)[-1] if e.__traceback__ else None
    where = f" (at {Path(last.filename).name}:{last.lineno})" if last else ""
    msg = reason(e) if str(e).strip() else ""
    return f"{e.__class__.__name__}: {msg}{where}"


class Split(Record):
    """How the data was split into train and test, and what the test split holds (issue 29: a split that
    put every sample of one class in the test part measured accuracy on that class alone)."""

    method: Literal["given", "stratified", "shuffled", "all"] = Field(
        description="given: x_train/x_test from the file; stratified: x/y split 80/20 at random within each "
        "class; shuffled: at random (labels that are not classes, or none); all: fewer than 5 samples, every "
        "split holds them all."
    )
    seed: int | None = Field(None, description="Seeds the random split (None: not split here).")
    train: int = Field(0, description="Training samples.")
    test: int = Field(0, description="Test samples.")
    test_classes: dict[str, int] = Field(
        default_factory=dict, description="Samples per class in the test split (labels that are classes)."
    )
    warnings: list[str] = Field(default_factory=list, description="What makes the test split a poor measure.")


class Dropped(Record):
    """Default recipes a sweep left out for this model, and why (never silently)."""

    recipes: list[str]
    reason: str


class ConvertedInput(Record):
    """One input of a PyTorch or ONNX model, and what the converted .tflite takes for it."""

    name: str = Field(description="The input's name in the source model (the data's x:<name> key).")
    key: str = Field(description="Its name in the .tflite signature: the same where it is a Python identifier.")
    source_shape: list[int] = Field(description="One call of the source model, in its own layout.")
    shape: list[int] = Field(default_factory=list, description="The .tflite input (batch first, 1).")
    sample_axis: Literal["batch", "whole"] = Field(
        "batch",
        description="batch: a data row is the input without its leading batch axis; whole: a row is the whole "
        "input (its batch axis is not first), which the .tflite takes with a leading axis of 1.",
    )
    dtype: str = "float32"
    layout: str = Field("", description="NCHW or NHWC for an image input (rank 4), else empty.")


class Conversion(Record):
    """How a PyTorch or ONNX model became the float .tflite every candidate starts from, and what that cost on
    the user's data: its own error against the source runtime, apart from any quantization error."""

    source: str = Field(description="onnx, pt2, or module (an nn.Module given in Python).")
    file: str = Field(description="The source file's name.")
    route: str = Field(description="What converted it (onnx2torch with our converters, torch.export, litert-torch).")
    layout: str = Field("source", description="source (NCHW as PyTorch and ONNX take images) or channels-last.")
    inputs: list[ConvertedInput] = Field(default_factory=list)
    outputs: list[str] = Field(default_factory=list, description="The .tflite's outputs, by the source's names.")
    channel_last_outputs: list[str] = Field(default_factory=list, description="Outputs made NHWC.")
    whole_outputs: list[str] = Field(
        default_factory=list,
        description="Outputs whose first axis is not a batch of 1 (a recurrent state): given a leading axis of 1.",
    )
    frozen: dict[str, float | int] = Field(
        default_factory=dict, description="Inputs that were one value in every sample, frozen into the graph."
    )
    facts: list[str] = Field(default_factory=list, description="What normalising and converting changed.")
    transposes: int = Field(0, description="TRANSPOSE ops the conversion left in the float .tflite.")
    seconds: dict[str, float] = Field(default_factory=dict, description="normalize, onnx2torch, export, convert.")
    cached: bool = Field(False, description="Taken from the conversion cache (made by an earlier run).")
    fidelity: Fidelity | None = Field(
        None, description="The float .tflite against the source runtime (ONNX Runtime or PyTorch) on test samples."
    )


class Environment(Record):
    python: str
    platform: str
    host: str
    cpu_count: int
    versions: dict[str, str]
    threads: int


class MemoryUse(Record):
    """What the run's process tree held while it worked (issue 44), and the budget its workers were admitted
    against: the sweep's process and every process it started, resident memory summed over them (pages a fork
    shares with its parent count in both: the sum errs high), its peak sampled from a thread."""

    peak_bytes: int = Field(ge=0, description="Peak of the process tree's resident memory (RSS summed), in bytes.")
    peak_pss_bytes: int | None = Field(
        None, ge=0, description="Peak of its proportional share (PSS summed: a page forks share counted once)."
    )
    sampled_every_s: float = Field(gt=0, description="How often the tree's memory was read.")
    budget_bytes: int | None = Field(
        None, ge=0, description="The memory budget workers were admitted against (None: not bounded, e.g. Ray)."
    )
    budget_stated: bool = Field(False, description="Stated with --max-memory; else what was free at the start.")


class Study(Record):
    """One baseline plus candidates: the single JSON document every part of optimize reads."""

    schema_version: int = SCHEMA_VERSION
    created: str
    model: str = Field(description="Model path or 'demo'.")
    model_fingerprint: str
    data: str | None = None
    task: Task | None = Field(None, description="What the labelled output is: classification, regression, ...")
    calibration_outside: dict[str, float] = Field(
        default_factory=dict,
        description="Per input: the share of test values outside the range the calibration samples cover.",
    )
    baseline: str = Field(
        "float32", pattern=NAME_PATTERN, max_length=120, description="Name of the baseline candidate."
    )
    environment: Environment
    executor: str = Field("local", description="What produced the candidates: 'local' (this machine) or 'ray'.")
    candidates: list[Candidate]
    dropped: list[Dropped] = Field(default_factory=list, description="Default recipes left out, with the reason.")
    open_seconds: float | None = Field(
        None, description="Opening the model and data, checking them against each other and planning the sweep."
    )
    seconds: float | None = Field(
        None,
        description="Wall time of the sweep, from opening the model to the finished study (parallel work "
        "overlaps: the candidates' own `seconds` can add up to more).",
    )
    split: Split | None = Field(None, description="How the data was split into train and test (None: no data).")
    conversion: Conversion | None = Field(
        None, description="A PyTorch or ONNX model: how it was converted, and the conversion's own error."
    )
    memory: MemoryUse | None = Field(None, description="What the run's process tree held at its peak, and its budget.")

    @property
    def float_reference(self) -> Candidate | None:
        """The float32 candidate latency is compared with: the baseline, else the fastest ok float32 one."""
        base = next((c for c in self.candidates if c.name == self.baseline and c.ok), None)
        if base is not None and base.p50_ms is not None:
            return base
        floats = [c for c in self.candidates if c.ok and c.scheme == "float32" and c.p50_ms is not None]
        return min(floats, key=lambda c: c.p50_ms) if floats else None

    @property
    def float_ms(self) -> float | None:
        """The float reference latency: the baseline's, else the fastest ok float32 candidate's."""
        base = next((c for c in self.candidates if c.name == self.baseline and c.ok), None)
        if base is not None and base.p50_ms is not None:
            return base.p50_ms
        floats = [c.p50_ms for c in self.candidates if c.ok and c.scheme == "float32" and c.p50_ms is not None]
        return min(floats) if floats else None

    def candidate(self, name: str) -> Candidate:
        for c in self.candidates:
            if c.name == name:
                return c
        raise KeyError(name)

    def to_json(self) -> str:
        return self.model_dump_json(indent=2)

    def save(self, path: str | os.PathLike) -> Path:
        """Written as `load_study` reads it back: text from a model (a tensor named with a NUL, in a converter's
        message) shown escaped in every one-line field, never refused by the reader (issue 41)."""
        return write_atomic(Path(path), self.one_lined().to_json().encode())

    def one_lined(self) -> Study:
        """This study with every control character in its candidates' one-line fields shown (`core.shown`)."""
        from optimize.core.shown import escape

        def line(value):
            return [escape(v) for v in value] if isinstance(value, list) else escape(value) if value else value

        fixed = [c.model_copy(update={k: line(getattr(c, k)) for k in ONE_LINE_FIELDS}) for c in self.candidates]
        return self.model_copy(update={"candidates": fixed})


MAX_STUDY_BYTES = 256 * 2**20  # a study of thousands of candidates is a few MiB
FRACTIONS = {
    "top1",
    "topk",
    "top1_agreement",
    "decision_agreement",
    "relative_error",
    "iou",
    "sparsity",
    "auc",
    "coverage",
}
PLAUSIBLE = (  # (how a numeric field's name ends, its unit, the largest value a real study can hold)
    ("bytes", "bytes", 2**48),
    ("_ms", "ms", 1e9),
    ("seconds", "seconds", 1e9),
    ("samples", "samples", 2**40),
)


def _is_number(v) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _numbers(value, where: str = ""):
    """Every number in a dumped record, with its dotted path; a list of numbers (a shape, a histogram) as its
    extremes and first non-finite value (`_extremes`): a study from elsewhere may hold millions of them, and
    one at a time they took a minute per ten million (issue 41)."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _numbers(v, f"{where}.{k}" if where else str(k))
    elif isinstance(value, list | tuple):
        if len(value) > 8 and all(map(_is_number, value)):
            yield from _extremes(value, where)
            return
        for i, v in enumerate(value):
            yield from _numbers(v, f"{where}.{i}")
    elif _is_number(value):
        yield where, value


def _extremes(values: list, where: str):
    """The items of a list of numbers that decide whether it is plausible: its first non-finite one, its least
    and its greatest (every item's path ends in its index, so one rule, a range, holds for them all)."""
    import numpy as np

    try:
        a = np.asarray(values, dtype=np.float64)
    except OverflowError:  # an integer beyond float64: looked at one by one
        yield from ((f"{where}.{i}", v) for i, v in enumerate(values))
        return
    odd = np.flatnonzero(~np.isfinite(a))
    picks = [int(odd[0])] if odd.size else [int(np.argmin(a)), int(np.argmax(a))]
    yield from ((f"{where}.{i}", values[i]) for i in picks)


def _implausible(where: str, v: float) -> str | None:
    """Why one number cannot come from a real measurement, or None."""
    if v != v or v in (float("inf"), float("-inf")):
        return f"{where} is {v}"
    leaf = where.rsplit(".", 1)[-1]
    parent = where.rsplit(".", 2)[-2] if where.count(".") >= 1 else ""
    if leaf in FRACTIONS or parent == "calibration_outside":
        return None if 0 <= v <= 1 else f"{where} is {v:g}, outside 0..1 (fractions are 0..1, not percent)"
    if leaf == "accuracy_delta":
        return None if -1 <= v <= 1 else f"{where} is {v:g}, outside -1..1 (a difference of two fractions)"
    for end, unit, top in PLAUSIBLE:
        if (leaf.endswith(end) or parent.endswith(end)) and not 0 <= v <= top:
            return f"{where} is {v:g} {unit}, outside 0..{top:g}"
    return None


def check_plausible(study: Study) -> str | None:
    """What makes a study impossible as a measurement (NaN, negative sizes, a top-1 of 57, no baseline)."""
    names = [c.name for c in study.candidates]
    if study.baseline not in names:
        return f"its baseline {study.baseline!r} is not among its candidates"
    for i, c in enumerate(study.candidates):
        for where, v in _numbers(c.model_dump(exclude={"steps"})):
            why = _implausible(where, v)
            if why:
                return f"candidate {i} ({c.name}): {why}"
    for where, v in _numbers(study.model_dump(include={"calibration_outside"})):
        why = _implausible(where, v)
        if why:
            return why
    return None


def load_study(path: str | os.PathLike) -> Study:
    """Read a study.json, with one clear error for a missing, foreign, hand-broken or impossible file."""
    p = Path(path)
    if p.is_dir():
        p = p / "study.json"
    fix = "Re-run `optimize sweep`, or pass the study.json it wrote."
    if not p.exists():
        raise StudyError(f"No study at {p}.", "Run `optimize sweep` first, or pass the study.json it wrote.")
    data = read_bounded(p, "study", StudyError, limit=MAX_STUDY_BYTES)
    raw = loads_json(data, str(p), StudyError, fix, noun="a JSON study")
    if not isinstance(raw, dict) or raw.get("schema_version") != SCHEMA_VERSION:
        found = raw.get("schema_version") if isinstance(raw, dict) else None
        raise StudyError(
            f"{p} has schema_version {found!r}; this optimize reads {SCHEMA_VERSION}.",
            "Re-run `optimize sweep` with this version.",
        )
    try:
        study = Study.model_validate(raw)
    except ValidationError as e:
        raise from_validation(
            e, Study, where=f"{p} is not a valid study: ", kind=StudyError, fix="Re-run `optimize sweep`."
        ) from None
    names = [c.name for c in study.candidates]
    twice = next((n for n in names if names.count(n) > 1), None)
    if twice is not None:  # every reader (report, recommend, the notebooks) addresses candidates by name
        raise StudyError(f"{p} has two candidates named {twice!r}.", "Re-run `optimize sweep`; do not hand-edit names.")
    why = check_plausible(study)
    if why:
        raise StudyError(f"{p} is not a real measurement: {why}.", "Re-run `optimize sweep`; do not edit its numbers.")
    why = check_one_line(study)
    if why:
        raise StudyError(f"{p} is not a study optimize wrote: {why}.", fix)
    return study


#: Candidate text printed on one line (names, errors, notes): a sweep writes none with a control character;
#: a hand-edited one would forge terminal lines (a `[[steps]]` block after "Chosen from measurements").
ONE_LINE_FIELDS = ("name", "artifact", "error", "error_kind", "notes", "skipped_layers")
_CONTROL = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f]")


def check_one_line(study: Study) -> str | None:
    """The first one-line text field of a study holding a control character (newline, escape), or None."""
    for i, c in enumerate(study.candidates):
        for key in ONE_LINE_FIELDS:
            value = getattr(c, key)
            for text in value if isinstance(value, list) else [value]:
                if isinstance(text, str) and _CONTROL.search(text):
                    return f"candidate {i}'s {key} holds the control character {_CONTROL.search(text).group()!r}"
    return None

"""What a model's output means, so each figure is the right one: classes, a yes/no, labels, values, or
something else (landmarks, boxes, masks).

`detect(output, y)` guesses the task from the output head (its width and final activation) and the
labels; `--task` overrides the guess. The metrics follow: top-1/top-k and agreement for classes;
accuracy at 0.5 and AUC for one sigmoid unit; per-label accuracy for multi-label; MAE and RMSE in the
target's units for regression; relative error (and IoU at 0.5 for masks) when there is nothing else.
Pure numpy: no TensorFlow.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from optimize.core.errors import DataError
from optimize.core.vocab import Task
from optimize.models import postprocess, runtime


@dataclass(frozen=True)
class Head:
    """An output as far as the task is concerned: its shape (batch first) and final activation."""

    shape: tuple[int, ...]
    activation: str | None = None  # "softmax", "sigmoid", "linear", ... (None: unknown)
    role: str | None = None  # what a detector's post-processing op writes there: boxes, classes, scores, count
    index: bool = False  # class ids or counts (an ArgMax, an integer output, the op's classes and count)

    @property
    def units(self) -> int:
        return int(np.prod([d for d in self.shape[1:] if d and d > 0])) if len(self.shape) > 1 else 1

    @property
    def is_mask(self) -> bool:
        return len(self.shape) == 4 and self.shape[-1] == 1 and self.activation in ("sigmoid", None)


def _is_binary(y: np.ndarray) -> bool:
    values = np.unique(y)
    return values.size <= 2 and set(values.tolist()) <= {0, 1}


def _integral(y: np.ndarray) -> bool:
    return np.issubdtype(y.dtype, np.integer) or bool(np.all(np.mod(y, 1) == 0))


def _from_head(head: Head) -> Task:
    if head.activation == "softmax":
        return Task.CLASSIFICATION
    if head.activation == "sigmoid":
        return Task.BINARY if head.units == 1 else (Task.OTHER if head.is_mask else Task.MULTILABEL)
    return Task.OTHER


def _from_labels(head: Head, y: np.ndarray) -> Task:
    y = np.asarray(y)
    if y.ndim == 1 and head.units > 1 and _integral(y):
        return Task.CLASSIFICATION
    binary_labels = y.ndim == 1 and _is_binary(y)
    if head.units == 1 and binary_labels and (head.activation == "sigmoid" or np.issubdtype(y.dtype, np.integer)):
        return Task.BINARY
    if y.ndim == 2 and y.shape[1] == head.units and head.activation == "sigmoid" and _is_binary(y):
        return Task.MULTILABEL
    return Task.REGRESSION


def detect(head: Head, y: np.ndarray | None, override: str | None = None) -> Task:
    """The task for one output: `override` when given, else a guess from the head and the labels."""
    if override:
        return Task(override)
    return _from_head(head) if y is None else _from_labels(head, y)


def check_labels(task: Task, head: Head, y: np.ndarray, where: str = "y") -> np.ndarray:
    """Labels that fit the task, or one clear line saying what is wrong with them."""
    y = np.asarray(y)
    if task is Task.CLASSIFICATION:
        if y.ndim == 2 and y.shape[1] == head.units and y.shape[1] > 1:
            raise DataError(
                f"{where} holds one-hot rows ({y.shape[1]} columns) for a {head.units}-class output.",
                "Store integer class ids (e.g. y.argmax(1)), one per sample.",
            )
        if y.ndim != 1 or not _integral(y):
            raise DataError(
                f"{where} has {'float' if y.ndim == 1 else f'{y.ndim}-D'} labels, but the model's output is "
                f"{head.units} classes.",
                "Store integer class ids, one per sample, or pass --task regression.",
            )
        if y.min() < 0 or y.max() >= head.units:
            raise DataError(
                f"{where} has class ids {int(y.min())}..{int(y.max())}; the model has {head.units} classes.",
                "Labels are class indices 0..classes-1.",
            )
        return y.astype(np.int64)
    if task in (Task.BINARY, Task.MULTILABEL) and not _is_binary(y):
        raise DataError(f"{where} is not 0/1 for a {task} output.", "Store 0/1 labels, or pass --task regression.")
    _check_width(y, head, where)
    return y


def check_some_class(y: np.ndarray, head: Head, where: str = "y", task: str | None = None) -> None:
    """Rows of 0/1 labels, one column per output unit (one-hot classes or multi-label), where no row has any
    class: nothing to train on or score against. One line, unless --task regression says zeros are the
    values."""
    y = np.asarray(y)
    if task is not None and Task(task) not in (Task.CLASSIFICATION, Task.MULTILABEL):
        return
    if y.ndim != 2 or y.shape[0] == 0 or y.shape[1] < 2 or y.shape[1] != head.units or not np.isfinite(y).all():
        return
    if not np.any(y):
        raise DataError(
            f"{where} has no class in any row: all {y.shape[0]} rows of {y.shape[1]} label columns are zeros.",
            "Store class ids (one per sample) or 0/1 rows with a 1 for each sample's class; pass --task "
            "regression if zeros are the values to learn.",
        )


def _check_width(y: np.ndarray, head: Head, where: str) -> None:
    """Labels with as many values per sample as the output has (a known output: one value for one unit)."""
    known = len(head.shape) > 1 and all(d and d > 0 for d in head.shape[1:])
    if not known:
        return
    per_sample = int(np.prod(y.shape[1:])) if y.ndim > 1 else 1
    if per_sample != head.units:
        raise DataError(
            f"{where} has {per_sample} value(s) per sample; the output it belongs to has {head.units}.",
            "Give integer class ids for a classifier, or one row per sample with the output's shape "
            "(labels for another output: y:<output>).",
        )


# ---------------------------------------------------------------------------------------------- metrics
def _auc(scores: np.ndarray, y: np.ndarray) -> float | None:
    """Area under the ROC curve (the rank statistic), or None when only one class is present."""
    pos, neg = scores[y == 1], scores[y == 0]
    if not len(pos) or not len(neg):
        return None
    order = np.argsort(np.concatenate([pos, neg]), kind="mergesort")
    ranks = np.empty(len(order))
    ranks[order] = np.arange(1, len(order) + 1)
    return float((ranks[: len(pos)].sum() - len(pos) * (len(pos) + 1) / 2) / (len(pos) * len(neg)))


def probabilities(out: np.ndarray, head: Head) -> np.ndarray:
    """Sigmoid outputs as they are; logits (no final sigmoid) squashed."""
    return out if head.activation == "sigmoid" else 1 / (1 + np.exp(-out.astype(np.float64)))


def output_kind(head: Head | None, task: str | None = None) -> Task | None:
    """What one output is, for judging it against float32: classes (a softmax head, or the labelled output of
    a classification task), yes/no decisions (a sigmoid head that is not a mask, or a binary/multi-label
    task), else values (None: no agreement applies). `task`: the labelled output's task, when this is it."""
    if task is not None:
        return None if Task(task) is Task.OTHER else Task(task)
    if head is None:
        return None
    if head.activation == "softmax":
        return Task.CLASSIFICATION
    if head.activation == "sigmoid" and not head.is_mask:
        return Task.BINARY if head.units == 1 else Task.MULTILABEL
    return None


def scores(task: Task, out: np.ndarray, y: np.ndarray, head: Head, k: int = 5) -> dict:
    """The task's figures for one output against its labels (fields of results.Accuracy), over the samples
    whose outputs are finite (a model that answers NaN has those samples counted in its fidelity instead)."""
    out = out[: len(y)]
    finite = np.isfinite(out.reshape(len(out), -1)).all(axis=1)
    out, y = out[finite], np.asarray(y)[: len(out)][finite]
    n = len(y)
    if n == 0:
        return {}
    if task is Task.CLASSIFICATION:
        logits = out.reshape(n, -1)
        k = min(k, logits.shape[1])
        top1 = float((logits.argmax(1) == y).mean())
        topk = float((np.argsort(-logits, axis=1)[:, :k] == y[:, None]).any(1).mean())
        return {"top1": top1, "topk": topk, "k": k}
    if task is Task.BINARY:
        p = probabilities(out.reshape(n), head)
        return {"top1": float(((p > 0.5).astype(np.int64) == y).mean()), "auc": _auc(p, y)}
    if task is Task.MULTILABEL:
        p = probabilities(out.reshape(n, -1), head)
        return {"top1": float(((p > 0.5) == (y.reshape(n, -1) > 0.5)).mean())}
    diff = out.reshape(n, -1).astype(np.float64) - np.asarray(y, np.float64).reshape(n, -1)
    return {"mae": float(np.abs(diff).mean()), "rmse": float(np.sqrt((diff**2).mean()))}


def relative_error(out: np.ndarray, ref: np.ndarray) -> float:
    """Mean |out - ref| over the reference's range: a unit-free error for any output."""
    ref = ref.astype(np.float64)
    span = float(ref.max() - ref.min()) or float(np.abs(ref).max()) or 1.0
    return float(np.abs(out.astype(np.float64) - ref).mean() / span)


def mask_iou(out: np.ndarray, ref: np.ndarray, threshold: float = 0.5) -> float | None:
    """Intersection over union of the two masks thresholded at 0.5 (None when both are empty)."""
    a, b = out > threshold, ref > threshold
    union = np.logical_or(a, b).sum()
    return float(np.logical_and(a, b).sum() / union) if union else None


def segmentation_iou(out: np.ndarray, ref: np.ndarray, head: Head | None = None) -> float | None:
    """Mean IoU of a segmentation map against the reference's: a one-channel mask thresholded at 0.5 (0 for
    logits), else the class per pixel (argmax over the channel axis: the last of NHWC, the first of NCHW's
    smaller) and IoU averaged over the classes either map uses."""
    if out.ndim < 3:
        return None
    axis = 1 if out.ndim == 4 and out.shape[1] < out.shape[-1] else out.ndim - 1
    if out.shape[axis] == 1:
        unit = float(ref.min()) >= 0 and float(ref.max()) <= 1
        return mask_iou(out, ref, 0.5 if unit else 0.0)
    a, b = out.argmax(axis), ref.argmax(axis)
    ious = []
    for c in np.union1d(np.unique(a), np.unique(b)):
        union = np.logical_or(a == c, b == c).sum()
        ious.append(np.logical_and(a == c, b == c).sum() / union)
    return float(np.mean(ious)) if ious else None


def heads(
    model: str | Path | bytes, runner: runtime.Runner | None = None, outputs: list[dict] | None = None
) -> list[Head]:
    """Each output's shape and final activation (the op producing it, looking through a DEQUANTIZE), in the
    order of the runner's outputs (or of `outputs`, the runtime's output details)."""
    from optimize.models.tflite import read_model

    sg = read_model(model).main
    producer = {o: op for op in sg.ops for o in op.outputs if o >= 0}
    by_index = {t.index: t for t in sg.tensors}
    roles = postprocess.roles((op.name, op.outputs) for op in sg.ops)
    out = []
    for d in runner.outputs if runner is not None else outputs or []:
        op = producer.get(d["index"])
        if op is not None and op.name in ("DEQUANTIZE", "QUANTIZE") and op.inputs:
            op = producer.get(op.inputs[0], op)
        shape = by_index[d["index"]].shape if d["index"] in by_index else tuple(d["shape"])
        out.append(_head_of(op, d, tuple(int(x) for x in shape), roles.get(d["index"])))
    return out


def _head_of(op, detail: dict, shape: tuple[int, ...], role: str | None) -> Head:
    """One output's Head from the op that makes it: its activation, its post-processing role, whether it holds
    indices."""
    act = {"SOFTMAX": "softmax", "LOGISTIC": "sigmoid"}.get(op.name if op else "", "linear")
    return Head(shape, act, role, role in ("classes", "count") or _index_output(op, detail))


#: Ops whose output is an index (a class id, a position), not a value.
INDEX_OPS = ("ARG_MAX", "ARG_MIN")


def _index_output(op, detail: dict) -> bool:
    """Whether an output holds indices or counts: made by an ArgMax/ArgMin, or of an integer type that is not a
    quantized value (no scale). A TopK's indices are integers too."""
    if op is not None and op.name in INDEX_OPS:
        return True
    scale = (detail.get("quantization") or (0.0, 0))[0]
    return bool(np.issubdtype(detail["dtype"], np.integer)) and not scale


def _head(model, i: int):
    """The Keras model's i-th output as a task Head: its shape and its final activation."""
    from optimize.models.tasks import Head

    layer = model.get_layer(model.output_names[i]) if hasattr(model, "output_names") else model.layers[-1]
    shape = tuple(-1 if d is None else int(d) for d in model.outputs[i].shape)
    return Head(shape, activation_name(layer))


def activation_name(layer) -> str | None:
    """A Keras layer's final activation by name (`softmax`, `sigmoid`, `linear`, ...; None: unknown), seen
    through tfmot's wrappers (prune, cluster, quantize keep the layer inside) and through the
    QuantizeAwareActivation that QAT puts in place of a layer's activation (its `__name__` is not the
    activation's: read as it was, a softmax output looked like logits)."""
    inner = layer
    while hasattr(inner, "layer"):  # a tfmot wrapper keeps the layer inside
        inner = inner.layer
    if type(inner).__name__ == "Softmax":  # the layer, not an activation argument
        return "softmax"
    act = getattr(inner, "activation", None)
    while act is not None and not hasattr(act, "__name__") and hasattr(act, "activation"):
        act = act.activation  # QAT's QuantizeAwareActivation wraps the real one
    name = getattr(act, "__name__", None)
    return {"softmax_v2": "softmax"}.get(name, name)


def check_labels_fit(data, named: list) -> None:
    """Every split's labels fit the output they belong to and its task (class ids in range, 0/1, as many
    values per sample as the output has), checked before any work: one line, nothing written. `named`: (output
    name, Head) per output of the model."""
    if not named:
        return
    by_name = dict(named)
    by_name.update({f"output_{i}": head for i, (_, head) in enumerate(named)})  # a converted model's keys
    plain = data.label_output if data.label_output in by_name else named[0][0]
    for split, y in (("train", data.y_train), ("test", data.y_test)):
        for label, ys in (y.items() if isinstance(y, dict) else [(None, y)]) if y is not None else []:
            head = by_name.get(label or plain)
            if head is not None:
                where = f"y_{split}" + (f":{label}" if label else "")
                check_some_class(ys, head, where, data.task)
                check_labels(detect(head, ys, data.task), head, ys, where)


def check_label_names(data) -> None:
    """Labels keyed per output (y:<output>) and --label-output must name the model's outputs."""
    outputs = list(data.outputs)
    keyed = [k for y in (data.y_train, data.y_test) if isinstance(y, dict) for k in y]
    wrong = [k for k in dict.fromkeys(keyed) if outputs and k not in outputs]
    signature_keys = [f"output_{i}" for i in range(len(outputs))]  # what a converted model calls them
    if data.label_output is not None and outputs and data.label_output not in outputs + signature_keys:
        wrong.insert(0, data.label_output)
    if wrong:
        raise DataError(
            f"{wrong[0]!r} is not an output of the model (it has {', '.join(outputs)}).",
            "Key labels as y:<output name> and pass --label-output with one of those names.",
        )

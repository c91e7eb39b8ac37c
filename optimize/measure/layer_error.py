"""Which op breaks int8: per-layer quantization error, ranked, and what keeping one op in float would buy.

Method: the float and the quantized model run side by side on the same samples in ai-edge-litert's
interpreter with its preserve-all-tensors mode (`runtime.load(..., keep_tensors=True)`), and every
quantized op output is compared with the float model's tensor of the same name, dequantized with its own
scale and zero point: RMSE, RMSE over the scale, mean and max |error| (the per-layer statistics of TFLite's
QuantizationDebugger). LiteRT Quantizer's `model_validator.compare_model` compares tensors the same way but
builds two fresh interpreters for every sample; reading both interpreters' tensors after each invoke does
the same work once. Each op's own share of the error is `error_added` (its relative RMSE minus its worst
quantized input's), and for the worst few, the leave-one-out measurement: the model quantized except that
op (a LiteRT Quantizer per-op NO_QUANTIZE rule, see optimize.transforms.tflite.session), compared with float at the outputs.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from optimize.core.results import DebugReport, LayerError
from optimize.models import runtime
from optimize.models.flatbuffer import Model
from optimize.models.tflite import read_model

QUANT_DTYPES = ("int8", "uint8", "int16")
METHOD = (
    "ai-edge-litert interpreter, preserve-all-tensors: quantized op outputs vs the float model's same tensors; "
    "leave-one-out by LiteRT Quantizer per-op NO_QUANTIZE"
)


@dataclass
class _Pair:
    """One quantized op output and the float tensor it approximates, with running error sums."""

    op_index: int
    op: str
    tensor: str
    dtype: str
    q_index: int
    f_index: int
    scale: float
    zero: int
    inputs: list[str]
    sse: float = 0.0
    sae: float = 0.0
    max_ae: float = 0.0
    n: int = 0
    lo: float = np.inf
    hi: float = -np.inf

    def add(self, f: np.ndarray, q: np.ndarray) -> None:
        if not (np.all(np.isfinite(f)) and np.all(np.isfinite(q))):
            return  # a sample where the float model (or a float island) is not finite measures nothing here
        d = np.abs(q.astype(np.float64) - f.astype(np.float64))
        self.sse += float((d * d).sum())
        self.sae += float(d.sum())
        self.max_ae = max(self.max_ae, float(d.max()) if d.size else 0.0)
        self.n += d.size
        if f.size:
            self.lo, self.hi = min(self.lo, float(f.min())), max(self.hi, float(f.max()))

    @property
    def rmse(self) -> float:
        return (self.sse / self.n) ** 0.5 if self.n else 0.0

    @property
    def relative(self) -> float:
        span = self.hi - self.lo
        return self.rmse / span if span > 0 else 0.0


@dataclass
class Samples:
    """What the models are fed: one list of input arrays (batch of 1) per sample, in input order."""

    items: list = field(default_factory=list)  # each: an array, or a dict keyed by input name

    @classmethod
    def from_array(cls, xs, n: int) -> Samples:
        """The first n samples of an array, or of a dict of arrays keyed by input name."""
        from optimize.models.data import count, take

        return cls([take(xs, slice(i, i + 1)) for i in range(min(n, count(xs)))])


def _computing(sg):
    """(op, its first output tensor) for every op that computes something: QUANTIZE/DEQUANTIZE excluded."""
    for op in sg.ops:
        if op.name not in ("QUANTIZE", "DEQUANTIZE") and op.outputs and op.outputs[0] >= 0:
            yield op, sg.tensors[op.outputs[0]]


def _pairs(fm: Model, qm: Model, f_names: dict[str, int], q_names: dict[str, int]) -> list[_Pair]:
    """Quantized op outputs that have a float counterpart of the same name (QUANTIZE/DEQUANTIZE excluded)."""
    sg = qm.main
    out = []
    for op, t in _computing(sg):
        q = t.quant
        if t.dtype not in QUANT_DTYPES or q is None or not len(q.scales) or t.name not in f_names:
            continue
        if t.name not in q_names:
            continue
        inputs = [sg.tensors[i].name for i in op.inputs if i >= 0 and not sg.tensors[i].is_const]
        zp = q.zero_points
        out.append(
            _Pair(
                op.index,
                op.name,
                t.name,
                t.dtype,
                q_names[t.name],
                f_names[t.name],
                float(q.scales[0]),
                int(zp[0]) if len(zp) else 0,
                inputs,
            )
        )
    return out


def _weight_share(fm: Model) -> dict[str, float]:
    """Per op (keyed by its first output's name): its constant inputs' bytes over all constant bytes."""
    sg = fm.main
    per: dict[str, int] = {}
    for op in sg.ops:
        if op.outputs and op.outputs[0] >= 0:
            consts = [sg.tensors[i] for i in op.inputs if i >= 0 and sg.tensors[i].is_const]
            per[sg.tensors[op.outputs[0]].name] = sum(len(t.data) if t.data is not None else 0 for t in consts)
    total = sum(per.values()) or 1
    return {k: v / total for k, v in per.items()}


def _load(content: bytes, threads: int, like=None) -> runtime.Runner:
    """`like`: a sample whose shapes free input dimensions take (the data's, not the runtime's default of 1)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the runtime warns that preserve-all-tensors is for debugging
        return runtime.Runner(runtime.load(content, threads=threads, keep_tensors=True, like=like))


def _names(runner: runtime.Runner) -> dict[str, int]:
    return {d["name"]: d["index"] for d in runner.it.get_tensor_details()}


def layer_errors(
    float_model: bytes, quantized: bytes, samples: Samples, threads: int = 2, reference: list | None = None
) -> tuple[list[LayerError], float]:
    """Every quantized op output vs float on `samples`, unranked; and the model-output relative error.
    `reference`, when given a list, receives the float model's outputs per sample (for later comparisons)."""
    fm, qm = read_model(float_model), read_model(quantized)
    like = samples.items[0] if samples.items else None
    f_run, q_run = _load(float_model, threads, like), _load(quantized, threads, like)
    pairs = _pairs(fm, qm, _names(f_run), _names(q_run))
    outs: list[tuple[list[np.ndarray], list[np.ndarray]]] = []
    for sample in samples.items:
        f_out, q_out = f_run.run_fresh(sample), q_run.run_fresh(sample)
        outs.append((f_out, q_out))
        if reference is not None:
            reference.append(f_out)
        for p in pairs:
            f = f_run.it.get_tensor(p.f_index)
            q = (q_run.it.get_tensor(p.q_index).astype(np.float64) - p.zero) * p.scale
            p.add(f, q)
    share = _weight_share(fm)
    rel = {p.tensor: p.relative for p in pairs}
    layers = [
        LayerError(
            op_index=p.op_index,
            op=p.op,
            tensor=p.tensor,
            dtype=p.dtype,
            rmse=p.rmse,
            rmse_over_scale=p.rmse / p.scale if p.scale else None,
            mean_abs_error=p.sae / p.n if p.n else 0.0,
            max_abs_error=p.max_ae,
            relative_rmse=p.relative,
            error_added=p.relative - max((rel.get(i, 0.0) for i in p.inputs), default=0.0),
            weight_share=share.get(p.tensor, 0.0),
        )
        for p in pairs
    ]
    return layers, output_error(outs)


def output_error(outs: Sequence[tuple[list[np.ndarray], list[np.ndarray]]]) -> float:
    """The worst output's relative error, the sweep's own fidelity measure (optimize.measure.metrics): mean
    |quantized - float| over the float output's range (optimize.models.tasks.relative_error), over the samples
    where the float model is finite; one measure everywhere a figure is compared with the table's."""
    from optimize.models.tasks import relative_error

    if not outs:
        return 0.0
    outs = [o for o in outs if all(np.all(np.isfinite(a)) for a in o[0])] or outs  # where float is finite
    per_output = []
    for j in range(len(outs[0][0])):
        f = np.stack([o[0][j] for o in outs])
        q = np.stack([o[1][j] for o in outs])
        per_output.append(relative_error(q, f))
    return float(max(per_output))


def rank(layers: list[LayerError]) -> list[LayerError]:
    """Most harmful first: measured leave-one-out gain when known, then the error the op adds itself."""

    def key(le: LayerError):
        return (le.output_error_without is None, le.output_error_without or 0.0, -le.error_added, -le.relative_rmse)

    return sorted(layers, key=key)


def kept_float(float_model: bytes, quantized: bytes) -> list[str]:
    """Ops the quantizer left in float (it does not support them): `OP (tensor)`, in graph order."""
    qm = read_model(quantized)
    sg = qm.main
    out = []
    for op, t in _computing(sg):
        weights = [sg.tensors[i] for i in op.inputs if i >= 0 and sg.tensors[i].is_const]
        if t.dtype == "float32" and any(w.dtype == "float32" and w.numel > 1 for w in weights):
            out.append(f"{op.name} ({t.name})")
    return out


#: Float ops that turn int8's absolute rounding into a large relative error: LOG of a value near 0 (a log-mel
#: front end's power spectrum), a square root or division by one. The quantized op feeding one can matter far
#: more than its own error says, so it is always among the ops measured with only them kept float.
SENSITIVE = ("LOG", "RSQRT", "SQRT", "DIV", "POW", "LOG_SOFTMAX")


def feeding_sensitive(quantized: bytes, hops: int = 4) -> list[str]:
    """Output tensors of quantized ops that feed one of the SENSITIVE float ops: through its DEQUANTIZE, and
    through up to `hops` float ops between them (a float mel matrix between the int8 power spectrum and its LOG)."""
    return list(feeding_sensitive_ops(quantized, hops))


def feeding_sensitive_ops(quantized: bytes, hops: int = 4) -> dict[str, str]:
    """`feeding_sensitive`, each tensor with the sensitive op it feeds (LOG, RSQRT, ...)."""
    sg = read_model(quantized).main
    producer = {o: op for op in sg.ops for o in op.outputs if o >= 0}
    out: dict[str, str] = {}

    def walk(tensor: int, left: int, sensitive: str) -> None:
        src = producer.get(tensor)
        if src is None or not src.outputs:
            return
        if src.name == "DEQUANTIZE":
            src = producer.get(src.inputs[0]) if src.inputs else None
            if src is not None and src.name not in ("QUANTIZE", "DEQUANTIZE") and src.outputs:
                out.setdefault(sg.tensors[src.outputs[0]].name, sensitive)
            return
        if sg.tensors[src.outputs[0]].dtype.startswith("float") and left > 0:
            for i in src.inputs:
                if i >= 0 and not sg.tensors[i].is_const:
                    walk(i, left - 1, sensitive)

    for op in sg.ops:
        if op.name in SENSITIVE:
            for i in op.inputs:
                if i >= 0 and not sg.tensors[i].is_const:
                    walk(i, hops, op.name)
    return out


def analyze(
    float_model: bytes,
    quantize: Callable[[dict[str, str] | None], bytes],
    samples: Samples,
    *,
    scheme: str = "int8",
    leave_out: int = 3,
    threads: int = 2,
) -> DebugReport:
    """The debug report: `quantize(overrides)` makes the quantized model (overrides keep ops in float).

    The `leave_out` worst ops by `error_added` are also measured leave-one-out (one quantization and one
    pass over the samples each), so the ranking ends with what keeping each in float really buys; so are
    the ops feeding a float LOG, square root or division (`SENSITIVE`), whose harm their own error hides.
    """
    t0 = time.perf_counter()
    full = quantize(None)
    ref_outs: list = []
    layers, out_err = layer_errors(float_model, full, samples, threads, reference=ref_outs)
    ranked = rank(layers)
    measured = {}
    sensitive = set(feeding_sensitive(full)) if leave_out else set()
    extra = [le for le in ranked[leave_out:] if le.tensor in sensitive]
    like = samples.items[0] if samples.items else None  # free input dimensions at the samples' shape
    for le in ranked[:leave_out] + extra:
        variant = runtime.Runner(runtime.load(quantize({le.tensor: "float"}), threads=threads, like=like))
        outs = [(r, variant.run_fresh(s)) for r, s in zip(ref_outs, samples.items)]
        measured[le.tensor] = output_error(outs)
    layers = [le.model_copy(update={"output_error_without": measured.get(le.tensor)}) for le in layers]
    return DebugReport(
        scheme=scheme,
        samples=len(samples.items),
        method=METHOD,
        output_error=out_err,
        layers=rank(layers),
        kept_float=kept_float(float_model, full),
        seconds=time.perf_counter() - t0,
    )

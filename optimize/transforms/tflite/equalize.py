"""Cross-layer equalization and activation smoothing: function-preserving rescales of a float32 .tflite.

Why on the float32 flatbuffer: every input (Keras 2 or 3, a SavedModel, someone else's .tflite) reaches the
quantizer as one normalised float32 flatbuffer, so one implementation serves them all, after any Keras-stage
step (prune -> cluster -> equalize -> int8) and before LiteRT Quantizer or the TFLite calibrator. Only
constants change (optimize.transforms.tflite.flatedit); the graph, its names and signature stay as they were.

A *pair* is two linear ops A -> B (CONV_2D, DEPTHWISE_CONV_2D, FULLY_CONNECTED) where A's output reaches B's
data input through ops that commute with a positive per-channel scale: A's fused activation NONE or RELU,
then any single-consumer chain of RELU, MAX_POOL_2D, AVERAGE_POOL_2D, MEAN over non-channel axes, PAD
(zeros stay zeros) and RESHAPE that keeps the channel innermost (Flatten: feature j is channel j mod C).
Dividing A's output channel c (weights and bias) by s_c and multiplying B's input channel c by s_c leaves
the float function unchanged, since relu(x / s) = relu(x) / s for s > 0.

Clustered weights (a chain's `cluster` step) stay clustered: a pair whose B is a clustered Conv/Dense is
left, as scaling B's input columns would split its shared values.

ReLU6 (and tanh, RELU_N1_TO_1) is not crossed: relu6(x / s) = min(relu(x) / s, 6) is not relu6(x) / s, so
scaling across the clip would change the float model. Those pairs are left as they are and counted
(`Equalized.skipped`); a ReLU6 network (MobileNet V2) is equalized only where its layers meet without a clip.

After CLE, high-bias absorption (`absorb_high_bias`, needs calibration data) moves the part of A's bias
that A's output never falls below out of A and into B's bias, shrinking the activation range; it is
exact on every input where that floor holds (it is measured on calibration data), and only where B takes
the constant back exactly (a Dense layer, or a convolution reading no zero padding).

Two rules for s_c:
- `cle` (Nagel et al. 2019, data-free): s_c = sqrt(r1_c / r2_c), with r1_c the range of A's output channel's
  weights and r2_c the range of B's input channel's weights; both become sqrt(r1_c r2_c). Iterated over all
  pairs until the scales settle, as the paper does for chains.
- `smooth` (SmoothQuant, Xiao et al. 2022): s_c = max|x_c|^alpha / r2_c^(1 - alpha), with max|x_c| the
  channel's largest activation on calibration samples (B's input); moves activation outliers into B's
  weights, which are quantized per output channel, so one per-tensor activation range fits every channel.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from optimize.transforms.tflite.flatedit import LINEAR, Graph, clustered

THROUGH = frozenset({"RELU", "MAX_POOL_2D", "AVERAGE_POOL_2D", "MEAN", "PAD", "RESHAPE", "SQUEEZE"})
CROSSABLE = ("NONE", "RELU")
ROUNDS = 20
LIMIT = 1e6  # a scale further from 1 than this is clamped (a dead channel's weights are all ~0)


@dataclass(frozen=True)
class Pair:
    """A -> B, joined through `between` (op indices), with `period` the channel count when B reads a
    flattened tensor (its input feature j is A's channel j mod period), else None."""

    a: int
    b: int
    between: tuple[int, ...]
    period: int | None = None


@dataclass
class Equalized:
    """The rescaled model and what was done (for the candidate's notes)."""

    content: bytes
    pairs: list[tuple[str, str]] = field(default_factory=list)  # (A's output, B's output) tensor names
    skipped: list[str] = field(default_factory=list)  # why a candidate pair was not crossed
    max_scale: float = 1.0  # the largest max(s, 1/s) applied
    absorbed: int = 0  # pairs whose high bias was absorbed (`cle` with samples)


def _weights(g: Graph, op: int) -> np.ndarray | None:
    ins = g.inputs(op)
    return g.const(ins[1]) if len(ins) > 1 else None


def _channels_out(g: Graph, op: int) -> int:
    w = _weights(g, op)
    return int(w.shape[-1] if g.names[op] == "DEPTHWISE_CONV_2D" else w.shape[0])


def _passes(g: Graph, k: int, channels: int, period: int | None) -> tuple[bool, int | None]:
    """Whether op k commutes with a per-channel scale, and the flattened period after it."""
    name = g.names[k]
    if name not in THROUGH or g.activation(k) not in CROSSABLE:
        return False, period
    if name == "MEAN":
        axes = g.const(g.inputs(k)[1]) if len(g.inputs(k)) > 1 else None
        rank = len(g.shape(g.inputs(k)[0]))
        ok = axes is not None and period is None and all(int(a) % rank != rank - 1 for a in np.ravel(axes))
        return ok, period
    if name == "PAD":
        return len(g.inputs(k)) == 2, period  # PADV2's constant value would be scaled too: not crossed
    if name in ("RESHAPE", "SQUEEZE"):
        out = g.shape(g.output(k))
        last = out[-1] if out else 0
        unit = period or channels
        return bool(last) and last % unit == 0, (None if last == channels and period is None else unit)
    return True, period


def _keeps_clusters(g: Graph, found: list[Pair], skipped: list[str]) -> list[Pair]:
    """Pairs whose rescale keeps clustered weights clustered: A's rows and a depthwise B's channels scale
    whole output channels (the int8 values per channel stay the same), a Conv/Dense B's input columns do
    not, so such a pair is left (and said) when B is clustered."""
    out = []
    for p in found:
        if g.names[p.b] != "DEPTHWISE_CONV_2D" and clustered(_weights(g, p.b)):
            skipped.append(f"{g.tensor_name(g.output(p.a))} -> {g.tensor_name(g.output(p.b))}: clustered weights")
        else:
            out.append(p)
    return out


def pairs(g: Graph) -> tuple[list[Pair], list[str]]:
    """Every pair that a positive per-channel scale crosses exactly, and why other candidates were not."""
    found, skipped = [], []
    for a, name in enumerate(g.names):
        if name not in LINEAR or _weights(g, a) is None:
            continue
        act = g.activation(a)
        channels = _channels_out(g, a)
        t, between, period = g.output(a), [], None
        while True:
            users = g.consumers(t)
            if len(users) != 1 or g.is_output(t):
                break
            k = users[0]
            if g.names[k] in LINEAR:
                if (
                    g.inputs(k)[0] == t
                    and _weights(g, k) is not None
                    and (period is None or g.names[k] != "DEPTHWISE_CONV_2D")
                ):
                    if act not in CROSSABLE:
                        skipped.append(f"{g.tensor_name(g.output(a))} -> {g.tensor_name(g.output(k))}: {act} clip")
                    else:
                        found.append(Pair(a, k, tuple(between), period))
                break
            ok, period = _passes(g, k, channels, period)
            if not ok:
                break
            between.append(k)
            t = g.output(k)
    return found, skipped


def _out_ranges(g: Graph, op: int) -> np.ndarray:
    w = np.abs(_weights(g, op))
    if g.names[op] == "DEPTHWISE_CONV_2D":
        return w.reshape(-1, w.shape[-1]).max(axis=0)
    return w.reshape(w.shape[0], -1).max(axis=1)


def _in_ranges(g: Graph, p: Pair, channels: int) -> np.ndarray:
    """B's weight range per input channel of A (its columns folded by the flatten period)."""
    w = np.abs(_weights(g, p.b))
    if g.names[p.b] == "DEPTHWISE_CONV_2D":
        per = w.reshape(-1, w.shape[-1]).max(axis=0)  # per output channel c*m + k
        return per.reshape(channels, -1).max(axis=1)
    cols = w.reshape(-1, w.shape[-1]).max(axis=0) if g.names[p.b] == "CONV_2D" else w.max(axis=0)
    return cols.reshape(-1, channels).max(axis=0)


def _scale_out(g: Graph, op: int, s: np.ndarray) -> None:
    """A's output channel c divided by s_c (weights and bias)."""
    ins = g.inputs(op)
    w = _weights(g, op)
    w = w / s if g.names[op] == "DEPTHWISE_CONV_2D" else w / s.reshape((-1,) + (1,) * (w.ndim - 1))
    g.set_const(ins[1], w)
    bias = g.const(ins[2]) if len(ins) > 2 else None
    if bias is not None:
        g.set_const(ins[2], bias / s)


def _scale_in(g: Graph, p: Pair, s: np.ndarray) -> None:
    """B's input channel c multiplied by s_c."""
    i = g.inputs(p.b)[1]
    w = _weights(g, p.b)
    if g.names[p.b] == "DEPTHWISE_CONV_2D":
        w = w * np.repeat(s, w.shape[-1] // len(s))
    elif g.names[p.b] == "CONV_2D":
        w = w * s
    else:
        w = w * np.tile(s, w.shape[1] // len(s))
    g.set_const(i, w)


def _apply(g: Graph, p: Pair, s: np.ndarray) -> None:
    s = np.clip(np.where(np.isfinite(s) & (s > 0), s, 1.0), 1 / LIMIT, LIMIT).astype(np.float32)
    _scale_out(g, p.a, s)
    _scale_in(g, p, s)


def _cle_scales(g: Graph, p: Pair) -> np.ndarray:
    r1 = _out_ranges(g, p.a).astype(np.float64)
    r2 = _in_ranges(g, p, len(r1)).astype(np.float64)
    ok = (r1 > 0) & (r2 > 0)
    return np.where(ok, np.sqrt(np.where(ok, r1 / np.where(r2 > 0, r2, 1), 1)), 1.0)


def equalize(content: bytes, rounds: int = ROUNDS) -> Equalized:
    """Cross-layer equalization of every pair, iterated until the scales settle (or `rounds`)."""
    g = Graph.load(content)
    found, skipped = pairs(g)
    found = _keeps_clusters(g, found, skipped)
    biggest = 1.0
    for _ in range(rounds):
        moved = 1.0
        for p in found:
            s = _cle_scales(g, p)
            _apply(g, p, s)
            moved = max(moved, float(np.max(np.maximum(s, 1 / s))) if s.size else 1.0)
        biggest = max(biggest, moved)
        if moved < 1 + 1e-4:
            break
    return Equalized(g.save(), _names(g, found), skipped, biggest)


def smooth(content: bytes, act_max: dict[str, np.ndarray], alpha: float = 0.5) -> Equalized:
    """SmoothQuant-style migration: B's input activation range per channel (`act_max`, keyed by the tensor
    B reads) moved into B's weights by s_c = max|x_c|^alpha / r2_c^(1-alpha), folded into A."""
    g = Graph.load(content)
    found, skipped = pairs(g)
    found = _keeps_clusters(g, found, skipped)
    biggest = 1.0
    done = []
    for p in found:
        x = act_max.get(g.tensor_name(g.inputs(p.b)[0]))
        channels = _channels_out(g, p.a)
        if x is None:
            continue
        x = np.asarray(x, np.float64).reshape(-1, channels).max(axis=0)  # a flattened input: fold per channel
        r2 = _in_ranges(g, p, channels).astype(np.float64)
        ok = (x > 0) & (r2 > 0)
        # s divides the activation: x_c / s_c and r2_c * s_c meet at x^alpha r2^(1-alpha)
        s = np.where(ok, np.power(np.where(ok, x, 1), alpha) / np.power(np.where(ok, r2, 1), 1 - alpha), 1.0)
        s = s / np.exp(np.mean(np.log(s)))  # only the spread matters: keep the geometric mean at 1
        _apply(g, p, s)
        done.append(p)
        biggest = max(biggest, float(np.max(np.maximum(s, 1 / s))) if s.size else 1.0)
    return Equalized(g.save(), _names(g, done), skipped, biggest)


#: Ops between A and B that commute with subtracting a per-channel constant (pooling of VALID or
#: padding-excluding kind, flatten): max(x - c) = max(x) - c, mean(x - c) = mean(x) - c.
SHIFTABLE = frozenset({"MAX_POOL_2D", "AVERAGE_POOL_2D", "MEAN", "RESHAPE", "SQUEEZE"})


def _absorbable(g: Graph, p: Pair) -> bool:
    """Whether a constant c subtracted from A's output can be added back as B's bias exactly: B is a Dense
    layer, or a convolution that reads no zero padding (VALID, or 1x1), and nothing in between pads."""
    if any(g.names[k] not in SHIFTABLE for k in p.between) or len(g.inputs(p.b)) < 3:
        return False
    if g.names[p.b] == "DEPTHWISE_CONV_2D" or g.const(g.inputs(p.b)[2]) is None:
        return False
    if g.names[p.b] == "FULLY_CONNECTED":
        return True
    w = _weights(g, p.b)
    return (g.options(p.b).padding or 0) == 1 or (w.shape[1] == 1 and w.shape[2] == 1)


def absorb_high_bias(content: bytes, out_min: dict[str, np.ndarray]) -> Equalized:
    """High-bias absorption (Nagel et al. 2019, the empirical form): where A's output channel c never falls
    below h_c > 0 on calibration data (`out_min`, keyed by A's output tensor), h_c moves out of A's bias and
    into B's: relu(z - h) = relu(z) - h whenever z >= h, so the model is unchanged on such inputs, and the
    activation range shrinks by h. Only pairs where B's bias can take it back exactly (`_absorbable`)."""
    g = Graph.load(content)
    found, skipped = pairs(g)
    done, biggest = [], 0.0
    for p in found:
        low = out_min.get(g.tensor_name(g.output(p.a)))
        bias_a = g.const(g.inputs(p.a)[2]) if len(g.inputs(p.a)) > 2 else None
        if low is None or bias_a is None or not _absorbable(g, p):
            continue
        h = np.maximum(np.asarray(low, np.float64).reshape(-1, len(bias_a)).min(axis=0), 0.0)
        if not np.any(h > 0):
            continue
        w = _weights(g, p.b).astype(np.float64)
        if g.names[p.b] == "FULLY_CONNECTED":
            add = w @ np.tile(h, w.shape[1] // len(h))
        else:
            add = np.einsum("okhc,c->o", w, h)
        g.set_const(g.inputs(p.a)[2], (bias_a - h).astype(np.float32))
        g.set_const(g.inputs(p.b)[2], (g.const(g.inputs(p.b)[2]) + add).astype(np.float32))
        done.append(p)
        biggest = max(biggest, float(h.max()))
    return Equalized(g.save(), _names(g, done), skipped, biggest)


def output_minima(content: bytes, samples: list, threads: int = 2) -> dict[str, np.ndarray]:
    """Each Conv/DepthwiseConv/Dense output's smallest value per channel on the samples."""
    from optimize.measure.tensors import channel_extremes

    g = Graph.load(content)
    outs = [g.output(k) for k, n in enumerate(g.names) if n in LINEAR]
    return {g.tensor_name(t): lo for t, (lo, _) in channel_extremes(content, samples, outs, threads).items()}


def left(skipped: list[str]) -> str:
    """`; 5 pair(s) left (RELU6 clip 4, clustered weights 1)`, or nothing when none was left."""
    if not skipped:
        return ""
    why: dict[str, int] = {}
    for s in skipped:
        reason = s.rsplit(": ", 1)[-1]
        why[reason] = why.get(reason, 0) + 1
    return f"; {len(skipped)} pair(s) left ({', '.join(f'{k} {v}' for k, v in why.items())})"


def _names(g: Graph, found: list[Pair]) -> list[tuple[str, str]]:
    return [(g.tensor_name(g.output(p.a)), g.tensor_name(g.output(p.b))) for p in found]


def cle(content: bytes, samples=None, threads: int = 1) -> Equalized:
    """Cross-layer equalization, then, where `samples` (a callable giving calibration samples) is given and
    pairs were rescaled, high-bias absorption measured on them: what the `equalize` technique (absorb=true)
    and the accuracy rescue's first step both run."""
    made = equalize(content)
    if samples is not None and made.pairs:
        high = absorb_high_bias(made.content, output_minima(made.content, samples(), max(1, threads)))
        made.content, made.absorbed = high.content, len(high.pairs)
    return made

"""Weights made for int8: empirical bias correction and AdaRound-style learned rounding, on the float32 .tflite.

Both anticipate the int8 quantizer's weight rounding (symmetric, narrow range [-127, 127], one scale per
output channel or per tensor: scale = max|w| / 127, as LiteRT Quantizer and the TFLite calibrator make it)
and write the result back into the float model, so any backend that quantizes it afterwards gets it:

- Bias correction (Nagel et al. 2019, the empirical form): the expected output shift that rounding the
  weights causes, E[W_q x] - E[W x] = (W_q - W) E[x], measured with each layer's float inputs on
  calibration samples (for a convolution, the mean input patch, padding included), is subtracted from the
  layer's bias. The float model then differs from the original by exactly the shift its int8 twin adds.
- Learned rounding (Nagel et al. 2020, AdaRound): instead of rounding each weight to nearest, choose up or
  down to minimise the layer's output error || (W_q - W) X ||^2 on its recorded inputs X (a few hundred
  samples, im2col patches for a convolution), with the rectified sigmoid h(V) and the regulariser
  1 - |2h - 1|^beta whose beta anneals from 20 to 2, optimised by Adam in numpy. The weights are then set
  to the chosen grid points s * q: the quantizer recomputes the same scale (each row's largest weight stays
  on +-127) and rounds them to exactly q. Kept only when it beats nearest rounding on the same inputs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from optimize.measure.tensors import stream
from optimize.transforms.tflite.flatedit import LINEAR, Graph, clustered

QMAX = 127
ZETA, GAMMA = 1.1, -0.1  # the rectified sigmoid's stretch
MAX_ROWS = 4096  # im2col rows kept per layer (a seeded subset beyond that)


def _axis(name: str) -> int:
    return 3 if name == "DEPTHWISE_CONV_2D" else 0


def weight_scales(w: np.ndarray, name: str, per_tensor: bool) -> np.ndarray:
    """The quantizer's scale, broadcastable against w."""
    ax = _axis(name)
    if per_tensor:
        m = np.full([1] * w.ndim, np.abs(w).max())
    else:
        m = np.abs(w).max(axis=tuple(i for i in range(w.ndim) if i != ax), keepdims=True)
    return np.where(m > 0, m / QMAX, 1.0).astype(np.float32)


def fake_quant(w: np.ndarray, name: str, per_tensor: bool) -> np.ndarray:
    s = weight_scales(w, name, per_tensor)
    return (np.clip(np.round(w / s), -QMAX, QMAX) * s).astype(np.float32)


def _pads(size: int, k: int, stride: int, dil: int, same: bool) -> tuple[int, int, int]:
    """(pad before, pad after, output size) of TensorFlow's SAME/VALID padding along one axis."""
    eff = (k - 1) * dil + 1
    out = -(-size // stride) if same else (size - eff) // stride + 1
    total = max((out - 1) * stride + eff - size, 0) if same else 0
    return total // 2, total - total // 2, out


def patches(g: Graph, op: int, x: np.ndarray, kh: int, kw: int) -> np.ndarray:
    """im2col of a convolution's input: (N, OH, OW, KH, KW, C), padding zeros included."""
    o = g.options(op)
    same = (o.padding or 0) == 0
    sh, sw, dh, dw = o.strideH or 1, o.strideW or 1, o.dilationHFactor or 1, o.dilationWFactor or 1
    ph0, ph1, oh = _pads(x.shape[1], kh, sh, dh, same)
    pw0, pw1, ow = _pads(x.shape[2], kw, sw, dw, same)
    xp = np.pad(x, ((0, 0), (ph0, ph1), (pw0, pw1), (0, 0)))
    rows = [
        np.stack(
            [
                xp[:, i * dh : i * dh + (oh - 1) * sh + 1 : sh, j * dw : j * dw + (ow - 1) * sw + 1 : sw]
                for j in range(kw)
            ],
            3,
        )
        for i in range(kh)
    ]
    return np.stack(rows, 3)


def _mean_input(g: Graph, op: int, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """E[x] in the layout the weights multiply: the mean patch (KH, KW, C) or the mean feature vector."""
    if g.names[op] == "FULLY_CONNECTED":
        return x.reshape(-1, w.shape[1]).mean(axis=0)
    kh, kw = w.shape[1], w.shape[2]
    return patches(g, op, x, kh, kw).mean(axis=(0, 1, 2))


def output_shift(g: Graph, op: int, dw: np.ndarray, mean: np.ndarray) -> np.ndarray:
    """(W_q - W) E[x] per output channel."""
    name = g.names[op]
    if name == "FULLY_CONNECTED":
        return dw @ mean
    if name == "CONV_2D":
        return np.einsum("okhc,khc->o", dw, mean)
    mult = dw.shape[3] // mean.shape[-1]
    return np.einsum("khc,khc->c", dw[0], np.repeat(mean, mult, axis=-1))


@dataclass
class Corrected:
    content: bytes
    layers: list[tuple[str, float]] = field(default_factory=list)  # (op output, largest |shift| / |bias range|)
    skipped: list[str] = field(default_factory=list)


def _linear(g: Graph) -> list[int]:
    return [
        k for k, n in enumerate(g.names) if n in LINEAR and len(g.inputs(k)) > 1 and g.const(g.inputs(k)[1]) is not None
    ]


def bias_correct(content: bytes, samples: list, per_tensor: bool = False, threads: int = 2) -> Corrected:
    """Every Conv/DepthwiseConv/Dense bias corrected for the mean shift its int8 weights cause."""
    g = Graph.load(content)
    ops = _linear(g)
    sums: dict[int, np.ndarray] = {}
    for values in stream(content, samples, sorted({g.inputs(k)[0] for k in ops}), threads):
        for k in ops:
            m = _mean_input(g, k, values[g.inputs(k)[0]], g.const(g.inputs(k)[1]))
            sums[k] = sums[k] + m if k in sums else m
    done, skipped = [], []
    for k in ops:
        ins = g.inputs(k)
        bias = g.const(ins[2]) if len(ins) > 2 else None
        if bias is None:
            skipped.append(f"{g.tensor_name(g.output(k))}: no bias to fold the shift into")
            continue
        w = g.const(ins[1])
        shift = output_shift(g, k, fake_quant(w, g.names[k], per_tensor) - w, sums[k] / max(len(samples), 1))
        g.set_const(ins[2], bias - shift.astype(np.float32))
        span = float(np.abs(bias).max()) or 1.0
        done.append((g.tensor_name(g.output(k)), float(np.abs(shift).max()) / span))
    return Corrected(g.save(), done, skipped)


# ---- learned rounding ----


def _rows(g: Graph, op: int, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """What the weights multiply, one row per output position: features (P, I), or patches (P, K, C)."""
    if g.names[op] == "FULLY_CONNECTED":
        return x.reshape(-1, w.shape[1])
    p = patches(g, op, x, w.shape[1], w.shape[2])
    return p.reshape(-1, w.shape[1] * w.shape[2], p.shape[-1])


def _groups(g: Graph, op: int, rows: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray, callable]:
    """The layer as batched least squares: weights (B, R, J), input Gram matrices (B, J, J), and the map
    from (B, R, J) back to the weights' layout."""
    name = g.names[op]
    if name == "FULLY_CONNECTED":
        return w[None], (rows.T @ rows / len(rows))[None], lambda m: m[0]
    if name == "CONV_2D":
        xs = rows.reshape(len(rows), -1)
        return w.reshape(w.shape[0], -1)[None], (xs.T @ xs / len(xs))[None], lambda m: m[0].reshape(w.shape)
    k, c = rows.shape[1], rows.shape[2]
    wg = w.reshape(k, c, w.shape[3] // c).transpose(1, 2, 0)  # (C, multiplier, K)
    gram = np.einsum("pkc,plc->ckl", rows, rows) / len(rows)
    return wg, gram, lambda m: m.transpose(2, 0, 1).reshape(w.shape)


def _sampled_rows(g: Graph, ops: list[int], content: bytes, samples: list, threads: int) -> dict[int, np.ndarray]:
    """Each op's input rows over the samples, at most MAX_ROWS (a seeded share of each sample's)."""
    rng = np.random.default_rng(0)
    per = max(MAX_ROWS // max(len(samples), 1), 1)
    got: dict[int, list] = {k: [] for k in ops}
    for values in stream(content, samples, sorted({g.inputs(k)[0] for k in ops}), threads):
        for k in ops:
            r = _rows(g, k, values[g.inputs(k)[0]].astype(np.float64), g.const(g.inputs(k)[1]))
            got[k].append(r[rng.choice(len(r), per, replace=False)] if len(r) > per else r)
    return {k: np.concatenate(v) for k, v in got.items()}


def _recon(dw: np.ndarray, gram: np.ndarray) -> float:
    return float(np.einsum("brj,bjk,brk->", dw, gram, dw))


def adaround_layer(
    w: np.ndarray, gram: np.ndarray, scale: np.ndarray, iters: int = 400, reg: float = 0.01, seed: int = 0
):
    """Learned integer grid points for weights (B, R, J) with scales (B, R, 1): (new weights, error of
    nearest rounding, error of the learned rounding), errors as || dW X ||^2 summed."""
    base = np.floor(w / scale)
    frac = np.clip(w / scale - base, 1e-4, 1 - 1e-4)
    v = -np.log((ZETA - GAMMA) / (frac - GAMMA) - 1)  # h(v) = frac at the start
    nearest = np.clip(np.round(w / scale), -QMAX, QMAX) * scale
    e_near = _recon(nearest - w, gram)
    norm = max(e_near, 1e-12)
    m, s2 = np.zeros_like(v), np.zeros_like(v)
    lr, b1, b2 = 0.05, 0.9, 0.999
    warm = iters // 5
    for t in range(1, iters + 1):
        sig = 1 / (1 + np.exp(-v))
        hraw = sig * (ZETA - GAMMA) + GAMMA
        h = np.clip(hraw, 0, 1)
        dw = scale * (base + h) - w
        grad_h = 2 * np.einsum("brj,bjk->brk", dw, gram) * scale / norm
        if t > warm:
            beta = 20 + (2 - 20) * (t - warm) / max(iters - warm, 1)
            u = 2 * h - 1
            # the regulariser's mean over the weights, weighted against the reconstruction error (which is
            # normalised to 1 at nearest rounding): reg = 0.01 of a 1,000-weight layer's error per weight
            grad_h += reg * (-beta * np.abs(u) ** (beta - 1) * np.sign(u) * 2) / h.size * 1e3
        grad = grad_h * ((hraw > 0) & (hraw < 1)) * sig * (1 - sig) * (ZETA - GAMMA)
        m = b1 * m + (1 - b1) * grad
        s2 = b2 * s2 + (1 - b2) * grad * grad
        v -= lr * (m / (1 - b1**t)) / (np.sqrt(s2 / (1 - b2**t)) + 1e-8)
    q = np.clip(base + (v >= 0), -QMAX, QMAX)
    top = np.abs(w / scale) >= QMAX - 1e-3  # each row's largest weight stays on +-127: the scale is kept
    q = np.where(top, np.round(w / scale), q)
    learned = (q * scale).astype(np.float32)
    return learned, e_near, _recon(learned - w, gram)


@dataclass
class Rounded:
    content: bytes
    layers: list[tuple[str, str, float, float]] = field(default_factory=list)  # (output, op, nearest, learned)
    seconds: float = 0.0


def adaround(
    content: bytes,
    samples: list,
    tensors: list[str] | None = None,
    per_tensor: bool = False,
    iters: int = 400,
    max_seconds: float = 60.0,
    threads: int = 2,
) -> Rounded:
    """Learned rounding for the Conv/DepthwiseConv/Dense ops whose outputs are named in `tensors` (all of
    them when None), in that order, within `max_seconds`."""
    t0 = time.perf_counter()
    g = Graph.load(content)
    # clustered weights keep their shared values: learning each weight's rounding would split them
    by_name = {g.tensor_name(g.output(k)): k for k in _linear(g) if not clustered(g.const(g.inputs(k)[1]))}
    ops = [by_name[n] for n in (tensors if tensors is not None else list(by_name)) if n in by_name]
    rows = _sampled_rows(g, ops, content, samples, threads)
    done = []
    for k in ops:
        if time.perf_counter() - t0 > max_seconds:
            break
        ins = g.inputs(k)
        w = g.const(ins[1])
        wg, gram, back = _groups(g, k, rows[k], w.astype(np.float64))
        full = np.broadcast_to(weight_scales(w, g.names[k], per_tensor), w.shape).astype(np.float64)
        learned, e_near, e_learned = adaround_layer(wg, gram, _groups_scale(g.names[k], full, wg.shape), iters)
        if e_learned < e_near:
            g.set_const(ins[1], back(learned))
        done.append((g.tensor_name(g.output(k)), g.names[k], e_near, min(e_learned, e_near)))
    return Rounded(g.save(), done, time.perf_counter() - t0)


def _groups_scale(name: str, s: np.ndarray, shape: tuple) -> np.ndarray:
    """The scales laid out like `_groups`' weights."""
    if name == "FULLY_CONNECTED":
        return s[None]
    if name == "CONV_2D":
        return s.reshape(s.shape[0], -1)[None]
    kh, kw, cm = s.shape[1], s.shape[2], s.shape[3]
    c = shape[0]
    return s.reshape(kh * kw, c, cm // c).transpose(1, 2, 0)

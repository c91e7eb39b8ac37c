"""Activation ranges for int8: min/max, percentile or MSE-optimal per tensor, from the float model's values.

LiteRT Quantizer calibrates min/max per tensor (its `qsvs`: {tensor name: {"min": [..], "max": [..]}}) and
quantizes from whatever ranges it is given, so other choices are made by overriding those entries:

- `minmax`: the global min and max over the samples (what the converter does; an outlier stretches the
  range and every other value loses resolution);
- `percentile`: the 0.01th and 99.99th percentiles (clips the rare extremes);
- `mse`: the range [r * min, r * max], r in (0.3 .. 1], whose int8 fake-quantization (asymmetric, 256
  levels, zero exactly representable) has the least mean squared error on the recorded values;
- `auto`: per tensor, whichever of the three has the least error, min/max on ties: what the rescue uses.

Values are recorded in the float model with the runtime's preserve-all-tensors mode, at most `KEEP` values
per tensor (a seeded subset; the extremes always kept). The model input keeps its min/max: its range is
the data's. The TFLite calibrator (the fallback backend) takes no ranges: with it these choices are min/max.
"""

from __future__ import annotations

import numpy as np

METHODS = ("minmax", "percentile", "mse", "auto")
KEEP = 200_000
PERCENTILE = 99.99
RATIOS = np.linspace(1.0, 0.3, 36)


def fake_quant(x: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """int8 (asymmetric, 256 levels) quantize-dequantize of x over [lo, hi] (widened to hold zero)."""
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    if hi - lo <= 0:
        return x
    scale = (hi - lo) / 255
    zp = np.round(-lo / scale) - 128
    q = np.clip(np.round(x / scale) + zp, -128, 127)
    return (q - zp) * scale


def _mse(x: np.ndarray, lo: float, hi: float) -> float:
    return float(np.mean((fake_quant(x, lo, hi) - x) ** 2))


def choose(x: np.ndarray, method: str) -> tuple[float, float, str]:
    """(lo, hi, the method it came from) for one tensor's recorded values."""
    x = np.asarray(x, np.float64).ravel()
    lo, hi = float(x.min()), float(x.max())
    options = {"minmax": (lo, hi)}
    if method in ("percentile", "auto"):
        p_lo = float(np.percentile(x, 100 - PERCENTILE)) if lo < 0 else lo
        options["percentile"] = (p_lo, float(np.percentile(x, PERCENTILE)))
    if method in ("mse", "auto"):
        best = min(RATIOS, key=lambda r: _mse(x, r * lo, r * hi))
        options["mse"] = (best * lo, best * hi)
    if method != "auto":
        return (*options[method], method)
    errors = {k: _mse(x, *v) for k, v in options.items()}
    pick = min(errors, key=lambda k: (errors[k], k != "minmax"))
    if errors[pick] > 0.99 * errors["minmax"]:  # within 1%: the plain range
        pick = "minmax"
    return (*options[pick], pick)


def record(content: bytes, samples: list, names: set[str], threads: int = 2) -> dict[str, np.ndarray]:
    """Recorded float values of the named tensors over the samples (a seeded subset of at most KEEP
    values each, the minimum and maximum always included)."""
    from optimize.measure.tensors import stream

    per = max(KEEP // max(len(samples), 1), 16)
    rng = np.random.default_rng(0)
    got: dict[str, list] = {}
    for values in stream(content, samples, set(names), threads):
        for n, v in values.items():
            v = v.astype(np.float32, copy=False).ravel()
            if v.size > per:
                v = np.concatenate([rng.choice(v, per, replace=False), [v.min(), v.max()]])
            got.setdefault(n, []).append(v)
    return {n: np.concatenate(v) for n, v in got.items() if v}


def override(qsvs: dict, content: bytes, samples: list, method: str, keep: set[str], threads: int = 2):
    """`qsvs` with each activation's range chosen by `method` (tensors in `keep` left as calibrated), and
    how many tensors each method gave."""
    if method == "minmax":
        return qsvs, {}
    values = record(content, samples, {n for n in qsvs if n not in keep}, threads)
    out, picked = dict(qsvs), {}
    for name, x in values.items():
        lo, hi, how = choose(x, method)
        old = qsvs[name]
        out[name] = {
            **old,
            "min": np.full_like(np.asarray(old["min"], np.float64), min(lo, 0.0)),
            "max": np.full_like(np.asarray(old["max"], np.float64), max(hi, 0.0)),
        }
        picked[how] = picked.get(how, 0) + 1
    return out, picked

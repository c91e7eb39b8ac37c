"""The robustness probe: run a candidate on edge inputs its float model handles, and say where it breaks.

A quantized model can fail on inputs that are perfectly ordinary for its float model: digital silence
(an all-zero input, which audio pipelines feed when they zero-pad) makes an int8 DIV whose divisor
rounds to its zero point fail to invoke (`div.cc:262 data[i] != zero_point`). Measuring on real samples
never sees it. The probe feeds, one sample each:

    all-zero input            zeros
    constant input (v)        every element v, the middle of the data's range
    calibrated minimum (lo)   every element the calibration samples' minimum
    calibrated maximum (hi)   every element their maximum
    random values in range    seeded, uniform between each element's calibrated minimum and maximum
    real sample i             the first test samples

and compares with the float model on the same inputs: an input the candidate fails to invoke on, or
answers with NaN/inf, while the float model runs and answers finitely, is a `ProbeFailure` naming the
node and op from the runtime's own error. Without data only zeros, a constant (0.5) and seeded values in
[0, 1] are tried. The float model's outcomes are computed once per process and reused for every
candidate; the candidate's own interpreter (the one measuring uses) is reused, so a probe costs a few
invokes.

    inputs_for(runner, data)              -> [(label, sample)]
    outcomes(runner, inputs)              -> [None | ProbeFailure]   (per input, reference-free)
    run(runner, data, reference, threads) -> Probe                   (results.Probe)
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from optimize.core.errors import ModelError, TechniqueFailed
from optimize.core.results import Probe, ProbeFailure
from optimize.models import runtime
from optimize.models.data import Dataset, count, take

CALIBRATION_SAMPLES = 200  # the samples the calibrated range is read from (what int8 calibrates on)
REAL_SAMPLES = 2
SEED = 0


def _fill(arrays: dict[str, np.ndarray], value_of) -> dict[str, np.ndarray]:
    """One sample per input, every element set by value_of(array) (a scalar), in the array's dtype."""
    out = {}
    for name, a in arrays.items():
        v = value_of(a)
        out[name] = np.full((1, *a.shape[1:]), v, dtype=a.dtype)
    return out


def _middle(a: np.ndarray) -> float:
    lo, hi = float(a.min()), float(a.max())
    mid = (lo + hi) / 2
    if abs(mid) <= 1e-6 * max(abs(lo), abs(hi), 1e-12):  # a range centred on zero: zero is probed already
        mid = hi / 2
    v = float(f"{mid:.3g}")
    return round(v) if np.issubdtype(a.dtype, np.integer) else v


def _random(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(SEED)
    out = {}
    for name, a in arrays.items():
        lo, hi = a.min(axis=0).astype(np.float64), a.max(axis=0).astype(np.float64)
        x = lo + (hi - lo) * rng.random(lo.shape)
        out[name] = (np.round(x) if np.issubdtype(a.dtype, np.integer) else x).astype(a.dtype)[None]
    return out


def _label(what: str, arrays: dict[str, np.ndarray], value_of) -> str:
    if len(arrays) != 1:
        return what
    return f"{what} ({value_of(next(iter(arrays.values()))):.3g})"


def _unwrap(sample: dict[str, np.ndarray], keyed: bool):
    return sample if keyed else next(iter(sample.values()))


def inputs_for(runner: runtime.Runner, data: Dataset | None) -> list[tuple[str, object]]:
    """The probe inputs for this model and data, as (label, sample) pairs; a sample is what Runner.run takes."""
    if data is None:
        shapes = {n: tuple(int(v) for v in d["shape"]) for n, d in zip(runner.input_names, runner.inputs)}
        rng = np.random.default_rng(SEED)
        plain = [
            ("all-zero input", {n: np.zeros(s, np.float32) for n, s in shapes.items()}),
            ("constant input (0.5)", {n: np.full(s, 0.5, np.float32) for n, s in shapes.items()}),
            ("random values in [0, 1]", {n: rng.random(s).astype(np.float32) for n, s in shapes.items()}),
        ]
        return [(label, _unwrap(s, len(shapes) > 1)) for label, s in plain]
    cal = take(data.x_cal, data.calibration_index(CALIBRATION_SAMPLES))
    keyed = isinstance(cal, dict)
    arrays = cal if keyed else {"x": cal}
    lowest, highest = (lambda a: a.min().item()), (lambda a: a.max().item())
    out = [
        ("all-zero input", _fill(arrays, lambda a: 0)),
        (_label("constant input", arrays, _middle), _fill(arrays, _middle)),
        (_label("calibrated minimum", arrays, lowest), _fill(arrays, lowest)),
        (_label("calibrated maximum", arrays, highest), _fill(arrays, highest)),
        ("random values in the data's range", _random(arrays)),
    ]
    out = [(label, _unwrap(s, keyed)) for label, s in out]
    for i in range(min(REAL_SAMPLES, count(data.x_test))):
        out.append((f"real sample {i}", take(data.x_test, slice(i, i + 1))))
    return out


def outcome(runner: runtime.Runner, label: str, sample) -> ProbeFailure | None:
    """None when the model runs on the sample and every output is finite; else what went wrong."""
    try:
        outs = runner.run_fresh(sample)
    except runtime.InvokeError as e:
        f = e.failure
        return ProbeFailure(input=label, kind="invoke", node=f.node, op=f.op, message=f.message)
    bad = [runner.output_names()[j] for j, o in enumerate(outs) if not np.all(np.isfinite(o))]
    if bad:
        what = "NaN" if any(np.isnan(o).any() for o in outs) else "inf"
        return ProbeFailure(input=label, kind="non-finite", message=f"{what} in {', '.join(bad[:3])}")
    return None


def outcomes(runner: runtime.Runner, inputs: list[tuple[str, object]]) -> list[ProbeFailure | None]:
    """Each probe input's outcome on one model (None: it ran, and every output is finite)."""
    return [outcome(runner, label, sample) for label, sample in inputs]


_REFERENCE_MEMO: dict[tuple, list[ProbeFailure | None]] = {}


def _reference_outcomes(reference: Path, inputs, data: Dataset | None, threads: int) -> list[ProbeFailure | None]:
    """The float reference's outcomes on the probe inputs, computed once per process and data."""
    st = reference.stat()
    key = (str(reference.resolve()), st.st_mtime_ns, st.st_size, data.fingerprint if data else None)
    if key not in _REFERENCE_MEMO:
        _REFERENCE_MEMO.clear()
        loaded = runtime.load(reference, threads=threads, like=inputs[0][1])
        _REFERENCE_MEMO[key] = outcomes(runtime.Runner(loaded), inputs)
    return _REFERENCE_MEMO[key]


def run(runner: runtime.Runner, data: Dataset | None, reference: str | Path | None = None, threads: int = 2) -> Probe:
    """Probe one model (through its runner) against its float `reference` (a .tflite path; None: no
    comparison, every failure counts). Inputs the reference itself fails on are listed, not held against it."""
    inputs = inputs_for(runner, data)
    mine = outcomes(runner, inputs)
    theirs: list[ProbeFailure | None] = [None] * len(inputs)
    if reference is not None:
        try:
            theirs = _reference_outcomes(Path(reference), inputs, data, threads)
        except ModelError:
            theirs = [None] * len(inputs)  # a reference this runtime cannot run compares with nothing
    return Probe(
        inputs=[label for label, _ in inputs],
        reference=Path(reference).name if reference is not None else None,
        failures=[f for f, ref in zip(mine, theirs) if f is not None and ref is None],
        reference_failures=[label for (label, _), ref in zip(inputs, theirs) if ref is not None],
    )


def passed(runner: runtime.Runner, data: Dataset | None, reference: str | Path, reference_failures) -> Probe:
    """The probe of a model that already ran on every probe input, as the failure repair's check runs them
    (optimize.transforms.tflite.repair.Check: these inputs and more, where the float model runs): no failure,
    and the inputs its float reference fails on listed, as `run` would find them."""
    labels = [label for label, _ in inputs_for(runner, data)]
    theirs = set(reference_failures)
    return Probe(
        inputs=labels,
        reference=Path(reference).name,
        failures=[],
        reference_failures=[label for label in labels if label in theirs],
    )


class ProbeFailed(TechniqueFailed):
    """A candidate fails the robustness probe: it is a failed candidate, with the probe on its record."""

    def __init__(self, probe: Probe):
        self.probe = probe
        super().__init__(probe.line)

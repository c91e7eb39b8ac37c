"""What `optimize debug` says about fixes: only what was measured, and by how much.

Each fix is a `Tried`: measured here (on held-out samples, in the sweep's own measure: the worst output's
relative error against float32) or taken from a study the sweep wrote (its figures: points of top-1 lost, the
MAE's ratio, or the relative error, each against the study's own plain int8). A fix is printed as one to try
only when it took at least `HELPS` of the error away, with the figures; one measured and found wanting is
listed as such; one that failed is named with why, never suggested; one nobody measured is said to be
unmeasured. The cause is named first when the analysis finds one (a linear power spectrum quantized before
the LOG of a log-mel front end). Pure: no TensorFlow, no numpy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: A debug output error under this (of the output's range) leaves nothing worth fixing.
DEBUG_FINE = 0.005
#: A fix helps when it takes at least this share of the error away (the error left at most half).
HELPS = 0.5
#: RMSE over the output's scale beyond this points at clipping or a poor range, not rounding (~0.29).
DEBUG_CLIPPING = 0.7


@dataclass(frozen=True)
class Tried:
    """One fix and what measuring it found. `unit`: error (relative error, debug's and the sweep's fidelity
    measure), points (top-1 lost), mae (the MAE's ratio to float32's), detections (the share of float32's
    detections lost: a detector's measure); `before`/`after` in it (None: not
    measured); `where`: here, or the study's candidate that measured it; `failed`: why it could not be made."""

    what: str
    command: str
    before: float | None = None
    after: float | None = None
    unit: str = "error"
    where: str = "here"
    failed: str = ""

    @property
    def measured(self) -> bool:
        return self.after is not None and self.before is not None and math.isfinite(self.after)

    @property
    def helped(self) -> bool:
        if not self.measured:
            return False
        base = self.before - 1 if self.unit == "mae" else self.before
        left = self.after - 1 if self.unit == "mae" else self.after
        return base > 0 and left <= base * (1 - HELPS) + 1e-12

    def figures(self) -> str:
        """`output error 0.1985 -> 0.0012 (-99%)`, `8.3 -> 1.0 points of top-1 lost`, `MAE x1.12 -> x1.02`."""
        b, a = self.before, self.after
        if self.unit == "points":
            return f"{_points(b)} -> {_points(a)} points of top-1 lost"
        if self.unit == "mae":
            return f"MAE x{b:.3f} -> x{a:.3f} of float32's"
        if self.unit == "detections":  # the share of float32's detections lost
            return f"{(1 - b) * 100:.1f}% -> {(1 - a) * 100:.1f}% of float32's detections kept"
        change = ""
        if b > 0 and math.isfinite(b):
            change = " (no change)" if abs(a / b - 1) < 0.005 else f" ({(a / b - 1) * 100:+.0f}%)"
        before = f"{b:.4f}" if math.isfinite(b) else "inf (non-finite outputs)"
        return f"output error {before} -> {a:.4f}{change}"

    @property
    def source(self) -> str:
        return "measured here" if self.where == "here" else f"measured by the sweep ({self.where})"


def debug_fixes(report, tried: list[Tried] | None = None, cause: str = "") -> list[str]:
    """The lines `optimize debug` ends with: the cause when one was found, the fixes that helped (best
    first, each with its figures and command), those measured that did not, those that failed, and those
    not measured; "Nothing to fix" when the error is under DEBUG_FINE of the output's range."""
    scheme, err = str(report.scheme), report.output_error
    if err < DEBUG_FINE:
        return [f"Nothing to fix: {scheme} is within {err * 100:.2f}% of float32's output range on these samples."]
    tried = tried or []
    lines = [f"Cause: {cause}"] if cause else []
    helped = sorted((t for t in tried if t.helped), key=_left)
    lines += [f"Fix to try: {t.what}: {t.figures()}, {t.source}: `{t.command}`." for t in helped]
    if not helped:
        lines.append(
            f"No fix measured helps: none takes {HELPS:.0%} of {scheme}'s error away (what was tried is below)."
        )
    return lines + _not_fixes(tried)


def _not_fixes(tried: list[Tried]) -> list[str]:
    """What was measured and did not help, what could not be made (never suggested), what nobody measured."""
    lines = [
        f"Measured, did not help: {t.what}: {t.figures()}, {t.source}." for t in tried if t.measured and not t.helped
    ]
    for t in (t for t in tried if t.failed):
        where = "Not possible here" if t.where == "here" else f"Failed in the sweep, as {t.where}"
        lines.append(f"{where}: {t.what}: {t.failed}; not suggested.")
    return lines + [f"Not measured: {t.what} (`{t.command}`)." for t in tried if not t.measured and not t.failed]


def _points(x: float) -> str:
    """Points of top-1 lost, a gain shown as a negative loss, never `-0.0`."""
    return f"{x * 100:.1f}".replace("-0.0", "0.0")


def _left(t: Tried) -> float:
    """The share of the error a fix leaves (lower is better), to order the fixes that helped."""
    base = t.before - 1 if t.unit == "mae" else t.before
    left = t.after - 1 if t.unit == "mae" else t.after
    return left / base if base else 0.0


def stage_tried(stage, scheme: str) -> tuple[Tried | None, str]:
    """The output stage of an output of several scales (a detector's boxes and scores joined in one tensor), as
    measured by `optimize debug`: keeping it float, in the worst slice's error (and the detections kept), and the
    cause in words when one scale for the joined quantities is what breaks the model. (None, "") without one."""
    if stage is None or not stage.slices:
        return None, ""
    worst = max(stage.slices, key=lambda e: e.relative_error)
    after = next((e for e in stage.slices_float if e.name == worst.name and e.channels == worst.channels), None)
    det, det_f = stage.detections, stage.detections_float
    what = f"the output stage ({stage.op} #{stage.op_index} and after) kept float"
    command = "optimize run mixed-int8 MODEL --data D.npz"
    if det is not None and det_f is not None and det.kept_fraction is not None:  # a detector: its detections
        tried = Tried(what, command, 1 - det.kept_fraction, 1 - (det_f.kept_fraction or 0.0), unit="detections")
    else:
        tried = Tried(what, command, worst.relative_error, after.relative_error if after is not None else None)
    small = min(stage.slices, key=lambda e: e.range)  # the quantity one scale for the tensor cannot resolve
    big = max(stage.slices, key=lambda e: e.range)
    cause = (
        f"the output stage: {stage.op} #{stage.op_index} joins quantities of different scales in one {scheme} "
        f"tensor, {small.name} (range {small.range:.4g}) beside {big.name} (range {big.range:.4g}), so "
        f"{small.name} is {small.relative_error * 100:.2f}% of its range off float32"
    )
    if det is not None and det.kept_fraction is not None:
        cause += f" and {det.kept} of float32's {det.reference_detections} detections are kept"
    return tried, cause + "."

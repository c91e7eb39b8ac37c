"""Fidelity that sees slices: an output whose channels carry quantities of different scales, measured slice by
slice.

A detector's single head holds pixel boxes (0..1000) beside 0..1 class scores; a landmark output can hold pixel
coordinates beside visibility scores. The tensor-wide relative error (mean |diff| over the whole output's range)
is dominated by the big quantity: one int8 scale for the tensor can wipe the scores while the tensor's error reads
0.15%. So each output is cut along its feature axis into the channels one 8-bit scale for the whole tensor
resolves (range at least `SMALL` of the output's, 8 steps) and those it cannot, and each part is measured over
its own range. A model's layout (a recognised detector head: boxes, scores) or the caller names slices instead.

The worst slice's figure is the output's `relative_error` (what the table, the guard and `debug` read); the
tensor-wide figure stays beside it. Pure numpy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from optimize.core.results import SliceError

#: A channel whose range is under this share of the output's (fewer than 8 steps of one int8 scale for the
#: whole tensor) is a quantity of another scale: it is measured as a slice of its own.
SMALL = 1 / 32
#: ... and only where the channels' ranges fall into groups: sorted, two neighbours this far apart. Class logits
#: or an embedding spread their ranges evenly (MobileNetV2's 1,000 logits: no two neighbours 1.2x apart), and a
#: few quiet classes at the bottom of that spread are not another quantity.
GAP = 8.0


@dataclass(frozen=True)
class Slice:
    """Channels `channels` along `axis` of one output (batch is axis 0), measured together."""

    name: str
    axis: int
    channels: tuple[int, ...]


def feature_axis(shape: tuple[int, ...]) -> int | None:
    """The axis whose entries are the output's quantities: the last of [batch, F]; the smaller of the two
    trailing dims of [batch, a, b] (YOLO's [1, 4+C, N] and [1, N, 4+C] alike); channels of an image
    ([batch, H, W, C] or [batch, C, H, W], whichever is smaller). None for a vector per sample of one value."""
    rank = len(shape)
    if rank < 2:
        return None
    if rank == 2:
        return 1 if shape[1] > 1 else None
    if rank == 3:
        return 1 if shape[1] < shape[2] else 2
    if rank == 4:
        return 1 if shape[1] < shape[3] else 3
    return rank - 1


def channel_runs(channels: tuple[int, ...]) -> str:
    """`0-3`, `4-14`, `2,5,7-9`: channel indices in runs, for a slice's name."""
    runs, start = [], None
    for i, c in enumerate(channels):
        if start is None:
            start = c
        if i + 1 == len(channels) or channels[i + 1] != c + 1:
            runs.append(f"{start}" if start == c else f"{start}-{c}")
            start = None
    return ",".join(runs)


def _ranges(ref: np.ndarray, axis: int) -> np.ndarray:
    moved = np.moveaxis(ref, axis, 0).reshape(ref.shape[axis], -1).astype(np.float64)
    return moved.max(axis=1) - moved.min(axis=1)


def scale_slices(ref: np.ndarray, axis: int | None = None) -> list[Slice]:
    """The output cut by scale: the channels one int8 scale for the tensor resolves, and the rest (a range
    under `SMALL` of the output's and `GAP` below the next channel's, constant channels left out); [] when
    every channel is of one scale."""
    axis = feature_axis(ref.shape) if axis is None else axis
    if axis is None or ref.ndim <= axis or ref.shape[axis] < 2 or not ref.size:
        return []
    r = _ranges(ref, axis)
    whole = float(ref.max() - ref.min())
    cut = _gap(r, whole) if np.isfinite(whole) and whole > 0 else None
    if cut is None:
        return []
    small = tuple(int(c) for c in np.flatnonzero((r > 0) & (r <= cut)))
    large = tuple(int(c) for c in np.flatnonzero(r > cut))
    if not small or not large:
        return []
    return [Slice(f"channels {channel_runs(g)}", axis, g) for g in (large, small)]


def _gap(ranges: np.ndarray, whole: float) -> float | None:
    """The largest channel range of the quiet group, where the sorted ranges jump `GAP`-fold below `SMALL` of
    the output's; None for a continuum of ranges (class logits: one quantity)."""
    positive = np.sort(ranges[ranges > 0])
    if len(positive) < 2:
        return None
    steps = positive[1:] / positive[:-1]
    k = int(np.argmax(steps))
    return float(positive[k]) if steps[k] >= GAP and positive[k] < SMALL * whole else None


def _take(a: np.ndarray, s: Slice) -> np.ndarray:
    return np.take(a, list(s.channels), axis=s.axis)


def slice_errors(out: np.ndarray, ref: np.ndarray, slices: list[Slice]) -> list[SliceError]:
    """Each slice of `out` against the same slice of `ref`: mean and max |diff|, and the mean over the slice's
    own range in the reference."""
    from optimize.models.tasks import relative_error

    errs = []
    for s in slices:
        a, b = _take(out, s), _take(ref, s)
        d = np.abs(a.astype(np.float64) - b.astype(np.float64))
        errs.append(
            SliceError(
                name=s.name,
                axis=s.axis,
                channels=channel_runs(s.channels),
                range=float(b.max() - b.min()) if b.size else 0.0,
                mean_abs_diff=float(d.mean()) if d.size else 0.0,
                max_abs_diff=float(d.max()) if d.size else 0.0,
                relative_error=relative_error(a, b) if d.size else 0.0,
            )
        )
    return errs

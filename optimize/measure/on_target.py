"""A candidate's quality as the GPU computes it, beside the CPU's (`metrics.on_target.gpu`).

The CPU's figures are the CPU's arithmetic: hybrid kernels for dynamic range, integer kernels for int8. A GPU
dequantizes weights and computes in float (float16 for a float16 model), so the same file can be better or worse
there (measured on an H100: MediaPipe's hand landmark model as `dynamic` is 3.5-6.8% of range off float32 on the
CPU and 1.8-3.0% on the GPU). Where no GPU exists the GPU's arithmetic is emulated (`gpu_arithmetic.gpu_copy`,
run by the CPU interpreter); where one does, `--observe gpu` runs the candidate on it and `observed` turns its
outputs into the same record. The figures have the shape of `metrics.fidelity`, against the same float32
reference outputs, plus accuracy where there are labels.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from optimize.core.errors import ModelError
from optimize.core.results import Accuracy, Fidelity, TargetFidelity
from optimize.measure import batched
from optimize.measure.gpu_arithmetic import NotEmulated, gpu_copy
from optimize.models import runtime

#: An observed GPU whose worst output is this much further from float32 than the emulation (or the CPU) says, and
#: beyond this share of the output's range, computes the candidate badly: the candidate is flagged.
BAD_FACTOR = 3.0
BAD_ERROR = 0.02


def _target(fid: Fidelity, method: str, how: str, acc: Accuracy | None = None, **delta) -> TargetFidelity:
    return TargetFidelity(**dict(fid), method=method, how=how, accuracy=acc, **delta)


def emulated(path: Path, xs, score, threads: int = 2, cpu: tuple | None = None) -> TargetFidelity | None:
    """The candidate's figures in the GPU's arithmetic, emulated on the CPU. `score(outs, runner)` turns outputs
    into (Fidelity, Accuracy | None, the change against the baseline): the same measure as the CPU's figures,
    `cpu` (those figures, taken as they are where the GPU computes as the CPU does). None when the emulated copy
    cannot be run here (said in the log)."""
    try:
        content, how = gpu_copy(Path(path).read_bytes())
    except NotEmulated as e:
        if cpu is not None and cpu[0] is not None:
            return _target(cpu[0], "emulated", f"{e}: the CPU's figures", cpu[1], **cpu[2])
        content, how = Path(path).read_bytes(), f"{e}: the CPU's figures"
    except Exception as e:  # a flatbuffer the rewrite does not understand: no figure, not a failed candidate
        logging.getLogger(__name__).warning("%s: the GPU's arithmetic was not emulated (%s)", Path(path).name, e)
        return None
    try:
        runner = runtime.Runner(runtime.load(content, threads=threads, like=_first(xs)))
        outs = batched.predict(content, runner, xs, threads)
    except ModelError as e:
        logging.getLogger(__name__).warning("%s: its GPU emulation does not run here (%s)", Path(path).name, e)
        return None
    fid, acc, delta = score(outs, runner)
    return _target(fid, "emulated", how, acc, **delta)


def _first(xs):
    from optimize.models.data import take

    return take(xs, slice(0, 1))


def observed(
    fid: Fidelity, device: str, acc: Accuracy | None = None, expected: Fidelity | None = None, **delta
) -> TargetFidelity:
    """The figures of outputs the GPU computed (on `device`), flagged where they are far worse than the
    arithmetic says they should be (`expected`: the emulation's, or the CPU's)."""
    flag = _far(fid, expected) or _lost(fid, expected)
    return _target(fid, "observed", device, acc, flagged=flag, **delta)


def _far(fid: Fidelity, expected: Fidelity | None) -> str | None:
    """The worst output further from float32 than `BAD_ERROR`, and `BAD_FACTOR` times what was expected."""
    mine = fid.worst()
    theirs = expected.worst() if expected is not None else None
    if mine is None or mine.relative_error is None or mine.relative_error <= BAD_ERROR:
        return None
    base = theirs.relative_error if theirs is not None and theirs.relative_error is not None else 0.0
    if mine.relative_error <= BAD_FACTOR * max(base, 1e-4):
        return None
    return (
        f"the GPU computes it badly: output {mine.name} is {mine.relative_error * 100:.2f}% of its range off "
        f"float32 there, against {base * 100:.2f}% in its arithmetic on the CPU"
    )


def _lost(fid: Fidelity, expected: Fidelity | None) -> str | None:
    """A detector keeping under 90% of float32's detections there, 5 points fewer than expected."""
    det = fid.detection
    if det is None or det.kept_fraction is None or det.kept_fraction >= 0.9:
        return None
    exp = expected.detection.kept_fraction if expected is not None and expected.detection else None
    if exp is not None and exp - det.kept_fraction <= 0.05:
        return None
    return f"the GPU computes it badly: it keeps {det.kept_fraction * 100:.0f}% of float32's detections"


def differs(cpu: Fidelity | None, gpu: TargetFidelity | None) -> bool:
    """Whether the GPU's figures differ from the CPU's (a dynamic candidate's do; a float32 one's do not)."""
    if cpu is None or gpu is None:
        return False
    a = [o.relative_error for o in cpu.outputs]
    b = [o.relative_error for o in gpu.outputs]
    return not np.allclose(np.nan_to_num(np.array(a, float)), np.nan_to_num(np.array(b, float)), rtol=1e-6, atol=0)

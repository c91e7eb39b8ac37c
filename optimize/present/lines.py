"""One-line descriptions of what a candidate holds, in the same words on the terminal (`report_text`) and in
the report (`report`): sizes, float islands and what they cost, a PyTorch or ONNX model's conversion."""

from __future__ import annotations

import re

from optimize.core.results import Candidate


def fmt_bytes(n: int | None) -> str:
    if n is None:
        return ""
    return f"{n / 1e6:.2f} MB" if n >= 1e6 else f"{n / 1e3:.1f} kB"


def island_cost(c: Candidate, baseline: Candidate | None = None) -> str:
    """What a quantized candidate's float islands cost, in one line: the ops computing in float, their float
    weights, the conversions at their edges, XNNPACK's partitions, the latency, and the repair's time."""
    comp = c.composition
    if comp is None or not comp.compute_ops:
        return ""
    share = comp.float_compute_count / comp.compute_ops
    parts = [f"{comp.float_compute_count} of {comp.compute_ops} ops compute in float ({share:.0%})"]
    weights = sum(i.weight_bytes for i in c.islands)
    if weights:
        parts.append(f"{fmt_bytes(weights)} of float weights")
    parts.append(f"{comp.conversions} QUANTIZE/DEQUANTIZE")
    x = c.delegates.get("xnnpack")
    if x is not None:
        parts.append(f"XNNPACK {x.nodes_delegated}/{x.nodes_total} nodes in {x.partitions} partition(s)")
    if c.p50_ms is not None and baseline is not None and baseline.p50_ms:
        parts.append(f"p50 {c.p50_ms / baseline.p50_ms:.2f}x {baseline.name}")
    if c.repair is not None:
        parts.append(f"repaired in {c.repair.rounds} round(s), {c.repair.seconds:.1f} s ({c.repair.route})")
    return ", ".join(parts)


def island_groups(c: Candidate) -> list[str]:
    """The islands grouped by reason: `DIV truediv (kept int8, divisor clamped): fails on ...`, `LOG x3,
    RFFT2D: LiteRT Quantizer has no integer version of it`."""
    by_reason: dict[str, list] = {}
    for i in c.islands:
        by_reason.setdefault(i.reason, []).append(i)
    out = []
    for reason, items in by_reason.items():
        if len(items) <= 2:
            what = ", ".join(
                f"{i.op} {i.tensor}" + ("" if i.precision == "float" else f" ({i.precision})") for i in items
            )
        else:
            counts: dict[str, int] = {}
            for i in items:
                counts[i.op] = counts.get(i.op, 0) + 1
            what = ", ".join(f"{op} x{n}" if n > 1 else op for op, n in counts.items())
        out.append(f"{what}: {reason}")
    return out


def conversion_line(c) -> str:
    """A PyTorch or ONNX model's conversion in one line: what converted it, the layout its image inputs take,
    and its own error against the source runtime (apart from any quantization error)."""
    fid = c.fidelity
    cost = "not measured (no data)"
    if fid is not None:
        worst = fid.worst()
        rel = f"rel err {worst.relative_error:.1e}" if worst is not None and worst.relative_error is not None else ""
        peak = max((o.max_abs_diff for o in fid.outputs), default=0.0)
        agree = f", agree {fid.top1_agreement:.1%}" if fid.top1_agreement is not None else ""
        cost = (
            f"float32 vs {fid.reference}: {rel} (max |diff| {peak:.1e}){agree}, {fid.samples} samples{_few_star(fid)}"
        )
    layout = ", ".join(f"{i.key} {i.layout}" for i in c.inputs if i.layout)
    moved = f"; {c.transposes} TRANSPOSE op(s) left" if c.transposes else ""
    fixed = "".join(f"; {m.group(0)}" for m in (_FIXED.match(f) for f in c.facts) if m)
    return f"conversion of {c.file} ({c.route}{'; ' + layout if layout else ''}{moved}{fixed}): {cost}"


#: A conversion fact saying a dynamic input dimension was fixed to the data's shape (`input x [?, 8] fixed to
#: [1, 8]`): the converted model takes that shape only, so the one line about the conversion says it.
_FIXED = re.compile(r"input \S+ \[[^\]]*\] fixed to \[[^\]]*\]")


def _few_star(fid) -> str:
    return "*" if fid.few_samples else ""


def samples_of(c: Candidate) -> int | None:
    """The number of test samples a candidate's quality figure stands on (its accuracy's, else its fidelity's)."""
    m = c.metrics
    if m is None:
        return None
    if m.accuracy is not None:
        return m.accuracy.samples
    return m.fidelity.samples if m.fidelity is not None else None

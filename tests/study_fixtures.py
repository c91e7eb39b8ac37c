"""Hand-built Study objects for the recommender and report tests: no TensorFlow, no files.

Figures are loosely those of the small digits CNN in the platform notes (float32 ~152 KB, int8 ~4x
smaller, dynamic range slower than float on the CPU, int16x8 on slow reference kernels).
"""

from __future__ import annotations

import hashlib

from optimize.core.results import (
    Accuracy,
    Candidate,
    DelegateReport,
    Environment,
    Fidelity,
    Latency,
    Metrics,
    NodeVerdict,
    OutputFidelity,
    Size,
    Step,
    Study,
)

DELEGATES = ("gpu", "nnapi", "hexagon", "coreml", "xnnpack")
BASE_TOP1 = 0.9667


def report(
    delegate: str, verdict: str = "full", total: int = 12, *, reason: str = "", source: str = "rules"
) -> DelegateReport:
    """A delegate report: 'full' takes every node; 'partial' leaves two ops; 'none' vetoes the model."""
    if verdict == "full":
        return DelegateReport(
            delegate=delegate, source=source, nodes_total=total, nodes_delegated=total, partitions=1, verdict="full"
        )
    if verdict == "partial":
        nodes = [
            NodeVerdict(index=0, op="QUANTIZE", version=1, reason=reason or "float input is rejected"),
            NodeVerdict(
                index=total - 1, op="DEQUANTIZE", version=2, reason=reason or "output type <float> & not supported"
            ),
        ]
        return DelegateReport(
            delegate=delegate,
            source=source,
            nodes_total=total,
            nodes_delegated=total - 2,
            partitions=1,
            verdict="partial",
            cpu_nodes=nodes,
        )
    return DelegateReport(
        delegate=delegate,
        source=source,
        nodes_total=total,
        nodes_delegated=0,
        partitions=0,
        verdict="none",
        vetoed=reason or "model type not supported",
    )


def reports(**verdicts: str) -> dict[str, DelegateReport]:
    """reports(gpu="full", hexagon="none") -> {delegate: DelegateReport}; unnamed delegates are full."""
    out = {}
    for d in DELEGATES:
        v = verdicts.get(d, "full")
        if v != "missing":
            out[d] = report(d, v, source="runtime" if d == "xnnpack" else "rules")
    return out


def latency(p50: float, threads: int = 2, xnnpack: bool = True) -> Latency:
    return Latency(
        runtime="ai-edge-litert 2.3.0 (host CPU)",
        threads=threads,
        xnnpack=xnnpack,
        warmup_runs=5,
        runs=50,
        init_ms=3.0,
        first_ms=p50 * 2,
        mean_ms=p50 * 1.05,
        std_ms=p50 * 0.1,
        p50_ms=p50,
        p90_ms=p50 * 1.2,
        min_ms=p50 * 0.9,
    )


def candidate(
    name: str,
    scheme: str = "float32",
    *,
    size: int = 152_000,
    gzip: int | None = None,
    delta: float | None = 0.0,
    p50: float | None = 1.0,
    steps: list[Step] | None = None,
    io: str = "float",
    delegates: dict[str, DelegateReport] | None = None,
    error: str | None = None,
    backend: str = "converter",
) -> Candidate:
    """One candidate; `error` makes it a failed one (no metrics)."""
    params = {"scheme": scheme, "io": io}
    steps = steps if steps is not None else [Step(technique="convert", params=params)]
    metrics = None
    if error is None:
        metrics = Metrics(
            size=Size(bytes=size, gzip_bytes=gzip if gzip is not None else int(size * 0.93)),
            accuracy=None if delta is None else Accuracy(samples=360, top1=round(BASE_TOP1 + delta, 4)),
            accuracy_delta=delta,
            fidelity=Fidelity(
                reference="float32.tflite",
                samples=100,
                outputs=[
                    OutputFidelity(
                        name="Identity", mean_abs_diff=abs(delta or 0) / 3, std_abs_diff=0.001, max_abs_diff=0.02
                    )
                ],
                top1_agreement=1.0 + min(delta or 0.0, 0.0),
            ),
            latency=None if p50 is None else latency(p50, xnnpack=scheme != "int16x8"),
        )
    return Candidate(
        name=name,
        steps=steps,
        recipe_hash=hashlib.sha256(name.encode()).hexdigest()[:16],
        scheme=scheme,
        backend=backend,
        artifact=None if error else f"artifacts/{name}.tflite",
        metrics=metrics,
        delegates=delegates if delegates is not None else ({} if error else reports()),
        error=error,
    )


ENV = Environment(
    python="3.11.2",
    platform="Linux-x86_64",
    host="test-host",
    cpu_count=2,
    versions={"tensorflow": "2.21.0", "ai-edge-litert": "2.3.0"},
    threads=2,
)


def study(candidates: list[Candidate], *, data: str | None = "digits", baseline: str = "float32") -> Study:
    return Study(
        created="2026-01-01T00:00:00Z",
        model="demo",
        model_fingerprint="abc123",
        data=data,
        baseline=baseline,
        environment=ENV,
        candidates=candidates,
    )


def full_study() -> Study:
    """Baseline plus every kind of candidate, with delegate reports, a pruned one and a failed one."""
    prune = Step(technique="prune", params={"target_sparsity": 0.5})
    return study(
        [
            candidate("float32", size=152_000, gzip=143_000, delta=0.0, p50=1.0, delegates=reports(hexagon="none")),
            candidate(
                "float16", "float16", size=78_000, gzip=72_000, delta=0.0, p50=1.1, delegates=reports(hexagon="none")
            ),
            candidate(
                "dynamic",
                "dynamic",
                size=41_000,
                gzip=36_000,
                delta=-0.0028,
                p50=1.9,
                delegates=reports(gpu="partial", nnapi="none", hexagon="none", coreml="none"),
            ),
            candidate(
                "int8",
                "int8",
                size=42_000,
                gzip=35_000,
                delta=-0.0084,
                p50=0.6,
                delegates=reports(hexagon="partial", coreml="none"),
            ),
            candidate(
                "int8_io",
                "int8",
                io="int8",
                size=41_500,
                gzip=34_800,
                delta=-0.0111,
                p50=0.55,
                delegates=reports(coreml="none"),
            ),
            candidate(
                "int16x8",
                "int16x8",
                size=48_000,
                gzip=40_000,
                delta=0.0,
                p50=25.0,
                delegates=reports(gpu="none", nnapi="none", hexagon="none", coreml="none", xnnpack="none"),
            ),
            candidate(
                "pruned",
                size=152_000,
                gzip=86_000,
                delta=-0.0056,
                p50=1.0,
                steps=[prune, Step(technique="convert", params={"scheme": "float32", "io": "float"})],
                delegates=reports(hexagon="none"),
            ),
            candidate(
                "int16x8_mnv3", "int16x8", error="Quantization to 16x8-bit not yet supported for op: 'HARD_SWISH'"
            ),
        ]
    )


def empty_study() -> Study:
    return study([])

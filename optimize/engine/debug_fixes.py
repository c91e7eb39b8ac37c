"""The fixes `optimize debug` measures, each on the same held-out samples and in the sweep's measure (the worst
output's relative error against float32), and those a study of the same model already measured.

Measured here: each leave-one-out op the analysis measured (keep it float), those ops kept float together, the
front end that feeds a float LOG / square root / division kept float (where int8 loses a log-mel spectrum's
quiet frames), other activation ranges (`--ranges auto`) and, for int8, 16-bit activations (int16x8): one
quantization and one pass over the samples each. From a study (its own figures against its own plain int8):
int16x8, the selective search (mixed-int8) and quantization-aware training (qat-int8), failed ones included.
Quantization-aware training nobody measured is offered only where the model can be fine-tuned here.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from optimize.core.errors import OptimizeError, StudyError, TechniqueFailed
from optimize.core.results import Candidate, DebugReport, Study, load_study
from optimize.core.vocab import Scheme
from optimize.decide.debug_advice import Tried
from optimize.measure import layer_error
from optimize.models import runtime

log = logging.getLogger(__name__)
MODEL = "MODEL --data D.npz"
MIXED = f"optimize run mixed-int8 {MODEL}"


@dataclass
class Bench:
    """What every measurement here shares: the samples, the float model's outputs on them, the threads."""

    samples: layer_error.Samples
    reference: list
    threads: int

    def error(self, quantized: bytes) -> float:
        """The sweep's measure of one variant: the worst output's relative error against float32."""
        like = self.samples.items[0] if self.samples.items else None
        runner = runtime.Runner(runtime.load(quantized, threads=self.threads, like=like))
        return layer_error.output_error([(r, runner.run_fresh(s)) for r, s in zip(self.reference, self.samples.items)])


def leave_outs(report: DebugReport) -> list[Tried]:
    """Each op the analysis measured kept float alone."""
    err = report.output_error
    return [
        Tried(f"keep {le.op} #{le.op_index} float", MIXED, err, le.output_error_without)
        for le in report.layers
        if le.output_error_without is not None
    ]


def upstream(quantized: bytes, tensors: list[str]) -> list[str]:
    """The quantized ops' output tensors from the model's inputs up to `tensors` (those included): the front
    end that computes them."""
    from optimize.models.tflite import read_model

    sg = read_model(quantized).main
    producer = {o: op for op in sg.ops for o in op.outputs if o >= 0}
    index = {t.name: t.index for t in sg.tensors}
    seen, out, todo = set(), [], [index[t] for t in tensors if t in index]
    while todo:
        t = todo.pop()
        op = producer.get(t)
        if t in seen or op is None:
            continue
        seen.add(t)
        out_t = sg.tensors[op.outputs[0]]
        if op.name not in ("QUANTIZE", "DEQUANTIZE") and out_t.dtype in layer_error.QUANT_DTYPES:
            out.append(out_t.name)
        todo += [i for i in op.inputs if i >= 0 and not sg.tensors[i].is_const]
    return out


def together_and_front(report: DebugReport, session, full: bytes, bench: Bench) -> tuple[list[Tried], str]:
    """The measured ops kept float together, and the front end feeding a sensitive float op (LOG, square root,
    division) kept float; with the cause named when that front end holds the error no single op does."""
    err, out = report.output_error, []
    measured = [le.tensor for le in report.layers if le.output_error_without is not None]
    if len(measured) > 1:
        out.append(
            _variant(f"keep the {len(measured)} ops measured above float together", session, measured, err, bench)
        )
    feeding = layer_error.feeding_sensitive_ops(full)
    front = upstream(full, list(feeding))
    if not front or sorted(front) == sorted(measured):
        return out, ""
    sensitive = sorted(set(feeding.values()))
    tried = _variant(f"keep the {len(front)} ops feeding {'/'.join(sensitive)} float (its front end)", session,
                     front, err, bench)  # fmt: skip
    out.append(tried)
    alone = [t for t in leave_outs(report) if t.helped]
    cause = ""
    if tried.helped and not alone:
        tensor, op = next(iter(feeding.items()))
        le = next((le for le in report.layers if le.tensor == tensor), None)
        name = f"{le.op} #{le.op_index} ({tensor})" if le is not None else tensor
        what = (
            "a linear quantity with a wide range (a power spectrum, as in a log-mel front end)"
            if op == "LOG"
            else "a quantity that comes near zero"
        )
        cause = (
            f"{name} is quantized to {report.scheme} before the float {op} it feeds: {what} spans more than "
            f"{report.scheme}'s steps hold, its small values round away and {op} magnifies the loss; no single op "
            f"holds the error (each kept float alone leaves it), the front end kept float does."
        )
    return out, cause


def _variant(what: str, session, tensors: list[str], err: float, bench: Bench) -> Tried:
    try:
        after = bench.error(session.quantize(dict.fromkeys(tensors, "float")))
    except (TechniqueFailed, OptimizeError) as e:
        return Tried(what, MIXED, failed=str(getattr(e, "problem", e)))
    return Tried(what, MIXED, err, after)


def other_schemes(report: DebugReport, make, bench: Bench, skip: set[str], scheme: str) -> list[Tried]:
    """Other activation ranges and, for int8, 16-bit activations, each made by `make(params_update)` (a
    repaired session's model): what the study already measured (`skip`) is not measured again."""
    err, out = report.output_error, []
    wanted = [("other activation ranges (--ranges auto)", {"calibration": "auto"}, f"--scheme {scheme} --ranges auto")]
    if scheme == Scheme.INT8 and "int16x8" not in skip:
        wanted.append(("16-bit activations (int16x8)", {"scheme": "int16x8"}, "--scheme int16x8"))
    for what, update, opts in wanted:
        command = f"optimize quantize MODEL -c D.npz {opts}"
        try:
            after = bench.error(make(update))
        except (TechniqueFailed, OptimizeError) as e:
            out.append(Tried(what, command, failed=str(getattr(e, "problem", e)).rstrip(".")))
            continue
        out.append(Tried(what, command, err, after))
    return out


#: What a study measured that debug would suggest: (what, command, test on a candidate).
FROM_STUDY = (
    ("16-bit activations (int16x8)", "optimize quantize MODEL -c D.npz --scheme int16x8", "int16x8"),
    ("the selective search (mixed-int8: ops raised to float or 16-bit)", MIXED, "selective"),
    ("quantization-aware training", f"optimize qat {MODEL}", "qat"),
)


def _kind(c: Candidate) -> str | None:
    if c.uses("selective"):
        return "selective"
    if c.uses("qat"):
        return "qat" if c.scheme == Scheme.INT8 else None
    if c.scheme == Scheme.INT16X8 and not c.uses("prune", "cluster"):
        return "int16x8"
    return None


def _figure(c: Candidate) -> tuple[str, float] | None:
    """A candidate's loss in the study's own terms: points lost, the MAE's ratio, else the relative error."""
    m = c.metrics
    if m is None:
        return None
    if m.accuracy_delta is not None:
        return "points", -m.accuracy_delta
    if m.error_ratio is not None:
        return "mae", m.error_ratio
    if m.fidelity is not None and m.fidelity.relative_error is not None:
        return "error", m.fidelity.relative_error
    return None


def _plain_int8(study: Study) -> Candidate | None:
    """The study's post-training int8 with float I/O and no other technique: what the fixes are compared with."""
    for c in study.candidates:
        if c.ok and c.scheme == Scheme.INT8 and c.io == "float" and not c.uses("prune", "cluster", "qat", "selective"):
            return c
    return None


def from_study(study: Study, where: str) -> list[Tried]:
    """The fixes a study measured, each against the study's own plain int8 (the same samples): failed ones
    with why."""
    plain = _plain_int8(study)
    base = _figure(plain) if plain is not None else None
    out = []
    for what, command, kind in FROM_STUDY:
        found = [c for c in study.candidates if _kind(c) == kind]
        c = next((c for c in found if c.ok), found[0]) if found else None
        if c is None:
            continue
        label = f"{c.name} in {where}"
        if not c.ok:
            out.append(Tried(what, command, where=label, failed=(c.error or "failed").rstrip(".")))
            continue
        fig = _figure(c)
        if fig is not None and base is not None and fig[0] == base[0]:
            out.append(Tried(what, command, base[1], fig[1], unit=fig[0], where=label))
    return out


def qat_offer(src, ds) -> Tried | None:
    """Quantization-aware training, not measured: offered where the model can be fine-tuned here, named as
    impossible (with why) where it cannot."""
    from optimize.models import facts

    why = facts.training_blocker(src, ds)
    if why is None:
        refusal = facts.keras_refusal(src, ds)
        why = refusal.problem if refusal is not None else None
    what = "quantization-aware training"
    return Tried(what, f"optimize qat {MODEL}", failed=why.rstrip(".")) if why else Tried(what, f"optimize qat {MODEL}")


def find_study(given: str | Path | None, model: str | Path, src) -> tuple[Study, str] | None:
    """The study of this model: the one given (refused in one line when it is another model's), else a
    study.json beside the model or in ./optimize-out that a sweep of this model wrote; None when there is
    none."""
    if given is not None:
        study = load_study(given)
        if not _same_model(study, Path(given) if Path(given).is_dir() else Path(given).parent, model, src):
            raise StudyError(
                f"{given} is the study of another model ({study.model}).", "Pass the study a sweep of this model wrote."
            )
        return study, str(given)
    for folder in dict.fromkeys([Path(model).parent, Path(model).parent.parent, Path("optimize-out")]):
        path = folder / "study.json"
        if not path.is_file():
            continue
        try:
            study = load_study(path)
        except OptimizeError:
            continue
        if _same_model(study, folder, model, src):
            return study, str(path)
    return None


def _same_model(study: Study, folder: Path, model, src) -> bool:
    if study.model_fingerprint == src.fingerprint:
        return True
    try:
        mine = Path(model).resolve()
    except OSError:
        return False
    return any(
        c.artifact and (folder / c.artifact).resolve() == mine and c.scheme == "float32" for c in study.candidates
    )


def reference(float_model: bytes, samples: layer_error.Samples, threads: int) -> list:
    like = samples.items[0] if samples.items else None
    runner = runtime.Runner(runtime.load(float_model, threads=threads, like=like))
    return [[np.asarray(o) for o in runner.run_fresh(s)] for s in samples.items]

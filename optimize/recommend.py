"""From "what should I ship for this target?" to a decision: a decision tree, and a choice over a study.

Two answers, both pure (no TensorFlow, no numpy), so they are tested case by case in milliseconds:

- `advise(target, ...)` walks a decision tree (target precision -> data available -> accuracy
  sensitivity -> objective) without any measurement, and returns every question it asked with the
  answer that decided it, the pipeline it recommends as a runnable recipe, the alternatives and the
  facts users trip over.
- `recommend(study, target, goals)` chooses from what was measured: candidates that ran, that the
  target can execute, and that meet every goal, ranked by the objective; the Pareto front over size,
  latency and accuracy; and, for every rejected candidate, the first check it failed.

Conventions: accuracy drop is `-metrics.accuracy_delta` (a fraction; 0.01 is one point). Latency is
the host-CPU `p50_ms`. The size objective ranks by the raw `.tflite` size (`size.bytes`): that is
what a delegate loads and what flash holds. Pruning and clustering shrink only the gzip size, so a
fact says so whenever the study holds pruned or clustered candidates (their gzip size is in the report).
"""

from __future__ import annotations

import math

from .errors import GoalsNotMet, OptimizeError, StudyError
from .results import Candidate, Goals, Record, Step, Study
from .vocab import TARGET_DELEGATE, Target, names

#: Accuracy drops below this (one point) count as "sensitive": int8 PTQ may not hold them.
SENSITIVE_DROP = 0.01
_EPS = 1e-9  # goals compare with a tolerance, so a drop of exactly 0.01 meets max_accuracy_drop 0.01

TARGET_FACTS: dict[str, tuple[str, ...]] = {
    "cpu": (
        "On the CPU, XNNPACK runs float32 and int8 fast; float16 weights are dequantized to float32 (smaller, not faster).",
        "Dynamic-range models are often slower than float32 on the CPU (MobileNetV2 here: ~9.5 ms vs ~4 ms): measure.",
        "int16x8 rescues accuracy that int8 breaks, but runs on slow single-threaded reference kernels.",
    ),
    "gpu": (
        "The GPU delegate wants float16: it computes in float16, so float16 halves the file at no speed or accuracy cost.",
        "The GPU runs 8-bit models only by dequantizing them to float: smaller, not faster.",
    ),
    "nnapi": (
        "NNAPI is deprecated from Android 15: prefer the GPU delegate or a vendor delegate (e.g. Qualcomm QNN).",
        "NNAPI rejects dynamic-range (weight-only) models; accelerators want full int8 with symmetric weights.",
    ),
    "hexagon": (
        "The Hexagon delegate takes only full int8 (8-bit) models, and is superseded by Qualcomm's QNN delegate.",
    ),
    "coreml": (
        "The Core ML delegate runs float models only: ship float16 (the Neural Engine computes in float16).",
        "int8 and dynamic-range models stay on the CPU under Core ML.",
    ),
    "edgetpu": (
        "The Edge TPU needs full int8 with integer (int8/uint8) input and output, compiled with `edgetpu_compiler`.",
        "Ops the Edge TPU compiler cannot map run on the host CPU, often slower than no accelerator at all.",
    ),
    "mcu": (
        "Microcontrollers (TFLite Micro) need full int8 with int8 input and output: there are no float kernels to fall back to.",
    ),
}
PRUNE_FACT = (
    "Pruning and clustering shrink only the compressed (gzip) size; the .tflite file and its latency stay the same."
)
SLOWER_FACT = "A quantized model measured slower than float is never recommended for latency."
DATA_FACT = "Full int8 needs 100-500 representative inputs (unlabelled is fine) or quantization-aware training."


class Question(Record):
    """One step of the decision path: what was asked, what the answer was, what it decided."""

    question: str
    answer: str
    decided: str


class Advice(Record):
    """The decision tree's answer for one target, before (or without) any measurement."""

    target: str
    path: list[Question]
    pipeline: list[dict]
    recipe_toml: str
    alternatives: list[str]
    facts: list[str]


class Rejection(Record):
    """A measured candidate that was not eligible, with the first check it failed."""

    candidate: str
    reason: str


class Recommendation(Record):
    """The choice over a study. `chosen` is None when nothing meets the goals (the CLI exits 1)."""

    target: str
    goals: Goals
    advice: Advice
    chosen: str | None
    chosen_recipe_toml: str | None = None
    ranked: list[str]
    pareto: list[str]
    rejected: list[Rejection]
    facts: list[str]


# ----------------------------------------------------------------------------------------- inputs
def check_target(target: str) -> str:
    """Return the target, or raise one clear line naming the known ones."""
    if target not in names(Target):
        raise OptimizeError(f"Unknown target {target!r}.", f"Choose one of: {', '.join(names(Target))}.")
    return Target(target)


def make_goals(
    max_accuracy_drop: float | None = None,
    max_size_bytes: int | None = None,
    max_latency_ms: float | None = None,
    objective: str = "size",
) -> Goals:
    """Build Goals from CLI options; a negative or out-of-range goal or an unknown objective is one clear line."""
    from pydantic import ValidationError

    try:
        return Goals(
            max_accuracy_drop=max_accuracy_drop,
            max_size_bytes=max_size_bytes,
            max_latency_ms=max_latency_ms,
            objective=objective,
        )
    except ValidationError as e:
        err = e.errors()[0]
        field = ".".join(str(x) for x in err["loc"])
        raise OptimizeError(
            f"Goal {field}={err.get('input')!r} is impossible: {err['msg']}.",
            "Accuracy drop is a fraction 0..1 (0.01 = one point), sizes and latencies are positive, "
            "objective is size, latency or accuracy.",
        ) from None


# ---------------------------------------------------------------------------------- decision tree
def _convert(scheme: str, io: str = "float") -> dict:
    step = {"technique": "convert", "scheme": scheme}
    if io != "float":
        step["io"] = io
    return step


def _describe(steps: list[dict]) -> str:
    parts = []
    for s in steps:
        params = ", ".join(f"{k}={v}" for k, v in s.items() if k != "technique")
        parts.append(f"{s['technique']}({params})")
    return " -> ".join(parts)


def recipe_toml(name: str, steps: list[dict], target: str | None = None, goals: Goals | None = None) -> str:
    """A pipeline as TOML the user can save and run with `optimize run` (no registry validation here)."""
    from .recipe import Recipe

    recipe = Recipe(
        name=name,
        targets=(target,) if target else (),
        goals=goals or Goals(),
        steps=tuple(
            Step(technique=s["technique"], params={k: v for k, v in s.items() if k != "technique"}) for s in steps
        ),
    )
    return recipe.to_toml()


def advise(
    target: str,
    *,
    have_calibration_data: bool = True,
    have_training_data: bool = False,
    goals: Goals | None = None,
) -> Advice:
    """Walk the decision tree: target precision -> data available -> accuracy sensitivity -> objective.

    Every question asked is recorded with the answer that decided it, so the user sees why.
    Only questions that matter for the target are asked (float16 needs no data, so the GPU path
    never asks about calibration data).
    """
    target = check_target(target)
    goals = goals or Goals()
    path: list[Question] = []
    alts: list[tuple[str, list[dict]]] = []
    facts = list(TARGET_FACTS[target])
    drop = goals.max_accuracy_drop
    sensitive = drop is not None and drop < SENSITIVE_DROP - _EPS
    drop_answer = "not stated" if drop is None else f"at most {drop * 100:g} point(s)"

    def ask(question: str, answer: str, decided: str) -> None:
        path.append(Question(question=question, answer=answer, decided=decided))

    if target in ("gpu", "coreml"):
        steps = _float_path(target, goals, have_calibration_data, ask, alts)
    elif target == "cpu":
        steps = _cpu_path(goals, have_calibration_data, have_training_data, sensitive, drop_answer, ask, alts)
    else:
        steps = _int8_path(target, have_calibration_data, have_training_data, sensitive, drop_answer, ask, alts, facts)

    if any(s["technique"] in ("prune", "cluster") for _, a in alts for s in a):
        facts.append(PRUNE_FACT)
    if goals.objective == "latency" or goals.max_latency_ms is not None:
        facts.append(SLOWER_FACT)
    if goals.max_size_bytes is not None or goals.max_latency_ms is not None:
        facts.append("Size and latency goals are checked against measurements: run `optimize sweep` with them.")
    return Advice(
        target=target,
        path=path,
        pipeline=steps,
        recipe_toml=recipe_toml(f"{target}-recommended", steps, target, goals),
        alternatives=[f"{label}: {_describe(s)}" for label, s in alts],
        facts=facts,
    )


def _float_path(target, goals, have_calibration_data, ask, alts) -> list[dict]:
    """GPU and Core ML: float16 unless no accuracy drop at all is allowed."""
    device = "The GPU delegate" if target == "gpu" else "Core ML"
    ask(
        f"Which precision does {target} run?",
        f"{device} runs float32/float16" + ("; 8-bit models are dequantized to float" if target == "gpu" else " only"),
        "float16 conversion: half the size, computed in float16 anyway",
    )
    if goals.max_accuracy_drop is not None and goals.max_accuracy_drop <= _EPS:
        ask("How much accuracy can you give up?", "none", "keep float32: float16 rounding can move outputs slightly")
        alts.append(("float16, half the size, usually identical accuracy", [_convert("float16")]))
        return [_convert("float32")]
    answer = "not stated" if goals.max_accuracy_drop is None else f"at most {goals.max_accuracy_drop * 100:g} point(s)"
    ask("How much accuracy can you give up?", answer, "float16 costs far less than a point: keep float16")
    alts.append(("float32, the reference, twice the size", [_convert("float32")]))
    if target == "gpu" and have_calibration_data:
        alts.append(("int8, 4x smaller file; the GPU runs it in float, so smaller, not faster", [_convert("int8")]))
    return [_convert("float16")]


def _cpu_path(goals, have_cal, have_train, sensitive, drop_answer, ask, alts) -> list[dict]:
    """CPU (XNNPACK): the objective decides, then the data, then the accuracy budget."""
    ask("Which precision does cpu run?", "any; XNNPACK is fast for float32 and int8", "let the objective decide")
    objective = goals.objective
    lossless = goals.max_accuracy_drop is not None and goals.max_accuracy_drop <= _EPS
    if objective == "accuracy" or lossless:
        why = "the objective is accuracy" if objective == "accuracy" else "no accuracy drop allowed"
        ask("What matters most?", why, "float32: the reference, nothing lost")
        if have_cal:
            alts.append(("int8, 4x smaller and faster on ARM, usually within a point", [_convert("int8")]))
        alts.append(("dynamic range, 4x smaller, no data needed; often slower than float", [_convert("dynamic")]))
        return [_convert("float32")]
    ask("What matters most?", objective, "an 8-bit model (4x smaller; int8 is the fast one on CPU)")
    if have_cal:
        ask("Do you have calibration data?", "yes", "post-training full int8 (float I/O)")
        steps = [_convert("int8")]
    elif have_train:
        ask("Do you have calibration data?", "no", "ask about training data")
        ask("Do you have training data?", "yes", "quantization-aware training, then int8")
        steps = [{"technique": "qat"}, _convert("int8")]
    elif objective == "size":
        ask("Do you have calibration data?", "no", "dynamic range: int8 weights, no data needed")
        alts.append(("float32, when dynamic range proves too slow", [_convert("float32")]))
        return [_convert("dynamic")]
    else:
        ask(
            "Do you have calibration data?",
            "no",
            "float32: without data only dynamic range is left, often slower than float",
        )
        alts.append(("dynamic range, 4x smaller, needs no data; measure its latency", [_convert("dynamic")]))
        return [_convert("float32")]
    if steps[0]["technique"] == "qat":
        ask("How much accuracy can you give up?", drop_answer, "QAT keeps int8 close to float: keep it")
    elif sensitive:
        if have_train:
            ask(
                "How much accuracy can you give up?",
                drop_answer,
                "less than int8 usually costs: QAT instead of post-training int8",
            )
            alts.append(("post-training int8, no training needed; measure the drop", steps))
            steps = [{"technique": "qat"}, _convert("int8")]
        elif objective == "size":
            ask(
                "How much accuracy can you give up?",
                drop_answer,
                "dynamic range: same 4x size cut, float activations keep accuracy",
            )
            alts.append(("int8, faster, but may break the accuracy goal", steps))
            steps = [_convert("dynamic")]
        else:
            ask(
                "How much accuracy can you give up?",
                drop_answer,
                "keep int8 and measure; int16x8 if it breaks the goal",
            )
        alts.append(("int16x8, rescues accuracy int8 breaks; slow reference kernels", [_convert("int16x8")]))
    else:
        ask("How much accuracy can you give up?", drop_answer, "int8 usually costs under a point: keep it")
    alts.append(("float32, the reference", [_convert("float32")]))
    if have_train and objective == "size":
        alts.append(
            (
                "prune 50% then int8, for a smaller download (gzip only)",
                [{"technique": "prune", "target_sparsity": 0.5}, _convert("int8")],
            )
        )
    return steps


def _int8_path(target, have_cal, have_train, sensitive, drop_answer, ask, alts, facts) -> list[dict]:
    """NNAPI, Hexagon, Edge TPU, microcontrollers: full integer, so data decides how to get there."""
    io = {"edgetpu": "uint8", "mcu": "int8", "hexagon": "int8"}.get(target, "float")
    wants = {
        "nnapi": "int8 on its accelerators, float on GPU drivers; never dynamic range",
        "hexagon": "full int8 only, integer I/O (it rejects QUANTIZE from a float input), per-tensor FC weights",
        "edgetpu": "full int8 with uint8/int8 input and output",
        "mcu": "full int8 with int8 input and output",
    }[target]
    ask(f"Which precision does {target} run?", wants, f"full-integer int8 ({io} I/O)")
    ptq, qat = [_convert("int8", io)], [{"technique": "qat"}, _convert("int8", io)]
    if target == "hexagon":
        # Hexagon's FULLY_CONNECTED takes per-tensor weights only (LiteRT utils.cc): LiteRT Quantizer can
        # quantize per tensor with int8 I/O, which the DSP then runs whole.
        ptq = [_convert("float32"), {"technique": "quantize", "scheme": "int8", "io": "int8", "granularity": "tensor"}]
        facts.append("Hexagon takes FULLY_CONNECTED only with per-tensor weights: the recipe quantizes per tensor.")
    if have_cal:
        ask("Do you have calibration data?", "yes", "post-training int8 calibrated on 100-500 inputs")
        steps = ptq
    else:
        ask("Do you have calibration data?", "no", "ask about training data")
        if have_train:
            ask("Do you have training data?", "yes", "quantization-aware training: it learns the ranges, then int8")
            return qat
        if target == "nnapi":
            ask("Do you have training data?", "no", "float32: NNAPI rejects dynamic range, and int8 needs data")
            alts.append(("int8, once you have 100-500 representative inputs", [_convert("int8")]))
            alts.append(("the GPU delegate with float16 (NNAPI is deprecated)", [_convert("float16")]))
            return [_convert("float32")]
        ask(
            "Do you have training data?",
            "no",
            f"collect representative inputs: {target} cannot run the model without full int8",
        )
        facts.append(DATA_FACT)
        return ptq
    if sensitive and have_train:
        ask(
            "How much accuracy can you give up?",
            drop_answer,
            "less than int8 usually costs: QAT instead of post-training int8",
        )
        alts.append(("post-training int8, no training needed; measure the drop", ptq))
        steps = qat
    elif sensitive:
        ask(
            "How much accuracy can you give up?",
            drop_answer,
            f"keep int8 and measure; {target} has no higher-precision option",
        )
        facts.append(
            "If int8 breaks the accuracy goal, quantization-aware training (needs training data) recovers most of it."
        )
    else:
        ask("How much accuracy can you give up?", drop_answer, "int8 usually costs under a point: keep it")
        if have_train:
            alts.append(("quantization-aware training then int8, if the measured drop is too large", qat))
    if target == "nnapi":
        alts.append(("the GPU delegate with float16 (NNAPI is deprecated)", [_convert("float16")]))
    if have_train and target in ("mcu", "edgetpu"):
        alts.append(
            (
                "prune 50% then int8, for a smaller download (gzip only)",
                [{"technique": "prune", "target_sparsity": 0.5}, ptq[0]],
            )
        )
    return steps


# ------------------------------------------------------------------------------- measured choice
def candidate_io(c: Candidate) -> str:
    """The I/O type of a candidate's artifact: the last step that sets `io`, else float."""
    io = "float"
    for s in c.steps:
        io = getattr(s.params, "io", None) or io
    return io


def accuracy_score(c: Candidate) -> float | None:
    """Higher is better: the delta to the baseline when known, else top-1, else -MAE."""
    m = c.metrics
    if m is None:
        return None
    if m.accuracy_delta is not None:
        return m.accuracy_delta
    if m.accuracy is not None:
        if m.accuracy.top1 is not None:
            return m.accuracy.top1
        if m.accuracy.mae is not None:
            return -m.accuracy.mae
    return None


def _latency(c: Candidate) -> float | None:
    return c.metrics.latency.p50_ms if c.metrics and c.metrics.latency else None


def _point(c: Candidate) -> tuple[float, float, float]:
    """(size, latency, -accuracy): smaller is better on every axis; unknown counts as worst."""
    lat, acc = _latency(c), accuracy_score(c)
    return (float(c.metrics.size.bytes), math.inf if lat is None else lat, math.inf if acc is None else -acc)


def pareto_front(candidates: list[Candidate]) -> list[str]:
    """Names of ok candidates that no other ok candidate beats on size, latency and accuracy at once.

    Candidates with identical measurements do not dominate each other: both stay on the front.
    """
    ok = [c for c in candidates if c.ok]
    pts = {c.name: _point(c) for c in ok}

    def dominates(a, b) -> bool:
        return all(x <= y for x, y in zip(a, b, strict=True)) and any(x < y for x, y in zip(a, b, strict=True))

    return [c.name for c in ok if not any(dominates(pts[o.name], pts[c.name]) for o in ok if o.name != c.name)]


def _uses(c: Candidate, *techniques: str) -> bool:
    return any(s.technique in techniques for s in c.steps)


def _check_study(study: Study) -> None:
    seen: set[str] = set()
    for c in study.candidates:
        if c.name in seen:
            raise StudyError(
                f"The study has two candidates named {c.name!r}.", "Re-run `optimize sweep`; do not hand-edit names."
            )
        seen.add(c.name)
        m = c.metrics
        if m and (m.size.bytes < 0 or m.size.gzip_bytes < 0 or (m.latency and m.latency.p50_ms < 0)):
            raise StudyError(
                f"Candidate {c.name!r} has a negative size or latency.", "Re-run `optimize sweep`; the file was edited."
            )


def _float_latency(study: Study) -> float | None:
    """The float reference latency: the baseline's, else the fastest ok float32 candidate's."""
    base = next((c for c in study.candidates if c.name == study.baseline and c.ok), None)
    if base is not None and _latency(base) is not None:
        return _latency(base)
    floats = [_latency(c) for c in study.candidates if c.ok and c.scheme == "float32" and _latency(c) is not None]
    return min(floats) if floats else None


def _target_problem(c: Candidate, target: str, facts: set[str]) -> str | None:
    """Why the target cannot run this candidate fully, or None."""
    if target in ("edgetpu", "mcu"):
        io, allowed = candidate_io(c), ("int8", "uint8") if target == "edgetpu" else ("int8",)
        if c.scheme != "int8" or io not in allowed:
            need = "int8/uint8" if target == "edgetpu" else "int8"
            return f"{target} needs full int8 with {need} I/O; this is {c.scheme} with {io} I/O"
        return None
    delegate = TARGET_DELEGATE[target]
    report = c.delegates.get(delegate)
    if report is None:
        facts.add(
            f"No {delegate} report for some candidates (older run?): their {target} compatibility was not checked."
        )
        return None
    where = f"{report.nodes_delegated}/{report.nodes_total} nodes, {report.partitions} partition(s), {report.source}"
    if target == "cpu":
        if report.verdict != "full":
            facts.add(f"{c.name}: XNNPACK takes {where}; the rest runs on the CPU's reference kernels (slower).")
        return None  # the CPU runs every op; XNNPACK coverage shows up in the measured latency
    if report.verdict == "full":
        return None
    first = report.vetoed or (f"{report.cpu_nodes[0].op}: {report.cpu_nodes[0].reason}" if report.cpu_nodes else "")
    how = "runs it only partly" if report.verdict == "partial" else "does not run it"
    return f"{delegate} delegate {how} ({where})" + (f": {first}" if first else "")


def _first_problem(c: Candidate, target: str, goals: Goals, float_ms: float | None, facts: set[str]) -> str | None:
    """The first check this candidate fails, in a fixed order: failed, target, accuracy, size, latency, slower."""
    if c.error is not None:
        return f"failed: {c.error}"
    if c.metrics is None:
        return "not measured"
    problem = _target_problem(c, target, facts)
    if problem:
        return problem
    m = c.metrics
    if goals.max_accuracy_drop is not None:
        if m.accuracy_delta is None:
            return "accuracy not measured (no labelled data), so max_accuracy_drop cannot be checked"
        if -m.accuracy_delta > goals.max_accuracy_drop + _EPS:
            return f"accuracy drop {-m.accuracy_delta * 100:.2f} points > {goals.max_accuracy_drop * 100:g}"
    if goals.max_size_bytes is not None and m.size.bytes > goals.max_size_bytes:
        return f"size {m.size.bytes:,} bytes > {goals.max_size_bytes:,}"
    lat = _latency(c)
    if goals.max_latency_ms is not None:
        if lat is None:
            return "latency not measured, so max_latency_ms cannot be checked"
        if lat > goals.max_latency_ms + _EPS:
            return f"p50 latency {lat:.3g} ms > {goals.max_latency_ms:g} ms"
    if goals.objective == "latency":
        if lat is None:
            return "latency not measured, and the objective is latency"
        if c.scheme != "float32" and float_ms is not None and lat > float_ms + _EPS:
            return f"{c.scheme} measured slower than float32 ({lat:.3g} ms vs {float_ms:.3g} ms)"
    return None


def judge(c: Candidate, target: str | None, goals: Goals) -> str | None:
    """The first requirement one candidate breaks for a target and goals, or None when it meets them all.

    Used by `optimize run` to judge a recipe's result against the recipe's own targets and goals.
    """
    return _first_problem(c, check_target(target or "cpu"), goals, None, set())


def judge_recipe(c: Candidate, recipe) -> list[tuple[str, str | None]]:
    """A recipe's result judged against each of its own targets (cpu when it names none) and its goals."""
    return [(str(t), judge(c, t, recipe.goals)) for t in (recipe.targets or (Target.CPU,))]


def _rank_key(c: Candidate, objective: str, index: int) -> tuple:
    """Objective first, then the other two axes, then study order: ties are deterministic."""
    size, lat, neg_acc = _point(c)
    order = {"size": (size, lat, neg_acc), "latency": (lat, size, neg_acc), "accuracy": (neg_acc, size, lat)}[objective]
    return (*order, index)


def _study_facts(study: Study, target: str, goals: Goals, float_ms: float | None) -> list[str]:
    facts = []
    if not study.candidates:
        facts.append("The study has no candidates: run `optimize sweep` to measure some.")
    elif not any(c.name == study.baseline for c in study.candidates):
        facts.append(f"The study has no baseline candidate {study.baseline!r}: accuracy deltas cannot be trusted.")
    for c in study.candidates:
        lat = _latency(c)
        if c.ok and c.scheme != "float32" and float_ms is not None and lat is not None and lat > float_ms + _EPS:
            label = c.name if c.name == c.scheme else f"{c.name} ({c.scheme})"
            facts.append(f"{label} measured slower than float32 here: {lat:.3g} ms vs {float_ms:.3g} ms.")
    pruned = [c for c in study.candidates if c.ok and _uses(c, "prune", "cluster")]
    if pruned:
        sizes = "; ".join(
            f"{c.name}: {c.metrics.size.bytes:,} bytes raw, {c.metrics.size.gzip_bytes:,} gzip" for c in pruned
        )
        facts.append(f"{PRUNE_FACT[:-1]} ({sizes}).")
    if target != "cpu" and (goals.objective == "latency" or goals.max_latency_ms is not None):
        facts.append(
            f"Latencies are host-CPU measurements, not {target} ones: they rank candidates, they do not predict the device."
        )
    return facts


def recommend(
    study: Study,
    target: str = "cpu",
    goals: Goals | None = None,
    *,
    have_calibration_data: bool | None = None,
    have_training_data: bool | None = None,
) -> Recommendation:
    """Choose from what was measured. `chosen` is None when nothing meets the goals.

    A candidate is eligible when it ran, the target runs it fully (the delegate's report says
    'full'; Edge TPU and MCU are judged from scheme and I/O; a missing report is stated, not
    rejected; on the CPU, XNNPACK coverage is informative only since the CPU runs every op), and it
    meets every goal. For a latency objective, a quantized candidate measured slower than float32
    is never eligible. Eligible candidates are ranked by the objective, then the other two axes,
    then study order. Data availability for the decision tree is inferred from the study unless
    given: calibration data when the study names data, training data when it holds a
    prune/cluster/QAT candidate.
    """
    target = check_target(target)
    goals = goals or Goals()
    _check_study(study)
    if have_calibration_data is None:
        have_calibration_data = study.data is not None
    if have_training_data is None:
        have_training_data = any(_uses(c, "prune", "cluster", "qat") for c in study.candidates)
    advice = advise(
        target, have_calibration_data=have_calibration_data, have_training_data=have_training_data, goals=goals
    )

    float_ms = _float_latency(study)
    target_facts: set[str] = set()
    eligible: list[tuple[tuple, Candidate]] = []
    rejected: list[Rejection] = []
    for i, c in enumerate(study.candidates):
        problem = _first_problem(c, target, goals, float_ms, target_facts)
        if problem:
            rejected.append(Rejection(candidate=c.name, reason=problem))
        else:
            eligible.append((_rank_key(c, goals.objective, i), c))
    ranked = [c for _, c in sorted(eligible, key=lambda kc: kc[0])]
    chosen = ranked[0] if ranked else None
    study_facts = _study_facts(study, target, goals, float_ms)
    generic = [
        f
        for f in advice.facts
        if not (f == PRUNE_FACT and any(x.startswith(PRUNE_FACT[:-1] + " (") for x in study_facts))
    ]
    facts = generic + sorted(target_facts) + study_facts
    return Recommendation(
        target=target,
        goals=goals,
        advice=advice,
        chosen=chosen.name if chosen else None,
        chosen_recipe_toml=_candidate_toml(chosen, target, goals) if chosen else None,
        ranked=[c.name for c in ranked],
        pareto=pareto_front(study.candidates),
        rejected=rejected,
        facts=list(dict.fromkeys(facts)),
    )


def _candidate_toml(c: Candidate, target: str, goals: Goals) -> str:
    steps = [s.flat() for s in c.steps]
    return recipe_toml(c.name, steps, target, goals)


def raise_if_unmet(rec: Recommendation) -> None:
    """Raise GoalsNotMet (exit code 1) when no candidate meets the goals, naming the closest miss."""
    if rec.chosen is not None:
        return
    if not rec.rejected:
        raise GoalsNotMet(
            f"No candidate to choose from for {rec.target}: the study is empty.", "Run `optimize sweep` first."
        )
    first = rec.rejected[0]
    raise GoalsNotMet(
        f"No candidate meets the goals for {rec.target} ({len(rec.rejected)} rejected; e.g. {first.candidate}: {first.reason}).",
        "Relax a goal, or try the recommended pipeline: `optimize recommend --target " + rec.target + "`.",
    )


# -------------------------------------------------------------------------------------- output
def format_advice(advice: Advice) -> str:
    """The decision tree's answer as terminal text."""
    lines = [f"Target: {advice.target}", "", "Decision path:"]
    for i, q in enumerate(advice.path, 1):
        lines.append(f"  {i}. {q.question} {q.answer} -> {q.decided}")
    lines += ["", f"Recommended pipeline: {_describe(advice.pipeline)}", "", advice.recipe_toml.rstrip()]
    if advice.alternatives:
        lines += ["", "Alternatives:"] + [f"  - {a}" for a in advice.alternatives]
    if advice.facts:
        lines += ["", "Good to know:"] + [f"  - {f}" for f in advice.facts]
    return "\n".join(lines) + "\n"


def format_recommendation(rec: Recommendation | Advice) -> str:
    """A recommendation (or bare advice) as terminal text: path, pipeline, choice, ranking, rejections, facts."""
    if isinstance(rec, Advice):
        return format_advice(rec)
    goals = ", ".join(f"{k}={v}" for k, v in rec.goals.model_dump().items() if v is not None)
    adv = rec.advice
    lines = [f"Target: {rec.target}    Goals: {goals}", "", "Decision path (rule of thumb):"]
    lines += [f"  {i}. {q.question} {q.answer} -> {q.decided}" for i, q in enumerate(adv.path, 1)]
    lines.append(f"  Rule-of-thumb pipeline: {_describe(adv.pipeline)}")
    lines.append("")
    if rec.chosen:
        lines.append(f"Chosen from measurements: {rec.chosen}")
        lines += ["", rec.chosen_recipe_toml.rstrip()] if rec.chosen_recipe_toml else []
    else:
        lines.append("No measured candidate meets the goals.")
    if len(rec.ranked) > 1:
        lines += ["", "Also eligible, in order: " + ", ".join(rec.ranked[1:])]
    lines += ["", "Pareto front (size, latency, accuracy): " + (", ".join(rec.pareto) or "none")]
    if rec.rejected:
        lines += ["", "Rejected:"] + [f"  - {r.candidate}: {r.reason}" for r in rec.rejected]
    if adv.alternatives:
        lines += ["", "Alternatives to try:"] + [f"  - {a}" for a in adv.alternatives]
    if rec.facts:
        lines += ["", "Good to know:"] + [f"  - {f}" for f in rec.facts]
    return "\n".join(lines) + "\n"

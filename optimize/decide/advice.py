"""The decision tree: which pipeline to ship for a target, before (or without) any measurement.

`advise(target, ...)` walks target precision -> data available -> accuracy sensitivity -> objective, and
returns every question it asked with the answer that decided it, the pipeline it recommends as a
runnable recipe, the alternatives and the facts users trip over. Pure: no TensorFlow, no numpy. The
measured choice over a study is `choose.recommend`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pydantic import Field

from optimize.core.results import Goals, Record
from optimize.core.vocab import IO, Objective, Scheme, Target, names

#: Accuracy drops below this (one point) count as "sensitive": int8 PTQ may not hold them.
SENSITIVE_DROP = 0.01
EPS = 1e-9  # goals compare with a tolerance, so a drop of exactly 0.01 meets max_accuracy_drop 0.01

TARGET_FACTS: dict[Target, tuple[str, ...]] = {
    Target.CPU: (
        "On the CPU, XNNPACK runs float32 and int8 fast; float16 weights are dequantized to float32 "
        "(smaller, not faster).",
        "Dynamic-range models are often slower than float32 on the CPU (MobileNetV2 here: ~9.5 ms vs ~4 ms): measure.",
        "int16x8 rescues accuracy that int8 breaks, but runs on slow single-threaded reference kernels.",
    ),
    Target.GPU: (
        "The GPU delegate wants float16: it computes in float16, so float16 halves the file at no speed or "
        "accuracy cost.",
        "The GPU runs 8-bit models only by dequantizing them to float: smaller, not faster.",
    ),
    Target.NNAPI: (
        "NNAPI is deprecated from Android 15: prefer the GPU delegate or a vendor delegate (e.g. Qualcomm QNN).",
        "NNAPI runs dynamic-range (weight-only) models as float, their weights dequantized (and rejects them before "
        "Android 10): only full int8 with symmetric weights reaches its accelerators.",
    ),
    Target.HEXAGON: (
        "The Hexagon delegate takes only full int8 (8-bit) models, and is superseded by Qualcomm's QNN delegate.",
    ),
    Target.COREML: (
        "The Core ML delegate runs float models only: ship float16 (the Neural Engine computes in float16).",
        "int8 and dynamic-range models stay on the CPU under Core ML.",
    ),
    Target.EDGETPU: (
        "The Edge TPU needs full int8 with integer (int8/uint8) input and output, compiled with `edgetpu_compiler`.",
        "Ops the Edge TPU compiler cannot map run on the host CPU, often slower than no accelerator at all.",
    ),
    Target.MCU: (
        "Microcontrollers (TFLite Micro) need full int8 with int8 input and output: there are no float kernels "
        "to fall back to.",
    ),
}
PRUNE_FACT = (
    "Pruning and clustering shrink only the compressed (gzip) size; the .tflite file and its latency stay the same."
)
SLOWER_FACT = "A quantized model measured slower than float is never recommended for latency."
DATA_FACT = "Full int8 needs 100-500 representative inputs (unlabelled is fine) or quantization-aware training."
INT4_FACT = (
    "int4 (4-bit Dense/attention weights, float activations) is for CPU targets: the GPU delegate's float reader "
    "and NNAPI have no 4-bit type, so either fails its whole delegation on such a model."
)

#: Targets whose decision path rules out a scheme the delegate still takes: the measured pick honours the path,
#: ranking such candidates after every other eligible one (elsewhere the measurements update the path, and say
#: so). The schemes passed over, and why, in words.
PASSED_OVER: dict[Target, tuple[tuple[Scheme, ...], str]] = {
    Target.NNAPI: (
        (Scheme.DYNAMIC, Scheme.INT4),
        "NNAPI runs {scheme} as float (its weights dequantized), never on the int8 accelerators the path is for",
    ),
}

#: Full-integer targets: the I/O type each wants, and what it runs.
INT8_IO: dict[Target, IO] = {Target.EDGETPU: IO.UINT8, Target.MCU: IO.INT8, Target.HEXAGON: IO.INT8}
INT8_WANTS: dict[Target, str] = {
    Target.NNAPI: "int8 on its accelerators, float on GPU drivers; dynamic range only as float (weights dequantized)",
    Target.HEXAGON: "full int8 only, integer I/O (it rejects QUANTIZE from a float input), per-tensor FC weights",
    Target.EDGETPU: "full int8 with uint8/int8 input and output",
    Target.MCU: "full int8 with int8 input and output",
}


class Question(Record):
    """One step of the decision path: what was asked, what the answer was, what it decided."""

    question: str
    answer: str
    decided: str


class Alternative(Record):
    """One pipeline the decision tree offers besides its own, with what it is good for."""

    label: str
    steps: list[dict]


class Advice(Record):
    """The decision tree's answer for one target, before (or without) any measurement."""

    target: Target
    path: list[Question]
    pipeline: list[dict]
    recipe_toml: str
    alternatives: list[str]
    facts: list[str]
    alternative_pipelines: list[Alternative] = []
    passed_over: list[Scheme] = Field(
        default_factory=list,
        description="Schemes the path rules out for this target although its delegate takes them: the measured pick "
        "ranks them after every other eligible candidate, as the path says.",
    )


def check_target(target: str) -> Target:
    """The target, or one clear line naming the known ones."""
    from optimize.core.errors import OptimizeError

    if target not in names(Target):
        raise OptimizeError(f"Unknown target {target!r}.", f"Choose one of: {', '.join(names(Target))}.")
    return Target(target)


def convert(scheme: str, io: str = IO.FLOAT) -> dict:
    step = {"technique": "convert", "scheme": str(scheme)}
    if io != IO.FLOAT:
        step["io"] = str(io)
    return step


def describe(steps: list[dict]) -> str:
    """`prune(target_sparsity=0.5) -> convert(scheme=int8)`."""
    parts = []
    for s in steps:
        params = ", ".join(f"{k}={v}" for k, v in s.items() if k != "technique")
        parts.append(f"{s['technique']}({params})")
    return " -> ".join(parts)


def recipe_toml(name: str, steps: list[dict], target: str | None = None, goals: Goals | None = None) -> str:
    """A pipeline as TOML the user can save and run with `optimize run`."""
    import re

    from optimize.core.recipe import build

    fields = {"targets": (target,) if target else (), "goals": goals or Goals()}
    safe = re.sub(r"[^A-Za-z0-9._-]", "-", name).lstrip(".") or "recipe"  # a study's names may be anything
    return build(safe, steps, **fields).to_toml()


@dataclass
class Advisor:
    """Builds one answer: the questions asked, the alternatives offered, the facts to know."""

    target: Target
    goals: Goals
    have_cal: bool
    have_train: bool
    dense_weights: bool = False  # most weights are large Dense/attention matrices (what int4 makes 4-bit)
    path: list[Question] = field(default_factory=list)
    alts: list[tuple[str, list[dict]]] = field(default_factory=list)
    facts: list[str] = field(default_factory=list)

    def ask(self, question: str, answer: str, decided: str) -> None:
        self.path.append(Question(question=question, answer=answer, decided=decided))

    def alternative(self, label: str, steps: list[dict]) -> None:
        self.alts.append((label, steps))

    @property
    def drop_answer(self) -> str:
        drop, increase = self.goals.max_accuracy_drop, self.goals.max_error_increase
        if drop is None and increase is not None:
            return f"MAE at most {increase * 100:g}% above float32's"
        return "not stated" if drop is None else f"at most {drop * 100:g} point(s)"

    @property
    def sensitive(self) -> bool:
        drop = self.goals.max_accuracy_drop
        return drop is not None and drop < SENSITIVE_DROP - EPS

    @property
    def lossless(self) -> bool:
        return self.goals.max_accuracy_drop is not None and self.goals.max_accuracy_drop <= EPS

    # ---- GPU and Core ML: float16 unless no accuracy drop at all is allowed
    def float_path(self) -> list[dict]:
        device = "The GPU delegate" if self.target is Target.GPU else "Core ML"
        extra = "; 8-bit models are dequantized to float" if self.target is Target.GPU else " only"
        self.ask(
            f"Which precision does {self.target} run?",
            f"{device} runs float32/float16{extra}",
            "float16 conversion: half the size, computed in float16 anyway",
        )
        if self.lossless:
            self.ask("How much accuracy can you give up?", "none", "keep float32: float16 rounding can move outputs")
            self.alternative("float16, half the size, usually identical accuracy", [convert(Scheme.FLOAT16)])
            return [convert(Scheme.FLOAT32)]
        self.ask("How much accuracy can you give up?", self.drop_answer, "float16 costs far less than a point: keep it")
        self.alternative("float32, the reference, twice the size", [convert(Scheme.FLOAT32)])
        if self.target is Target.GPU and self.have_cal:
            self.alternative(
                "int8, 4x smaller file; the GPU runs it in float, so smaller, not faster", [convert(Scheme.INT8)]
            )
        return [convert(Scheme.FLOAT16)]

    # ---- CPU (XNNPACK): the objective decides, then the data, then the accuracy budget
    def cpu_path(self) -> list[dict]:
        self.ask(
            "Which precision does cpu run?", "any; XNNPACK is fast for float32 and int8", "let the objective decide"
        )
        objective = self.goals.objective
        if objective is Objective.ACCURACY or self.lossless:
            why = "the objective is accuracy" if objective is Objective.ACCURACY else "no accuracy drop allowed"
            self.ask("What matters most?", why, "float32: the reference, nothing lost")
            if self.have_cal:
                self.alternative("int8, 4x smaller and faster on ARM, usually within a point", [convert(Scheme.INT8)])
            self.alternative("dynamic range, 4x smaller, no data needed; often slower than float", [convert("dynamic")])
            return [convert(Scheme.FLOAT32)]
        self.ask("What matters most?", str(objective), "an 8-bit model (4x smaller; int8 is the fast one on CPU)")
        steps = self._cpu_data()
        if steps is None or steps[-1]["scheme"] in (Scheme.DYNAMIC, Scheme.FLOAT32):
            return self._cpu_int4(steps or [convert(Scheme.FLOAT32)])
        steps = self._cpu_int4(self._cpu_budget(steps))
        self.alternative("float32, the reference", [convert(Scheme.FLOAT32)])
        if self.have_train and objective is Objective.SIZE:
            self.alternative(
                "prune 50% then int8, for a smaller download (gzip only)",
                [{"technique": "prune", "target_sparsity": 0.5}, convert(Scheme.INT8)],
            )
        return steps

    def _cpu_int4(self, steps: list[dict]) -> list[dict]:
        """Large Dense/attention weights: 4-bit weights (int4) halve int8's size again, and XNNPACK runs them."""
        if not self.dense_weights:
            return steps
        question, int4 = "Are most weights large Dense or attention matrices?", [convert(Scheme.INT4)]
        self.facts.append(INT4_FACT)
        if self.goals.objective is Objective.SIZE and not self.sensitive:
            self.ask(question, "yes", "int4: 4-bit weights, about half of int8's size, no data needed")
            self.alternative(f"{steps[-1]['scheme']}: 8-bit weights, a smaller accuracy cost; twice int4's size", steps)
            return int4
        why = "the accuracy budget is tight" if self.sensitive else f"the objective is {self.goals.objective}"
        self.ask(question, "yes", f"keep {steps[-1]['scheme']} ({why}); int4 as the alternative: measure it")
        self.alternative("int4: 4-bit Dense/attention weights, about half of int8's size; measure the accuracy", int4)
        return steps

    def _cpu_data(self) -> list[dict] | None:
        if self.have_cal:
            self.ask("Do you have calibration data?", "yes", "post-training full int8 (float I/O)")
            return [convert(Scheme.INT8)]
        if self.have_train:
            self.ask("Do you have calibration data?", "no", "ask about training data")
            self.ask("Do you have training data?", "yes", "quantization-aware training, then int8")
            return [{"technique": "qat"}, convert(Scheme.INT8)]
        if self.goals.objective is Objective.SIZE:
            self.ask("Do you have calibration data?", "no", "dynamic range: int8 weights, no data needed")
            self.alternative("float32, when dynamic range proves too slow", [convert(Scheme.FLOAT32)])
            return [convert(Scheme.DYNAMIC)]
        self.ask(
            "Do you have calibration data?", "no", "float32: without data only dynamic range is left, often slower"
        )
        self.alternative("dynamic range, 4x smaller, needs no data; measure its latency", [convert(Scheme.DYNAMIC)])
        return [convert(Scheme.FLOAT32)]

    def _cpu_budget(self, steps: list[dict]) -> list[dict]:
        question = "How much accuracy can you give up?"
        if steps[0]["technique"] == "qat":
            self.ask(question, self.drop_answer, "QAT keeps int8 close to float: keep it")
            return steps
        if not self.sensitive:
            self.ask(question, self.drop_answer, "int8 usually costs under a point: keep it")
            return steps
        if self.have_train:
            self.ask(question, self.drop_answer, "less than int8 usually costs: QAT instead of post-training int8")
            self.alternative("post-training int8, no training needed; measure the drop", steps)
            steps = [{"technique": "qat"}, convert(Scheme.INT8)]
        elif self.goals.objective is Objective.SIZE:
            self.ask(question, self.drop_answer, "dynamic range: same 4x size cut, float activations keep accuracy")
            self.alternative("int8, faster, but may break the accuracy goal", steps)
            steps = [convert(Scheme.DYNAMIC)]
        else:
            self.ask(question, self.drop_answer, "keep int8 and measure; mixed int8 or int16x8 if it breaks the goal")
        self.alternative(
            "mixed int8: the few ops that break int8 kept float (a bounded search; optimize debug shows them)",
            [convert(Scheme.FLOAT32), {"technique": "selective"}],
        )
        self.alternative("int16x8, rescues accuracy int8 breaks; slow reference kernels", [convert(Scheme.INT16X8)])
        return steps

    # ---- NNAPI, Hexagon, Edge TPU, microcontrollers: full integer, so data decides how to get there
    def int8_path(self) -> list[dict]:
        io = INT8_IO.get(self.target, IO.FLOAT)
        wants = INT8_WANTS[self.target]
        self.ask(f"Which precision does {self.target} run?", wants, f"full-integer int8 ({io} I/O)")
        ptq, qat = [convert(Scheme.INT8, io)], [{"technique": "qat"}, convert(Scheme.INT8, io)]
        if self.target is Target.HEXAGON:
            # Hexagon's FULLY_CONNECTED takes per-tensor weights only (LiteRT utils.cc): LiteRT Quantizer can
            # quantize per tensor with int8 I/O, which the DSP then runs whole.
            tensor = {"technique": "quantize", "scheme": "int8", "io": "int8", "granularity": "tensor"}
            ptq = [convert(Scheme.FLOAT32), tensor]
            self.facts.append(
                "Hexagon takes FULLY_CONNECTED only with per-tensor weights: the recipe quantizes per tensor."
            )
        if not self.have_cal:
            return self._int8_without_data(ptq, qat)
        self.ask("Do you have calibration data?", "yes", "post-training int8 calibrated on 100-500 inputs")
        steps = self._int8_budget(ptq, qat)
        if self.target is Target.NNAPI:
            self.alternative("the GPU delegate with float16 (NNAPI is deprecated)", [convert(Scheme.FLOAT16)])
        if self.have_train and self.target in (Target.MCU, Target.EDGETPU):
            self.alternative(
                "prune 50% then int8, for a smaller download (gzip only)",
                [{"technique": "prune", "target_sparsity": 0.5}, ptq[-1]],
            )
        return steps

    def _int8_without_data(self, ptq: list[dict], qat: list[dict]) -> list[dict]:
        self.ask("Do you have calibration data?", "no", "ask about training data")
        if self.have_train:
            self.ask(
                "Do you have training data?", "yes", "quantization-aware training: it learns the ranges, then int8"
            )
            return qat
        if self.target is Target.NNAPI:
            self.ask(
                "Do you have training data?",
                "no",
                "float32: dynamic range runs as float there anyway, and int8 needs data",
            )
            self.alternative("int8, once you have 100-500 representative inputs", [convert(Scheme.INT8)])
            self.alternative("the GPU delegate with float16 (NNAPI is deprecated)", [convert(Scheme.FLOAT16)])
            return [convert(Scheme.FLOAT32)]
        self.ask(
            "Do you have training data?",
            "no",
            f"collect representative inputs: {self.target} cannot run the model without full int8",
        )
        self.facts.append(DATA_FACT)
        return ptq

    def _int8_budget(self, ptq: list[dict], qat: list[dict]) -> list[dict]:
        question = "How much accuracy can you give up?"
        if self.sensitive and self.have_train:
            self.ask(question, self.drop_answer, "less than int8 usually costs: QAT instead of post-training int8")
            self.alternative("post-training int8, no training needed; measure the drop", ptq)
            return qat
        if self.sensitive:
            self.ask(question, self.drop_answer, f"keep int8 and measure; {self.target} has no higher-precision option")
            self.facts.append(
                "If int8 breaks the accuracy goal, quantization-aware training (needs training data) recovers most of it."
            )
            return ptq
        self.ask(question, self.drop_answer, "int8 usually costs under a point: keep it")
        if self.have_train:
            self.alternative("quantization-aware training then int8, if the measured drop is too large", qat)
        return ptq


def advise(
    target: str,
    *,
    have_calibration_data: bool = True,
    have_training_data: bool = False,
    goals: Goals | None = None,
    dense_weights: bool = False,
) -> Advice:
    """Walk the decision tree: target precision -> data available -> accuracy sensitivity -> objective.

    Every question asked is recorded with the answer that decided it, so the user sees why. Only
    questions that matter for the target are asked (float16 needs no data, so the GPU path never asks
    about calibration data). `dense_weights`: most of the model's weights are large Dense/attention
    matrices, where a CPU target can take 4-bit weights (int4).
    """
    target = check_target(target)
    facts = list(TARGET_FACTS[target])
    a = Advisor(target, goals or Goals(), have_calibration_data, have_training_data, dense_weights, facts=facts)
    if target in (Target.GPU, Target.COREML):
        steps = a.float_path()
    elif target is Target.CPU:
        steps = a.cpu_path()
    else:
        steps = a.int8_path()
    if any(s["technique"] in ("prune", "cluster") for _, alt in a.alts for s in alt):
        a.facts.append(PRUNE_FACT)
    if a.goals.objective is Objective.LATENCY or a.goals.max_latency_ms is not None:
        a.facts.append(SLOWER_FACT)
    if a.goals.max_size_bytes is not None or a.goals.max_latency_ms is not None:
        a.facts.append("Size and latency goals are checked against measurements: run `optimize sweep` with them.")
    return Advice(
        target=target,
        path=a.path,
        pipeline=steps,
        recipe_toml=recipe_toml(f"{target}-recommended", steps, target, a.goals),
        alternatives=[f"{label}: {describe(s)}" for label, s in a.alts],
        facts=a.facts,
        alternative_pipelines=[Alternative(label=label, steps=s) for label, s in a.alts],
        passed_over=list(PASSED_OVER[target][0]) if target in PASSED_OVER else [],
    )

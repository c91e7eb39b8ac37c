"""The contract every delegate's rules follow, and the vocabulary they share.

A delegate's rules are one object that satisfies `DelegateRules`: a name, the source it follows, its
partition `policy`, and two stages, as the runtime has them:

1. `check(node, target) -> Verdict | None` per node (None: the delegate takes the node): the delegate's
   IsSupported / Validate, which decides per node and feeds the partitioner;
2. `build_failure(node, target, boundary) -> Verdict | None` per node the partitioner gave the delegate:
   what fails while the delegate builds its own graph (GPU Parse, NNAPI AddOpsAndTensors, Core ML
   BuildModel, Hexagon PopulateSubGraph). A node the first stage accepts can fail here, and one failure
   fails the whole delegation: the runtime restores the CPU plan (`core/subgraph.cc:2507-2515`).

A `Verdict` carries a reason *code* (`Reason`) beside the delegate's own words, so hints, reports and
overlays key on the code, never on the text. The optional hooks (`veto`, `build_failure`, `hints`) have
do-nothing defaults in `Rules`, so `apply_rules` calls them unconditionally.

Each module keeps its op table as data (op name -> `Rule`: highest op version, minimum feature level,
a tuple of small checks). A check returns a Verdict or None; the first Verdict wins, the way the runtime's
IsSupported returns its first failing status.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property
from typing import TYPE_CHECKING, NamedTuple, Protocol, runtime_checkable

from optimize.core.vocab import Delegate
from optimize.delegates.graph import NodeView
from optimize.models.flatbuffer import Tensor

if TYPE_CHECKING:
    from optimize.delegates.target import TargetParams
    from optimize.models.flatbuffer import Model, Subgraph


class Reason(StrEnum):
    """Why a delegate leaves a node (or the whole model) on the CPU, as a code."""

    UNSUPPORTED_OP = "unsupported-op"  # the delegate has no kernel for this op (or custom op)
    OP_VERSION = "op-version"  # the op's version is above the delegate's cap
    FEATURE_LEVEL = "feature-level"  # needs a newer Android/NNAPI level or another Core ML version
    TENSOR_TYPE = "tensor-type"  # an input or output dtype the delegate does not take
    TENSOR_RANK = "tensor-rank"  # rank above the delegate's limit (or wrong rank for the op)
    SHAPE = "shape"  # dimension constraints (sizes, channels, batch)
    BROADCAST = "broadcast"  # broadcasting pattern the delegate does not do
    ARITY = "arity"  # number of inputs/outputs, or runtime vs constant inputs
    CONSTANT = "constant"  # an input must be a constant (weights, axes, sizes)
    ACTIVATION = "activation"  # fused activation not supported
    OPTION = "option"  # a builtin option value (strides, masks, beta, axis, mode ...)
    PER_CHANNEL = "per-channel"  # per-channel (or blockwise) quantization where per-tensor is needed
    DYNAMIC_RANGE = "dynamic-range"  # hybrid op: float activations with 8-bit weights
    QUANTIZATION = "quantization"  # scale / zero-point constraints
    GRAPH = "graph"  # the op's producers/consumers (e.g. a comparison must feed one CAST/SELECT)
    QUANT_DISABLED = "quant-disabled"  # the target turned quantized models off (GPU flag)
    NO_OPENCL = "no-opencl"  # the target has no OpenCL (GPU excludes SPLIT/SPLIT_V)
    FP16_DEQUANT = "fp16-dequantize"  # float16 weight DEQUANTIZE kept on the CPU in partial delegation
    PARTITION_LIMIT = "partition-limit"  # supported, but its partition is not among the N kept
    PARTITION_SIZE = "partition-size"  # supported, but its partition is below the minimum size
    DYNAMIC_TENSOR = "dynamic-tensor"  # model-level: a dynamic-sized tensor vetoes the delegate
    BUILD_FAILURE = "build-failure"  # model-level: the delegate would fail building its graph
    PLATFORM = "platform"  # model-level: the target cannot run this delegate at all
    RUNTIME = "runtime"  # observed in the interpreter (XNNPACK), not predicted


@dataclass(frozen=True, slots=True)
class Verdict:
    """A delegate's refusal: the code, its own words, the threshold involved (a version cap, a level) and
    the offending value where one helps a hint (e.g. the dtype that was refused)."""

    code: Reason
    text: str
    limit: int | None = None
    detail: str | None = None


def reject(code: Reason, text: str, limit: int | None = None, detail: str | None = None) -> Verdict:
    return Verdict(code, text, limit, detail)


class Finding(NamedTuple):
    """One node a delegate leaves on the CPU, with its verdict."""

    subgraph: int
    index: int
    op: str
    version: int
    verdict: Verdict


class Boundary:
    """One delegated partition as its delegate kernel receives it: the tensors it reads from outside (graph
    inputs, CPU outputs; constants not counted) and the tensors it hands back (read outside, graph outputs),
    as graph_info.cc:130-143, 205-230 collect them. Computed on first use: most rules never ask."""

    def __init__(self, sg: Subgraph, nodes: Iterable[int]):
        self.sg, self.nodes = sg, tuple(nodes)

    def _tensors(self, nodes: Iterable[int], attr: str) -> set[int]:
        ops = self.sg.ops
        return {t for i in nodes for t in getattr(ops[i], attr) if t >= 0}

    @cached_property
    def _produced(self) -> set[int]:
        return self._tensors(self.nodes, "outputs")

    @cached_property
    def inputs(self) -> frozenset[int]:
        tensors = self.sg.tensors
        return frozenset(t for t in self._tensors(self.nodes, "inputs") - self._produced if not tensors[t].is_const)

    @cached_property
    def outputs(self) -> frozenset[int]:
        inside = set(self.nodes)
        outside = self._tensors((op.index for op in self.sg.ops if op.index not in inside), "inputs")
        return frozenset(t for t in self._produced if t in outside or t in self.sg.outputs)


@dataclass(frozen=True)
class Policy:
    """How a delegate turns supported nodes into delegated ones (partition helper and its limits)."""

    max_partitions: int | None  # None: unlimited
    min_nodes: int
    fp16_helper: bool  # FP16GraphPartitionHelper: fold float16-weight DEQUANTIZE into consumers
    allows_dynamic: bool  # kTfLiteDelegateFlagsAllowDynamicTensors
    params: dict = field(default_factory=dict)


@runtime_checkable
class DelegateRules(Protocol):
    """What `apply_rules` needs from one delegate's rules."""

    name: Delegate
    source: str

    def policy(self, target: TargetParams) -> Policy: ...

    def check(self, node: NodeView, target: TargetParams) -> Verdict | None: ...

    def veto(self, model: Model, target: TargetParams) -> Verdict | None: ...

    def build_failure(self, node: NodeView, target: TargetParams, boundary: Boundary) -> Verdict | None: ...

    def hints(self, findings: Sequence[Finding], target: TargetParams, scheme: str) -> list[str]: ...


class Rules:
    """Defaults for the optional hooks: no model-level veto, no build-time failure, no hints."""

    name: Delegate
    source: str

    def veto(self, model: Model, target: TargetParams) -> Verdict | None:
        return None

    def build_failure(self, node: NodeView, target: TargetParams, boundary: Boundary) -> Verdict | None:
        return None

    def hints(self, findings: Sequence[Finding], target: TargetParams, scheme: str) -> list[str]:
        return []


class ModuleRules(Rules):
    """A delegate's rules made of its module's functions: `policy` and `check` always; `veto`,
    `build_failure` and `hints` where the delegate has them (the defaults above otherwise)."""

    def __init__(self, name: Delegate, source: str, policy, check, veto=None, build_failure=None, hints=None):
        self.name, self.source = name, source
        self.policy, self.check = policy, check
        for hook, fn in (("veto", veto), ("build_failure", build_failure), ("hints", hints)):
            if fn is not None:
                setattr(self, hook, fn)

    def __repr__(self) -> str:
        return f"ModuleRules({self.name})"


Check = Callable[[NodeView, "TargetParams"], Verdict | None]


@dataclass(frozen=True)
class Rule:
    """One op in a delegate's table: highest op version, lowest feature level, then its checks."""

    vmax: int | None = None
    checks: tuple[Check, ...] = ()
    min_level: int | None = None


def first(checks: Iterable[Check], node: NodeView, target: TargetParams) -> Verdict | None:
    """The first failing check's verdict (the runtime's RETURN_IF_ERROR chain)."""
    for c in checks:
        v = c(node, target)
        if v is not None:
            return v
    return None


def codes(findings: Iterable[Finding]) -> set[Reason]:
    return {f.verdict.code for f in findings}


def build_detail(findings: Iterable[Finding]) -> str | None:
    """The offending value (a dtype, say) of the node that fails the delegate's build, if one does."""
    return next((f.verdict.detail for f in findings if f.verdict.code is Reason.BUILD_FAILURE), None)


FLOAT = frozenset({"float32", "float16"})
QUANT8 = frozenset({"uint8", "int8"})


def shape_str(t: Tensor | None) -> str:
    return "none" if t is None else "[" + ",".join(str(d) for d in t.shape) + "]"


def dtype(node: NodeView, i: int) -> str:
    """Type of input i ('none' when absent or omitted)."""
    t = node.input(i)
    return t.dtype if t is not None else "none"


# ---- small predicate factories -------------------------------------------------------------------


def _count(what: str, allowed: tuple[int, ...]) -> Check:
    def check(node: NodeView, _t) -> Verdict | None:
        n = len(getattr(node.op, what))
        if n in allowed:
            return None
        return reject(Reason.ARITY, f"Expected {' or '.join(map(str, allowed))} {what[:-1]}(s), got {n}.")

    return check


def n_inputs(*allowed: int) -> Check:
    return _count("inputs", allowed)


def n_outputs(*allowed: int) -> Check:
    return _count("outputs", allowed)


def runtime_const(*pairs: tuple[int, int]) -> Check:
    """(runtime inputs, const inputs) must be one of the given pairs (gpu_compatibility's CheckInputsConstsOutputs)."""

    def check(node: NodeView, _t) -> Verdict | None:
        got = (len(node.runtime_inputs), len(node.const_inputs))
        if got in pairs:
            return None
        want = " or ".join(f"{r} runtime + {c} constant" for r, c in pairs)
        return reject(Reason.ARITY, f"Expected {want} input(s), got {got[0]} runtime + {got[1]} constant.")

    return check


def option(key: str, ok: Callable[[object], bool], what: str) -> Check:
    def check(node: NodeView, _t) -> Verdict | None:
        v = node.opts.get(key)
        return None if ok(v) else reject(Reason.OPTION, f"{what} (got {key}={v!r}).")

    return check


def activation_in(allowed: frozenset[str], key: str = "fused_activation_function") -> Check:
    def check(node: NodeView, _t) -> Verdict | None:
        act = node.opts.get(key, "NONE")
        return None if act in allowed else reject(Reason.ACTIVATION, f"Unsupported fused activation {act}.")

    return check


def input_type_in(i: int, allowed: Iterable[str], what: str = "Input type") -> Check:
    """Input i's dtype must be one of `allowed` (an omitted input counts as 'none')."""
    allowed = frozenset(allowed)

    def check(node: NodeView, _t) -> Verdict | None:
        got = dtype(node, i)
        return None if got in allowed else reject(Reason.TENSOR_TYPE, f"{what} {got} is not supported.")

    return check


def constant_input(i: int, what: str) -> Check:
    def check(node: NodeView, _t) -> Verdict | None:
        t = node.input(i)
        return None if t is not None and t.is_const else reject(Reason.CONSTANT, f"{what} must be constant.")

    return check

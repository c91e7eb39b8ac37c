"""Shared vocabulary for the per-delegate rule tables: the rule record, the policy, small predicates.

Each delegate module keeps its rules as data: a table from builtin op name to the highest op version it
takes and a tuple of small checks (GPU uses `Rule`; NNAPI adds the minimum feature level; Hexagon and
Core ML keep their version allowlist beside the table). A check returns a reason string or None; the
first reason wins, the way the runtime's IsSupported returns its first failing status. Each module also
provides `policy(target)` (partition limits, FP16 helper, dynamic tensors), `check(node, target)`,
`hints(...)`, and a `SOURCE` tag naming the file and release it follows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from .flatbuffer import Tensor
from .graph import NodeView

Check = Callable[[NodeView, object], "str | None"]

FLOAT = frozenset({"float32", "float16"})
QUANT8 = frozenset({"uint8", "int8"})


@dataclass(frozen=True)
class Rule:
    vmax: int | None = None
    checks: tuple[Check, ...] = ()


@dataclass(frozen=True)
class Policy:
    """How a delegate turns supported nodes into delegated ones (partition helper and its limits)."""

    max_partitions: int | None  # None or <= 0: unlimited
    min_nodes: int
    fp16_helper: bool  # FP16GraphPartitionHelper: fold float16-weight DEQUANTIZE into consumers
    allows_dynamic: bool  # kTfLiteDelegateFlagsAllowDynamicTensors
    params: dict = field(default_factory=dict)


def shape_str(t: Tensor | None) -> str:
    return "none" if t is None else "[" + ",".join(str(d) for d in t.shape) + "]"


# ---- small predicate factories -------------------------------------------------------------------


def n_inputs(*allowed: int) -> Check:
    def check(node: NodeView, _t) -> str | None:
        n = len(node.op.inputs)
        return None if n in allowed else f"Expected {' or '.join(map(str, allowed))} input(s), got {n}."

    return check


def n_outputs(*allowed: int) -> Check:
    def check(node: NodeView, _t) -> str | None:
        n = len(node.op.outputs)
        return None if n in allowed else f"Expected {' or '.join(map(str, allowed))} output(s), got {n}."

    return check


def runtime_const(*pairs: tuple[int, int]) -> Check:
    """(runtime inputs, const inputs) must be one of the given pairs (gpu_compatibility's CheckInputsConstsOutputs)."""

    def check(node: NodeView, _t) -> str | None:
        got = (len(node.runtime_inputs), len(node.const_inputs))
        if got in pairs:
            return None
        want = " or ".join(f"{r} runtime + {c} constant" for r, c in pairs)
        return f"Expected {want} input(s), got {got[0]} runtime + {got[1]} constant."

    return check


def option(key: str, ok: Callable[[object], bool], what: str) -> Check:
    def check(node: NodeView, _t) -> str | None:
        v = node.opts.get(key)
        return None if ok(v) else f"{what} (got {key}={v!r})."

    return check


def activation_in(allowed: frozenset[str], key: str = "fused_activation_function") -> Check:
    def check(node: NodeView, _t) -> str | None:
        act = node.opts.get(key, "NONE")
        return None if act in allowed else f"Unsupported fused activation {act}."

    return check

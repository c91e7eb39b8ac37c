"""The GPU column observed in the runtime, next to the rules' prediction, where this machine has a GPU device.

ai-edge-litert's CompiledModel API has a GPU accelerator: ML Drift, here on WebGPU (Dawn) over Vulkan. Without a
GPU, Mesa's software Vulkan driver (lavapipe, Mesa 25; Debian 12's own 22.3 is refused by Dawn) is a device it
accepts (docs/platform-notes.md). Each model is compiled with the GPU (CPU fallback allowed) and run once in a
subprocess, so a driver fault costs one observation, not the run; the accelerator's own log says how many nodes
it took and why it left the others ("Following operations are not supported by GPU delegate: ...").

ML Drift is not the classic TfLiteGpuDelegateV2 whose rules `gpu.py` follows: an app on the Interpreter API with
the GPU delegate runs the predicted column; an app on the CompiledModel API with Accelerator.GPU runs ML Drift
(on a phone over OpenCL/OpenGL rather than WebGPU). The observed report says so (`source: runtime`).
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import tempfile
from functools import cache
from pathlib import Path

from optimize.core.results import DelegateReport, NodeVerdict
from optimize.core.vocab import Delegate
from optimize.delegates.rules import Reason

#: The report key of an observed column, beside the rules' own ("gpu").
OBSERVED = {Delegate.GPU: "gpu-observed"}
ICDS = (Path("/usr/share/vulkan/icd.d/lvp_icd.json"), Path("/usr/share/vulkan/icd.d/lvp_icd.x86_64.json"))
TIMEOUT_S = 300
UNAVAILABLE = (
    "GPU (observed): not observed: no Vulkan device the LiteRT GPU accelerator accepts on this machine (Mesa's "
    "lavapipe 25 is one, docs/platform-notes.md); the GPU column is the rules' prediction only."
)
ML_DRIFT = (
    "observed: LiteRT's GPU accelerator (ML Drift, the CompiledModel API's Accelerator.GPU) on {device}; "
    "the 'gpu' column predicts the classic GPU delegate (Interpreter API + GpuDelegate)"
)

PROBE = r"""
import json, sys, time
import numpy as np
from ai_edge_litert.compiled_model import CompiledModel
from ai_edge_litert.hardware_accelerator import HardwareAccelerator as HA
t0 = time.perf_counter()
try:
    m = CompiledModel.from_file(sys.argv[1], hardware_accel=HA.GPU if sys.argv[2] == "gpu" else HA.GPU | HA.CPU)
    out = {"compiled": True, "full": bool(m.is_fully_accelerated()), "compile_s": time.perf_counter() - t0}
    inputs, outputs = m.create_input_buffers(0), m.create_output_buffers(0)
    for b, d in zip(inputs, m.get_input_tensor_details(list(m.get_signature_list())[0]).values()):
        b.write(np.zeros(d["shape"], d["dtype"]))
    m.run_by_index(0, inputs, outputs)
    out["ran"] = True
except Exception as e:  # the accelerator's refusal is the observation
    out = {"compiled": False, "error": (str(e).strip().splitlines() or [type(e).__name__])[-1][:300]}
print("JSON" + json.dumps(out), flush=True)
"""

OUTPUTS = r"""
import json, sys, time
import numpy as np
from ai_edge_litert.compiled_model import CompiledModel
from ai_edge_litert.hardware_accelerator import HardwareAccelerator as HA
from ai_edge_litert.tensor_buffer import TensorBuffer
feeds = np.load(sys.argv[2])
try:
    m = CompiledModel.from_file(sys.argv[1], hardware_accel=HA.GPU | HA.CPU)
    key = list(m.get_signature_list())[0]
    ins, outs = m.get_input_tensor_details(key), m.get_output_tensor_details(key)
    got, run_ms = {}, []
    n = int(feeds["n"])
    for k in list(range(n)) + [0] * max(0, 21 - n):  # at least 20 timed runs after the first (compile, warm-up)
        inputs = m.create_input_buffers(0)  # outputs in host memory: some GPU buffers cannot be locked to read
        outputs = [TensorBuffer.create_from_host_memory(np.zeros(d["shape"], d["dtype"])) for d in outs.values()]
        for i, (b, d) in enumerate(zip(inputs, ins.values())):
            b.write(feeds[f"in{i}_{k}"].astype(d["dtype"]).reshape(d["shape"]))
        t0 = time.perf_counter()
        m.run_by_index(0, inputs, outputs)
        run_ms.append((time.perf_counter() - t0) * 1e3)
        for j, (b, d) in enumerate(zip(outputs, outs.values())):
            got[f"out{j}_{k}"] = b.read(int(np.prod(d["shape"])), d["dtype"]).reshape(d["shape"])
    np.savez(sys.argv[3], **got)
    out = {"ran": True, "full": bool(m.is_fully_accelerated()), "names": list(outs), "run_ms": run_ms}
except Exception as e:
    out = {"ran": False, "error": (str(e).strip().splitlines() or [type(e).__name__])[-1][:300]}
print("JSON" + json.dumps(out), flush=True)
"""

_COUNT = re.compile(r"(\d+) operations will run on the GPU, and the remaining (\d+) operations will run on the CPU")
_NONE = re.compile(r"No operations will run on the GPU, and all (\d+) operations will run on the CPU")
_RESTORED = "Restored original execution plan after delegate application failure"


def check(names) -> list[str]:
    """The delegates to observe in the runtime: only the GPU (its accelerator) can be. Others: one clear error."""
    from optimize.core.errors import OptimizeError

    names = [n.strip().lower() for n in (names.split(",") if isinstance(names, str) else names or ()) if n.strip()]
    others = [n for n in names if n not in OBSERVED]
    if others:
        raise OptimizeError(
            f"{', '.join(others)} cannot be observed here.",
            "Only the GPU is observed in the runtime (--observe gpu); XNNPACK always is.",
        )
    return list(dict.fromkeys(names))


def _run(path: Path, icd: Path, mode: str) -> tuple[dict, list[str]]:
    env = {**os.environ, "VK_ICD_FILENAMES": str(icd)}
    try:
        r = subprocess.run(
            [sys.executable, "-c", PROBE, str(path), mode], capture_output=True, text=True, env=env, timeout=TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        return {"compiled": False, "error": f"no answer within {TIMEOUT_S} s"}, []
    lines = [ln[4:] for ln in r.stdout.splitlines() if ln.startswith("JSON")]
    result = json.loads(lines[-1]) if lines else {"compiled": False, "error": f"exit code {r.returncode}"}
    return result, r.stderr.splitlines()


def _tiny_model() -> bytes:
    """x + x on a [1, 8] float32 input: the smallest model the accelerator must take whole."""
    from optimize.models.normalize import _save, _schema

    s = _schema()
    m = s.ModelT()
    m.version, m.buffers = 3, [s.BufferT()]
    code = s.OperatorCodeT()
    code.builtinCode = code.deprecatedBuiltinCode = s.BuiltinOperator.ADD
    code.version = 1
    m.operatorCodes = [code]
    g = s.SubGraphT()
    g.tensors = []
    for name in ("x", "y"):
        t = s.TensorT()
        t.shape, t.type, t.name, t.buffer = [1, 8], s.TensorType.FLOAT32, name, 0
        g.tensors.append(t)
    op = s.OperatorT()
    op.opcodeIndex, op.inputs, op.outputs = 0, [0, 0], [1]
    op.builtinOptionsType, op.builtinOptions = s.BuiltinOptions.AddOptions, s.AddOptionsT()
    g.operators, g.inputs, g.outputs = [op], [0], [1]
    m.subgraphs = [g]
    return _save(m)


@cache
def gpu_device() -> Path | None:
    """A Vulkan driver (ICD file) the accelerator accepts: it compiles a one-op model with the GPU alone and runs
    it. `VK_ICD_FILENAMES`, when set, is tried first. None when there is none (checked once per process)."""
    env = os.environ.get("VK_ICD_FILENAMES")
    candidates = [Path(p) for p in env.split(os.pathsep)] if env else []
    candidates += [p for p in ICDS if p not in candidates]
    with tempfile.TemporaryDirectory() as tmp:
        probe = Path(tmp) / "probe.tflite"
        probe.write_bytes(_tiny_model())
        for icd in candidates:
            if icd.is_file() and _run(probe, icd, "gpu")[0].get("ran"):
                return icd
    return None


def _device_name(icd: Path) -> str:
    try:
        lib = json.loads(icd.read_text())["ICD"]["library_path"]
    except (OSError, ValueError, KeyError, TypeError):
        lib = "?"
    return f"Vulkan {icd.name} ({Path(lib).name})"


def _refused(log: list[str]) -> list[tuple[str, str]]:
    """The accelerator's "OP: reason" lines after "Following operations are not supported by GPU delegate"."""
    out, inside = [], False
    for line in log:
        if "Following operations are not supported by GPU delegate" in line:
            inside = True
        elif inside and (_COUNT.search(line) or _NONE.search(line)):
            inside = False
        elif inside and ": " in line:
            op, reason = line.split(": ", 1)
            out.append((op.strip().split()[-1], reason.strip()))
    return out


def _counts(result: dict, log: list[str], total: int) -> tuple[int, int, str | None]:
    """(nodes on the GPU, nodes considered, why nothing runs there when the build failed)."""
    error = str(result.get("error", "")).lstrip("└ ").strip()
    if any(_RESTORED in line for line in log):
        return 0, total, f"the accelerator failed to build its graph ({error or 'Failed to initialize kernel'})"
    if not result.get("compiled"):
        return 0, total, f"the accelerator refused the model ({error or 'no answer'})"
    for line in log:
        m = _COUNT.search(line)
        if m:
            return int(m.group(1)), int(m.group(1)) + int(m.group(2)), None
        m = _NONE.search(line)
        if m:
            return 0, int(m.group(1)), None
    return (total if result.get("full") else 0), total, None


def _cpu_nodes(model, refused: list[tuple[str, str]]) -> list[NodeVerdict]:
    """Every main-subgraph node of an op the accelerator named, with its reason (it names ops, not nodes)."""
    why = dict(refused)
    return [
        NodeVerdict(index=op.index, op=op.name, version=op.version, reason=f"{why[op.name]} (observed)", code="runtime")
        for op in model.main.ops
        if op.name in why
    ]


def observe_gpu(model: str | Path | bytes, icd: Path | None = None) -> DelegateReport | None:
    """What the GPU accelerator does with the model on this machine, as a `source: runtime` report; None when
    no device the accelerator accepts exists here (`UNAVAILABLE` says so in one line)."""
    from optimize.models.tflite import read_model

    icd = icd or gpu_device()
    if icd is None:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        if isinstance(model, bytes):
            path = Path(tmp) / "model.tflite"
            path.write_bytes(model)
        else:
            path = Path(model)
        parsed = read_model(path.read_bytes())
        result, log = _run(path, icd, "gpu+cpu")
    delegated, total, failed = _counts(result, log, len(parsed.main.ops))
    refused = _refused(log)
    return DelegateReport(
        delegate=Delegate.GPU,
        source="runtime",
        rules_version=ML_DRIFT.format(device=_device_name(icd)),
        nodes_total=total,
        nodes_delegated=delegated,
        partitions=1 if delegated else 0,  # the log gives no partition count; the accelerator keeps one
        verdict="full" if total and delegated == total else ("partial" if delegated else "none"),
        cpu_nodes=_cpu_nodes(parsed, refused),
        vetoed=failed,
        veto_code=Reason.BUILD_FAILURE.value if failed else None,
    )


def observe_study(study, folder: Path, progress=None):
    """The study with an observed GPU report on every candidate that has an artifact (`OBSERVED` key); the
    study unchanged when this machine has no device the accelerator accepts."""
    if gpu_device() is None:
        logging.getLogger(__name__).warning(UNAVAILABLE)
        return study
    candidates = []
    for c in study.candidates:
        path = Path(folder) / c.artifact if c.ok and c.artifact else None
        if path is not None and path.is_file():
            if progress is not None:
                progress.phase(f"{c.name}: observing the GPU accelerator")
            report = observe_gpu(path)
            c = c.model_copy(update={"delegates": {**c.delegates, OBSERVED[Delegate.GPU]: report}})
        candidates.append(c)
    return study.model_copy(update={"candidates": candidates})


def gpu_outputs(model: str | Path, feeds: list[list], icd: Path | None = None) -> tuple[list, str, list[float]]:
    """The model's outputs computed by the GPU accelerator: `feeds` holds, per sample, each input as the model
    takes it (in signature order, its own dtype); the outputs come back per sample in signature order, in the
    model's output dtypes. (outputs, the device in words, each run's milliseconds: the first compiles and warms
    up, at least 20 follow); ValueError with the accelerator's words when it cannot run the model, or when no
    device is here."""
    import numpy as np

    icd = icd or gpu_device()
    if icd is None:
        raise ValueError(UNAVAILABLE)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "feeds.npz"
        arrays = {f"in{i}_{k}": np.asarray(x) for k, sample in enumerate(feeds) for i, x in enumerate(sample)}
        np.savez(path, n=len(feeds), **arrays)
        env = {**os.environ, "VK_ICD_FILENAMES": str(icd)}
        result_path = Path(tmp) / "outputs.npz"
        try:
            r = subprocess.run(
                [sys.executable, "-c", OUTPUTS, str(model), str(path), str(result_path)],
                capture_output=True,
                text=True,
                env=env,
                timeout=TIMEOUT_S,
            )
        except subprocess.TimeoutExpired:
            raise ValueError(f"no answer within {TIMEOUT_S} s") from None
        lines = [ln[4:] for ln in r.stdout.splitlines() if ln.startswith("JSON")]
        result = json.loads(lines[-1]) if lines else {"ran": False, "error": f"exit code {r.returncode}"}
        if not result.get("ran"):
            raise ValueError(result.get("error", "the accelerator did not run the model"))
        with np.load(result_path) as got:
            per = [[got[f"out{j}_{k}"] for j in range(len(result["names"]))] for k in range(len(feeds))]
    how = "" if result.get("full") else ", part of it on the CPU"
    device = f"observed: LiteRT's GPU accelerator (ML Drift) on {_device_name(icd)}{how}"
    return per[: len(feeds)], device, [float(t) for t in result.get("run_ms", [])]

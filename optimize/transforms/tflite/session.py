"""A LiteRT Quantizer session: calibrate a float .tflite once, then quantize it as often as a search needs,
with some ops held at a higher precision.

LiteRT Quantizer matches per-op configs by a regex over the op's *scope*: its output tensor names joined
by ";" with a trailing ";" (litert_quantizer.utils.tfl_flatbuffer_utils.get_op_scope), and the latest
matching rule wins. So one op is addressed as `^<escaped output name>;`. Calibration statistics (per-tensor
min/max) do not depend on the bit width, so one calibration serves every variant: a variant costs one
quantization pass (~10 ms on a small model), not a calibration.

A session can carry a base: ops every variant keeps float or at 16 bits, and DIVs whose divisors are
clamped in integer (what the failure rescue, optimize.transforms.tflite.repair, found a model needs to
run). Calibration samples whose float outputs are not finite are dropped (the quantizer crashes on
NaN ranges), and a range that is still not finite is a failed attempt, never handed to the quantizer.
Every native call runs in a forked child (optimize.transforms.tflite.isolate).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from optimize.core.errors import OptimizeError, TechniqueFailed
from optimize.core.paths import write_atomic
from optimize.core.registry import Context
from optimize.core.vocab import Precision
from optimize.transforms.tflite.isolate import QuantizerCrashed, isolated
from optimize.transforms.tflite.quantizer_setup import calibrate, quiet, recipe


def scope_regex(tensor_name: str) -> str:
    """The regex LiteRT Quantizer matches against exactly one op: the one whose first output is `tensor_name`."""
    return "^" + re.escape(tensor_name) + ";"


def nonfinite_ranges(qsvs: dict | None) -> list[str]:
    """Tensors whose calibrated min or max is NaN or infinite."""
    bad = []
    for name, v in (qsvs or {}).items():
        for key in ("min", "max"):
            if key in v and not np.all(np.isfinite(np.asarray(v[key], np.float64))):
                bad.append(name)
                break
    return bad


def finite_samples(content: bytes, calibration: dict, threads: int = 2) -> tuple[dict, int]:
    """The calibration samples whose float outputs are all finite, and how many were dropped (a log front
    end gives -inf on digital silence; its NaN ranges crash the quantizer)."""
    from optimize.models import runtime

    ((signature, samples),) = calibration.items()
    runner = runtime.Runner(runtime.load(content, threads=threads, like=samples[0] if samples else None))
    kept = []
    for s in samples:
        try:
            outs = runner.run_fresh(s)
        except runtime.InvokeError:
            continue
        if all(np.all(np.isfinite(o)) for o in outs):
            kept.append(s)
    return {signature: kept}, len(samples) - len(kept)


def _calibrate_in_child(content: bytes, calibration: dict, params, threads: int) -> tuple[dict, dict]:
    from optimize.core.registry import Context as Ctx

    ctx = Ctx(workdir=None, data=None, threads=threads)  # ranges: only `auto` reads samples, from `calibration`
    with quiet():
        qsvs = calibrate(content, calibration, recipe(params), params, ctx)
    return qsvs, dict(ctx.records)


def _quantize_in_child(content: bytes, recipe: list, qsvs) -> bytes:
    from litert_quantizer import quantizer

    with quiet():
        qt = quantizer.Quantizer(bytearray(content), recipe)
        return bytes(qt.quantize(qsvs, enable_progress_bar=False, enable_progress_report=False).quantized_model)


@dataclass
class Session:
    """Calibrate once (`content` is a float .tflite, `params` the quantize technique's params), then
    `quantize(overrides)` any number of variants."""

    content: bytes
    params: object  # transforms.tflite.quantize.QuantizeParams
    ctx: Context
    calibration: dict | None = None
    qsvs: dict | None = field(default=None, repr=False)
    base: dict[str, str] = field(default_factory=dict)  # overrides every variant gets
    clamps: frozenset[str] = frozenset()  # DIVs (by output tensor) whose divisors every variant clamps
    dropped: int = 0  # calibration samples dropped for non-finite float outputs

    def __post_init__(self) -> None:
        if self.qsvs is not None or self.calibration is None or not recipe(self.params).need_calibration():
            return
        self.qsvs = self._calibrate()
        bad = nonfinite_ranges(self.qsvs)
        if bad:
            kept, self.dropped = finite_samples(self.content, self.calibration, max(1, self.ctx.threads))
            if self.dropped and next(iter(kept.values())):
                self.calibration = kept
                self.qsvs = self._calibrate()
                bad = nonfinite_ranges(self.qsvs)
        if bad:
            raise TechniqueFailed(
                f"calibration gives {len(bad)} tensor(s) a non-finite range ({bad[0]}, ...): the float model "
                "computes inf or NaN inside on the calibration data"
                + (f" (after dropping the {self.dropped} samples whose outputs are not finite)" if self.dropped else "")
            )

    def _calibrate(self) -> dict:
        qsvs, records = shared_calibration(self.ctx.shared, self._key(), self._calibrate_here)
        if records.get("ranges"):
            self.ctx.records["ranges"] = records["ranges"]
        return qsvs

    def _key(self) -> str:
        """What the ranges depend on: the float model, the samples and how ranges are chosen (not the bit
        width: int8, int16x8 and the rescue's variants share one calibration)."""
        h = hashlib.sha256(self.content)
        for group, samples in sorted((self.calibration or {}).items()):
            h.update(str(group).encode())
            for sample in samples:
                for name, a in sorted(sample.items()) if isinstance(sample, dict) else [("", sample)]:
                    a = np.ascontiguousarray(a)
                    h.update(f"{name}|{a.dtype}|{a.shape}".encode())
                    h.update(a.tobytes())
        h.update(f"{self.params.calibration}|{self.params.granularity}".encode())
        return h.hexdigest()[:24]

    def _calibrate_here(self) -> tuple[dict, dict]:
        try:
            return isolated(
                _calibrate_in_child,
                self.content,
                self.calibration,
                self.params,
                max(1, self.ctx.threads),
                what="LiteRT Quantizer's calibration",
            )
        except OptimizeError:
            raise
        except TechniqueFailed as e:
            raise TechniqueFailed(f"LiteRT Quantizer could not calibrate this model: {e}") from e
        except Exception as e:  # the quantizer raises many types on models it cannot handle
            raise TechniqueFailed(f"LiteRT Quantizer could not calibrate this model: {_first_line(e)}") from e

    def with_base(self, base: Mapping[str, str], clamps=frozenset()) -> Session:
        """The same calibration with a base every variant gets."""
        return Session(
            self.content,
            self.params,
            self.ctx,
            self.calibration,
            self.qsvs,
            dict(base),
            frozenset(clamps),
            self.dropped,
        )

    def quantize(self, overrides: Mapping[str, Precision] | None = None) -> bytes:
        """The model quantized by the session's scheme, except the ops named (by output tensor) in `overrides`
        (and the session's base)."""
        from litert_quantizer import qtyping
        from litert_quantizer.algorithm_manager import AlgorithmName

        from optimize.transforms.tflite import graphfix

        rm = recipe(self.params)
        op = qtyping.TFLOperationName
        gran = (
            qtyping.QuantGranularity.CHANNELWISE
            if self.params.granularity == "channel"
            else qtyping.QuantGranularity.TENSORWISE
        )
        for tensor, precision in {**self.base, **(overrides or {})}.items():
            if precision == Precision.FLOAT:
                rm.add_quantization_config(scope_regex(tensor), op.ALL_SUPPORTED, None, AlgorithmName.NO_QUANTIZE)
            elif precision == Precision.INT16:
                rm.add_static_config(scope_regex(tensor), op.ALL_SUPPORTED, 16, 8, gran)
        try:
            out = isolated(
                _quantize_in_child, self.content, rm.get_quantization_recipe(), self.qsvs, what="LiteRT Quantizer"
            )
        except TechniqueFailed as e:
            raise TechniqueFailed(f"LiteRT Quantizer could not make this variant: {e}") from e
        except Exception as e:  # noqa: BLE001 - a variant the quantizer cannot make is reported, not fatal
            raise TechniqueFailed(f"LiteRT Quantizer could not make this variant: {_first_line(e)}") from e
        if not out:
            raise TechniqueFailed("LiteRT Quantizer returned no model.")
        out = made_by("LiteRT Quantizer", graphfix.fix_signature_if_stale(out, self.content))
        if self.clamps:
            out, _ = graphfix.clamp_divisors(out, self.clamps)
        return out


# ------------------------------------------------------------------------------------------- shared calibrations

_CALIBRATIONS: dict[str, tuple[dict, dict]] = {}  # this process's, by key (a worker's int8 and its rescue)


def shared_calibration(folder: Path | None, key: str, compute) -> tuple[dict, dict]:
    """(ranges, records) for `key`: from this process's memory, else from `folder` (shared by the run's tasks on
    this machine: another worker calibrated the same model on the same samples), else `compute()`d and kept in
    both. One task calibrates at a time per key (a lock file): the others wait for it and read its ranges, so a
    sweep's int8 and int16x8, started together, calibrate once. A store that cannot be read or written is
    passed by (each task calibrates, as before)."""
    if key in _CALIBRATIONS:
        return _CALIBRATIONS[key]
    if folder is None:
        return _remember(key, compute())
    import fcntl

    path = Path(folder) / f"calibration-{key}.json"
    try:
        Path(folder).mkdir(parents=True, exist_ok=True)
        lock = open(Path(folder) / f"calibration-{key}.lock", "a+b")  # noqa: SIM115 - held across the compute
    except OSError:
        return _remember(key, compute())
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        found = _read_calibration(path)
        if found is None:
            found = compute()
            with contextlib.suppress(OSError, TypeError, ValueError):
                write_atomic(path, json.dumps(_plain(found)).encode())
    return _remember(key, found)


def _remember(key: str, found: tuple[dict, dict]) -> tuple[dict, dict]:
    _CALIBRATIONS.clear()  # one model's at a time: a worker moves on to other models
    _CALIBRATIONS[key] = found
    return found


def _plain(value):
    """Ranges as JSON: arrays as {"dtype", "shape", "values"}."""
    if isinstance(value, np.ndarray | np.generic):
        a = np.asarray(value)
        return {"__array__": True, "dtype": a.dtype.str, "shape": list(a.shape), "values": a.ravel().tolist()}
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _arrays(value):
    if isinstance(value, dict) and value.get("__array__") is True:
        return np.asarray(value["values"], dtype=np.dtype(value["dtype"])).reshape(value["shape"])
    if isinstance(value, dict):
        return {k: _arrays(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_arrays(v) for v in value]
    return value


def _read_calibration(path: Path) -> tuple[dict, dict] | None:
    from optimize.core.bounded import loads_json
    from optimize.core.paths import read_bounded

    if not path.is_file():
        return None
    try:
        qsvs, records = _arrays(loads_json(read_bounded(path, "calibration", limit=2**30), "calibration"))
        return dict(qsvs), dict(records)
    except Exception:  # noqa: BLE001 - a damaged entry is calibrated again
        return None


def made_by(who: str, content: bytes) -> bytes:
    """A model a quantizer wrote, validated like any .tflite and prepared once by the runtime in a forked child:
    when it does not validate, or the runtime dies preparing it (a kernel's check aborts the process: int16
    SUB with a constant operand of scale 0 in the TFLite calibrator's output), the fault is the quantizer's (a
    failed attempt naming it and the op), never the user's model, and never the end of this process."""
    from optimize.core.errors import ModelError
    from optimize.models.tflite import read_model

    try:
        read_model(content)
    except ModelError as e:
        raise TechniqueFailed(f"{who} wrote a model that does not validate ({e.problem})") from None
    try:
        isolated(_prepares, content, what="the LiteRT runtime")
    except QuantizerCrashed as e:
        suspects = zero_scales(content)
        raise TechniqueFailed(
            f"{who} wrote a model that {e} while preparing it" + (f" ({'; '.join(suspects[:2])})" if suspects else "")
        ) from None
    except OptimizeError:
        pass  # a model the runtime refuses with a reason is judged later, by the check that loads it
    return content


def _prepares(content: bytes) -> bool:
    """Whether the runtime prepares the model (its own refusals are answered, not raised: only a crash counts)."""
    from optimize.models import runtime

    return runtime.loads(content)


def zero_scales(content: bytes) -> list[str]:
    """'OP tensor: an input of scale 0' for ops reading a quantized tensor whose scale is 0: its kernel's
    requantization multiplier is then 0, which the runtime's preparation aborts on."""
    from optimize.models.tflite import read_model

    sg = read_model(content).main
    out = []
    for op in sg.ops:
        for i in op.inputs:
            q = sg.tensors[i].quant if i >= 0 else None
            if q is not None and q.count and not np.all(q.scales > 0):
                where = sg.tensors[op.outputs[0]].name if op.outputs else str(op.index)
                out.append(f"{op.name} {where}: its input {sg.tensors[i].name} has quantization scale 0")
                break
    return out


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:200] if text else type(e).__name__

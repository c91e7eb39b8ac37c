"""A .tflite's I/O contract, read from the file: how to feed each input and read each output (issue 43).

For every input and output of the main subgraph: its name, the dtype the caller hands over, its shape (-1 where
the file leaves a dimension free), and for a tensor quantized to integers the scale and zero point that turn
its integers into the float values the model was made for: `q = round(x / scale) + zero_point`, `x = (q -
zero_point) * scale`. The float range an integer tensor stands for follows from those two numbers and its dtype;
a float tensor's file says no range, so the range of the data the model was measured on is given for it,
labelled as such (`range_from`). Everything else comes from the artifact's own bytes, never from what the
recipe meant to make: an `int8-int8io` whose quantizer left a float edge says float here.
"""

from __future__ import annotations

import numpy as np

from optimize.core.results import IOContract, TensorContract
from optimize.models.flatbuffer import Model, Subgraph
from optimize.models.tflite import read_model

#: The integers each quantized dtype holds: what scale and zero point can represent.
INTEGER_RANGES = {"int8": (-128, 127), "uint8": (0, 255), "int16": (-32768, 32767), "uint16": (0, 65535)}


def _names(model: Model, sg: Subgraph, which: str) -> dict[int, str]:
    """Tensor index -> the signature's key for it, where the main subgraph's signature names its edges."""
    for sig in model.signatures:
        pairs = getattr(sig, which)
        if sig.subgraph == sg.index and pairs:
            return {i: key for key, i in pairs}
    return {}


def _tensor(sg: Subgraph, i: int, name: str | None, data_range: tuple[float, float] | None) -> TensorContract:
    t = sg.tensors[i]
    shape = list(t.shape_signature if t.shape_signature else t.shape)
    q = t.quant
    if q is not None and t.dtype in INTEGER_RANGES and q.count == 1 and not q.blockwise:
        scale = float(q.scales[0])
        zp = int(q.zero_points[0]) if q.zp_count else 0
        lo, hi = INTEGER_RANGES[t.dtype]
        return TensorContract(
            name=name or t.name,
            dtype=t.dtype,
            shape=shape,
            scale=scale,
            zero_point=zp,
            range=[_round((lo - zp) * scale), _round((hi - zp) * scale)],
            range_from="quantization",
        )
    ranged = data_range is not None and t.dtype in ("float32", "float16")
    return TensorContract(
        name=name or t.name,
        dtype=t.dtype,
        shape=shape,
        range=[_round(data_range[0]), _round(data_range[1])] if ranged else None,
        range_from="data" if ranged else None,
    )


def _round(v: float) -> float:
    return float(f"{float(v):.6g}")


def read_contract(
    model: bytes | Model, data_ranges: dict[str, tuple[float, float]] | None = None, metadata: str | None = None
) -> IOContract:
    """The contract of a .tflite (its bytes, or the parsed model). `data_ranges`: per input name (or "" for a
    model with one input), the range of the data it was measured on, given for float inputs; `metadata`: the
    line that says what TFLite metadata the file carries (`optimize.models.metadata.summary`)."""
    parsed = model if isinstance(model, Model) else read_model(model)
    sg = parsed.main
    ranges = data_ranges or {}
    keys_in, keys_out = _names(parsed, sg, "inputs"), _names(parsed, sg, "outputs")
    inputs = []
    for i in sg.inputs:
        name = keys_in.get(i) or sg.tensors[i].name
        found = ranges.get(name, ranges.get(sg.tensors[i].name))
        if found is None and len(sg.inputs) == 1:
            found = ranges.get("")
        inputs.append(_tensor(sg, i, name, found))
    outputs = [_tensor(sg, i, keys_out.get(i), None) for i in sg.outputs]
    return IOContract(inputs=inputs, outputs=outputs, metadata=metadata)


def data_ranges(x) -> dict[str, tuple[float, float]]:
    """Per input (keyed by the data's input name, "" for one unnamed input), the lowest and highest value of the
    float samples given: what a float input is measured on, and so what it expects."""
    arrays = x.items() if isinstance(x, dict) else [("", x)]
    out = {}
    for name, a in arrays:
        a = np.asarray(a)
        if a.size and np.issubdtype(a.dtype, np.floating):
            out[name] = (float(a.min()), float(a.max()))
    return out


def feed_line(t: TensorContract) -> str:
    """How to feed (an input) or read (an output) one tensor, in a line."""
    shape = "x".join("?" if d < 0 else str(d) for d in t.shape) or "scalar"
    head = f"{t.name}: {t.dtype} [{shape}]"
    span = f"[{t.range[0]:g}, {t.range[1]:g}]" if t.range else None
    if t.scale is not None:
        return f"{head}, scale {t.scale:.6g}, zero point {t.zero_point} (float {span})"
    if span:
        return f"{head}, float {span} (the data's range)"
    return head

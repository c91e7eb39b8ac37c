"""What a model's weights are made of, read before any conversion: the share Dense/MatMul layers hold.

4-bit weights pay off where the weights are large matrices (Dense, attention projections, embeddings): XNNPACK
has 4-bit kernels for FULLY_CONNECTED and its kin, not for convolutions. The default sweep tries `int4` when
most of a model's weight elements sit in such matrices of at least 1,024 elements (what the quantizer turns to
4 bits). Read without TensorFlow: a .tflite's flatbuffer, or a Keras file's config and weights (HDF5). A
SavedModel is not read before conversion (None: unknown).
"""

from __future__ import annotations

import io
import json
import re
import zipfile
from pathlib import Path

#: Ops whose weights int4 makes 4-bit: what LiteRT Quantizer's 4-bit dynamic recipes take besides CONV_2D
#: (default_policy.py: dynamic_wi4_afp32, dynamic_wi4_afp32_blockwise), and what XNNPACK has 4-bit kernels for.
INT4_OPS = ("FULLY_CONNECTED", "EMBEDDING_LOOKUP")
#: Keras layers that convert to those ops.
DENSE_LAYERS = frozenset({"Dense", "EinsumDense", "MultiHeadAttention", "Embedding"})
DENSE_NAMES = frozenset({"dense", "einsum_dense", "multi_head_attention", "embedding"})
MIN_ELEMENTS = 1024  # smaller weights stay float (the quantizer's min_weight_elements default)
MOSTLY = 0.5


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _float_constant(sg, i: int, source: dict[int, int]):
    t = sg.tensors[source.get(i, i)] if i >= 0 else None
    return t if t is not None and t.is_const and t.dtype in ("float32", "float16") else None


def tflite_share(content: bytes) -> float | None:
    """Share of a float .tflite's weight elements that feed Dense/MatMul ops in tensors of >= 1,024 elements
    (float16 weights behind DEQUANTIZE count for the op that reads them)."""
    from optimize.models.tflite import read_model

    sg = read_model(content).main
    source = {op.outputs[0]: op.inputs[0] for op in sg.ops if op.opcode == "DEQUANTIZE" and op.inputs and op.outputs}
    sizes: dict[int, int] = {}
    dense: set[int] = set()
    for op in sg.ops:
        for pos, i in enumerate(op.inputs):
            t = _float_constant(sg, i, source)
            if t is None:
                continue
            sizes[t.index] = t.numel
            if op.opcode in INT4_OPS and pos == 1 and t.numel >= MIN_ELEMENTS:
                dense.add(t.index)
    total = sum(sizes.values())
    return sum(sizes[i] for i in dense) / total if total else None


def _h5_shapes(f, prefix: str) -> list[tuple[str, tuple]]:
    out: list[tuple[str, tuple]] = []
    f.visititems(lambda name, obj: out.append((name, obj.shape)) if hasattr(obj, "shape") else None)
    return [(n[len(prefix) :], s) for n, s in out if n.startswith(prefix)]  # not the optimizer's slots


def _keras_weights(path: Path) -> tuple[dict | None, list[tuple[str, tuple]]]:
    """The Keras config and (path under the top-level layer's name, shape) of every stored weight."""
    import h5py

    if path.read_bytes()[:2] == b"PK":
        with zipfile.ZipFile(path) as z:
            config = json.loads(z.read("config.json"))
            with h5py.File(io.BytesIO(z.read("model.weights.h5")), "r") as f:
                return config, _h5_shapes(f, "layers/")
    with h5py.File(path, "r") as f:
        raw = f.attrs.get("model_config")
        config = json.loads(raw.decode() if isinstance(raw, bytes) else raw)
        return config, _h5_shapes(f["model_weights"], "")


def _base(segment: str) -> str:
    """`dense_3` -> `dense`, `_key_dense` -> `key_dense`: the layer kind a weight path segment names."""
    return re.sub(r"_\d+$", "", segment.lstrip("_"))


def _dense_weight(path: str, kinds: dict[str, str]) -> bool:
    """A stored weight of a Dense-like layer: the .keras format names groups after the layer's class
    (`dense_1`, `multi_head_attention/_key_dense`), the legacy .h5 after the layer (its class in the config)."""
    segments = [seg for seg in path.split("/") if seg not in ("layers", "vars") and not seg.isdigit()]
    if any(kinds.get(seg) in DENSE_LAYERS for seg in segments):
        return True
    return any(_base(seg) in DENSE_NAMES or _base(seg).endswith("_dense") for seg in segments)


def keras_share(path: Path) -> float | None:
    """The same share for a Keras .keras/.h5 file, from its stored weight shapes (and config)."""
    try:
        config, shapes = _keras_weights(path)
        kinds = {layer["config"]["name"]: layer["class_name"] for layer in config["config"]["layers"]}
    except (KeyError, TypeError, ValueError, OSError, zipfile.BadZipFile):
        return None
    total = sum(_numel(s) for _, s in shapes)
    dense = sum(
        _numel(s) for name, s in shapes if len(s) >= 2 and _numel(s) >= MIN_ELEMENTS and _dense_weight(name, kinds)
    )
    return dense / total if total else None


def dense_share(src) -> float | None:
    """Share of the weights int4 would make 4-bit, for a ModelSource (None: not known before conversion)."""
    if src.converted and src.content is not None:  # a model's float .tflite, converted at the door
        return tflite_share(src.content)
    if src.kind == "tflite":
        return tflite_share(src.path.read_bytes())
    if src.kind in ("keras2", "keras3") and src.path.is_file():
        return keras_share(src.path)
    return None


def mostly_dense(src) -> bool:
    """Most weight elements are Dense/MatMul matrices int4 would make 4-bit: the default sweep tries int4."""
    share = dense_share(src)
    return share is not None and share > MOSTLY

"""The crafted corpus of issue 41 (trust boundaries), built here from small seeded models: `.tflite` files with
broken quantization, sparsity and constant-backed tensors, and the hostile names a study or report meets.
Shared by tests/test_trust_boundaries.py (tests/ is on sys.path, as for the other fixture modules).

Every case is (bytes, what the one `error:` line must name). The files are edits of two bases made with the
TFLite converter: an int8 CNN with float I/O (a QUANTIZE op on its input, per-channel conv weights) and a float
dense model whose weights the converter stores sparse (`Optimize.EXPERIMENTAL_SPARSITY`, behind DENSIFY).
"""

from __future__ import annotations

import numpy as np
from delegate_fixtures import load_t, save_t

#: Text from outside that a Markdown viewer would make live: a link, a remote image, HTML, bare autolinks.
MARKDOWN = (
    "x [click](javascript:alert(1)) ![p](http://evil.example/p.png) <img src=x onerror=alert(1)> "
    "www.evil.example a@b.example <https://evil.example/a> `tick` *em* | pipe"
)


def _schema():
    from ai_edge_litert import schema_py_generated as s

    return s


def int8_base() -> bytes:
    """Conv (8 channels, per-channel int8 weights) -> max pool -> dense, int8 inside, float I/O."""
    from optimize.models import _tf

    keras, tf = _tf.keras(), _tf.tf()
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.layers.Input((8, 8, 1)),
            keras.layers.Conv2D(8, 3, padding="same", activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dense(10),
        ]
    )
    return _calibrated(model, (1, 8, 8, 1), tf.lite.OpsSet.TFLITE_BUILTINS_INT8)


def _calibrated(model, shape: tuple, ops) -> bytes:
    """The TFLite converter's integer conversion (`ops`) of a Keras model, calibrated on seeded uniform samples."""
    from optimize.models import _tf

    tf = _tf.tf()
    rng = np.random.default_rng(0)
    c = tf.lite.TFLiteConverter.from_keras_model(model)
    c.optimizations = [tf.lite.Optimize.DEFAULT]
    c.representative_dataset = lambda: ([rng.random(shape, dtype=np.float32)] for _ in range(16))
    c.target_spec.supported_ops = [ops]
    return c.convert()


def zero_channel_int16x8() -> bytes:
    """What TensorFlow's converter writes for int16x8 when a channel's weights are all zero (a pruned filter):
    that channel's scale is 0, and the model runs. The validator must take it."""
    from optimize.models import _tf

    keras, tf = _tf.keras(), _tf.tf()
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.layers.Input((8, 8, 3)), keras.layers.Conv2D(4, 3), keras.layers.Flatten()])
    w, b = model.layers[0].get_weights()
    w[..., 1], b[1] = 0, 0
    model.layers[0].set_weights([w, b])
    return _calibrated(model, (1, 8, 8, 3), tf.lite.OpsSet.EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8)


def sparse_base() -> bytes:
    """Dense(32) -> Dense(4) on 32 inputs, 80% of each weight zero: the converter stores them sparse (CSR)."""
    from optimize.models import _tf

    keras, tf = _tf.keras(), _tf.tf()
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.layers.Input((32,)), keras.layers.Dense(32, "relu"), keras.layers.Dense(4)])
    rng = np.random.default_rng(0)
    for layer in model.layers:
        w, b = layer.get_weights()
        w[rng.random(w.shape) < 0.8] = 0
        layer.set_weights([w, b])
    c = tf.lite.TFLiteConverter.from_keras_model(model)
    c.optimizations = [tf.lite.Optimize.EXPERIMENTAL_SPARSITY]
    return c.convert()


def _tensors(m):
    return m.subgraphs[0].tensors


def _by(m, pred):
    """The first tensor of subgraph 0 for which `pred(tensor)` holds, and its index."""
    return next((i, t) for i, t in enumerate(_tensors(m)) if pred(t))


def _op_output(m, code: str):
    s = _schema()
    want = getattr(s.BuiltinOperator, code)
    for op in m.subgraphs[0].operators:
        if (
            max(m.operatorCodes[op.opcodeIndex].builtinCode, m.operatorCodes[op.opcodeIndex].deprecatedBuiltinCode)
            == want
        ):
            return int(op.outputs[0])
    raise LookupError(code)


def _weights(m):
    """The conv's per-channel int8 weights (rank 4)."""
    return _by(m, lambda t: t.type == 9 and t.buffer and len(t.shape) == 4)


def _activation(m):
    """The max pool's output: a per-tensor int8 activation."""
    i = _op_output(m, "MAX_POOL_2D")
    return i, _tensors(m)[i]


def _input_quantized(m):
    i = _op_output(m, "QUANTIZE")
    return i, _tensors(m)[i]


def _set_scale(which, value, channel: int | None = None):
    def edit(m):
        i, t = which(m)
        scales = list(t.quantization.scale)
        scales[channel or 0] = value
        t.quantization.scale = scales
        return i

    return edit


def _set_zero_point(which, value):
    def edit(m):
        i, t = which(m)
        t.quantization.zeroPoint = [value] * len(t.quantization.zeroPoint)
        return i

    return edit


def _drop_channel(m):
    i, t = _weights(m)
    t.quantization.scale = list(t.quantization.scale)[:-1]
    t.quantization.zeroPoint = list(t.quantization.zeroPoint)[:-1]
    return i


def _short_zero_points(m):
    i, t = _weights(m)
    t.quantization.zeroPoint = list(t.quantization.zeroPoint)[:-1]
    return i


def _dimension(m):
    i, t = _weights(m)
    t.quantization.quantizedDimension = 7
    return i


def _applied(base: bytes, edits: dict) -> dict[str, tuple[bytes, str]]:
    """name -> (the base with that edit made, what is said about it)."""
    out = {}
    for name, (edit, said) in edits.items():
        m = load_t(base)
        edit(m)
        out[name] = (save_t(m), said)
    return out


def quant_cases(base: bytes) -> dict[str, tuple[bytes, str]]:
    """Each quantization defect, applied to the int8 base: name -> (file, what the error line says)."""
    nan, inf = float("nan"), float("inf")
    edits = {
        "input scale 0 (the segfault)": (_set_scale(_input_quantized, 0.0), "quantization scale of 0.0"),
        "input scale negative": (_set_scale(_input_quantized, -0.5), "quantization scale of -0.5"),
        "input scale NaN": (_set_scale(_input_quantized, nan), "quantization scale of nan"),
        "input scale infinite": (_set_scale(_input_quantized, inf), "quantization scale of inf"),
        "activation scale 0": (_set_scale(_activation, 0.0), "quantization scale of 0.0"),
        "activation scale NaN": (_set_scale(_activation, nan), "quantization scale of nan"),
        "weight scale NaN (channel 3)": (_set_scale(_weights, float("nan"), 3), "scale of nan (channel 3)"),
        "weight scale negative": (_set_scale(_weights, -1.0, 0), "scale of -1.0 (channel 0)"),
        "weight scale infinite": (_set_scale(_weights, inf, 5), "scale of inf (channel 5)"),
        "zero point 300 on int8": (_set_zero_point(_activation, 300), "zero point 300, outside int8's -128..127"),
        "zero point -129 on int8": (_set_zero_point(_input_quantized, -129), "zero point -129"),
        "zero point 2**40": (_set_zero_point(_activation, 2**40), "zero point 1099511627776"),
        "per-axis count short of the channels": (_drop_channel, "7 scales for 8 channels"),
        "fewer zero points than scales": (_short_zero_points, "8 quantization scales but 7 zero points"),
        "quantized dimension outside the shape": (_dimension, "quantized along dimension 7"),
    }
    return _applied(base, edits)


# ------------------------------------------------------------------------------------------------ sparsity


def _sparse(m):
    return next(t for t in _tensors(m) if t.sparsity is not None)


def _vector(values, kind: int = 1):
    s = _schema()
    v = {1: s.Int32VectorT, 2: s.Uint16VectorT, 3: s.Uint8VectorT}[kind]()
    v.values = list(values)
    return v


def _issue_sparsity(m):  # the values issue 41 found copied into a written int8.tflite
    t = _sparse(m)
    t.sparsity.traversalOrder = [0, 7, 9]
    d = t.sparsity.dimMetadata[1]
    d.arraySegmentsType, d.arraySegments = 1, _vector([0, 2147483647, -4])


def _segments(values):
    def edit(m):
        d = _sparse(m).sparsity.dimMetadata[1]
        d.arraySegmentsType, d.arraySegments = 1, _vector(values(list(int(v) for v in d.arraySegments.values)))

    return edit


def _indices(m):
    d = _sparse(m).sparsity.dimMetadata[1]
    values = [int(v) for v in d.arrayIndices.values]
    values[0] = 4096
    d.arrayIndicesType, d.arrayIndices = 1, _vector(values)


def _decreasing(v):
    v[3] = v[2] - 1
    return v


def _set(path: str, value):
    def edit(m):
        obj = _sparse(m)
        *parents, last = path.split(".")
        for p in parents:
            obj = obj[int(p)] if p.isdigit() else getattr(obj, p)
        setattr(obj, last, value)

    return edit


def _short_buffer(m):
    t = _sparse(m)
    m.buffers[t.buffer].data = list(m.buffers[t.buffer].data)[:16]


def _not_constant(m):
    _sparse(m).buffer = 0


def sparse_cases(base: bytes) -> dict[str, tuple[bytes, str]]:
    """Each sparsity defect, applied to the sparse base's first sparse weight: name -> (file, what is said)."""
    edits = {
        "issue 41's: order [0, 7, 9], segments [0, 2147483647, -4]": (_issue_sparsity, "3 traversal dimensions"),
        "traversal order repeats a dimension": (_set("sparsity.traversalOrder", [1, 1]), "traversal order [1, 1]"),
        "segments out of range": (_segments(lambda v: [0, 2147483647, *v[2:]]), "at level 1 that do not run"),
        "segments decreasing": (_segments(_decreasing), "at level 1 that do not run"),
        "too few segments": (_segments(lambda v: v[:5]), "5 segments at level 1"),
        "an index outside its dimension": (_indices, "an index outside 0..31 at level 1"),
        "a dense level larger than its dimension": (_set("sparsity.dimMetadata.0.denseSize", 1000), "dense level 0"),
        "a block map naming no dimension": (_set("sparsity.blockMap", [5]), "1 block dimension"),
        "a level in no known format": (_set("sparsity.dimMetadata.0.format", 5), "format 5"),
        "a sparse level without indices": (_set("sparsity.dimMetadata.1.arrayIndices", None), "without its segments"),
        "a buffer shorter than the values kept": (_short_buffer, "but its buffer holds 16 bytes"),
        "sparsity on a tensor with no data": (_not_constant, "sparse but with no constant data"),
    }
    return _applied(base, edits)


def blocked(base: bytes) -> bytes:
    """The sparse base's first weight re-stored in 1x4 blocks (traversal [0, 1, 2], block map [1]): a valid
    layout the validator must accept and the runtime runs to the same outputs."""
    s = _schema()
    m = load_t(base)
    t = _sparse(m)
    rows, cols = (int(d) for d in t.shape)
    sp = t.sparsity
    seg = np.asarray(sp.dimMetadata[1].arraySegments.values, int)
    idx = np.asarray(sp.dimMetadata[1].arrayIndices.values, int)
    values = np.frombuffer(bytes(bytearray(m.buffers[t.buffer].data)), np.float32)
    dense = np.zeros((rows, cols), np.float32)
    for r in range(rows):
        dense[r, idx[seg[r] : seg[r + 1]]] = values[seg[r] : seg[r + 1]]
    segments, indices, kept = [0], [], []
    for r in range(rows):
        for b in range(cols // 4):
            block = dense[r, 4 * b : 4 * b + 4]
            if block.any():
                indices.append(b)
                kept.extend(block)
        segments.append(len(indices))
    levels = []
    for fmt, size in ((0, rows), (1, 0), (0, 4)):
        d = s.DimensionMetadataT()
        d.format, d.denseSize = fmt, size
        levels.append(d)
    levels[1].arraySegmentsType, levels[1].arraySegments = 1, _vector(segments)
    levels[1].arrayIndicesType, levels[1].arrayIndices = 1, _vector(indices)
    t.sparsity = s.SparsityParametersT()
    t.sparsity.traversalOrder, t.sparsity.blockMap, t.sparsity.dimMetadata = [0, 1, 2], [1], levels
    m.buffers[t.buffer].data = list(np.asarray(kept, np.float32).tobytes())
    return save_t(m)


# ------------------------------------------------------------------------------------- constant-backed


def _constant(m, index: int, size: int) -> None:
    s = _schema()
    b = s.BufferT()
    b.data = [1] * size
    m.buffers.append(b)
    _tensors(m)[index].buffer = len(m.buffers) - 1


def const_cases(base: bytes) -> dict[str, tuple[bytes, str]]:
    """Graph inputs and outputs, and an operator's output, backed by constant buffers (int8 base)."""
    out = {}
    m = load_t(base)
    i = int(m.subgraphs[0].inputs[0])
    _constant(m, i, 256)
    out["an input backed by a constant"] = (save_t(m), f"subgraph 0's input is tensor {i}")
    m = load_t(base)
    i = _op_output(m, "MAX_POOL_2D")
    _constant(m, i, 128)
    out["an operator writing into a constant"] = (save_t(m), f"writes its output into tensor {i}")
    m = load_t(base)
    o = int(m.subgraphs[0].outputs[0])
    _constant(m, o, 40)
    out["the output backed by a constant"] = (save_t(m), f"tensor {o}")
    m = load_t(base)
    i, _ = _weights(m)
    m.subgraphs[0].outputs = [*m.subgraphs[0].outputs, i]
    out["a weight listed as an output"] = (save_t(m), f"output tensor {i}")
    return out

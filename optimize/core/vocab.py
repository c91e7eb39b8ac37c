"""The one vocabulary: scheme, I/O, target, delegate, backend, objective and task names, and the tables
that relate them. Everything else imports these (params, Typer options, records, reports, the recommender),
the way ai-edge-quantizer's `qtyping.py` serves that project. Pure Python: no TensorFlow, no pydantic.

Every name is a `StrEnum`, so a member compares equal to its string and prints as it (`Scheme.INT8 ==
"int8"`, `f"{Scheme.INT8}" == "int8"`), and JSON written by older runs still reads.
"""

from __future__ import annotations

from enum import StrEnum


class Scheme(StrEnum):
    """The numeric scheme of a .tflite artifact."""

    FLOAT32 = "float32"
    FLOAT16 = "float16"  # float16 weights, float32 compute (dequantized at load, or fp16 on GPU)
    DYNAMIC = "dynamic"  # int8 weights, float activations quantized on the fly
    INT8 = "int8"  # full integer: int8 weights and activations, calibrated
    INT16X8 = "int16x8"  # int8 weights, int16 activations, calibrated (reference kernels)
    INT4 = "int4"  # 4-bit Dense/MatMul weights (channel-wise or blockwise), float activations (LiteRT Quantizer)


class IO(StrEnum):
    """The type of a model's inputs and outputs."""

    FLOAT = "float"
    INT8 = "int8"
    UINT8 = "uint8"
    INT16 = "int16"


class Target(StrEnum):
    """Where a model is meant to run."""

    CPU = "cpu"
    GPU = "gpu"
    NNAPI = "nnapi"
    HEXAGON = "hexagon"
    COREML = "coreml"
    EDGETPU = "edgetpu"
    MCU = "mcu"


class Delegate(StrEnum):
    """The delegates whose acceptance is checked: four by their rules, XNNPACK in the runtime."""

    GPU = "gpu"
    NNAPI = "nnapi"
    HEXAGON = "hexagon"
    COREML = "coreml"
    XNNPACK = "xnnpack"


class Backend(StrEnum):
    """Who quantizes a post-training scheme: the TFLite converter while converting, or LiteRT Quantizer
    on the float32 flatbuffer. AUTO picks per scheme (`DEFAULT_BACKEND`)."""

    CONVERTER = "converter"
    LITERT = "litert"
    CALIBRATOR = "calibrator"  # the TFLite calibrator on a float flatbuffer (LiteRT Quantizer's fallback)
    PT2E = "pt2e"  # litert-torch's PT2E quantizer on a PyTorch / ONNX model's torch graph, then converted
    AUTO = "auto"


class Layout(StrEnum):
    """The layout a PyTorch or ONNX model's image inputs and outputs take once converted."""

    SOURCE = "source"  # as the source model takes them (NCHW for PyTorch and ONNX image models)
    CHANNELS_LAST = "channels-last"  # NHWC: what GPU delegates, Core ML and camera pipelines feed


class FitOption(StrEnum):
    """Rewrites of the fit (optimize.transforms.tflite.fit) beyond the model's contract: applied only when named."""

    NON_NEGATIVE_IDS = "non-negative-ids"  # drop the negative-index wrap of ids the model does not declare >= 0
    FLOAT_MASK = "float-mask"  # an integer mask input taken as float32 (0/1): the input's dtype changes


class Objective(StrEnum):
    """What a recommendation ranks by, once every goal is met."""

    SIZE = "size"
    LATENCY = "latency"
    ACCURACY = "accuracy"


class Task(StrEnum):
    """What a model's labelled output means (optimize.models.tasks detects it; --task overrides)."""

    CLASSIFICATION = "classification"  # softmax or logits over classes, integer labels
    BINARY = "binary"  # one sigmoid unit (or logit), 0/1 labels
    MULTILABEL = "multilabel"  # several sigmoid units, 0/1 label vectors
    REGRESSION = "regression"  # values in the target's own units
    OTHER = "other"  # landmarks, boxes, masks, embeddings: compared with the float model only
    DETECT = "detect"  # a detector head (boxes and scores): detections kept against the float model's
    SEGMENT = "segment"  # a segmentation map (classes or a mask per pixel): mask IoU against the float model's


class Precision(StrEnum):
    """The precision one op runs at inside a mixed model (a selective-quantization search moves ops up)."""

    INT8 = "int8"
    INT16 = "int16"  # 16-bit activations, 8-bit weights
    FLOAT = "float"


#: Schemes made after training from a float model (everything but the float32 baseline).
PTQ_SCHEMES: tuple[Scheme, ...] = (Scheme.FLOAT16, Scheme.DYNAMIC, Scheme.INT8, Scheme.INT16X8, Scheme.INT4)

#: Schemes only LiteRT Quantizer makes (the TFLite converter has no 4-bit weights): always its backend.
LITERT_ONLY_SCHEMES: tuple[Scheme, ...] = (Scheme.INT4,)

#: Schemes whose activation ranges come from calibration data.
CALIBRATED_SCHEMES: tuple[Scheme, ...] = (Scheme.INT8, Scheme.INT16X8)

#: The I/O types each scheme can offer. Weight-only schemes keep float activations, so float I/O;
#: static schemes can expose their activation type at the model's edges.
IO_BY_SCHEME: dict[Scheme, tuple[IO, ...]] = {
    Scheme.FLOAT32: (IO.FLOAT,),
    Scheme.FLOAT16: (IO.FLOAT,),
    Scheme.DYNAMIC: (IO.FLOAT,),
    Scheme.INT8: (IO.FLOAT, IO.INT8, IO.UINT8),
    Scheme.INT16X8: (IO.FLOAT, IO.INT16),
    Scheme.INT4: (IO.FLOAT,),
}

#: Which delegate report decides whether a target runs a candidate (Edge TPU and MCU have none: they
#: are judged from scheme and I/O).
TARGET_DELEGATE: dict[Target, Delegate | None] = {
    Target.CPU: Delegate.XNNPACK,
    Target.GPU: Delegate.GPU,
    Target.NNAPI: Delegate.NNAPI,
    Target.HEXAGON: Delegate.HEXAGON,
    Target.COREML: Delegate.COREML,
    Target.EDGETPU: None,
    Target.MCU: None,
}

#: Which backend quantizes each scheme when nobody says (benchmarks/bench_backends.py): LiteRT Quantizer
#: matches the converter's fidelity on every scheme and is several times faster.
DEFAULT_BACKEND: dict[Scheme, Backend] = {s: Backend.LITERT for s in PTQ_SCHEMES}


def names(enum: type[StrEnum]) -> tuple[str, ...]:
    """The values of a vocabulary enum, in order: for messages and Typer choices."""
    return tuple(m.value for m in enum)


def io_allowed(scheme: str, io: str) -> str | None:
    """Why `io` does not go with `scheme`, or None when it does."""
    allowed = IO_BY_SCHEME[Scheme(scheme)]
    if io in allowed:
        return None
    return f"io={io!r} does not go with scheme={scheme!r}; allowed: {', '.join(allowed)}"

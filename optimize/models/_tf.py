"""The one place TensorFlow, tf_keras and tfmot are imported, lazily.

tfmot works only with Keras 2 (`tf_keras`) and sets TF_USE_LEGACY_KERAS=1 on import, which silently
changes what `tf.keras` means depending on import order. We set it here, before TensorFlow is first
imported, and always use `tf_keras` explicitly. `optimize --help` never pays for any of this.
"""

from __future__ import annotations

import logging
import os
import platform
import socket
import warnings


def _env() -> None:
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ.setdefault("ABSL_MIN_LOG_LEVEL", "3")
    # TensorFlow's oneDNN kernels crash fine-tuning some trained models (fer's mini-Xception, a Keras 2.0.5
    # .h5 of SeparableConv2D and BatchNormalization: SIGSEGV or "double free" in the first fit step, every
    # time); Eigen's kernels train it. TensorFlow here converts and fine-tunes, LiteRT measures: the speed
    # is the same on the models tried, and results no longer vary with oneDNN's reordering. A user's own
    # setting wins.
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")


def tf():
    """tensorflow, with the environment fixed first."""
    _env()
    import sys

    if "tensorflow" not in sys.modules:
        from optimize.models.runtime import captured_stderr

        with captured_stderr():  # absl/oneDNN/CUDA start-up chatter that TF_CPP_MIN_LOG_LEVEL does not silence
            import tensorflow

            tensorflow.config.list_physical_devices()  # device probing (cuInit) logs here, once
    import tensorflow

    tensorflow.get_logger().setLevel(logging.ERROR)
    return tensorflow


def keras():
    """Keras 2 (`tf_keras`): the Keras that tfmot understands."""
    tf()
    import tf_keras

    return tf_keras


def keras3():
    """Keras 3, for reading models saved with it (post-training conversion only)."""
    tf()
    import keras

    return keras


def tfmot():
    """tensorflow-model-optimization."""
    tf()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import tensorflow_model_optimization

    return tensorflow_model_optimization


def calibration_wrapper():
    """TensorFlow's TFLite calibrator (the one its converter uses). ai-edge-litert ships the same wrapper, but
    loading both in one process breaks the converter's, and every worker that quantizes has TensorFlow."""
    tf()
    from tensorflow.lite.python.optimize import _pywrap_tensorflow_lite_calibration_wrapper

    return _pywrap_tensorflow_lite_calibration_wrapper


def lite_convert():
    """TensorFlow's `tensorflow.lite.python.convert` (its MLIR quantizer, `mlir_quantize`, which the converter
    runs after calibration)."""
    tf()
    from tensorflow.lite.python import convert

    return convert


def versions() -> dict[str, str]:
    """Versions of the libraries that produce and run artifacts (importlib.metadata: no imports)."""
    from importlib import metadata

    out = {}
    for dist in (
        "optimize",
        "tensorflow",
        "tf-keras",
        "tensorflow-model-optimization",
        "ai-edge-litert",
        "litert-quantizer",
        "numpy",
    ):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return out


def serving_inputs(path) -> list[tuple[str, tuple[int, ...], str]] | None:
    """(name, shape with -1 for free, dtype) per input of a SavedModel's serving_default signature, loaded
    with TensorFlow; None when it has no such signature."""
    sig = tf().saved_model.load(os.fspath(path)).signatures.get("serving_default")
    if sig is None:
        return None
    return [
        (name, tuple(-1 if d is None else int(d) for d in spec.shape.as_list()), spec.dtype.name)
        for name, spec in sig.structured_input_signature[1].items()
    ]


def fingerprint_readable(data: bytes) -> bool:
    """Whether a SavedModel's fingerprint.pb parses (TensorFlow logs a traceback, then carries on, if not)."""
    tf()
    from google.protobuf.message import DecodeError
    from tensorflow.core.protobuf import fingerprint_pb2

    try:
        fingerprint_pb2.FingerprintDef().ParseFromString(data)
    except (DecodeError, ValueError):
        return False
    return True


def environment(threads: int):
    """What produced and ran the artifacts (study.json's `environment`): Python, platform, host, cores,
    library versions and the thread count the figures were measured with."""
    from optimize.core.results import Environment

    return Environment(
        python=platform.python_version(),
        platform=platform.platform(),
        host=socket.gethostname(),
        cpu_count=os.cpu_count() or 1,
        versions=versions(),
        threads=threads,
    )

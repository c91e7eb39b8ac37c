"""The only place that builds a LiteRT interpreter: load, feed (quantizing I/O), invoke, time, measure memory.

Uses `ai_edge_litert.interpreter` (no TensorFlow import, ~0.1 s). XNNPACK is applied by default, as in
the shipped runtime; every figure records the thread count and whether XNNPACK was on.
"""

from __future__ import annotations

import contextlib
import hashlib
import mmap
import os
import re
import sys
import tempfile
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import numpy as np

from optimize.core import crash
from optimize.core.errors import ModelError
from optimize.core.shown import named
from optimize.models import custom_ops, postprocess


def runtime_label() -> str:
    try:
        return f"ai-edge-litert {metadata.version('ai-edge-litert')} (host CPU)"
    except metadata.PackageNotFoundError:
        return "ai-edge-litert (host CPU)"


_OUTER_STDERR: list[int] = []  # the real fd 2 of each capture in progress, outermost first


def outer_stderr() -> int | None:
    """A descriptor of the terminal's stderr while `captured_stderr` holds fd 2 (None when it does not): where
    a progress line goes during a long captured step."""
    return _OUTER_STDERR[0] if _OUTER_STDERR else None


@contextlib.contextmanager
def captured_stderr():
    """Capture what the C++ runtime writes to fd 2 (delegate logs, errors) into a list of lines."""
    lines: list[str] = []
    sys.stderr.flush()
    with tempfile.TemporaryFile() as tmp:
        saved = os.dup(2)
        os.dup2(tmp.fileno(), 2)
        _OUTER_STDERR.append(saved)
        try:
            yield lines
        finally:
            _OUTER_STDERR.remove(saved)
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            lines.extend(tmp.read().decode(errors="replace").splitlines())


def _interpreter_class():
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    return Interpreter, OpResolverType


@dataclass
class Loaded:
    interpreter: object
    init_ms: float
    log: list[str]
    xnnpack: bool
    threads: int
    file: str = ""  # the model's path, when it was loaded from one (named if the runtime crashes on it)


class InvokeError(ModelError):
    """The runtime failed to run the model on one input (a kernel's check, a delegate's reshape)."""

    def __init__(
        self, failure: InvokeFailure, problem: str | None = None, fix: str | None = None, sample: int | None = None
    ):
        self.failure, self.sample = failure, sample
        super().__init__(problem or f"The model fails to invoke: {failure}.", fix)


class LoadError(ModelError):
    """The runtime refused to prepare the model (a kernel's Prepare check, a delegate's), naming the node
    when it did: `failure` holds what it said."""

    def __init__(self, failure: InvokeFailure, problem: str, fix: str | None = None):
        self.failure = failure
        super().__init__(problem, fix)


@dataclass(frozen=True)
class InvokeFailure:
    """What the runtime said when an invoke failed: the node and op it names, and the kernel's message."""

    node: int | None
    op: str | None
    message: str

    def __str__(self) -> str:
        where = f"{self.op} node {self.node}" if self.op is not None and self.node is not None else ""
        if where and self.message:
            return f"{where} ({self.message})"
        return where or self.message or "the runtime gave no reason"


_NODE = re.compile(r"Node number (\d+) \(([^)]+)\) failed to (?:invoke|prepare)\.?")


def invoke_failure(e: BaseException | str) -> InvokeFailure:
    """Read the runtime's error text: `div.cc:262 data[i] != zero_point was not true.Node number 6 (DIV)
    failed to invoke.` becomes node 6, op DIV and the kernel's own message."""
    text = str(e).strip()
    m = _NODE.search(text)
    node, op = (int(m.group(1)), m.group(2)) if m else (None, None)
    rest = _NODE.sub(" ", text) if m else text
    lines = [ln.strip(" .") for ln in rest.replace("\r", "\n").splitlines() if ln.strip(" .")]
    lines = [re.sub(r"^(?:\S*/)?(?=\w+\.cc:\d+)", "", ln) for ln in lines]  # tflite/kernels/div.cc -> div.cc
    return InvokeFailure(node, op, "; ".join(dict.fromkeys(lines))[:300])


def describe(model: bytes):
    """An interpreter that is built but not allocated: enough to read ops, tensors and signatures, even of a
    model whose custom ops this runtime lacks (allocation is where those fail)."""
    from optimize.models.tflite import checked

    checked(model)  # nothing unchecked reaches the interpreter's native code
    Interpreter, OpResolverType = _interpreter_class()
    with captured_stderr(), crash.doing("the LiteRT interpreter", None, "reading"):
        try:
            return Interpreter(
                model_content=model, experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES
            )
        except (ValueError, RuntimeError) as e:
            reason = str(e).strip().splitlines()[-1] if str(e).strip() else e.__class__.__name__
            raise ModelError(f"This is not a readable .tflite ({reason}).", "Pass a float32 .tflite model.") from None


def signature_key(it) -> str | None:
    """The signature optimize reads a model through: serving_default, else the first by name (None: none)."""
    sigs = it.get_signature_list()
    if not sigs:
        return None
    return "serving_default" if "serving_default" in sigs else sorted(sigs)[0]


def loads(model: str | Path | bytes, like=None) -> bool:
    """Whether this runtime can prepare the model (False for custom ops it lacks, for one)."""
    try:
        load(model, threads=1, xnnpack=False, like=like)
    except ModelError:
        return False
    return True


def io_details(it) -> tuple[str | None, list[str], list[dict], list[str], list[dict]]:
    """(signature key, input names, input details, output names, output details), through the signature
    when the model has one (inputs by key, outputs in signature order), else in the interpreter's order."""
    key = signature_key(it)
    if key is None:
        ins, outs = it.get_input_details(), it.get_output_details()
        return None, [d["name"] for d in ins], ins, [d["name"] for d in outs], outs
    names = it.get_signature_list()[key]
    sig = it.get_signature_runner(key)
    ins, outs = sig.get_input_details(), sig.get_output_details()
    return (
        key,
        list(names["inputs"]),
        [ins[n] for n in names["inputs"]],
        list(names["outputs"]),
        [outs[n] for n in names["outputs"]],
    )


def _ordered_samples(sample, names: list[str]) -> list:
    """A sample as a list in input order: an array (one input), a list, or a dict keyed by input name."""
    if isinstance(sample, dict):
        missing = [n for n in names if n not in sample]
        if missing:
            raise ModelError(
                f"No data for the model's input {named(missing[0])} (it takes {', '.join(map(named, names))})."
            )
        return [sample[n] for n in names]
    return list(sample) if isinstance(sample, (list, tuple)) else [sample]


def _fitted(x, d: dict) -> list[int] | None:
    """The shape to resize input `d` to for sample x (batch of 1), or None when it needs no resize."""
    sig = [int(v) for v in d.get("shape_signature", d["shape"])]
    shape = list(np.shape(x))
    if len(shape) == len(sig) - 1:
        shape = [1, *shape]
    fits = len(shape) == len(sig) and all(s in (-1, g) for s, g in zip(sig, shape))
    return shape if -1 in sig and fits and shape != [int(v) for v in d["shape"]] else None


def resize_to(it, sample) -> bool:
    """Resize the inputs with free dimensions (-1) to the sample's shapes; True if any changed. Allocation
    is the caller's: before the first one, delegates are built at the data's shape."""
    _, names, inputs, _, _ = io_details(it)
    return _resize_inputs(it, _ordered_samples(sample, names), inputs)


def _resize_inputs(it, samples: list, inputs: list[dict]) -> bool:
    changed = False
    for x, d in zip(samples, inputs):
        shape = _fitted(x, d)
        if shape is not None:
            it.resize_tensor_input(d["index"], shape, strict=True)
            changed = True
    return changed


def free_dims(it) -> str:
    """Which inputs have free dimensions, in words ('' when none): what a model without data runs at."""
    _, names, inputs, _, _ = io_details(it)
    free = [
        f"{n} {[int(v) for v in d['shape_signature']]}"
        for n, d in zip(names, inputs)
        if any(int(v) < 0 for v in d.get("shape_signature", ()))
    ]
    return f"input {', '.join(free)} has free dimensions (-1), allocated at 1" if free else ""


def _source(model: str | Path | bytes) -> dict:
    """How the interpreter gets the model: its bytes, or its path (mapped by the runtime). The runtime takes
    paths as UTF-8 text: a non-UTF-8 file name (a lone surrogate in Python) goes as bytes."""
    if isinstance(model, bytes):
        return {"model_content": model}
    return _path_source(Path(model))


def _path_source(path: Path) -> dict:
    text = str(path)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        from optimize.core.paths import read_bounded

        return {"model_content": read_bounded(path, "model", ModelError)}
    return {"model_path": text}


def _file_name(model: str | Path | bytes) -> str:
    """The model's path as a crash names it; "" for bytes (the command's file is named then)."""
    return "" if isinstance(model, bytes | bytearray | memoryview) else str(model)


def _builtin_only(source: dict) -> bytes | None:
    """Without XNNPACK, MediaPipe's custom transposed convolution has no kernel: the model's bytes with it as the
    builtin TRANSPOSE_CONV, for the interpreter (`custom_ops`; the file is not changed). None when not needed."""
    content = source.get("model_content")
    if content is None:
        with open(source["model_path"], "rb") as f:
            if os.fstat(f.fileno()).st_size == 0:
                return None
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
                if m.find(custom_ops.OP.encode()) < 0:
                    return None
                content = bytes(m)
    elif not custom_ops.has_transpose_bias(content):
        return None
    rewritten, n = custom_ops.builtin_transpose_conv(content)
    return rewritten if n else None


def load(
    model: str | Path | bytes, threads: int = 2, xnnpack: bool = True, keep_tensors: bool = False, like=None
) -> Loaded:
    """Build and allocate an interpreter. A model the runtime rejects is a ModelError with its reason.

    `keep_tensors` keeps every intermediate tensor readable after invoke (the runtime's
    preserve-all-tensors mode, for per-layer debugging; it costs memory, and XNNPACK is then off).
    `like`: a sample (batch of 1) whose shapes inputs with free dimensions take before the first
    allocation, so delegates are built for the data, not for the runtime's default of 1 per free dimension.
    """
    from optimize.models.tflite import checked

    checked(model)  # nothing unchecked reaches the interpreter's native code
    Interpreter, OpResolverType = _interpreter_class()
    kwargs: dict = {"num_threads": threads}
    if keep_tensors:
        kwargs["experimental_preserve_all_tensors"] = True
        xnnpack = False
    kwargs.update(_source(model))
    if not xnnpack:
        kwargs["experimental_op_resolver_type"] = OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES
        swapped = _builtin_only(kwargs)
        if swapped is not None:
            kwargs.pop("model_path", None)
            kwargs["model_content"] = swapped
    t0 = time.perf_counter()
    it = None
    file = _file_name(model)
    with captured_stderr() as log, crash.doing("the LiteRT interpreter", file, "loading"):
        try:
            it = Interpreter(**kwargs)
            if like is not None:
                resize_to(it, like)
            it.allocate_tensors()
        except (ValueError, RuntimeError) as e:
            errs = [ln for ln in log if "ERROR" in ln or "failed" in ln.lower()]
            failure = invoke_failure("\n".join(errs[-2:]) if errs else str(e).strip().splitlines()[-1])
            err = str(failure)
            free = free_dims(it) if it is not None and like is None else ""
            if free:
                raise LoadError(
                    failure,
                    f"The LiteRT runtime cannot load this model at its default shape ({free}): {err}",
                    "Pass data (--data) with samples of the size it takes.",
                ) from None
            raise LoadError(failure, f"The LiteRT runtime cannot load this model: {err}") from None
    init_ms = (time.perf_counter() - t0) * 1000
    used_xnn = xnnpack and any(name == "DELEGATE" for name, _ in nodes(it))
    return Loaded(it, init_ms, log, used_xnn, threads, file)


def nodes(it) -> list[tuple[str, list[int]]]:
    """(op name, output tensor indices) of every node of an allocated interpreter's primary subgraph: what
    `_get_ops_details` lists, without the types of every operand it reads for each node (a tenth of a
    MobileNetV2 interpreter's load, paid again by every runner timing builds)."""
    raw = getattr(it, "_interpreter", None)
    if raw is None or not hasattr(raw, "NodeName"):
        return [(d["op_name"], list(d["outputs"])) for d in it._get_ops_details()]
    return [(raw.NodeName(i), list(raw.NodeOutputs(i))) for i in range(raw.NumNodes())]


def _to_input(x: np.ndarray, detail: dict) -> np.ndarray:
    """Cast or quantize one float sample to what the input tensor wants (integer-only I/O models)."""
    dtype = detail["dtype"]
    x = np.asarray(x)
    if np.issubdtype(dtype, np.integer) and not np.issubdtype(x.dtype, np.integer):
        scale, zero = detail["quantization"]
        if scale:
            info = np.iinfo(dtype)
            x = np.clip(np.round(x / scale + zero), info.min, info.max)
    return x.astype(dtype).reshape(detail["shape"])


def _from_output(y: np.ndarray, detail: dict) -> np.ndarray:
    """Dequantize an integer output back to float, so accuracy and fidelity compare like with like."""
    scale, zero = detail["quantization"]
    if np.issubdtype(y.dtype, np.integer) and scale:
        return (y.astype(np.float32) - zero) * scale
    return y.astype(np.float32)


#: Outputs of models already run on samples in this process, by (model sha256, sample digest): a quantized
#: model that its quantizer's failure check ran on test samples is not run on them again when it is measured
#: (int16x8 on reference kernels: about 0.2 s an invoke on MobileNetV2). Bounded by SEEN_BYTES.
_SEEN: OrderedDict[tuple[str, str], list[np.ndarray]] = OrderedDict()
SEEN_BYTES = 64 * 2**20
_SEEN_LOCK = threading.Lock()  # two interpreters of one model may run at once (a slow variant's failure check)


def _sample_digest(sample) -> str:
    h = hashlib.sha256()
    for name, a in sorted(sample.items()) if isinstance(sample, dict) else [("", sample)]:
        a = np.ascontiguousarray(a)
        h.update(f"{name}|{a.dtype.str}|{a.shape}|".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def _seen(key: tuple[str, str], outputs: list[np.ndarray]) -> None:
    kept = [np.array(o, copy=True) for o in outputs]
    with _SEEN_LOCK:
        _SEEN[key] = kept
        while _SEEN and sum(o.nbytes for outs in _SEEN.values() for o in outs) > SEEN_BYTES:
            _SEEN.popitem(last=False)


def seen_share(digest: str | None, xs) -> float:
    """The share of the samples `xs` (first axis) whose outputs this process kept for the model `digest` (`_SEEN`).
    The samples are hashed only where enough are kept to reach half; below that, what is returned is the share the
    kept outputs could at most cover (under one half either way)."""
    from optimize.models.data import count, take

    n = count(xs)
    with _SEEN_LOCK:
        kept = {s for d, s in _SEEN if d == digest} if digest is not None else set()
    if not n or 2 * len(kept) < n:
        return len(kept) / n if n else 0.0
    return sum(_sample_digest(take(xs, slice(i, i + 1))) in kept for i in range(n)) / n


def _seen_before(key: tuple[str, str]) -> list[np.ndarray] | None:
    with _SEEN_LOCK:
        outs = _SEEN.get(key)
        return None if outs is None else [o.copy() for o in outs]


class Runner:
    """Feeds float samples one at a time and returns float outputs, whatever the model's I/O types.

    Inputs and outputs are addressed through the model's signature when it has one: inputs by their
    signature keys (a Keras model's input names), outputs in signature order (output_0, output_1, ...:
    the Keras model's output order). The interpreter's own tensor order is neither. An input with free
    dimensions (-1 in its shape signature: a variable length) is resized to each sample's shape before
    it is fed, as the runtime allocates it at 1 along every free dimension.
    """

    def __init__(self, loaded: Loaded, digest: str | None = None):
        self.loaded = loaded
        self.it = loaded.interpreter
        self.digest = digest  # the model's sha256: its outputs on a sample are kept for this process (`_SEEN`)
        file = loaded.file or crash.current()[2]
        self._running = crash.crumb("the LiteRT interpreter", file, "running")  # what a crash names
        crash.mark(self._running)  # from here on, until another step says otherwise: feeding it, running it
        self._read_details()

    def _read_details(self) -> None:
        """The input and output details (shapes change when an input is resized), and where a detector's
        post-processing op writes among the outputs."""
        self.key, self.input_names, self.inputs, self.keys, self.outputs = io_details(self.it)
        self._tails = postprocess.tails(nodes(self.it), self.outputs)

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(int(d) for d in self.inputs[0]["shape"])

    def output_names(self) -> list[str]:
        """The outputs' names, in signature order (the keys when the model has a signature)."""
        return list(self.keys)

    def zeros(self) -> list[np.ndarray]:
        """An all-zero sample for every input (for timing without data; free dimensions at 1)."""
        return [np.zeros(d["shape"], np.float32) for d in self.inputs]

    def _resize(self, samples: list) -> None:
        """Resize inputs with free dimensions to the samples' shapes (batch of 1), then reallocate."""
        if not _resize_inputs(self.it, samples, self.inputs):
            return
        with captured_stderr() as log:
            try:
                self.it.allocate_tensors()
            except (ValueError, RuntimeError) as e:
                errs = [ln for ln in log if "ERROR" in ln or "failed" in ln.lower()] or [str(e)]
                raise ModelError(f"The model cannot be resized to its data: {errs[-1].strip()}") from None
        self._read_details()

    def set_input(self, sample) -> None:
        """One sample (batch of 1): an array, a list in input order, or a dict keyed by input name."""
        samples = _ordered_samples(sample, self.input_names)
        if len(samples) != len(self.inputs):
            raise ModelError(f"The model has {len(self.inputs)} inputs; got {len(samples)}.")
        self._resize(samples)
        for x, d in zip(samples, self.inputs):
            expected = int(np.prod(d["shape"]))
            if np.asarray(x).size != expected:
                raise ModelError(
                    f"A sample of shape {np.asarray(x).shape} does not fit input {d['name']} {list(d['shape'])}."
                )
            try:
                self.it.set_tensor(d["index"], _to_input(x, d))
            except ValueError as e:  # the runtime's own check of the input tensor (its bytes, its type)
                why = (str(e).strip().splitlines() or ["no reason given"])[0][:200]
                raise ModelError(
                    f"The runtime refuses a sample for input {named(d['name'])}: {why}.",
                    "The model's input tensor is not one the runtime can fill: re-export the model.",
                ) from None

    def invoke(self) -> None:
        """Run the model once; a failure is an InvokeError naming the node, the op and the kernel's message."""
        crash.mark(self._running)  # left in place: the timing loops' bare invokes are this interpreter's too
        try:
            self.it.invoke()
        except (RuntimeError, ValueError) as e:
            raise InvokeError(invoke_failure(e)) from None

    def run(self, sample) -> list[np.ndarray]:
        """One sample's outputs (batch axis dropped), as floats; a post-processing op's rows past its count,
        which the kernel leaves unwritten, read 0 (`postprocess`)."""
        self.set_input(sample)
        self.invoke()
        outs = [_from_output(self.it.get_tensor(d["index"]), d)[0] for d in self.outputs]
        for tail in self._tails:
            postprocess.blank_past_count(outs, tail)
        return outs

    def run_fresh(self, sample) -> list[np.ndarray]:
        """`run` from a clean state: variable tensors (an RNN's state) reset first, so samples do not leak. With
        the model's `digest`, outputs this process already computed for these very bytes on this very sample
        are taken from `_SEEN` (the interpreter's tensors then hold nothing of the sample)."""
        key = (self.digest, _sample_digest(sample)) if self.digest else None
        if key is not None and (outs := _seen_before(key)) is not None:
            return outs
        self.it.reset_all_variables()
        out = self.run(sample)
        if key is not None:
            _seen(key, out)
        return out

    def predict(self, xs, limit: int | None = None) -> list[np.ndarray]:
        """Outputs for each sample of xs (an array, or a dict of arrays keyed by input name; first axis:
        samples), each from a clean state, stacked per output. A sample the model fails on is an
        InvokeError that says which sample."""
        from optimize.models.data import count, take

        n = count(xs) if limit is None else min(limit, count(xs))
        outs = []
        for i in range(n):
            try:
                outs.append(self.run_fresh(take(xs, slice(i, i + 1))))
            except InvokeError as e:
                raise InvokeError(
                    e.failure, f"The model fails to invoke on sample {i}: {e.failure}.", sample=i
                ) from None
        return [np.stack([o[j] for o in outs]) for j in range(len(self.outputs))]

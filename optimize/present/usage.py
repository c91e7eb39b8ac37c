"""How to run the chosen file on its target: interpreter set-up in Python, Kotlin and Swift with the target's
delegate, the integer I/O arithmetic when the file takes or gives integers, and the `benchmark_model` command that
measures it on a phone (issue 43). `optimize recommend` ends with it.

Everything is read from the candidate's I/O contract (`Candidate.contract`, read from the file itself): an int8
input's scale and zero point are the file's, never the recipe's. The delegate options are those each platform's
LiteRT (TensorFlow Lite) API takes; the benchmark flags are `benchmark_model`'s own (`--use_gpu`, `--use_nnapi`,
`--use_hexagon`, `--use_xnnpack`, `--num_threads`).
"""

from __future__ import annotations

from pathlib import Path

from optimize.core.results import Candidate, TensorContract
from optimize.core.vocab import Target

#: Per target: Python set-up, Kotlin (Android) set-up, Swift (iOS) set-up, benchmark_model flags (None: not a
#: phone's benchmark). `{file}` is the file's name, `{stem}` without `.tflite`; each line fits 80 columns
#: indented for a file name of up to 24 characters.
_PY_CPU = ("from ai_edge_litert.interpreter import Interpreter", 'it = Interpreter(model_path="{file}", num_threads=4)')
_PY_GPU = (
    "from ai_edge_litert.compiled_model import CompiledModel",
    "from ai_edge_litert.hardware_accelerator import HardwareAccelerator as A",
    "model = CompiledModel.from_file(",
    '    "{file}", hardware_accel=A.GPU | A.CPU)',
)
_KT_MODEL = 'val model = FileUtil.loadMappedFile(context, "{file}")'
_KT_CPU = (_KT_MODEL, "val it = Interpreter(model, Interpreter.Options().setNumThreads(4))")
_SW_PATH = 'let path = Bundle.main.path(forResource: "{stem}", ofType: "tflite")!'
_SW_CPU = (
    _SW_PATH,
    "var options = Interpreter.Options(); options.threadCount = 4",
    "let it = try Interpreter(modelPath: path, options: options)",
)


def _kotlin(delegate: str) -> tuple[str, ...]:
    return (
        _KT_MODEL,
        f"val options = Interpreter.Options().addDelegate({delegate})",
        "val it = Interpreter(model, options)",
    )


SETUP = {
    Target.CPU: (_PY_CPU, _KT_CPU, _SW_CPU, "--num_threads=4 --use_xnnpack=true"),
    Target.GPU: (
        _PY_GPU,
        _kotlin("GpuDelegate()"),
        (_SW_PATH, "let it = try Interpreter(modelPath: path, delegates: [MetalDelegate()!])"),
        "--use_gpu=true",
    ),
    Target.NNAPI: (_PY_CPU, _kotlin("NnApiDelegate()"), _SW_CPU, "--use_nnapi=true"),
    Target.HEXAGON: (_PY_CPU, _kotlin("HexagonDelegate(context)"), _SW_CPU, "--use_hexagon=true"),
    Target.COREML: (
        _PY_CPU,
        _KT_CPU,
        (
            _SW_PATH,
            "var o = CoreMLDelegate.Options(); o.enabledDevices = .all",
            "let coreml = CoreMLDelegate(options: o)!",
            "let it = try Interpreter(modelPath: path, delegates: [coreml])",
        ),
        None,
    ),
    Target.MCU: (_PY_CPU, (), (), None),
}
#: An output folder longer than this is said once above the commands, which then name the file alone.
SHORT_FOLDER = 24
_WHERE = {
    Target.COREML: "On an iPhone: LiteRT's iOS benchmark app, benchmark_params.json with use_coreml true.",
    Target.MCU: "On a microcontroller: TFLite Micro's MicroInterpreter, the file as a C array (xxd -i {file}).",
}


def _code(title: str, lines: tuple[str, ...], file: str) -> list[str]:
    stem = file.removesuffix(".tflite")
    return [f"  {title}:", *(f"    {line.format(file=file, stem=stem)}" for line in lines)] if lines else []


def _quantized(c: Candidate) -> tuple[list[TensorContract], list[TensorContract]]:
    k = c.contract
    return [t for t in k.inputs if t.scale is not None], [t for t in k.outputs if t.scale is not None]


def integer_io(c: Candidate) -> list[str]:
    """The arithmetic that feeds and reads an integer-I/O file, with the file's own scales and zero points."""
    ins, outs = _quantized(c)
    if not ins and not outs:
        return []
    lines = ["  Integer I/O (the file's own scale and zero point; np = numpy):"]
    for t in ins:
        lo, hi = _limits(t.dtype)
        lines += [
            f"    # input {t.name}: {t.dtype}, scale {t.scale:.8g}, zero point {t.zero_point}",
            f"    q = np.round(x / {t.scale:.8g}) + ({t.zero_point})",
            f"    q = np.clip(q, {lo}, {hi}).astype(np.{t.dtype})",
        ]
    for t in outs:
        lines += [
            f"    # output {t.name} as qy: {t.dtype}, scale {t.scale:.8g}, zero point {t.zero_point}",
            f"    y = (qy.astype(np.float32) - ({t.zero_point})) * {t.scale:.8g}",
        ]
    return lines


def _limits(dtype: str) -> tuple[int, int]:
    from optimize.models.contract import INTEGER_RANGES

    return INTEGER_RANGES.get(dtype, (-128, 127))


def benchmark(c: Candidate, target: Target, folder: Path | None) -> list[str]:
    """The command that measures the file on a phone, or where that is done for targets without one."""
    file = Path(c.artifact or f"{c.name}.tflite").name
    flags = SETUP[target][3]
    if flags is None:
        return [f"  {_WHERE[target].format(file=file)}"]
    # the file by its path while that is short enough to copy from the line, else by name, the folder said once
    near = folder is None or len(str(folder)) <= SHORT_FOLDER
    local = str(Path(folder) / file) if folder and near else file
    return [
        "Measure it on an Android phone (LiteRT's benchmark_model, adb)" + ("" if near else f", in {folder}") + ":",
        f"  adb push {local} /data/local/tmp/",
        "  adb shell /data/local/tmp/benchmark_model \\",
        f"    --graph=/data/local/tmp/{file} \\",
        f"    {flags}",
    ]


def usage_lines(c: Candidate, target: Target, folder: Path | None = None) -> list[str]:
    """How to run `c` on `target`, as terminal lines (each code line fits 80 columns for a short file name)."""
    if c.contract is None:
        return []
    file = Path(c.artifact or f"{c.name}.tflite").name
    py, kt, sw, _ = SETUP[target]
    lines = [f"How to run {file} on {target}:"]
    lines += _code("Python", py, file) + _code("Kotlin (Android)", kt, file) + _code("Swift (iOS)", sw, file)
    lines += integer_io(c)
    return lines + benchmark(c, target, folder)


def contract_lines(contract, indent: str = "  ") -> list[str]:
    """The I/O contract as plain lines: each input and output, then the TFLite metadata the file carries."""
    from optimize.models.contract import feed_line

    if contract is None:
        return []
    lines = [f"{indent}input   {feed_line(t)}" for t in contract.inputs]
    lines += [f"{indent}output  {feed_line(t)}" for t in contract.outputs]
    lines.append(f"{indent}metadata {contract.metadata or 'none (no TFLITE_METADATA in the file)'}")
    return lines


def integer_edges(c: Candidate) -> str:
    """A pick's integer inputs in a few words: what the caller must quantize with ('' when it takes floats)."""
    if c.contract is None:
        return ""
    said = [f"{t.dtype} in, scale {t.scale:.6g}, zero point {t.zero_point}" for t in c.contract.inputs if t.scale]
    return "; ".join(said)

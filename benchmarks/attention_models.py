"""Small attention encoders built the ways users build them, trained briefly on a synthetic text task, for
benchmarks/bench_torch.py's transformer rows (issue 34). Nothing is downloaded: Hugging Face's BertModel is
built from a config (random init, then trained here).

The task: token ids 1..999 (0 pads) in sequences of 4..16 tokens with a padding mask; the label says whether
most of a sequence's tokens are below 500. Each model sees 2,400 sequences and is tested on 600.

    encoder   nn.TransformerEncoder (2 layers, d=128, 4 heads, PyTorch's masked_fill(-inf) padding mask)
    bert      transformers.BertModel from a BertConfig (2 layers, d=128, 4 heads), a classifier on its pooler
    keras     Keras 3: Embedding + 2 MultiHeadAttention blocks, int32 ids and padding mask

`build(name, folder)` writes <name>.pt2 and <name>.onnx (PyTorch models) or text.keras, and data.npz (x:<input>
rows, y labels, x_train/x_test split), and returns the model paths.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

VOCAB, T, N, TRAIN = 1000, 16, 3000, 2400
D, HEADS, FF, LAYERS = 128, 4, 512, 2


def data(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(token ids, padding mask, labels), int64."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(4, T + 1, N)
    mask = (np.arange(T)[None] < lengths[:, None]).astype(np.int64)
    ids = rng.integers(1, VOCAB, (N, T)) * mask
    small = ((ids > 0) & (ids < VOCAB // 2)).sum(1)
    return ids, mask, (small * 2 > lengths).astype(np.int64)


def _save_data(folder: Path, ids, mask, y, dtype) -> Path:
    arrays = {}
    for split, rows in (("x_train", slice(0, TRAIN)), ("x_test", slice(TRAIN, N))):
        arrays[f"{split}:input_ids"] = ids[rows].astype(dtype)
        arrays[f"{split}:attention_mask"] = mask[rows].astype(dtype)
    arrays["y_train"], arrays["y_test"] = y[:TRAIN], y[TRAIN:]
    np.savez(folder / "data.npz", **arrays)
    return folder / "data.npz"


def _torch_encoder():
    """nn.TransformerEncoder at this module's sizes: the tests' encoder (tests/encoder_fixtures.py), one builder."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from encoder_fixtures import encoder

    return encoder(VOCAB, D, FF, T, heads=HEADS, layers=LAYERS, classes=2, pos_scale=0.02)


def import_transformers():
    """transformers, imported without torchvision where PyPI's CUDA build of it fails beside a CPU torch."""
    try:  # transformers imports torchvision when installed
        import torchvision  # noqa: F401
    except Exception:  # noqa: BLE001
        for name in [m for m in sys.modules if m.split(".")[0] == "torchvision"]:
            del sys.modules[name]
        sys.modules["torchvision"] = None
    import transformers

    return transformers


def _bert():
    import torch

    BertConfig, BertModel = import_transformers().BertConfig, import_transformers().BertModel

    cfg = BertConfig(
        vocab_size=VOCAB, hidden_size=D, num_hidden_layers=LAYERS, num_attention_heads=HEADS, intermediate_size=FF,
        max_position_embeddings=32, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )  # fmt: skip

    class Classifier(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bert = BertModel(cfg)
            self.head = torch.nn.Linear(D, 2)

        def forward(self, input_ids, attention_mask):
            return self.head(self.bert(input_ids=input_ids, attention_mask=attention_mask).pooler_output)

    return Classifier()


def _train_torch(net, ids, mask, y, steps: int = 1200) -> float:
    import torch

    torch.manual_seed(0)
    opt = torch.optim.Adam(net.parameters(), 1e-3)
    X, M, Y = (torch.from_numpy(a) for a in (ids, mask, y))
    net.train()
    for _ in range(steps):
        b = torch.randint(0, TRAIN, (64,))
        loss = torch.nn.functional.cross_entropy(net(X[b], M[b]), Y[b])
        opt.zero_grad()
        loss.backward()
        opt.step()
    net.eval()
    with torch.no_grad():
        return float((net(X[TRAIN:], M[TRAIN:]).argmax(1) == Y[TRAIN:]).float().mean())


def _keras(folder: Path, ids, mask, y) -> float:
    import keras

    keras.utils.set_random_seed(0)
    ids_in = keras.Input((T,), dtype="int32", name="input_ids")
    mask_in = keras.Input((T,), dtype="int32", name="attention_mask")
    h = keras.layers.Embedding(VOCAB, D)(ids_in) + keras.layers.Embedding(T, D)(keras.ops.arange(T)[None])
    allowed = keras.ops.cast(mask_in[:, None, :], "bool")
    for _ in range(LAYERS):
        h = keras.layers.LayerNormalization()(
            h + keras.layers.MultiHeadAttention(HEADS, D // HEADS)(h, h, attention_mask=allowed)
        )
        f = keras.layers.Dense(FF, activation="gelu")(h)
        h = keras.layers.LayerNormalization()(h + keras.layers.Dense(D)(f))
    m = keras.ops.cast(mask_in, "float32")[..., None]
    out = keras.layers.Dense(2, name="logits")(keras.ops.sum(h * m, 1) / keras.ops.maximum(keras.ops.sum(m, 1), 1.0))
    model = keras.Model([ids_in, mask_in], out)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=loss, metrics=["accuracy"])
    x = [ids.astype(np.int32), mask.astype(np.int32)]
    model.fit([a[:TRAIN] for a in x], y[:TRAIN], epochs=12, batch_size=64, verbose=0)
    model.save(folder / "text.keras")
    return float(model.evaluate([a[TRAIN:] for a in x], y[TRAIN:], verbose=0)[1])


def build(name: str, folder: Path) -> tuple[list[Path], Path, float]:
    """(model files, data, the trained model's test accuracy) for `name` (encoder, bert, keras); a model built
    before in `folder` is reused (`trained.json`)."""
    import json

    folder.mkdir(parents=True, exist_ok=True)
    done = folder / "trained.json"
    if done.is_file():
        made = json.loads(done.read_text())
        return [Path(p) for p in made["paths"]], Path(made["data"]), made["accuracy"]
    paths, data_file, accuracy = _build(name, folder)
    done.write_text(json.dumps({"paths": [str(p) for p in paths], "data": str(data_file), "accuracy": accuracy}))
    return paths, data_file, accuracy


def _build(name: str, folder: Path) -> tuple[list[Path], Path, float]:
    ids, mask, y = data()
    if name == "keras":
        accuracy = _keras(folder, ids, mask, y)
        return [folder / "text.keras"], _save_data(folder, ids, mask, y, np.int32), accuracy
    import torch

    torch.manual_seed(0)
    net = _torch_encoder() if name == "encoder" else _bert()
    accuracy = _train_torch(net, ids, mask, y)
    sample = (torch.from_numpy(ids[:1]), torch.from_numpy(mask[:1]))
    torch.export.save(torch.export.export(net, sample), str(folder / f"{name}.pt2"))
    torch.onnx.export(
        net, sample, str(folder / f"{name}.onnx"), input_names=["input_ids", "attention_mask"],
        output_names=["logits"], opset_version=17, dynamo=False,
    )  # fmt: skip
    return [folder / f"{name}.pt2", folder / f"{name}.onnx"], _save_data(folder, ids, mask, y, np.int64), accuracy

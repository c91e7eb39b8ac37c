"""A seeded PyTorch attention encoder over token ids with a padding mask, and its files (.pt2, ONNX, tokens.npz):
shared by the attention tests and the embedding-int8 tests, each at its own sizes, and by the benchmarks'
transformer rows (benchmarks/attention_models.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def encoder(vocab: int, width: int, ffn: int, seq: int, heads: int = 2, layers: int = 1, classes: int = 3,
            pos_scale: float = 0.1):  # fmt: skip
    """Token and position embeddings, `layers` encoder layers given a padding mask (PyTorch applies it with
    masked_fill(-inf)), masked mean pooling, a `classes`-way classifier. Seed torch before calling. (Also
    benchmarks/attention_models.py's `encoder`, at its own sizes.)"""
    import torch

    class Encoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(vocab, width)
            self.pos = torch.nn.Parameter(torch.randn(1, seq, width) * pos_scale)
            layer = torch.nn.TransformerEncoderLayer(width, heads, ffn, dropout=0.0, batch_first=True)
            self.enc = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
            self.head = torch.nn.Linear(width, classes)

        def forward(self, input_ids, attention_mask):
            h = self.enc(self.emb(input_ids) + self.pos, src_key_padding_mask=attention_mask == 0)
            m = attention_mask.unsqueeze(-1).to(h.dtype)
            return self.head((h * m).sum(1) / m.sum(1).clamp(min=1))

    return Encoder()


def tokens(n: int, vocab: int, seq: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Token ids (0 pads) and the padding mask, lengths 3..seq."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(3, seq + 1, n)
    mask = (np.arange(seq)[None] < lengths[:, None]).astype(np.int64)
    return rng.integers(1, vocab, (n, seq)) * mask, mask


def save(folder: Path, net, ids: np.ndarray, mask: np.ndarray) -> Path:
    """`net` as enc.pt2 and enc.onnx (exported on the first sample), and the tokens as tokens.npz, in `folder`."""
    import torch

    np.savez(folder / "tokens.npz", **{"x:input_ids": ids, "x:attention_mask": mask})
    sample = (torch.from_numpy(ids[:1]), torch.from_numpy(mask[:1]))
    torch.export.save(torch.export.export(net, sample), str(folder / "enc.pt2"))
    torch.onnx.export(
        net, sample, str(folder / "enc.onnx"), input_names=["input_ids", "attention_mask"], output_names=["logits"],
        opset_version=17, dynamo=False,
    )  # fmt: skip
    return folder

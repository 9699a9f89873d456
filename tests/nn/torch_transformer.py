"""PyTorch twins of minidist's transformer layers (oracles for the tests; import only after
pytest.importorskip("torch")). Attention uses torch's own scaled_dot_product_attention, so the oracle
shares no code with the layer it checks. Parameters are registered in minidist's parameters() order."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn as tnn
from torch.nn import functional as F


class Attention(tnn.Module):
    def __init__(self, d: int, h: int, causal: bool = True):
        super().__init__()
        self.h, self.causal = h, causal
        self.qkv, self.proj = tnn.Linear(d, 3 * d), tnn.Linear(d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = (a.view(b, t, self.h, d // self.h).transpose(1, 2) for a in self.qkv(x).split(d, dim=2))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return self.proj(out.transpose(1, 2).reshape(b, t, d))


class Block(tnn.Module):
    def __init__(self, d: int, h: int, d_ff: int | None = None):
        super().__init__()
        self.ln1, self.attn, self.ln2 = tnn.LayerNorm(d), Attention(d, h), tnn.LayerNorm(d)
        self.mlp = tnn.Sequential(tnn.Linear(d, d_ff or 4 * d), tnn.GELU(), tnn.Linear(d_ff or 4 * d, d))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(tnn.Module):
    def __init__(self, vocab: int, block_size: int, n_layers: int, d: int, h: int, tie: bool = False):
        super().__init__()
        self.tok_emb, self.pos_emb = tnn.Embedding(vocab, d), tnn.Embedding(block_size, d)
        self.blocks = tnn.ModuleList(Block(d, h) for _ in range(n_layers))
        self.ln_f, self.head = tnn.LayerNorm(d), tnn.Linear(d, vocab, bias=False)
        if tie:
            self.head.weight = self.tok_emb.weight

    def forward(self, tokens):
        x = self.tok_emb(tokens) + self.pos_emb(torch.arange(tokens.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def twin(layer, torch_layer) -> tnn.Module:
    """Copy layer's parameters into torch_layer (float64), matched by order and shape."""
    torch_layer = torch_layer.double()
    mine, theirs = layer.parameters(), list(torch_layer.parameters())
    assert [p.shape for p in mine] == [tuple(q.shape) for q in theirs]
    with torch.no_grad():
        for p, q in zip(mine, theirs, strict=True):
            q.copy_(torch.from_numpy(p.data))
    return torch_layer


def assert_close(a, b, what: str, rel: float = 1e-9) -> None:
    """max|a − b| / max|b| < rel (the issue's "relative error < 1e-9", on the scale of the whole array)."""
    a, b = np.asarray(a), np.asarray(b)
    err = np.abs(a - b).max(initial=0.0) / max(np.abs(b).max(initial=0.0), 1e-300)
    assert err < rel, f"{what}: relative error {err:.3g}"


def compare(layer, torch_layer, x, dy) -> None:
    """Forward, input gradient (None for tokens) and every parameter gradient, minidist vs torch."""
    torch_layer = twin(layer, torch_layer)
    layer.zero_grad()
    y = layer.forward(x)
    dx = layer.backward(dy)
    tx = torch.from_numpy(x)
    if x.dtype.kind == "f":
        tx.requires_grad_(True)
    ty = torch_layer(tx)
    ty.backward(torch.from_numpy(dy))
    assert_close(y, ty.detach().numpy(), "forward output")
    if dx is not None:
        assert_close(dx, tx.grad.numpy(), "input gradient")
    for (name, p), q in zip(layer.named_parameters(), torch_layer.parameters(), strict=True):
        assert_close(p.grad, q.grad.numpy(), f"gradient of {name}")

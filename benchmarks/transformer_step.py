"""Time one GPT training step (forward, loss, backward, AdamW update) of minidist against PyTorch, one thread.

    PYTHONPATH=. python benchmarks/transformer_step.py [--repeats 5] [--steps 3]

Model (float32, the issue's size): vocabulary 103 (the text corpus's characters), d = 128, 4 heads,
2 blocks, context T = 64, batch B = 16, untied head, no dropout; PyTorch's twin is written out in the
same arrangement (attention by q·kᵀ, mask, softmax, P·v — the same arithmetic, not a fused kernel;
``--sdpa`` uses torch's scaled_dot_product_attention instead). BLAS threads are set to 1 before NumPy
loads, torch.set_num_threads(1). Prints tokens/s and minidist's throughput as a fraction of PyTorch's,
the best of ``repeats`` timings of ``steps`` steps each, the two libraries taking turns.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS"):
    os.environ[_var] = "1"  # must happen before NumPy loads its BLAS

import argparse
import math
import time

import numpy as np

from minidist import nn
from minidist.optim import AdamW

VOCAB, D, HEADS, LAYERS, T, B = 103, 128, 4, 2, 64, 16


def torch_gpt(torch, sdpa: bool):
    tnn, F = torch.nn, torch.nn.functional

    class Attention(tnn.Module):
        def __init__(self):
            super().__init__()
            self.qkv, self.proj = tnn.Linear(D, 3 * D), tnn.Linear(D, D)
            self.register_buffer("mask", torch.triu(torch.ones(T, T, dtype=torch.bool), 1))

        def forward(self, x):
            b, t, d = x.shape
            q, k, v = (a.view(b, t, HEADS, d // HEADS).transpose(1, 2) for a in self.qkv(x).split(d, dim=2))
            if sdpa:
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                scores = (q @ k.transpose(-2, -1)) / math.sqrt(d // HEADS)
                out = torch.softmax(scores.masked_fill(self.mask[:t, :t], float("-inf")), dim=-1) @ v
            return self.proj(out.transpose(1, 2).reshape(b, t, d))

    class Block(tnn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.attn, self.ln2 = tnn.LayerNorm(D), Attention(), tnn.LayerNorm(D)
            self.mlp = tnn.Sequential(tnn.Linear(D, 4 * D), tnn.GELU(), tnn.Linear(4 * D, D))

        def forward(self, x):
            x = x + self.attn(self.ln1(x))
            return x + self.mlp(self.ln2(x))

    class GPT(tnn.Module):
        def __init__(self):
            super().__init__()
            self.tok_emb, self.pos_emb = tnn.Embedding(VOCAB, D), tnn.Embedding(T, D)
            self.blocks = tnn.ModuleList(Block() for _ in range(LAYERS))
            self.ln_f, self.head = tnn.LayerNorm(D), tnn.Linear(D, VOCAB, bias=False)

        def forward(self, tokens):
            x = self.tok_emb(tokens) + self.pos_emb(torch.arange(tokens.shape[1]))
            for block in self.blocks:
                x = block(x)
            return self.head(self.ln_f(x))

    return GPT()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--sdpa", action="store_true", help="torch uses its fused attention kernel")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, VOCAB, (B, T + 1))
    inputs, targets = tokens[:, :-1], tokens[:, 1:]

    model = nn.GPT(VOCAB, T, LAYERS, D, HEADS, rng=rng)
    opt, loss_fn = AdamW(model.parameters(), lr=1e-3), nn.CrossEntropyLoss()

    def minidist_step():
        opt.zero_grad()
        loss_fn(model.forward(inputs), targets)
        model.backward(loss_fn.backward())
        opt.step()

    steps = {"minidist": minidist_step}
    try:
        import torch
    except ImportError:
        torch = None
        print("torch not installed: minidist alone")
    if torch is not None:
        torch.set_num_threads(1)
        ref = torch_gpt(torch, args.sdpa)
        ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-3)
        tin, tout = torch.from_numpy(inputs), torch.from_numpy(targets).reshape(-1)

        def torch_step():
            ref_opt.zero_grad()
            torch.nn.functional.cross_entropy(ref(tin).reshape(-1, VOCAB), tout).backward()
            ref_opt.step()

        steps["torch"] = torch_step

    for step in steps.values():
        step()
        step()
    best = dict.fromkeys(steps, math.inf)
    for _ in range(args.repeats):
        for name, step in steps.items():
            start = time.perf_counter()
            for _ in range(args.steps):
                step()
            best[name] = min(best[name], (time.perf_counter() - start) / args.steps)
    print(f"GPT step: vocab {VOCAB}, d {D}, {HEADS} heads, {LAYERS} blocks, T {T}, B {B}, float32, "
          f"one thread; {model.num_parameters():,} parameters; load {os.getloadavg()[0]:.1f}")
    for name, seconds in best.items():
        print(f"  {name:9s} {seconds * 1e3:8.1f} ms/step  {B * T / seconds:9.0f} tokens/s")
    if torch is not None:
        print(f"  minidist / torch throughput: {best['torch'] / best['minidist']:.2f}x (target >= 0.85x)")


if __name__ == "__main__":
    main()

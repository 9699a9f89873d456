"""A whole GPT with its sequence split over the c ranks of ``comm`` (context parallelism).

Rank r holds every parameter and the tokens at ``layout.positions(T, c, r, layout)``. Embeddings, LayerNorms,
MLPs and the head work token by token on those positions (the position table is read at the global
positions); attention is ring attention (block.py). The loss of rank r is the mean over its B·T_r tokens;
scaled by T_r/T it is rank r's share of the mean over all B·T tokens, and the gradients of the parameters
outside the blocks are summed over the ranks in one all-reduce at the end of backward (the blocks add
theirs themselves): 2(c−1)/c·(V·d + T_max·d + 2d [+ V·d untied]) words per rank.
"""

from __future__ import annotations

import copy

import numpy as np

from minidist.checks import check_count
from minidist.nn import GPT, Module
from minidist.nn.runner import backward_through
from minidist.parallel.tensor.sequence import add_other_tokens

from .block import ContextParallelBlock
from .layout import positions


class ContextParallelGPT(Module):
    """``gpt`` (an nn.GPT, dropout 0, the same on every rank) on this rank's tokens of a T-token sequence.

    Sub-layers as nn.GPT's: ``tok_emb``, ``pos_emb``, ``blocks`` (ContextParallelBlock each), ``ln_f``,
    ``head``.
    """

    def __init__(self, comm, gpt: GPT, seq_len: int, *, layout: str = "zigzag"):
        if gpt.drop.p:
            raise ValueError(f"ContextParallelGPT supports dropout = 0 only, got {gpt.drop.p}")
        if not 1 <= check_count(seq_len, "ContextParallelGPT seq_len") <= gpt.block_size:
            raise ValueError(f"seq_len must lie in [1, block_size = {gpt.block_size}], got {seq_len}")
        self.comm, self.seq_len = comm, int(seq_len)
        self.positions = positions(seq_len, comm.world_size, comm.rank, layout)
        self.tok_emb, self.pos_emb = copy.deepcopy(gpt.tok_emb), copy.deepcopy(gpt.pos_emb)
        self.blocks = [ContextParallelBlock(comm, b, seq_len, layout=layout) for b in gpt.blocks]
        self.ln_f, self.head = copy.deepcopy(gpt.ln_f), copy.deepcopy(gpt.head)
        if gpt.tie_weights:
            self.head.weight = self.tok_emb.weight

    def shard(self, x: np.ndarray) -> np.ndarray:
        """This rank's tokens of x (B, T, ...) — e.g. of the tokens or of the targets."""
        if x.shape[1] != self.seq_len:
            raise ValueError(f"ContextParallelGPT was built for T = {self.seq_len} tokens, got shape "
                             f"{x.shape}")
        return x[:, self.positions]

    def forward(self, tokens: np.ndarray) -> np.ndarray:
        """tokens: (B, T) int, the whole sequence. Returns the logits of this rank's tokens (B, T_r, V)."""
        x = self.tok_emb.forward(self.shard(tokens)) + self.pos_emb.forward(self.positions)
        for block in self.blocks:
            x = block.forward(x)
        return self.head.forward(self.ln_f.forward(x))

    def backward(self, dlogits: np.ndarray) -> None:
        """dlogits: gradient of this rank's logits (B, T_r, V) of the loss over ALL tokens (scale a local
        mean by T_r/T). Adds every parameter's gradient, summed over the ranks."""
        outside = [p for name, p in self.named_parameters() if not name.startswith("blocks.")]
        before = [p.grad.copy() for p in outside]
        dx = backward_through([*self.blocks, self.ln_f, self.head], dlogits)
        self.tok_emb.backward(dx)
        self.pos_emb.backward(dx.sum(axis=0))
        add_other_tokens(self.comm, outside, before)

"""A whole GPT split over the t ranks of ``comm``: Megatron's layout, optionally with sequence parallelism.

    tokens → tok_emb (vocabulary-parallel) + pos_emb → blocks (TensorParallelBlock) → ln_f
           → head (vocabulary-parallel: rank p computes the logits of its ids V_p) → logits_p (B, T, |V_p|)

The logits stay split: VocabParallelCrossEntropy takes them as they are (vocab_parallel.py). The head
has the column-parallel input operator in front: f (identity forward, all-reduce of dx backward), or
with sequence parallelism ḡ (all-gather along T forward, reduce-scatter backward). With
``tie_weights`` the head's rows are the embedding's rows on the same rank: one Parameter, listed once.

Sequence parallelism: the embedding's all-reduce becomes a reduce-scatter, so every rank carries its
T/t tokens into the first block; pos_emb and ln_f work on those tokens and their gradients are all-reduced
at the end of backward (T_max·d + 2d words) — as the blocks do for theirs.
"""

from __future__ import annotations

import copy

import numpy as np

from minidist.nn import GPT, Module
from minidist.nn.runner import backward_through

from .attention import local_linear
from .block import TensorParallelBlock
from .comm import feature_slice
from .sequence import add_other_tokens, check_sequence_split, region_operators
from .vocab_parallel import VocabParallelEmbedding


class TensorParallelGPT(Module):
    """``gpt`` (an nn.GPT, dropout 0, the same on every rank) split over ``comm``.

    Sub-layers, in parameters() order: ``tok_emb`` (VocabParallelEmbedding), ``pos_emb`` (whole),
    ``blocks`` (TensorParallelBlock each), ``ln_f`` (whole), ``head`` (Linear(d, |V_p|), no bias).
    """

    def __init__(self, comm, gpt: GPT, *, sequence_parallel: bool = False):
        if gpt.drop.p:
            raise ValueError(f"TensorParallelGPT supports dropout = 0 only, got {gpt.drop.p}")
        self.comm, self.sequence_parallel, self.vocab_size = comm, bool(sequence_parallel), gpt.vocab_size
        self.tok_emb = VocabParallelEmbedding.from_embedding(comm, gpt.tok_emb,
                                                             sequence_parallel=sequence_parallel)
        self.pos_emb = copy.deepcopy(gpt.pos_emb)
        self.blocks = [TensorParallelBlock(comm, b, sequence_parallel=sequence_parallel) for b in gpt.blocks]
        self.ln_f = copy.deepcopy(gpt.ln_f)
        self.columns = feature_slice(gpt.vocab_size, comm.world_size, comm.rank)
        self.head = local_linear(gpt.head.weight.data[self.columns], None)
        if gpt.tie_weights:
            self.head.weight = self.tok_emb.weight          # the same rows: one Parameter on this rank
        self.enter_head = region_operators(comm, sequence_parallel)[0]

    def forward(self, tokens: np.ndarray) -> np.ndarray:
        """tokens: (B, T) int ids, the whole batch on every rank. Returns this rank's logits (B, T, |V_p|)."""
        if tokens.ndim != 2:
            raise ValueError(f"TensorParallelGPT expects tokens (B, T), got shape {tokens.shape}")
        seq_len, t = tokens.shape[1], self.comm.world_size
        positions = np.arange(seq_len)
        if self.sequence_parallel:
            check_sequence_split(seq_len, t)
            positions = positions[self.comm.rank * seq_len // t:(self.comm.rank + 1) * seq_len // t]
        x = self.tok_emb.forward(tokens) + self.pos_emb.forward(positions)
        for block in self.blocks:
            x = block.forward(x)
        return self.head.forward(self.enter_head.forward(self.ln_f.forward(x)))

    def backward(self, dlogits: np.ndarray) -> None:
        """dlogits: gradient of this rank's logits (B, T, |V_p|). Adds every parameter's gradient."""
        token_params = ([self.pos_emb.weight, self.ln_f.weight, self.ln_f.bias]
                        if self.sequence_parallel else [])
        before = [p.grad.copy() for p in token_params]
        dx = backward_through([*self.blocks, self.ln_f, self.enter_head, self.head], dlogits)
        self.tok_emb.backward(dx)
        self.pos_emb.backward(dx.sum(axis=0))               # every sample used the same position rows
        add_other_tokens(self.comm, token_params, before)

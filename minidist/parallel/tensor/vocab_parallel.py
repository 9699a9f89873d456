"""Vocabulary parallelism: the embedding table and the softmax cross-entropy split by token id over t ranks.

Megatron-LM (Shoeybi et al. 2019), section 3: rank p holds rows V_p of the (V, d) table (collectives.pieces's
rule, so t need not divide V; every rank needs at least one row).

Embedding     y = Σ_p [t ∈ V_p]·W_p[t]             one all-reduce of N·d words (operator g); backward local
              (with sequence parallelism a reduce-scatter along T instead, and an all-gather backward)
Head          z_p = f(x)·W_pᵀ, the logits of ids V_p    column-parallel, never gathered (f: all-reduce of dx
              backward; with sequence parallelism an all-gather along T forward, a reduce-scatter backward)
Cross-entropy with rank p holding the logits z[:, V_p] (a column-parallel head, gather_output=False):

    m  = max_p max_{v∈V_p} z_v          all-reduce (max) of N words
    S  = Σ_p Σ_{v∈V_p} exp(z_v − m)     all-reduce (sum) of N words
    z_t = Σ_p [t ∈ V_p]·z_t             all-reduce (sum) of N words
    loss = mean_n (log S + m − z_t),    dz_p = (exp(z_p − m)/S − onehot_p(t)) / N     (no communication)

so the (N, V) logits are never gathered: 3 all-reduces of N words (comm.group_allreduce) instead of an
all-gather of N·V. The loss sends 6(t−1)/t·N·itemsize bytes per rank when t divides N (all ranks together
6(t−1)·N·itemsize for any N), 6(t−1) messages.
"""

from __future__ import annotations

import numpy as np

from minidist.nn import Embedding, Linear, Module, Parameter
from minidist.nn.embedding import check_tokens
from minidist.nn.module import check_float_array

from .comm import check_same_on_all_ranks, feature_slice, group_allreduce, shard_parameter
from .layers import product_flops
from .sequence import region_operators


class VocabParallelEmbedding(Module):
    """``full`` (an nn.Embedding(V, d), the same table on every rank) with its rows (token ids) split over
    the ranks of ``comm``: weight (|V_p|, d). sequence_parallel: forward returns this rank's T/t tokens
    (B, T/t, d) of the (B, T) tokens it is given."""

    def __init__(self, comm, full: Embedding, *, sequence_parallel: bool = False):
        self.comm = comm
        self.leave = region_operators(comm, sequence_parallel)[1]        # g, or r̄ (reduce-scatter along T)
        self.num_embeddings, self.embedding_dim = full.num_embeddings, full.embedding_dim
        check_same_on_all_ranks(comm, "VocabParallelEmbedding (num_embeddings, embedding_dim)",
                                (full.num_embeddings, full.embedding_dim))
        self.rows = feature_slice(full.num_embeddings, comm.world_size, comm.rank)
        self.weight = shard_parameter(full.weight, self.rows)
        self._local: np.ndarray | None = None

    def forward(self, tokens: np.ndarray) -> np.ndarray:
        """tokens: integer ids in [0, V), any shape S, the same on every rank. Returns y (*S, d), whole."""
        check_tokens(tokens, self.num_embeddings, "VocabParallelEmbedding input")
        local = tokens - self.rows.start
        mine = (local >= 0) & (local < self.weight.shape[0])
        y = np.zeros((*tokens.shape, self.embedding_dim), dtype=self.weight.data.dtype)
        y[mine] = self.weight.data[local[mine]]
        self._local, self._mine = local, mine
        return self.leave.forward(y)                    # every row comes from exactly one rank

    def backward(self, dy: np.ndarray) -> None:
        """dy (*S, d) (sequence parallel: this rank's tokens, gathered here); scatter-adds into its rows."""
        if self._local is None:
            raise RuntimeError("VocabParallelEmbedding.backward called before forward")
        dy = self.leave.backward(dy)
        if dy.shape != (*self._local.shape, self.embedding_dim):
            raise ValueError(f"VocabParallelEmbedding.backward expects dy of shape "
                             f"{(*self._local.shape, self.embedding_dim)}, got {dy.shape}")
        grad = self.weight.grad
        np.add.at(grad, self._local[self._mine], dy[self._mine])
        self.weight.grad = grad   # through the setter: a partial gradient is now pending (nn.Parameter)

    def flops(self, input_shape: tuple[int, ...]) -> int:
        """0: a lookup of this rank's rows, no products (nn.GPTInput counts the whole embedding so too)."""
        return 0

    def __repr__(self) -> str:
        return (f"VocabParallelEmbedding({self.num_embeddings}, {self.embedding_dim}, rows={self.rows.start}:"
                f"{self.rows.stop})")


class VocabParallelHead(Module):
    """A GPT's head (Linear(d, V), no bias) with its rows (token ids V_p) on this rank: the logits stay split.

    ``weight`` (|V_p|, d): this rank's rows of ``head``'s, or ``tied`` (the vocabulary-parallel embedding's
    Parameter, the same rows) when the GPT ties them. forward x (B, T, d) (sequence parallel: (B, T/t, d))
    -> z_p (B, T, |V_p|); backward -> dx of x's shape."""

    def __init__(self, comm, head: Linear, *, sequence_parallel: bool = False, tied: Parameter | None = None):
        if head.bias is not None:
            raise ValueError("VocabParallelHead splits a head without bias (a GPT's)")
        self.rows = feature_slice(head.out_features, comm.world_size, comm.rank)
        self.enter = region_operators(comm, sequence_parallel)[0]        # f, or ḡ (all-gather along T)
        self.comm, self.sequence_parallel = comm, bool(sequence_parallel)
        self.weight = tied if tied is not None else shard_parameter(head.weight, self.rows)
        self.in_features, self.out_features = head.in_features, head.out_features
        self._x: np.ndarray | None = None

    def forward(self, x: np.ndarray) -> np.ndarray:
        self._x = self.enter.forward(x)
        return self._x @ self.weight.data.T

    def backward(self, dz: np.ndarray) -> np.ndarray:
        """dz: gradient of this rank's logits (B, T, |V_p|); adds into weight.grad; returns dx."""
        if self._x is None:
            raise RuntimeError("VocabParallelHead.backward called before forward")
        self.weight.grad += dz.reshape(-1, dz.shape[-1]).T @ self._x.reshape(-1, self._x.shape[-1])
        return self.enter.backward(dz @ self.weight.data)

    def flops(self, input_shape: tuple[int, ...]) -> int:
        """This rank's forward FLOPs for x (B, T, d) (sequence parallel: (B, T/t, d), gathered to T·t tokens):
        2·N·d·|V_p|, N = B·T, its share of the whole head's 2·N·d·V (ColumnParallelLinear's count)."""
        gathered = self.comm.world_size if self.sequence_parallel else 1
        return gathered * product_flops(input_shape, self.in_features, self.in_features, self.weight.shape[0])

    def __repr__(self) -> str:
        return (f"VocabParallelHead({self.in_features}, {self.out_features}, "
                f"rows={self.rows.start}:{self.rows.stop})")


class VocabParallelCrossEntropy:
    """Softmax cross-entropy (mean over N tokens) from logits split by vocabulary over ``comm``'s ranks:
    num_classes is V (the whole vocabulary); rank p holds the logits of ids ``feature_slice(V, t, p)``."""

    def __init__(self, comm, num_classes: int):
        self.comm, self.num_classes = comm, int(num_classes)
        self.columns = feature_slice(self.num_classes, comm.world_size, comm.rank)
        self._saved: tuple | None = None

    def forward(self, logits_part: np.ndarray, target: np.ndarray) -> float:
        """logits_part: this rank's logits, (N, |V_p|) or (B, T, |V_p|); target: integer ids in [0, V),
        (N,) or (B, T), the same on every rank. Returns the mean loss (a float, the same on every rank)."""
        check_float_array(logits_part, "VocabParallelCrossEntropy logits", ndim=(2, 3))
        width = self.columns.stop - self.columns.start
        if logits_part.shape[-1] != width or np.shape(target) != logits_part.shape[:-1]:
            raise ValueError(f"VocabParallelCrossEntropy on rank {self.comm.rank} expects "
                             f"logits (..., {width}) and target of their leading shape; "
                             f"got {logits_part.shape} and {np.shape(target)}")
        check_tokens(np.asarray(target), self.num_classes, "VocabParallelCrossEntropy target")
        z = logits_part.reshape(-1, width)
        local_target = np.asarray(target).reshape(-1) - self.columns.start
        # BEGIN SOLUTION vocab_parallel_cross_entropy
        mine = (local_target >= 0) & (local_target < width)
        m = group_allreduce(self.comm, z.max(axis=1), "max")          # the global max of each row
        e = np.exp(z - m[:, None])
        total = group_allreduce(self.comm, e.sum(axis=1), "sum")      # Σ_v exp(z_v − m) over all ranks
        picked = np.where(mine, z[np.arange(len(z)), np.where(mine, local_target, 0)], 0.0)
        z_target = group_allreduce(self.comm, picked, "sum")          # exactly one rank holds the target
        losses = np.log(total) + m - z_target
        # END SOLUTION
        self._saved = (e, total, local_target, logits_part.shape)
        return float(losses.mean())

    def backward(self) -> np.ndarray:
        """Returns dL/d(logits_part) = (softmax_p − onehot_p(target)) / N, shaped like logits_part. Local."""
        if self._saved is None:
            raise RuntimeError("VocabParallelCrossEntropy.backward called before forward")
        e, total, local_target, shape = self._saved
        grad = e / total[:, None]
        rows = np.flatnonzero((local_target >= 0) & (local_target < e.shape[1]))
        grad[rows, local_target[rows]] -= 1.0
        return (grad / len(e)).reshape(shape)

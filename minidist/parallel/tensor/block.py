"""A whole transformer block split over the t ranks of ``comm``: Megatron's tensor parallelism, optionally
with sequence parallelism (Korthikanti et al.).

    h = x + attn(ln1(x)),  y = h + mlp(ln2(h))         (nn.TransformerBlock, pre-LayerNorm)

attn is TensorParallelAttention (heads split), mlp is Megatron's MLP (the hidden units split: the first
Linear's rows, the second's columns). LayerNorms and residual adds run outside the tensor-parallel regions:
on the whole (B, T, d) on every rank (tensor parallelism), or on this rank's T/t tokens (sequence
parallelism). Per block and step, n = B·T·d words, each rank sends

    forward 2 × 2(t−1)/t·n,  backward 2 × 2(t−1)/t·n              (either way: sequence.py)

plus, with sequence parallelism, one all-reduce of the 6d words whose gradients are partial sums over
the tokens (the LayerNorms' γ, β and the two biases added after the reduce-scatter): 2(t−1)/t·6d.

With ``context`` (t × c ranks; minidist.parallel.context) the sequence is also split over c ranks:
attention's core becomes ring attention over ``context``, everything else runs on this group's tokens,
and backward ends with one all-reduce over ``context`` of all Ψ_p parameters this rank holds.
"""

from __future__ import annotations

import copy

import numpy as np

from minidist.nn import Linear, Module, Parameter, TransformerBlock
from minidist.nn.module import check_float_array

from .attention import TensorParallelAttention, local_linear
from .comm import feature_slice
from .sequence import add_other_tokens, region_operators


class TensorParallelMLP(Module):
    """``mlp`` (Sequential Linear(d, f), activation, Linear(f, d)) with its f hidden units split over
    ``comm``.

    Sub-layers: ``up`` Linear(d, f_p), ``activation``, ``down`` Linear(f_p, d) without bias, ``bias`` (d,).
    """

    def __init__(self, comm, mlp, *, sequence_parallel: bool = False):
        first, activation, second = list(mlp)
        if not (isinstance(first, Linear) and isinstance(second, Linear)):
            raise TypeError("TensorParallelMLP expects Sequential(Linear, activation, Linear)")
        self.hidden = feature_slice(first.out_features, comm.world_size, comm.rank)
        self.up = local_linear(first.weight.data[self.hidden], first.bias.data[self.hidden])
        self.activation = copy.deepcopy(activation)
        self.down = local_linear(second.weight.data[:, self.hidden], None)
        self.bias = Parameter(second.bias.data.copy())
        self.enter, self.leave = region_operators(comm, sequence_parallel)

    def forward(self, x: np.ndarray) -> np.ndarray:
        """x: (B, T, d) whole, or (B, T/t, d) with sequence parallelism. Returns x's shape."""
        h = self.activation.forward(self.up.forward(self.enter.forward(x)))
        return self.leave.forward(self.down.forward(h)) + self.bias.data

    def backward(self, dy: np.ndarray) -> np.ndarray:
        """dy: gradient of the output (x's shape); adds the parameters' gradients; returns dx (x's shape)."""
        self.bias.grad += dy.sum(axis=(0, 1))
        dh = self.activation.backward(self.down.backward(self.leave.backward(dy)))
        return self.enter.backward(self.up.backward(dh))


class TensorParallelBlock(Module):
    """``block`` (an nn.TransformerBlock, the same on every rank, dropout 0) split over ``comm``.

    Sub-layers ``ln1``, ``attn``, ``ln2``, ``mlp`` as in the block. sequence_parallel: forward takes and
    returns this rank's tokens (B, T/t, d) (sequence.sequence_shard), t must divide T.
    """

    def __init__(self, comm, block: TransformerBlock, *, sequence_parallel: bool = False, context=None,
                 seq_len: int | None = None, layout: str = "zigzag"):
        if block.mlp_drop.p:
            raise ValueError(f"TensorParallelBlock supports dropout = 0 only, got {block.mlp_drop.p}")
        self.comm, self.sequence_parallel, self.context = comm, bool(sequence_parallel), context
        self.ln1 = copy.deepcopy(block.ln1)
        self.attn = TensorParallelAttention(comm, block.attn, sequence_parallel=self.sequence_parallel,
                                            context=context, seq_len=seq_len, layout=layout)
        self.ln2 = copy.deepcopy(block.ln2)
        self.mlp = TensorParallelMLP(comm, block.mlp, sequence_parallel=self.sequence_parallel)

    def forward(self, x: np.ndarray) -> np.ndarray:
        """x: (B, T, d) whole on every rank, or (B, T/t, d) this rank's tokens. Returns x's shape."""
        check_float_array(x, "TensorParallelBlock input", ndim=3)
        h = x + self.attn.forward(self.ln1.forward(x))
        return h + self.mlp.forward(self.ln2.forward(h))

    def backward(self, dy: np.ndarray) -> np.ndarray:
        """dy: gradient of the output (x's shape). Adds every parameter's gradient; returns dx."""
        token_params = self.token_parameters() if self.sequence_parallel else []
        params = self.parameters() if self.context is not None else token_params
        before = {id(p): p.grad.copy() for p in params}
        dh = dy + self.ln2.backward(self.mlp.backward(dy))
        dx = dh + self.ln1.backward(self.attn.backward(dh))
        # gradients summed over this rank's tokens only: add the other ranks' terms (one all-reduce each)
        if token_params:
            add_other_tokens(self.comm, token_params, [before[id(p)] for p in token_params])
        if self.context is not None:
            add_other_tokens(self.context, params, [before[id(p)] for p in params])
        return dx

    def token_parameters(self) -> list[Parameter]:
        """The parameters applied token by token outside the split regions: whole on every rank."""
        return [self.ln1.weight, self.ln1.bias, self.attn.bias, self.ln2.weight, self.ln2.bias, self.mlp.bias]

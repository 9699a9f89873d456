"""The Megatron MLP block and two ways to split a whole MLP over the ranks of a tensor-parallel group.

Megatron-LM (Shoeybi et al. 2019): a column-parallel Linear, an element-wise activation, then a
row-parallel Linear, ``MegatronMLP`` — for two Linears and an activation (``megatron_parallel_mlp`` cuts a
Sequential into such blocks) or for a transformer block's ``mlp`` (``MegatronMLP.from_mlp``: what
``tensor_parallel`` and the split experts use). The "Distributed Deep Learning (Part II)" slides' own
scheme instead all-gathers every layer's output forward and all-reduces every input gradient backward:
``column_parallel_mlp``. cost.py counts the words each pattern moves.
"""

from __future__ import annotations

import copy
import math

import numpy as np

from minidist.nn import Linear, Module, ReLU, Sequential
from minidist.nn.checkpoint import forward_flops
from minidist.nn.module import check_float_array

from .layers import ColumnParallelLinear, RowParallelLinear
from .sequence import region_operators


def _rows(a: np.ndarray) -> np.ndarray:
    """a (..., n) as (N, n): one row per token (a view)."""
    return a.reshape(-1, a.shape[-1])


class MegatronMLP(Module):
    """The Megatron MLP block, Linear(d, h) → activation → Linear(h, d_out), split over ``comm``'s P ranks.

    Rank p holds the column slice of the first layer and the row slice of the second (n_p hidden units):
        up.weight w1 (n_p, d), up.bias b1 (n_p,), down.weight w2 (d_out, n_p), down.bias b2 (d_out,) whole.
    Forward:   x → f → a_p = act(x·w1ᵀ + b1) → z_p = a_p·w2ᵀ → g → z = Σ_p z_p + b2
    Backward:  db2 = Σ_n dz → dz → g' (identity) → dw2 = dzᵀ·a_p → da_p = dz·w2 → dh_p = act'(da_p)
               → dw1 = dh_pᵀ·x, db1 = Σ_n dh_p → dx = f'(dh_p·w1) = Σ_p dh_p·w1_p
    x is (..., d), whole on every rank. The hidden activations never leave their rank: one all-reduce of
    (N, d_out) forward, one of (N, d) backward (skipped with input_grad=False). The activation must be
    element-wise (ReLU, GELU, Tanh...).

    sequence_parallel: x and z are this rank's tokens (B, T/t, d); f becomes an all-gather along T and g a
    reduce-scatter (sequence.py: the same bytes), so b2 sees only this rank's tokens and its gradient is a
    partial sum over the group (``tensor_parallel`` marks it so).
    """

    def __init__(self, comm, first: Linear, second: Linear, activation: Module | None = None, *,
                 input_grad: bool = True, sequence_parallel: bool = False):
        if second.in_features != first.out_features:
            raise ValueError(f"MegatronMLP: the second layer's in_features ({second.in_features}) must equal "
                             f"the first's out_features ({first.out_features})")
        self.comm = comm
        self.up = ColumnParallelLinear(comm, first, gather_output=False, input_grad=input_grad)
        self.activation = copy.deepcopy(activation) if activation is not None else ReLU()
        self.down = RowParallelLinear(comm, second, input_is_parallel=True)
        self.sequence_parallel = bool(sequence_parallel)
        self.f, self.g = region_operators(comm, self.sequence_parallel)
        self.input_grad = input_grad
        self.prices_activation = True

    @classmethod
    def from_mlp(cls, comm, mlp, *, sequence_parallel: bool = False) -> MegatronMLP:
        """A block's ``mlp`` or an MoE's expert (Sequential Linear(d, f), activation, Linear(f, d)) split,
        priced as nn.TransformerBlock prices its mlp (the products only)."""
        layers = list(mlp) if isinstance(mlp, Sequential) else []
        if len(layers) != 3 or not (isinstance(layers[0], Linear) and isinstance(layers[2], Linear)):
            raise TypeError(f"MegatronMLP.from_mlp expects Sequential(Linear, activation, Linear), got "
                            f"{type(mlp).__name__}")
        split = cls(comm, layers[0], layers[2], layers[1], sequence_parallel=sequence_parallel)
        split.prices_activation = False
        return split

    def forward(self, x: np.ndarray) -> np.ndarray:
        """x: input (..., d) (sequence parallel: this rank's tokens (B, T/t, d)). Returns z (..., d_out)."""
        w1, b1 = self.up.weight.data, self.up.bias
        w2, b2 = self.down.weight.data, self.down.bias
        check_float_array(x, "MegatronMLP input", ndim=3 if self.sequence_parallel else None)
        if x.ndim < 1 or x.shape[-1] != w1.shape[1]:
            raise ValueError(f"MegatronMLP expects input (..., {w1.shape[1]}), got {x.shape}")
        # BEGIN SOLUTION megatron_mlp
        self._x = self.f.forward(x)  # identity: every rank holds the whole input
        h_part = self._x @ w1.T + (b1.data if b1 is not None else 0)
        self._a = self.activation.forward(h_part)  # element-wise: the slice stays on its rank
        z = self.g.forward(self._a @ w2.T)  # all-reduce of the P partial products
        if b2 is not None:
            z += b2.data  # the whole bias, added once after the sum
        # END SOLUTION
        return z

    def backward(self, dz: np.ndarray) -> np.ndarray | None:
        """dz: upstream gradient, x's shape with d_out features. Adds into w1, b1, w2, b2's gradients;
        returns dx, x's shape, the same on every rank (None with input_grad=False)."""
        w1, b1 = self.up.weight, self.up.bias
        w2, b2 = self.down.weight, self.down.bias
        # BEGIN SOLUTION megatron_mlp
        if b2 is not None:
            b2.grad += _rows(dz).sum(axis=0)  # before g': with sequence parallelism, this rank's tokens only
        dz = self.g.backward(dz)  # identity: dz is whole on every rank
        w2.grad += _rows(dz).T @ _rows(self._a)
        dh_part = self.activation.backward(dz @ w2.data)
        w1.grad += _rows(dh_part).T @ _rows(self._x)
        if b1 is not None:
            b1.grad += _rows(dh_part).sum(axis=0)
        dx = self.f.backward(dh_part @ w1.data) if self.input_grad else None  # all-reduce of Σ_p terms
        # END SOLUTION
        return dx

    def flops(self, input_shape: tuple[int, ...]) -> int:
        """This rank's forward FLOPs for x (..., d) (sequence parallel: (B, T/t, d), gathered to T·t tokens
        first): 2·N·d·n_p (up) + 2·N·n_p·d_out (down), plus its N·n_p activations as a Sequential counts
        them — unless built by ``from_mlp``: the products only, as nn.TransformerBlock counts its mlp."""
        *lead, d = input_shape
        if d != self.up.in_features:
            raise ValueError(f"MegatronMLP.flops expects (..., {self.up.in_features}), got {input_shape}")
        tokens = math.prod(lead) * (self.comm.world_size if self.sequence_parallel else 1)
        n_p = self.up.weight.shape[0]
        products = 2 * tokens * d * n_p + 2 * tokens * n_p * self.down.out_features
        return products + (forward_flops(self.activation, (tokens, n_p)) if self.prices_activation else 0)


def column_parallel_mlp(comm, model: Sequential, *, input_grad: bool = False) -> Sequential:
    """The slides' scheme: every Linear column-parallel with its output all-gathered, other layers copied.
    Backward: one all-reduce of the input gradient per Linear except a first layer's (unless input_grad)."""
    layers = []
    for layer in model:
        if isinstance(layer, Linear):  # the model's input needs no gradient; every later input does
            layers.append(ColumnParallelLinear(comm, layer, gather_output=True,
                                               input_grad=input_grad or bool(layers)))
        else:
            layers.append(copy.deepcopy(layer))
    return Sequential(*layers)


def megatron_parallel_mlp(comm, model: Sequential, *, input_grad: bool = False) -> Sequential:
    """Megatron's scheme: each (Linear, activation, Linear) of ``model`` becomes one MegatronMLP block; layers
    between blocks are copied and run whole on every rank. The first block skips the input-gradient
    all-reduce unless input_grad=True."""
    items, layers, i = list(model), [], 0
    while i < len(items):
        block = items[i:i + 3]
        if (len(block) == 3 and isinstance(block[0], Linear) and isinstance(block[2], Linear)
                and not isinstance(block[1], Linear)):
            layers.append(MegatronMLP(comm, block[0], block[2], block[1],
                                      input_grad=input_grad or bool(layers)))
            i += 3
        elif isinstance(items[i], Linear):
            raise ValueError(f"megatron_parallel_mlp: layer {i} ({items[i]!r}) is not the start of a "
                             f"(Linear, activation, Linear) block")
        else:
            layers.append(copy.deepcopy(items[i]))
            i += 1
    return Sequential(*layers)

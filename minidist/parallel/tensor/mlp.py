"""The Megatron MLP block and two ways to split a whole MLP over the ranks of a tensor-parallel group.

Megatron-LM (Shoeybi et al. 2019): a column-parallel Linear, an element-wise activation, then a
row-parallel Linear. The hidden activations never leave their rank, so the block needs one all-reduce
forward (g) and one backward (f):

    forward:   z = Σ_p act(x·W1_pᵀ + b1_p)·W2_pᵀ + b2          one all-reduce of (N, d_out)
    backward:  dx = Σ_p (act'(dz·W2_p))·W1_p                   one all-reduce of (N, d)

The "Distributed Deep Learning (Part II)" slides' own scheme instead all-gathers every
layer's output forward and all-reduces every input gradient backward: ``column_parallel_mlp``. cost.py
counts the words each pattern moves. ``TensorParallelMLP`` is the same split of a transformer block's
``mlp`` (its bias added after the sum, as a separate Parameter), with f and g or, with sequence
parallelism, their sequence-parallel forms (sequence.py).
"""

from __future__ import annotations

import copy
import math

import numpy as np

from minidist.nn import Linear, Module, ReLU, Sequential
from minidist.nn.checkpoint import forward_flops
from minidist.nn.module import check_float_array

from .attention import local_linear
from .comm import feature_slice, shard_parameter
from .layers import ColumnParallelLinear, RowParallelLinear
from .sequence import region_operators


class MegatronMLP(Module):
    """The Megatron MLP block, Linear(d, h) → activation → Linear(h, d_out), split over ``comm``'s P ranks.

    Rank p holds the column slice of the first layer and the row slice of the second (n_p hidden units):
        w1 (n_p, d), b1 (n_p,), w2 (d_out, n_p), b2 (d_out,) whole.
    Forward:   x → f → a_p = act(x·w1ᵀ + b1) → z_p = a_p·w2ᵀ → g → z = Σ_p z_p + b2
    Backward:  dz → g' (identity) → dw2 = dzᵀ·a_p, db2 = Σ_n dz → da_p = dz·w2 → dh_p = act'(da_p)
               → dw1 = dh_pᵀ·x, db1 = Σ_n dh_p → dx = f'(dh_p·w1) = Σ_p dh_p·w1_p
    The hidden activations never leave their rank: one all-reduce of (N, d_out) forward, one of (N, d)
    backward (skipped with input_grad=False). The activation must be element-wise (ReLU, GELU, Tanh...).
    """

    def __init__(self, comm, first: Linear, second: Linear, activation: Module | None = None, *,
                 input_grad: bool = True):
        if second.in_features != first.out_features:
            raise ValueError(f"MegatronMLP: the second layer's in_features ({second.in_features}) must equal "
                             f"the first's out_features ({first.out_features})")
        self.comm = comm
        self.up = ColumnParallelLinear.from_linear(comm, first, gather_output=False, input_grad=input_grad)
        self.activation = copy.deepcopy(activation) if activation is not None else ReLU()
        self.down = RowParallelLinear.from_linear(comm, second, input_is_parallel=True)
        self.f, self.g = self.up.f, self.down.g
        self.input_grad = input_grad

    def forward(self, x: np.ndarray) -> np.ndarray:
        """x: input, shape (N, d), whole on every rank.
        Returns z, shape (N, d_out), the same on every rank."""
        w1, b1 = self.up.weight.data, self.up.bias
        w2, b2 = self.down.weight.data, self.down.bias
        check_float_array(x, "MegatronMLP input", ndim=2)
        if x.shape[1] != w1.shape[1]:
            raise ValueError(f"MegatronMLP expects input (N, {w1.shape[1]}), got {x.shape}")
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
        """dz: upstream gradient, shape (N, d_out). Adds into w1, b1, w2, b2's gradients; returns dx,
        shape (N, d), the same on every rank (None with input_grad=False)."""
        w1, b1 = self.up.weight, self.up.bias
        w2, b2 = self.down.weight, self.down.bias
        # BEGIN SOLUTION megatron_mlp
        dz = self.g.backward(dz)  # identity: dz is whole on every rank
        w2.grad += dz.T @ self._a
        if b2 is not None:
            b2.grad += dz.sum(axis=0)
        dh_part = self.activation.backward(dz @ w2.data)
        w1.grad += dh_part.T @ self._x
        if b1 is not None:
            b1.grad += dh_part.sum(axis=0)
        dx = self.f.backward(dh_part @ w1.data) if self.input_grad else None  # all-reduce of Σ_p terms
        # END SOLUTION
        return dx

    def flops(self, input_shape: tuple[int, ...]) -> int:
        """This rank's forward FLOPs for x (N, d): its two Linear shares and its n_p activations."""
        hidden = (*tuple(input_shape)[:-1], self.up.weight.shape[0])
        return self.up.flops(input_shape) + forward_flops(self.activation, hidden) + self.down.flops(hidden)


class TensorParallelMLP(Module):
    """A transformer block's ``mlp`` (Sequential Linear(d, f), activation, Linear(f, d)) with its f hidden
    units split over ``comm``.

    Sub-layers: ``up`` Linear(d, f_p), ``activation``, ``down`` Linear(f_p, d) without bias, ``bias`` (d,).
    forward: x (B, T, d) whole, or (B, T/t, d) with sequence parallelism -> x's shape;
        y = g(act(f(x)·W1_pᵀ + b1_p)·W2_pᵀ) + b2.
    """

    def __init__(self, comm, mlp, *, sequence_parallel: bool = False):
        first, activation, second = list(mlp)
        if not (isinstance(first, Linear) and isinstance(second, Linear)):
            raise TypeError("TensorParallelMLP expects Sequential(Linear, activation, Linear)")
        self.hidden = feature_slice(first.out_features, comm.world_size, comm.rank)
        self.up = local_linear(shard_parameter(first.weight, self.hidden),
                               shard_parameter(first.bias, self.hidden))
        self.activation = copy.deepcopy(activation)
        self.down = local_linear(shard_parameter(second.weight, (slice(None), self.hidden)), None)
        self.bias = shard_parameter(second.bias)
        self.comm, self.sequence_parallel = comm, bool(sequence_parallel)
        self.enter, self.leave = region_operators(comm, sequence_parallel)

    def forward(self, x: np.ndarray) -> np.ndarray:
        h = self.activation.forward(self.up.forward(self.enter.forward(x)))
        return self.leave.forward(self.down.forward(h)) + self.bias.data

    def backward(self, dy: np.ndarray) -> np.ndarray:
        """dy: gradient of the output (x's shape); adds the parameters' gradients; returns dx (x's shape)."""
        self.bias.grad += dy.sum(axis=(0, 1))
        dh = self.activation.backward(self.down.backward(self.leave.backward(dy)))
        return self.enter.backward(self.up.backward(dh))

    def flops(self, input_shape: tuple[int, ...]) -> int:
        """This rank's forward matmul FLOPs for x (B, T, d) (sequence parallel: (B, T/t, d), gathered to T·t
        tokens first): 2·N·d·f_p (up) + 2·N·f_p·d (down) = 4·N·d·f_p, N = B·T — its share of the whole
        MLP's 4·N·d·f, which TransformerBlock counts (the products only, as it does: not the activation)."""
        *lead, d = input_shape
        tokens = math.prod(lead) * (self.comm.world_size if self.sequence_parallel else 1)
        return self.up.flops((tokens, d)) + self.down.flops((tokens, self.up.out_features))


def column_parallel_mlp(comm, model: Sequential, *, input_grad: bool = False) -> Sequential:
    """The slides' scheme: every Linear column-parallel with its output all-gathered, other layers copied.

    Forward: one all-gather per Linear; backward: one all-reduce of the input gradient per Linear except
    a first layer's (unless input_grad=True).
    """
    layers = []
    for layer in model:
        if isinstance(layer, Linear):  # the model's input needs no gradient; every later input does
            layers.append(ColumnParallelLinear.from_linear(comm, layer, gather_output=True,
                                                           input_grad=input_grad or bool(layers)))
        else:
            layers.append(copy.deepcopy(layer))
    return Sequential(*layers)


def megatron_parallel_mlp(comm, model: Sequential, *, input_grad: bool = False) -> Sequential:
    """Megatron's scheme: each (Linear, activation, Linear) of ``model`` becomes one MegatronMLP block.

    Layers between blocks (e.g. the ReLU after a block) are copied and run whole on every rank.
    The first block skips the input-gradient all-reduce unless input_grad=True.
    """
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

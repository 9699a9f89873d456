"""Tensor (intra-layer model) parallelism: one Linear layer's weight split across the P ranks of ``comm``.

A Linear layer y = x·Wᵀ + b has W of shape (out, in). It can be cut two ways (slides-ai-systems seed,
"Model Parallelism: partition weights across different processes"; Megatron-LM, Shoeybi et al. 2019):

* column-parallel — split by OUTPUT features: rank p holds W[rows_p, :] and b[rows_p] and computes
  y_p = x·W_pᵀ + b_p, its own slice of the output columns, from the whole input x.
  Forward: the slices are either all-gathered into y, or left sharded for a row-parallel layer.
  Backward: dx = Σ_p dy_p·W_p — every rank holds only one term, so the input gradient needs an all-reduce.
* row-parallel — split by INPUT features: rank p holds W[:, cols_p] and sees only x[:, cols_p];
  z_p = x_p·W_pᵀ is a partial product and z = Σ_p z_p + b needs an all-reduce.
  Backward: dx_p = dz·W_p is already the rank's own slice of dx — no communication.

Megatron's two conjugate operators make the communication explicit:
    f: forward identity,   backward all-reduce      (in front of a column-parallel layer)
    g: forward all-reduce, backward identity        (behind a row-parallel layer)
A column layer followed by a row layer (the Megatron MLP block) needs one all-reduce forward (g) and one
backward (f). The seed's own scheme instead all-gathers every layer's output forward and all-reduces every
input gradient backward: ``column_parallel_mlp``. ``tensor_cost`` has the bytes each pattern moves.

Every shard is cut from a full layer built with the same seed on every rank, so a test can compare each
shard with the single-process layer's slice.
"""

from __future__ import annotations

import copy

import numpy as np

from minidist.nn import Linear, Module, Parameter, ReLU, Sequential
from minidist.nn.module import check_float_array

from .tensor_comm import allgather_features, allreduce_sum, check_same_on_all_ranks, shard_slice


class CopyToTensorParallel(Module):
    """Megatron's f: forward is the identity (every rank already holds x); backward all-reduces dx."""

    def __init__(self, comm):
        self.comm = comm

    def forward(self, x: np.ndarray) -> np.ndarray:
        return x

    def backward(self, dx_partial: np.ndarray) -> np.ndarray:
        return allreduce_sum(self.comm, dx_partial)


class ReduceFromTensorParallel(Module):
    """Megatron's g: forward all-reduces the partial outputs; backward is the identity."""

    def __init__(self, comm):
        self.comm = comm

    def forward(self, z_partial: np.ndarray) -> np.ndarray:
        return allreduce_sum(self.comm, z_partial)

    def backward(self, dz: np.ndarray) -> np.ndarray:
        return dz


class GatherFromTensorParallel(Module):
    """Forward all-gathers the column slices into the full output; backward keeps this rank's slice."""

    def __init__(self, comm, columns: slice):
        self.comm, self.columns = comm, columns

    def forward(self, y_part: np.ndarray) -> np.ndarray:
        return allgather_features(self.comm, y_part)

    def backward(self, dy: np.ndarray) -> np.ndarray:
        return dy[..., self.columns]


def _full_layer(in_features, out_features, bias, rng, dtype) -> Linear:
    # Every rank draws the same full layer from the same seed, then keeps its slice.
    return Linear(in_features, out_features, bias, rng=rng, dtype=dtype)


class ColumnParallelLinear(Module):
    """Linear(in, out) with W's rows (output features) split over the ranks of ``comm``.

    Shapes on rank p of P (n_p = len(rows_p), np.array_split sizes): weight (n_p, in), bias (n_p,).
    x (N, in) whole on every rank → y_p = x·W_pᵀ + b_p (N, n_p) → gather_output: y (N, out).
    Backward: dW_p = dy_pᵀ·x, db_p = Σ_n dy_p, dx = allreduce_p(dy_p·W_p)  (the operator f).
    ``input_grad=False`` skips that all-reduce and returns None: the network's input needs no
    gradient (the seed's sums over layers start at i = 2 for this reason).
    """

    def __init__(self, comm, in_features: int, out_features: int, bias: bool = True, *,
                 gather_output: bool = True, input_grad: bool = True,
                 rng: np.random.Generator | None = None, dtype=np.float32):
        full = _full_layer(in_features, out_features, bias, rng, dtype)
        self._take_slice(comm, full, gather_output, input_grad)

    @classmethod
    def from_linear(cls, comm, full: Linear, *, gather_output: bool = True,
                    input_grad: bool = True) -> ColumnParallelLinear:
        layer = cls.__new__(cls)
        layer._take_slice(comm, full, gather_output, input_grad)
        return layer

    def _take_slice(self, comm, full: Linear, gather_output: bool, input_grad: bool) -> None:
        self.comm = comm
        self.in_features, self.out_features = full.in_features, full.out_features
        check_same_on_all_ranks(comm, "ColumnParallelLinear (in_features, out_features, bias)",
                                (full.in_features, full.out_features, full.bias is not None))
        self.rows = shard_slice(full.out_features, comm.world_size, comm.rank)
        self.weight = Parameter(full.weight.data[self.rows].copy())
        self.bias = Parameter(full.bias.data[self.rows].copy()) if full.bias is not None else None
        self.f = CopyToTensorParallel(comm)
        self.gather = GatherFromTensorParallel(comm, self.rows) if gather_output else None
        self.input_grad = input_grad
        self._x2d: np.ndarray | None = None

    def forward(self, x: np.ndarray) -> np.ndarray:
        check_float_array(x, "ColumnParallelLinear input")
        if x.ndim < 1 or x.shape[-1] != self.in_features:
            raise ValueError(f"ColumnParallelLinear expects input (..., {self.in_features}), got {x.shape}")
        self._x2d = self.f.forward(x).reshape(-1, self.in_features)
        y_part = self._x2d @ self.weight.data.T
        if self.bias is not None:
            y_part += self.bias.data
        y_part = y_part.reshape(*x.shape[:-1], -1)
        return self.gather.forward(y_part) if self.gather is not None else y_part

    def backward(self, dy: np.ndarray) -> np.ndarray | None:
        if self._x2d is None:
            raise RuntimeError("ColumnParallelLinear.backward called before forward")
        dy_part = self.gather.backward(dy) if self.gather is not None else dy
        dy2d = dy_part.reshape(-1, self.weight.shape[0])
        self.weight.grad += dy2d.T @ self._x2d
        if self.bias is not None:
            self.bias.grad += dy2d.sum(axis=0)
        if not self.input_grad:
            return None
        dx_partial = (dy2d @ self.weight.data).reshape(*dy.shape[:-1], self.in_features)
        return self.f.backward(dx_partial)

    def __repr__(self) -> str:
        return (f"ColumnParallelLinear({self.in_features}, {self.out_features}, rows={self.rows.start}:"
                f"{self.rows.stop}, gather_output={self.gather is not None})")


class RowParallelLinear(Module):
    """Linear(in, out) with W's columns (input features) split over the ranks of ``comm``.

    Shapes on rank p: weight (out, n_p); the bias (out,) is whole on every rank, added once after the sum.
    input_is_parallel: x_p (N, n_p) is this rank's slice already (from a column layer); otherwise x (N, in)
    is whole and each rank slices it (no communication).
    Forward:  z = allreduce_p(x_p·W_pᵀ) + b                     (the operator g)
    Backward: dW_p = dzᵀ·x_p, db = Σ_n dz, dx_p = dz·W_p        (local; gathered when x was whole)
    """

    def __init__(self, comm, in_features: int, out_features: int, bias: bool = True, *,
                 input_is_parallel: bool = True, rng: np.random.Generator | None = None, dtype=np.float32):
        full = _full_layer(in_features, out_features, bias, rng, dtype)
        self._take_slice(comm, full, input_is_parallel)

    @classmethod
    def from_linear(cls, comm, full: Linear, *, input_is_parallel: bool = True) -> RowParallelLinear:
        layer = cls.__new__(cls)
        layer._take_slice(comm, full, input_is_parallel)
        return layer

    def _take_slice(self, comm, full: Linear, input_is_parallel: bool) -> None:
        self.comm = comm
        self.in_features, self.out_features = full.in_features, full.out_features
        check_same_on_all_ranks(comm, "RowParallelLinear (in_features, out_features, bias)",
                                (full.in_features, full.out_features, full.bias is not None))
        self.cols = shard_slice(full.in_features, comm.world_size, comm.rank)
        self.weight = Parameter(full.weight.data[:, self.cols].copy())
        self.bias = Parameter(full.bias.data.copy()) if full.bias is not None else None
        self.g = ReduceFromTensorParallel(comm)
        self.input_is_parallel = input_is_parallel
        self._x2d: np.ndarray | None = None

    def forward(self, x: np.ndarray) -> np.ndarray:
        check_float_array(x, "RowParallelLinear input")
        n_local = self.weight.shape[1]
        expected = n_local if self.input_is_parallel else self.in_features
        if x.ndim < 1 or x.shape[-1] != expected:
            raise ValueError(f"RowParallelLinear (input_is_parallel={self.input_is_parallel}) on rank "
                             f"{self.comm.rank} expects input (..., {expected}), got {x.shape}")
        x_part = x if self.input_is_parallel else x[..., self.cols]
        self._x2d = x_part.reshape(-1, n_local)
        z = self.g.forward(self._x2d @ self.weight.data.T)
        if self.bias is not None:
            z += self.bias.data
        return z.reshape(*x.shape[:-1], self.out_features)

    def backward(self, dz: np.ndarray) -> np.ndarray:
        if self._x2d is None:
            raise RuntimeError("RowParallelLinear.backward called before forward")
        dz2d = self.g.backward(dz).reshape(-1, self.out_features)
        self.weight.grad += dz2d.T @ self._x2d
        if self.bias is not None:
            self.bias.grad += dz2d.sum(axis=0)
        dx_part = (dz2d @ self.weight.data).reshape(*dz.shape[:-1], -1)
        if self.input_is_parallel:
            return dx_part
        return allgather_features(self.comm, dx_part)

    def __repr__(self) -> str:
        return (f"RowParallelLinear({self.in_features}, {self.out_features}, cols={self.cols.start}:"
                f"{self.cols.stop}, input_is_parallel={self.input_is_parallel})")


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


def column_parallel_mlp(comm, model: Sequential, *, input_grad: bool = False) -> Sequential:
    """The seed's scheme: every Linear column-parallel with its output all-gathered, other layers copied.

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

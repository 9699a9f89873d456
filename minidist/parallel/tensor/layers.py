"""Tensor (intra-layer model) parallelism: one Linear layer's weight split across the P ranks of ``comm``.

A Linear layer y = x·Wᵀ + b has W of shape (out, in). It can be cut two ways ("Distributed Deep
Learning (Part II)" slides, "Model Parallelism: partition weights across different processes";
Megatron-LM, Shoeybi et al. 2019):

* column-parallel — split by OUTPUT features: y_p = x·W_pᵀ + b_p; backward dx = Σ_p dy_p·W_p (f).
* row-parallel — split by INPUT features: z = Σ_p x_p·W_pᵀ + b (g); backward dx_p = dz·W_p, local.

The operators f and g are in comm.py; the Megatron MLP block (column then row) is in mlp.py. Every shard
is cut from a full layer, the same on every rank, so a test can compare it with that layer's slice.
"""

from __future__ import annotations

import math

import numpy as np

from minidist.nn import Linear, Module
from minidist.nn.module import check_float_array

from .comm import (
    CopyToTensorParallel,
    ReduceFromTensorParallel,
    allgather_features,
    check_same_on_all_ranks,
    feature_slice,
    shard_parameter,
)


def product_flops(input_shape: tuple[int, ...], expected: int, inner: int, outer: int) -> int:
    """2·N·inner·outer for an input (..., expected), N the product of the leading dimensions."""
    input_shape = tuple(input_shape)
    if not input_shape or input_shape[-1] != expected:
        raise ValueError(f"flops expects an input shape (..., {expected}), got {input_shape}")
    return 2 * math.prod(input_shape[:-1]) * inner * outer


class ColumnParallelLinear(Module):
    """``full`` (an nn.Linear(in, out), the same on every rank) with W's rows (output features) split over
    the ranks of ``comm``.

    Shapes on rank p of P (n_p = len(rows_p), np.array_split sizes): weight (n_p, in), bias (n_p,).
    x (N, in) whole on every rank → y_p = x·W_pᵀ + b_p (N, n_p) → gather_output: y (N, out).
    Backward: dW_p = dy_pᵀ·x, db_p = Σ_n dy_p, dx = allreduce_p(dy_p·W_p)  (the operator f).
    ``input_grad=False`` skips that all-reduce and returns None: the network's input needs no
    gradient (the slides' sums over layers start at i = 2 for this reason).
    """

    def __init__(self, comm, full: Linear, *, gather_output: bool = True, input_grad: bool = True):
        self.comm = comm
        self.in_features, self.out_features = full.in_features, full.out_features
        check_same_on_all_ranks(comm, "ColumnParallelLinear (in_features, out_features, bias)",
                                (full.in_features, full.out_features, full.bias is not None))
        self.rows = feature_slice(full.out_features, comm.world_size, comm.rank)
        self.weight = shard_parameter(full.weight, self.rows)
        self.bias = shard_parameter(full.bias, self.rows) if full.bias is not None else None
        self.f = CopyToTensorParallel(comm)
        self.gather_output, self.input_grad = gather_output, input_grad
        self._x2d: np.ndarray | None = None

    def forward(self, x: np.ndarray) -> np.ndarray:
        """x (..., in), whole on every rank. Returns y (..., out) with gather_output, else y_p (..., n_p)."""
        check_float_array(x, "ColumnParallelLinear input")
        if x.ndim < 1 or x.shape[-1] != self.in_features:
            raise ValueError(f"ColumnParallelLinear expects input (..., {self.in_features}), got {x.shape}")
        self._x2d = self.f.forward(x).reshape(-1, self.in_features)
        y_part = self._x2d @ self.weight.data.T
        if self.bias is not None:
            y_part += self.bias.data
        y_part = y_part.reshape(*x.shape[:-1], -1)
        return allgather_features(self.comm, y_part) if self.gather_output else y_part

    def backward(self, dy: np.ndarray) -> np.ndarray | None:
        """dy (..., out) with gather_output, else (..., n_p). Returns dx (..., in), None if not input_grad."""
        if self._x2d is None:
            raise RuntimeError("ColumnParallelLinear.backward called before forward")
        dy_part = dy[..., self.rows] if self.gather_output else dy              # this rank's columns
        dy2d = dy_part.reshape(-1, self.weight.shape[0])
        self.weight.grad += dy2d.T @ self._x2d
        if self.bias is not None:
            self.bias.grad += dy2d.sum(axis=0)
        if not self.input_grad:
            return None
        dx_partial = (dy2d @ self.weight.data).reshape(*dy.shape[:-1], self.in_features)
        return self.f.backward(dx_partial)

    def flops(self, input_shape: tuple[int, ...]) -> int:
        """This rank's forward FLOPs for x (..., in): 2·N·in·n_p, its share of Linear's (as Linear counts)."""
        return product_flops(input_shape, self.in_features, self.in_features, self.weight.shape[0])

    def __repr__(self) -> str:
        return (f"ColumnParallelLinear({self.in_features}, {self.out_features}, rows={self.rows.start}:"
                f"{self.rows.stop}, gather_output={self.gather_output})")


class RowParallelLinear(Module):
    """``full`` (an nn.Linear(in, out), the same on every rank) with W's columns (input features) split over
    the ranks of ``comm``.

    Shapes on rank p: weight (out, n_p); the bias (out,) is whole on every rank, added once after the sum.
    input_is_parallel: x_p (N, n_p) is this rank's slice already (from a column layer); otherwise x (N, in)
    is whole and each rank slices it (no communication).
    Forward:  z = allreduce_p(x_p·W_pᵀ) + b                     (the operator g)
    Backward: dW_p = dzᵀ·x_p, db = Σ_n dz, dx_p = dz·W_p        (local; gathered when x was whole)
    """

    def __init__(self, comm, full: Linear, *, input_is_parallel: bool = True):
        self.comm = comm
        self.in_features, self.out_features = full.in_features, full.out_features
        check_same_on_all_ranks(comm, "RowParallelLinear (in_features, out_features, bias)",
                                (full.in_features, full.out_features, full.bias is not None))
        self.cols = feature_slice(full.in_features, comm.world_size, comm.rank)
        self.weight = shard_parameter(full.weight, (slice(None), self.cols))
        self.bias = shard_parameter(full.bias) if full.bias is not None else None
        self.g = ReduceFromTensorParallel(comm)
        self.input_is_parallel = input_is_parallel
        self._x2d: np.ndarray | None = None

    def forward(self, x: np.ndarray) -> np.ndarray:
        """x: x_p (..., n_p) if input_is_parallel, else the whole x (..., in). Returns z (..., out)."""
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
        """dz (..., out), whole on every rank. Returns dx_p (..., n_p), or the gathered dx (..., in)."""
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

    def flops(self, input_shape: tuple[int, ...]) -> int:
        """This rank's forward FLOPs for its input (..., n_p) or the whole x (..., in): 2·N·n_p·out."""
        expected = self.weight.shape[1] if self.input_is_parallel else self.in_features
        return product_flops(input_shape, expected, self.weight.shape[1], self.out_features)

    def __repr__(self) -> str:
        return (f"RowParallelLinear({self.in_features}, {self.out_features}, cols={self.cols.start}:"
                f"{self.cols.stop}, input_is_parallel={self.input_is_parallel})")


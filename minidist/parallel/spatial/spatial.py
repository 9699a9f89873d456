"""Spatial parallelism: convolutions, pools and batch norms whose images are split across ranks.

"Distributed Deep Learning (Part II)" slides, "Spatial Parallel Training" (Jin, Ginsburg &
Keutzer 2018; Gholami et al., SPAA 2018): "break the input into smaller pieces and distribute the work
among different processors; need to exchange boundary points for spatial convolutions".

Every rank of a Ph × Pw grid holds one block of every activation (N, C, h, w), the blocks being the even
split of H and of W (rank = i·Pw + j). One layer, on each rank:

    forward:   window = exchange_halo(x_local)            own block + halo rows/columns from neighbours
               y_local = layer(pad(window))               the ordinary single-process layer, padding 0
    backward:  d_window = layer.backward(dy_local)        includes the gradient of the halo part
               dx_local = return_halo_gradient(d_window)  halo gradients go home and are added
A conv's weight and bias gradients are then sums over this rank's block only: SpatialConv2d marks them
partial over the grid (``Parameter.partial_over``), and the gradient sync (GradientSync, or
minidist.collectives.sum_partial_gradients by hand) sums them over the ranks — the full gradient.

FLOPs are charged to the simulated clock (backward 2× forward, minidist.sim.compute) between the layer's
own messages.
"""

from __future__ import annotations

import numpy as np

from minidist.collectives import allgather, gather, scatter
from minidist.nn import (
    GELU,
    AvgPool2d,
    BatchNorm2d,
    Conv2d,
    Flatten,
    MaxPool2d,
    Module,
    ReLU,
    Sequential,
    Sigmoid,
    Tanh,
)
from minidist.parallel.sync_batchnorm import SyncBatchNorm, _adopt
from minidist.sim.compute import charge_flops

from .comm import exchange_halo, return_halo_gradient
from .partition import HaloPlan, split_bounds


class _SpatialLayer(Module):
    """Halo exchange + explicit padding + the local single-process layer (padding 0) + the reverse."""

    pad_value = 0.0

    def __init__(self, local: Module, comm, grid: tuple[int, int], input_hw: tuple[int, int],
                 kernel_size, stride, padding):
        self.comm = comm
        self.plan = HaloPlan.build(input_hw, kernel_size, stride, padding, grid)
        if self.plan.world_size != comm.world_size:
            raise ValueError(f"grid {self.plan.grid} has {self.plan.world_size} ranks but the communicator "
                             f"has world_size {comm.world_size}")
        self.local = local

    def forward(self, x_local: np.ndarray) -> np.ndarray:
        """x_local: this rank's block of the input, shape (N, C, h, w). Returns its block of the
        output, shape (N, C_out, h_out, w_out) (the plan's out_block for this rank)."""
        window = exchange_halo(self.comm, x_local, self.plan)
        (top, bottom), (left, right) = self.plan.padding_of(self.comm.rank)
        self._window_hw = window.shape[2:]
        padded = np.pad(window, ((0, 0), (0, 0), (top, bottom), (left, right)),
                        constant_values=self.pad_value)
        self._flops = self.local.flops(padded.shape)
        charge_flops(self.comm, self._flops, f"{type(self).__name__} forward")
        return self.local.forward(padded)

    def backward(self, dy_local: np.ndarray) -> np.ndarray:
        """dy_local: upstream gradient of this rank's output block, (N, C_out, h_out, w_out). Returns
        dx_local, the gradient of its input block, (N, C, h, w), halo contributions included."""
        d_padded = self.local.backward(dy_local)         # checks dy's shape before any message
        charge_flops(self.comm, 2 * self._flops, f"{type(self).__name__} backward")
        (top, _), (left, _) = self.plan.padding_of(self.comm.rank)
        height, width = self._window_hw
        return return_halo_gradient(self.comm, d_padded[:, :, top:top + height, left:left + width], self.plan)


class SpatialConv2d(_SpatialLayer):
    """A Conv2d over images split on a grid of ranks; shares ``conv``'s weight and bias Parameters.

    conv: the single-process layer (any kernel, stride, padding); input_hw: the GLOBAL (H, W) of the
    input; grid: (Ph, Pw) with Ph·Pw = world_size ((P, 1) splits H only). forward takes this rank's
    block (N, C, h, w) and returns its block of the output (N, O, ho, wo).
    """

    def __init__(self, conv: Conv2d, comm, grid: tuple[int, int], input_hw: tuple[int, int]):
        if not isinstance(conv, Conv2d):
            raise TypeError(f"SpatialConv2d wraps a Conv2d, got {type(conv).__name__}")
        local = Conv2d(conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride, padding=0,
                       bias=conv.bias is not None, rng=np.random.default_rng(0), dtype=conv.weight.data.dtype)
        # The same Parameter objects (the new layer's random initial values are dropped): one set of weights.
        local.weight, local.bias = conv.weight, conv.bias
        super().__init__(local, comm, grid, input_hw, conv.kernel_size, conv.stride, conv.padding)
        for p in local.parameters():
            p.partial_over.append(comm)                # this rank's block's terms only: summed over the grid


class _SpatialPool(_SpatialLayer):
    """A pool of class ``wraps`` over a grid-split image: the local pool has padding 0, the padding is made
    around the window (``pad_value``)."""

    wraps: type

    def __init__(self, pool, comm, grid: tuple[int, int], input_hw: tuple[int, int]):
        if not isinstance(pool, self.wraps):
            raise TypeError(f"{type(self).__name__} wraps {self.wraps.__name__} layers, got "
                            f"{type(pool).__name__}")
        super().__init__(self.wraps(pool.kernel_size, pool.stride, padding=0), comm, grid, input_hw,
                         pool.kernel_size, pool.stride, pool.padding)


class SpatialMaxPool2d(_SpatialPool):
    """MaxPool2d over a grid-split image; the padding it makes itself is −∞, as MaxPool2d's."""

    wraps, pad_value = MaxPool2d, -np.inf


class SpatialAvgPool2d(_SpatialPool):
    """AvgPool2d over a grid-split image; padding zeros count in the mean (count_include_pad=True)."""

    wraps = AvgPool2d


class SpatialBatchNorm2d(SyncBatchNorm):
    """BatchNorm2d on this rank's block (N, C, h, w) with statistics over the whole (N, C, H, W) image.

    SyncBatchNorm's sums, with the split across the image instead of the batch: rank r holds N·h_r·w_r of
    a channel's values. No halo is needed (the layer is element-wise once μ, σ² are known), and the
    backward's one allreduce serves dx and the parameters alike: dβ += D₁, dγ += D₂, the global sums (the
    spatial ranks share one set of parameters and allreduce no gradients afterwards).
    bn: the single-process BatchNorm2d (its weight, bias and running statistics are shared, not copied);
    comm: the grid's Communicator; algorithm: the allreduce algorithm.
    """

    expected_ndim = (4,)
    global_parameter_gradients = True

    def __init__(self, bn: BatchNorm2d, comm, algorithm: str = "ring"):
        if not isinstance(bn, BatchNorm2d):
            raise TypeError(f"SpatialBatchNorm2d wraps a BatchNorm2d, got {type(bn).__name__}")
        super().__init__(bn.num_features, bn.eps, bn.momentum, bn.weight is not None, comm=comm,
                         algorithm=algorithm, dtype=bn.running_mean.dtype)
        _adopt(self, bn)


# -- moving whole images to and from the grid ---------------------------------------------------------

def grid_blocks(image_hw: tuple[int, int], grid: tuple[int, int]) -> list[tuple[slice, slice]]:
    """(rows, cols) slices of every rank's block of an H × W image, in rank order."""
    rows, cols = split_bounds(image_hw[0], grid[0]), split_bounds(image_hw[1], grid[1])
    return [(slice(*r), slice(*c)) for r in rows for c in cols]


def _check_grid(comm, grid: tuple[int, int]) -> None:
    if len(grid) != 2 or grid[0] * grid[1] != comm.world_size:
        raise ValueError(f"grid {grid} must be (Ph, Pw) with Ph·Pw = world_size = {comm.world_size}")


def assemble(blocks: list[np.ndarray], grid: tuple[int, int]) -> np.ndarray:
    """Blocks in rank order -> the whole image (grid row i: blocks i·Pw … i·Pw + Pw − 1, side by side)."""
    return np.block([[blocks[i * grid[1] + j] for j in range(grid[1])] for i in range(grid[0])])


def scatter_to_grid(comm, image: np.ndarray | None, grid: tuple[int, int], root: int = 0) -> np.ndarray:
    """Root holds the global (N, C, H, W) image (others pass None); every rank gets its block."""
    _check_grid(comm, grid)
    chunks = None
    if comm.rank == root:
        if not isinstance(image, np.ndarray) or image.ndim != 4:
            raise ValueError(f"scatter_to_grid: root needs an (N, C, H, W) array, got "
                             f"{getattr(image, 'shape', type(image).__name__)}")
        chunks = [np.ascontiguousarray(image[:, :, rows, cols])
                  for rows, cols in grid_blocks(image.shape[2:], grid)]
    return scatter(comm, chunks, root=root)


def gather_from_grid(comm, block: np.ndarray, grid: tuple[int, int], root: int = 0) -> np.ndarray | None:
    """Reassemble the global image at root from every rank's block; None on the other ranks."""
    _check_grid(comm, grid)
    blocks = gather(comm, block, root=root)
    return None if blocks is None else assemble(blocks, grid)


class GridAllgather(Module):
    """forward: this rank's block -> the whole image on every rank (an allgather of the blocks).
    backward: the gradient of the whole image (the same on every rank) -> this rank's block of it.

    Used before the replicated head of a spatial CNN (Flatten, Linear): every rank then computes the
    same logits, loss and head gradients, so the head needs no allreduce.
    """

    def __init__(self, comm, grid: tuple[int, int], image_hw: tuple[int, int]):
        _check_grid(comm, grid)
        self.comm, self.grid, self.image_hw = comm, grid, image_hw
        self._rows, self._cols = grid_blocks(image_hw, grid)[comm.rank]

    def forward(self, block: np.ndarray) -> np.ndarray:
        """block: this rank's block, (N, C, h, w). Returns the whole image (N, C, H, W) on every rank."""
        return assemble(allgather(self.comm, block), self.grid)

    def backward(self, dy: np.ndarray) -> np.ndarray:
        """dy: upstream gradient of the whole image, (N, C, H, W). Returns this rank's block, (N, C, h, w)."""
        return np.ascontiguousarray(dy[:, :, self._rows, self._cols])


ELEMENTWISE = (ReLU, Tanh, Sigmoid, GELU)
SPATIAL = {Conv2d: SpatialConv2d, MaxPool2d: SpatialMaxPool2d, AvgPool2d: SpatialAvgPool2d}


def spatialize(model: Sequential, comm, grid: tuple[int, int], input_hw: tuple[int, int]) -> Sequential:
    """The spatially parallel twin of ``model``, sharing its Parameters (so one optimizer serves both).

    model: Sequential of Conv2d / MaxPool2d / AvgPool2d / BatchNorm2d / ELEMENTWISE layers, then Flatten and
    the head. Convs, pools and batch norms become their Spatial versions, element-wise layers work on the
    blocks as they are; a GridAllgather goes before the Flatten and the head runs replicated on every rank.
    forward takes this rank's block of the input, returns the full output.
    """
    model.label_parameters()              # names for the optimizers' refusal of a partial gradient
    layers, hw = [], tuple(input_hw)
    for index, layer in enumerate(model.layers):
        if type(layer) in SPATIAL:
            spatial = SPATIAL[type(layer)](layer, comm, grid, hw)
            layers.append(spatial)
            hw = spatial.plan.output_hw
        elif isinstance(layer, ELEMENTWISE):
            layers.append(layer)
        elif type(layer) is BatchNorm2d:       # statistics over all blocks: one allreduce each way
            layers.append(SpatialBatchNorm2d(layer, comm))
        elif isinstance(layer, Flatten):
            return Sequential(*layers, GridAllgather(comm, grid, hw), *model.layers[index:])
        else:
            raise TypeError(f"spatialize: layer {index} ({type(layer).__name__}) is neither a conv/pool, an "
                            f"element-wise activation nor Flatten; a spatial split cannot run it per block")
    return Sequential(*layers, GridAllgather(comm, grid, hw))

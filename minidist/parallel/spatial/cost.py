"""What a spatially parallel convolution costs on the simulated clock, at sizes too big to compute here.

The cluster's clock (minidist.cluster.ledger) charges a message of n bytes α + n·β to its sender and a
computation of F FLOPs F / R (R = the device's FLOP/s); it does not look at the numbers in the messages.
So one training step of a 3×3 conv on a 512² batch of 32 images with 64 channels can be *rehearsed*:
send zero-filled slabs of exactly the planned shapes along the real schedule (plan.steps), charge the
local convolution's FLOPs (minidist.sim.compute), and read the clock — without the 600 GFLOP of arithmetic.

    forward   = halo exchange + F_local / R
    backward  = 2·F_local / R + halo gradients sent back + allreduce of the weight gradient

For a 1-D split (P ranks, halo r rows each side, rows of W pixels, N·C planes of b bytes) every rank
passes one slab down, then one up, so the forward takes

    T_fwd(P) = 2·(α + r·W·N·C·b·β) + F(⌈H/P⌉ rows) / R            (P ≥ 2; T_fwd(1) = F / R)

which ``forward_time_1d`` evaluates; a lesson checks it against the rehearsed clock.
"""

from __future__ import annotations

import math

import numpy as np

from minidist.collectives import allreduce
from minidist.nn import Conv2d
from minidist.sim.compute import charge_flops

from .comm import _dst, _src, shift_step
from .partition import HaloPlan, length

REHEARSAL_TAG = 105


def _rehearse_exchange(comm, plan: HaloPlan, planes: int, dtype, backward: bool) -> None:
    """Walk the halo schedule with zero slabs of the planned shapes (backward: reversed, roles swapped)."""
    for phase in ((1, 0) if backward else (0, 1)):
        steps = plan.steps(comm.rank, phase)
        for send, recv in (reversed(steps) if backward else steps):
            if backward:  # the gradient of what was received goes back to its sender
                outgoing, dst, src = recv, _src(recv), _dst(send)
            else:
                outgoing, dst, src = send, _dst(send), _src(recv)
            slab = None if outgoing is None else np.zeros((planes, length(outgoing.rows),
                                                           length(outgoing.cols)), dtype)
            shift_step(comm, slab, dst, src, REHEARSAL_TAG)


def rehearse_conv_step(comm, plan: HaloPlan, batch: int, in_channels: int, out_channels: int,
                       dtype=np.float32) -> tuple[float, float]:
    """One forward + backward of a spatial conv on the simulated clock only; returns this rank's
    (forward seconds, backward seconds). Run it inside cluster.run on plan.world_size ranks."""
    if plan.world_size != comm.world_size:
        raise ValueError(f"plan is for {plan.world_size} ranks, the communicator has {comm.world_size}")
    rows, cols = plan.out_block(comm.rank)
    kernel = plan.rows.kernel * plan.cols.kernel      # the local conv's 2·N·O·ho·wo·C·kh·kw, as Conv2d.flops
    flops = 2 * batch * out_channels * length(rows) * length(cols) * in_channels * kernel
    start = comm.clock
    _rehearse_exchange(comm, plan, batch * in_channels, dtype, backward=False)
    charge_flops(comm, flops, "conv forward")
    middle = comm.clock
    charge_flops(comm, 2 * flops, "conv backward")
    _rehearse_exchange(comm, plan, batch * in_channels, dtype, backward=True)
    weight_grad = np.zeros(out_channels * in_channels * kernel + out_channels, dtype)
    if comm.world_size > 1:
        allreduce(comm, weight_grad)
    return middle - start, comm.clock - middle


def forward_time_1d(height: int, width: int, kernel: int, ranks: int, batch: int, channels: int,
                    alpha: float, beta: float, flops_per_second: float, itemsize: int = 4) -> float:
    """T_fwd(P) of a 'same' conv (stride 1, padding (k − 1)/2, C in = C out) split along H over P ranks."""
    if kernel % 2 != 1:
        raise ValueError(f"forward_time_1d models an odd kernel with 'same' padding, got kernel {kernel}")
    if height // ranks < kernel // 2:
        raise ValueError(f"{ranks} ranks leave pieces of {height // ranks} rows, thinner than the halo "
                         f"{kernel // 2}: the exchange would need more hops than this formula counts")
    conv = Conv2d(channels, channels, kernel, padding=kernel // 2, rng=np.random.default_rng(0))
    rows = math.ceil(height / ranks)
    compute = conv.flops((batch, channels, rows, width)) / flops_per_second
    if ranks == 1:
        return compute
    halo = kernel // 2
    return 2 * (alpha + halo * width * batch * channels * itemsize * beta) + compute

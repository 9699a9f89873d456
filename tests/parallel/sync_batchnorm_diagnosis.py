"""Diagnosing SyncBatchNorm.backward in its own terms: which of dX, dγ, dβ is wrong, on which rank, and
the first index off.

The global batch x (M, C) is split over P ranks (pieces.split_range); the reference is float64 central
differences of L = Σ dy ⊙ BN(x) with the statistics of the whole batch. dX is checked rank by rank (rank
r's rows of the global dX); dγ, dβ are local sums, so rank r must hold Σ over its own rows of dy·x̂ and dy
(DataParallel's gradient allreduce adds them later), and their sum over ranks is the full gradient.
"""

import numpy as np

import minidist.parallel.sync_batchnorm as sync_batchnorm
from minidist.cluster import ClusterError, run
from minidist.collectives.pieces import split_range
from minidist.nn.gradcheck import numerical_gradient
from tests.nn.backward_diagnosis import first_off


def global_bn(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    """BatchNorm over the whole batch, written out: (M, C) -> (M, C)."""
    mean, var = x.mean(axis=0), ((x - x.mean(axis=0)) ** 2).mean(axis=0)
    return gamma * (x - mean) / np.sqrt(var + eps) + beta


def sync_backward_worker(comm, x, dy, gamma, beta):
    """This rank's (dx, dγ, dβ) of its shard of x, dy with SyncBatchNorm (looked up at call time, so a
    planted class reaches the forked ranks)."""
    lo, hi = split_range(len(x), comm.world_size, comm.rank)
    layer = sync_batchnorm.SyncBatchNorm(x.shape[1], comm=comm, algorithm="recursive_doubling",
                                         dtype=np.float64)
    layer.weight.data[...], layer.bias.data[...] = gamma, beta
    layer.forward(x[lo:hi])
    return layer.backward(dy[lo:hi]), layer.weight.grad.copy(), layer.bias.grad.copy()


def diagnose_sync_batchnorm(world: int, rng: np.random.Generator, batch: int = 7,
                            channels: int = 3) -> str | None:
    """The first of dX (rank by rank), dγ, dβ (each rank's local sum) that SyncBatchNorm gets wrong."""
    x, dy = 1.0 + rng.standard_normal((batch, channels)), rng.standard_normal((batch, channels))
    gamma, beta = rng.uniform(0.5, 2.0, channels), rng.standard_normal(channels)
    what = f"SyncBatchNorm backward, global batch ({batch}, {channels}) over {world} rank{'s' * (world != 1)}"
    try:
        results = run(sync_backward_worker, world, x, dy, gamma, beta, timeout=30)
    except ClusterError as err:
        return f"{what}: the run failed: {err}"
    dx_want = numerical_gradient(lambda: float(np.sum(dy * global_bn(x, gamma, beta))), x)
    x_hat = (x - x.mean(axis=0)) / np.sqrt(x.var(axis=0) + 1e-5)
    for r, (dx, dgamma, dbeta) in enumerate(results):
        lo, hi = split_range(batch, world, r)
        wrong = first_off(f"dX on rank {r} (global rows {lo}:{hi})", dx, dx_want[lo:hi])
        if wrong:
            return (f"{what}: {wrong} (dx = γ/√(σ² + ε)·(dy − D₁/M − x̂·D₂/M), "
                    f"D₁ = Σ dy, D₂ = Σ dy·x̂ allreduced over all M = {batch} rows)")
        for name, got, want in (("dγ", dgamma, (dy * x_hat)[lo:hi].sum(axis=0)),
                                ("dβ", dbeta, dy[lo:hi].sum(axis=0))):
            wrong = first_off(f"{name} on rank {r}", got, want)
            if wrong:
                return (f"{what}: {wrong} — rank {r} must hold the sum over its own rows {lo}:{hi} only "
                        f"(DataParallel allreduces the parameters' gradients later)")
    return None

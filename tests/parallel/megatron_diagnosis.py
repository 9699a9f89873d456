"""Diagnosing the Megatron MLP block in its own terms: the forward output as Σ_p of the ranks' partial
products plus b2, the input gradient as Σ_p of their terms dh_p·w1_p, and each rank's shard gradient
(dW1/db1 rows, dW2 columns, db2 whole) with the first index off.

Linear(3, 5) → tanh → Linear(5, 2) on 4 tokens, split over P = 2 and 3 ranks (5 hidden units: uneven
slices). What a wrong array reads as — one rank's partial only (an all-reduce missing), the bias added P
times, half of an accumulation — is said when it is one of those.
"""

import numpy as np

import minidist.parallel.tensor.mlp as mlp
from minidist.cluster import ClusterError, run
from minidist.nn import Linear, Tanh

D, H, D_OUT, N = 3, 5, 2, 4
GRADIENTS = (("dW1", "up.weight", "its rows {rows} of W1"), ("db1", "up.bias", "its rows {rows} of b1"),
             ("dW2", "down.weight", "its columns {rows} of W2"), ("db2", "down.bias", "all of b2"))


def _setup():
    rng = np.random.default_rng(55)
    first, second = Linear(D, H, rng=rng, dtype=np.float64), Linear(H, D_OUT, rng=rng, dtype=np.float64)
    return first, second, rng.normal(size=(N, D)), rng.normal(size=(N, D_OUT))


def megatron_trace(comm):
    """This rank's z, dx and shard gradients after one backward, its gradients after a second one, rows."""
    first, second, x, dz = _setup()
    block = mlp.MegatronMLP(comm, first, second, Tanh())     # looked up now: a planted one reaches the ranks
    z = block.forward(x)
    dx = block.backward(dz)
    params = {"up.weight": block.up.weight, "up.bias": block.up.bias, "down.weight": block.down.weight,
              "down.bias": block.down.bias}
    once = {k: np.array(p.grad) for k, p in params.items()}
    block.forward(x)
    block.backward(dz)
    return z, dx, once, {k: np.array(p.grad) for k, p in params.items()}, list(range(H))[block.up.rows]


def _off(got, want) -> str:
    got = np.asarray(got)
    if got.shape != want.shape:
        return f"it has shape {got.shape}, not {want.shape}"
    i = tuple(int(v) for v in np.argwhere(~np.isclose(got, want, rtol=1e-12, atol=1e-13))[0])
    return f"first index off {i}: should be {want[i]:.6g}, is {got[i]:.6g}"


def _reads_as(got, candidates: dict) -> str:
    for name, value in candidates.items():
        if np.shape(got) == value.shape and np.allclose(got, value, rtol=1e-12, atol=1e-13):
            return f"; it is {name}"
    return ""


def diagnose_megatron(world: int) -> str | None:
    """The first of z, dx, dW1, db1, dW2, db2 (forward, then backward, then a second backward) off."""
    what = (f"MegatronMLP Linear({D}, {H}) → tanh → Linear({H}, {D_OUT}) on {N} tokens over {world} "
            f"rank{'s' * (world > 1)}")
    try:
        traces = run(megatron_trace, world, timeout=30)
    except ClusterError as err:
        return f"{what}: the run failed: {err}"
    first, second, x, dz = _setup()
    w1, b1, w2, b2 = first.weight.data, first.bias.data, second.weight.data, second.bias.data
    a = np.tanh(x @ w1.T + b1)
    dh = (dz @ w2) * (1 - a ** 2)
    want = {"up.weight": dh.T @ x, "up.bias": dh.sum(0), "down.weight": dz.T @ a, "down.bias": dz.sum(0)}
    parts = [tr[4] for tr in traces]
    z_parts = [a[:, rows] @ w2[:, rows].T for rows in parts]
    dx_parts = [dh[:, rows] @ w1[rows] for rows in parts]
    z, dx = sum(z_parts) + b2, sum(dx_parts)
    for r, (got_z, got_dx, once, twice, rows) in enumerate(traces):
        if not (np.shape(got_z) == z.shape and np.allclose(got_z, z, rtol=1e-12, atol=1e-13)):
            reads = _reads_as(got_z, {f"rank {r}'s own partial z_{r} + b2 (g's all-reduce is missing)":
                                      z_parts[r] + b2, "Σ_p z_p + P·b2 (b2 added inside the sum)":
                                      sum(z_parts) + world * b2, "Σ_p z_p without b2": sum(z_parts)})
            return (f"{what}: forward: rank {r}'s z should be Σ_p z_p + b2 (the all-reduce of the {world} "
                    f"partial products a_p·w2_pᵀ, then the whole bias once); {_off(got_z, z)}{reads}")
        if not (np.shape(got_dx) == dx.shape and np.allclose(got_dx, dx, rtol=1e-12, atol=1e-13)):
            reads = _reads_as(got_dx, {f"rank {r}'s own term dh_{r}·w1_{r} (f's backward all-reduce is "
                                       f"missing)": dx_parts[r]})
            return (f"{what}: backward: rank {r}'s dx should be Σ_p dh_p·w1_p (all-reduced over the "
                    f"{world} ranks); {_off(got_dx, dx)}{reads}")
        for label, name, part in GRADIENTS:
            expected = want[name] if name == "down.bias" else \
                want[name][:, rows] if name == "down.weight" else want[name][rows]
            where = f"{what}: backward: rank {r}'s {label} ({part.format(rows=rows)})"
            if not (once[name].shape == expected.shape and np.allclose(once[name], expected, rtol=1e-12,
                                                                       atol=1e-13)):
                reads = _reads_as(once[name], {f"{world}·the whole-batch gradient": world * expected})
                return f"{where}: {_off(once[name], expected)}{reads}"
            if not np.allclose(twice[name], 2 * expected, rtol=1e-12, atol=1e-13):
                reads = _reads_as(twice[name], {"1×: it assigns": expected})
                return (f"{where}: a second backward should add into it (2× one backward's); "
                        f"{_off(twice[name], 2 * expected)}{reads}")
    return None

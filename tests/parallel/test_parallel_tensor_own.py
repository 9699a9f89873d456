"""megatron_mlp's own tests: the Megatron MLP block against the same block written out in NumPy.

The reference is computed here, by hand (x·W1ᵀ + b1, tanh, ·W2ᵀ + b2), not by Linear.forward, so these
tests reach only the megatron_mlp region (Linear objects only carry the full weights to be sliced).
The property of the exercise: the split block gives the single-process output, every shard's gradient is
the matching slice of the full gradient, the input gradient is whole, and the block moves one all-reduce
of the output forward and one of the input gradient backward — nothing else.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist.cluster import run
from minidist.nn import Linear, Tanh
from minidist.parallel import MegatronMLP
from tests.parallel.megatron_diagnosis import diagnose_megatron


@pytest.mark.exercise("megatron_mlp")
@pytest.mark.diagnose
def test_megatron_output_is_the_sum_of_the_partials_and_each_shard_gradient_its_slice():
    for world in (2, 3):
        wrong = diagnose_megatron(world)
        assert wrong is None, wrong


def layers(d, h, d_out, seed):
    rng = np.random.default_rng(seed)
    return Linear(d, h, rng=rng, dtype=np.float64), Linear(h, d_out, rng=rng, dtype=np.float64)


def reference(x, dz, first, second):
    """Forward output and every gradient of Linear → tanh → Linear, in plain NumPy."""
    w1, b1, w2, b2 = first.weight.data, first.bias.data, second.weight.data, second.bias.data
    a = np.tanh(x @ w1.T + b1)
    z = a @ w2.T + b2
    da = dz @ w2
    dh = da * (1 - a ** 2)
    return z, {"w1": dh.T @ x, "b1": dh.sum(0), "w2": dz.T @ a, "b2": dz.sum(0), "dx": dh @ w1}


def worker(comm, d, h, d_out, n, seed, input_grad):
    first, second = layers(d, h, d_out, seed)
    rng = np.random.default_rng([seed, 1])
    x, dz = rng.normal(size=(n, d)), rng.normal(size=(n, d_out))
    block = MegatronMLP(comm, first, second, Tanh(), input_grad=input_grad)
    s0 = comm.stats.bytes_sent
    z = block.forward(x)
    s1 = comm.stats.bytes_sent
    dx = block.backward(dz)
    s2 = comm.stats.bytes_sent
    grads = {"w1": block.up.weight.grad, "b1": block.up.bias.grad, "w2": block.down.weight.grad,
             "b2": block.down.bias.grad}
    return z, dx, grads, block.up.rows, (s1 - s0, s2 - s1)


@pytest.mark.parametrize("P, d, h, d_out, n", [(1, 3, 4, 2, 5), (2, 4, 6, 3, 5), (3, 5, 7, 4, 2),
                                               (4, 3, 9, 5, 3)])
def test_megatron_block_equals_the_single_process_block(P, d, h, d_out, n):
    check(P, d, h, d_out, n, seed=P, input_grad=True)


def test_megatron_block_without_input_gradient_skips_the_backward_allreduce():
    check(3, 4, 6, 2, 4, seed=7, input_grad=False)


@settings(max_examples=5)
@given(P=st.integers(1, 4), d=st.integers(1, 5), extra=st.integers(0, 5), d_out=st.integers(1, 4),
       n=st.integers(1, 4), seed=st.integers(0, 2**16))
def test_megatron_block_hypothesis(P, d, extra, d_out, n, seed):
    check(P, d, P + extra, d_out, n, seed, input_grad=True)


def check(P, d, h, d_out, n, seed, input_grad):
    first, second = layers(d, h, d_out, seed)
    rng = np.random.default_rng([seed, 1])
    x, dz = rng.normal(size=(n, d)), rng.normal(size=(n, d_out))
    z, want = reference(x, dz, first, second)
    results = run(worker, P, d, h, d_out, n, seed, input_grad, timeout=60)
    for rank, (got_z, got_dx, grads, rows, (_forward_bytes, _backward_bytes)) in enumerate(results):
        where = f"rank {rank} of {P}"
        np.testing.assert_allclose(got_z, z, rtol=1e-12, atol=1e-14, err_msg=where)
        if input_grad:
            np.testing.assert_allclose(got_dx, want["dx"], rtol=1e-12, atol=1e-14, err_msg=where)
        else:
            assert got_dx is None, where
        np.testing.assert_allclose(grads["w1"], want["w1"][rows], rtol=1e-12, atol=1e-14, err_msg=where)
        np.testing.assert_allclose(grads["b1"], want["b1"][rows], rtol=1e-12, atol=1e-14, err_msg=where)
        np.testing.assert_allclose(grads["w2"], want["w2"][:, rows], rtol=1e-12, atol=1e-14, err_msg=where)
        np.testing.assert_allclose(grads["b2"], want["b2"], rtol=1e-12, atol=1e-14, err_msg=where)
    assert np.concatenate([np.arange(h)[r[3]] for r in results]).tolist() == list(range(h))
    # One all-reduce of the (n, d_out) output forward, one of the (n, d) input gradient backward:
    # a ring reduce-scatter + all-gather sends 2(P−1)·(elements)·8 bytes summed over the ranks.
    forward_total = sum(r[4][0] for r in results)
    backward_total = sum(r[4][1] for r in results)
    assert forward_total == 2 * (P - 1) * n * d_out * 8
    assert backward_total == (2 * (P - 1) * n * d * 8 if input_grad else 0)

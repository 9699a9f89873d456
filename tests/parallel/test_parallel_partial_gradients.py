"""A split model's gradient that is still a partial sum cannot be stepped on (issue 53, item 4).

After ``spatialize`` or a tensor (sequence-parallel) or context transform, a parameter in ``partial_over``
holds only this rank's share of its gradient until ``sum_partial_gradients`` runs. Every optimizer family
refuses to step on it — a ValueError naming the parameter (index, name, shape) and its group, before any
parameter changes — and accepts it after the one summing call. A new backward makes it pending again;
``zero_grad`` clears it; a group of one rank needs no sum.
"""

import numpy as np
import pytest

from minidist.cluster import run
from minidist.collectives import sum_partial_gradients
from minidist.nn import GPT, Conv2d, Flatten, Linear, ReLU, Sequential, TransformerBlock
from minidist.optim import LAMB, LARS, SAG, SGD, Adagrad, Adam, AdamW, RMSprop
from minidist.parallel.context import context_parallel, positions
from minidist.parallel.spatial import grid_blocks, spatialize
from minidist.parallel.tensor import sequence_shard, tensor_parallel

D, HEADS, T, V = 8, 2, 4, 7

# every family of minidist.optim (MaskedOptimizer wraps one of them and steps it)
OPTIMIZERS = {
    "SGD": lambda ps, model: SGD(ps, lr=0.1, momentum=0.9),
    "Adam": lambda ps, model: Adam(ps, lr=0.01),
    "AdamW": lambda ps, model: AdamW(ps, lr=0.01, weight_decay=0.1),
    "RMSprop": lambda ps, model: RMSprop(ps, lr=0.01),
    "Adagrad": lambda ps, model: Adagrad(ps, lr=0.05),
    "LARS": lambda ps, model: LARS(ps, lr=0.1),
    "LAMB": lambda ps, model: LAMB(ps, lr=0.01),
    "SAG": lambda ps, model: SAG(ps, lr=0.1, num_samples=1),
}
# transform -> (the parameter refused first: its index, name, shape)
FIRST_PARTIAL = {"spatial": (0, "layers.0.weight", (3, 2, 3, 3)), "tensor": (0, "ln1.weight", (D,)),
                 "context": (0, "tok_emb.weight", (V, D))}


def _split(comm, transform):
    """(the split model, one forward + backward of it on this rank's share of a fixed batch)."""
    rng = np.random.default_rng(0)
    if transform == "spatial":
        model = Sequential(Conv2d(2, 3, 3, padding=1, rng=rng, dtype=np.float64), ReLU(), Flatten(),
                           Linear(3 * 4 * 4, 2, rng=rng, dtype=np.float64))
        split = spatialize(model, comm, (comm.world_size, 1), (4, 4))
        rows, cols = grid_blocks((4, 4), (comm.world_size, 1))[comm.rank]
        x = np.random.default_rng(1).standard_normal((2, 2, 4, 4))[:, :, rows, cols]
    elif transform == "tensor":
        model = split = tensor_parallel(TransformerBlock(D, HEADS, rng=rng, dtype=np.float64), comm,
                                        sequence_parallel=True)
        x = sequence_shard(np.random.default_rng(1).standard_normal((2, T, D)), comm.world_size, comm.rank)
    else:
        model = split = context_parallel(GPT(V, T, 1, D, HEADS, rng=rng, dtype=np.float64), comm, seq_len=T,
                                         layout="zigzag")
        tokens = np.random.default_rng(1).integers(0, V, (2, T))
        x = tokens[:, positions(T, comm.world_size, comm.rank, "zigzag")]

    def forward_backward():
        y = split.forward(x)
        split.backward(0.01 * np.ones_like(y))
    return model, forward_backward


def _try_step(optimizer):
    """The refusal's text, or None if the step ran."""
    try:
        optimizer.step(0) if isinstance(optimizer, SAG) else optimizer.step()
    except ValueError as refusal:
        return str(refusal)
    return None


def _refused_until_summed(comm, transform, name):
    model, forward_backward = _split(comm, transform)
    params = model.parameters()
    optimizer = OPTIMIZERS[name](params, model)
    forward_backward()
    before = [p.data.copy() for p in params]
    refused = _try_step(optimizer)
    untouched = all(np.array_equal(b, p.data) for b, p in zip(before, params, strict=True))
    sum_partial_gradients(params)                       # the one call that sums them
    accepted = _try_step(optimizer)
    moved = any(not np.array_equal(b, p.data) for b, p in zip(before, params, strict=True))
    forward_backward()                                  # a new backward: partial again
    again = _try_step(optimizer)
    optimizer.zero_grad()                               # a zero gradient is no partial sum
    cleared = _try_step(optimizer)
    return refused, untouched, accepted, moved, again, cleared


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("transform", ["spatial", "tensor", "context"])
def test_every_optimizer_refuses_a_partial_gradient_until_it_is_summed(transform, name):
    index, param_name, shape = FIRST_PARTIAL[transform]
    for refused, untouched, accepted, moved, again, cleared in run(_refused_until_summed, 2, transform, name):
        assert refused is not None, f"{name} stepped on a partial gradient after the {transform} transform"
        assert refused.startswith(f"{name}.step: params[{index}] ('{param_name}', shape {shape}) of its "
                                  f"parameter group"), refused
        assert "partial over groups of 2 ranks" in refused and "sum_partial_gradients" in refused
        assert untouched, "the refused step changed a parameter"
        assert accepted is None and moved, "the summed gradient was not stepped on"
        assert again is not None and again == refused, "a second backward's partial gradient was stepped on"
        assert cleared is None, "zero_grad did not clear the pending partial gradient"


def _one_rank(comm):
    model = tensor_parallel(TransformerBlock(D, HEADS, rng=np.random.default_rng(0), dtype=np.float64), comm,
                            sequence_parallel=True)
    y = model.forward(np.ones((1, T, D)))
    model.backward(np.ones_like(y))
    pending = [p.name for p in model.parameters() if p.partial_pending]
    return pending, _try_step(SGD(model.parameters(), lr=0.1))


def test_a_group_of_one_rank_needs_no_sum_and_a_whole_parameter_is_never_pending():
    pending, refused = run(_one_rank, 1)[0]
    # named as in the block before its split (the transform labels them first; a shard keeps the name)
    assert pending == ["ln1.weight", "ln1.bias", "attn.proj.bias", "ln2.weight", "ln2.bias",
                       "mlp.layers.2.bias"]
    assert refused is None

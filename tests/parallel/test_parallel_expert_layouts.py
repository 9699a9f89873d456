"""The Switch slide's five layouts (data, model, expert, expert+data, expert+model+data: lesson 18), each a
Mesh and parallelize — the slide's model parallelism is the mesh's tensor axis — train a small
SwitchTransformer exactly as one process does, per parameter after several steps."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from minidist.cluster import ClusterError, run
from minidist.nn import CrossEntropyLoss, SwitchTransformer
from minidist.optim import SGD
from minidist.parallel import Mesh, parallelize

V, T, LAYERS, D, HEADS, E, D_FF, B = 7, 4, 2, 4, 4, 4, 8, 2  # B sequences per token set
STEPS = 3
LAYOUTS = {"data": dict(data=4), "model": dict(tensor=4), "expert": dict(expert=4),
           "expert+data": dict(data=2, expert=2), "expert+model+data": dict(data=2, expert=2, tensor=2)}


def _sets(sizes):
    return sizes.get("data", 1) * sizes.get("expert", 1)


def _model(groups):
    return SwitchTransformer(V, T, LAYERS, D, HEADS, E, D_FF, k=1, capacity_factor=1.0, aux_loss_coef=0.1,
                             z_loss_coef=0.01, groups=groups, rng=np.random.default_rng(0), dtype=np.float64)


def _batches(token_sets):
    rng = np.random.default_rng(1)
    return rng.integers(0, V, (token_sets * B, T)), rng.integers(0, V, (token_sets * B, T))


def _record_router_inputs(model) -> list:
    seen, router = [], model.blocks[0].mlp.router
    forward = router.forward
    router.forward = lambda x: seen.append(x.copy()) or forward(x)
    return seen


def _expert_rows(model, state):
    """{expert j: (start, stop) fraction of its d_ff this rank holds} in the first MoE layer, matching each
    held expert's first weight against the trained full ones."""
    held = {}
    for ex in model.blocks[0].mlp.experts:
        w = ex.parameters()[0].data
        for j in range(E):
            full = state[f"blocks.0.mlp.experts.{j}.layers.0.weight"]
            starts = [o for o in range(len(full) - len(w) + 1) if np.allclose(full[o:o + len(w)], w)]
            if starts:
                held[j] = (starts[0] / len(full), (starts[0] + len(w)) / len(full))
    return held


def _worker(comm, sizes):
    model = _model(_sets(sizes))
    seen = _record_router_inputs(model)
    trainer = parallelize(model, Mesh(comm, **sizes), loss_fn=CrossEntropyLoss(),
                          optimizer=lambda params: SGD(params, lr=0.1, momentum=0.9))
    tokens, targets = _batches(_sets(sizes))
    losses = [trainer.train_step(tokens, targets) for _ in range(STEPS)]
    state = trainer.full_state_dict()
    return state, losses, seen[0], _expert_rows(model, state)


def _single(token_sets):
    model = _model(groups=token_sets)  # one routing group per token set, as on the cluster
    seen = _record_router_inputs(model)
    tokens, targets = _batches(token_sets)
    opt, loss_fn, losses, dropped = SGD(model.parameters(), lr=0.1, momentum=0.9), CrossEntropyLoss(), [], 0
    for _ in range(STEPS):
        opt.zero_grad()
        losses.append(loss_fn.forward(model.forward(tokens), targets) + model.router_loss)
        dropped += sum(block.mlp.routing.dropped_tokens for block in model.blocks)
        model.backward(loss_fn.backward())
        opt.step()
    return model.state_dict(), losses, np.split(seen[0], token_sets), dropped


@pytest.mark.parametrize("name", LAYOUTS)
def test_layout_trains_like_one_process(name):
    sizes = LAYOUTS[name]
    world, sets = int(np.prod(list(sizes.values()))), _sets(sizes)
    results = run(_worker, world, sizes, timeout=180)
    full, full_losses, per_set, dropped = _single(sets)
    for state, losses, _, _ in results:
        assert set(state) == set(full)
        for key, value in full.items():
            np.testing.assert_allclose(state[key], value, rtol=0, atol=1e-11, err_msg=key)
        np.testing.assert_allclose(losses, full_losses, rtol=1e-10)
    # every expert of the first layer is held whole by some ranks, or in slices that tile its d_ff
    for j in range(E):
        pieces = sorted({r[3][j] for r in results if j in r[3]})
        assert pieces[0][0] == 0.0 and pieces[-1][1] == 1.0
        assert all(a[1] == b[0] for a, b in itertools.pairwise(pieces))
    # the ranks' tokens (their first router's inputs) are the S token sets, each on some rank
    trained = {next(s for s in range(sets) if np.allclose(r[2], per_set[s])) for r in results}
    assert trained == set(range(sets))
    assert dropped > 0  # capacity factor 1: some tokens were dropped, on every layout


def test_layout_refuses_a_wrong_world_size():
    with pytest.raises(ClusterError, match="multiply to 4, but the world size is 2"):
        run(lambda comm: Mesh(comm, expert=4), 2)

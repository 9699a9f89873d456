"""The Switch slide's five layouts (data, model, expert, expert+data, expert+model+data) train a small
SwitchTransformer exactly as one process does, per parameter after several steps."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from minidist.cluster import run
from minidist.nn import CrossEntropyLoss, SwitchTransformer
from minidist.optim import SGD
from minidist.parallel.switch_layouts import (
    Layout,
    LayoutGroups,
    expert_holdings,
    held_weights,
    parallelize,
    slide_layouts,
    train_step,
)

V, T, LAYERS, D, HEADS, E, D_FF, B = 7, 4, 2, 4, 2, 4, 8, 2  # B sequences per token set
STEPS = 3


def _model(groups=1):
    return SwitchTransformer(V, T, LAYERS, D, HEADS, E, D_FF, k=1, capacity_factor=1.0, aux_loss_coef=0.1,
                             z_loss_coef=0.01, groups=groups, rng=np.random.default_rng(0), dtype=np.float64)


def _batches(token_sets):
    rng = np.random.default_rng(1)
    return rng.integers(0, V, (token_sets * B, T)), rng.integers(0, V, (token_sets * B, T))


def _worker(comm, layout):
    groups = LayoutGroups(comm, layout)
    model = parallelize(groups, _model())
    tokens, targets = _batches(layout.token_sets)
    rows = slice(groups.token_set * B, (groups.token_set + 1) * B)
    opt = SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = [train_step(groups, model, CrossEntropyLoss(), opt, tokens[rows], targets[rows])
              for _ in range(STEPS)]
    held = {name: (a.copy(), index) for name, (a, index) in held_weights(model).items()}
    dropped = sum(block.mlp.routing.dropped_tokens for block in model.blocks)
    return held, losses, groups.token_set, expert_holdings(model), dropped


def _single(token_sets):
    model = _model(groups=token_sets)  # one routing group per token set, as on the cluster
    tokens, targets = _batches(token_sets)
    opt, loss_fn = SGD(model.parameters(), lr=0.1, momentum=0.9), CrossEntropyLoss()
    for _ in range(STEPS):
        opt.zero_grad()
        loss_fn.forward(model.forward(tokens), targets)
        model.backward(loss_fn.backward())
        opt.step()
    return dict(model.named_parameters())


@pytest.mark.parametrize("layout", slide_layouts(4), ids=lambda layout: layout.name)
def test_layout_trains_like_one_process(layout):
    results = run(_worker, layout.world_size, layout, timeout=180)
    full = _single(layout.token_sets)
    for held, *_ in results:
        assert {name for name in held if ".experts." not in name} == {n for n in full if ".experts." not in n}
        for name, (array, index) in held.items():
            np.testing.assert_allclose(array, full[name].data[index], rtol=0, atol=1e-11, err_msg=name)
    # every expert of the first layer is held whole by some ranks, or in slices that tile its d_ff
    for j in range(E):
        pieces = sorted({h[3][j] for h in results if j in h[3]})
        assert pieces[0][0] == 0.0 and pieces[-1][1] == 1.0
        assert all(a[1] == b[0] for a, b in itertools.pairwise(pieces))
    assert sorted({h[2] for h in results}) == list(range(layout.token_sets))
    assert sum(h[4] for h in results) > 0  # capacity factor 1: some tokens were dropped, on every layout


def test_layout_refuses_a_wrong_world_size():
    from minidist.cluster import ClusterError
    with pytest.raises(ClusterError, match="needs 4 ranks"):
        run(LayoutGroups, 2, Layout("expert", expert=4))

"""Helpers shared by the nn tests: copying a minidist layer's parameters into a torch layer and comparing
outputs and every gradient (torch is only an oracle; tests that use it call pytest.importorskip)."""

from __future__ import annotations

import numpy as np

TOL = {"rtol": 1e-10, "atol": 1e-10}  # float64 on both sides: only summation order differs


def copy_params_to_torch(layer, torch_layer) -> None:
    import torch

    mine = dict(layer.named_parameters())
    theirs = dict(torch_layer.named_parameters())
    assert set(mine) == set(theirs), (sorted(mine), sorted(theirs))
    with torch.no_grad():
        for name, p in mine.items():
            theirs[name].copy_(torch.from_numpy(p.data))


def compare_with_torch(layer, torch_layer, x: np.ndarray, rng: np.random.Generator) -> None:
    """Forward both on x (float64), backward a random upstream gradient, compare y, dx and every grad."""
    import torch

    torch_layer = torch_layer.double()
    copy_params_to_torch(layer, torch_layer)
    torch_layer.zero_grad()
    layer.zero_grad()
    y = layer.forward(x)
    dy = rng.standard_normal(y.shape)
    dx = layer.backward(dy)
    tx = torch.tensor(x, requires_grad=True)
    ty = torch_layer(tx)
    ty.backward(torch.from_numpy(dy))
    np.testing.assert_allclose(y, ty.detach().numpy(), **TOL, err_msg="forward output")
    np.testing.assert_allclose(dx, tx.grad.numpy(), **TOL, err_msg="input gradient")
    theirs = dict(torch_layer.named_parameters())
    for name, p in layer.named_parameters():
        np.testing.assert_allclose(p.grad, theirs[name].grad.numpy(), **TOL, err_msg=f"gradient of {name}")

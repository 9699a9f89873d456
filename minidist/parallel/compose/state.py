"""Which elements of the unsplit model each rank holds, and the full state dict gathered from the shards.

The transforms cut parameters in many ways (rows, columns, heads, experts, vocabulary ...). Rather than
invert each cut, the Trainer labels every element before splitting: element i of the concatenation of
``model.named_parameters()`` gets the value i (float64), so after the split each held parameter's values
name the elements it holds. Then the real values come back (``restore_values``), and the lowest rank
holding an element owns it (``owners``): ``full_state`` sends each element once, from its owner.
"""

from __future__ import annotations

import numpy as np

from minidist.collectives.primitives import pairwise_allreduce


def label_elements(model) -> list[tuple[str, object, np.ndarray]]:
    """Replace every parameter's values by its elements' float64 labels (module docstring). Returns
    [(name, parameter, its original values)]."""
    named, start = [], 0
    for name, p in model.named_parameters():
        named.append((name, p, p.data))
        p.data = np.arange(start, start + p.size, dtype=np.float64).reshape(p.shape)
        start += p.size
    return named


def restore_values(named: list, held: list) -> list[np.ndarray]:
    """Read the labels of each held (split) parameter, then give it (and the unsplit parameters) the real
    values and a zero gradient of their dtype. Returns each held parameter's labels, flat (int64)."""
    values = np.concatenate([v.ravel() for _, _, v in named])
    labels = [p.data.ravel().astype(np.int64) for p in held]
    for _, p, value in named:
        p.data = value
    for p, where in zip(held, labels):
        p.data = values[where].reshape(p.shape)
        p.grad = np.zeros_like(p.data)
    return labels


def owners(comm, labels: list[np.ndarray], total: int) -> np.ndarray:
    """owner[i]: the lowest rank holding element i of the model (an allreduce of min over the world)."""
    mine = np.full(total, float(comm.world_size))
    for where in labels:
        mine[where] = comm.rank
    owner = pairwise_allreduce(comm, mine, op="min").astype(np.int64)
    if (owner == comm.world_size).any():
        raise RuntimeError(f"{int((owner == comm.world_size).sum())} elements of the model are on no rank")
    return owner


def full_state(comm, named: list, held: list, labels: list, owner: np.ndarray, buffers) -> dict:
    """{name: array} of the unsplit model: each element written by its owner, one allreduce of the
    concatenation (one nonzero term per element: exact), reshaped and cast to each parameter's dtype;
    ``buffers`` (name, array) copied as they are."""
    flat = np.zeros(sum(v.size for _, _, v in named))
    for p, where in zip(held, labels):
        owned = owner[where] == comm.rank
        flat[where[owned]] = p.data.ravel()[owned]
    flat = pairwise_allreduce(comm, flat)
    state, start = {}, 0
    for name, _, value in named:
        state[name] = flat[start:start + value.size].reshape(value.shape).astype(value.dtype)
        start += value.size
    state.update({name: np.array(b, copy=True) for name, b in buffers})
    return state

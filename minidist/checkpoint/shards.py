"""What one rank of a parallelized run saves, and how any mesh takes it back.

Every element of the unsplit model has a label: its index i in the concatenation of
``model.named_parameters()`` (compose/state.py labels them before the split). Rank r saves its optimizer's
parameters — its held slices (tensor columns, heads, its pipeline stage), or under ZeRO its shards of the
flat groups — each as (labels, values, one array per optimizer state name):

    labels_k (n_k,) int64     which elements of the model parameter k of the optimizer holds
    data_k   (n_k,)           their values, in the model's dtype
    <name>_k (n_k,)           the optimizer's state of them (Adam: exp_avg, exp_avg_sq), same order

Loading scatters every rank's file into full flat vectors (``assemble``: flat[labels_k] = data_k) and
gathers each new rank's elements from them (``take_back``: data = flat[labels]). The same mesh gets back
the same elements; another mesh gets the elements its split holds: a re-split through the labels, exact.
"""

from __future__ import annotations

import numpy as np


def optimizer_labels(trainer) -> list[np.ndarray]:
    """labels (n_k,) int64 of each parameter of trainer.optimizer: the held parameters' labels, or under
    ZeRO each flat group's concatenated labels cut to this rank's piece [lo, hi)."""
    if not trainer.zero:
        return [np.asarray(where) for where in trainer.labels]
    label_of = {id(p): where for p, where in zip(trainer.held, trainer.labels)}
    groups = trainer.syncs[-1].groups
    return [np.concatenate([label_of[id(p)] for p in g.params])[g.lo:g.hi] for g in groups]


def rank_arrays(trainer) -> dict[str, np.ndarray]:
    """{file key: array} this rank saves (module docstring); copies."""
    arrays = {}
    optimizer = trainer.optimizer
    for k, (p, where, state) in enumerate(zip(optimizer.params, optimizer_labels(trainer), optimizer.state)):
        arrays[f"labels_{k}"] = where
        arrays[f"data_{k}"] = np.array(p.data, copy=True).ravel()
        for name, value in state.items():
            arrays[f"{name}_{k}"] = np.array(value, copy=True).ravel()
    return arrays


def assemble(files: dict[str, dict[str, np.ndarray]], total: int, dtype, state_names) -> dict:
    """{"data": flat (total,), name: flat (total,) per state name}, scattered from every rank's arrays
    (files: {file name: its arrays}). ValueError naming a file whose keys do not fit, or the count of
    elements no file holds."""
    flat = {key: np.zeros(total, dtype=dtype) for key in ("data", *state_names)}
    seen = np.zeros(total, dtype=bool)
    for file, arrays in files.items():
        for k in range(sum(key.startswith("labels_") for key in arrays)):
            where = arrays.get(f"labels_{k}")
            if where is None or where.size and (where.min() < 0 or where.max() >= total):
                raise ValueError(f"{file}: labels_{k} missing or outside the model's {total} elements")
            for key in flat:
                value = arrays.get(f"{key}_{k}")
                if value is None or value.shape != where.shape:
                    raise ValueError(f"{file}: {key}_{k} missing or not of labels_{k}'s shape {where.shape}")
                flat[key][where] = value
            seen[where] = True
    if not seen.all():
        raise ValueError(f"{int((~seen).sum())} of the model's {total} elements are in no rank's file")
    return flat


def take_back(trainer, flat: dict[str, np.ndarray], step_count: int) -> None:
    """Give this rank's optimizer parameters and their state their elements of ``flat`` (in place), set
    the optimizer's step counter; under ZeRO the shards are shared out again (a collective over the data
    group)."""
    optimizer = trainer.optimizer
    for p, where, state in zip(optimizer.params, optimizer_labels(trainer), optimizer.state):
        p.data[...] = flat["data"][where].reshape(p.shape)
        for name, value in state.items():
            value[...] = flat[name][where].reshape(value.shape)
    optimizer.step_count = step_count
    if trainer.zero:            # (without ZeRO the optimizer's parameters are the held ones)
        trainer.syncs[-1].share_masters()   # stages 1-2: the full parameters; stage 3: the working shards

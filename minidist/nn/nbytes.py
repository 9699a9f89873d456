"""The bytes behind arrays: which arrays a module holds, and how much distinct memory a set of them is.

A view counts through its base, once: ``x``, ``x[1:]`` and ``x.reshape(...)`` are one block of memory.
A module holds

    parameters    each Parameter's data, and the registered buffers (running statistics, ...)
    gradients     each Parameter's grad
    activations   what its layers keep between calls that is neither a parameter, a buffer nor a module:
                  the arrays saved for backward (a Linear's input, a ReLU's mask, ...)

``nbytes_of(*values)`` counts each block of memory once; ``distinct_nbytes(claims)`` does so per category,
in the first category that claims it. The memory ledger (minidist/sim/memory.py) adds an optimizer's
state and communication buffers to a module's claims; gradient checkpointing (checkpoint.py) and the
pipeline measure what they keep with them. Here, in nn, because they only read what arrays a Module holds
(nn sits below the instruments and may not import them).
"""

from __future__ import annotations

import numpy as np


def array_roots(value, found: dict[int, np.ndarray]) -> None:
    """Collect into ``found`` (id -> array) the memory-owning arrays under value (arrays, lists, tuples,
    dicts; a view counts through its base, so memory shared by several views counts once)."""
    if isinstance(value, np.ndarray):
        while isinstance(value.base, np.ndarray):
            value = value.base
        found[id(value)] = value
    elif isinstance(value, (list, tuple)):
        for item in value:
            array_roots(item, found)
    elif isinstance(value, dict):
        for item in value.values():
            array_roots(item, found)



def nbytes_of(*values) -> int:
    """Bytes of the distinct memory behind the arrays in values (a view and its base count once)."""
    found: dict[int, np.ndarray] = {}
    for value in values:
        array_roots(value, found)
    return sum(a.nbytes for a in found.values())

def _is_parameter(value) -> bool:
    return hasattr(value, "data") and hasattr(value, "grad") and not isinstance(value, np.ndarray)


def saved_arrays(model) -> list:
    """The values the model's layers keep between calls that are neither parameters, buffers nor modules:
    the activations saved for backward (arrays, or lists, tuples and dicts of them)."""
    saved = []
    for module in model.modules():
        kept = set(vars(module).get("_buffer_names", []))
        for name, value in vars(module).items():
            if name in kept or _is_parameter(value) or hasattr(value, "modules"):
                continue
            if isinstance(value, (np.ndarray, list, tuple, dict)):
                saved.append(value)
    return saved


def module_arrays(model=None, parameters=()) -> dict[str, list]:
    """{"parameters", "gradients", "activations": the arrays model holds (None: none)}, with the data and
    grad of the extra Parameters ``parameters`` (e.g. a wrapper's shards). A freed data or grad (None) is
    kept as None and holds nothing."""
    params = (list(model.parameters()) if model is not None else []) + list(parameters)
    buffers = [b for _, b in model.named_buffers()] if model is not None else []
    return {"parameters": [p.data for p in params] + buffers, "gradients": [p.grad for p in params],
            "activations": saved_arrays(model) if model is not None else []}


def distinct_nbytes(claims: dict[str, list]) -> dict[str, int]:
    """{category: bytes} for claims {category: values}, in the claims' order: a block of memory counts
    once, in the first category that claims it (None values hold nothing)."""
    seen: set[int] = set()
    held = {}
    for category, values in claims.items():
        found: dict[int, np.ndarray] = {}
        array_roots([v for v in values if v is not None], found)
        held[category] = sum(a.nbytes for key, a in found.items() if key not in seen)
        seen.update(found)
    return held

"""Data-parallel replicas must hold the same parameters: checked with small allgathers of hashes.

At the start every rank allgathers a fixed-size signature of its parameters (count, elements, a hash of
the shapes and dtypes), then a SHA-256 of their bytes; any rank that differs from rank 0 is named in a
ValueError raised on every rank alike (every rank sees the same allgathered table).
"""

from __future__ import annotations

import hashlib

import numpy as np

from minidist.collectives import allgather
from minidist.nn.module import Parameter


def check_same_layout(comm, params: list[Parameter]) -> None:
    """Raise ValueError (on every rank) unless every rank's parameters have rank 0's shapes and dtypes."""
    layout = ";".join(f"{p.shape}:{p.data.dtype}" for p in params).encode()
    digest = np.frombuffer(hashlib.sha256(layout).digest()[:8], dtype=np.int64)[0]
    signature = np.array([len(params), sum(p.size for p in params), digest], dtype=np.int64)   # fixed size
    signatures = allgather(comm, signature)
    differ = [r for r, s in enumerate(signatures) if not np.array_equal(s, signatures[0])]
    if differ:
        described = ", ".join(f"rank {r}: {s[0]} parameters, {s[1]} elements"
                              for r, s in enumerate(signatures) if r in [0, *differ])
        raise ValueError(f"data-parallel replicas must have the same parameter shapes and dtypes; "
                         f"rank(s) {differ} differ from rank 0 ({described})")


def check_same_values(comm, params: list[Parameter],
                      what: str = "replicas are not bitwise identical") -> None:
    """Raise ValueError (on every rank) unless every rank's parameters are bitwise equal to rank 0's."""
    h = hashlib.sha256()                                     # of every parameter's bytes: 32 uint8
    for p in params:
        h.update(np.ascontiguousarray(p.data).tobytes())
    digests = allgather(comm, np.frombuffer(h.digest(), dtype=np.uint8).copy())
    differ = [r for r, d in enumerate(digests) if not np.array_equal(d, digests[0])]
    if differ:
        raise ValueError(f"{what}: the parameters of rank(s) {differ} differ from rank 0's")

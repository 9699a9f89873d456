"""permute: rank r sends its array to rank perm[r] and receives the array of rank perm⁻¹[r].

The "Hardware Accelerators for Training DNNs" tutorial's table of collectives opens with permute: before
x0 x1 x2 x3 on nodes 0-3, after x1 x0 x3 x2 (perm = [1, 0, 3, 2]). A cyclic shift, perm[r] = r + 1 mod P,
is one step of a ring. Every
rank sends one message and receives one (none where perm[r] = r): one exchange, so

    T = α + n β        (n: the bytes of one rank's array; every rank at once)
"""

from __future__ import annotations

import numpy as np

from minidist.collectives.common import TAGS, agree, check_array, check_comm


def check_permutation(perm, world_size: int) -> tuple[int, ...]:
    """perm as a tuple of ints if it is a permutation of range(world_size); else ValueError naming perm."""
    values = list(perm) if isinstance(perm, (list, tuple, np.ndarray)) else None
    if values is None or any(isinstance(v, bool) or not isinstance(v, (int, np.integer)) for v in values):
        raise ValueError(f"permute: perm must be a list of ints, a permutation of range({world_size}), "
                         f"got {perm!r}")
    if sorted(int(v) for v in values) != list(range(world_size)):
        raise ValueError(f"permute: perm must be a permutation of range({world_size}), got {perm!r}")
    return tuple(int(v) for v in values)


def permute(comm, x: np.ndarray, perm) -> np.ndarray:
    """The array of rank perm⁻¹[r], on rank r: rank r's x goes to rank perm[r].

    x: any shape and dtype (may differ between ranks). perm: the same permutation of range(P) on every
    rank (list, tuple or integer array). Returns a new array (the sender's shape and dtype).
    """
    check_comm(comm)
    x = check_array(x)
    p, r = comm.world_size, comm.rank
    perm = check_permutation(perm, p)
    agree(comm, f"permute(perm={perm})")
    source = perm.index(r)
    if perm[r] == r:
        return x.copy()
    return comm.sendrecv(x, dst=perm[r], src=source, sendtag=TAGS["permute"], recvtag=TAGS["permute"])

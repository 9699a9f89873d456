"""The other collectives: broadcast, reduce, gather, scatter, allgather, reduce_scatter, alltoall, barrier,
and pairwise_allreduce (reduce_scatter then allgather).

P ranks; x is this rank's array. Each returns a new array (or list of arrays) and never modifies x.

    broadcast(x, root)   root's x to every rank              binomial tree, ⌈log2 P⌉ steps
    reduce(x, root)      elementwise sum at root, None else   binomial tree, ⌈log2 P⌉ steps
    gather(x, root)      [x_0, ..., x_{P-1}] at root          root receives P − 1 messages
    scatter(chunks, root)  chunks[r] to rank r               root sends P − 1 messages
    allgather(x)         [x_0, ..., x_{P-1}] on every rank    P − 1 pairwise exchanges, (P − 1) · n
    reduce_scatter(x)    piece r of the sum on rank r         P − 1 pairwise exchanges, (P − 1)/P · n
    alltoall(chunks)     out[j] = rank j's chunks[r]          P − 1 pairwise exchanges
    pairwise_allreduce(x)  the sum on every rank              reduce_scatter + allgather, 2(P − 1)/P · n

allgather and reduce_scatter exchange directly (round k: send to r + k, receive from r − k): the same
messages and bytes per rank as the two phases of a ring allreduce, without its forwarding (the ring is
lesson 05's exercise, collectives/ring.py). The rounds of pairwise_allreduce and alltoall are described
in minidist.sim.collective_rounds ("pairwise", "alltoall"), priced by minidist.sim.collective_cost.

gather, allgather, scatter and alltoall accept arrays of different shapes on different ranks; the
reductions need the same shape and dtype everywhere. Pieces of reduce_scatter follow
np.array_split(total.ravel(), P), so P may exceed the length (some pieces are then empty).
"""

from __future__ import annotations

import numpy as np

from minidist.collectives.common import (
    TAGS,
    agree,
    agreement,
    check_array,
    check_comm,
    check_op,
    check_root,
    dtype_name,
    finish,
    flat_copy,
)
from minidist.collectives.pieces import split_offsets


def broadcast(comm, x: np.ndarray | None, root: int = 0) -> np.ndarray:
    """root's x on every rank (a binomial tree).

    x: at root, the array to send (any shape); elsewhere None or an array of root's shape and dtype.
    Returns a new array of root's x's shape and dtype on every rank.
    """
    check_comm(comm)
    p, root, tag = comm.world_size, check_root(comm, root), TAGS["broadcast"]
    agree(comm, f"broadcast(root={root})")
    me = (comm.rank - root) % p  # number the ranks so that the root is 0
    if me == 0:
        data = check_array(x).copy()
    mask = 1
    while mask < p:  # receive from the parent (me with its lowest set bit cleared)
        if me & mask:
            out = None if x is None else np.empty_like(check_array(x))
            data = comm.recv((me - mask + root) % p, tag=tag, out=out)
            break
        mask <<= 1
    mask >>= 1
    while mask > 0:  # forward to the children, farthest first
        if me + mask < p:
            comm.send(data, dst=(me + mask + root) % p, tag=tag)
        mask >>= 1
    return data


def reduce(comm, x: np.ndarray, root: int = 0, op: str = "sum") -> np.ndarray | None:
    """The elementwise reduction (sum, mean, max, min) of every rank's x at root; None elsewhere.

    x: any shape, the same shape and dtype on every rank. Returns, at root, a new array of x's shape.
    """
    check_comm(comm)
    x = check_array(x)
    p, root, tag = comm.world_size, check_root(comm, root), TAGS["reduce"]
    check_op(op, x.dtype)
    agree(comm, f"reduce(root={root}, op={op!r}, size={x.size}, dtype={dtype_name(x.dtype)})")
    me = (comm.rank - root) % p
    total = flat_copy(x)
    mask = 1
    while mask < p:  # add the children's partial results, then pass ours to the parent
        if me & mask:
            comm.send(total, dst=(me - mask + root) % p, tag=tag)
            return None
        if me + mask < p:
            comm.recv((me + mask + root) % p, tag=tag, out=total, op="sum" if op == "mean" else op)
        mask <<= 1
    return finish(total, op, p, x.shape)


def gather(comm, x: np.ndarray, root: int = 0) -> list[np.ndarray] | None:
    """The list [x of rank 0, ..., x of rank P − 1] at root (P new arrays, each its rank's shape); None
    elsewhere. x: any shape, may differ between ranks."""
    check_comm(comm)
    x = check_array(x)
    root, tag = check_root(comm, root), TAGS["gather"]
    agree(comm, f"gather(root={root})")
    if comm.rank != root:
        comm.send(x, dst=root, tag=tag)
        return None
    return [x.copy() if src == root else comm.recv(src, tag=tag) for src in range(comm.world_size)]


def scatter(comm, chunks: list[np.ndarray] | None, root: int = 0) -> np.ndarray:
    """chunks[r] of the root's list on rank r, a new array of that chunk's shape.

    chunks: at root, a list of P arrays (any shapes); elsewhere ignored (None is fine).
    """
    check_comm(comm)
    root, tag = check_root(comm, root), TAGS["scatter"]
    agree(comm, f"scatter(root={root})")
    if comm.rank != root:
        return comm.recv(root, tag=tag)
    if not isinstance(chunks, (list, tuple)) or len(chunks) != comm.world_size:
        raise ValueError(f"scatter: the root needs a list of {comm.world_size} arrays (one per rank)")
    for dst, chunk in enumerate(chunks):
        if dst != root:
            comm.send(check_array(chunk, f"chunks[{dst}]"), dst=dst, tag=tag)
    return check_array(chunks[root], f"chunks[{root}]").copy()


def allgather(comm, x: np.ndarray) -> list[np.ndarray]:
    """The list [x of rank 0, ..., x of rank P − 1] on every rank (P − 1 pairwise exchanges).

    x: any shape, may differ between ranks. Returns P new arrays, each of its rank's shape.
    """
    check_comm(comm)
    x = check_array(x)
    p, r, tag = comm.world_size, comm.rank, TAGS["allgather"]
    out = [None] * p
    out[r] = x.copy()
    with agreement(comm, "allgather()"):
        for k in range(1, p):  # round k: my x to rank r + k; rank r − k's x from it
            out[(r - k) % p] = comm.sendrecv(x, dst=(r + k) % p, src=(r - k) % p, sendtag=tag, recvtag=tag)
    return out


def reduce_scatter(comm, x: np.ndarray, op: str = "sum") -> np.ndarray:
    """Piece r of the reduction of all x, cut with np.array_split, on rank r (P − 1 pairwise exchanges).

    x: any shape (n elements), the same on every rank. Returns a new 1-D array, shape (split_sizes(n, P)[r],).
    """
    check_comm(comm)
    x = check_array(x)
    check_op(op, x.dtype)
    p, r, tag = comm.world_size, comm.rank, TAGS["reduce_scatter"]
    flat = flat_copy(x)
    bounds = split_offsets(flat.size, p)
    mine = flat[bounds[r]:bounds[r + 1]].copy()
    with agreement(comm, f"reduce_scatter(op={op!r}, size={x.size}, dtype={dtype_name(x.dtype)})"):
        for k in range(1, p):  # round k: piece r + k to its owner; rank r − k's copy of piece r added in
            dst = (r + k) % p
            comm.sendrecv(flat[bounds[dst]:bounds[dst + 1]], dst=dst, src=(r - k) % p, sendtag=tag,
                          recvtag=tag, out=mine, op="sum" if op == "mean" else op)
    return finish(mine, op, p, mine.shape)


def pairwise_allreduce(comm, x: np.ndarray, op: str = "sum") -> np.ndarray:
    """allreduce = reduce_scatter, then allgather of the pieces (the identity ZeRO builds on).

    x: any shape, the same shape and dtype on every rank. Returns a new array of x's shape, bitwise the same
    on every rank: each piece is reduced once, by its owner, then only copied. 2(P − 1) messages and
    2(P − 1)/P · n elements sent per rank, as the ring (summed over the ranks exactly 2(P − 1) · n for any
    n), but by direct exchanges: it is not the ring exercise, so a strategy whose own tests must not
    depend on that exercise (tensor parallelism) uses this one.
    """
    piece = reduce_scatter(comm, x, op=op)
    return np.concatenate(allgather(comm, piece)).reshape(np.shape(x))


def alltoall(comm, chunks: list[np.ndarray]) -> list[np.ndarray]:
    """out[j] = rank j's chunks[r]: every rank sends a different array to every other rank.

    chunks: a list of P arrays (any shapes). Returns a list of P new arrays.
    """
    check_comm(comm)
    p, r, tag = comm.world_size, comm.rank, TAGS["alltoall"]
    if not isinstance(chunks, (list, tuple)) or len(chunks) != p:
        raise ValueError(f"alltoall needs a list of {p} arrays (one per destination rank)")
    out = [None] * p
    out[r] = check_array(chunks[r], f"chunks[{r}]").copy()
    with agreement(comm, "alltoall()"):
        for shift in range(1, p):  # round `shift`: send to r + shift, receive from r − shift
            dst, src = (r + shift) % p, (r - shift) % p
            out[src] = comm.sendrecv(check_array(chunks[dst], f"chunks[{dst}]"), dst=dst, src=src,
                                     sendtag=tag, recvtag=tag)
    return out


def barrier(comm) -> None:
    """Return only when every rank has called barrier (the cluster's own, uncounted in the ledger)."""
    check_comm(comm)
    comm.barrier()

"""Double binary tree allreduce (NCCL's "tree" algorithm): half the array on each of two binary trees.

Sanders, Speck and Träff 2009 ("Two-tree algorithms for full bandwidth broadcast, reduction and scan");
NCCL 2.4 uses it for allreduce; the "Hardware Accelerators for Training
DNNs" tutorial's table (after Pjesivac-Grbovic) lists the double binary tree for large broadcasts and
reductions. A binomial tree (tree.py) sends the whole array over each of its root's
⌈log2 P⌉ edges; a single binary tree leaves its leaves' send links idle on the way down. Two trees fix
both: tree A and tree B, where every rank is interior (has children) in at most one of them, so every
rank forwards at most one half downwards.

Tree A is the in-order binary tree over positions 1..P: position i sits at height h = trailing zeros of
i (leaves: odd i), its children are i − h'/2 and the largest i + d ≤ P with d ≤ h'/2 (h' = 2^h), the root
is the largest power of two ≤ P. Rank of position i: i − 1 in tree A, i mod P in tree B (A shifted by
one). A's interior ranks are odd, B's are even, so no rank is interior in both. For P = 8:

    tree A (ranks)   root 7: children 3, --    3: 1, 5    1: 0, 2    5: 4, 6    leaves 0 2 4 6
    tree B (ranks)   root 0: children 4, --    4: 2, 6    2: 1, 3    6: 5, 7    leaves 1 3 5 7

The array is cut in two (np.array_split's rule): half 0 is reduced up tree A and broadcast down it, half
1 the same on tree B. Per tree: 2(P − 1) messages of its half (one reduce message up and one broadcast
message down each edge), so in all 4(P − 1) messages and 2(P − 1)·n elements — as the binomial tree, but
spread out: rank r sends (parent in A) + children in A messages of ⌈n/2⌉ and (parent in B) + children
in B of ⌊n/2⌋, at most 4 messages and 4⌈n/2⌉ ≈ 2n elements on any rank (the binomial root: ⌈log2 P⌉·n).
The steps are described in minidist.sim.collective_rounds ("double_tree") and priced there exactly.
NCCL also pipelines each half in small chunks down the trees; minidist sends each half whole (chain.py
shows pipelining). Each half is reduced once, at its root, and broadcast: the same bits on every rank.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from minidist.collectives.common import TAGS
from minidist.collectives.pieces import split_offsets


def height(position: int) -> int:
    """Height of 1-based position i in the in-order tree: the number of trailing zero bits of i."""
    return (position & -position).bit_length() - 1


def position_children(position: int, p: int) -> list[int]:
    """Children positions of ``position`` in the in-order binary tree over 1..p: [left, right] (either
    may be missing)."""
    half = (position & -position) >> 1
    if half == 0:
        return []
    right = half
    while right >= 1 and position + right > p:  # the right subtree is cut off by p: descend into it
        right >>= 1
    return [position - half] + ([position + right] if right >= 1 else [])


@lru_cache(maxsize=64)
def binary_tree(p: int, shift: int) -> tuple[tuple, tuple]:
    """(parent, children) by rank of tree A (shift 0) or tree B (shift 1) on p ranks: parent[r] is a rank
    or None (the root); children[r] a tuple of ranks, left first. Rank of position i: (i − 1 + shift) % p."""
    rank = [(i - 1 + shift) % p for i in range(p + 1)]          # rank[i] for 1-based position i
    parent, children = [None] * p, [()] * p
    for i in range(1, p + 1):
        kids = position_children(i, p)
        children[rank[i]] = tuple(rank[k] for k in kids)
        for k in kids:
            parent[rank[k]] = rank[i]
    return tuple(parent), tuple(children)


def double_tree_allreduce(comm, flat: np.ndarray, op: str = "sum") -> np.ndarray:
    """Allreduce ``flat`` in place: half 0 reduced and broadcast on tree A, half 1 on tree B.

    flat: this rank's contribution, shape (n,), contiguous; overwritten with the result. op: "sum", "max"
    or "min". Returns flat, bitwise the same on every rank. Order on each rank: reduce A, reduce B,
    broadcast A, broadcast B (sends never wait for a later phase, so no cycle of waits).
    """
    p, r, tag = comm.world_size, comm.rank, TAGS["double_tree"]
    bounds = split_offsets(flat.size, 2)
    halves = [flat[bounds[0]:bounds[1]], flat[bounds[1]:bounds[2]]]
    trees = [binary_tree(p, 0), binary_tree(p, 1)]
    for half, (parent, children) in zip(halves, trees):   # reduce: children's partial sums, then up
        for child in children[r]:
            comm.recv(child, tag=tag, out=half, op=op)
        if parent[r] is not None:
            comm.send(half, dst=parent[r], tag=tag)
    for half, (parent, children) in zip(halves, trees):   # broadcast: the total from above, then down
        if parent[r] is not None:
            comm.recv(parent[r], tag=tag, out=half)
        for child in children[r]:
            comm.send(half, dst=child, tag=tag)
    return flat

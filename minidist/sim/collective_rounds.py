"""Who sends which chunk to whom at each step of a collective: the one description of its cost.

``schedule(algorithm, P)`` lists, step by step, the transfers the code performs:

    naive, parameter_server     collectives/allreduce.py
    ring                        collectives/ring.py
    tree                        collectives/tree.py
    recursive_doubling,         collectives/halving_doubling.py
    rabenseifner
    pairwise                    collectives/primitives.py ``pairwise_allreduce`` (reduce_scatter, allgather)
    alltoall                    collectives/primitives.py ``alltoall`` (the array: the P chunks, in order)
    double_tree                 collectives/double_tree.py (chunk 0 on tree A, chunk 1 on tree B)
    van_de_geijn                collectives/van_de_geijn.py (a broadcast from rank 0: scatter, ring allgather)

A transfer moves chunks ``lo..hi-1`` of the array, cut into ``parts`` chunks with np.array_split
(``parts`` is P for ring, pairwise, alltoall and van_de_geijn, P' for Rabenseifner, 2 for double_tree, 1
for whole-array algorithms), and
either adds them into the receiver's copy (``reduce=True``) or overwrites it. The pattern does not depend
on the array's length: short arrays just send empty chunks. collective_cost.py prices a schedule on the
cluster's α-β clock; schedule_figure.py draws it (lesson 05).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from minidist.collectives.common import largest_power_of_two
from minidist.collectives.double_tree import binary_tree, height
from minidist.collectives.pieces import split_sizes
from minidist.nn.checks import check_count


@dataclass(frozen=True)
class Transfer:
    src: int
    dst: int
    lo: int  # first chunk sent
    hi: int  # one past the last chunk sent
    reduce: bool  # True: the receiver adds it in; False: the receiver overwrites its copy


@dataclass(frozen=True)
class Schedule:
    algorithm: str
    world_size: int
    parts: int  # the array is cut into this many chunks (np.array_split)
    steps: tuple  # tuple of steps, each a tuple of Transfers
    own_input: bool = False  # True (naive): messages carry the sender's input, not its running result


def _ring(p: int) -> list:
    reduce_scatter = [[Transfer(r, (r + 1) % p, (r - s - 1) % p, (r - s - 1) % p + 1, True) for r in range(p)]
                      for s in range(p - 1)]
    allgather = [[Transfer(r, (r + 1) % p, (r - s) % p, (r - s) % p + 1, False) for r in range(p)]
                 for s in range(p - 1)]
    return reduce_scatter + allgather


def _pairwise(p: int) -> list:
    reduce_scatter = [[Transfer(r, (r + k) % p, (r + k) % p, (r + k) % p + 1, True) for r in range(p)]
                      for k in range(1, p)]
    allgather = [[Transfer(r, (r + k) % p, r, r + 1, False) for r in range(p)] for k in range(1, p)]
    return reduce_scatter + allgather


def _alltoall(p: int) -> list:
    return [[Transfer(r, (r + k) % p, (r + k) % p, (r + k) % p + 1, False) for r in range(p)]
            for k in range(1, p)]


def _naive(p: int) -> list:
    return [[Transfer(r, (r + s) % p, 0, 1, True) for r in range(p)] for s in range(1, p)]


def _parameter_server(p: int) -> list:
    gather = [Transfer(w, 0, 0, 1, True) for w in range(1, p)]
    send_back = [Transfer(0, w, 0, 1, False) for w in range(1, p)]
    return [gather, send_back]


def _tree(p: int) -> list:
    lowbit = [r & -r for r in range(p)]
    steps, mask = [], 1
    while mask < p:  # reduce: ranks whose lowest set bit is `mask` send to r − mask
        steps.append([Transfer(r, r - mask, 0, 1, True) for r in range(p) if lowbit[r] == mask])
        mask <<= 1
    mask >>= 1
    while mask > 0:  # broadcast: multiples of 2·mask send to r + mask
        steps.append([Transfer(r, r + mask, 0, 1, False) for r in range(0, p, 2 * mask) if r + mask < p])
        mask >>= 1
    return steps


def _fold(p: int, parts: int) -> tuple[int, int, list, list, list]:
    """The non-power-of-two fold: (P', rem, active real ranks by new number, step in, step out)."""
    p2 = largest_power_of_two(p)
    rem = p - p2
    active = [2 * me + 1 if me < rem else me + rem for me in range(p2)]
    fold_in = [Transfer(r, r + 1, 0, parts, True) for r in range(0, 2 * rem, 2)]
    fold_out = [Transfer(r + 1, r, 0, parts, False) for r in range(0, 2 * rem, 2)]
    return p2, rem, active, fold_in, fold_out


def _recursive_doubling(p: int) -> list:
    p2, _, active, fold_in, fold_out = _fold(p, 1)
    steps = [fold_in] if fold_in else []
    distance = 1
    while distance < p2:
        steps.append([Transfer(active[me], active[me ^ distance], 0, 1, True) for me in range(p2)])
        distance <<= 1
    return steps + ([fold_out] if fold_out else [])


def _rabenseifner(p: int) -> list:
    p2, _, active, fold_in, fold_out = _fold(p, largest_power_of_two(p))
    steps = [fold_in] if fold_in else []
    ranges = [(0, p2)] * p2  # chunks each new rank is responsible for
    history = [[] for _ in range(p2)]
    distance = p2 // 2
    while distance >= 1:  # recursive halving: send the half the partner keeps
        step = []
        for me in range(p2):
            lo, hi = ranges[me]
            mid = (lo + hi) // 2
            keep, give = ((mid, hi), (lo, mid)) if me & distance else ((lo, mid), (mid, hi))
            step.append(Transfer(active[me], active[me ^ distance], *give, True))
            history[me].append(ranges[me])
            ranges[me] = keep
        steps.append(step)
        distance //= 2
    distance = 1
    while distance < p2:  # recursive doubling: send what I hold, get the partner's half back
        steps.append([Transfer(active[me], active[me ^ distance], *ranges[me], False) for me in range(p2)])
        ranges = [history[me].pop() for me in range(p2)]
        distance <<= 1
    return steps + ([fold_out] if fold_out else [])


def _double_tree(p: int) -> list:
    """Reduce A, reduce B (by height, leaves first), broadcast A, broadcast B (by height, root first): the
    order double_tree_allreduce runs them on every rank."""
    levels = range(p.bit_length())                                    # heights 0 .. ⌊log2 P⌋
    position = [[(r + 1 - shift) % p or p for r in range(p)] for shift in (0, 1)]  # rank -> position
    reduce, broadcast = [], []
    for chunk, shift in enumerate((0, 1)):
        parent, children = binary_tree(p, shift)
        for h in levels:
            reduce.append([Transfer(r, parent[r], chunk, chunk + 1, True) for r in range(p)
                           if parent[r] is not None and height(position[shift][r]) == h])
        for h in reversed(levels):
            broadcast.append([Transfer(r, c, chunk, chunk + 1, False) for r in range(p)
                              if height(position[shift][r]) == h for c in children[r]])
    return reduce + broadcast


def _van_de_geijn(p: int) -> list:
    scatter = [Transfer(0, j, j, j + 1, False) for j in range(1, p)]
    return [scatter] + _ring(p)[p - 1:]


_BUILDERS = {"naive": _naive, "parameter_server": _parameter_server, "ring": _ring, "tree": _tree,
             "recursive_doubling": _recursive_doubling, "rabenseifner": _rabenseifner,
             "pairwise": _pairwise, "alltoall": _alltoall, "double_tree": _double_tree,
             "van_de_geijn": _van_de_geijn}
COLLECTIVES = tuple(_BUILDERS)


@lru_cache(maxsize=256, typed=True)  # True is no world size (check_count), though it hashes as 1
def schedule(algorithm: str, world_size: int) -> Schedule:
    """The step-by-step transfers of ``allreduce(..., algorithm=algorithm)`` (or of ``pairwise_allreduce``,
    ``alltoall``, ``van_de_geijn_broadcast`` from rank 0: "pairwise", "alltoall", "van_de_geijn") on
    world_size ranks."""
    if algorithm not in _BUILDERS:
        raise ValueError(f"algorithm must be one of {COLLECTIVES}, got {algorithm!r}")
    check_count(world_size, "world_size")
    whole = {"rabenseifner": largest_power_of_two(world_size), "naive": 1, "parameter_server": 1, "tree": 1,
             "recursive_doubling": 1, "double_tree": 2}
    parts = whole.get(algorithm, world_size)
    steps = _BUILDERS[algorithm](world_size) if world_size > 1 else []
    return Schedule(algorithm, world_size, parts, tuple(tuple(step) for step in steps if step),
                    own_input=algorithm == "naive")


def chunk_sizes(plan: Schedule, n: int) -> np.ndarray:
    """Number of elements in each of the plan's chunks for an array of n elements: shape (parts,)."""
    return np.array(split_sizes(n, plan.parts), dtype=np.int64)

"""Diagnosing hierarchical_allreduce in its own terms: which level (reduce-scatter inside the node, the
allreduce across nodes, the allgather inside the node), which rank, which piece and element.

Rank r of P = N·G (node r // G, local index g = r % G) starts with flat[i] = i·2^P + 2^r, so a sum over a
set S of ranks reads back as a mask of S (the value mod 2^P) and i·|S|: each element says whose data it
holds and which element it was. The three steps are watched through the names hierarchical.py calls
(reduce_scatter, recursive_doubling_allreduce, allgather); a solution that calls others is judged on its
result alone.
"""

import numpy as np

import minidist.collectives.hierarchical as hierarchical
from minidist.cluster import ClusterError, Topology, run
from minidist.collectives.pieces import split_range


def hierarchical_trace(comm, n):
    """This rank's (pieces after step 1, pieces after step 2, the result) on the marked data."""
    fn = hierarchical.hierarchical_allreduce     # looked up at call time: a planted one reaches the ranks
    names = fn.__globals__                       # the module it calls its steps in
    seen = {"reduce_scatter": [], "recursive_doubling_allreduce": []}
    originals = {name: names[name] for name in seen}

    def watched(name):
        def call(*args, **kwargs):
            out = originals[name](*args, **kwargs)
            seen[name].append(np.array(out, copy=True))
            return out
        return call

    names.update({name: watched(name) for name in seen})
    try:
        p = comm.world_size
        flat = np.arange(n, dtype=np.float64) * 2.0**p + 2.0**comm.rank
        result = fn(comm, flat)
    finally:
        names.update(originals)
    return seen["reduce_scatter"], seen["recursive_doubling_allreduce"], np.array(result)


def decode(value: float, p: int) -> tuple[list[int], int | None]:
    """(the ranks whose data a marked sum holds, the element index) of one value."""
    v = int(value)
    ranks = [r for r in range(p) if v >> r & 1]
    return ranks, (v >> p) // len(ranks) if ranks and (v >> p) % len(ranks) == 0 else None


def first_wrong(values, lo: int, want_ranks: list[int], p: int) -> str | None:
    """Where values (elements lo, lo+1, ...) first hold other ranks' sums or another element."""
    for k, value in enumerate(values):
        ranks, element = decode(value, p)
        if ranks != want_ranks or element != lo + k:
            return (f"element {lo + k} should be the sum over ranks {want_ranks}; it holds {value:g}, which "
                    f"reads as the sum over ranks {ranks} of element {element}")
    return None


def diagnose_hierarchical(nodes: int, per_node: int, n: int) -> str | None:
    """The first level, rank and element at which hierarchical_allreduce goes wrong (None: all right)."""
    p = nodes * per_node
    what = f"hierarchical allreduce, {nodes} nodes × {per_node} ranks, {n} elements"
    try:
        traces = run(hierarchical_trace, p, n, link=Topology(nodes, per_node), timeout=30)
    except ClusterError as err:
        return f"{what}: the run failed: {err}"
    everyone = list(range(p))
    for r, (scattered, across, result) in enumerate(traces):
        node, g = divmod(r, per_node)
        lo, hi = split_range(n, per_node, g)
        steps = ((f"after the reduce-scatter inside node {node}", scattered,
                  list(range(node * per_node, (node + 1) * per_node))),
                 ("after the allreduce across nodes", across, everyone))
        for step, pieces, want in steps:
            if pieces and pieces[0].shape != (hi - lo,):
                return (f"{what}: {step}, rank {r} (local index {g}) holds shape {pieces[0].shape}, "
                        f"expected piece {g}: elements {lo}:{hi}")
            wrong = first_wrong(pieces[0], lo, want, p) if pieces else None
            if wrong:
                return f"{what}: {step}, rank {r} (local index {g}), piece {g}: {wrong}"
        wrong = first_wrong(result, 0, everyone, p)
        if wrong:
            return f"{what}: after the allgather inside node {node}, rank {r}: {wrong}"
    return None

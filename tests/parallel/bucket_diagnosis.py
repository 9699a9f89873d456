"""Diagnosing allreduce_bucket (data parallelism's bucketed allreduce) in its own terms: which gradient
of the bucket, which element, on which rank, and how many allreduces the bucket cost.

Rank r's gradient k holds, at flat element j, (64·k + j)·2^P + 2^r: a sum over a set S of ranks reads back
as a mask of S (the value mod 2^P) and (64·k + j)·|S|, so each element says whose data it holds and which
gradient's element it was. The bucket must cost ONE allreduce of all its elements (watched through the
name buckets.py calls), with and without the reused scratch buffer.
"""

import numpy as np

import minidist.parallel.data.buckets as buckets
from minidist.cluster import ClusterError, run

SHAPES = ((2, 3), (4,), (1, 2))


def marked(rank: int, p: int) -> list[np.ndarray]:
    """Rank ``rank``'s bucket of gradients of SHAPES, each element marked with (gradient, element, rank)."""
    return [((64 * k + np.arange(int(np.prod(s)))) * 2.0**p + 2.0**rank).reshape(s)
            for k, s in enumerate(SHAPES)]


def bucket_trace(comm, with_buffer: bool):
    """This rank's gradients after allreduce_bucket and the sizes of the allreduces it made."""
    fn = buckets.allreduce_bucket                 # looked up at call time: a planted one reaches the ranks
    names, calls = fn.__globals__, []
    original = names["allreduce"]

    def watched(comm_, x, *args, **kwargs):
        calls.append(int(np.asarray(x).size))
        return original(comm_, x, *args, **kwargs)

    grads = marked(comm.rank, comm.world_size)
    buffer = np.empty(sum(g.size for g in grads)) if with_buffer else None
    names["allreduce"] = watched
    try:
        fn(comm, grads, "ring", buffer)
    finally:
        names["allreduce"] = original
    return grads, calls


def diagnose_bucket(world: int) -> str | None:
    """The first gradient, element and rank allreduce_bucket gets wrong, or its allreduce count."""
    total = sum(int(np.prod(s)) for s in SHAPES)
    for with_buffer in (False, True):
        what = (f"allreduce_bucket over {world} ranks, gradients of shapes {list(SHAPES)}"
                f"{' with a scratch buffer' if with_buffer else ''}")
        try:
            traces = run(bucket_trace, world, with_buffer, timeout=30)
        except ClusterError as err:
            return f"{what}: the run failed: {err}"
        for r, (grads, calls) in enumerate(traces):
            if calls != [total]:
                return (f"{what}: rank {r} made allreduces of {calls} elements; the bucket should cost ONE "
                        f"allreduce of all its {total} elements (flatten, allreduce, copy back)")
            for k, got in enumerate(grads):
                for j, value in enumerate(np.asarray(got, np.float64).ravel()):
                    v = int(value)
                    ranks = [q for q in range(world) if v >> q & 1]
                    index = (v >> world) // len(ranks) if ranks else None
                    if ranks != list(range(world)) or index != 64 * k + j:
                        source = "?" if index is None else f"gradient {index // 64}'s element {index % 64}"
                        return (f"{what}: rank {r}, gradient {k} (shape {SHAPES[k]}), flat element {j}: "
                                f"should be the sum over ranks {list(range(world))} of gradient {k}'s "
                                f"element {j}; it holds {value:g}, which reads as the sum over ranks "
                                f"{ranks} of {source}")
    return None

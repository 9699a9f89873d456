"""Diagnosing DistributedSampler.indices in its own terms: which rank holds too few or too many indices,
which sample index is duplicated or missing and on which rank (and at which position) it belongs, or which
rank's position holds the wrong sample.

torch's rule, written out here: order = default_rng((seed, epoch)).permutation(N) (range(N) without
shuffle); drop_last cuts it to total = P·floor(N/P), otherwise it is padded by wrapping around to
total = P·ceil(N/P) (order[k] = order[k mod N] for k ≥ N); rank r gets order[r], order[r + P], ...
(order[r::P]).
"""

import numpy as np

#: (N, P, shuffle, drop_last, seed, epoch): by hand first, then a shuffle, its padding and a later epoch
CASES = ((10, 3, False, False, 0, 0), (10, 3, False, True, 0, 0), (7, 4, True, False, 3, 0),
         (7, 4, True, True, 3, 2), (12, 4, True, False, 1, 1), (5, 1, True, False, 0, 4),
         (2, 5, True, False, 7, 1))                                      # P > N: the padding wraps twice


def torch_order(n: int, p: int, shuffle: bool, drop_last: bool, seed: int, epoch: int) -> np.ndarray:
    """The order every rank cuts its shard from, of length total."""
    order = np.random.default_rng((seed, epoch)).permutation(n) if shuffle else np.arange(n)
    total = p * (n // p if drop_last else -(-n // p))
    return order[:total] if drop_last else np.resize(order, total)


def home(places: list[tuple[int, int]], p: int, n: int) -> str:
    """(rank, position) pairs in words, with the place in the order of each (and the padding's origin)."""
    def one(r: int, i: int) -> str:
        k = r + i * p
        return f"rank {r} position {i} (order[r + i·P] = order[{k}]" + \
            (f", the padding's copy of order[{k % n}])" if k >= n else ")")
    return ", ".join(one(r, i) for r, i in places) or "no rank (drop_last drops it)"


def diagnose_sampler(sampler_class) -> str | None:
    """The first case where sampler_class(N, P, r, ...).indices() for r < P breaks torch's rule."""
    for n, p, shuffle, drop_last, seed, epoch in CASES:
        what = (f"DistributedSampler(N={n}, P={p}, shuffle={shuffle}, drop_last={drop_last}, seed={seed}), "
                f"epoch {epoch}")
        order = torch_order(n, p, shuffle, drop_last, seed, epoch)
        source = "the permutation of default_rng((seed, epoch))" if shuffle else "range(N)"
        shards = []
        for r in range(p):
            sampler = sampler_class(n, p, r, shuffle=shuffle, seed=seed, drop_last=drop_last)
            sampler.set_epoch(epoch)
            shards.append([int(i) for i in sampler.indices()])
        per_rank = len(order) // p
        rule = f"floor(N/P) = {per_rank} (drop_last)" if drop_last else f"ceil(N/P) = {per_rank} (padded)"
        for r, shard in enumerate(shards):
            if len(shard) != per_rank:
                return f"{what}: rank {r} has {len(shard)} indices; every rank should have {rule}"
        want = {j: [(r, i) for r in range(p) for i in range(per_rank) if order[r + i * p] == j]
                for j in range(n)}
        got = {j: [(r, i) for r, shard in enumerate(shards) for i, x in enumerate(shard) if x == j]
               for j in range(n)}
        stray = [(r, i, x) for r, shard in enumerate(shards) for i, x in enumerate(shard) if not 0 <= x < n]
        if stray:
            return f"{what}: rank {stray[0][0]}, position {stray[0][1]} holds {stray[0][2]}, not in range(N)"
        for j in range(n):
            extra = [place for place in got[j] if place not in want[j]]
            lost = [place for place in want[j] if place not in got[j]]
            if len(got[j]) > len(want[j]):
                return (f"{what}: sample {j} is duplicated on {home(extra, p, n)}; it belongs on "
                        f"{home(want[j], p, n)}{' only' * bool(want[j])}")
            if len(got[j]) < len(want[j]):
                seen = f"it is only on {home(got[j], p, n)}" if got[j] else "no rank has it"
                return f"{what}: sample {j} is missing from {home(lost, p, n)}; {seen}"
        for r, shard in enumerate(shards):
            for i, x in enumerate(shard):
                k = r + i * p
                if x != order[k]:
                    return (f"{what}: {home([(r, i)], p, n)} should be sample {order[k]} of {source}; "
                            f"it is sample {x}, which belongs on {home(want[x], p, n)}")
    return None

"""The distributed sampler: which examples rank r of P reads in epoch e (torch's DistributedSampler contract).

Data parallelism splits every epoch's data across the P ranks (the "Scaling Up Training" slides, "split
the data across devices ... each device sees a fraction of the batch"). The rule, as
torch.utils.data.DistributedSampler applies it:

    order      = a permutation of range(N) drawn from (seed, epoch)     (range(N) without shuffle)
    drop_last:   total = P·floor(N/P); order = order[:total]           (the last N mod P examples skipped)
    otherwise:   total = P·ceil(N/P);  order = order + order[:total−N]  (padded by wrapping around)
    rank r     = order[r : total : P]                                   (every P-th index, from r)

so every rank gets ``total / P`` indices, the ranks' shards are disjoint and together cover every example
once (drop_last) or once plus the padding. The order is a pure function of (seed, epoch): every rank
computes the same permutation without talking to the others, and ``set_epoch(e)`` gives a new one each
epoch. (That is why it takes an integer seed and not a ``Generator``: P generators would have to be kept
in the same state on P processes.) Cost: O(N) per epoch and rank, no communication.

Beside it, for one process or a batch already drawn: ``batched`` cuts a rank's indices into batches,
``iterate_batches`` draws one epoch's mini-batches from an explicit rng, ``shard`` gives rank r of P its
contiguous piece of a batch.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from minidist.collectives.pieces import split_range
from minidist.nn.checks import check_count, check_rank


class DistributedSampler:
    """DistributedSampler(dataset_size, num_replicas, rank, *, shuffle=True, seed=0, drop_last=False).

    ``num_replicas`` is P (the world size), ``rank`` in [0, P). Iterating yields this rank's indices
    (Python ints) for the current epoch; ``set_epoch(e)`` before each epoch reshuffles, as in torch.

    Attributes:
        num_samples: indices per rank per epoch (``len(sampler)``).   total_size: P · num_samples.
    """

    def __init__(self, dataset_size: int, num_replicas: int, rank: int, *, shuffle: bool = True,
                 seed: int = 0, drop_last: bool = False):
        self.dataset_size = check_count(dataset_size, "dataset_size", 0)
        self.num_replicas = check_count(num_replicas, "num_replicas")
        self.rank = check_rank(rank, self.num_replicas)
        self.seed = check_count(seed, "seed", 0)
        if not isinstance(shuffle, bool) or not isinstance(drop_last, bool):
            raise TypeError(f"shuffle and drop_last must be True or False, got {shuffle!r}, {drop_last!r}")
        if not drop_last and self.dataset_size == 0:
            raise ValueError("an empty dataset cannot be padded to num_replicas; use drop_last=True")
        self.shuffle, self.drop_last = shuffle, drop_last
        n, p = self.dataset_size, self.num_replicas
        self.num_samples = n // p if drop_last else -(-n // p)
        self.total_size = self.num_samples * p
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Use epoch ``epoch``'s order from now on (every rank must set the same epoch)."""
        self.epoch = check_count(epoch, "epoch", 0)

    def indices(self) -> np.ndarray:
        """This rank's indices for the current epoch: int64 array of shape (num_samples,)."""
        n, p = self.dataset_size, self.num_replicas
        # BEGIN SOLUTION distributed_sampler
        # BEGIN PROMPT
        # Hint: the order is np.random.default_rng((self.seed, self.epoch)).permutation(n) (or np.arange(n)
        # without shuffle); cut it to self.total_size, or pad it by wrapping around (np.resize); then take
        # every p-th index starting at self.rank.
        # END PROMPT
        if self.shuffle:
            order = np.random.default_rng((self.seed, self.epoch)).permutation(n)
        else:
            order = np.arange(n)
        if self.drop_last:
            order = order[:self.total_size]
        else:
            order = np.resize(order, self.total_size)  # repeats from the start: the padding wraps around
        return order[self.rank:self.total_size:p].astype(np.int64)
        # END SOLUTION

    def state_dict(self) -> dict:
        """{"epoch", "seed", "dataset_size", "num_replicas", "shuffle", "drop_last"}: JSON. No generator
        state: the order is a pure function of (seed, epoch), so these numbers are all of it."""
        return {"epoch": self.epoch, "seed": self.seed, "dataset_size": self.dataset_size,
                "num_replicas": self.num_replicas, "shuffle": self.shuffle, "drop_last": self.drop_last}

    def load_state_dict(self, state: dict) -> None:
        """Go on from ``state`` (state_dict's): its epoch. ValueError, before anything changes, when it is
        of another split (seed, dataset_size, num_replicas, shuffle or drop_last differ)."""
        mine = self.state_dict()
        if not isinstance(state, dict) or set(state) != set(mine):
            raise ValueError(f"sampler state must be a dict with keys {sorted(mine)}, got {state!r}")
        for key in ("seed", "dataset_size", "num_replicas", "shuffle", "drop_last"):
            if state[key] != mine[key]:
                raise ValueError(f"sampler state is of another split: {key} = {state[key]!r}, this "
                                 f"sampler's is {mine[key]!r}")
        self.set_epoch(state["epoch"])

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices().tolist())

    def __len__(self) -> int:
        return self.num_samples


def batched(indices: np.ndarray, batch_size: int, drop_last: bool = False) -> list[np.ndarray]:
    """Cut a rank's indices (shape (n,)) into consecutive batches of ``batch_size`` (the last may be short,
    or dropped with ``drop_last``): the batches a loader then fetches."""
    batch_size = check_count(batch_size, "batch_size")
    indices = np.asarray(indices)
    stop = len(indices) - len(indices) % batch_size if drop_last else len(indices)
    return [indices[i:i + batch_size] for i in range(0, stop, batch_size)]


def iterate_batches(n: int, batch_size: int, rng: np.random.Generator | None, shuffle: bool = True,
                    drop_last: bool = False) -> Iterator[np.ndarray]:
    """Index arrays of mini-batches over range(n), shuffled by ``rng`` (one epoch).

    Use as ``for idx in iterate_batches(len(x), 64, rng): xb, yb = x[idx], y[idx]``.
    """
    n, batch_size = check_count(n, "n", 0), check_count(batch_size, "batch_size")
    if shuffle and rng is None:
        raise ValueError("iterate_batches(shuffle=True) needs an explicit rng")
    order = rng.permutation(n) if shuffle else np.arange(n)
    stop = n - n % batch_size if drop_last else n
    for start in range(0, stop, batch_size):
        yield order[start:start + batch_size]


def shard(indices: np.ndarray, rank: int, world_size: int) -> np.ndarray:
    """Rank ``rank``'s contiguous piece of ``indices`` (shape (n, ...)): collectives.pieces's rule, as
    np.array_split cuts it into world_size pieces.

    Pieces differ in length by at most one; when world_size > len(indices) some pieces are empty.
    """
    check_rank(rank, check_count(world_size, "shard world_size"), "shard rank")
    lo, hi = split_range(len(indices), world_size, rank)
    return np.asarray(indices)[lo:hi]

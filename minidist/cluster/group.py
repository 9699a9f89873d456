"""A group of ranks and how its members agree: ``barrier``, ``all_equal`` and the exchange behind ``split``.

``Group`` is the part of the Communicator that knows who is in it (``rank``, ``world_size``, the world
ranks behind them, the communicator's id) and the three operations with which all its ranks agree on
something. Their messages are the communicator's own kinds (BARRIER, AGREE, SPLIT), never counted in
``comm.stats``, and set aside if they arrive while the rank waits for another kind.

``barrier`` and ``all_equal`` use the dissemination pattern: in round k each rank sends to rank + 2^k
and receives from rank − 2^k, so after ceil(log2 P) rounds every rank has heard, directly or not, from
every other. ``split`` is an all-to-all of (color, key) triples: every rank can then compute the same
new groups on its own.
"""

from __future__ import annotations

import hashlib

import numpy as np

from .ledger import Ledger
from .mailbox import Endpoint
from .messages import read_message, send_message, wait_for_header

USER, BARRIER, SPLIT, AGREE = 0, 1, 2, 3   # message kinds: only USER messages are counted in stats


class Group:
    """The ranks of a communicator: ``rank`` (0..world_size-1) of this process, ``world_size``."""

    def __init__(self, endpoint: Endpoint, ledger: Ledger, ranks: list[int], comm_id: int = 0):
        self._ep, self._ledger, self._ranks, self._id = endpoint, ledger, list(ranks), comm_id
        self.rank = self._ranks.index(endpoint.rank)
        self.world_size = len(self._ranks)
        self._splits = 0

    def barrier(self) -> None:
        """Return once every rank of this communicator has called barrier (log2 P rounds).

        Not counted in stats; on the simulated clock every rank jumps to the latest clock (an ideal
        barrier).
        """
        latest = self._ledger.clock
        step = 1
        while step < self.world_size:
            self._control_send(np.empty(0, np.uint8), (self.rank + step) % self.world_size, BARRIER, latest)
            meta = self._control_recv((self.rank - step) % self.world_size, BARRIER)[0]
            latest = max(latest, meta.arrival)
            step *= 2
        self._ledger.record("barrier", latest, "barrier")

    def all_equal(self, value: int) -> bool:
        """value: an int (int64). Returns True on every rank if every rank passed the same value, else
        False on every rank.

        In each round a rank passes on the smallest and the largest value it has seen. The collectives
        use it to check that all ranks made the same call. Not counted in stats, and the simulated clock
        does not move: a check, not communication the model charges.
        """
        low = high = int(value)
        step = 1
        while step < self.world_size:
            self._control_send(np.array([low, high], dtype=np.int64), (self.rank + step) % self.world_size,
                               AGREE, self._ledger.clock)
            theirs = self._control_recv((self.rank - step) % self.world_size, AGREE)[1]
            other_low, other_high = theirs.tolist()
            low, high = min(low, other_low), max(high, other_high)
            step *= 2
        return low == high

    def _split_members(self, color: int | None, key: int | None) -> tuple[list[int], int] | None:
        """The exchange of ``split``: (world ranks of this rank's new group in new-rank order, the new
        communicator's id), or None for ``color=None``. Every rank must call it."""
        if color is not None and not isinstance(color, (int, np.integer)):
            raise TypeError(f"split expects an int color or None, got {type(color).__name__}")
        key = self.rank if key is None else key
        mine = np.array([-1 if color is None else 0, 0 if color is None else color, key], dtype=np.int64)
        everyone = {self.rank: mine}
        for peer in range(self.world_size):
            if peer != self.rank:
                self._control_send(mine, peer, SPLIT, self._ledger.clock)
        for peer in range(self.world_size):
            if peer != self.rank:
                everyone[peer] = self._control_recv(peer, SPLIT)[1]
        self._splits += 1
        if color is None:
            return None
        members = sorted((int(v[2]), r) for r, v in everyone.items() if v[0] == 0 and v[1] == color)
        digest = hashlib.blake2b(repr((self._id, self._splits, int(color))).encode(), digest_size=8)
        comm_id = int.from_bytes(digest.digest(), "little") >> 1     # fits a signed int64 too
        return [self._ranks[r] for _, r in members], comm_id

    def _control_send(self, data: np.ndarray, dst: int, kind: int, stamp: float) -> None:
        """Send one of the communicator's own messages (not counted, no clock charge) to rank ``dst``."""
        send_message(self._ep, self._ranks[dst], data, self._id, 0, kind, 0, stamp, wait_tag=-kind)

    def _control_recv(self, src: int, kind: int):
        """Receive the next message of ``kind`` from rank ``src``: (its header, a new array)."""
        world_src = self._ranks[src]
        meta, incoming = wait_for_header(self._ep, world_src, self._id, kind, -kind)
        data = np.empty(meta.shape, meta.dtype)
        read_message(self._ep, world_src, meta, incoming, data, wait_tag=-kind)
        return meta, data

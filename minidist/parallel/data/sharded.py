"""What ZeRO (stages 1-2, zero.py) and FSDP (stage 3, fsdp.py) share once their shards exist: the bytes a
rank holds, the memory ledger's points, the fp32 masters, Ψ_r and the optimizer state of its shards.

A subclass sets ``comm``, ``model``, ``optimizer``, ``groups`` (flat.ShardGroup list), ``mixed`` and
``memory`` (a MemoryLedger or None).
"""

from __future__ import annotations

import numpy as np

from minidist.memory import held_bytes, record

from . import flat
from .zero_mixed import gather_masters, held_arguments


class ShardedWrapper:
    """The bookkeeping common to every ZeRO stage (not a wrapper on its own: see ZeRO and FSDP)."""

    def held(self) -> dict[str, int]:
        """Bytes this rank holds now, by category (minidist.memory.held_bytes; fp32 masters: optimizer)."""
        return held_bytes(self.model, self.optimizer, **held_arguments(self))

    def _record(self, label: str) -> None:
        record(self.memory, label, self.model, self.optimizer, **held_arguments(self), time=self.comm.clock)

    def master_parameters(self) -> list[np.ndarray]:
        """Mixed precision: the full fp32 masters in model.parameters() order (a collective)."""
        return gather_masters(self.comm, self.groups, self.model.parameters())

    def shard_elements(self) -> int:
        """Ψ_r: the elements of this rank's shards (Σ over groups of split_sizes(n, P)[rank])."""
        return sum(g.hi - g.lo for g in self.groups)

    def state_dict(self) -> dict:
        """This rank's optimizer state (its shards), tagged with P, rank and stage."""
        return flat.state_dict(self)

    def load_state_dict(self, state: dict) -> None:
        """Restore ``state_dict()`` of the same rank of a run with the same P and stage (else ValueError)."""
        flat.load_state_dict(self, state)

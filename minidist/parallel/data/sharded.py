"""What ZeRO (stages 1-2, zero.py) and FSDP (stage 3, fsdp.py) share once their shards exist: the bytes a
rank holds, the memory ledger's points, the fp32 masters, Ψ_r and the optimizer state of its shards.

A subclass sets ``comm``, ``model``, ``optimizer``, ``groups`` (flat.ShardGroup list), ``mixed`` (the
user's argument), ``precision`` (``zero_mixed.check_mixed(mixed)``) and
``memory`` (a MemoryLedger or None), ``loss_fn``.
"""

from __future__ import annotations

import numpy as np

from minidist.memory import held_bytes
from minidist.nn.runner import Attachment, StepRunner
from minidist.parallel.clock import ComputeClock
from minidist.parallel.memory import MemoryRecorder

from . import flat
from .shards import ShardWeightedLoss, shard_range
from .zero_mixed import gather_masters


class ShardedWrapper(Attachment):
    """The bookkeeping common to every ZeRO stage (not a wrapper on its own: see ZeRO and FSDP), and the
    step runner they attach to: [the wrapper, the memory recorder (it sees a layer's gathered parameters
    or full gradient before the wrapper frees them), the compute clock (no overlap), the precision]."""

    def _attach(self, forward_points: dict[int, str], backward_points: dict[int, str]) -> None:
        """Build the runner; the memory recorder records after the layers of these {index: label}."""
        self.clock = ComputeClock(self.comm, overlap=False)
        self.recorder = MemoryRecorder(self.memory, self.held, self.comm, forward_points=forward_points,
                                       backward_points=backward_points)
        self.runner = StepRunner(self.model, self.loss_fn, [self, self.recorder, self.clock, self.precision])

    def _forward_backward(self, x: np.ndarray, y: np.ndarray) -> float:
        """Forward and backward of this rank's shard of the global batch (x, y) through the runner."""
        lo, hi, self.runner.loss_fn = self._my_shard(x, y)
        return self.runner.forward_backward(x[lo:hi], y[lo:hi])

    @property
    def compute_spans(self) -> list:
        """The compute stream's spans on the simulated clock (forward and backward of each layer)."""
        return self.clock.spans

    def _my_shard(self, x: np.ndarray, y: np.ndarray) -> tuple[int, int, ShardWeightedLoss]:
        """[lo, hi) of this rank's shard of the global batch (x, y) and the loss weighted by (hi − lo)/B."""
        lo, hi = shard_range(self.comm, x, y)
        return lo, hi, ShardWeightedLoss(self.loss_fn, (hi - lo) / len(x))

    def held(self) -> dict[str, int]:
        """Bytes this rank holds now, by category (minidist.memory.held_bytes; fp32 masters: optimizer)."""
        return held_bytes(self.model, self.optimizer, **self.precision.held(self.groups))

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

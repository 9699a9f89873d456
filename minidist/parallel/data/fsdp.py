"""ZeRO stage 3 / fully sharded data parallelism (FSDP): the parameters are sharded too.

Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models" (stage 3,
P_os+g+p); PyTorch's FullyShardedDataParallel with one unit per layer. Each rank keeps only its piece of
every layer's flat parameter vector (flat.py), with the gradient and optimizer state of that piece:

    forward, layer l:   allgather W_l, y = layer(x), free W_l
    backward, layer l:  allgather W_l again, dx, dW_l = layer.backward(dy), free W_l,
                        reduce-scatter dW_l -> this rank's piece of the summed gradient, free dW_l
    step:               the optimizer updates the shards only (no allgather: the next forward gathers)

Memory per rank: (b + b + K) Ψ_r, plus while layer l runs its gathered parameters b Ψ_l (forward) or its
gathered parameters and full gradient 2 b Ψ_l (backward). Bytes sent per rank and step: two allgathers
and one reduce-scatter of every layer, 3(P − 1)/P · bΨ when P divides every layer (1.5x ZeRO-1/2).
Between steps the model's Parameters hold no data (None); ``full_parameters()`` gathers them.

    fsdp = FSDP(comm, model, lambda shards: Adam(shards, lr=1e-3), CrossEntropyLoss())
    loss = fsdp.train_step(x, y)
"""

from __future__ import annotations

import numpy as np

from .sharded import ShardedWrapper
from .zero_mixed import ShardedMixedPrecision


class FSDP(ShardedWrapper):
    """ZeRO stage 3 over the ranks of ``comm``; one shard group per layer with parameters.

    Args: as ZeRO (zero.py) without stage and bucket_bytes: comm, model, make_optimizer (a function
    [Parameter] -> optimizer, called with this rank's shards), loss_fn, memory (a MemoryLedger or None),
    mixed (a ShardedMixedPrecision: each rank keeps a low-precision shard ``g.low``, gathered before use,
    and the fp32 master shard ``g.shard`` the optimizer updates).
    """

    stage = 3

    def __init__(self, comm, model, make_optimizer, loss_fn, *, algorithm: str = "ring", memory=None,
                 mixed: ShardedMixedPrecision | None = None):
        super().__init__(comm, model, make_optimizer, loss_fn, algorithm, memory, mixed)
        with_params = [i for i, layer in enumerate(self.layers) if layer.parameters()]
        self._attach(make_optimizer, {i: f"forward layer {i} (gathered)" for i in with_params},
                     {i: f"backward layer {i} (gathered)" for i in with_params})

    # -- one global batch ------------------------------------------------------------------------------------
    def train_step(self, x: np.ndarray, y: np.ndarray) -> float:
        """Forward and backward on this rank's shard of the global batch, layer by layer with gathered
        parameters (the sync gathers before a layer runs and frees after, zero_sync.py), then the optimizer on
        the shards.

        x: the global batch (B, ...), the same on every rank, P <= B; y: its targets (B, ...).
        Returns this rank's mean loss over its shard.
        """
        loss = self._forward_backward(x, y)
        self._update()
        return loss

    # -- what a rank holds -----------------------------------------------------------------------------------
    def full_parameters(self) -> list[np.ndarray]:
        """The full parameters in model.parameters() order, gathered (a collective: every rank calls it;
        its bytes count in comm.stats). The model's Parameters stay freed."""
        return self._gather_full(lambda g: g.low)

    def largest_layer(self) -> int:
        """max_l Ψ_l: elements of the largest layer, gathered whole while it runs."""
        return max(g.n for g in self.groups)

    def bytes_per_step(self, applied: bool = True) -> int:
        """Bytes this rank sends per step: two allgathers and one reduce-scatter of every layer (flat.py);
        with mixed precision also the found_inf flag (applied: no difference, nothing is gathered
        at the step)."""
        return self._bytes_sent(allgathers=2)

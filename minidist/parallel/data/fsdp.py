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

from minidist.collectives import allgather, reduce_scatter
from minidist.nn.module import Parameter

from . import flat
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
        p, r = comm.world_size, comm.rank
        self.group_of: list[flat.ShardGroup | None] = []
        for layer in self.layers:
            params = layer.parameters()
            self.group_of.append(flat.ShardGroup(params, r, p) if params else None)
        self.groups = [g for g in self.group_of if g is not None]
        for g in self.groups:
            g.shard = Parameter(g.data[g.lo:g.hi].copy())     # this rank's piece
        self.optimizer = self._build_optimizer(make_optimizer)
        for g in self.groups:                                  # only now let the rest go
            g.free_data()
            g.free_grad()
        self.share_masters()
        with_params = [i for i, g in enumerate(self.group_of) if g is not None]
        self._attach({i: f"forward layer {i} (gathered)" for i in with_params},
                     {i: f"backward layer {i} (gathered)" for i in with_params})
        self.applied = True                            # did the last step update (False: skipped, Inf/NaN)?

    def share_masters(self) -> None:
        """Each rank's working shard g.low, the one gathered before use (local): the shard itself, or with
        mixed precision its low-precision copy quantize(master shard, fmt)."""
        for g in self.groups:
            g.low = self.precision.working(g.shard.data)

    def _gather(self, g: flat.ShardGroup) -> None:
        g.bind_data(np.concatenate(allgather(self.comm, g.low)))

    # -- one global batch ------------------------------------------------------------------------------------
    def train_step(self, x: np.ndarray, y: np.ndarray) -> float:
        """Forward and backward on this rank's shard of the global batch, layer by layer with gathered
        parameters, then the optimizer on the shards.

        x: the global batch (B, ...), the same on every rank, P <= B; y: its targets (B, ...).
        Returns this rank's mean loss over its shard.
        """
        loss = self._forward_backward(x, y)
        self._update()
        self.recorder.record("after step")
        return loss

    # -- the runner's events: gather a layer before it runs, free it after -----------------------------------
    def before_forward(self, i, layer, x):
        if self.group_of[i] is not None:
            self._gather(self.group_of[i])
        return x

    def after_forward(self, i, layer, y):
        if self.group_of[i] is not None:
            self.group_of[i].free_data()
        return y

    def before_backward(self, i, layer, dy):
        g = self.group_of[i]
        if g is not None:
            self._gather(g)
            g.bind_grad(np.zeros(g.n, dtype=g.dtype))
        return dy

    def after_backward(self, i, layer, dx):
        g = self.group_of[i]
        if g is not None:
            g.free_data()
            g.shard.grad = reduce_scatter(self.comm, g.grad)   # piece r of Σ_ranks dW_l
            g.free_grad()
        return dx

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

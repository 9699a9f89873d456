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
from minidist.memory import held_bytes, record
from minidist.nn.module import Parameter

from . import flat
from .shards import ShardWeightedLoss, charge_forward, shard_bounds


class FSDP:
    """ZeRO stage 3 over the ranks of ``comm``; one shard group per layer with parameters.

    Args: as ZeRO (zero.py) without stage and bucket_bytes: comm, model, make_optimizer (a function
    [Parameter] -> optimizer, called with this rank's shards), loss_fn, memory (a MemoryLedger or None).
    """

    stage = 3

    def __init__(self, comm, model, make_optimizer, loss_fn, *, algorithm: str = "ring", memory=None):
        self.layers = flat.check_wrapper_inputs(comm, model, make_optimizer, loss_fn)
        flat.check_algorithm(algorithm)
        self.comm, self.model, self.loss_fn, self.memory = comm, model, loss_fn, memory
        p, r = comm.world_size, comm.rank
        self.group_of: list[flat.ShardGroup | None] = []
        for layer in self.layers:
            params = layer.parameters()
            self.group_of.append(flat.ShardGroup(params, r, p) if params else None)
        self.groups = [g for g in self.group_of if g is not None]
        for g in self.groups:
            g.shard = Parameter(g.data[g.lo:g.hi].copy())     # this rank's piece
        self.optimizer = flat.build_optimizer(make_optimizer, [g.shard for g in self.groups])
        for g in self.groups:                                  # only now let the rest go
            g.free_data()
            g.free_grad()
        self.compute_spans: list = []

    def _gather(self, g: flat.ShardGroup) -> None:
        g.bind_data(np.concatenate(allgather(self.comm, g.shard.data)))

    # -- one global batch ------------------------------------------------------------------------------------
    def train_step(self, x: np.ndarray, y: np.ndarray) -> float:
        """Forward and backward on this rank's shard of the global batch, layer by layer with gathered
        parameters, then the optimizer on the shards.

        x: the global batch (B, ...), the same on every rank, P <= B; y: its targets (B, ...).
        Returns this rank's mean loss over its shard.
        """
        if not (isinstance(x, np.ndarray) and isinstance(y, np.ndarray)) or x.ndim < 1 or len(x) != len(y):
            raise ValueError("expected arrays x and y with the same first (batch) dimension")
        if len(x) < self.comm.world_size:
            raise ValueError(f"a global batch of {len(x)} examples cannot be split over {self.comm.world_size} ranks")
        lo, hi = shard_bounds(len(x), self.comm.world_size, self.comm.rank)
        loss_fn = ShardWeightedLoss(self.loss_fn, (hi - lo) / len(x))
        h, times = x[lo:hi], []
        for i, (layer, g) in enumerate(zip(self.layers, self.group_of)):
            if g is not None:
                self._gather(g)
            shape, h = h.shape, layer.forward(h)
            times += charge_forward(self.comm, [layer], [shape], self.compute_spans)
            if g is not None:
                self._record(f"forward layer {i} (gathered)")
                g.free_data()
        loss = loss_fn.forward(h, y[lo:hi])
        self._record("after forward")
        dy = loss_fn.backward()
        for i in reversed(range(len(self.layers))):
            g = self.group_of[i]
            if g is not None:
                self._gather(g)
                g.bind_grad(np.zeros(g.n, dtype=g.dtype))
            dy = self.layers[i].backward(dy)
            self.comm.elapse(2 * times[i], label=f"backward {type(self.layers[i]).__name__}")
            if g is not None:
                self._record(f"backward layer {i} (gathered)")
                g.free_data()
                g.shard.grad = reduce_scatter(self.comm, g.grad)   # piece r of Σ_ranks dW_l
                g.free_grad()
        self._record("after backward")
        self.optimizer.step()
        self._record("after step")
        return loss

    # -- what a rank holds ------------------------------------------------------------------------------------
    def held(self) -> dict[str, int]:
        """Bytes this rank holds now, by category (minidist.memory.held_bytes)."""
        return held_bytes(self.model, self.optimizer, parameters=[g.shard for g in self.groups])

    def _record(self, label: str) -> None:
        record(self.memory, label, self.model, self.optimizer, parameters=[g.shard for g in self.groups],
               time=self.comm.clock)

    def full_parameters(self) -> list[np.ndarray]:
        """The full parameters in model.parameters() order, gathered (a collective: every rank calls it;
        its bytes count in comm.stats). The model's Parameters stay freed."""
        out = []
        for g in self.groups:
            full = np.concatenate(allgather(self.comm, g.shard.data))
            out += [view.copy() for view in g.views(full)]
        return out

    def shard_elements(self) -> int:
        """Ψ_r: the elements of this rank's shards (Σ over layers of split_sizes(Ψ_l, P)[rank])."""
        return sum(g.hi - g.lo for g in self.groups)

    def largest_layer(self) -> int:
        """max_l Ψ_l: elements of the largest layer, gathered whole while it runs."""
        return max(g.n for g in self.groups)

    def bytes_per_step(self) -> int:
        """Bytes this rank sends per step: two allgathers and one reduce-scatter of every layer (flat.py)."""
        p, r = self.comm.world_size, self.comm.rank
        return sum(2 * flat.send_bytes(g.n, p, r, g.dtype.itemsize, "allgather")
                   + flat.send_bytes(g.n, p, r, g.dtype.itemsize, "reduce_scatter") for g in self.groups)

    def state_dict(self) -> dict:
        """This rank's optimizer state (its shards), tagged with P, rank and stage."""
        return flat.state_dict(self)

    def load_state_dict(self, state: dict) -> None:
        """Restore ``state_dict()`` of the same rank of a run with the same P and stage (else ValueError)."""
        flat.load_state_dict(self, state)

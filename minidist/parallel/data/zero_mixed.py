"""ZeRO with mixed precision: low-precision parameters and gradients, fp32 master weights only per shard.

Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models" (mixed-precision
Adam: fp16 parameters and gradients, 2Ψ + 2Ψ bytes; fp32 master weights, momentum and variance, K = 12
bytes per parameter, sharded: KΨ/P); the recipe of MixedPrecisionTrainer (minidist.precision.mixed), step
for step, with the update done per shard:

    forward/backward   on the low-precision parameters; activations quantized to fmt, gradients to grad_fmt
    reduce-scatter     the scaled gradients; the piece arrives in grad_fmt (as DataParallel rounds its sum)
    unscale            piece /= s; found_inf on this piece -> allreduce(max) so every rank agrees
    step (unless Inf)  the optimizer updates the fp32 master shard; masters rounded to master_fmt
    share              quantize(master shard, fmt), allgathered into the low-precision parameters

Emulation: a low-precision value is stored in a float32 array (as everywhere in minidist), so the ledger
counts it at 4 bytes, not 2. Measured model states per rank (b = 4 here, Ψ_r = this rank's shard):

    ZeRO-1  bΨ + bΨ + (4 + K')Ψ_r    ZeRO-2  bΨ + (b + 4 + K')Ψ_r    ZeRO-3  (b + b + 4 + K')Ψ_r
with K' the optimizer's own state (Adam 8): K = 4 + K' = 12 (the master shards count as "optimizer"
state) — the paper's with 2 replaced by b = 4.

    zero = ZeRO(comm, model, make_adam, loss_fn, stage=2, mixed=ShardedMixedPrecision(FP16))
"""

from __future__ import annotations

import numpy as np

from minidist.collectives import allreduce
from minidist.collectives.pieces import split_sizes
from minidist.nn.runner import Attachment
from minidist.precision import FP32, quantize
from minidist.precision.mixed import MixedPrecisionTrainer, Recipe, boundaries


class ShardedMixedPrecision(Recipe):
    """The mixed-precision recipe of a sharded wrapper (ZeRO stages 1-3).

    Args:
        fmt: format of parameters and activations in forward/backward (FP16, BF16, ...).
        grad_fmt: format of gradients (default: fmt).
        scaler: StaticLossScaler / DynamicLossScaler (default DynamicLossScaler()); one per wrapper.
        master_fmt: format the fp32 masters are rounded to (nearest) after each update (FP32: none).
    """

    def __init__(self, fmt, *, grad_fmt=None, scaler=None, master_fmt=FP32):
        super().__init__(fmt, grad_fmt, scaler, master_fmt)
        self.bound = False

    def bind(self, model, params) -> None:
        """Check the model (float32 parameters), find MixedPrecisionTrainer's layer boundaries; once."""
        if self.bound:
            raise ValueError("this ShardedMixedPrecision (and its loss scaler) already serves another "
                             "wrapper; make one per wrapper")
        dtypes = {p.data.dtype for p in params}
        if dtypes != {np.dtype(np.float32)}:
            raise TypeError("mixed precision keeps fp32 masters: the model's parameters must be float32, got "
                            f"{sorted(str(d) for d in dtypes)}")
        self.starts, self.ends = boundaries(model)
        self.bound = True

    # -- forward and backward in low precision: the step runner's events (unit i of the wrapper) -------------
    keeps_masters = True          # a wrapper's state_dict holds the fp32 master shards

    def master(self, piece: np.ndarray) -> np.ndarray:
        """The fp32 master shard of a piece of the flat parameters: a copy (the parameters go low)."""
        return piece.copy()

    def working(self, master: np.ndarray) -> np.ndarray:
        """The low-precision copy of fp32 values: quantize(master, fmt, saturate=True), float32."""
        return quantize(master, self.fmt, saturate=True)

    def begin(self, runner) -> None:
        self._errors = np.seterr(over="ignore", invalid="ignore")   # Inf/NaN expected: the step is skipped

    # before_forward, after_forward: Recipe's (the input and each top-level layer's output in fmt)

    after_loss = MixedPrecisionTrainer.after_loss           # dL/dlogits · s in grad_fmt

    def after_backward(self, i, layer, dx):
        """Layer i's dW leave in grad_fmt (in place); dx too if i starts a top-level layer."""
        for p in layer.parameters():
            p.grad[...] = quantize(p.grad, self.grad_fmt)
        return quantize(dx, self.grad_fmt) if dx is not None and i in self.starts else dx

    def end(self) -> None:
        np.seterr(**self._errors)

    # -- the sharded update ----------------------------------------------------------------------------------
    def step(self, comm, masters, optimizer) -> bool:
        """masters: the fp32 master shards, .grad this rank's piece of the summed scaled gradient; the
        module docstring's unscale and step. Returns True if the update was applied."""
        with np.errstate(over="ignore", invalid="ignore"):
            found_inf = self._agree([m.grad for m in masters],
                                    lambda flag: allreduce(comm, flag, op="max", algorithm="ring"))
        return self._apply(found_inf, optimizer, [m.data for m in masters])

    def flag_bytes(self, world_size: int, rank: int) -> int:
        """Bytes rank sends in the ring allreduce of the one-element float64 found_inf flag: its
        reduce-scatter sends every chunk but its own, its allgather every chunk but its right neighbour's."""
        sizes = split_sizes(1, world_size)
        return 8 * (1 - sizes[rank]) + 8 * (1 - sizes[(rank + 1) % world_size])

    def held(self, groups) -> dict:
        """held_bytes keywords: the fp32 master shards are optimizer state (the paper's K), their .grad
        gradients, stage 3's low-precision shards (``g.low``) parameters."""
        shards = [g.shard for g in groups]
        return {"extra": {"parameters": [getattr(g, "low", None) for g in groups],
                          "gradients": [s.grad for s in shards], "optimizer": [s.data for s in shards]}}

    def save(self, groups) -> dict:
        """A wrapper's state_dict entries: the fp32 master shards and the scaler's scale and clean steps."""
        return {"mixed": {"masters": [g.shard.data.copy() for g in groups], "scale": self.scaler.scale,
                          "clean_steps": getattr(self.scaler, "clean_steps", 0)}}

    def restore(self, state: dict, wrapper) -> None:
        """Load ``save``'s entries; the low-precision parameters follow (``share_masters``, a collective)."""
        mixed = state["mixed"]
        for g, master in zip(wrapper.groups, mixed["masters"]):
            g.shard.data[...] = master
        self.scaler.scale = float(mixed["scale"])
        if hasattr(self.scaler, "clean_steps"):
            self.scaler.clean_steps = int(mixed["clean_steps"])
        wrapper.share_masters()


class ShardedFullPrecision(Attachment):
    """Plain precision for a sharded wrapper, with ShardedMixedPrecision's interface (as FullPrecision is
    MixedPrecisionTrainer's for DataParallel): any dtype trains in its own precision; the shard the
    optimizer updates (master) and the values forward and backward use (working) are the piece itself, a
    view of the flat parameters; the optimizer always steps; no flag is sent; nothing beyond the
    optimizer's state is saved."""

    keeps_masters = False

    def bind(self, model, params) -> None:
        pass

    def master(self, piece: np.ndarray) -> np.ndarray:
        return piece

    def working(self, master: np.ndarray) -> np.ndarray:
        return master

    def step(self, comm, masters, optimizer) -> bool:
        optimizer.step()
        return True

    def flag_bytes(self, world_size: int, rank: int) -> int:
        return 0

    def held(self, groups) -> dict:
        """held_bytes keywords: the shards are parameters (data) and gradients."""
        return {"parameters": [g.shard for g in groups]}

    def save(self, groups) -> dict:
        return {}

    def restore(self, state: dict, wrapper) -> None:
        pass


def check_mixed(mixed) -> ShardedMixedPrecision | ShardedFullPrecision:
    """The precision attachment of a sharded wrapper: ``mixed`` itself, or ShardedFullPrecision() for None."""
    if mixed is None:                      # the default argument: plain precision
        return ShardedFullPrecision()
    if not isinstance(mixed, ShardedMixedPrecision):
        raise TypeError("mixed must be a ShardedMixedPrecision(fmt, grad_fmt=..., scaler=...) (the sharded "
                        f"wrappers build the optimizer on fp32 master shards), got {type(mixed).__name__}")
    return mixed

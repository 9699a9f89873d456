"""Data parallelism with compressed gradients: every worker sends its compressed message to all others.

Sparse or 1-bit messages cannot be added on the way, as a ring allreduce adds dense chunks, so the
workers exchange them whole (an allgather: every message travels P − 1 hops) and each decodes and sums
them in rank order — every rank ends with bitwise the same sum and applies the same step:

    w ← w − lr · Σ_r decode(message_r)      message_r = compressor_r.compress(g_r),  g_r = Σ_{i∈r} ∇ℓ_i / B

Bytes sent per rank and step: (P − 1) · |message|. ``Dense`` (codecs.py) sends the float gradient
itself the same way, so the ratio of bytes per step is the ratio of message sizes (32x for 1-bit,
1 / (2·density) for top-k with float32 values and int32 indices). Against a ring allreduce of the dense
gradient, which sends 2(P − 1)/P · 4n bytes, the saving is P/2 times smaller. Sources: Seide et al.,
"1-Bit Stochastic Gradient Descent ..."; Lin et al., "Deep Gradient Compression ..."; the "Scaling Deep
Learning" slides.
"""

from __future__ import annotations

import numpy as np

from minidist.collectives import allgather
from minidist.nn.flat import flatten, unflatten
from minidist.nn.runner import Attachment, StepRunner
from minidist.parallel.shards import check_trainer, shard_range

from .codecs import Dense
from .error_feedback import ErrorFeedback


class CompressedDataParallel(Attachment):
    """Synchronous data parallelism whose gradients travel compressed.

    Args:
        comm: the Communicator; model, optimizer, loss_fn: as for DataParallel (replicas start identical).
        compressor: has ``compress(flat_grad) -> uint8 message`` and ``decode(message) -> (n,)``, e.g.
            ErrorFeedback(OneBit(...)), ErrorFeedback(TopK(...), enabled=False), DGC(...);
            None sends the dense gradient.
    """

    def __init__(self, comm, model, optimizer, loss_fn, compressor=None):
        self.params = check_trainer(comm, model, loss_fn)
        self.n = sum(p.size for p in self.params)
        self.dtype = self.params[0].data.dtype
        if compressor is None:
            compressor = ErrorFeedback(Dense(self.n, self.dtype), enabled=False)
        if not (callable(getattr(compressor, "compress", None))
                and callable(getattr(compressor, "decode", None))):
            raise TypeError(f"compressor needs compress() and decode(), got {type(compressor).__name__}")
        if getattr(compressor, "n", self.n) != self.n:
            raise ValueError(f"the compressor is built for {compressor.n} entries, the model has {self.n}")
        self.comm, self.model, self.optimizer, self.loss_fn = comm, model, optimizer, loss_fn
        self.compressor = compressor
        self.bytes_per_step: list[int] = []
        self.runner = StepRunner(model, loss_fn, [self])

    def train_step(self, x: np.ndarray, y: np.ndarray) -> float:
        """One step on the global batch (x, y), the same on every rank; returns this rank's shard loss."""
        lo, hi = shard_range(self.comm, x, y)
        self.model.zero_grad()
        self._weight = self.dtype.type((hi - lo) / len(x))
        loss = self.runner.forward_backward(x[lo:hi], y[lo:hi])      # end_backward: the exchange
        self.optimizer.step()
        return float(loss)

    def end_backward(self) -> None:
        """Every gradient is ready: compress this rank's weighted gradient, allgather the messages, sum
        what they decode to into .grad."""
        flat = flatten([q.grad for q in self.params]) * self._weight
        sent = self.comm.stats.bytes_sent
        messages = allgather(self.comm, self.compressor.compress(flat))
        total = self.compressor.decode(messages[0])
        for message in messages[1:]:
            total += self.compressor.decode(message)
        self.bytes_per_step.append(self.comm.stats.bytes_sent - sent)
        unflatten(total, [q.grad for q in self.params])

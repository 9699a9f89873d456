"""Ring attention: the sequence split over the c ranks of ``comm``; key/value blocks travel round the ring.

Liu, Zaharia and Abbeel, "Ring Attention with Blockwise Transformers for Near-Infinite Context". Rank r
holds the queries, keys and values of its own tokens (layout.py: naive or zigzag). In c steps every
rank sees every key/value block: at step s it attends its queries to the block of rank (r − s) mod c,
merges the partial result with the online softmax (``merge``), and meanwhile passes the block it holds
to rank r+1 and receives the next from rank r−1. Backward runs the same ring; the gradients dk, dv of
a block travel with it (one step behind) and arrive home complete after the last step.

What each rank sends (c − 1 messages forward, 2c − 1 backward) is counted in cost.py (``ring_traffic``).

The simulated clock keeps two streams per step, as a GPU runs a transfer beside a kernel: the step's
transfers start at its start (comm.clock moves through them), the block's compute takes its FLOPs /
device.flops from the same start, and the step ends when both are done (``overlap=False``: one after
the other). Under the causal mask a block charges only its unmasked pairs and a block with none is
skipped, so the naive split leaves early ranks idle while the last works (lesson 17 shows it).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from minidist.cluster import Device
from minidist.nn.blockwise_attention import (
    block_attention,
    block_attention_backward,
    block_flops,
    causal_mask,
)
from minidist.nn.module import Module, check_float_array
from minidist.sim.compute import charge_seconds, wait_until

from .layout import positions

TAG = 133


def merge(out1: np.ndarray, lse1: np.ndarray, out2: np.ndarray,
          lse2: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Merge two partial attention results over disjoint key sets into the result over their union.

    One key block gives a partial result (O, lse) (nn.blockwise_attention.block_attention); two of them
    merge exactly by the online softmax (Milakov & Gimelshein, "Online normalizer calculation for
    softmax"; used by FlashAttention and by ring attention):

        lse = log(exp(lse₁) + exp(lse₂)),     O = exp(lse₁ − lse)·O₁ + exp(lse₂ − lse)·O₂

    out1, out2: (..., T_q, d_k); lse1, lse2: (..., T_q). Returns (out, lse) of the same shapes. Rows that
    saw no key on either side stay (0, −∞).
    """
    # BEGIN SOLUTION online_softmax_merge
    lse = np.logaddexp(lse1, lse2)
    safe = np.where(np.isneginf(lse), 0.0, lse)          # both sides empty: weights exp(−∞) = 0
    out = np.exp(lse1 - safe)[..., None] * out1 + np.exp(lse2 - safe)[..., None] * out2
    return out, lse
    # END SOLUTION


class RingAttention(Module):
    """Attention of this rank's queries to the whole sequence, on the c ranks of ``comm``: an attention
    ``core`` (the interface of nn.BlockwiseAttention) that a context-split attention holds.

    seq_len: T; this rank holds the tokens ``layout.positions(T, c, rank, layout)``; None: T = c·T_r, read
    from each forward's q. causal: mask keys after the query (by global position). overlap: transfers
    beside compute on the clock. device: turns a block's FLOPs into seconds of the compute stream (default
    ``comm.device``, the run's). ``flops`` and ``compute_seconds`` add up what was charged.
    """

    def __init__(self, comm, seq_len: int | None, *, causal: bool = True, layout: str = "zigzag",
                 overlap: bool = True, device: Device | None = None):
        c, rank = comm.world_size, comm.rank
        self.comm, self.causal, self.layout, self.overlap = comm, bool(causal), layout, bool(overlap)
        self.device = device or comm.device
        positions(int(seq_len or 2 * c), c, rank, layout)    # refuse a bad layout or length now
        self.seq_len, self.infer_seq_len = seq_len, seq_len is None
        self.left, self.right = (rank - 1) % c, (rank + 1) % c
        # the compute stream's FLOPs and seconds, updated in place (a pipeline saves what forward *assigns*)
        self.charged = SimpleNamespace(flops=0, seconds=0.0)
        self._saved: tuple | None = None

    @property
    def flops(self) -> int:
        return self.charged.flops

    @property
    def compute_seconds(self) -> float:
        return self.charged.seconds

    def held(self, rank: int) -> np.ndarray:
        """The global positions of the tokens ``rank`` holds (computed, not kept: no activation memory)."""
        return positions(self.seq_len, self.comm.world_size, rank, self.layout)

    def forward(self, q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
        """q, k, v: this rank's tokens, each (B, h, T_r, d_k). Returns this rank's output (B, h, T_r, d_k)."""
        self._check(q, k, v)
        out = np.zeros_like(q)
        lse = np.full(q.shape[:-1], -np.inf, dtype=q.dtype)
        kv = np.stack([k, v])
        for step in range(self.comm.world_size):
            owner = (self.comm.rank - step) % self.comm.world_size
            mask, flops = self._block(q, owner, backward=False)
            last = step == self.comm.world_size - 1
            arrived = self._ring_step([] if last else [kv], flops,
                                      f"attention forward, block of rank {owner}")
            if flops:
                out, lse = merge(out, lse, *block_attention(q, kv[0], kv[1], mask))
            if not last:
                kv = arrived[0]
        self._saved = (q, k, v, out, lse)
        return out

    def backward(self, d_out: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """d_out: dL/d(output) of this rank's tokens (B, h, T_r, d_k). Returns (dq, dk, dv), each like q."""
        if self._saved is None:
            raise RuntimeError("RingAttention.backward called before forward")
        q, k, v, out, lse = self._saved
        if d_out.shape != out.shape:
            raise ValueError(f"RingAttention.backward expects d_out of shape {out.shape}, got {d_out.shape}")
        delta = (d_out * out).sum(axis=-1)
        dq = np.zeros_like(q)
        kv, dkv = np.stack([k, v]), None
        c = self.comm.world_size
        for step in range(c):
            owner = (self.comm.rank - step) % c
            mask, flops = self._block(q, owner, backward=True)
            outgoing = ([kv] if step < c - 1 else []) + ([dkv] if step > 0 else [])
            arrived = self._ring_step(outgoing, flops, f"attention backward, block of rank {owner}")
            mine = np.zeros_like(kv)                     # this rank's share of the block's dK, dV
            if flops:
                dq_block, mine[0], mine[1] = block_attention_backward(q, kv[0], kv[1], mask, lse, d_out,
                                                                      delta)
                dq += dq_block
            dkv = mine if step == 0 else arrived[-1] + mine    # add to what the ranks before added
            if step < c - 1:
                kv = arrived[0]
        if c > 1:                                        # the block of rank+1 goes home; ours comes back
            dkv = self._ring_step([dkv], 0, "attention backward, dK and dV home")[0]
        return dq, dkv[0], dkv[1]

    # -- helpers ------------------------------------------------------------------------------------------
    def _block(self, q: np.ndarray, owner: int, backward: bool) -> tuple[np.ndarray | None, int]:
        """The mask of this rank's queries against ``owner``'s keys (None: all visible) and its FLOPs."""
        keys = self.held(owner)
        mask = causal_mask(self.held(self.comm.rank), keys) if self.causal else None
        if mask is not None and mask.all():
            mask = None
        return mask, block_flops(q, mask, len(keys), backward)

    def _ring_step(self, outgoing: list[np.ndarray], flops: int, label: str) -> list[np.ndarray]:
        """Pass each array right and receive the left neighbour's, beside ``flops`` of compute (the clock)."""
        comm, seconds = self.comm, flops / self.device.flops
        self.charged.flops += flops
        self.charged.seconds += seconds
        start = comm.clock
        if not self.overlap and seconds:
            charge_seconds(comm, seconds, label)
        arrived = [comm.sendrecv(a, self.right, self.left, sendtag=TAG, recvtag=TAG) for a in outgoing]
        if self.overlap:                                    # the clock waits if the compute stream ends last
            wait_until(comm, start + seconds, label)
        return arrived

    def _check(self, q: np.ndarray, k: np.ndarray, v: np.ndarray) -> None:
        for name, a in (("q", q), ("k", k), ("v", v)):
            check_float_array(a, f"RingAttention {name}")
        if not (q.ndim == 4 and q.shape == k.shape == v.shape and q.dtype == k.dtype == v.dtype):
            raise ValueError(f"RingAttention expects q, k, v of one shape (B, h, T_r, d_k) and dtype; got "
                             f"{q.shape} {q.dtype}, {k.shape} {k.dtype}, {v.shape} {v.dtype}")
        if self.infer_seq_len and self.seq_len != self.comm.world_size * q.shape[2]:
            self.seq_len = self.comm.world_size * q.shape[2]
        mine = len(self.held(self.comm.rank))
        if q.shape[2] != mine:
            raise ValueError(f"rank {self.comm.rank} holds {mine} tokens of the {self.layout} "
                             f"split (layout.shard), got q with T_r = {q.shape[2]}")

"""The Communicator: what ``fn(comm, ...)`` uses to talk to the other ranks.

    comm.rank, comm.world_size
    comm.send(array, dst, tag=0)               eager: returns once the message is in dst's mailbox
    comm.recv(src, tag=0, out=None, op=None, base=None)   -> the array sent (same dtype and shape)
    comm.sendrecv(sendbuf, dst, src, ...)      send and receive progressing together (rings never deadlock)
    comm.barrier()
    comm.all_equal(value)                      -> True on every rank iff every rank passed the same int
    comm.split(color, key=None)                -> a Communicator over the ranks of the same color
    with comm.collective("allreduce(...)"):    messages inside carry the call's checksum (collectives)
    comm.stats, comm.clock, comm.compute(flops), comm.elapse(seconds)   (see ledger.py)

Messages between an ordered pair of ranks arrive in the order they were sent (FIFO). The next message
must carry the tag the receiver expects, and with ``out=`` also its dtype and shape; otherwise
``MessageMismatchError`` says what each side had. ``op="sum"`` (or "max", "min", "prod") adds the
incoming data into ``out`` in place, straight from shared memory: ``out = out + incoming``; with
``base=``, ``out = base + incoming`` (so a reduction can start from an array it must not modify,
without first copying it into ``out``).

``send`` returns as soon as its last segment is in the mailbox, so it never waits for the receiver
while the mailbox has room: by default 16 slots of 128 KiB (``run(..., mailbox_bytes=2 MiB)``), i.e. up
to 16 small messages or 2 MiB in flight per ordered pair. Bigger messages stream and wait for the reader;
use ``sendrecv`` for exchanges of any size.

A message that fits in one mailbox slot (up to 128 KiB by default) is written and read in one step
(messages.post_short / take_short); longer ones stream segment by segment (Outgoing / Incoming).

A message for another communicator (or a barrier) that arrives while ``recv`` waits is set aside and
delivered when asked for, so sub-communicators from ``split`` never mix with their parent. One thread
per rank: a Communicator is not meant to be shared between threads.
"""

from __future__ import annotations

import hashlib
import os
import zlib

import numpy as np

from .checks import check_out, check_payload, check_tag
from .ledger import Ledger, Stats, _size
from .mailbox import Endpoint
from .messages import Incoming, Meta, Outgoing, post_short, take_short

USER, BARRIER, SPLIT, AGREE = 0, 1, 2, 3   # message kinds: only USER messages are counted in stats


class MessageMismatchError(ValueError):
    """The next message from a rank is not the one the receiver asked for (tag, dtype or shape)."""


class CollectiveCall:
    """The context manager ``comm.collective(call)`` returns (see there)."""

    def __init__(self, comm: Communicator, call: str):
        self.comm, self.call, self.checksum = comm, call, zlib.crc32(call.encode()) + 1     # 0: no call

    def __enter__(self) -> None:
        comm = self.comm
        self.outer = comm._call, comm._call_name
        comm._call, comm._call_name = self.checksum, self.call

    def __exit__(self, *exception) -> None:
        self.comm._call, self.comm._call_name = self.outer


class Communicator:
    """A group of ranks that exchange NumPy arrays. Built by ``run``; sub-groups by ``split``."""

    def __init__(self, endpoint: Endpoint, ledger: Ledger, ranks: list[int], comm_id: int = 0):
        self._ep, self._ledger, self._ranks, self._id = endpoint, ledger, list(ranks), comm_id
        self.rank = self._ranks.index(endpoint.rank)
        self.world_size = len(self._ranks)
        self.stats = Stats()
        self._splits = 0
        self._call, self._call_name = 0, ""     # the collective call in progress (see ``collective``)
        self._verbose = os.environ.get("MINIDIST_VERBOSE", "") not in ("", "0")

    def __repr__(self) -> str:
        return f"Communicator(rank={self.rank}, world_size={self.world_size}, world_ranks={self._ranks})"

    # -- the simulated clock ----------------------------------------------------------------------------
    @property
    def clock(self) -> float:
        """Simulated seconds on this rank (shared by all communicators of the process)."""
        return self._ledger.clock

    def compute(self, flops: float, label: str = "") -> None:
        """Charge ``flops`` floating-point operations: the clock advances by flops / device.flops."""
        self._ledger.compute(flops, label)

    def elapse(self, seconds: float, label: str = "") -> None:
        """Charge ``seconds`` of work to the clock."""
        self._ledger.elapse(seconds, label)

    # -- point to point ---------------------------------------------------------------------------------
    def send(self, array: np.ndarray, dst: int, tag: int = 0) -> None:
        """Send ``array`` (any shape, numeric/bool/string dtype; copied) to rank ``dst``."""
        world_dst, data, tag = self._peer(dst, "dst"), check_payload(array), check_tag(tag)
        arrival = self._ledger.send(data.nbytes, world_dst)
        if not post_short(self._ep, world_dst, data, self._id, self._call, USER, tag, arrival):
            out = Outgoing(self._ep, world_dst, data, self._id, self._call, USER, tag, arrival)   # streams
            while not out.advance():
                self._ep.wait(out.has_room, send_to=out.dst, tag=tag, room_at=out.room_at())
        self._count_send(data, dst, world_dst, tag)     # after the message is out: the receiver is not kept waiting

    def recv(self, src: int, tag: int = 0, out: np.ndarray | None = None, op: str | None = None,
             base: np.ndarray | None = None) -> np.ndarray:
        """Receive the next message from rank ``src``; it must carry ``tag``.

        ``out``: receive into this array (same dtype and shape as the message) and return it.
        ``op``: "sum" | "max" | "min" | "prod" — combine into ``out`` instead of overwriting it.
        ``base``: with ``op``, combine this array (same dtype and shape as ``out``) with the message
        instead of ``out``'s own values: ``out = base + incoming``.
        """
        world_src = self._peer(src, "src")
        accept, finish = self._receiver(src, check_tag(tag), out, op, base)
        return finish(*self._receive(world_src, accept, tag))

    def sendrecv(self, sendbuf: np.ndarray, dst: int, src: int, sendtag: int = 0, recvtag: int = 0,
                 out: np.ndarray | None = None, op: str | None = None,
                 base: np.ndarray | None = None) -> np.ndarray:
        """Send ``sendbuf`` to ``dst`` and receive from ``src`` at the same time; return what arrived.

        Both directions progress segment by segment, so a ring where every rank calls sendrecv never
        deadlocks, whatever the message size. ``out``, ``op`` and ``base`` are those of ``recv``.
        """
        world_dst, data, sendtag = self._peer(dst, "dst"), check_payload(sendbuf), check_tag(sendtag)
        world_src = self._peer(src, "src")
        accept, finish = self._receiver(src, check_tag(recvtag), out, op, base)
        arrival = self._ledger.send(data.nbytes, world_dst)
        if post_short(self._ep, world_dst, data, self._id, self._call, USER, sendtag, arrival):
            self._count_send(data, dst, world_dst, sendtag)
            return finish(*self._receive(world_src, accept, recvtag))   # sent already: receive only
        outgoing = Outgoing(self._ep, world_dst, data, self._id, self._call, USER, sendtag, arrival)
        self._count_send(data, dst, world_dst, sendtag)
        inc = Incoming(self._ep, world_src, self._id, USER, accept)
        sent = received = False
        while not (sent and received):
            sent = sent or outgoing.advance()
            received = received or inc.advance()
            if sent and not received:
                self._ep.wait(inc.has_data, recv_from=inc.src, tag=recvtag)
            elif received and not sent:
                self._ep.wait(outgoing.has_room, send_to=outgoing.dst, tag=sendtag,
                              room_at=outgoing.room_at())
            elif not sent and not received:
                self._ep.wait(lambda: outgoing.has_room() or inc.has_data(), outgoing.dst, inc.src, recvtag,
                              outgoing.room_at())
        return finish(inc.meta, inc.target)

    def collective(self, call: str) -> CollectiveCall:
        """``with comm.collective(call):`` — inside the block every message sent carries ``call``'s
        checksum, and every message received must carry this rank's own: a collective's messages can
        then only meet the same call on the other side. A message of another call raises
        MessageMismatchError ("collective mismatch"), naming this rank's call, before anything is
        received (a plain ``send`` carries checksum 0). Blocks nest; leaving one restores the outer call.
        """
        return CollectiveCall(self, call)

    def barrier(self) -> None:
        """Wait until every rank of this communicator has called barrier (dissemination: log2 P rounds).

        Not counted in stats; on the simulated clock every rank jumps to the latest clock.
        """
        latest = self._ledger.clock
        step = 1
        while step < self.world_size:
            self._internal_send(np.empty(0, np.uint8), (self.rank + step) % self.world_size, BARRIER, latest)
            meta = self._internal_recv((self.rank - step) % self.world_size, BARRIER)[0]
            latest = max(latest, meta.arrival)
            step *= 2
        self._ledger.record("barrier", latest, "barrier")

    def all_equal(self, value: int) -> bool:
        """True on every rank if every rank passed the same int ``value`` (int64), else False on every rank.

        Dissemination, like ``barrier``: in round k each rank sends the smallest and the largest value it
        has seen to rank + 2^k and takes those of rank − 2^k; after ceil(log2 P) rounds every rank has seen
        every value. The collectives use it to check that all ranks made the same call. Not counted in
        stats, and the simulated clock does not move: a check, not communication the model charges.
        """
        low = high = int(value)
        step = 1
        while step < self.world_size:
            self._internal_send(np.array([low, high], dtype=np.int64), (self.rank + step) % self.world_size,
                                AGREE, self._ledger.clock)
            other_low, other_high = self._internal_recv((self.rank - step) % self.world_size, AGREE)[1].tolist()
            low, high = min(low, other_low), max(high, other_high)
            step *= 2
        return low == high

    def split(self, color: int | None, key: int | None = None) -> Communicator | None:
        """A new communicator over the ranks that passed the same ``color`` (collective: all ranks call it).

        New ranks are ordered by ``key`` (default: the old rank), ties by old rank. ``color=None`` takes
        no part and gets None back. Messages of the new communicator never mix with this one's.
        """
        if color is not None and not isinstance(color, (int, np.integer)):
            raise TypeError(f"split expects an int color or None, got {type(color).__name__}")
        key = self.rank if key is None else key
        mine = np.array([-1 if color is None else 0, 0 if color is None else color, key], dtype=np.int64)
        everyone = {self.rank: mine}
        for peer in range(self.world_size):
            if peer != self.rank:
                self._internal_send(mine, peer, SPLIT, self._ledger.clock)
        for peer in range(self.world_size):
            if peer != self.rank:
                everyone[peer] = self._internal_recv(peer, SPLIT)[1]
        self._splits += 1
        if color is None:
            return None
        members = sorted((int(v[2]), r) for r, v in everyone.items() if v[0] == 0 and v[1] == color)
        digest = hashlib.blake2b(repr((self._id, self._splits, int(color))).encode(), digest_size=8)
        comm_id = int.from_bytes(digest.digest(), "little") >> 1     # fits a signed int64 too
        return Communicator(self._ep, self._ledger, [self._ranks[r] for _, r in members], comm_id)

    # -- helpers ----------------------------------------------------------------------------------------
    def _peer(self, peer, what: str) -> int:
        if type(peer) is int and 0 <= peer < self.world_size and peer != self.rank:   # the usual case
            return self._ranks[peer]
        if not isinstance(peer, (int, np.integer)) or isinstance(peer, bool):
            raise TypeError(f"{what} must be an int rank, got {type(peer).__name__}")
        if not 0 <= peer < self.world_size or peer == self.rank:
            raise ValueError(f"{what} must be another rank in 0..{self.world_size - 1} (this is rank "
                             f"{self.rank}), got {peer}")
        return self._ranks[int(peer)]

    def _count_send(self, data: np.ndarray, dst: int, world_dst: int, tag: int) -> None:
        """Count a send in the stats (and print it in verbose mode); its message has been numbered."""
        self.stats.bytes_sent += data.nbytes
        self.stats.messages_sent += 1
        if self._verbose:
            print(f"rank {self.rank} -> {dst}  tag {tag}  {_size(data.nbytes)}  step {self._ep.seq[world_dst]}",
                  flush=True)

    def _receiver(self, src: int, tag: int, out, op, base):
        """The checks of a receive, as ``accept(meta) -> (target, ufunc, base)`` (see messages.Incoming),
        and ``finish(meta, target)``, which charges the receive and returns the array."""
        ufunc = check_out(out, op, base)
        # a non-contiguous out (or base) is received through a temporary and combined at the end
        direct = out is not None and out.flags.c_contiguous and (base is None or base.flags.c_contiguous)

        def accept(meta: Meta):
            if meta.call != self._call:
                raise MessageMismatchError(self._call_mismatch(src, meta))
            if meta.tag != tag or (out is not None and (meta.dtype != out.dtype or meta.shape != out.shape)):
                want = f"tag {tag}" + ("" if out is None else f", {out.dtype} {out.shape} (out=)")
                raise MessageMismatchError(
                    f"rank {self.rank} expected from rank {src}: {want}; but rank {src} sent: {meta.describe()}")
            if direct:
                return out, ufunc, base
            return np.empty(meta.shape, meta.dtype), None, None

        def finish(meta: Meta, target: np.ndarray) -> np.ndarray:
            self._ledger.recv(meta.arrival, meta.nbytes, self._ranks[src])
            self.stats.bytes_received += meta.nbytes
            self.stats.messages_received += 1
            if self._verbose:
                print(f"rank {self.rank} <- {src}  tag {tag}  {_size(meta.nbytes)}  step {meta.seq}", flush=True)
            if out is None or direct:
                return target
            if ufunc is None:
                out[...] = target
            else:
                ufunc(out if base is None else base, target, out=out)
            return out

        return accept, finish

    def _receive(self, world_src: int, accept, tag: int, kind: int = USER) -> tuple[Meta, np.ndarray]:
        """The next message from ``world_src`` of this communicator and kind: (meta, target)."""
        ep = self._ep
        stashed = ep.stash and (self._id, kind, world_src) in ep.stash
        got = None if stashed else take_short(ep, world_src, self._id, kind, accept, tag)
        if got is None:                             # a long message, or one set aside earlier
            inc = Incoming(ep, world_src, self._id, kind, accept)
            while not inc.advance():
                ep.wait(inc.has_data, recv_from=world_src, tag=tag)
            got = inc.meta, inc.target
        return got

    def _call_mismatch(self, src: int, meta: Meta) -> str:
        if self._call == 0:
            return (f"collective mismatch: rank {self.rank} expects a plain message from rank {src}, but the next "
                    f"one is a message of a collective call ({meta.describe()}); every rank must make the same "
                    f"calls in the same order")
        theirs = "a plain send" if meta.call == 0 else "a message of another collective call"
        return (f"collective mismatch: rank {self.rank} called {self._call_name}, but not every rank made the same "
                f"call: the next message from rank {src} is {theirs} ({meta.describe()})")

    def _internal_send(self, data: np.ndarray, dst: int, kind: int, stamp: float) -> None:
        if post_short(self._ep, self._ranks[dst], data, self._id, 0, kind, 0, stamp):
            return
        outgoing = Outgoing(self._ep, self._ranks[dst], data, self._id, 0, kind, 0, stamp)
        while not outgoing.advance():
            self._ep.wait(outgoing.has_room, send_to=outgoing.dst, tag=-kind, room_at=outgoing.room_at())

    def _internal_recv(self, src: int, kind: int) -> tuple[Meta, np.ndarray]:
        return self._receive(self._ranks[src], lambda meta: (np.empty(meta.shape, meta.dtype), None, None), -kind,
                             kind)


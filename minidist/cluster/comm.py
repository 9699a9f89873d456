"""The Communicator: what ``fn(comm, ...)`` uses to talk to the other ranks.

    comm.rank, comm.world_size
    comm.send(array, dst, tag=0)               eager: returns once the message is in dst's mailbox
    comm.recv(src, tag=0, out=None, op=None, base=None)   -> the array sent (same dtype and shape)
    comm.sendrecv(sendbuf, dst, src, ...)      both directions at once (rings never deadlock)
    comm.barrier(), comm.all_equal(value), comm.split(color, key=None)        (group.py)
    with comm.collective("allreduce(...)"):    messages inside carry the call's checksum
    comm.stats, comm.clock, comm.compute(flops), comm.elapse(seconds)          (ledger.py)
    comm.wall                                  real seconds in calls, waiting, sleeps (wall.py)
    comm.shared_area()                         arrays every rank reads in place (shared_area.py)

Each message costs its sender alpha + n * beta seconds of simulated time (the alpha-beta model of the
"Distributed Deep Learning (Part II)" slides; ledger.py). Messages between an ordered pair of ranks
arrive in the order they were sent (FIFO). The next message must carry the tag the receiver expects,
and with ``out=`` also its dtype and shape; otherwise ``MessageMismatchError`` says what each side had.
``op="sum"`` (or "max", "min", "prod") combines the incoming data into ``out`` straight from shared
memory: ``out = out + incoming``, or with ``base=``, ``out = base + incoming``.

Send and receive buffers must not overlap (as in MPI): ``sendrecv`` refuses a send array that shares
memory with ``out``, and ``recv`` a ``base`` that overlaps ``out`` without being ``out`` itself.

``send`` never waits for the receiver while the mailbox has room (by default 16 slots of 128 KiB,
``run(..., mailbox_bytes=2 MiB)``); bigger messages wait for the reader: on Linux it copies them
straight out of the sender's array (cross_memory.py; from 1 MiB), elsewhere they stream through the
mailbox. A message for
another communicator that arrives while ``recv`` waits is set aside until asked for, so communicators
from ``split`` never mix. One thread per rank: a Communicator is not shared between threads.
"""

from __future__ import annotations

import os
import zlib
from time import perf_counter

import numpy as np

from .checks import MessageMismatchError, check_out, check_payload, check_separate, check_tag
from .group import USER, Group
from .header import Meta
from .ledger import Ledger, Stats, _size
from .mailbox import Endpoint
from .messages import Incoming, Outgoing, post_short, read_message, send_message, wait_for_header
from .shared_area import SharedArea


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


class Communicator(Group):
    """A group of ranks that exchange NumPy arrays. Built by ``run``; sub-groups by ``split``."""

    def __init__(self, endpoint: Endpoint, ledger: Ledger, ranks: list[int], comm_id: int = 0):
        super().__init__(endpoint, ledger, ranks, comm_id)
        self.stats = Stats()
        self._call, self._call_name = 0, ""     # the collective call in progress (see ``collective``)
        self._verbose = os.environ.get("MINIDIST_VERBOSE", "") not in ("", "0")
        world = comm_id == 0 and len(ranks) == endpoint.layout.world_size
        self._area = SharedArea(self) if world else None

    def __repr__(self) -> str:
        return f"Communicator(rank={self.rank}, world_size={self.world_size}, world_ranks={self._ranks})"

    # -- the simulated clock ----------------------------------------------------------------------------
    @property
    def clock(self) -> float:
        """Simulated seconds on this rank (shared by all communicators of the process)."""
        return self._ledger.clock

    @property
    def device(self):
        """The simulated accelerator of this rank (``run(..., device=)``): what ``compute`` divides by."""
        return self._ledger.device

    @property
    def wall(self):
        """Real seconds this rank's process spent in calls and waits (wall.py's WallTimes; shared by all
        communicators of the process, like the clock)."""
        return self._ep.wall

    def compute(self, flops: float, label: str = "") -> None:
        """Charge ``flops`` floating-point operations: the clock advances by flops / device.flops."""
        self._ledger.compute(flops, label)

    def elapse(self, seconds: float, label: str = "") -> None:
        """Charge ``seconds`` of work to the clock."""
        self._ledger.elapse(seconds, label)

    def drop_spans(self) -> None:
        """Forget the spans this rank's process has recorded so far (the clock runs on): a long run whose
        trace needs only its end (the demo's last step) then sends back only those."""
        self._ledger.drop_spans()

    # -- point to point ---------------------------------------------------------------------------------
    def send(self, array: np.ndarray, dst: int, tag: int = 0) -> None:
        """Send a copy of ``array`` (any shape, numeric/bool/string dtype) to rank ``dst``.

        dst: another rank of this communicator; tag: an int >= 0 the receiver must expect. Returns None
        once the message is in dst's mailbox (it waits only while the mailbox is full).
        """
        began = perf_counter()
        world_dst, data, tag = self._peer(dst, "dst"), check_payload(array), check_tag(tag)
        arrival = self._ledger.send(data.nbytes, world_dst)
        send_message(self._ep, world_dst, data, self._id, self._call, USER, tag, arrival, wait_tag=tag)
        # after the message is out: the receiver is not kept waiting
        self._count_send(data, dst, world_dst, tag)
        self._ep.wall.in_calls += perf_counter() - began

    def recv(self, src: int, tag: int = 0, out: np.ndarray | None = None, op: str | None = None,
             base: np.ndarray | None = None) -> np.ndarray:
        """Receive the next message from rank ``src``; it must carry ``tag``.

        Returns the array sent (its dtype and shape), or ``out`` itself when given.
        out: receive into this array (the message's dtype and shape; any strides).
        op: "sum" | "max" | "min" | "prod" — combine into ``out`` instead of overwriting it:
            out = op(out, incoming).
        base: with ``op``, out = op(base, incoming) (base: out's dtype and shape; ``out`` itself, or an
            array that does not overlap out), so a reduction can start from an array it must not modify.
        """
        began = perf_counter()
        world_src, tag, ufunc = self._peer(src, "src"), check_tag(tag), check_out(out, op, base)
        if base is not None:
            check_separate(out, base)
        received = self._receive(src, world_src, tag, out, ufunc, base)
        self._ep.wall.in_calls += perf_counter() - began
        return received

    def sendrecv(self, sendbuf: np.ndarray, dst: int, src: int, sendtag: int = 0, recvtag: int = 0,
                 out: np.ndarray | None = None, op: str | None = None,
                 base: np.ndarray | None = None) -> np.ndarray:
        """Send ``sendbuf`` to ``dst`` and receive from ``src`` at the same time; return what arrived.

        Both directions progress segment by segment, so a ring where every rank calls sendrecv never
        deadlocks, whatever the message size. ``out``, ``op``, ``base`` and the result are those of
        ``recv``; ``sendbuf`` must not share memory with ``out`` (ValueError, before anything is sent;
        receive into another array — there is no in-place "replace" mode).
        """
        began = perf_counter()
        try:
            return self._sendrecv(sendbuf, dst, src, sendtag, recvtag, out, op, base)
        finally:
            self._ep.wall.in_calls += perf_counter() - began

    def _sendrecv(self, sendbuf, dst, src, sendtag, recvtag, out, op, base) -> np.ndarray:
        world_dst, data, sendtag = self._peer(dst, "dst"), check_payload(sendbuf), check_tag(sendtag)
        world_src, recvtag, ufunc = self._peer(src, "src"), check_tag(recvtag), check_out(out, op, base)
        if out is not None:
            check_separate(out, base, sendbuf)
        arrival = self._ledger.send(data.nbytes, world_dst)
        if post_short(self._ep, world_dst, data, self._id, self._call, USER, sendtag, arrival):
            self._count_send(data, dst, world_dst, sendtag)             # sent already: receive only
            return self._receive(src, world_src, recvtag, out, ufunc, base)
        outgoing = Outgoing(self._ep, world_dst, data, self._id, self._call, USER, sendtag, arrival)
        self._count_send(data, dst, world_dst, sendtag)
        incoming = Incoming(self._ep, world_src, self._id, USER)
        meta = None
        sent = received = False
        while True:                     # write what fits, read what has come; wait for either
            sent = sent or outgoing.advance()
            if meta is None and (meta := incoming.header()) is not None:     # the header is here: check it
                self._check_header(src, recvtag, meta, out)
                target, how, onto = _destination(meta, out, ufunc, base)
                incoming.start(target, how, onto)
            received = meta is not None and incoming.advance()
            if sent and received:
                return self._received(src, recvtag, meta, target, out, ufunc, base)
            self._ep.wait(send_to=-1 if sent else world_dst, recv_from=-1 if received else world_src,
                          tag=recvtag if not received else sendtag, room_at=outgoing.room_at(),
                          ack=outgoing.awaiting_ack(), data_at=incoming.data_at())

    def collective(self, call: str) -> CollectiveCall:
        """``with comm.collective(call):`` — inside the block every message sent carries ``call``'s
        checksum, and every message received must carry this rank's own: a collective's messages can
        then only meet the same call on the other side. A message of another call raises
        MessageMismatchError ("collective mismatch"), naming this rank's call, before anything is
        received (a plain ``send`` carries checksum 0). Blocks nest; leaving one restores the outer call.
        """
        return CollectiveCall(self, call)

    def shared_area(self) -> SharedArea | None:
        """The cluster's shared area (shared_area.py): arrays every rank reads in place, and meetings.

        Only the world communicator of the simulated cluster has one (its ranks share one block, and
        its meetings count every rank); a communicator from ``split``, or one of the MPI backend, whose
        ranks share no block, returns None.
        """
        return getattr(self, "_area", None)      # (MPICommunicator does not run this __init__)

    def split(self, color: int | None, key: int | None = None) -> Communicator | None:
        """A new communicator over the ranks that passed the same ``color`` (collective: all ranks call it).

        color: an int, or None to take no part (then None is returned); key: orders the new ranks
        (default: the old rank; ties by old rank). Messages of the new communicator never mix with
        this one's.
        """
        members = self._split_members(color, key)
        return None if members is None else Communicator(self._ep, self._ledger, *members)

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
            print(
                f"rank {self.rank} -> {dst}  tag {tag}  {_size(data.nbytes)}  step {self._ep.seq[world_dst]}",
                flush=True,
            )

    def _receive(self, src: int, world_src: int, tag: int, out, ufunc, base) -> np.ndarray:
        """Wait for the header, check it, say where the payload goes, copy it out and count it."""
        meta, incoming = wait_for_header(self._ep, world_src, self._id, USER, tag)
        self._check_header(src, tag, meta, out)
        target, how, onto = _destination(meta, out, ufunc, base)
        read_message(self._ep, world_src, meta, incoming, target, how, onto, tag)
        return self._received(src, tag, meta, target, out, ufunc, base)

    def _check_header(self, src: int, tag: int, meta: Meta, out) -> None:
        """Raise MessageMismatchError unless the message is the one asked for (call, tag, dtype, shape)."""
        if meta.call != self._call:
            raise MessageMismatchError(self._call_mismatch(src, meta))
        if meta.tag != tag or (out is not None and (meta.dtype != out.dtype or meta.shape != out.shape)):
            want = f"tag {tag}" + ("" if out is None else f", {out.dtype} {out.shape} (out=)")
            raise MessageMismatchError(
                f"rank {self.rank} expected from rank {src}: {want}; but rank {src} sent: {meta.describe()}")

    def _received(self, src: int, tag: int, meta: Meta, target: np.ndarray, out, ufunc, base) -> np.ndarray:
        """Charge a completed receive to the clock and the stats; return the array received."""
        self._ledger.recv(meta.arrival, meta.nbytes, self._ranks[src])
        self.stats.bytes_received += meta.nbytes
        self.stats.messages_received += 1
        if self._verbose:
            print(f"rank {self.rank} <- {src}  tag {tag}  {_size(meta.nbytes)}  step {meta.seq}", flush=True)
        if out is None or target is out:
            return target
        if ufunc is None:             # out was not C-contiguous: the message went through a temporary
            out[...] = target
        else:
            ufunc(out if base is None else base, target, out=out)
        return out

    def _call_mismatch(self, src: int, meta: Meta) -> str:
        if self._call == 0:
            return (
                f"collective mismatch: rank {self.rank} expects a plain message from rank {src}, "
                f"but the next one is a message of a collective call ({meta.describe()}); "
                f"every rank must make the same "
                f"calls in the same order"
            )
        theirs = "a plain send" if meta.call == 0 else "a message of another collective call"
        return (
            f"collective mismatch: rank {self.rank} called {self._call_name}, "
            f"but not every rank made the same call: "
            f"the next message from rank {src} is {theirs} ({meta.describe()})"
        )


def _destination(meta: Meta, out, ufunc, base):
    """Where a message goes: (target, ufunc, base) for ``read_message``. A new array without ``out``;
    ``out`` itself if it (and ``base``) are C-contiguous; else a temporary, combined into out at the end."""
    if out is not None and out.flags.c_contiguous and (base is None or base.flags.c_contiguous):
        return out, ufunc, base
    return np.empty(meta.shape, meta.dtype), None, None

"""The transport under the Communicator: mailboxes in one block of shared memory, and doorbells.

Layout of the shared block (created by the launcher, mapped by every rank)::

    control lines (64 bytes each, so two ranks never write the same cache line):
        line 0                 abort flag, rank that failed first
        line 1 + r             done[r]: rank r's function has returned
        line 1 + P + r         status[r]: what rank r sleeps for (ROOM/DATA bits, send_to, recv_from, tag)
        written[s, d], read[s, d]   slots written by s / consumed by d in mailbox s -> d
    mailboxes: one per ordered pair (s, d), each ``nslots`` slots of [header | segment of payload]

A message takes ceil(nbytes / segment) slots (at least one); its header (sequence number, communicator,
kind, tag, dtype, shape, nbytes, arrival time) rides in the first. Mailbox s -> d is a ring buffer with a
single writer (s) and a single reader (d): s may write slot ``written`` while ``written - read <
nslots``; d may read slot ``read`` while ``read < written``. Each side owns one counter, so no lock is
needed. Larger messages stream through the ring, segment after segment.

Waiting never burns CPU: every rank has one *doorbell* semaphore and a status line saying what it is
asleep for (data from s, room in the mailbox to d). Whoever writes into d's mailbox while d sleeps for
its data, or frees the slots d sleeps for, rings d's doorbell; the sleeper re-checks its condition each time
the bell rings, and at least every ``POLL`` seconds, when it also notices an abort or a peer that has
already returned. A writer that finds the mailbox full asks to be woken only once several slots are free
(half the mailbox, or what the rest of its message needs if less): one wake-up per batch of segments
instead of one per segment, because a wake-up costs far more CPU than writing a segment.

Waking a sleeping process costs tens of microseconds, far more than a short message, so a rank first
spins for up to ``SPIN`` seconds, but only while the ranks that are awake fit on the cores: every rank
if there are no more ranks than cores, else those whose status line says they are not asleep. Spinning
on a core another awake rank needs would only delay that rank.
"""

from __future__ import annotations

import functools
import struct
import threading
import time
from typing import NamedTuple

import numpy as np

HEADER = struct.Struct("<QQqQdii16s")           # seq, comm, tag, nbytes, arrival, kind, ndim, dtype
MAX_DIMS = 32
HEADER_BYTES = 384                              # HEADER + up to 32 dims of int64, rounded to 64
# HEADER followed by the shape, one Struct per number of dimensions (packed and unpacked in one call)
HEADER_WITH_SHAPE = [struct.Struct(HEADER.format + "q" * ndim) for ndim in range(MAX_DIMS + 1)]
LINE = 8                                        # int64 per 64-byte control line
POLL = 0.05                                     # seconds between checks for abort / returned peers
SPIN = 50e-6                                    # bounded spin before sleeping (only if awake ranks <= cores)

# Status line of a rank: [what it sleeps for (bits), send_to, recv_from, tag, room_at]
# (room_at: wake this writer when the reader's ``read`` counter reaches it)
ROOM, DATA = 1, 2
_lock = threading.Lock()


def fence() -> None:
    """A full memory barrier: taking a lock is an atomic instruction, which the CPU does not reorder.

    Needed between "publish my counter" and "read the peer's status" (and the mirror image on the other
    side), so that one of the two always sees the other and no doorbell is missed.
    """
    _lock.acquire()
    _lock.release()


class Aborted(BaseException):
    """Raised inside a rank when the run is being aborted because another rank failed or time ran out.

    A BaseException, like KeyboardInterrupt, so that an ``except Exception`` in user code cannot swallow it.
    """


class PeerReturnedError(RuntimeError):
    """A rank waits for a peer whose function has already returned."""


class Layout:
    """Sizes and offsets of the shared block for ``world_size`` ranks (all in bytes unless said)."""

    def __init__(self, world_size: int, mailbox_bytes: int = 2 * 2**20, nslots: int = 16):
        p = self.world_size = world_size
        self.mailbox_bytes, self.nslots = mailbox_bytes, nslots
        self.segment = max(64, mailbox_bytes // nslots // 64 * 64)      # payload bytes per slot
        self.slot_bytes = HEADER_BYTES + self.segment
        self.control_bytes = (1 + 2 * p + 2 * p * p) * LINE * 8
        self.total_bytes = self.control_bytes + p * p * nslots * self.slot_bytes

    def line(self, name: str, a: int = 0, b: int = 0) -> int:
        """Index (in int64) of a control value."""
        p = self.world_size
        first = {"abort": 0, "done": 1 + a, "status": 1 + p + a,
                 "written": 1 + 2 * p + a * p + b, "read": 1 + 2 * p + p * p + a * p + b}[name]
        return first * LINE

    def mailbox_offset(self, src: int, dst: int) -> int:
        return self.control_bytes + (src * self.world_size + dst) * self.nslots * self.slot_bytes

    def segment_for(self, itemsize: int) -> int:
        """Segment size for one message: a whole number of items when an item fits in a segment."""
        return self.segment // itemsize * itemsize if 0 < itemsize <= self.segment else self.segment

    def segments(self, nbytes: int, itemsize: int) -> tuple[int, int]:
        """(segment size, number of segments >= 1) of a message of ``nbytes`` bytes."""
        if nbytes <= self.segment - itemsize:       # one segment: the usual case, decided at once
            return self.segment, 1
        seg = self.segment_for(itemsize)
        return seg, max(1, -(-nbytes // seg))


class Endpoint:
    """One rank's view of the shared block: its mailboxes, counters, doorbells and stash.

    ``buf`` is the shared block (a memoryview), ``doorbells`` one semaphore per rank.
    """

    def __init__(self, layout: Layout, rank: int, buf, doorbells, cores: int):
        self.layout, self.rank, self.doorbells, self.cores = layout, rank, doorbells, cores
        # the control lines as 64-bit integers (a memoryview: reading one gives a Python int, quickly)
        self.ctrl = buf[:layout.control_bytes].cast("q")
        self.buf = buf
        self.raw = np.ndarray(layout.total_bytes, dtype=np.uint8, buffer=buf)
        p = layout.world_size
        self.nslots, self.slot_bytes = layout.nslots, layout.slot_bytes
        me, peers = rank, range(p)
        self.status = [layout.line("status", r) for r in peers]
        # where my counters and mailboxes are: out = me -> d, in = s -> me
        self.written_out = [layout.line("written", me, d) for d in peers]
        self.read_out = [layout.line("read", me, d) for d in peers]
        self.written_in = [layout.line("written", s, me) for s in peers]
        self.read_in = [layout.line("read", s, me) for s in peers]
        self.box_out = [layout.mailbox_offset(me, d) for d in peers]
        self.box_in = [layout.mailbox_offset(s, me) for s in peers]
        self.written = [0] * p     # my copies of counters I own: written[me, d] and read[s, me]
        self.read = [0] * p
        self.seq = [0] * p          # messages sent to each rank
        self.stash: dict[tuple, list] = {}   # messages that arrived for another communicator / kind

    def close(self) -> None:
        """Drop the views of the shared block, so that it can be unmapped."""
        if self.ctrl is not None:
            self.ctrl.release()
        self.ctrl = self.raw = self.buf = None

    # -- shared state ------------------------------------------------------------------------------------
    def aborting(self) -> bool:
        return self.ctrl[0] != 0

    def abort(self) -> None:
        """Tell every rank to stop (they notice at once: all doorbells ring)."""
        if self.ctrl[0] == 0:
            self.ctrl[1] = self.rank
            self.ctrl[0] = 1
        for bell in self.doorbells:
            bell.release()

    def mark_done(self) -> None:
        self.ctrl[self.layout.line("done", self.rank)] = 1
        for bell in self.doorbells:
            bell.release()

    def peer_done(self, peer: int) -> bool:
        return self.ctrl[self.layout.line("done", peer)] != 0

    def ring_if_asleep(self, peer: int, reason: int, column: int, read: int = 0) -> None:
        """Ring ``peer``'s doorbell if it sleeps for ``reason`` (ROOM/DATA) concerning this rank.

        For ROOM, ``read`` is this reader's new counter: the writer is woken once it reaches its room_at.
        """
        fence()
        st = self.status[peer]
        if self.ctrl[st] & reason and self.ctrl[st + column] == self.rank and \
                (reason == DATA or read >= self.ctrl[st + 4]):
            self.doorbells[peer].release()

    # -- waiting -----------------------------------------------------------------------------------------
    def wait(self, ready, send_to: int = -1, recv_from: int = -1, tag: int = 0, room_at: int = 0) -> None:
        """Return when ``ready()`` is true (room to send to ``send_to`` / data from ``recv_from``).

        ``room_at``: the reader of mailbox me -> send_to rings only once its ``read`` counter reaches it
        (``Outgoing.room_at()``); a poll or a message from ``recv_from`` may still wake this rank earlier.

        Raises Aborted, or PeerReturnedError, instead of waiting forever.
        """
        if self.may_spin():
            stop = time.perf_counter() + SPIN
            while time.perf_counter() < stop:
                if ready():
                    return
        bell, st = self.doorbells[self.rank], self.status[self.rank]
        self.ctrl[st + 1], self.ctrl[st + 2], self.ctrl[st + 3] = send_to, recv_from, tag
        self.ctrl[st + 4] = room_at
        self.ctrl[st] = (ROOM if send_to >= 0 else 0) | (DATA if recv_from >= 0 else 0)
        fence()
        try:
            while True:
                while bell.acquire(False):     # old rings: their events are covered by the check below
                    pass
                if ready():
                    return
                if not bell.acquire(True, POLL):
                    if self.aborting():
                        raise Aborted()
                    for peer in (recv_from, send_to):
                        if peer >= 0 and self.peer_done(peer) and not ready():
                            what = "a message from" if peer == recv_from else "room in the mailbox to"
                            raise PeerReturnedError(
                                f"rank {self.rank} waits for {what} rank {peer} (tag {tag}), but rank "
                                f"{peer}'s function has already returned")
                elif self.aborting():
                    raise Aborted()
        finally:
            self.ctrl[st] = 0

    def may_spin(self) -> bool:
        """Spin before sleeping only while the awake ranks (this one included) fit on the cores."""
        p = self.layout.world_size
        if p <= self.cores:
            return True
        awake = sum(1 for r in range(p) if self.ctrl[self.status[r]] == 0 and not self.peer_done(r))
        return awake <= self.cores

    def blocked_on(self, rank: int) -> str:
        """'recv from rank 3 (tag 0)' — what ``rank`` is asleep for, read from its status line."""
        st = self.status[rank]
        mask, send_to, recv_from, tag = self.ctrl[st:st + 4].tolist()
        parts = ([f"send to rank {send_to}"] if mask & ROOM else []) + \
                ([f"recv from rank {recv_from}"] if mask & DATA else [])
        what = {-1: "barrier", -2: "split"}.get(tag, f"tag {tag}")
        return f"{' + '.join(parts)} ({what})" if parts else "running"


class Outgoing:
    """A message on its way from this rank to ``dst``: ``advance()`` writes as many segments as fit."""

    def __init__(self, ep: Endpoint, dst: int, data: np.ndarray, comm: int, kind: int, tag: int, arrival: float):
        self.ep, self.dst = ep, dst
        self.bytes = data.reshape(-1).view(np.uint8)   # data is C-contiguous
        self.seg, self.nseg = ep.layout.segments(self.bytes.size, data.dtype.itemsize)
        self.next = 0
        ep.seq[dst] += 1
        self.seq = ep.seq[dst]
        self.header = HEADER_WITH_SHAPE[data.ndim].pack(self.seq, comm, tag, self.bytes.size, arrival, kind,
                                                        data.ndim, _dtype_code(data.dtype), *data.shape)
        self.read_index, self.written_index, self.box = ep.read_out[dst], ep.written_out[dst], ep.box_out[dst]

    def has_room(self) -> bool:
        ep = self.ep
        return ep.written[self.dst] - ep.ctrl[self.read_index] < ep.nslots

    def room_at(self) -> int:
        """The reader's ``read`` count at which this full mailbox has room for a batch of segments.

        The batch is half the mailbox, or the rest of the message if shorter: a reader that receives
        this message always frees that much, so waiting for the batch can never deadlock.
        """
        ep = self.ep
        return ep.written[self.dst] - ep.nslots + min(ep.nslots // 2, self.nseg - self.next)

    def advance(self) -> bool:
        """Write segments while there are free slots; True when the whole message is written."""
        ep, dst = self.ep, self.dst
        while self.next < self.nseg:
            if not self.has_room():
                return False
            w = ep.written[dst]
            offset = self.box + (w % ep.nslots) * ep.slot_bytes
            if self.next == 0:
                ep.buf[offset:offset + len(self.header)] = self.header
            lo = self.next * self.seg
            piece = self.bytes[lo:lo + self.seg]
            start = offset + HEADER_BYTES
            ep.buf[start:start + piece.size] = piece
            ep.written[dst] = w + 1
            ep.ctrl[self.written_index] = w + 1      # publish after the data is in place
            ep.ring_if_asleep(dst, DATA, 2)
            self.next += 1
        return True


class Incoming:
    """A message being received from ``src``: ``advance()`` consumes the segments that have arrived.

    ``accept(meta)`` is called with the header of the next message of this communicator and kind; it
    checks it and returns the destination array (C-contiguous, of the message's dtype and shape), the
    ufunc to combine with (None: plain copy) and the array combined with the message (None: the
    destination itself; else C-contiguous, like it). Messages of another communicator or kind are stashed.
    """

    def __init__(self, ep: Endpoint, src: int, comm: int, kind: int, accept):
        self.ep, self.src, self.comm, self.kind, self.accept = ep, src, comm, kind, accept
        self.key = (comm, kind, src)
        self.written_index, self.read_index, self.box = ep.written_in[src], ep.read_in[src], ep.box_in[src]
        self.meta = None           # header of the message in progress
        self.done = False

    def has_data(self) -> bool:
        return self.ep.read[self.src] < self.ep.ctrl[self.written_index]

    def advance(self) -> bool:
        ep = self.ep
        if self.meta is None and ep.stash and ep.stash.get(self.key):
            meta, data = ep.stash[self.key].pop(0)
            self.target, ufunc, base = self.accept(meta)
            _combine(self.target.reshape(-1), data.reshape(-1), ufunc, None if base is None else base.reshape(-1))
            self.meta, self.done = meta, True
        while not self.done:
            if not self.has_data():
                return False
            r = ep.read[self.src]
            offset = self.box + (r % ep.nslots) * ep.slot_bytes
            if self.meta is None:
                self.start_message(offset)
            lo = self.next * self.seg
            n = min(self.seg, self.nbytes - lo)
            incoming = ep.raw[offset + HEADER_BYTES:offset + HEADER_BYTES + n]
            if self.ufunc is None:
                self.target_bytes[lo:lo + n] = incoming
            else:
                piece = slice(lo // self.target.dtype.itemsize, (lo + n) // self.target.dtype.itemsize)
                _combine(self.target_flat[piece], incoming.view(self.target.dtype), self.ufunc,
                         None if self.base_flat is None else self.base_flat[piece])
            ep.read[self.src] = r + 1
            ep.ctrl[self.read_index] = r + 1
            ep.ring_if_asleep(self.src, ROOM, 1, r + 1)
            self.next += 1
            if self.next == self.nseg:
                if self.stashing:
                    ep.stash.setdefault(self.stash_key, []).append((self.meta, self.target))
                    self.meta = None
                else:
                    self.done = True
        return True

    def start_message(self, offset: int) -> None:
        ndim = HEADER.unpack_from(self.ep.buf, offset)[6]
        seq, comm, tag, nbytes, arrival, kind, ndim, dtype, *shape = HEADER_WITH_SHAPE[ndim].unpack_from(
            self.ep.buf, offset)
        meta = Meta(seq, comm, kind, tag, nbytes, arrival, _dtype(dtype), tuple(shape))
        self.meta, self.nbytes, self.next = meta, nbytes, 0
        self.seg, self.nseg = self.ep.layout.segments(nbytes, meta.dtype.itemsize)
        self.stashing = comm != self.comm or kind != self.kind
        if self.stashing:       # another communicator's message: keep it aside, in arrival order
            self.stash_key = (comm, kind, self.src)
            self.target, self.ufunc, base = np.empty(shape, meta.dtype), None, None
        else:
            self.target, self.ufunc, base = self.accept(meta)
        self.target_flat = self.target.reshape(-1)
        self.base_flat = None if base is None else base.reshape(-1)
        if self.ufunc is None:
            self.target_bytes = self.target_flat.view(np.uint8)


class Meta(NamedTuple):
    """A message header as the receiver sees it."""

    seq: int
    comm: int
    kind: int
    tag: int
    nbytes: int
    arrival: float
    dtype: np.dtype
    shape: tuple

    def describe(self) -> str:
        return f"tag {self.tag}, {self.dtype} {self.shape}, {self.nbytes} bytes"


@functools.lru_cache(maxsize=256)
def _dtype(code: bytes) -> np.dtype:
    """The dtype of a header's code: b'<f4\\0\\0...' -> float32."""
    return np.dtype(code.rstrip(b"\0").decode())


@functools.lru_cache(maxsize=256)
def _dtype_code(dtype: np.dtype) -> bytes:
    """A dtype as the header carries it: float32 -> b'<f4' (the array-interface string)."""
    return dtype.str.encode()


def _combine(target: np.ndarray, incoming: np.ndarray, ufunc, base: np.ndarray | None = None) -> None:
    """target = incoming, or target = ufunc(base, incoming) (base defaults to target itself)."""
    if ufunc is None:
        target[...] = incoming
    else:
        ufunc(target if base is None else base, incoming, out=target)

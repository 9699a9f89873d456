"""One message through a mailbox: a header and a payload, in as many slots as it needs.

Sending is "reserve slots, copy in, ring the doorbell": a message takes ceil(nbytes / segment) slots of
mailbox s -> d (at least one); its header (sequence number, communicator, collective call, tag, nbytes,
arrival time on the simulated clock, kind, dtype, shape) rides in the first slot. The writer publishes
its ``written`` counter once a segment is in place and rings the reader's doorbell if it sleeps.

Receiving is "wait, copy out (or reduce into out), free": the reader waits for the header
(``wait_for_header``), the caller checks it and says where the payload goes, and ``read_message``
copies each segment out of shared memory — or combines it, ``out = op(base, incoming)`` — then
publishes its ``read`` counter, which frees the slot, and rings the writer if it sleeps for room.

A message that fits in one slot is written and read in one step (``post_short``, ``take_short``);
longer ones stream segment by segment (``Outgoing``, ``Incoming``), so a message of any size passes
through a mailbox of a few slots. A message bigger than the whole mailbox, where the system allows,
takes one slot (header, sender's pid and address); the reader copies the payload straight out of the
sender's array, then frees the slot, which the sender waits for (``wait(ack=True)``; cross_memory.py).
Messages of another communicator or kind that arrive first are read whole and set aside
(``Endpoint.stash``) until someone asks for them.

Nothing here calls back into comm.py: each function returns what the caller needs to decide next.
"""

from __future__ import annotations

import numpy as np

from .cross_memory import goes_remote, post_address, receive_remote
from .header import REMOTE, Meta, pack_header, read_header
from .mailbox import ACK, DATA, HEADER_BYTES, ROOM, Endpoint

SMALL_BYTES = 2048     # up to this size a payload goes through bytes (tobytes): fewer NumPy calls


# -- sending: reserve slots, copy in, ring the doorbell -----------------------------------------------------
def send_message(ep: Endpoint, dst: int, data: np.ndarray, comm: int, call: int, kind: int, tag: int,
                 arrival: float, wait_tag: int) -> None:
    """Write ``data`` (C-contiguous, any shape) with its header into mailbox me -> ``dst``; return once
    the last segment is in. ``wait_tag`` is what this rank's status line shows while it waits for room."""
    if not post_short(ep, dst, data, comm, call, kind, tag, arrival):
        out = Outgoing(ep, dst, data, comm, call, kind, tag, arrival)
        while not out.advance():
            ep.wait(send_to=dst, tag=wait_tag, room_at=out.room_at(), ack=out.awaiting_ack())


def post_short(ep: Endpoint, dst: int, data: np.ndarray, comm: int, call: int, kind: int, tag: int,
               arrival: float) -> bool:
    """Write a message that fits in one slot in one step, if the mailbox to ``dst`` has a free slot.

    Returns False, having written nothing, if the message needs more than one slot or the mailbox is
    full: then ``Outgoing`` streams it (and waits for room).
    """
    nbytes = data.nbytes
    w = ep.written[dst]
    if nbytes > ep.layout.segment - data.dtype.itemsize or w - ep.ctrl[ep.read_out[dst]] >= ep.nslots:
        return False
    ep.seq[dst] += 1
    header = pack_header(ep.seq[dst], comm, call, tag, data, arrival, kind)
    offset = ep.box_out[dst] + (w % ep.nslots) * ep.slot_bytes
    ep.buf[offset:offset + len(header)] = header
    start = offset + HEADER_BYTES
    if nbytes <= SMALL_BYTES:
        ep.buf[start:start + nbytes] = data.tobytes()
    else:
        ep.raw[start:start + nbytes] = data.reshape(-1).view(np.uint8)
    ep.written[dst] = w + 1
    ep.ctrl[ep.written_out[dst]] = w + 1          # publish after the data is in place
    ep.ring_if_asleep(dst, DATA, 2, w + 1)
    return True


class Outgoing:
    """A message on its way from this rank to ``dst``: ``advance()`` writes as many segments as fit (a
    remote message: its one slot, then it waits until the reader has taken it)."""

    def __init__(self, ep: Endpoint, dst: int, data: np.ndarray, comm: int, call: int, kind: int, tag: int,
                 arrival: float):
        self.ep, self.dst = ep, dst
        self.bytes = data.reshape(-1).view(np.uint8)   # data is C-contiguous
        self.remote = goes_remote(ep, self.bytes.size)
        self.seg, self.nseg = ep.layout.segments(self.bytes.size, data.dtype.itemsize)
        if self.remote:
            self.seg, self.nseg, kind = self.bytes.size, 1, kind | REMOTE
        self.next = 0
        ep.seq[dst] += 1
        self.header = pack_header(ep.seq[dst], comm, call, tag, data, arrival, kind)
        self.written_index, self.box = ep.written_out[dst], ep.box_out[dst]

    def awaiting_ack(self) -> bool:
        """True once a remote message is in the mailbox: then the sender waits for the reader to take it."""
        return self.remote and self.next == 1

    def room_at(self) -> int:
        """The reader's ``read`` count at which this full mailbox has room for a batch of segments.

        The batch is half the mailbox, or the rest of the message if shorter: a reader that receives
        this message always frees that much, so waiting for the batch can never deadlock. (One wake-up
        per batch instead of one per segment: a wake-up costs far more CPU than writing a segment.)
        """
        ep = self.ep
        if self.awaiting_ack():
            return self.taken_at
        return ep.written[self.dst] - ep.nslots + min(ep.nslots // 2, self.nseg - self.next)

    def advance(self) -> bool:
        """Write segments while there are free slots; True when the whole message is written (a remote
        message: when the reader has taken it)."""
        ep, dst = self.ep, self.dst
        if self.remote and self.next == 1:
            return ep.ctrl[ep.read_out[dst]] >= self.taken_at
        while self.next < self.nseg:
            if not ep.has_room(dst):
                return False
            w = ep.written[dst]
            offset = self.box + (w % ep.nslots) * ep.slot_bytes
            if self.next == 0:
                ep.buf[offset:offset + len(self.header)] = self.header
            if self.remote:                          # the slot says where the payload is; it stays there
                post_address(ep, offset + HEADER_BYTES, self.bytes)
                ep.written[dst] = self.taken_at = w + 1     # taken once the reader has read that many
                ep.ctrl[self.written_index] = w + 1
                ep.ring_if_asleep(dst, DATA, 2, w + 1)
                self.next = 1
                return False                         # not taken yet (the reader cannot have been this fast)
            lo = self.next * self.seg
            piece = self.bytes[lo:lo + self.seg]
            start = offset + HEADER_BYTES
            ep.buf[start:start + piece.size] = piece
            ep.written[dst] = w + 1
            ep.ctrl[self.written_index] = w + 1      # publish after the data is in place
            ep.ring_if_asleep(dst, DATA, 2, w + 1)
            self.next += 1
        return True


# -- receiving: wait, copy out (or reduce into out), free -------------------------------------------------
def wait_for_header(ep: Endpoint, src: int, comm: int, kind: int,
                    wait_tag: int) -> tuple[Meta, Incoming | None]:
    """Wait for the next message of this communicator and kind from ``src``; consume nothing of it.

    Returns (header, None) for a message that sits in one slot (``read_message`` takes it in one
    step), else (header, the ``Incoming`` that reads it). Messages of other communicators or kinds that
    come first are set aside. ``wait_tag``: what this rank's status line shows while it waits.
    """
    if not (ep.stash and (comm, kind, src) in ep.stash):        # nothing set aside: look at the mailbox
        r = ep.read[src]
        if r >= ep.ctrl[ep.written_in[src]]:
            ep.wait(recv_from=src, tag=wait_tag)
        meta = read_header(ep.buf, ep.box_in[src] + (r % ep.nslots) * ep.slot_bytes)
        if meta.comm == comm and meta.kind == kind and meta.nbytes <= ep.layout.segment - meta.dtype.itemsize:
            return meta, None
    incoming = Incoming(ep, src, comm, kind)
    while (meta := incoming.header()) is None:
        ep.wait(recv_from=src, tag=wait_tag)
    return meta, incoming


def read_message(ep: Endpoint, src: int, meta: Meta, incoming: Incoming | None, target: np.ndarray,
                 ufunc=None, base: np.ndarray | None = None, wait_tag: int = 0) -> None:
    """Receive the message ``wait_for_header`` announced into ``target`` and free its slots.

    target: C-contiguous, of the message's dtype and shape. ufunc None: target = incoming; else
    target = ufunc(base, incoming), base defaulting to target itself (C-contiguous, like target).
    """
    if incoming is None:
        take_short(ep, src, meta, target, ufunc, base)
        return
    incoming.start(target, ufunc, base)
    while not incoming.advance():
        ep.wait(recv_from=src, tag=wait_tag, data_at=incoming.data_at())


def take_short(ep: Endpoint, src: int, meta: Meta, target: np.ndarray, ufunc, base) -> None:
    """Copy (or combine) the one-slot message at the head of mailbox src -> me into ``target``; free its
    slot."""
    r = ep.read[src]
    start = ep.box_in[src] + (r % ep.nslots) * ep.slot_bytes + HEADER_BYTES
    if ufunc is None:
        if meta.nbytes:
            _copy_out(ep, start, meta.nbytes, target)
    else:
        incoming = np.frombuffer(ep.buf, meta.dtype, target.size, start).reshape(target.shape)
        ufunc(target if base is None else base, incoming, out=target)
    ep.read[src] = r + 1
    ep.ctrl[ep.read_in[src]] = r + 1
    ep.ring_if_asleep(src, ROOM | ACK, 1, r + 1)


class Incoming:
    """The next message of one communicator and kind from ``src``, read segment by segment.

    ``header()`` until it returns the header (None: wait for data), then ``start(target, ufunc, base)``
    to say where the payload goes, then ``advance()`` until it returns True (False: wait for data).
    """

    def __init__(self, ep: Endpoint, src: int, comm: int, kind: int):
        self.ep, self.src, self.comm, self.kind = ep, src, comm, kind
        self.meta = None            # the header of our message, once known
        self.stashed = None         # its payload, if it had been set aside earlier
        self.reading = None         # the header of the message being read from the mailbox (ours or not)
        self.done = False

    def header(self) -> Meta | None:
        """The header of our message, or None until it has arrived. Messages of another communicator or
        kind that come first are read whole (as far as they have arrived) and set aside."""
        ep, key = self.ep, (self.comm, self.kind, self.src)
        if self.meta is None and ep.stash.get(key):
            self.meta, self.stashed = ep.stash[key].pop(0)
            if not ep.stash[key]:
                del ep.stash[key]     # an empty stash lets the next receive take the short path
        while self.meta is None and ep.has_data(self.src):
            if self.reading is None:
                slot = ep.box_in[self.src] + (ep.read[self.src] % ep.nslots) * ep.slot_bytes
                meta = read_header(ep.buf, slot)
                if meta.comm == self.comm and meta.kind == self.kind:
                    self.meta = meta
                    break
                self._begin(meta, np.empty(meta.shape, meta.dtype), None, None)    # someone else's: set aside
            if self._copy_segments():
                ep.stash.setdefault((self.reading.comm, self.reading.kind, self.src), []).append(
                    (self.reading, self.target))
                self.reading = None
        return self.meta

    def start(self, target: np.ndarray, ufunc=None, base: np.ndarray | None = None) -> None:
        """Receive our message into ``target`` (see ``read_message``)."""
        if self.stashed is not None:
            base_flat = None if base is None else base.reshape(-1)
            _combine(target.reshape(-1), self.stashed.reshape(-1), ufunc, base_flat)
            self.done = True
        else:
            self._begin(self.meta, target, ufunc, base)

    def data_at(self) -> int:
        """The writer's ``written`` count at which a batch of segments of the message being read has
        arrived: half the mailbox, or the rest of the message if shorter (the writer writes that much
        without waiting for anything else, so waiting for the batch cannot deadlock). Any slot while
        no message is being read (its header is awaited)."""
        ep = self.ep
        if self.reading is None or self.next >= self.nseg:
            return ep.read[self.src] + 1
        return ep.read[self.src] + min(ep.nslots // 2, self.nseg - self.next)

    def advance(self) -> bool:
        """Copy out the segments that have arrived; True once the whole message is in ``target``."""
        if not self.done:
            self.done = self._copy_segments()
        return self.done

    def _begin(self, meta: Meta, target: np.ndarray, ufunc, base) -> None:
        self.reading, self.target, self.ufunc, self.next = meta, target, ufunc, 0
        self.seg, self.nseg = self.ep.layout.segments(meta.nbytes, meta.dtype.itemsize)
        if meta.remote:
            self.seg, self.nseg = meta.nbytes, 1
        self.target_flat = target.reshape(-1)
        self.target_bytes = self.target_flat.view(np.uint8)
        self.base_flat = None if base is None else base.reshape(-1)

    def _copy_segments(self) -> bool:
        """Copy (or combine) the arrived segments of the message being read and free their slots; True
        once it is complete."""
        ep, src, meta = self.ep, self.src, self.reading
        while self.next < self.nseg:
            if not ep.has_data(src):
                return False
            r = ep.read[src]
            start = ep.box_in[src] + (r % ep.nslots) * ep.slot_bytes + HEADER_BYTES
            lo = self.next * self.seg
            n = min(self.seg, meta.nbytes - lo)
            if meta.remote:
                receive_remote(ep, src, start, self.target_flat, self.ufunc, self.base_flat)
            elif self.ufunc is None:
                self.target_bytes[lo:lo + n] = ep.raw[start:start + n]
            else:
                incoming = ep.raw[start:start + n]
                piece = slice(lo // meta.dtype.itemsize, (lo + n) // meta.dtype.itemsize)
                _combine(self.target_flat[piece], incoming.view(meta.dtype), self.ufunc,
                         None if self.base_flat is None else self.base_flat[piece])
            ep.read[src] = r + 1
            ep.ctrl[ep.read_in[src]] = r + 1
            ep.ring_if_asleep(src, ROOM | ACK, 1, r + 1)
            self.next += 1
        return True


def _copy_out(ep: Endpoint, start: int, nbytes: int, target: np.ndarray) -> None:
    """Copy ``nbytes`` bytes of the shared block at ``start`` into the C-contiguous ``target``."""
    if nbytes <= SMALL_BYTES and target.dtype.kind not in "mM":    # memoryviews: fewer calls for a few bytes
        memoryview(target).cast("B")[:] = ep.buf[start:start + nbytes]
    else:                                                         # (datetimes have no buffer format)
        target.reshape(-1).view(np.uint8)[:] = ep.raw[start:start + nbytes]


def _combine(target: np.ndarray, incoming: np.ndarray, ufunc, base: np.ndarray | None = None) -> None:
    """target = incoming, or target = ufunc(base, incoming) (base defaults to target itself)."""
    if ufunc is None:
        target[...] = incoming
    else:
        ufunc(target if base is None else base, incoming, out=target)

"""Messages through a mailbox: ``Outgoing`` writes one segment by segment, ``Incoming`` reads one.

A message takes ceil(nbytes / segment) slots of the mailbox s -> d (at least one; mailbox.py has the
layout); its header (sequence number, communicator, call, tag, nbytes, arrival time, kind, dtype, shape)
rides in the first slot. The writer publishes its ``written`` counter after each segment is in place
and rings the reader's doorbell if the reader sleeps for it; the reader copies (or combines, for
``recv(op=)``) each segment out of shared memory, publishes its ``read`` counter and rings the writer
if the writer sleeps for room.

Most messages fit in one slot. ``post_short`` and ``take_short`` move those in one step each, the same
bytes as ``Outgoing``/``Incoming`` write and read, without their bookkeeping: a 64-byte message is
dominated by Python statements, not by copying, so fewer statements is what makes it faster.
"""

from __future__ import annotations

import functools
import struct
from typing import NamedTuple

import numpy as np

from .mailbox import DATA, HEADER_BYTES, MAX_DIMS, ROOM, Endpoint

# seq, comm, call, tag, nbytes, arrival, kind, ndim, dtype (``call``: see Communicator.collective)
HEADER = struct.Struct("<QQQqQdii16s")
# HEADER followed by the shape, one Struct per number of dimensions (packed and unpacked in one call)
HEADER_WITH_SHAPE = [struct.Struct(HEADER.format + "q" * ndim) for ndim in range(MAX_DIMS + 1)]
assert HEADER_WITH_SHAPE[MAX_DIMS].size <= HEADER_BYTES
NDIM_BYTE = struct.calcsize("<QQQqQdi")          # where ndim sits in the header (its low byte: ndim <= 32)
SMALL_BYTES = 2048     # up to this size a payload goes through bytes (tobytes): fewer NumPy calls


class Outgoing:
    """A message on its way from this rank to ``dst``: ``advance()`` writes as many segments as fit."""

    def __init__(self, ep: Endpoint, dst: int, data: np.ndarray, comm: int, call: int, kind: int, tag: int,
                 arrival: float):
        self.ep, self.dst = ep, dst
        self.bytes = data.reshape(-1).view(np.uint8)   # data is C-contiguous
        self.seg, self.nseg = ep.layout.segments(self.bytes.size, data.dtype.itemsize)
        self.next = 0
        ep.seq[dst] += 1
        self.seq = ep.seq[dst]
        self.header = _header(self.seq, comm, call, tag, data, arrival, kind)
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
            if not ep.stash[self.key]:
                del ep.stash[self.key]     # an empty stash lets the next receive take the short path
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
        meta = self.meta = _read_header(self.ep.buf, offset)
        self.nbytes, self.next = meta.nbytes, 0
        self.seg, self.nseg = self.ep.layout.segments(meta.nbytes, meta.dtype.itemsize)
        self.stashing = meta.comm != self.comm or meta.kind != self.kind
        if self.stashing:       # another communicator's message: keep it aside, in arrival order
            self.stash_key = (meta.comm, meta.kind, self.src)
            self.target, self.ufunc, base = np.empty(meta.shape, meta.dtype), None, None
        else:
            self.target, self.ufunc, base = self.accept(meta)
        self.target_flat = self.target.reshape(-1)
        self.base_flat = None if base is None else base.reshape(-1)
        if self.ufunc is None:
            self.target_bytes = self.target_flat.view(np.uint8)


class Meta(NamedTuple):
    """A message header as the receiver sees it (the fields in the header's order)."""

    seq: int
    comm: int
    call: int
    tag: int
    nbytes: int
    arrival: float
    kind: int
    dtype: np.dtype
    shape: tuple

    def describe(self) -> str:
        return f"tag {self.tag}, {self.dtype} {self.shape}, {self.nbytes} bytes"


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
    header = _header(ep.seq[dst], comm, call, tag, data, arrival, kind)
    offset = ep.box_out[dst] + (w % ep.nslots) * ep.slot_bytes
    ep.buf[offset:offset + len(header)] = header
    start = offset + HEADER_BYTES
    if nbytes <= SMALL_BYTES:
        ep.buf[start:start + nbytes] = data.tobytes()
    else:
        ep.raw[start:start + nbytes] = data.reshape(-1).view(np.uint8)
    ep.written[dst] = w + 1
    ep.ctrl[ep.written_out[dst]] = w + 1          # publish after the data is in place
    ep.ring_if_asleep(dst, DATA, 2)
    return True


def take_short(ep: Endpoint, src: int, comm: int, kind: int, accept, wait_tag: int):
    """Wait for the next message from ``src``; if it fits in one slot and is of this communicator and kind,
    receive it in one step and return (meta, target) — ``accept`` as for ``Incoming``; ``wait_tag`` is
    what the status line shows while this rank waits.

    Returns None, having consumed nothing, for any other message: ``Incoming`` then takes it (it streams
    long messages and sets aside other communicators' messages). Call it only when nothing is set aside
    for (comm, kind, src): that message would come first.
    """
    written_index, r = ep.written_in[src], ep.read[src]
    if r >= ep.ctrl[written_index]:
        ep.wait(lambda: r < ep.ctrl[written_index], recv_from=src, tag=wait_tag)
    offset = ep.box_in[src] + (r % ep.nslots) * ep.slot_bytes
    meta = _read_header(ep.buf, offset)
    if meta.comm != comm or meta.kind != kind or meta.nbytes > ep.layout.segment - meta.dtype.itemsize:
        return None
    target, ufunc, base = accept(meta)
    start = offset + HEADER_BYTES
    if ufunc is None:
        if meta.nbytes:
            _copy_out(ep, start, meta.nbytes, target)
    else:
        incoming = np.frombuffer(ep.buf, meta.dtype, target.size, start).reshape(target.shape)
        ufunc(target if base is None else base, incoming, out=target)
    ep.read[src] = r + 1
    ep.ctrl[ep.read_in[src]] = r + 1
    ep.ring_if_asleep(src, ROOM, 1, r + 1)
    return meta, target


def _copy_out(ep: Endpoint, start: int, nbytes: int, target: np.ndarray) -> None:
    """Copy ``nbytes`` bytes of the shared block at ``start`` into the C-contiguous ``target``."""
    if nbytes <= SMALL_BYTES and target.dtype.kind not in "mM":    # memoryviews: fewer calls for a few bytes
        memoryview(target).cast("B")[:] = ep.buf[start:start + nbytes]
    else:                                                         # (datetimes have no buffer format)
        target.reshape(-1).view(np.uint8)[:] = ep.raw[start:start + nbytes]


def _header(seq: int, comm: int, call: int, tag: int, data: np.ndarray, arrival: float, kind: int) -> bytes:
    return HEADER_WITH_SHAPE[data.ndim].pack(seq, comm, call, tag, data.nbytes, arrival, kind, data.ndim,
                                             _dtype_code(data.dtype), *data.shape)


def _read_header(buf, offset: int) -> Meta:
    ndim = buf[offset + NDIM_BYTE]          # read first: it says which Struct unpacks the rest
    fields = HEADER_WITH_SHAPE[ndim].unpack_from(buf, offset)       # ..., kind, ndim, dtype code, *shape
    return Meta._make((*fields[:7], _dtype(fields[8]), fields[9:]))


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

"""Where everything sits in the shared block: control lines, one mailbox per ordered pair, the shared area.

    control lines (64 bytes each, so two ranks never write the same cache line):
        line 0                 abort flag, rank that failed first
        line 1 + r             done[r]: rank r's function has returned
        line 1 + P + r         status[r]: what rank r sleeps for (ROOM/DATA/ACK bits, send_to, recv_from,
                               tag, room_at, wait number, data_at; written by ``Endpoint.wait``)
        written[s, d], read[s, d]   slots written by s / consumed by d in mailbox s -> d
        meet[r]                rank r's meetings in the shared area: count, then per parity the call's
                               checksum and r's clock, then r's pid and per parity where its array
                               is (shared_area.py, window.py)
    mailboxes: one per ordered pair (s, d), each ``nslots`` slots of [header | segment of payload]
    shared area: per parity (0, 1), per rank, ``area_bytes`` that every rank reads (shared_area.py)
    shared buffers: per rank, ``buffer_bytes`` of arrays that live in the block (shared_buffers.py)

A message takes ceil(nbytes / segment) slots (at least one); its header rides in the first slot
(messages.py packs it). ``room_at`` in a status line: wake this writer when the reader's ``read``
counter reaches it; ``data_at``: wake this reader when the writer's ``written`` counter reaches it; the
wait number counts the rank's sleeps, so find_deadlock can tell them apart.
"""

from __future__ import annotations

MAX_DIMS = 32
HEADER_BYTES = 384          # a message header with up to 32 dims (messages.py), rounded up to 64
LINE = 8                    # int64 per 64-byte control line
PAGE = 4096
ROOM, DATA, ACK = 1, 2, 4    # status bits: asleep for room in a mailbox / for data from a rank / for
                             # the reader to take a message copied straight from this rank (room_at)
MEET = 8                     # / for rank recv_from to reach meeting data_at in the shared area


class Layout:
    """Sizes and offsets of the shared block for ``world_size`` ranks (all in bytes unless said)."""

    def __init__(self, world_size: int, mailbox_bytes: int = 2 * 2**20, nslots: int = 16,
                 area_bytes: int = 2**20, buffer_bytes: int = 64 * 2**20):
        p = self.world_size = world_size
        self.mailbox_bytes, self.nslots = mailbox_bytes, nslots
        self.segment = max(64, mailbox_bytes // nslots // 64 * 64)      # payload bytes per slot
        self.slot_bytes = HEADER_BYTES + self.segment
        self.control_bytes = (1 + 3 * p + 2 * p * p) * LINE * 8
        self.area_offset = self.control_bytes + p * p * nslots * self.slot_bytes
        self.area_bytes = area_bytes // 64 * 64        # the largest array a shared-area allreduce takes
        self.buffer_offset = -(-(self.area_offset + 2 * p * self.area_bytes) // PAGE) * PAGE   # a new page
        self.buffer_bytes = buffer_bytes // PAGE * PAGE    # (pages are only taken once written)
        self.total_bytes = self.buffer_offset + p * self.buffer_bytes
        self.capacity = nslots * self.segment          # payload bytes a mailbox holds: the eager limit

    def line(self, name: str, a: int = 0, b: int = 0) -> int:
        """Index (in int64) of a control value."""
        p = self.world_size
        first = {"abort": 0, "done": 1 + a, "status": 1 + p + a,
                 "written": 1 + 2 * p + a * p + b, "read": 1 + 2 * p + p * p + a * p + b,
                 "meet": 1 + 2 * p + 2 * p * p + a}[name]
        return first * LINE

    def mailbox_offset(self, src: int, dst: int) -> int:
        """Byte offset of mailbox ``src`` -> ``dst`` in the block."""
        return self.control_bytes + (src * self.world_size + dst) * self.nslots * self.slot_bytes

    def area(self, parity: int, rank: int) -> int:
        """Byte offset of ``rank``'s part of the shared area of ``parity`` (0 or 1)."""
        return self.area_offset + (parity * self.world_size + rank) * self.area_bytes

    def buffers(self, rank: int) -> int:
        """Byte offset of rank ``rank``'s shared buffers in the block."""
        return self.buffer_offset + rank * self.buffer_bytes

    def segments(self, nbytes: int, itemsize: int) -> tuple[int, int]:
        """(segment size, number of segments >= 1) of a message of ``nbytes`` bytes.

        A segment holds a whole number of items when an item fits in one.
        """
        if nbytes <= self.segment - itemsize:       # one segment: the usual case, decided at once
            return self.segment, 1
        seg = self.segment // itemsize * itemsize if 0 < itemsize <= self.segment else self.segment
        return seg, max(1, -(-nbytes // seg))

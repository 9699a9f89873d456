"""The shared area: arrays that every rank of the cluster can read, and meetings instead of messages.

A message through a mailbox is copied twice (into the mailbox, out of it) and costs the receiver a
header to check and a wake-up. Ranks that share memory can do without: rank r writes its array into
its own part of the area, all ranks *meet*, and then any rank reads any other's array in place. That is
how MPICH and NCCL reduce small arrays inside one machine, and what ``allreduce(...,
algorithm="shared_memory")`` does (collectives/shared_memory.py).

    area = comm.shared_area()                  # None unless the ranks share a block (see there)
    arrays = area.arrays(dtype, n)             # arrays[q]: rank q's n items in the area, for this call
    area.meet(sent, received)                  # wait until every rank has reached this meeting
    win = area.window(flat, sent, received)    # a meeting that exposes every rank's own array (window.py)
    buffer = area.buffers.empty(shape, dtype)  # an array that lives in the block (shared_buffers.py)

The area lies at the end of the shared block (layout.py): per rank ``area_bytes`` (the largest array
it takes), twice. Successive calls alternate between the two parities, so a rank may write the next
call's input while slower ranks still read this call's result; the meeting of the next call keeps it
from getting two calls ahead.

A meeting: rank r raises its meeting count in its ``meet`` line, rings whoever sleeps for that, and
waits (``Endpoint.wait``: a bounded spin, then its doorbell, status MEET) until every other rank's
count has reached the same number. Faults, timeouts and deadlocks are reported as for messages; the
line also holds the call's checksum (``comm.collective``), so ranks in different calls find out.

On the simulated clock a meeting is charged as the messages it replaces: each piece another rank reads
out of this rank's array is a send to that rank, each piece this rank reads a receive (``meet``'s
``sent`` and ``received``), so the α-β cost and ``comm.stats`` match the same exchange by messages.
"""

from __future__ import annotations

import struct

import numpy as np

from .checks import MessageMismatchError
from .cross_memory import location
from .layout import MEET
from .shared_buffers import SharedBuffers
from .window import Window

MEET_TAG = -4                     # what the status line shows as the tag of a meeting (deadlock.py)
_FLOAT, _INT = struct.Struct("<d"), struct.Struct("<q")


class SharedArea:
    """The shared area as seen by the world communicator ``comm`` of one rank (built by Communicator)."""

    def __init__(self, comm):
        self._comm, self._ep = comm, comm._ep
        layout = self._ep.layout
        self.capacity = layout.area_bytes         # the largest array (bytes) ``arrays`` can place
        self.calls = self.meetings = 0
        self._lines = [layout.line("meet", r) for r in range(layout.world_size)]
        self._peers = [q for q in range(layout.world_size) if q != self._ep.rank]
        self.buffers = SharedBuffers(self._ep)     # arrays that live in the block (shared_buffers.py)

    def arrays(self, dtype: np.dtype, n: int) -> list[np.ndarray]:
        """Every rank's array of ``n`` items of ``dtype`` in the area, for the next call (rank order).

        Only this rank writes its own array; the others may read it after the next meeting.
        """
        dtype = np.dtype(dtype)
        if not 0 <= n * dtype.itemsize <= self.capacity:
            raise ValueError(f"the shared area holds at most {self.capacity} bytes per rank, "
                             f"got {n} items of {dtype}")
        layout, raw = self._ep.layout, self._ep.raw
        parity, self.calls = self.calls % 2, self.calls + 1
        starts = [layout.area(parity, r) for r in range(layout.world_size)]
        return [raw[s:s + n * dtype.itemsize].view(dtype) for s in starts]

    @property
    def windows(self) -> bool:
        """True if ``window`` works for any array: processes may copy straight between each other here
        (cross_memory.py; the same answer on every rank: one system, one environment)."""
        return self._ep.cross_memory

    def window(self, flat: np.ndarray, sent: list[int], received: list[int]) -> Window:
        """Meet (as ``meet``), exposing every rank's ``flat`` (contiguous, 1-D; the same dtype and size
        on every rank) to every other: returns the Window (window.py). The closing fence is the
        caller's next ``meet``. A flat in the shared block (a shared buffer, a slot of the area) is
        reached through views; a private one needs ``windows`` (else RuntimeError, before meeting)."""
        where = location(self._ep, flat)                                # in the block, or in our memory
        if where >= 0 and not self.windows:
            raise RuntimeError("windows on private arrays need cross-memory copies (process_vm_readv), "
                               "which this system or MINIDIST_CROSS_MEMORY=0 turns off; expose an array "
                               "in the shared block, or check SharedArea.windows first")
        self.meet(sent, received, where=where)
        ctrl, g = self._ep.ctrl, self.meetings
        return Window(self._ep, flat, [(ctrl[line + 5], ctrl[line + 6 + g % 2]) for line in self._lines])

    def meet(self, sent: list[int], received: list[int], where: int = 0) -> None:
        """Wait until every rank has reached this meeting; charge the pieces read across it.

        sent[q]: bytes rank q reads out of this rank's array after this meeting; received[q]: bytes
        this rank reads out of rank q's (both indexed by rank; this rank's own entries are ignored).
        where: where this rank's array is, for ``window`` (``cross_memory.location``).
        Raises MessageMismatchError if a rank meets here in another collective call.
        """
        comm, ep, ledger, stats = self._comm, self._ep, self._comm._ledger, self._comm.stats
        me, ctrl, peers = ep.rank, ep.ctrl, self._peers
        for q in peers:                               # the sends this meeting stands for
            ledger.send(sent[q], q)
            stats.bytes_sent += sent[q]
            stats.messages_sent += 1
        g = self.meetings = self.meetings + 1
        mine = self._lines[me]
        ctrl[mine + 1 + g % 2] = comm._call            # two slots: a peer may be one meeting ahead
        ctrl[mine + 3 + g % 2] = _INT.unpack(_FLOAT.pack(ledger.clock))[0]
        ctrl[mine + 5], ctrl[mine + 6 + g % 2] = ep.pid, where         # where this rank's array is (window)
        ctrl[mine] = g                                 # published last: the count says the rest is there
        for q in peers:
            ep.ring_if_asleep(q, MEET, 2, g)
        for q in peers:
            line = self._lines[q]
            if ctrl[line] < g:
                ep.wait(recv_from=q, tag=MEET_TAG, data_at=g, met=lambda line=line: ctrl[line] >= g)
            if ctrl[line + 1 + g % 2] != comm._call:
                raise MessageMismatchError(
                    f"collective mismatch: rank {comm.rank} called {comm._call_name}, but not every rank "
                    f"made the same call: rank {q} met it in the shared area in another call")
        for q in peers:                               # the receives: each piece was there at the meeting
            arrival = _FLOAT.unpack(_INT.pack(ctrl[self._lines[q] + 3 + g % 2]))[0]
            ledger.recv(arrival, received[q], q)
            stats.bytes_received += received[q]
            stats.messages_received += 1

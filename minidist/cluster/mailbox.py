"""The transport under the Communicator: mailboxes in one block of shared memory, and doorbells.

The block's layout (control lines, then one mailbox per ordered pair of ranks) is in layout.py.

Mailbox s -> d is a ring buffer with one writer (s) and one reader (d): s may write slot ``written``
while ``written - read < nslots``; d may read slot ``read`` while ``read < written``. Each side owns
one counter, so no lock is needed. messages.py says what goes into the slots.

Waiting never burns CPU: a rank that must wait (``Endpoint.wait``) writes in its status line what it
waits for and sleeps on its *doorbell* semaphore; whoever writes the data it waits for, or frees the
room, rings the bell. Every ``POLL`` seconds the sleeper also looks for an abort, a peer that has
returned, or a deadlock (``find_deadlock``: every rank asleep and none can ever be woken), and raises
instead of hanging. This module calls nothing above it: ``wait`` decides from the counters alone
whether a rank may go on.
"""

from __future__ import annotations

import os
import threading
import time

import numpy as np

from .deadlock import blocked_on, find_deadlock
from .layout import ACK, DATA, HEADER_BYTES, MAX_DIMS, MEET, ROOM, Layout  # noqa: F401 (re-exported)
from .process_setup import exit_if_orphaned
from .wall import WallTimes

POLL = 0.05                                     # seconds between checks for abort / returned peers
YIELDS = 3                                      # sched_yield()s before sleeping, when spinning is not allowed
SPIN = 50e-6                                    # bounded spin before sleeping (only if awake ranks <= cores)
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


class DeadlockError(RuntimeError):
    """Every rank that has not returned waits for a message or for room that no rank can ever provide."""


class Endpoint:
    """One rank's view of the shared block: its mailboxes, counters, doorbells and stash.

    ``buf`` is the shared block (a memoryview), ``doorbells`` one semaphore per rank; ``cross_memory``:
    messages bigger than a mailbox are read straight out of the sender's array (cross_memory.py).
    """

    def __init__(self, layout: Layout, rank: int, buf, doorbells, cores: int, cross_memory: bool = False):
        self.layout, self.rank, self.doorbells, self.cores = layout, rank, doorbells, cores
        self.cross_memory, self.pid, self.scratch = cross_memory, os.getpid(), None
        # the control lines as 64-bit integers (a memoryview: reading one gives a Python int, quickly)
        self.ctrl = buf[:layout.control_bytes].cast("q")
        self.buf = buf
        self.raw = np.ndarray(layout.total_bytes, dtype=np.uint8, buffer=buf)
        self.block_address = self.raw.ctypes.data      # where the block starts in this process
        p = layout.world_size
        self.nslots, self.slot_bytes = layout.nslots, layout.slot_bytes
        me, peers = rank, range(p)
        self.status = [layout.line("status", r) for r in peers]
        # the other ranks' status and done lines, for may_spin
        self.others = [(self.status[r], layout.line("done", r)) for r in peers if r != rank]
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
        self.wall = WallTimes()              # real seconds in calls and waits (wall.py)

    def close(self) -> None:
        """Drop the views of the shared block, so that it can be unmapped."""
        if self.ctrl is not None:
            self.ctrl.release()
        self.ctrl = self.raw = self.buf = None

    # -- shared state ------------------------------------------------------------------------------------
    def aborting(self) -> bool:
        """True once any rank (or the parent) has asked the run to stop."""
        return self.ctrl[0] != 0

    def abort(self) -> None:
        """Tell every rank to stop (they notice at once: all doorbells ring)."""
        if self.ctrl[0] == 0:
            self.ctrl[1] = self.rank
            self.ctrl[0] = 1
        for bell in self.doorbells:
            bell.release()

    def await_abort(self, seconds: float) -> bool:
        """Sleep until the run is aborted (the abort rings every doorbell) or ``seconds`` have passed;
        True if it is aborted. For a rank that finds a peer's process gone: the launcher notices the
        death and aborts the run, and the rank that died, not this one, is then named as the cause."""
        deadline = time.monotonic() + seconds
        while not self.aborting() and (left := deadline - time.monotonic()) > 0:
            self.doorbells[self.rank].acquire(True, left)
        return self.aborting()

    def mark_done(self) -> None:
        """Tell every rank that this rank's function has returned (a peer waiting for it then raises)."""
        self.ctrl[self.layout.line("done", self.rank)] = 1
        for bell in self.doorbells:
            bell.release()

    def peer_done(self, peer: int) -> bool:
        """True if world rank ``peer``'s function has returned."""
        return self.ctrl[self.layout.line("done", peer)] != 0

    def ring_if_asleep(self, peer: int, reason: int, column: int, count: int) -> None:
        """Ring ``peer``'s doorbell if it sleeps for ``reason`` (ROOM/DATA/ACK bits) concerning this rank.

        ``count`` is this rank's new counter of the mailbox between them: for ROOM and ACK (column 1)
        the reader's ``read``, which must reach the sleeper's room_at; for DATA (column 2) the writer's
        ``written``, which must reach its data_at. (One wake-up per batch of segments, not per segment.)
        """
        fence()
        st = self.status[peer]
        if self.ctrl[st] & reason and self.ctrl[st + column] == self.rank and \
                count >= self.ctrl[st + (6 if column == 2 else 4)]:
            self.doorbells[peer].release()

    def has_room(self, dst: int) -> bool:
        """True if mailbox me -> dst has a free slot."""
        return self.written[dst] - self.ctrl[self.read_out[dst]] < self.nslots

    def has_data(self, src: int) -> bool:
        """True if mailbox src -> me holds a slot this rank has not read yet."""
        return self.read[src] < self.ctrl[self.written_in[src]]

    # -- waiting -----------------------------------------------------------------------------------------
    def wait(self, send_to: int = -1, recv_from: int = -1, tag: int = 0, room_at: int = 0,
             ack: bool = False, data_at: int = 0, met=None) -> None:
        """Return once there is room in mailbox me -> ``send_to`` or data in ``recv_from`` -> me.

        send_to, recv_from: world ranks, -1 for "not waiting for that"; tag: what the status line shows
        (``blocked_on``); room_at: ring me only once the reader of me -> send_to has read this many
        slots (``Outgoing.room_at``; a poll or data from ``recv_from`` may still wake me earlier).
        ack: wait instead until that reader *has* read room_at slots (it has taken a message that it
        copies straight out of this rank's memory). data_at: ring me only once the writer of
        recv_from -> me has written this many slots (``Incoming.data_at``; any data still counts).
        met: wait instead until ``met()`` is true: rank recv_from has reached meeting data_at in the
        shared area (shared_area.py; the status line says MEET).
        Raises Aborted, PeerReturnedError or DeadlockError instead of waiting forever.

        Waking a sleeping process costs tens of microseconds, far more than a short message, so a rank
        first spins for up to ``SPIN`` seconds if ``may_spin``, else yields its core ``YIELDS`` times (a
        yield hands the core to an awake rank, often the one it waits for; with nobody else wanting the
        core it returns at once, so this is no busy-wait). Then it writes its status line (what it
        waits for, and a new wait number) and sleeps on its doorbell, re-checking after every ring and
        every ``POLL`` seconds.
        """
        start = time.perf_counter()             # (wall.py: always-on counters of real time)
        try:
            self._wait(send_to, recv_from, tag, room_at, ack, data_at, met)
        finally:
            self.wall.waiting += time.perf_counter() - start

    def _wait(self, send_to, recv_from, tag, room_at, ack, data_at, met) -> None:
        def ready() -> bool:  # from the two mailboxes' counters only (find_deadlock reads the same)
            return (
                send_to >= 0 and self.written[send_to] - self.ctrl[self.read_out[send_to]] < self.nslots
            ) or (recv_from >= 0 and self.read[recv_from] < self.ctrl[self.written_in[recv_from]])

        def taken() -> bool:  # the ack variant: my message to send_to has been read
            return self.ctrl[self.read_out[send_to]] >= room_at or (
                recv_from >= 0 and self.read[recv_from] < self.ctrl[self.written_in[recv_from]])

        if ack or met:
            ready = met or taken
        if (recv_from >= 0 or not ack) and self.may_spin():   # (a large message takes longer: sleep)
            stop = time.perf_counter() + SPIN
            while time.perf_counter() < stop:
                if ready():
                    return
        else:
            for _ in range(YIELDS):
                os.sched_yield()
                if ready():
                    return
        bell, st = self.doorbells[self.rank], self.status[self.rank]
        self.wall.sleeps += 1
        self.ctrl[st + 5] += 1                 # a new wait number, published before the bits below
        self.ctrl[st + 1], self.ctrl[st + 2], self.ctrl[st + 3] = send_to, recv_from, tag
        self.ctrl[st + 4], self.ctrl[st + 6] = room_at, data_at
        self.ctrl[st] = MEET if met else \
            ((ACK if ack else ROOM) if send_to >= 0 else 0) | (DATA if recv_from >= 0 else 0)
        fence()
        try:
            while True:
                while bell.acquire(False):     # old rings: their events are covered by the check below
                    pass
                if ready():
                    return
                if not bell.acquire(True, POLL):
                    exit_if_orphaned()         # the launcher is gone: nobody will ever collect this rank
                    if self.aborting():
                        raise Aborted()
                    for peer in (recv_from, send_to):
                        if peer >= 0 and self.peer_done(peer) and not ready():
                            what = ("a meeting in the shared area with" if met else
                                    "a message from" if peer == recv_from else
                                    "its message to be taken by" if ack else "room in the mailbox to")
                            raise PeerReturnedError(
                                f"rank {self.rank} waits for {what} rank {peer} (tag {tag}), but rank "
                                f"{peer}'s function has already returned")
                    deadlock = self.find_deadlock()
                    if deadlock:
                        raise DeadlockError(deadlock)
                elif self.aborting():
                    raise Aborted()
        finally:
            self.ctrl[st] = 0

    def find_deadlock(self) -> str | None:
        """What every rank waits for, if no rank can ever make progress again; else None (deadlock.py)."""
        return find_deadlock(self)

    def blocked_on(self, rank: int, line: list[int] | None = None) -> str:
        """'recv from rank 3 (tag 0)' — what ``rank`` is asleep for (its status line, or ``line``)."""
        return blocked_on(self, rank, line)

    def may_spin(self) -> bool:
        """Spin before sleeping only while the awake ranks (this one included) fit on the cores: every rank
        if there are no more ranks than cores, else those whose status line says they are not asleep.
        Spinning on a core another awake rank needs would only delay that rank."""
        p = self.layout.world_size
        if p <= self.cores:
            return True
        ctrl, awake = self.ctrl, 1                  # this rank
        for status, done in self.others:            # (a plain loop: this runs before every wait)
            if ctrl[status] == 0 and ctrl[done] == 0:
                awake += 1
                if awake > self.cores:
                    return False
        return True


def timeout_report(timeout: float, states: dict[int, str]) -> str:
    """The timeout report of both backends: 'run timed out after 2 s; still running: rank 0: recv from rank
    1 (tag 0); rank 1: running' (states: what each rank still running was doing, by rank)."""
    waiting = "; ".join(f"rank {r}: {what}" for r, what in sorted(states.items()))
    return f"run timed out after {timeout:g} s; still running: {waiting or 'none'}"

"""The transport under the Communicator: mailboxes in one block of shared memory, and doorbells.

Layout of the shared block (created by the launcher, mapped by every rank)::

    control lines (64 bytes each, so two ranks never write the same cache line):
        line 0                 abort flag, rank that failed first
        line 1 + r             done[r]: rank r's function has returned
        line 1 + P + r         status[r]: what rank r sleeps for (ROOM/DATA bits, send_to, recv_from, tag,
                               room_at, wait number)
        written[s, d], read[s, d]   slots written by s / consumed by d in mailbox s -> d
    mailboxes: one per ordered pair (s, d), each ``nslots`` slots of [header | segment of payload]

A message takes ceil(nbytes / segment) slots (at least one); its header (sequence number, communicator,
kind, tag, dtype, shape, nbytes, arrival time) rides in the first. Mailbox s -> d is a ring buffer with a
single writer (s) and a single reader (d): s may write slot ``written`` while ``written - read <
nslots``; d may read slot ``read`` while ``read < written``. Each side owns one counter, so no lock is
needed. Larger messages stream through the ring, segment after segment (messages.py: Outgoing, Incoming).

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
on a core another awake rank needs would only delay that rank. Then the rank yields its core instead
(``sched_yield``, ``YIELDS`` times) before it sleeps: a yield hands the core straight to an awake rank
with work to do, often the very one it waits for, and costs a few microseconds where a sleep and a
wake-up cost tens. When no other rank wants the core, a yield returns at once, so this is no busy-wait.

A rank whose poll finds nothing to do looks for a *deadlock* (``find_deadlock``): every rank that has not
returned is asleep, and none of them can be woken, because no message and no free slot can ever come.
Then it raises ``DeadlockError`` saying what every rank waits for, instead of hanging until the timeout.
"""

from __future__ import annotations

import os
import threading
import time

import numpy as np

from .process_setup import exit_if_orphaned

MAX_DIMS = 32
HEADER_BYTES = 384                              # a message header with up to 32 dims (messages.py), rounded to 64
LINE = 8                                        # int64 per 64-byte control line
POLL = 0.05                                     # seconds between checks for abort / returned peers
YIELDS = 3                                       # sched_yield()s before sleeping, when spinning is not allowed
SPIN = 50e-6                                    # bounded spin before sleeping (only if awake ranks <= cores)

# Status line of a rank: [what it sleeps for (bits), send_to, recv_from, tag, room_at, wait number]
# (room_at: wake this writer when the reader's ``read`` counter reaches it; the wait number counts the
# rank's sleeps, so that find_deadlock can tell one sleep from the next)
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


class DeadlockError(RuntimeError):
    """Every rank that has not returned waits for a message or for room that no rank can ever provide."""


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

    def segments(self, nbytes: int, itemsize: int) -> tuple[int, int]:
        """(segment size, number of segments >= 1) of a message of ``nbytes`` bytes.

        A segment holds a whole number of items when an item fits in one.
        """
        if nbytes <= self.segment - itemsize:       # one segment: the usual case, decided at once
            return self.segment, 1
        seg = self.segment // itemsize * itemsize if 0 < itemsize <= self.segment else self.segment
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

        Raises Aborted, PeerReturnedError or DeadlockError instead of waiting forever. ``ready`` must depend
        only on the counters of mailboxes me -> send_to and recv_from -> me (find_deadlock reads those).
        """
        if self.may_spin():
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
        self.ctrl[st + 5] += 1                 # a new wait number, published before the bits below
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
                    exit_if_orphaned()         # the launcher is gone: nobody will ever collect this rank
                    if self.aborting():
                        raise Aborted()
                    for peer in (recv_from, send_to):
                        if peer >= 0 and self.peer_done(peer) and not ready():
                            what = "a message from" if peer == recv_from else "room in the mailbox to"
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

    def may_spin(self) -> bool:
        """Spin before sleeping only while the awake ranks (this one included) fit on the cores."""
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

    def find_deadlock(self) -> str | None:
        """What every rank waits for, if no rank can ever make progress again; else None.

        A deadlock: every rank that has not returned sleeps in ``wait``, and none can be woken — a rank
        waiting for data from s finds mailbox s -> it empty (written == read), one waiting for room to d
        finds mailbox it -> d full (written - read >= nslots), one in sendrecv both. Any unread data, even
        a message it will only stash, means "not now": the next poll looks again.

        Why it never cries wolf, though the other ranks run on while we look: we read every status line
        and done flag, then the counters, then every status line and done flag again, and only trust
        two identical snapshots. A rank inside ``wait`` writes nothing but its own status line; one that
        leaves ``wait`` clears its bits, and one that enters again has a new wait number. So identical
        snapshots, with every rank asleep or done, mean that no rank was outside ``wait`` while we read
        the counters: nobody wrote a counter then, so the counters we read were true all that time, and
        if they let nobody progress, nobody ever will (a rank only wakes for good once a counter moves).
        Like the rest of this file, it relies on the CPU making stores visible in program order (x86 does).
        """
        ctrl, line = self.ctrl, self.layout.line

        def snapshot() -> list[tuple]:      # (done, bits, send_to, recv_from, tag, room_at, wait number)
            return [(ctrl[line("done", r)], *ctrl[st:st + 6].tolist()) for r, st in enumerate(self.status)]

        first = snapshot()
        for r, (finished, mask, send_to, recv_from, *_) in enumerate(first):
            if finished:
                continue
            if mask == 0:
                return None                          # rank r is running: it may still send
            if any(peer >= 0 and first[peer][0] for peer in (send_to, recv_from)):
                return None                          # its peer returned: it raises PeerReturnedError itself
            if mask & DATA and ctrl[line("written", recv_from, r)] > ctrl[line("read", recv_from, r)]:
                return None                          # data has arrived for it
            if mask & ROOM and ctrl[line("written", r, send_to)] - ctrl[line("read", r, send_to)] < self.nslots:
                return None                          # a slot is free for it
        if snapshot() != first:
            return None                                  # someone moved while we looked: look again later
        return "deadlock: every rank is waiting and no message can arrive: " + "; ".join(
            f"rank {r} returned" if status[0] else f"rank {r} waits for {self.blocked_on(r, status[1:])}"
            for r, status in enumerate(first))

    def blocked_on(self, rank: int, line: list[int] | None = None) -> str:
        """'recv from rank 3 (tag 0)' — what ``rank`` is asleep for, read from its status line (or ``line``)."""
        st = self.status[rank]
        mask, send_to, recv_from, tag = (self.ctrl[st:st + 4].tolist() if line is None else line)[:4]
        parts = ([f"send to rank {send_to}"] if mask & ROOM else []) + \
                ([f"recv from rank {recv_from}"] if mask & DATA else [])
        what = {-1: "barrier", -2: "split", -3: "all_equal"}.get(tag, f"tag {tag}")
        return f"{' + '.join(parts)} ({what})" if parts else "running"

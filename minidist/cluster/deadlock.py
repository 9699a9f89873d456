"""What a rank waits for, read from the status lines: the deadlock check and the words for a report.

``Endpoint.wait`` (mailbox.py) writes, before it sleeps, what the rank waits for in its status line:
the bits ROOM / DATA / ACK / MEET (layout.py), the peer, the tag and the counter value that lets it go
on. These two functions only read those lines and the counters beside them.
"""

from __future__ import annotations

from .layout import ACK, DATA, MEET, ROOM

KINDS = {-1: "barrier", -2: "split", -3: "all_equal", -4: "allreduce in the shared area"}   # tags < 0


def find_deadlock(ep) -> str | None:
    """What every rank waits for, if no rank can ever make progress again; else None.

    ep: an Endpoint. A deadlock: every rank that has not returned sleeps in ``wait``, and none can be
    woken — a rank waiting for data from s finds mailbox s -> it empty (written == read), one waiting
    for room to d finds mailbox it -> d full (written - read >= nslots), one waiting for d to take its
    message finds d's read count below its room_at, one in sendrecv both, one waiting to meet s in the
    shared area finds s's meeting count below its data_at. Any unread data, even a message it will
    only stash, means "not now": the next poll looks again.

    Why it never cries wolf, though the other ranks run on while we look: we read every status line
    and done flag, then the counters, then every status line and done flag again, and only trust
    two identical snapshots. A rank inside ``wait`` writes nothing but its own status line; one that
    leaves ``wait`` clears its bits, and one that enters again has a new wait number. So identical
    snapshots, with every rank asleep or done, mean that no rank was outside ``wait`` while we read
    the counters: nobody wrote a counter then, so the counters we read were true all that time, and
    if they let nobody progress, nobody ever will (a rank only wakes for good once a counter moves).
    Like mailbox.py, it relies on the CPU making stores visible in program order (x86 does).
    """
    ctrl, line = ep.ctrl, ep.layout.line

    def snapshot() -> list[tuple]:      # (done, bits, send_to, recv_from, tag, room_at, wait number)
        return [(ctrl[line("done", r)], *ctrl[st:st + 6].tolist()) for r, st in enumerate(ep.status)]

    first = snapshot()
    for r, (finished, mask, send_to, recv_from, _, room_at, _) in enumerate(first):
        if finished:
            continue
        if mask == 0:
            return None                          # rank r is running: it may still send
        if any(peer >= 0 and first[peer][0] for peer in (send_to, recv_from)):
            return None                          # its peer returned: it raises PeerReturnedError itself
        if mask & DATA and ctrl[line("written", recv_from, r)] > ctrl[line("read", recv_from, r)]:
            return None  # data has arrived for it
        if (
            mask & ROOM
            and ctrl[line("written", r, send_to)] - ctrl[line("read", r, send_to)] < ep.nslots
        ):
            return None                          # a slot is free for it
        if mask & ACK and ctrl[line("read", r, send_to)] >= room_at:
            return None                          # its message has been taken
        if mask & MEET and ctrl[line("meet", recv_from)] >= ctrl[ep.status[r] + 6]:
            return None                          # the rank it waits for has reached the meeting
    if snapshot() != first:
        return None                                  # someone moved while we looked: look again later
    return "deadlock: every rank is waiting and no message can arrive: " + "; ".join(
        f"rank {r} returned" if status[0] else f"rank {r} waits for {blocked_on(ep, r, status[1:])}"
        for r, status in enumerate(first))


def blocked_on(ep, rank: int, line: list[int] | None = None) -> str:
    """'recv from rank 3 (tag 0)' — what ``rank`` is asleep for, read from its status line in ``ep``'s
    block (or from ``line``: bits, send_to, recv_from, tag)."""
    st = ep.status[rank]
    mask, send_to, recv_from, tag = (ep.ctrl[st:st + 4].tolist() if line is None else line)[:4]
    parts = ([f"send to rank {send_to}"] if mask & (ROOM | ACK) else []) + \
            ([f"recv from rank {recv_from}"] if mask & DATA else []) + \
            ([f"rank {recv_from} to meet"] if mask & MEET else [])
    what = KINDS.get(tag, f"tag {tag}")
    return f"{' + '.join(parts)} ({what})" if parts else "running"

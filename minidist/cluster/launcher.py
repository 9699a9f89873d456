"""``run(fn, world_size, *args)``: start one process per rank, call ``fn(comm, *args)`` in each, collect.

How a run goes:

1. The parent creates the shared block (mailbox.py's Layout) and one doorbell semaphore per rank
   (process_setup.py: anonymous under fork; under spawn named, until every rank has opened them).
2. It starts ``world_size`` processes with the ``multiprocess`` package (fork by default on Linux,
   spawn elsewhere), each recorded before it starts. Each builds its Communicator, calls ``fn`` and
   sends back ("ok", result, ledger) or ("error", summary, traceback) through its own pipe.
3. The parent sleeps in ``multiprocess.connection.wait`` on the pipes and the process sentinels (a
   sentinel becomes ready when its process ends) until every rank has answered, something goes wrong,
   or ``timeout`` runs out. No polling loop.
4. On failure it raises the abort flag in shared memory and rings every doorbell: ranks blocked in
   send/recv raise at once; ranks busy computing are terminated after ``GRACE`` seconds, killed if they
   ignore that. Then ``ClusterError`` names the rank that failed first, how (exception, exit code or
   signal), and carries its traceback. Ctrl-C in the parent goes the same way. Shared memory and
   semaphores are unlinked and unmapped in every case, at once (not when the error's traceback, which
   holds this frame, is collected), and a rank never outlives its launcher (process_setup.py).
"""

from __future__ import annotations

import math
import numbers
import os
import signal
import sys
import time
from itertools import count

import multiprocess
import numpy as np
from multiprocess.connection import wait

from . import cross_memory
from .comm import Communicator
from .ledger import Device, Ledger, LinkModel, Trace, checked_link
from .mailbox import Aborted, Endpoint, Layout, timeout_report
from .wall import now, pack_ledger, unpack_ledger

from .process_setup import (check_picklable, die_with_parent, explain_exception, leave_block,  # isort: skip
                            one_blas_thread, release_block, settle_rank, shared_resources, signals_deferred,
                            unlink_names)

MAX_RANKS = 64
GRACE = 1.0              # seconds a failing run gives the other ranks to stop before terminating them
_names = count()
_last_names: list[str] = []


class ClusterError(RuntimeError):
    """A run failed. ``rank``: the rank that failed first (None for a timeout); ``exitcode``; ``details``:
    its traceback or what happened; the message says all of it."""

    def __init__(self, message: str, rank: int | None = None, exitcode: int | None = None, details: str = ""):
        super().__init__(message)
        self.rank, self.exitcode, self.details = rank, exitcode, details


def run(fn, world_size: int, *args, timeout: float = 60.0, link: LinkModel | None = None,
        device: Device | None = None, start_method: str | None = None,
        mailbox_bytes: int = 2 * 2**20) -> list:
    """Run ``fn(comm, *args)`` on ``world_size`` ranks (processes); return their results in rank order.

    ``timeout`` bounds the run (seconds; None/inf: none, a deadlock still ends it); ``link`` (LinkModel or
    Topology) and ``device`` set the simulated machine; ``start_method``: "fork" (Linux default), "spawn";
    ``mailbox_bytes`` is the capacity of each mailbox (the eager limit of ``send``).
    Raises ``ClusterError`` if a rank raises, exits, is killed, or the time runs out.
    """
    return _run(fn, world_size, args, timeout, link, device, start_method, mailbox_bytes)[0]


def run_traced(fn, world_size: int, *args, **options) -> tuple[list, Trace]:
    """Like ``run``, but every rank keeps its spans: also returns the ``Trace`` (spans, clocks, stats, and
    the real seconds of the run's start-up and shutdown: wall.py)."""
    called = now()
    results, packed = _run(fn, world_size, args, keep_spans=True, **options)
    ledgers = [unpack_ledger(data) for data in packed]       # (spans, clock, stats, began, returned)
    return results, Trace([span for ledger in ledgers for span in ledger[0]], [lg[1] for lg in ledgers],
                          [lg[2] for lg in ledgers], startup=max(lg[3] for lg in ledgers) - called,
                          shutdown=now() - max(lg[4] for lg in ledgers))


def last_resource_names() -> list[str]:
    """The /dev/shm names (segment, semaphores) the last run of this process created — for tests."""
    return list(_last_names)


def _run(fn, world_size, args, timeout=60.0, link=None, device=None, start_method=None,
         mailbox_bytes=2 * 2**20, keep_spans=False):
    if not callable(fn):
        raise TypeError(f"run expects a function fn(comm, *args), got {type(fn).__name__}")
    if not isinstance(world_size, (int, np.integer)) or isinstance(world_size, bool) or world_size < 1:
        raise ValueError(f"world_size must be an int >= 1, got {world_size!r}")
    if world_size > MAX_RANKS:
        raise ValueError(f"world_size must be <= {MAX_RANKS} (one process and P-1 mailboxes per rank), "
                         f"got {world_size}")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, numbers.Real)):
        raise TypeError(f"timeout must be a number of seconds or None, got {type(timeout).__name__}")
    if timeout is not None and not timeout > 0:             # also NaN
        raise ValueError(f"timeout must be > 0 seconds (None or inf: no limit), got {timeout!r}")
    if not isinstance(mailbox_bytes, int) or mailbox_bytes < 1024:
        raise ValueError(f"mailbox_bytes must be an int >= 1024, got {mailbox_bytes!r}")
    methods = multiprocess.get_all_start_methods()
    # fork on Linux; elsewhere spawn, Python's own default (fork is unsafe on macOS, absent on Windows)
    method = start_method or ("fork" if sys.platform.startswith("linux") else "spawn")
    if method not in ("fork", "spawn") or method not in methods:
        raise ValueError(f"start_method must be one of {[m for m in methods if m in ('fork', 'spawn')]}, "
                         f"got {start_method!r}")
    if method == "spawn":
        check_picklable(fn, args)
    ctx = multiprocess.get_context(method)
    layout = Layout(int(world_size), mailbox_bytes)
    # A rank may spin briefly before sleeping while the ranks that are awake fit on the cores (mailbox.py)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    plan = (layout, checked_link(link, int(world_size)), device or Device(), cores, keep_spans, os.getpid())

    block = shm = parent = None
    doorbells, procs, conns = [], [], []
    try:
        with signals_deferred():                  # an interrupt here must not lose a name in /dev/shm
            block, shm, doorbells = shared_resources(ctx, method, layout.total_bytes, world_size,
                                                     f"minidist_{os.getpid()}_{next(_names)}")
        _last_names[:] = ([shm.name] if shm else []) + [s._semlock.name for s in doorbells if s._semlock.name]
        parent = Endpoint(layout, -1, block, doorbells, cores=0)
        with one_blas_thread(method):
            for rank in range(world_size):
                reader, writer = ctx.Pipe(duplex=False)
                conns.append(reader)
                shared = block if shm is None else shm      # spawn: the segment travels by name
                proc = ctx.Process(target=_worker, args=(rank, plan, shared, doorbells, fn, args, writer),
                                   name=f"minidist-rank-{rank}", daemon=True)
                procs.append(proc)                # recorded before it starts: _shutdown finds every rank
                with signals_deferred():          # no interrupt between its birth and knowing its pid
                    proc.start()
                    writer.close()
        # spawn: once every rank has opened the names, remove them (a killed launcher leaves none)
        unlink = (lambda: unlink_names(shm, doorbells)) if shm is not None else None
        return _watch(procs, conns, parent, timeout, unlink)
    finally:
        with signals_deferred():                  # a second Ctrl-C waits until all is cleaned up
            _shutdown(procs, parent)
            for conn in conns:
                conn.close()
            if parent is not None:
                parent.close()
            unlink_names(shm, doorbells)          # now, not when the last reference goes (a traceback's)
            release_block(block, shm, doorbells)  # unmapped now, for the same reason


def _watch(procs, conns, parent: Endpoint, timeout: float | None, unlink=None):
    """Every rank's answer; ClusterError at the first failure or the deadline; unlink() once all attached."""
    deadline = math.inf if timeout is None else time.monotonic() + timeout
    answers: dict[int, tuple] = {}
    attached: set[int] = set()
    pending = {conn: rank for rank, conn in enumerate(conns)}
    running = {proc.sentinel: rank for rank, proc in enumerate(procs)}
    failed = timed_out = False
    while len(answers) < len(procs) and not failed:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            timed_out = failed = True
            break
        # (at most an hour per wait: the OS refuses a timeout of months with OverflowError)
        for ready in wait(list(pending) + list(running), timeout=min(remaining, 3600.0)):
            if ready in running:                   # a process ended: read what it sent first, if anything
                rank = running.pop(ready)
                while conns[rank] in pending and conns[rank].poll():
                    _take(conns[rank], pending, answers, attached)
                pending.pop(conns[rank], None)
                failed |= rank not in answers      # ended without an answer: it died
            elif ready in pending:
                failed |= _take(ready, pending, answers, attached) not in ("ok", "attached")
        if unlink is not None and len(attached) == len(procs):
            with signals_deferred():               # a Ctrl-C here would keep a semaphore in a traceback frame
                unlink = unlink()                  # (returns None: once)
    if not failed:
        return [answers[r][1] for r in range(len(procs))], [answers[r][2] for r in range(len(procs))]
    blocked = {r: parent.blocked_on(r) for r in running.values()}
    first_alarm = int(parent.ctrl[1]) if parent.aborting() else -1    # the rank that raised first
    parent.abort()
    _stop(running, pending, answers, attached)
    ended = set(range(len(procs))) - set(running.values())
    if timed_out:
        raise ClusterError(timeout_report(timeout, blocked))
    raise _error(_culprit(answers, ended, first_alarm), answers, procs)


def _culprit(answers, ended: set[int], first_alarm: int) -> int:
    """The rank whose failure caused the others': the first exception, else a death, else an abort."""
    errors = [r for r, a in answers.items() if a[0] == "error"]
    if errors:
        return first_alarm if first_alarm in errors else min(errors)
    if dead := [r for r in ended if r not in answers]:
        return min(dead)
    return min(r for r, a in answers.items() if a[0] == "aborted")


def _error(rank, answers, procs) -> ClusterError:
    answer = answers.get(rank)
    procs[rank].join(GRACE)          # it has answered or ended (its pipe closes just before it can be reaped)
    code = procs[rank].exitcode
    if answer is not None and answer[0] == "error":
        report = f"rank {rank} raised {answer[1]}\n\n--- traceback of rank {rank} ---\n{answer[2]}"
        return ClusterError(report, rank, code, answer[2])
    if code is not None and code < 0:
        how = f"was killed by signal {signal.Signals(-code).name}"
    elif answer is not None:
        how = "was aborted"
    else:
        how = f"exited with code {code} before returning"
        if procs[rank]._start_method == "spawn" and code == 1:
            how += (" (under spawn each worker imports the main script again: is its top-level code "
                    "guarded by `if __name__ == '__main__':`? see the worker's output above)")
    return ClusterError(f"rank {rank} {how}", rank, code, how)


def _take(conn, pending: dict, answers: dict, attached: set) -> str | None:
    """Read one message from a rank's pipe; return its status ("ok", "error", "aborted", "attached"; None:
    EOF). After "attached" (spawn: the rank has opened the named objects) its answer is still pending."""
    rank = pending.pop(conn)
    try:
        message = conn.recv()
    except (EOFError, OSError):                  # the pipe closed without an answer: the rank died
        return None
    if message == "attached":
        pending[conn] = rank
        attached.add(rank)
        return message
    answers[rank] = message
    return message[0]


def _stop(running, pending, answers, attached) -> None:
    """Give the ranks still running GRACE seconds to notice the abort, reading their answers."""
    deadline = time.monotonic() + GRACE
    while running and (remaining := deadline - time.monotonic()) > 0:
        for ready in wait(list(running) + list(pending), timeout=remaining):
            if ready in pending:
                _take(ready, pending, answers, attached)
            else:
                running.pop(ready, None)
    for conn in list(pending):                          # answers sent just before their process ended
        while conn in pending and conn.poll():
            _take(conn, pending, answers, attached)


def _shutdown(procs, parent: Endpoint) -> None:
    """Make sure no worker outlives the run: abort, terminate, then kill; reap them all."""
    procs = [p for p in procs if p.pid is not None]          # those that started
    if parent is not None and any(p.is_alive() for p in procs):
        parent.abort()
    for sig in ("terminate", "kill"):
        alive = [p for p in procs if p.is_alive()]
        for p in alive:
            getattr(p, sig)()
        if alive:
            wait([p.sentinel for p in alive], timeout=1.0)
    for p in procs:
        p.join()


def _worker(rank, plan, shared, doorbells, fn, args, conn) -> None:
    """The body of one rank's process."""
    layout, link, device, cores, keep_spans, launcher = plan
    die_with_parent(launcher)
    signal.signal(signal.SIGINT, signal.SIG_IGN)     # Ctrl-C is the parent's to handle
    if hasattr(shared, "buf"):
        conn.send("attached")                        # spawn: segment and semaphores are open (by name)
    endpoint, code = None, 0
    try:
        block = shared.buf if hasattr(shared, "buf") else shared     # SharedMemory or the inherited map
        settle_rank(rank, layout.world_size, launcher)     # freed memory kept; a core of its own
        endpoint = Endpoint(layout, rank, block, doorbells, cores, cross_memory.enable())
        ledger = Ledger(rank, link, device, keep_spans)
        comm = Communicator(endpoint, ledger, list(range(layout.world_size)))
        began = now()
        result = fn(comm, *args)
        returned = now()
        endpoint.mark_done()
        answer = ("ok", result, pack_ledger(ledger.spans, ledger.clock, comm.stats, began, returned))
    except Aborted:
        answer, code = ("aborted", None, None), 1
    except BaseException as exc:                     # noqa: BLE001 - report everything, even SystemExit
        if endpoint is not None:
            endpoint.abort()
        answer, code = ("error", *explain_exception(exc)), 1
    try:
        conn.send(answer)
    except Exception as exc:  # noqa: BLE001 - e.g. a result that cannot be pickled
        summary, trace = explain_exception(exc)
        conn.send(("error", f"{summary} (while sending rank {rank}'s result)", trace))
        code = 1
    conn.close()
    if endpoint is not None:
        endpoint.close()
    leave_block(shared)
    sys.exit(code)


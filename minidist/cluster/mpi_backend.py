"""``run`` on a real cluster: the ranks are MPI processes started by ``mpiexec``, not forked here.

    mpiexec -n 4 python lessons/06_data_parallel.py        # every process runs the whole script

Under mpiexec (MPICH sets PMI_SIZE/PMI_RANK, Open MPI OMPI_COMM_WORLD_SIZE) or with MINIDIST_BACKEND=mpi,
``cluster.run(fn, world_size, *args)`` runs ``fn(comm, *args)`` on MPI ranks 0..world_size-1 (an
``MPICommunicator``, mpi_comm.py); the other ranks wait. Every rank then gets the list of all results,
so a script written for the simulated cluster runs unchanged: each process executes it top to bottom,
and every call to ``run`` is one collective step of all processes. So every process must call it alike:
one allgather first compares world_size, fn's name, timeout, link and device, and a difference is a
ValueError on every process.

Failures: if every rank of the run raises (the same bad argument everywhere, say), ``run`` raises the
same ``ClusterError`` on every process, as on the simulated cluster. Otherwise some rank may wait for a
failed one forever, so the job ends as MPI jobs end: the failed rank prints its rank, exception and
traceback (once: the lowest failed rank reports) and calls MPI_Abort. A watchdog thread does the same
when ``timeout`` runs out, listing what every rank was doing as the simulated cluster does; an
exception nobody catches ends the job too (printed once, by the lowest process that raised it). A
process that dies without Python (a signal, os._exit) is named by ``python -m minidist run --mpi``
(mpi_watch.py); a bare mpiexec names no rank. Only rank 0 prints to stdout (minidist/cluster/mpi_rank.py).
mpi4py is imported only here, only when this backend is chosen (importing it starts MPI; no process may
fork after that).
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback

from minidist.cluster.mpi_rank import python_ends

from .ledger import Device, Ledger, LinkModel, Trace
from .mailbox import timeout_report

LAUNCHER_VARS = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE")
REPORT_WINDOW = 1.0        # seconds a failing rank listens for the failures of the others
OUTPUT_GRACE = 0.3         # seconds between printing a failure report and MPI_Abort (lets mpiexec forward it)
FAILED = 77                # tag of "I failed" notes between ranks, on the backend's own communicator
UNCAUGHT = 78              # tag of "an exception nobody caught" notes between processes
_state: dict = {}          # MPI module, the run counter and the backend's communicator, once started
_inside_run = threading.local()


def mpi_chosen() -> bool:
    """True when ``run`` should use MPI: MINIDIST_BACKEND=mpi, or launched by mpiexec (unless
    MINIDIST_BACKEND=shm). Imports nothing."""
    choice = os.environ.get("MINIDIST_BACKEND", "").lower()
    if choice not in ("", "mpi", "shm"):
        raise ValueError(f"MINIDIST_BACKEND must be 'mpi' or 'shm' (or unset), got {choice!r}")
    return choice == "mpi" or (choice == "" and any(v in os.environ for v in LAUNCHER_VARS))


def refuse_fork_under_mpi() -> None:
    """Raise RuntimeError if MPI is running in this process: forking the simulated cluster's ranks then
    copies MPI's state into children (unsafe)."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        raise RuntimeError("a fork-based cluster.run inside an MPI job: MPI is initialised in this process, "
                           "so "
                           "it must not fork. Under mpiexec, cluster.run uses the MPI backend; do not set "
                           "MINIDIST_BACKEND=shm there, and do not call run inside a run's fn")


def load_mpi():
    """mpi4py's MPI module (initialising MPI), or ImportError saying how to install it."""
    if "MPI" not in _state:
        try:
            from mpi4py import MPI
        except ImportError as exc:
            raise ImportError(f"the MPI backend needs mpi4py and an MPI library: pip install -e \".[mpi]\" "
                              f"(mpi4py and the mpich wheel) — {exc}") from exc
        _state.update(MPI=MPI, runs=0, control=MPI.COMM_WORLD.Dup(), excepthook=sys.excepthook)
        sys.excepthook = _uncaught
    return _state["MPI"]


def run_mpi(fn, world_size: int, args: tuple, timeout: float | None = 60.0, link: LinkModel | None = None,
            device: Device | None = None, mailbox_bytes: int = 2 * 2**20, keep_spans: bool = False):
    """``run`` over MPI: (results by rank, [(spans, clock, stats)] by rank), the same on every process."""
    check_agreement(load_mpi(), fn=getattr(fn, "__qualname__", type(fn).__name__), world_size=world_size,
                    timeout=timeout, link=link, device=device)
    if not callable(fn):
        raise TypeError(f"run expects a function fn(comm, *args), got {type(fn).__name__}")
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise ValueError(f"world_size must be an int >= 1, got {world_size!r}")
    if timeout is not None and not timeout > 0:
        raise ValueError(f"timeout must be > 0 seconds (or None: none), got {timeout!r}")
    if hasattr(link, "check_covers"):              # a two-level Topology must cover the world
        link.check_covers(world_size)
    if getattr(_inside_run, "active", False):
        raise RuntimeError("cluster.run called inside a run's fn: under MPI the ranks are the MPI processes; "
                           "use comm.split for sub-groups instead")
    MPI = _state["MPI"]
    world = MPI.COMM_WORLD
    if world_size > world.Get_size():
        raise ValueError(f"run(fn, {world_size}) needs {world_size} MPI processes, but this job has "
                         f"{world.Get_size()}: launch it with mpiexec -n {world_size} (or more)")
    from .mpi_comm import MPICommunicator  # after mpi4py: it is the MPI transport

    _state["runs"] += 1
    me = world.Get_rank()
    member = me < world_size
    group = world.Split(0 if member else MPI.UNDEFINED, me)
    answer = None
    if member:
        ledger = Ledger(me, link or LinkModel(), device or Device(), keep_spans)
        waiting = [""]
        comm = MPICommunicator(MPI, group, ledger, list(range(world_size)), 0, mailbox_bytes, waiting)
        endless = timeout is None or timeout == float("inf")
        watchdog = threading.Timer(0 if endless else timeout, _timed_out, (me, world_size, timeout, waiting))
        watchdog.daemon = True
        if not endless:
            watchdog.start()
        _inside_run.active = True
        try:
            answer = ("ok", fn(comm, *args), (ledger.spans, ledger.clock, comm.stats))
            comm.finish(time.monotonic() + 1.0)
        except BaseException as exc:               # noqa: BLE001 - report everything, even SystemExit
            answer = ("error", fail(me, world_size, f"rank {me} raised {type(exc).__name__}: {exc}\n\n--- "
                                                    f"traceback of rank {me} ---\n{traceback.format_exc()}"))
        finally:
            _inside_run.active = False
            watchdog.cancel()
        group.Free()
    answers = world.allgather(answer)[:world_size]
    errors = [(rank, a[1]) for rank, a in enumerate(answers) if a[0] == "error"]
    if errors:                                     # every rank failed: the same ClusterError everywhere
        from .launcher import ClusterError

        rank, (report, details) = errors[0]
        raise ClusterError(report, rank, 1, details)
    return [a[1] for a in answers], [a[2] for a in answers]


def check_agreement(MPI, **arguments) -> None:
    """Every process must call ``run`` alike (it is one collective step): one allgather of the arguments'
    reprs; ValueError on every process, naming what differs where, if they do not match."""
    mine = {name: repr(value)[:200] for name, value in arguments.items()}
    everyone = _state["control"].allgather(mine)
    differ = [name for name in mine if len({seen[name] for seen in everyone}) > 1]
    if differ:
        def where(name):
            values = {}
            for process, seen in enumerate(everyone):
                values.setdefault(seen[name], []).append(str(process))
            return ", ".join(f"{value} on process{'es' if len(ps) > 1 else ''} {' '.join(ps)}"
                             for value, ps in values.items())

        raise ValueError(
            "the MPI processes called run with different arguments (each call of run is one step "
            "of every process, so they must match): " + "; ".join(f"{name}: {where(name)}" for name in differ)
        )


def run_traced_mpi(fn, world_size: int, args: tuple, **options) -> tuple[list, Trace]:
    """``run_traced`` over MPI: (results, Trace), the same on every process."""
    results, ledgers = run_mpi(fn, world_size, args, keep_spans=True, **options)
    spans = [span for spans, _, _ in ledgers for span in spans]
    return results, Trace(spans, [clock for _, clock, _ in ledgers], [stats for _, _, stats in ledgers])


def fail(rank: int, world_size: int, report: str, may_return: bool = True,
         timeout: float | None = None) -> tuple[str, str]:
    """A rank of a run on ranks 0..world_size-1 failed: tell the others and hear from them for up to
    REPORT_WINDOW seconds. If every rank failed (none waits for another: e.g. the same bad argument
    everywhere), return (report, traceback) of the lowest rank: ``run`` raises ClusterError on every
    process, as the simulated cluster does. Otherwise end the job: the lowest failed rank prints its
    report, then MPI_Abort. With ``timeout`` (the watchdog's call; report: what this rank waits for) the
    report lists every rank's state."""
    reports, notes = _hear(rank, world_size, report, FAILED)
    if may_return and len(reports) == world_size:
        _state["MPI"].Request.Waitall(notes)
        first = reports[min(reports)]
        return first, first.partition("---\n")[2]
    if timeout is not None:  # every rank's state, as the simulated cluster reports a timeout
        report = timeout_report(
            timeout,
            {
                r: reports.get(r, "no report (busy in a call that holds Python's GIL?)").partition("\n")[0]
                for r in range(world_size)
            },
        )
    _end_job(f"\nminidist (MPI backend): {report}" if min(reports) == rank else None)


def _hear(rank: int, size: int, report: str, tag: int) -> tuple[dict[int, str], list]:
    """Send ``report`` to ranks 0..size-1 of the backend's communicator and collect theirs (under ``tag``)
    for up to REPORT_WINDOW seconds: ({rank: report} heard, including this one's; the pending sends)."""
    control = _state["control"]
    notes = [control.isend(report, r, tag) for r in range(size) if r != rank]
    reports = {rank: report}
    deadline = time.monotonic() + REPORT_WINDOW
    while len(reports) < size and time.monotonic() < deadline:
        for r in range(size):
            if r not in reports and control.iprobe(r, tag):
                reports[r] = control.recv(source=r, tag=tag)
        time.sleep(0.002)
    return reports, notes


def _end_job(text: str | None) -> None:
    """Print ``text`` to stderr (None: another process prints) and end the whole job with MPI_Abort."""
    python_ends("reported")     # (for the launcher's watch, mpi_watch.py: this process is not dying silently)
    if text is not None:
        print(text, file=sys.stderr, flush=True)
        time.sleep(OUTPUT_GRACE)    # MPI_Abort can kill mpiexec's forwarding before the report gets out
    else:
        time.sleep(5.0)         # the reporting process aborts the job; abort anyway if it does not
    _state["MPI"].COMM_WORLD.Abort(1)
    os._exit(1)                 # never return into the failed run


def _uncaught(kind, error, trace) -> None:
    """An exception nobody caught ends the job, so that no process waits for this one. Each distinct
    error is printed once: by the lowest process that raised it (the processes that raise within
    REPORT_WINDOW compare their tracebacks), e.g. "needs 3 MPI processes" raised by all of them."""
    import io

    with io.StringIO() as text:
        sys.stderr, stderr = text, sys.stderr        # the previous hook (Python's, or a lesson's) prints
        try:
            _state["excepthook"](kind, error, trace)
        finally:
            sys.stderr = stderr
        printed = text.getvalue()
    me = _state["MPI"].COMM_WORLD.Get_rank()
    reports, _ = _hear(me, _state["MPI"].COMM_WORLD.Get_size(), printed, UNCAUGHT)
    _end_job(None if any(r < me and seen == printed for r, seen in reports.items()) else printed)


def _timed_out(rank: int, world_size: int, timeout: float, waiting: list) -> None:
    fail(rank, world_size, waiting[0] or "running", may_return=False, timeout=timeout)

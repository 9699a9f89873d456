"""The input pipeline: k worker processes load batches ahead of the training loop ("Feed Data Fast").

The "Scaling Up Training" slides ask for parallel workers (multiprocessing) and warn that "primary memory
is a bottleneck": while a step computes, the next batches must already be on their way. Here, as in
torch.utils.data.DataLoader:

    batch i is loaded by worker i mod k;  each worker holds up to q requests   (k = num_workers,
    the loop receives batch i from worker i mod k, then asks for batch i + k·q  q = prefetch)

so at most k·q batches are requested and not yet consumed, and the batches come out in order, bitwise
the same for any k (k = 0 loads in the calling process, on demand). With a loading time L and a
compute time C per batch the loop takes max(C, L/k) per step once q >= 1 (input_clock.py models it).

Workers are real processes (``multiprocess``, fork on Linux, spawn elsewhere), one pipe in and one pipe
out each: no shared memory, so nothing in /dev/shm. The guarantees are the cluster launcher's
(cluster/launcher.py, cluster/process_setup.py): a worker that raises ends the iteration with
``LoaderError`` carrying the worker's traceback; a worker that dies or hangs ends it too (``timeout``);
an epoch left early (``break``, an exception, Ctrl-C in the loop) stops every worker — asked, then
terminated, then killed — and closes every pipe; workers ignore Ctrl-C (the parent handles it) and die
with their parent. Cost: one pickled copy of every batch through a pipe.

Resuming (a checkpoint keeps it, minidist.checkpoint.save(..., loader=)): ``state_dict()`` is
{"epoch": epochs finished, "position": batches of this epoch handed to the loop, "sampler": its state};
after ``load_state_dict(state)`` the next epoch starts at that position, so a run resumed mid-epoch sees
exactly the batches of an uninterrupted one. Given a DistributedSampler, the loader draws each epoch's
batches from it (``set_epoch(epoch)``, then ``batched``): epoch and position are then the whole state.
"""

from __future__ import annotations

import math
import signal
import sys
import traceback
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import multiprocess
from multiprocess.connection import wait

from minidist.cluster.process_setup import check_picklable, die_with_parent, one_blas_thread, signals_deferred
from minidist.nn.checks import check_count, check_real

from .sampler import DistributedSampler, batched

GRACE = 1.0      # seconds a worker gets to leave on its own before it is terminated (then killed)


class LoaderError(RuntimeError):
    """A worker failed. ``worker``: its index; ``batch``: the batch it was loading; ``details``: its
    traceback (or what happened to it)."""

    def __init__(self, message: str, worker: int, batch: int, details: str = ""):
        super().__init__(message)
        self.worker, self.batch, self.details = worker, batch, details


class Loader:
    """Loader(fetch, batches, *, batch_size=None, num_workers=0, prefetch=2, timeout=60.0, start_method=None).

    Args:
        fetch: ``fetch(indices) -> batch``, e.g. ``lambda idx: (x[idx], y[idx])``; runs in the workers.
        batches: the index arrays of one epoch, in order (e.g. ``sampler.batched(sampler.indices(), 64)``),
            the same every epoch; or a DistributedSampler, each epoch's order (then give batch_size).
        batch_size: with a sampler, the indices per batch (the last batch of an epoch may be short).
        num_workers: k >= 0 processes (0: load in this process when the loop asks).
        prefetch: q >= 1 requests each worker may hold ahead of the loop (torch's prefetch_factor).
        timeout: seconds to wait for one batch before giving up (None or math.inf: no limit).
        start_method: "fork" (Linux default) or "spawn" (then fetch must be picklable).

    ``for batch in loader:`` runs one epoch; workers start with the epoch and end with it.
    ``worker_pids`` lists the processes of the last epoch (for tests). ``epoch`` (epochs finished) and
    ``position`` (batches handed out in this epoch) are what state_dict saves.
    """

    def __init__(self, fetch: Callable[[Any], Any], batches: Sequence | DistributedSampler, *,
                 batch_size: int | None = None, num_workers: int = 0, prefetch: int = 2,
                 timeout: float | None = 60.0, start_method: str | None = None):
        if not callable(fetch):
            raise TypeError(f"fetch must be a function of one batch's indices, got {type(fetch).__name__}")
        self.sampler = batches if isinstance(batches, DistributedSampler) else None
        if (self.sampler is None) != (batch_size is None):
            raise ValueError("batch_size goes with a DistributedSampler as batches (and only then), got "
                             f"batches = {type(batches).__name__}, batch_size = {batch_size!r}")
        self.batch_size = None if batch_size is None else check_count(batch_size, "batch_size")
        check_count(num_workers, "num_workers", 0), check_count(prefetch, "prefetch")
        if timeout == math.inf:   # as the cluster's run: inf is no limit (selectors cannot wait that long)
            timeout = None
        if timeout is not None:
            timeout = check_real(timeout, "Loader timeout (seconds, or None for no limit)", 0.0, strict=True)
        method = start_method or ("fork" if sys.platform.startswith("linux") else "spawn")
        if method not in ("fork", "spawn") or method not in multiprocess.get_all_start_methods():
            raise ValueError("start_method must be 'fork' or 'spawn' (where available), "
                             f"got {start_method!r}")
        if method == "spawn" and num_workers > 0:
            check_picklable(fetch, ())
        self.fetch, self.batches = fetch, list(batches) if self.sampler is None else self._drawn(0)
        self.num_workers, self.prefetch, self.timeout = int(num_workers), int(prefetch), timeout
        self.start_method = method
        self.worker_pids: list[int] = []
        self.epoch = self.position = self._start = 0

    def __len__(self) -> int:
        return len(self.batches)

    def _drawn(self, epoch: int) -> list:
        self.sampler.set_epoch(epoch)
        return batched(self.sampler.indices(), self.batch_size)

    def __iter__(self) -> Iterator[Any]:
        """One epoch, from batch ``position`` when load_state_dict set one (else from the first)."""
        if self.sampler is not None:
            self.batches = self._drawn(self.epoch)
        start, self._start = self._start, 0
        self.position, left = start, self.batches[start:]
        if self.num_workers == 0:
            return self._counted(self.fetch(indices) for indices in left)
        return self._counted(self._epoch(left))

    def _counted(self, batches: Iterator[Any]) -> Iterator[Any]:
        try:
            for batch in batches:
                self.position += 1           # handed to the loop: a checkpoint now resumes after it
                yield batch
            self.epoch, self.position = self.epoch + 1, 0
        finally:
            batches.close()                  # an epoch left early stops its workers now

    def state_dict(self) -> dict:
        """{"epoch", "position", "sampler"} (JSON): where the loop is; the sampler's state or None."""
        return {"epoch": self.epoch, "position": self.position,
                "sampler": None if self.sampler is None else self.sampler.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """Go on from ``state``: the next epoch iterated starts at its position. ValueError, before anything
        changes, for a state of another loader (keys, a sampler of another split, a position past the
        epoch's batches)."""
        if not isinstance(state, dict) or set(state) != {"epoch", "position", "sampler"}:
            raise ValueError(f"loader state must be a dict with keys epoch, position, sampler, got {state!r}")
        epoch, position = check_count(state["epoch"], "loader epoch", 0), check_count(state["position"],
                                                                                    "loader position", 0)
        if (state["sampler"] is None) != (self.sampler is None):
            raise ValueError(f"loader state has sampler {state['sampler']!r}; this loader "
                             f"{'has none' if self.sampler is None else 'has one'}")
        count = len(self.batches) if self.sampler is None else -(-self.sampler.num_samples // self.batch_size)
        if position > count:
            raise ValueError(f"loader position {position} is past the epoch's {count} batches")
        if self.sampler is not None:
            self.sampler.load_state_dict(state["sampler"])     # checks the split first
        self.epoch, self.position, self._start = epoch, position, position

    def _epoch(self, batches: list) -> Iterator[Any]:
        k, ctx = self.num_workers, multiprocess.get_context(self.start_method)
        procs, tasks, results = [], [], []
        try:
            with one_blas_thread(self.start_method):
                for w in range(k):
                    task_out, task_in = ctx.Pipe(duplex=False)
                    result_out, result_in = ctx.Pipe(duplex=False)
                    proc = ctx.Process(target=_worker, name=f"minidist-loader-{w}", daemon=True,
                                       args=(self.fetch, task_out, result_in,
                                             multiprocess.current_process().pid))
                    tasks.append(task_in)
                    results.append(result_out)
                    procs.append(proc)                 # recorded before it starts: the finally finds it
                    with signals_deferred():           # no Ctrl-C between its birth and knowing its pid
                        proc.start()
                    task_out.close()
                    result_in.close()
            self.worker_pids = [p.pid for p in procs]
            ahead = min(len(batches), k * self.prefetch)
            for i in range(ahead):                     # fill every worker's queue
                self._ask(tasks, batches, i)
            for i in range(len(batches)):
                batch = self._receive(i, procs[i % k], results[i % k])
                if i + ahead < len(batches):           # one out, one in: k·q requests stay in flight
                    self._ask(tasks, batches, i + ahead)
                yield batch
        finally:
            _stop(procs, tasks, results)

    def _ask(self, tasks, batches: list, i: int) -> None:
        """Request batch i from worker i mod k. A worker that has failed already cannot take it: its
        error (or death) is reported when the loop reaches the batch it failed on."""
        try:
            tasks[i % self.num_workers].send((i, batches[i]))
        except (BrokenPipeError, ConnectionResetError):
            pass

    def _receive(self, i: int, proc, conn) -> Any:
        """Batch i from its worker's pipe; LoaderError if the worker raised, died or kept us waiting."""
        w = i % self.num_workers
        if not wait([conn, proc.sentinel], timeout=self.timeout):
            raise LoaderError(f"worker {w} did not deliver batch {i} within {self.timeout:g} s", w, i)
        try:
            message = conn.recv()                      # (what it sent before it ended is still readable)
        except (EOFError, OSError):
            proc.join(GRACE)
            how = f"ended (exit code {proc.exitcode})"
            raise LoaderError(f"worker {w} {how} while loading batch {i}", w, i, how) from None
        status, index, *payload = message
        if status == "error":
            summary, details = payload
            raise LoaderError(f"worker {w} raised {summary} while loading batch {i}\n\n"
                              f"--- traceback of worker {w} ---\n{details}", w, i, details)
        assert index == i, f"worker {w} answered batch {index}, expected {i}"   # pipes keep the order
        return payload[0]


def _stop(procs, tasks, results) -> None:
    """End every worker of an epoch: ask (None), then terminate, then kill; reap them; close the pipes."""
    for conn in tasks:
        try:
            conn.send(None)
        except (OSError, ValueError):                  # its worker is gone already
            pass
        conn.close()
    for conn in results:                               # a worker blocked sending a batch gets EPIPE
        conn.close()
    started = [p for p in procs if p.pid is not None]
    if started:
        wait([p.sentinel for p in started], timeout=GRACE)
    for how in ("terminate", "kill"):
        alive = [p for p in started if p.is_alive()]
        for p in alive:
            getattr(p, how)()
        if alive:
            wait([p.sentinel for p in alive], timeout=GRACE)
    for p in started:
        p.join()
        # frees its sentinel pipe now, not at garbage collection
        p.close()


def _worker(fetch, tasks, results, launcher: int) -> None:
    """One worker: load the batches asked for, in order, until told to stop (None or a closed pipe)."""
    die_with_parent(launcher)
    signal.signal(signal.SIGINT, signal.SIG_IGN)       # Ctrl-C is the parent's to handle
    while True:
        try:
            task = tasks.recv()
        except (EOFError, OSError):
            break
        if task is None:
            break
        i, indices = task
        try:
            message = ("ok", i, fetch(indices))
        except BaseException as exc:  # noqa: BLE001 - report everything, even SystemExit
            message = ("error", i, f"{type(exc).__name__}: {exc}", traceback.format_exc())
        try:
            results.send(message)
        except (BrokenPipeError, OSError):             # the loop has gone: nobody to tell
            break
        except Exception as exc:  # noqa: BLE001 - a batch that cannot be pickled
            results.send(("error", i, f"{type(exc).__name__}: {exc} (while sending batch {i})",
                          traceback.format_exc()))
        if message[0] == "error":
            break
    tasks.close()
    results.close()

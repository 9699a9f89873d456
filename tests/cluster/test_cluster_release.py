"""A run unmaps its shared memory in the launcher as it ends, whatever the ending, not at garbage collection.

The error a failed run raises carries a traceback whose frames (the launcher's own) stay alive as long as
the error does: pytest keeps it, a notebook keeps the last one (sys.last_value). Nothing those frames hold
may keep the run's shared block or its doorbell semaphores mapped in this process. A POSIX semaphore is a
page of /dev/shm mapped until it is closed; the block is a /dev/shm segment under spawn and shared anonymous
memory ("/dev/zero (deleted)" in the maps) under fork.
"""

import os
import signal
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from minidist.cluster import ClusterError, process_setup, run

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc and /dev/shm")


def shared_maps() -> set[str]:
    """This process's mappings of shared memory: 'start-end path' for /dev/shm files and shared anonymous
    memory."""
    maps = Path("/proc/self/maps").read_text().splitlines()
    return {f"{line.split()[0]} {line.split(None, 5)[-1]}" for line in maps
            if "/dev/shm/" in line or line.endswith("/dev/zero (deleted)")}


def run_names() -> set[str]:
    prefix = f"minidist_{os.getpid()}_"
    return {n for n in os.listdir("/dev/shm") if n.startswith((prefix, "sem." + prefix))}


def ring_then(failure):
    """A ring step on every rank, then rank 1 fails (raises, hangs, or Ctrl-C reaches the launcher) while
    rank 0 waits on it; failure "none": every rank returns."""
    def fn(comm):
        right, left = (comm.rank + 1) % comm.world_size, (comm.rank - 1) % comm.world_size
        comm.sendrecv(np.arange(5.0), right, left)
        if comm.rank == 1:
            if failure == "raise":
                raise ValueError("rank one is broken")
            if failure == "interrupt":
                os.kill(os.getppid(), signal.SIGINT)
            if failure in ("hang", "interrupt"):
                time.sleep(60)
        if comm.rank == 0 and failure != "none":
            comm.recv(1)                                # waits on rank 1
        return comm.rank
    return fn


@pytest.mark.parametrize("method", ["fork", "spawn"])
@pytest.mark.parametrize("failure, error, match", [
    ("raise", ClusterError, "rank 1 raised ValueError: rank one is broken"),
    ("hang", ClusterError, "run timed out after 2 s; still running"),     # (spawn: maybe still starting)
    ("interrupt", KeyboardInterrupt, None),
])
def test_a_failed_run_unmaps_its_shared_memory_while_the_error_lives(method, failure, error, match):
    before_maps, before_names = shared_maps(), run_names()
    with pytest.raises(error, match=match) as info:
        run(ring_then(failure), 3, start_method=method, timeout=2.0 if failure == "hang" else 30.0)
    assert info.value.__traceback__ is not None          # the launcher's frames are still referenced here
    assert shared_maps() <= before_maps, "the failed run's shared memory is still mapped in the launcher"
    assert run_names() <= before_names, "the failed run left names in /dev/shm"


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_run_that_succeeds_unmaps_its_shared_memory(method):
    before_maps = shared_maps()
    assert run(ring_then("none"), 3, start_method=method, timeout=30.0) == [0, 1, 2]
    assert shared_maps() <= before_maps


def test_a_failure_while_making_the_doorbells_unmaps_what_was_made(monkeypatch):
    """Under spawn the segment comes first, then one named semaphore per rank: the third one fails here."""
    made = []

    class Failing(process_setup._Doorbell):
        def __init__(self, prefix, ctx):
            if len(made) == 2:
                raise OSError("no more semaphores")
            super().__init__(prefix, ctx)
            made.append(self)

    monkeypatch.setattr(process_setup, "_Doorbell", Failing)
    before_maps, before_names = shared_maps(), run_names()
    with pytest.raises(OSError, match="no more semaphores") as info:
        run(lambda comm: comm.rank, 3, start_method="spawn", timeout=30.0)
    made.clear()                                          # (this test's own references)
    assert info.value.__traceback__ is not None
    assert shared_maps() <= before_maps, "the segment or a semaphore made before the failure is still mapped"
    assert run_names() <= before_names

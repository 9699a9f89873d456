"""A run unmaps its shared memory in the launcher as it ends, whatever the ending, not at garbage collection.

The error a failed run raises carries a traceback whose frames (the launcher's own) stay alive as long as
the error does: pytest keeps it, a notebook keeps the last one (sys.last_value). Nothing those frames hold
may keep the run's shared block or its doorbell semaphores mapped in this process. A POSIX semaphore is a
page of /dev/shm mapped until it is closed; the block is a /dev/shm segment under spawn and shared anonymous
memory ("/dev/zero (deleted)" in the maps) under fork.
"""

import signal
import sys

import pytest

from minidist.cluster import ClusterError, process_setup, run
from tests.cluster.test_cluster_failures import names_left, ring_then, shared_maps

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc and /dev/shm")


@pytest.mark.parametrize("method", ["fork", "spawn"])
@pytest.mark.parametrize("failure, error, match", [
    ("raise", ClusterError, "rank 1 raised ValueError: rank one is broken"),
    ("hang", ClusterError, "run timed out after 2 s; still running"),     # (spawn: maybe still starting)
    ("interrupt", KeyboardInterrupt, None),
])
def test_a_failed_run_unmaps_its_shared_memory_while_the_error_lives(method, failure, error, match):
    before_maps, before_names = shared_maps(), set(names_left())
    with pytest.raises(error, match=match) as info:
        run(ring_then(failure), 3, start_method=method, timeout=2.0 if failure == "hang" else 30.0)
    assert info.value.__traceback__ is not None          # the launcher's frames are still referenced here
    assert shared_maps() <= before_maps, "the failed run's shared memory is still mapped in the launcher"
    assert set(names_left()) <= before_names, "the failed run left names in /dev/shm"


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_run_that_succeeds_unmaps_its_shared_memory(method):
    before_maps = shared_maps()
    assert run(lambda comm: comm.rank, 3, start_method=method, timeout=30.0) == [0, 1, 2]
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
    before_maps, before_names = shared_maps(), set(names_left())
    with pytest.raises(OSError, match="no more semaphores") as info:
        run(lambda comm: comm.rank, 3, start_method="spawn", timeout=30.0)
    made.clear()                                          # (this test's own references)
    assert info.value.__traceback__ is not None
    assert shared_maps() <= before_maps, "the segment or a semaphore made before the failure is still mapped"
    assert set(names_left()) <= before_names


def test_an_interrupt_while_the_names_are_removed_leaves_nothing_mapped(monkeypatch):
    """Under spawn the launcher removes the names once every rank has opened them, while the ranks run; a
    Ctrl-C then must not leave a frame that holds a semaphore in the traceback (CI saw one once)."""
    from minidist.cluster import launcher

    calls = []

    def unlink_interrupted(shm, doorbells):
        for bell in doorbells:              # a frame holding a semaphore, as the real loop has
            if not calls:
                calls.append(bell)
                signal.raise_signal(signal.SIGINT)
        calls.append(None)                  # (the first call only: one Ctrl-C)
        process_setup.unlink_names(shm, doorbells)

    monkeypatch.setattr(launcher, "unlink_names", unlink_interrupted)
    before_maps, before_names = shared_maps(), set(names_left())
    with pytest.raises(KeyboardInterrupt) as info:
        run(lambda comm: comm.rank, 3, start_method="spawn", timeout=30.0)
    calls.clear()                           # (this test's own reference)
    assert info.value.__traceback__ is not None
    assert shared_maps() <= before_maps, "a semaphore is still mapped through the interrupted frame"
    assert set(names_left()) <= before_names

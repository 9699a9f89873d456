"""A failing rank makes run raise ClusterError naming it, within seconds, leaving nothing behind."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from minidist.cluster import ClusterError, run
from minidist.cluster.launcher import last_resource_names

ROOT = Path(__file__).resolve().parents[2]


def child_pids() -> set[int]:
    """Live children of this test process, except multiprocess's resource tracker (lives as long as we do)."""
    from multiprocess import resource_tracker

    me = os.getpid()
    pids = set()
    for task in os.listdir(f"/proc/{me}/task"):
        try:
            pids |= {int(p) for p in Path(f"/proc/{me}/task/{task}/children").read_text().split()}
        except FileNotFoundError:
            pass
    return pids - {resource_tracker._resource_tracker._pid}


def assert_nothing_left(before: set[int]) -> None:
    assert child_pids() <= before, "a worker process outlived the run"
    for name in last_resource_names():
        assert not os.path.exists(f"/dev/shm/{name.lstrip('/')}"), f"/dev/shm/{name} was left behind"
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(f"minidist_{os.getpid()}_")]


def ring_then(failure):
    """A ring step on every rank; then rank 1 fails in the given way while the others wait on it."""
    def fn(comm):
        right, left = (comm.rank + 1) % comm.world_size, (comm.rank - 1) % comm.world_size
        comm.sendrecv(np.arange(5.0), right, left)
        if comm.rank == 1:
            if failure == "raise":
                raise ValueError("rank one is broken")
            if failure == "exit":
                os._exit(3)
            if failure == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if failure == "hang":
                time.sleep(60)
        comm.recv(1) if comm.rank == 0 else None   # rank 0 waits on rank 1, the others return
        return comm.rank
    return fn


EXPECTED = {"raise": r"rank 1 raised ValueError: rank one is broken(.|\n)*traceback of rank 1(.|\n)*broken",
            "exit": r"rank 1 exited with code 3", "kill": r"rank 1 was killed by signal SIGKILL",
            "hang": r"timed out after 1 s; still running: rank 0: recv from rank 1 \(tag 0\); rank 1: running"}


@pytest.mark.parametrize("failure", ["raise", "exit", "kill", "hang"])
def test_failure_is_reported_promptly_and_cleaned_up(failure):
    before = child_pids()
    start = time.monotonic()
    with pytest.raises(ClusterError, match=EXPECTED[failure]) as info:
        run(ring_then(failure), 4, timeout=1.0 if failure == "hang" else 20.0)
    elapsed = time.monotonic() - start
    assert elapsed < (4.0 if failure == "hang" else 3.0)
    if failure != "hang":
        assert info.value.rank == 1
        assert info.value.exitcode == {"raise": 1, "exit": 3, "kill": -signal.SIGKILL}[failure]
    assert_nothing_left(before)


def test_recv_from_a_rank_that_already_returned():
    def fn(comm):
        if comm.rank == 1:
            comm.recv(0)

    before = child_pids()
    start = time.monotonic()
    with pytest.raises(ClusterError, match=r"rank 1 raised PeerReturnedError.*rank 0's function has already "
                                           r"returned") as info:
        run(fn, 2, timeout=20)
    assert info.value.rank == 1 and time.monotonic() - start < 3.0
    assert_nothing_left(before)


def test_thirty_runs_in_a_row_leave_nothing_behind():
    before = child_pids()
    failures = ["ok", "raise", "exit", "kill", "ok"]
    for i in range(30):
        failure = failures[i % len(failures)]
        if failure == "ok":
            assert run(lambda comm: comm.sendrecv(np.full(3, comm.rank), (comm.rank + 1) % 3,
                                                  (comm.rank - 1) % 3)[0], 3) == [2, 0, 1]
        else:
            with pytest.raises(ClusterError, match="rank 1"):
                run(ring_then(failure), 3, timeout=20)
    assert_nothing_left(before)


def test_failure_under_spawn_releases_shared_memory_and_semaphores():
    before = child_pids()
    with pytest.raises(ClusterError, match="rank 1 raised ValueError"):
        run(ring_then("raise"), 2, start_method="spawn", timeout=30)
    assert [n for n in last_resource_names() if n.startswith("minidist_")], "spawn uses a named segment"
    assert_nothing_left(before)


def test_unpicklable_function_under_spawn_is_a_clear_type_error():
    numbers = (i for i in range(3))          # generators cannot be pickled, even by dill
    with pytest.raises(TypeError, match="spawn.*cannot be pickled.*generator"):
        run(lambda comm: next(numbers), 2, start_method="spawn")


def test_unpicklable_result_names_the_rank():
    with pytest.raises(ClusterError, match="rank 0 raised .*sending rank 0's result"):
        run(lambda comm: (i for i in range(comm.rank + 1)) if comm.rank == 0 else 1, 2, timeout=20)


@pytest.mark.slow
def test_ctrl_c_stops_the_workers_and_no_resource_tracker_warning(tmp_path):
    script = textwrap.dedent(f"""
        import os, time
        import numpy as np
        from minidist.cluster import run, ClusterError

        def raising(comm):
            if comm.rank == 0:
                raise RuntimeError("boom")
            comm.recv(0)

        def sleeper(comm, folder):
            open(os.path.join(folder, str(os.getpid())), "w").close()
            time.sleep(60)

        if __name__ == "__main__":
            for method in ("fork", "spawn"):
                try:
                    run(raising, 2, start_method=method)
                except ClusterError:
                    pass
                run(lambda comm: comm.barrier(), 2, start_method=method)
            print("ready", flush=True)
            run(sleeper, 3, {str(tmp_path)!r}, timeout=60)
    """)
    path = tmp_path / "interrupt.py"
    path.write_text(script)
    proc = subprocess.Popen([sys.executable, str(path)], cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while len([p for p in tmp_path.iterdir() if p.name.isdigit()]) < 3:
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() else ""
            time.sleep(0.05)
        workers = [int(p.name) for p in tmp_path.iterdir() if p.name.isdigit()]
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=10)
    finally:
        proc.kill()
    assert "KeyboardInterrupt" in err
    assert "leaked" not in err and "resource_tracker" not in err, err
    for pid in workers:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)

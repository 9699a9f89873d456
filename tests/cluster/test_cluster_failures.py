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

from minidist.cluster import ClusterError, launcher, process_setup, run
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


def names_left() -> list[str]:
    """This process's runs' names in /dev/shm: segments minidist_<pid>_<n>, semaphores
    sem.minidist_<pid>_<n>-..."""
    prefix = f"minidist_{os.getpid()}_"
    return [n for n in os.listdir("/dev/shm") if n.startswith((prefix, "sem." + prefix))]


def shared_maps() -> set[str]:
    """This process's mappings of shared memory ('start-end path'): /dev/shm files (segments, POSIX
    semaphores) and shared anonymous memory (fork's block: "/dev/zero (deleted)")."""
    maps = Path("/proc/self/maps").read_text().splitlines()
    return {f"{line.split()[0]} {line.split(None, 5)[-1]}" for line in maps
            if "/dev/shm/" in line or line.endswith("/dev/zero (deleted)")}


def assert_nothing_left(before: set[int]) -> None:
    assert child_pids() <= before, "a worker process outlived the run"
    for name in last_resource_names():
        for path in (f"/dev/shm/{name.lstrip('/')}", f"/dev/shm/sem.{name.lstrip('/')}"):
            assert not os.path.exists(path), f"{path} was left behind"
    assert not names_left()


def ring_then(failure):
    """A ring step on every rank; then rank 1 fails in the given way while rank 0 waits on it ("interrupt":
    Ctrl-C reaches the launcher)."""
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
            if failure == "interrupt":
                os.kill(os.getppid(), signal.SIGINT)
            if failure in ("hang", "interrupt"):
                time.sleep(60)
        comm.recv(1) if comm.rank == 0 else None   # rank 0 waits on rank 1, the others return
        return comm.rank
    return fn


EXPECTED = {
    "raise": r"rank 1 raised ValueError: rank one is broken(.|\n)*traceback of rank 1(.|\n)*broken",
    "exit": r"rank 1 exited with code 3",
    "kill": r"rank 1 was killed by signal SIGKILL",
    "hang": r"timed out after 1 s; still running: rank 0: recv from rank 1 \(tag 0\); rank 1: running",
}


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


def test_names_are_gone_under_spawn_while_the_error_is_still_referenced():
    """A notebook keeps the last error (sys.last_value): its traceback's frames hold the doorbells."""
    with pytest.raises(ClusterError, match="rank 1 raised ValueError") as info:
        run(ring_then("raise"), 2, start_method="spawn", timeout=30)
    names = last_resource_names()
    assert len(names) == 3 and all(n.lstrip("/").startswith(f"minidist_{os.getpid()}_") for n in names)
    assert info.value.__traceback__ is not None
    assert not names_left(), "the run's segment or semaphores stay as long as the error is referenced"


def unprintable_error():
    def fn(comm):
        class Unprintable(Exception):
            def __str__(self):
                raise RuntimeError("no text for you")

        if comm.rank == 0:
            raise Unprintable()
        comm.recv(0)
    return fn


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_an_exception_whose_str_raises_is_still_reported(method):
    with pytest.raises(
        ClusterError,
        match=r"rank 0 raised Unprintable: <str\(\) of the exception raised "
        r"RuntimeError>(.|\n)*traceback of rank 0(.|\n)*raise Unprintable",
    ) as info:
        run(unprintable_error(), 2, start_method=method, timeout=30)
    assert info.value.rank == 0 and info.value.exitcode == 1


@pytest.mark.parametrize("timeout", [None, float("inf"), 1e7, 10**12, np.float32(30)])
def test_no_timeout_or_a_huge_one(timeout):
    assert run(lambda comm: comm.rank, 2, timeout=timeout) == [0, 1]


def test_without_timeout_a_deadlock_still_ends_the_run():
    start = time.monotonic()
    with pytest.raises(ClusterError, match="DeadlockError"):
        run(lambda comm: comm.recv((comm.rank + 1) % 2), 2, timeout=None)
    assert time.monotonic() - start < 10


@pytest.mark.parametrize("timeout, error", [(-1, ValueError), (0, ValueError), (float("nan"), ValueError),
                                            (-float("inf"), ValueError), ("10", TypeError), (True, TypeError),
                                            ([5], TypeError), (np.bool_(True), TypeError)])
def test_a_bad_timeout_is_refused_before_anything_starts(timeout, error, monkeypatch):
    def no_start(*args):
        raise AssertionError("a process context was made before the timeout was checked")

    monkeypatch.setattr(launcher.multiprocess, "get_context", no_start)
    with pytest.raises(error, match="timeout"):
        run(lambda comm: None, 2, timeout=timeout)


class InterruptAt:
    """A trace function that interrupts ``run``'s start-up at its k-th line, counting lines until ``_watch``.

    how="raise": raise KeyboardInterrupt at a line of launcher.py; how="signal": deliver SIGINT (Ctrl-C) at a
    line of launcher.py, process_setup.py or inside multiprocess's ``Process.start`` (comprehensions and
    finalizers aside: Python itself drops a KeyboardInterrupt raised in ``__del__``).
    """

    def __init__(self, k: int, how: str):
        self.k, self.how, self.lines, self.pid, self.done = k, how, 0, os.getpid(), False
        self.files = [launcher.__file__] + ([process_setup.__file__] if how == "signal" else [])

    def __call__(self, frame, event, arg):
        if os.getpid() != self.pid:                   # a forked rank inherits the tracer: not for it
            sys.settrace(None)
            return None
        file = frame.f_code.co_filename
        if frame.f_code.co_name == "_watch" and file == launcher.__file__:
            self.done = True
        starting = "multiprocess" in file and ("popen_" in file or frame.f_code.co_name == "start")
        if self.done or not (file in self.files or (self.how == "signal" and starting)):
            return None
        if frame.f_code.co_name in ("__del__", "<dictcomp>", "<listcomp>", "<genexpr>"):
            return None                               # (Python drops what a finalizer raises)
        return self.line

    def line(self, frame, event, arg):
        if os.getpid() != self.pid or self.done:
            return None
        if event == "line":
            self.lines += 1
            if self.lines == self.k:
                if self.how == "raise":
                    raise KeyboardInterrupt(f"injected at {frame.f_code.co_name}, line {frame.f_lineno}")
                signal.raise_signal(signal.SIGINT)
        return self.line


@pytest.mark.parametrize("how, method", [("raise", "fork"), ("signal", "fork"), ("raise", "spawn")])
def test_an_interrupt_anywhere_in_start_up_leaves_nothing_behind(how, method):
    before, maps_before = child_pids(), shared_maps()
    k = 0
    while True:
        k += 1
        tracer = InterruptAt(k, how)
        interrupted = None
        sys.settrace(tracer)
        try:
            result = run(lambda comm: comm.rank, 2, start_method=method, timeout=60)
        except KeyboardInterrupt as err:
            interrupted = err                         # kept, as a notebook keeps the last error
        finally:
            sys.settrace(None)
        assert_nothing_left(before)
        assert shared_maps() <= maps_before, f"the run interrupted at line {k} left shared memory mapped"
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler, "Ctrl-C's handler not restored"
        if tracer.lines < k:                          # start-up ended before line k: every line was tried
            assert interrupted is None and result == [0, 1]
            break
        assert interrupted is not None, f"the interrupt at line {k} was lost"
    assert k > 20, "too few lines traced: is the tracer looking at the right files?"


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
    proc = subprocess.Popen(
        [sys.executable, str(path)],
        cwd=tmp_path,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while len([p for p in tmp_path.iterdir() if p.name.isdigit()]) < 3:
            assert proc.poll() is None and time.monotonic() < deadline, (
                proc.stderr.read() if proc.poll() else ""
            )
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

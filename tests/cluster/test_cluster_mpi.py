"""The MPI backend: the programs of mpi_cases.py under ``mpiexec -n 2`` and ``-n 4`` give bitwise the
results, stats, clocks and spans of the simulated cluster (``auto``: the results; it may choose the
shared area on the simulated cluster only); failures end the job with one clear report.

Skipped, saying why, where mpi4py or mpiexec is missing (``pip install -e ".[mpi]"``). Each mpiexec job
is small: MPICH's ranks poll, and with 4 ranks on 2 cores they share the cores (mpi_launch.py asks them
to yield).
"""

import os
import pickle
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from minidist.cluster import ClusterError, run
from minidist.cluster.mpi_launch import launch, mpi_available
from minidist.collectives import allreduce

ROOT = Path(__file__).resolve().parents[2]
needs_mpi = pytest.mark.skipif(not mpi_available(), reason='MPI is not installed: pip install -e ".[mpi]" '
                               "(mpi4py and the mpich wheel, which brings mpiexec)")


def same(a, b) -> bool:
    """Bitwise equality of nested results (arrays: dtype, shape and bytes)."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (type(a) is type(b) and a.dtype == b.dtype and a.shape == b.shape
                and a.tobytes() == b.tobytes())
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and (a == b or (a != a and b != b))


def mpi_job(nprocs: int, argv: list[str], timeout: float = 240) -> subprocess.CompletedProcess:
    env_path = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = str(ROOT) + (os.pathsep + env_path if env_path else "")
    try:
        return launch(nprocs, argv, timeout=timeout, capture=True)
    finally:
        os.environ["PYTHONPATH"] = env_path


@needs_mpi
@pytest.mark.parametrize("nprocs", [2, 4])
def test_same_results_stats_clocks_and_spans_on_both_backends(tmp_path, nprocs):
    from tests.cluster import mpi_cases

    out = tmp_path / "mpi.pkl"
    job = mpi_job(nprocs, [str(Path(mpi_cases.__file__)), str(out), str(nprocs)])
    assert job.returncode == 0, job.stderr[-3000:]
    on_mpi = pickle.loads(out.read_bytes())
    assert on_mpi.pop("mpi_only") == [[True, True]] * nprocs          # MPI_Allreduce == ring, bitwise
    on_shm = mpi_cases.run_all(nprocs)
    assert on_mpi.keys() == on_shm.keys()
    for name in on_shm:
        kinds = ("results", "clocks", "stats", "spans")[:1 if name in mpi_cases.RESULTS_ONLY else 4]
        for what, a, b in zip(kinds, on_mpi[name][:len(kinds)], on_shm[name][:len(kinds)], strict=True):
            assert same(a, b) if what != "stats" else a == b, f"{name}: {what} differ between MPI and shm"
    sent = [s.bytes_sent for s in on_mpi["collectives"][2]]
    assert sent == [s.bytes_sent for s in on_shm["collectives"][2]] and min(sent) > 0


def script(tmp_path: Path, body: str, say: bool = False) -> str:
    """A job script: imports, ``body``; with ``say``, a ``say(*words)`` that writes to this rank's file."""
    path = tmp_path / "job.py"
    prelude = f"OUT = {str(tmp_path)!r}\n" + SAY if say else ""
    path.write_text("import numpy as np\nfrom minidist.cluster import run\nfrom minidist.collectives import "
                    "allreduce\n" + prelude + textwrap.dedent(body))
    return str(path)


FAILURES = {
    "raises": ("""
        def fn(comm):
            if comm.rank == 1:
                raise ValueError("boom on purpose")
            return comm.recv(1)
        run(fn, 2)
        """, ["rank 1 raised ValueError: boom on purpose", "--- traceback of rank 1 ---", "in fn"]),
    "mismatch": ("""
        def fn(comm):
            return allreduce(comm, np.ones(10), algorithm="ring" if comm.rank == 0 else "naive")
        run(fn, 2)
        """, ["collective mismatch"]),
    "timeout": ("""
        import time
        def fn(comm):
            return time.sleep(30) if comm.rank == 1 else comm.recv(1)
        run(fn, 2, timeout=2)
        """, ["run timed out after 2 s; still running: rank 0: recv from rank 1 (tag 0); rank 1: running"]),
    "too_few": ("""
        run(lambda comm: comm.rank, 3)
        """, ["needs 3 MPI processes, but this job has 2", "mpiexec -n 3"]),
}


@needs_mpi
@pytest.mark.parametrize("case", sorted(FAILURES))
def test_a_failure_ends_the_job_with_one_clear_report(tmp_path, case):
    body, expected = FAILURES[case]
    segments_before = set(Path("/dev/shm").glob("mpich_shm_*"))
    start = time.monotonic()
    job = mpi_job(2, [script(tmp_path, body)], timeout=60)
    assert job.returncode != 0
    # an aborted MPICH job never unlinks its shared memory: launch() removes what nobody maps any more
    assert set(Path("/dev/shm").glob("mpich_shm_*")) <= segments_before
    assert time.monotonic() - start < 30
    for text in expected:
        assert text in job.stderr, job.stderr[-3000:]
    once = {"raises": "--- traceback of rank", "mismatch": "--- traceback of rank",
            "timeout": "run timed out", "too_few": "needs 3 MPI processes"}
    assert job.stderr.count(once[case]) == 1, job.stderr[-3000:]
    assert "ended without a Python error" not in job.stderr      # a reported failure: nobody died silently


def wait_for_a_sleeper(comm):
    return time.sleep(30) if comm.rank == 1 else comm.recv(1)


def test_a_timeout_reports_every_rank_s_state_on_both_backends():
    with pytest.raises(ClusterError) as error:     # the simulated cluster's report, as the MPI case expects
        run(wait_for_a_sleeper, 2, timeout=2)
    assert str(error.value) == FAILURES["timeout"][1][0]


@needs_mpi
@pytest.mark.parametrize("death", ["os._exit(3)", "os.kill(os.getpid(), signal.SIGKILL)"])
def test_a_rank_that_dies_without_python_is_named_by_the_launcher(tmp_path, death):
    job = mpi_job(2, [script(tmp_path, f"""
        import os, signal
        def fn(comm):
            if comm.rank == 1:
                {death}
            return comm.recv(1)
        run(fn, 2)
        """)], timeout=60)
    assert job.returncode != 0
    assert job.stderr.count("ended without a Python error") == 1, job.stderr[-3000:]
    assert "minidist (MPI backend): rank 1 (pid " in job.stderr


@needs_mpi
def test_only_rank_0_prints_and_writes_figures_unless_asked(tmp_path, monkeypatch):
    body = """
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from mpi4py import MPI
        from minidist.sim.plots import save_figure
        print("hello from a lesson")
        save_figure(plt.figure(), f"rank{MPI.COMM_WORLD.Get_rank()}.png")
        """
    monkeypatch.setenv("MINIDIST_FIGURES", str(tmp_path))
    job = mpi_job(2, [script(tmp_path, body)])
    assert job.returncode == 0, job.stderr[-3000:]
    assert job.stdout.count("hello from a lesson") == 1
    assert sorted(p.name for p in tmp_path.glob("*.png")) == ["rank0.png"]
    monkeypatch.setenv("MINIDIST_ALL_RANKS_PRINT", "1")
    assert mpi_job(2, [script(tmp_path, body)]).stdout.count("hello from a lesson") == 2


def outputs(tmp_path: Path, nprocs: int) -> list[str]:
    """What each process wrote with ``say`` (one file per process: mpiexec may interleave stdout)."""
    return [(tmp_path / f"out{r}.txt").read_text() for r in range(nprocs)]


SAY = """
from mpi4py import MPI
def say(*words):
    with open(f"{OUT}/out{MPI.COMM_WORLD.Get_rank()}.txt", "a") as f:
        print(*words, file=f)
"""


@needs_mpi
def test_an_error_on_every_rank_is_a_cluster_error_on_every_process(tmp_path):
    job = mpi_job(2, [script(tmp_path, say=True, body="""
        from minidist.cluster import ClusterError
        def fn(comm):
            raise ValueError(f"bad argument (rank {comm.rank})")
        try:
            run(fn, 2)
        except ClusterError as error:
            say("caught", error.rank, str(error).splitlines()[0])
        say("result", run(lambda comm: comm.rank, 2))
        """)])
    assert job.returncode == 0, job.stderr[-3000:]
    expected = "caught 0 rank 0 raised ValueError: bad argument (rank 0)\nresult [0, 1]\n"
    assert outputs(tmp_path, 2) == [expected] * 2


@needs_mpi
def test_surplus_ranks_wait_and_everyone_gets_all_results(tmp_path):
    job = mpi_job(4, [script(tmp_path, say=True, body="""
        say(run(lambda comm: comm.rank * 10, 2))
        """)])
    assert job.returncode == 0, job.stderr[-3000:]
    assert outputs(tmp_path, 4) == ["[0, 10]\n"] * 4


@needs_mpi
def test_a_fork_based_run_inside_an_mpi_job_is_refused(tmp_path):
    env = {**os.environ, "MINIDIST_BACKEND": "shm", "PYTHONPATH": str(ROOT)}
    code = "from mpi4py import MPI\nfrom minidist.cluster import run\nrun(lambda comm: 1, 2)\n"
    job = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert job.returncode != 0 and "fork-based cluster.run inside an MPI job" in job.stderr


def test_missing_mpi4py_says_how_to_install_it():
    env = {**os.environ, "MINIDIST_BACKEND": "mpi", "PYTHONPATH": str(ROOT)}
    code = ("import sys\nsys.modules['mpi4py'] = None\nfrom minidist.cluster import run\n"
            "run(lambda comm: 1, 1)\n")
    job = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert job.returncode != 0 and 'pip install -e ".[mpi]"' in job.stderr


def test_algorithm_mpi_needs_the_mpi_backend():
    def fn(comm):
        try:
            allreduce(comm, np.ones(3), algorithm="mpi")
        except ValueError as error:
            return str(error)

    assert all("needs the MPI backend" in message for message in run(fn, 2))
    assert "needs the MPI backend" in run(fn, 1)[0]


def test_backend_choice_from_the_environment(monkeypatch):
    from minidist.cluster.mpi_backend import mpi_chosen

    for name in ("MINIDIST_BACKEND", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    assert not mpi_chosen()
    monkeypatch.setenv("PMI_SIZE", "4")
    assert mpi_chosen()
    monkeypatch.setenv("MINIDIST_BACKEND", "shm")
    assert not mpi_chosen()
    monkeypatch.setenv("MINIDIST_BACKEND", "gpu")
    with pytest.raises(ValueError, match="MINIDIST_BACKEND"):
        mpi_chosen()


@needs_mpi
def test_processes_that_disagree_on_run_s_arguments_all_get_an_error(tmp_path):
    job = mpi_job(4, [script(tmp_path, say=True, body="""
        from mpi4py import MPI
        def f(comm):
            return comm.rank
        try:
            run(f, 2 if MPI.COMM_WORLD.Get_rank() == 0 else 3)
        except ValueError as error:
            say("refused:", error)
        say(run(f, 2))
        """)])
    assert job.returncode == 0, job.stderr[-3000:]
    refused = "refused: the MPI processes called run with different arguments"
    for text in outputs(tmp_path, 4):
        first, second = text.splitlines()
        assert first.startswith(refused) and "world_size: 2 on process 0, 3 on processes 1 2 3" in first
        assert second == "[0, 1]"

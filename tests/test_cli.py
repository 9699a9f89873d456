"""python -m minidist: a bad --mpi process count is a usage error, never a traceback or a silent run."""

import pytest

import minidist.__main__ as cli


@pytest.mark.parametrize("count", ["-2", "0", "two", "1.5"])
def test_run_refuses_a_bad_mpi_process_count(count, capsys, monkeypatch):
    def must_not_run(*args, **kwargs):
        raise AssertionError("the lesson (or mpiexec) was started")

    monkeypatch.setattr(cli.runpy, "run_path", must_not_run)
    monkeypatch.setattr("minidist.cluster.mpi_launch.launch", must_not_run)
    with pytest.raises(SystemExit) as stop:
        cli.main(["run", "05", "--mpi", count])
    assert stop.value.code == 2
    assert f"the number of MPI processes must be an integer >= 1, got '{count}'" in capsys.readouterr().err

"""run_resilient: a rank killed at a random step (hypothesis: the step, the rank, and how it dies — an
exception, os._exit, SIGKILL) ends the attempt; the run restarts from the last complete checkpoint and
finishes bitwise equal to an uninterrupted run; the report names the rank and the step resumed from."""

import functools
import os
import signal
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist.checkpoint import resume, run_resilient, save
from minidist.cluster import ClusterError

from .helpers import draw, one_process, trainer_on

STEPS, EVERY = 5, 2


def die(how: str) -> None:
    if how == "exception":
        raise RuntimeError("this rank failed")
    if how == "exit":
        os._exit(3)
    os.kill(os.getpid(), signal.SIGKILL)


def training(comm, root, kill):
    """STEPS steps of a data × ZeRO-1 run on all the ranks, a checkpoint every EVERY steps, resumed from
    the newest; kill = (step, rank, how, marker) makes that rank die before that step, once (the marker)."""
    rng = np.random.default_rng(9)
    trainer = trainer_on(comm, {"data": comm.world_size}, zero=1)
    for step in range(resume(trainer, root, rngs={"batches": rng}), STEPS):
        if kill and (step, comm.rank) == kill[:2] and not os.path.exists(kill[3]):
            Path(kill[3]).touch()
            die(kill[2])
        trainer.train_step(*draw(rng))
        if (step + 1) % EVERY == 0:
            save(trainer, root, step + 1, rngs={"batches": rng})
    return trainer.full_state_dict()


@functools.cache
def uninterrupted() -> dict:
    with tempfile.TemporaryDirectory() as root:
        done = run_resilient(training, 2, root, None, root=root, restarts=0, timeout=120)
    assert not done.failures
    return done.results[0]


@settings(max_examples=3)
@given(step=st.integers(0, STEPS - 1), rank=st.integers(0, 1), how=st.sampled_from(["exception", "exit",
                                                                                     "kill"]))
def test_a_rank_killed_at_any_step_resumes_to_the_uninterrupted_state(step, rank, how):
    with tempfile.TemporaryDirectory() as root:
        kill = (step, rank, how, f"{root}/killed")
        done = run_resilient(training, 2, root, kill, root=root, restarts=1, timeout=120)
    assert len(done.failures) == 1
    failure = done.failures[0]
    assert f"rank {rank}" in failure.error and failure.resumed_from == step // EVERY * EVERY
    assert f"rank {rank}" in done.report() and f"resumed from step {failure.resumed_from}" in done.report()
    for name, value in uninterrupted().items():
        for result in done.results:
            assert np.array_equal(result[name], value), name


def test_elastic_a_run_of_4_that_loses_a_rank_goes_on_with_2_equal_to_one_process(tmp_path):
    kill = (3, 3, "kill", str(tmp_path / "killed"))
    done = run_resilient(training, [4, 2], str(tmp_path), kill, root=tmp_path, restarts=1, timeout=120)
    assert [f.resumed_from for f in done.failures] == [2] and "rank 3" in done.failures[0].error
    assert len(done.results) == 2                   # the second attempt ran on 2 ranks
    for name, value in one_process(STEPS).items():
        for result in done.results:
            np.testing.assert_allclose(result[name], value, rtol=0, atol=1e-9, err_msg=name)


def test_restarts_run_out_with_every_failure_listed(tmp_path):
    def always(comm):
        raise RuntimeError("always fails")
    with pytest.raises(ClusterError, match=r"2 attempts failed:\nattempt 0 failed: .*\nattempt 1 failed"):
        run_resilient(always, 2, root=tmp_path, restarts=1, timeout=60)
    with pytest.raises(ValueError, match="restarts must be an integer >= 0, got -1"):
        run_resilient(always, 2, root=tmp_path, restarts=-1)
    with pytest.raises(ValueError, match=r"world_size must be an integer >= 1 or a list of them, got \[4, 0"):
        run_resilient(always, [4, 0], root=tmp_path)

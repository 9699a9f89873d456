"""save / load with loader=: the data loader's place (epoch, position in it, its sampler's split) is in each
rank's file. On 2 DataParallel ranks, each reading its DistributedSampler shard in batches of 3 (4 batches
an epoch, 3 epochs; the global batch gathered from the ranks' batches), a run saved after step k (mid-epoch,
at an epoch's end) and resumed by a fresh model and loader sees exactly the batches of an uninterrupted run
after k and ends bitwise equal to it; a loader of another split, or a checkpoint without one, is refused."""

import numpy as np
import pytest

from minidist.checkpoint import held_by, load, resume, save
from minidist.cluster import run
from minidist.collectives import allgather
from minidist.data import DistributedSampler, Loader

from .test_checkpoint_held import data_parallel

EXAMPLES, EPOCHS, STEPS = 20, 3, 12
DATA = np.random.default_rng(4)
X, Y = DATA.standard_normal((EXAMPLES, 6)), DATA.standard_normal((EXAMPLES, 4))


def fetch(idx):
    return X[idx], Y[idx], idx


def training(comm, root, stop_at=None):
    """Train EPOCHS epochs from root's checkpoint (if any); with stop_at, save after that step and stop.
    Returns (the indices of every batch trained, the model's state_dict at the end or None)."""
    dp = data_parallel(comm)
    loader = Loader(fetch, DistributedSampler(EXAMPLES, comm.world_size, comm.rank, seed=3), batch_size=3)
    step, seen = resume(held_by(comm, dp.model, dp.optimizer), root, loader=loader), []
    while loader.epoch < EPOCHS:
        for x, y, idx in loader:          # the global batch: every rank's shard of it, in rank order
            dp.train_step(*(np.concatenate(allgather(comm, a)) for a in (x, y)))
            step, seen = step + 1, seen + [idx.tolist()]
            if step == stop_at:
                save(held_by(comm, dp.model, dp.optimizer), root, step, loader=loader)
                return seen, None
    return seen, dp.model.state_dict()


def runs(comm, root, cut):
    whole = training(comm, f"{root}/whole")
    first = training(comm, f"{root}/cut", stop_at=cut)
    return whole, first, training(comm, f"{root}/cut")


@pytest.mark.parametrize("cut", [5, 8])
def test_a_run_resumed_mid_epoch_sees_the_same_batches_and_ends_bitwise_equal(tmp_path, cut):
    ranks = run(runs, 2, str(tmp_path), cut, timeout=120)
    for (seen, final), (before, _), (after, resumed) in ranks:
        assert len(seen) == STEPS and len(before) == cut and before + after == seen
        for name, value in final.items():
            assert np.array_equal(resumed[name], value), name
    assert ranks[0][0][0] != ranks[1][0][0]              # the ranks read their own shards


def refused(comm, root):
    dp = data_parallel(comm)
    loader = Loader(fetch, DistributedSampler(EXAMPLES, 2, comm.rank, seed=4), batch_size=3)
    try:
        load(held_by(comm, dp.model, dp.optimizer), root, loader=loader)
    except ValueError as e:
        return str(e), loader.state_dict()


def test_a_loader_of_another_split_or_none_saved_is_refused(tmp_path):
    run(training, 2, str(tmp_path / "a"), 2, timeout=60)
    for message, state in run(refused, 2, str(tmp_path / "a"), timeout=60):
        assert "seed = 3" in message and state["position"] == 0       # nothing changed
    run(lambda comm, root: save(held_by(comm, *(lambda dp: (dp.model, dp.optimizer))(data_parallel(comm))),
                                root, 0), 2, str(tmp_path / "b"), timeout=60)
    for message, _ in run(refused, 2, str(tmp_path / "b"), timeout=60):
        assert "no data loader state" in message and "rank-0000" in message

"""held_by: checkpoints of DataParallel and of the Pipeline executor (runs parallelize does not build).

On 2 ranks an MLP (float64, AdamW) trains 2 DataParallel steps, saves, trains 2 more (A); a fresh
DataParallel loads and trains the 2 again: bitwise A. A 2-stage Pipeline (GPipe, 2 micro-batches) loads
the same checkpoint and trains them: each stage's parameters equal one process's after 4 steps (1e-9).
One cluster run."""

import numpy as np

from minidist.checkpoint import held_by, load, save
from minidist.cluster import run
from minidist.nn import Linear, MSELoss, Sequential, Tanh
from minidist.optim import AdamW
from minidist.parallel import DataParallel, Pipeline

from .helpers import adamw_steps


def mlp():
    rng = np.random.default_rng(3)
    return Sequential(Linear(6, 16, rng=rng, dtype=np.float64), Tanh(), Linear(16, 16, rng=rng,
                      dtype=np.float64), Tanh(), Linear(16, 4, rng=rng, dtype=np.float64))


def draw(rng):
    return rng.standard_normal((8, 6)), rng.standard_normal((8, 4))


def data_parallel(comm):
    model = mlp()
    return DataParallel(comm, model, AdamW(model.parameters(), lr=1e-2), MSELoss())


def both(comm, root):
    rng, dp = np.random.default_rng(9), data_parallel(comm)
    for step in range(4):
        if step == 2:
            save(held_by(comm, dp.model, dp.optimizer), root, 2, rngs={"batches": rng})
        dp.train_step(*draw(rng))
    uninterrupted = dp.model.state_dict()
    rng, dp = np.random.default_rng(0), data_parallel(comm)
    load(held_by(comm, dp.model, dp.optimizer), root, rngs={"batches": rng})
    for _ in range(2):
        dp.train_step(*draw(rng))
    model, rng = mlp(), np.random.default_rng(0)
    pipe = Pipeline(comm, model, loss_fn=MSELoss(), num_micro_batches=2, schedule="gpipe")
    optimizer = AdamW(pipe.parameters(), lr=1e-2)
    load(held_by(comm, model, optimizer), root, rngs={"batches": rng})
    for _ in range(2):
        pipe.train_step(*draw(rng), optimizer)
    mine = {id(p) for p in pipe.parameters()}
    stage = {name: p.data.copy() for name, p in model.named_parameters() if id(p) in mine}
    return uninterrupted, dp.model.state_dict(), stage


def one_process(steps):
    rng = np.random.default_rng(9)
    return adamw_steps(mlp(), MSELoss(), lambda: draw(rng), steps)


def test_data_parallel_and_pipeline_checkpoints(tmp_path):
    results = run(both, 2, str(tmp_path), timeout=120)
    reference = one_process(4)
    held = set()
    for uninterrupted, resumed, stage in results:
        for name in reference:
            assert np.array_equal(resumed[name], uninterrupted[name]), name
            np.testing.assert_allclose(uninterrupted[name], reference[name], rtol=0, atol=1e-9)
        for name, value in stage.items():
            np.testing.assert_allclose(value, reference[name], rtol=0, atol=1e-9, err_msg=name)
        held |= set(stage)
    assert held == set(reference) and all(len(r[2]) < len(reference) for r in results)   # 2 real stages

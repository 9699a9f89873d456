"""A tiny float64 GPT (and Switch) trained by parallelize, checkpointed, for the checkpoint tests."""

import numpy as np

from minidist.nn import GPT, CrossEntropyLoss, SwitchTransformer
from minidist.optim import AdamW
from minidist.parallel import Mesh, parallelize

N, T, V = 8, 8, 11


def build(switch: bool = False):
    rng = np.random.default_rng(5)
    if switch:       # 4 routing groups: data × expert × micro_batches = 4 on the meshes it meets
        return SwitchTransformer(V, T, 2, 8, 2, 2, 16, capacity_factor=2.0, aux_loss_coef=0.01,
                                 z_loss_coef=0.001, groups=4, rng=rng, dtype=np.float64)
    return GPT(V, T, 2, 8, 2, rng=rng, dtype=np.float64)


def draw(rng: np.random.Generator):
    """The next batch of the run: drawn from the run's generator (whose state the checkpoint keeps)."""
    return rng.integers(0, V, size=(N, T)), rng.integers(0, V, size=(N, T))


def trainer_on(comm, sizes: dict, zero: int = 0, switch: bool = False, micro_batches: int = 1):
    options = dict(schedule="1f1b", micro_batches=micro_batches) if sizes.get("pipeline", 1) > 1 else {}
    return parallelize(build(switch), Mesh(comm, **sizes), loss_fn=CrossEntropyLoss(),
                       optimizer=lambda ps: AdamW(ps, lr=1e-2), zero=zero,
                       micro_batches=micro_batches, **{k: v for k, v in options.items() if k == "schedule"})


def train(trainer, rng, steps: int) -> list[float]:
    return [trainer.train_step(*draw(rng)) for _ in range(steps)]


def adamw_steps(model, loss_fn, batches, steps: int) -> dict:
    """The model's state_dict after ``steps`` AdamW steps (lr 1e-2) in one process, batches() each."""
    optimizer = AdamW(model.parameters(), lr=1e-2)
    for _ in range(steps):
        x, y = batches()
        model.zero_grad()
        loss_fn.forward(model.forward(x), y)
        model.backward(loss_fn.backward())
        optimizer.step()
    return model.state_dict()


def one_process(steps: int, switch: bool = False) -> dict:
    """The unsplit model's state_dict after ``steps`` AdamW steps on the run's batches."""
    rng = np.random.default_rng(9)
    return adamw_steps(build(switch), CrossEntropyLoss(), lambda: draw(rng), steps)

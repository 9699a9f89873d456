"""Models, optimizers and the single-process reference shared by the data-parallel tests (float64)."""

import numpy as np

from minidist.nn import (
    Conv2d,
    CrossEntropyLoss,
    Flatten,
    LayerNorm,
    Linear,
    MaxPool2d,
    ReLU,
    Sequential,
    Tanh,
)
from minidist.optim import LARS, SGD, Adagrad, Adam, AdamW, RMSprop

MODELS = ("mlp", "tanh_layernorm", "nested", "conv")
OPTIMIZERS = ("sgd", "sgd_nesterov", "adam", "adamw", "rmsprop", "adagrad", "lars")


def make_model(kind: str, seed: int, dtype=np.float64) -> Sequential:
    rng = np.random.default_rng(seed)
    if kind == "mlp":
        return Sequential(Linear(6, 9, rng=rng, dtype=dtype), ReLU(), Linear(9, 4, rng=rng, dtype=dtype))
    if kind == "tanh_layernorm":
        return Sequential(Linear(6, 8, rng=rng, dtype=dtype), LayerNorm(8, dtype=dtype), Tanh(),
                          Linear(8, 5, rng=rng, dtype=dtype), Tanh(), Linear(5, 4, rng=rng, dtype=dtype))
    if kind == "nested":
        return Sequential(
            Sequential(Linear(6, 7, rng=rng, dtype=dtype), ReLU()),
            Sequential(Linear(7, 7, rng=rng, dtype=dtype), ReLU(), Linear(7, 4, rng=rng, dtype=dtype)),
        )
    if kind == "conv":
        return Sequential(Conv2d(1, 3, 3, padding=1, rng=rng, dtype=dtype), ReLU(), MaxPool2d(2), Flatten(),
                          Linear(3 * 2 * 3, 4, rng=rng, dtype=dtype))
    raise ValueError(kind)


def make_data(kind: str, seed: int, batch_sizes: list[int]) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng([seed, 7])
    shape = (1, 4, 6) if kind == "conv" else (6,)
    return [(rng.normal(size=(b, *shape)), rng.integers(0, 4, size=b)) for b in batch_sizes]


def make_optimizer(name: str, params):
    return {"sgd": lambda: SGD(params, lr=0.1, momentum=0.9, weight_decay=1e-3),
            "sgd_nesterov": lambda: SGD(params, lr=0.05, momentum=0.8, nesterov=True),
            "adam": lambda: Adam(params, lr=0.01),
            "adamw": lambda: AdamW(params, lr=0.01, weight_decay=0.1),
            "rmsprop": lambda: RMSprop(params, lr=0.01, momentum=0.5),
            "adagrad": lambda: Adagrad(params, lr=0.05),
            "lars": lambda: LARS(params, lr=1.0, momentum=0.9, weight_decay=1e-4)}[name]()


def single_process(
    kind: str, optimizer: str, seed: int, batches, micro_steps: int = 1
) -> list[list[np.ndarray]]:
    """Full-batch training in one process; parameters after every step. With micro_steps = k, k
    consecutive batches are concatenated into one step."""
    model = make_model(kind, seed)
    opt = make_optimizer(optimizer, model.parameters())
    loss_fn = CrossEntropyLoss()
    history = []
    for start in range(0, len(batches), micro_steps):
        group = batches[start:start + micro_steps]
        x = np.concatenate([b[0] for b in group])
        y = np.concatenate([b[1] for b in group])
        opt.zero_grad()
        loss_fn.forward(model.forward(x), y)
        model.backward(loss_fn.backward())
        opt.step()
        history.append([p.data.copy() for p in model.parameters()])
    return history

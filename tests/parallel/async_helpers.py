"""The small regression problem the asynchronous tests share: a Linear-Tanh-Linear model (float64) and a
batch per (worker, step) cut from one fixed data set."""

import numpy as np

from minidist.nn import Linear, Sequential, Tanh

X = np.random.default_rng(1).standard_normal((64, 5))
Y = np.random.default_rng(2).standard_normal((64, 3))


def model():
    rng = np.random.default_rng(0)
    return Sequential(
        Linear(5, 4, rng=rng, dtype=np.float64), Tanh(), Linear(4, 3, rng=rng, dtype=np.float64)
    )


def batch(worker, step):
    start = (step * 4 + worker) * 3 % 60
    return X[start:start + 3], Y[start:start + 3]

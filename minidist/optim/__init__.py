"""Optimizers with torch.optim's update rules, step for step, and learning-rate schedules."""

from .optimizer import Optimizer
from .sgd import SGD

__all__ = ["SGD", "Optimizer"]

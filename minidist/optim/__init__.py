"""Optimizers with torch.optim's update rules, step for step, and learning-rate schedules.

Every optimizer takes ``model.parameters()``, reads each ``Parameter.grad`` in ``step()`` and updates
``Parameter.data`` in place; ``lr`` can be assigned at any time (a schedule does so once per step).
"""

from .adagrad import Adagrad
from .adam import Adam, AdamW
from .lamb import LAMB
from .lars import LARS
from .masked import MaskedOptimizer
from .optimizer import Optimizer
from .rmsprop import RMSprop
from .sag import SAG
from .schedule import Constant, Cosine, LinearScalingRule, LinearWarmup, Schedule, StepDecay, scaled_lr
from .sgd import SGD

__all__ = ["LAMB", "LARS", "SGD", "Adagrad", "Adam", "AdamW", "Constant", "Cosine", "LinearScalingRule",
           "LinearWarmup", "Optimizer", "RMSprop", "Schedule", "StepDecay", "scaled_lr",
           "MaskedOptimizer", "SAG"]

"""Layers with hand-written backward passes (names and shapes follow torch.nn)."""

from .activation import ReLU
from .linear import Linear
from .loss import CrossEntropyLoss, MSELoss
from .module import Module, Parameter, Sequential

__all__ = ["Module", "Parameter", "Sequential", "Linear", "ReLU", "CrossEntropyLoss", "MSELoss"]

"""Layers with hand-written backward passes (names and shapes follow torch.nn)."""

from .activation import ReLU
from .conv import AvgPool2d, Conv2d, Flatten, MaxPool2d
from .linear import Linear
from .loss import CrossEntropyLoss, MSELoss
from .module import Module, Parameter, Sequential

__all__ = [
    "AvgPool2d", "Conv2d", "CrossEntropyLoss", "Flatten", "Linear", "MSELoss", "MaxPool2d", "Module",
    "Parameter", "ReLU", "Sequential",
]

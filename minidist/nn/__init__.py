"""Layers with hand-written backward passes (names and shapes follow torch.nn)."""

from .activation import GELU, Dropout, ReLU, Sigmoid, Tanh
from .attention import CausalSelfAttention
from .block import TransformerBlock
from .checkpoint import Checkpoint
from .conv import AvgPool2d, Conv2d, Flatten, MaxPool2d
from .embedding import Embedding
from .gpt import GPT
from .linear import Linear
from .loss import CrossEntropyLoss, MSELoss
from .module import Module, Parameter, Sequential
from .moe import MoE
from .norm import BatchNorm1d, BatchNorm2d, GroupNorm, LayerNorm
from .online_norm import OnlineNorm
from .pruning import Masked, channel_mask, cubic_sparsity, magnitude_mask, prune, unwrap
from .softmax import Softmax, log_softmax, softmax, softmax_backward
from .switch import SwitchTransformer

__all__ = [
    "AvgPool2d", "BatchNorm1d", "BatchNorm2d", "Checkpoint", "Conv2d", "CrossEntropyLoss", "Dropout",
    "Flatten", "GELU", "GroupNorm", "LayerNorm", "Linear", "MSELoss", "Masked", "MaxPool2d", "MoE", "Module",
    "OnlineNorm", "Parameter", "ReLU", "Sequential", "Sigmoid", "Tanh", "channel_mask", "cubic_sparsity",
    "magnitude_mask", "prune", "unwrap",
    "CausalSelfAttention", "Embedding", "GPT", "Softmax", "TransformerBlock", "log_softmax", "softmax",
    "softmax_backward",
    "SwitchTransformer",
]

"""Layers with hand-written backward passes (names and shapes follow torch.nn)."""

from .activation import GELU, Dropout, ReLU, Sigmoid, Tanh
from .attention import CausalSelfAttention
from .batch_renorm import BatchRenorm2d
from .block import TransformerBlock
from .checkpoint import Checkpoint
from .conv import AvgPool2d, Conv2d, Flatten, MaxPool2d
from .embedding import Embedding
from .gpt import GPT
from .gru import GRU
from .instance_norm import InstanceNorm2d
from .linear import Linear
from .loss import CrossEntropyLoss, MSELoss
from .module import Module, Parameter, Sequential
from .moe import MoE
from .norm import BatchNorm1d, BatchNorm2d, GroupNorm, LayerNorm
from .online_norm import OnlineNorm
from .pruning import Masked, channel_mask, cubic_sparsity, magnitude_mask, prune, unwrap
from .rnn import LSTM, RNN
from .softmax import Softmax, log_softmax, softmax, softmax_backward
from .switch import SwitchTransformer
from .weight_norm import WeightNorm

__all__ = [
    "AvgPool2d", "BatchNorm1d", "BatchNorm2d", "BatchRenorm2d", "CausalSelfAttention", "Checkpoint", "Conv2d",
    "CrossEntropyLoss", "Dropout", "Embedding", "Flatten", "GELU", "GPT", "GRU", "GroupNorm",
    "InstanceNorm2d", "LSTM", "LayerNorm", "Linear", "MSELoss", "Masked", "MaxPool2d", "MoE", "Module",
    "OnlineNorm", "Parameter", "RNN", "ReLU", "Sequential", "Sigmoid", "Softmax", "SwitchTransformer", "Tanh",
    "TransformerBlock", "WeightNorm", "channel_mask", "cubic_sparsity", "log_softmax", "magnitude_mask",
    "prune", "softmax", "softmax_backward", "unwrap",
]

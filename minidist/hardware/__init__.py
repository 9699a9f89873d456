"""Inside one accelerator: a systolic array cycle by cycle, a tensor-core tile, the seeds' devices."""

from .devices import DEVICES, linear_crossing_batch, rnn_step_cost
from .systolic import systolic_matmul, tile_schedule
from .tensor_core import mma, tensor_core_matmul

__all__ = ["DEVICES", "linear_crossing_batch", "mma", "rnn_step_cost", "systolic_matmul",
           "tensor_core_matmul", "tile_schedule"]

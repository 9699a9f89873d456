"""Gradient compression: 1-bit SGD, top-k, Deep Gradient Compression, with error feedback.

one_bit.py        OneBit: a sign bit per entry + two means per tensor or column (Seide et al.)
topk.py           TopK: the k largest entries as values + int32 indices; DGC: top-k with momentum
                  correction, local clipping and a sparsity warm-up (Lin et al.)
error_feedback.py ErrorFeedback: the residual that carries what was not sent to the next step
exchange.py       CompressedDataParallel: compressed messages exchanged with an allgather; Dense
"""

from .error_feedback import ErrorFeedback
from .exchange import CompressedDataParallel, Dense
from .one_bit import OneBit
from .topk import DGC, TopK, warmup_density

__all__ = ["DGC", "CompressedDataParallel", "Dense", "ErrorFeedback", "OneBit", "TopK", "warmup_density"]

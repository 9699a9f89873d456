"""Gradient compression: 1-bit SGD, top-k, Deep Gradient Compression, with error feedback.

one_bit.py        OneBit: a sign bit per entry + two means per tensor or column (Seide et al.)
topk.py           TopK: the k largest entries as values + int32 indices
error_feedback.py ErrorFeedback: the residual that carries what was not sent to the next step
dgc.py            DGC: momentum correction, local clipping, sparsity warm-up (Lin et al.)
exchange.py       CompressedDataParallel: compressed messages exchanged with an allgather; Dense
"""

from .dgc import DGC, warmup_density
from .error_feedback import ErrorFeedback
from .exchange import CompressedDataParallel, Dense
from .one_bit import OneBit
from .topk import TopK

__all__ = ["DGC", "CompressedDataParallel", "Dense", "ErrorFeedback", "OneBit", "TopK", "warmup_density"]

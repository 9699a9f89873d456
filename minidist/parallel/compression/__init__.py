"""Gradient compression: 1-bit SGD, top-k, Deep Gradient Compression, with error feedback.

codecs.py         OneBit: a sign bit per entry + two means per tensor or column (Seide et al.); TopK: the k
                  largest entries as values + int32 indices; Dense: the float bytes themselves
error_feedback.py ErrorFeedback: the residual that carries what was not sent to the next step; DGC: top-k
                  with momentum correction, local clipping and a sparsity warm-up (Lin et al.)
exchange.py       CompressedDataParallel: compressed messages exchanged with an allgather
"""

from .codecs import Dense, OneBit, TopK
from .error_feedback import DGC, ErrorFeedback, warmup_density
from .exchange import CompressedDataParallel

__all__ = ["DGC", "CompressedDataParallel", "Dense", "ErrorFeedback", "OneBit", "TopK", "warmup_density"]

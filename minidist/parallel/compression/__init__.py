"""Gradient compression: codecs.py (OneBit: 1-bit SGD's sign and two means; TopK: the k largest entries;
Dense: no compression), error_feedback.py (ErrorFeedback: the residual of what was not sent; DGC: top-k
with momentum correction), exchange.py (CompressedDataParallel: the messages exchanged by allgather)."""

from .codecs import Dense, OneBit, TopK
from .error_feedback import DGC, ErrorFeedback, warmup_density
from .exchange import CompressedDataParallel

__all__ = ["DGC", "CompressedDataParallel", "Dense", "ErrorFeedback", "OneBit", "TopK", "warmup_density"]

"""Model parallelism for recurrent layers: the distributed persistent RNN (hidden units split over ranks)."""

from .persistent import PersistentRNN

__all__ = ["PersistentRNN"]

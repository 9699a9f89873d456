"""minidist: a NumPy reference implementation of distributed deep-learning training.

Layers with hand-written backward passes (``minidist.nn``), optimizers (``minidist.optim``), emulated
low-precision arithmetic (``minidist.precision``), a cluster of processes joined by shared memory
(``minidist.cluster``), collectives on it (``minidist.collectives``) and parallel training strategies
(``minidist.parallel``). See README.md and the lessons.
"""

__version__ = "0.1.0"

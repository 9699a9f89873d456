"""What every collective shares: input checks, reduction ops, message tags and call agreement.

Chunks of an array follow ``minidist.collectives.pieces`` (np.array_split's rule): ``split_offsets(n, P)``.

Agreement: every rank must call the same collective with the same arguments (algorithm, root, op,
length, dtype). Ranks that disagree would run different message patterns and could wait for each other
forever, so they must find out, and say so, instead of hanging. Two ways:

- ``agreement(comm, call)`` (allreduce, allgather, reduce_scatter, alltoall): the check rides on the
  data. Inside it every message carries a checksum of the call (``comm.collective``), and a rank refuses
  a message of another call ("collective mismatch"). In these collectives every rank's result depends
  on every rank's input, so some message must cross between two ranks that disagree: it is refused, or
  the ranks end up waiting on each other (``DeadlockError``) or on a rank that has returned, which
  ``agreement`` also reports as a collective mismatch. No extra message: a small allreduce is one
  exchange per step and nothing more.
- ``agree(comm, call)`` (broadcast, reduce, gather, scatter): in a rooted collective some ranks only
  send, and an eager send returns before anyone looks at it, so a rank could finish a wrong call
  unnoticed. These check first: ``comm.all_equal`` on a checksum of the call, 16 bytes per round for
  log2 P rounds outside the ledger (no payload bytes, no simulated time); if the checksums differ,
  every rank raises at once.

Each collective (and allreduce algorithm) also sends with its own tag, and receives pass ``out=`` with
the expected shape, so a message that still does not fit is refused by the cluster.
"""

from __future__ import annotations

import functools
import zlib

import numpy as np

from minidist.cluster import Communicator, DeadlockError, PeerReturnedError

# Reductions the collectives accept; "mean" is a sum divided by the world size at the end.
REDUCE_OPS = ("sum", "mean", "max", "min")
# The in-place NumPy ufunc of each op (the same elementwise operation the cluster's recv(op=) applies).
UFUNCS = {"sum": np.add, "mean": np.add, "max": np.maximum, "min": np.minimum}

TAGS = {
    "broadcast": 1, "reduce": 2, "gather": 3, "scatter": 4, "allgather": 5, "reduce_scatter": 6,
    "alltoall": 7, "bruck_allgather": 8, "chain_broadcast": 9, "dissemination_barrier": 10,
    "naive": 11, "parameter_server": 12, "ring": 13, "tree": 14, "recursive_doubling": 15,
    "rabenseifner": 16, "double_tree": 17, "van_de_geijn_broadcast": 18, "permute": 19, "ring_gemm": 20,
}


def check_comm(comm) -> None:
    if type(comm) is Communicator:      # the usual case, checked first: it runs on every collective call
        return
    for name in ("rank", "world_size", "send", "recv", "sendrecv"):
        if not hasattr(comm, name):
            raise TypeError(f"expected a minidist.cluster Communicator as `comm`, got {type(comm).__name__}")


def check_op(op: str, dtype: np.dtype) -> str:
    if op not in REDUCE_OPS:
        raise ValueError(f"op must be one of {REDUCE_OPS}, got {op!r}")
    if op == "mean" and dtype.kind != "f":
        raise TypeError(f'op="mean" needs a float array, got dtype {dtype}')
    return op


def check_array(x, what: str = "x") -> np.ndarray:
    """x as a NumPy array of a float or integer dtype (bool, object, complex are refused)."""
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{what} must be a numpy array, got {type(x).__name__}")
    if x.dtype.kind not in "fiu":
        raise TypeError(f"{what} must have a float or integer dtype, got {x.dtype}")
    return x


def check_root(comm, root: int) -> int:
    if isinstance(root, (bool, np.bool_)):           # True == 1 in Python, but a bool is not a rank
        raise TypeError(f"root must be a rank, an integer in [0, {comm.world_size}), got the bool {root!r}")
    if not isinstance(root, (int, np.integer)) or not 0 <= root < comm.world_size:
        raise ValueError(f"root must be a rank in [0, {comm.world_size}), got {root!r}")
    return int(root)


def flat_copy(x: np.ndarray) -> np.ndarray:
    """A new contiguous 1-D copy of x: the working buffer an algorithm may overwrite."""
    return np.array(x, copy=True, order="C").reshape(-1)


def largest_power_of_two(p: int) -> int:
    """The largest power of two <= p (p >= 1)."""
    return 1 << (p.bit_length() - 1)


def finish(total: np.ndarray, op: str, world_size: int, shape: tuple) -> np.ndarray:
    """Turn the reduced flat buffer into the result: divide for "mean", restore the shape."""
    if op == "mean":
        np.divide(total, world_size, out=total, casting="unsafe")
    return total.reshape(shape)


def agree(comm, call: str) -> None:
    """Raise ValueError on every rank unless all ranks of comm pass the same ``call`` description."""
    if comm.world_size == 1:
        return
    checksum = zlib.crc32(call.encode())  # the same number in every process (unlike hash())
    try:
        same = comm.all_equal(checksum)
    except (DeadlockError, PeerReturnedError) as error:    # the others are in a collective without agree
        raise _mismatch(comm, call, error) from error
    if not same:
        raise _mismatch(comm, call)


def agreement(comm, call: str) -> Agreement:
    """``with agreement(comm, call):`` runs the block as the collective ``call``: its messages carry the
    call's checksum (see above).

    A rank that waits inside the block for a message that cannot come (every rank waits, or the peer
    has returned) raises the same ValueError as ``agree``, with the cluster's reason.
    """
    return Agreement(comm, call)


class Agreement:
    """The context manager of ``agreement`` (a class, not a @contextmanager generator: it runs on every
    collective call, and a class costs fewer Python statements)."""

    def __init__(self, comm, call: str):
        self.comm, self.call, self.block = comm, call, comm.collective(call)

    def __enter__(self) -> None:
        self.block.__enter__()

    def __exit__(self, kind, error, traceback) -> None:
        self.block.__exit__(kind, error, traceback)
        if isinstance(error, (DeadlockError, PeerReturnedError)):
            raise _mismatch(self.comm, self.call, error) from error


@functools.lru_cache(maxsize=256)
def dtype_name(dtype: np.dtype) -> str:
    """'float32': str(dtype), remembered (NumPy builds the name in Python, a few microseconds each time)."""
    return str(dtype)


def _mismatch(comm, call: str, error: Exception | None = None) -> ValueError:
    why = "" if error is None else f": it waits for a message that cannot come ({error})"
    return ValueError(
        f"collective mismatch: rank {comm.rank} called {call}, but not every rank made the same "
        f"call{why}; every rank must call the same collective with the same algorithm, root, op, "
        f"length and dtype"
    )

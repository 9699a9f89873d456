"""allreduce: every rank contributes an array, every rank gets the elementwise sum (or mean, max, min).

This file holds the entry point, the two algorithms of the first lecture slides, and ``auto``:

- ``naive``: everyone sends its whole array to everyone else; each rank adds the P arrays itself.
  (P − 1)·n elements sent per rank, O(n P²) in total; T = (P − 1)(α + n β).
- ``parameter_server``: one rank (the "manager", rank 0, itself one of the workers) receives every array,
  adds them, and sends the sum back. Only O(n P) in total, but all of it through one node: the root sends
  and receives (P − 1)·n, the workers n each. With receives free in the α-β model the root's sends are
  the bottleneck: T = P (α + n β).

The others live in ring.py (``ring``), tree.py (``tree``) and halving_doubling.py (``recursive_doubling``,
``rabenseifner``); their costs are in cost.py. Seeds: "Scaling Up Training" (naive vs manager vs ring and
their work counts), "Hardware Accelerators for Training DNNs" (collectives and their algorithms).

``auto`` picks as MPICH's classic allreduce does (MPICH src/mpi/coll/allreduce): recursive doubling
when the array has at most ``short_bytes`` bytes or fewer elements than P' (the largest power of two
<= P), otherwise Rabenseifner's reduce-scatter + allgather. MPICH's threshold is the tunable CVAR
MPIR_CVAR_ALLREDUCE_SHORT_MSG_SIZE, 2048 bytes by default (``MPICH_SHORT_MESSAGE_BYTES``). Tuned for
this library on its test machine it is ``SHORT_MESSAGE_BYTES`` = 512 KiB: a message costs minidist
~10-15 us of Python (MPICH: ~1 us), so the log2 P extra messages of Rabenseifner pay for themselves
only on much larger arrays. Measured (benchmarks/allreduce.md, "Session 4"): recursive doubling is
faster up to 512 KiB at P = 2 and P = 4, slower from 1 MiB at P = 4 and equal at 2 MiB for P = 2. Newer
MPICH releases choose from a tuning table (including a ring); the classic rule is the one taught here.
"""

from __future__ import annotations

import numpy as np

from minidist.collectives.common import (
    TAGS,
    UFUNCS,
    agreement,
    check_array,
    check_comm,
    check_op,
    dtype_name,
    finish,
    flat_copy,
    largest_power_of_two,
)
from minidist.collectives.halving_doubling import rabenseifner_allreduce, recursive_doubling_allreduce
from minidist.collectives.ring import ring_allreduce
from minidist.collectives.tree import tree_allreduce

MPICH_SHORT_MESSAGE_BYTES = 2048      # MPICH's MPIR_CVAR_ALLREDUCE_SHORT_MSG_SIZE default
SHORT_MESSAGE_BYTES = 512 * 1024      # the same threshold, tuned for minidist (see above)


def naive_allreduce(comm, flat: np.ndarray, op: str = "sum") -> np.ndarray:
    """Everyone sends its 1-D array to everyone; each rank reduces the P arrays in rank order."""
    p, r, tag = comm.world_size, comm.rank, TAGS["naive"]
    arrays = [flat] * p
    for shift in range(1, p):  # in round `shift`, send to r + shift, receive from r − shift
        src = (r - shift) % p
        arrays[src] = comm.sendrecv(flat, dst=(r + shift) % p, src=src, sendtag=tag, recvtag=tag,
                                    out=np.empty_like(flat))
    total = arrays[0].copy()
    for other in arrays[1:]:  # the same order on every rank, so the same bits on every rank
        UFUNCS[op](total, other, out=total)
    return total


def parameter_server_allreduce(comm, flat: np.ndarray, op: str = "sum", root: int = 0) -> np.ndarray:
    """The root (one of the workers) receives and reduces every 1-D array, then sends the result back."""
    p, r, tag = comm.world_size, comm.rank, TAGS["parameter_server"]
    # BEGIN SOLUTION parameter_server_allreduce
    if r != root:
        comm.send(flat, dst=root, tag=tag)
        return comm.recv(root, tag=tag, out=flat)
    for worker in range(p):  # reduce in rank order, straight out of each worker's message
        if worker != root:
            comm.recv(worker, tag=tag, out=flat, op=op)
    for worker in range(p):
        if worker != root:
            comm.send(flat, dst=worker, tag=tag)
    return flat
    # END SOLUTION


ALGORITHMS = {
    "naive": naive_allreduce,
    "parameter_server": parameter_server_allreduce,
    "ring": ring_allreduce,
    "tree": tree_allreduce,
    "recursive_doubling": recursive_doubling_allreduce,
    "rabenseifner": rabenseifner_allreduce,
}
# the algorithms that take ``source=``: x read in place, never copied into the working buffer
READ_SOURCE = ("ring", "recursive_doubling", "rabenseifner")


def mpi_allreduce(comm, x: np.ndarray, op: str = "sum") -> np.ndarray:
    """``allreduce(..., algorithm="mpi")``: MPI_Allreduce of x (MPI backend only; not in the ledger)."""
    if not hasattr(comm, "mpi_allreduce"):
        raise ValueError("algorithm='mpi' calls MPI_Allreduce: it needs the MPI backend (launch the script "
                         "with mpiexec; README, 'Run on a real cluster'), not the simulated cluster")
    flat = comm.mpi_allreduce(flat_copy(x), "sum" if op == "mean" else op)
    return finish(flat, op, comm.world_size, x.shape)


def choose_algorithm(nbytes: int, n: int, world_size: int, short_bytes: int = SHORT_MESSAGE_BYTES) -> str:
    """MPICH's classic choice: recursive doubling for short arrays, Rabenseifner for long ones.

    ``short_bytes``: the largest "short" array; MPICH_SHORT_MESSAGE_BYTES gives MPICH's own default.
    """
    if nbytes <= short_bytes or n < largest_power_of_two(world_size):
        return "recursive_doubling"
    return "rabenseifner"


def allreduce(comm, x: np.ndarray, op: str = "sum", algorithm: str = "ring") -> np.ndarray:
    """Reduce x elementwise over all ranks; every rank receives the result (a new array).

    x: any shape, float or integer dtype, the same shape and dtype on every rank. op: "sum", "mean",
    "max" or "min". algorithm: one of ``ALGORITHMS`` or "auto". Returns an array of x's shape and dtype,
    bitwise the same on every rank; x itself is not modified.
    """
    check_comm(comm)
    x = check_array(x)
    check_op(op, x.dtype)
    if algorithm == "auto":
        algorithm = choose_algorithm(x.nbytes, x.size, comm.world_size)
    if algorithm == "mpi":              # MPI_Allreduce itself, for comparison (MPI backend only)
        return mpi_allreduce(comm, x, op)
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {sorted(ALGORITHMS)} or 'auto', got {algorithm!r}")
    if comm.world_size == 1:
        return finish(flat_copy(x), op, 1, x.shape)
    reduce_op = "sum" if op == "mean" else op
    call = f"allreduce(algorithm={algorithm!r}, op={op!r}, size={x.size}, dtype={dtype_name(x.dtype)})"
    with agreement(comm, call):
        if algorithm in READ_SOURCE:     # these read x itself: no working copy
            flat = ALGORITHMS[algorithm](comm, np.empty(x.size, x.dtype), reduce_op, source=x.reshape(-1))
        else:
            flat = ALGORITHMS[algorithm](comm, flat_copy(x), reduce_op)
    return finish(flat, op, comm.world_size, x.shape)

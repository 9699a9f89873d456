"""allreduce: every rank contributes an array, every rank gets the elementwise sum (or mean, max, min).

This file holds the entry point, the two algorithms of the first lecture slides, and ``auto``:

- ``naive``: everyone sends its whole array to everyone else; each rank adds the P arrays itself, in
  rank order. (P − 1)·n elements sent per rank, O(n P²) in total; T = (P − 1)(α + n β).
- ``parameter_server``: one rank (the "manager", rank 0, itself one of the workers) receives every array,
  adds them, and sends the sum back. Only O(n P) in total, but all of it through one node: the root sends
  and receives (P − 1)·n, the workers n each. With receives free in the α-β model the root's sends are
  the bottleneck: T = P (α + n β).

The others live in ring.py (``ring``), tree.py (``tree``), halving_doubling.py (``recursive_doubling``,
``rabenseifner``) and double_tree.py (``double_tree``, NCCL's two binary trees); every algorithm's steps
are described once in minidist.sim.collective_rounds and priced, exactly or by the slides' formula, by
minidist.sim.collective_cost. ``shared_memory``
(shared_memory.py) reads the other ranks' arrays in the cluster's shared memory instead of sending
messages (not in ``ALGORITHMS``: where the ranks share no memory it runs the ring). Sources: the "Scaling
Up Training" slides (naive vs manager vs ring and their work counts), the "Hardware Accelerators for
Training DNNs" tutorial (collectives and their algorithms).

``auto`` takes ``shared_memory`` where its cost model says it beats the ring on one machine (the
world communicator of the simulated cluster, an array that fits its shared area), and otherwise picks
as MPICH's classic allreduce does: recursive doubling when the array has at most ``short_bytes`` bytes
or fewer elements than P' (the largest power of two <= P), otherwise Rabenseifner.
MPICH's default threshold is 2048 bytes (``MPICH_SHORT_MESSAGE_BYTES``); minidist's,
``SHORT_MESSAGE_BYTES`` = 512 KiB, is tuned for a message that costs Python statements rather than
hardware latency (benchmarks/allreduce.md).
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
from minidist.collectives.double_tree import double_tree_allreduce
from minidist.collectives.halving_doubling import rabenseifner_allreduce, recursive_doubling_allreduce
from minidist.collectives.hierarchical import TOPOLOGY_ALGORITHMS, choose_by_topology
from minidist.collectives.ring import ring_allreduce
from minidist.collectives.shared_memory import (
    WINDOW_MIN_BYTES,
    has_windows,
    ring_time,
    shared_area_bytes,
    shared_memory_allreduce,
    shared_memory_time,
)
from minidist.collectives.tree import tree_allreduce

MPICH_SHORT_MESSAGE_BYTES = 2048      # MPICH's MPIR_CVAR_ALLREDUCE_SHORT_MSG_SIZE default
SHORT_MESSAGE_BYTES = 512 * 1024      # the same threshold, tuned for minidist (benchmarks/allreduce.md)


def naive_allreduce(comm, flat: np.ndarray, op: str = "sum") -> np.ndarray:
    """Everyone sends ``flat`` (shape (n,)) to everyone; each rank reduces the P arrays in rank order.

    Returns a new array, shape (n,): the same operations in the same order on every rank, the same bits.
    """
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
    """The root (one of the workers) receives and reduces every rank's ``flat``, then sends it back.

    flat: this rank's contribution, shape (n,), contiguous; overwritten with the result and returned.
    """
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
    "double_tree": double_tree_allreduce,
}

SHARED = {"shared_memory": shared_memory_allreduce}     # through the shared area where there is one


def check_algorithm(algorithm) -> str:
    """``algorithm`` if ``allreduce`` takes it (a name of ALGORITHMS, TOPOLOGY_ALGORITHMS, SHARED, "mpi" or
    "auto"), else ValueError listing them: what a caller checks when it is given the name."""
    if not (isinstance(algorithm, str) and (algorithm in ALGORITHMS or algorithm in TOPOLOGY_ALGORITHMS
                                            or algorithm in SHARED or algorithm in ("mpi", "auto"))):
        raise ValueError(f"algorithm must be one of {sorted(ALGORITHMS)}, {sorted(TOPOLOGY_ALGORITHMS)} "
                         f"(on a Topology), 'shared_memory', 'mpi' (under mpiexec) or 'auto', "
                         f"got {algorithm!r}")
    return algorithm


def mpi_allreduce(comm, x: np.ndarray, op: str = "sum") -> np.ndarray:
    """``allreduce(..., algorithm="mpi")``: MPI_Allreduce of x (MPI backend only; not in the ledger)."""
    if not hasattr(comm, "mpi_allreduce"):
        raise ValueError("algorithm='mpi' calls MPI_Allreduce: it needs the MPI backend (launch the script "
                         "with mpiexec; README, 'Run on a real cluster'), not the simulated cluster")
    flat = comm.mpi_allreduce(flat_copy(x), "sum" if op == "mean" else op)
    return finish(flat, op, comm.world_size, x.shape)


def choose_algorithm(nbytes: int, n: int, world_size: int, short_bytes: int = SHORT_MESSAGE_BYTES,
                     shared_bytes: int = 0, windows: bool = False) -> str:
    """The shared area where it fits and wins, else MPICH's classic choice: recursive doubling for short
    arrays, Rabenseifner for long ones.

    nbytes, n: the array's size in bytes and elements. ``short_bytes``: the largest "short" array;
    MPICH_SHORT_MESSAGE_BYTES gives MPICH's own default. ``shared_bytes``: the largest array the
    communicator's shared area takes (0: it has none; ``shared_memory.shared_area_bytes``); the area
    is chosen when the array fits and ``shared_memory_time`` < ``ring_time`` (shared_memory.py).
    ``windows``: the area reaches every rank's array in place (``shared_memory.has_windows``); then
    arrays of ``WINDOW_MIN_BYTES`` or more go through it too. Returns an algorithm name.
    """
    fits = shared_bytes > 0 and nbytes <= shared_bytes           # (shared_bytes 0: there is no area)
    if fits and shared_memory_time(nbytes, world_size) < ring_time(nbytes, world_size):
        return "shared_memory"
    if windows and nbytes >= WINDOW_MIN_BYTES:
        return "shared_memory"
    if nbytes <= short_bytes or n < largest_power_of_two(world_size):
        return "recursive_doubling"
    return "rabenseifner"


def allreduce(comm, x: np.ndarray, op: str = "sum", algorithm: str = "ring",
              out: np.ndarray | None = None) -> np.ndarray:
    """Reduce x elementwise over all ranks; every rank receives the result, bitwise the same everywhere.

    x: any shape, float or integer dtype, the same shape and dtype on every rank; never modified unless
    it is ``out``. op: "sum", "mean", "max" or "min". algorithm: one of ``ALGORITHMS``, "hierarchical" or
    "torus" (``TOPOLOGY_ALGORITHMS``: under ``run(..., link=Topology(...))``), "shared_memory", or "auto".
    out: where to write the result (C-contiguous, x's shape and dtype; may be x itself, for an in-place
    allreduce); by default a new array. Returns the result, of x's shape and dtype (``out`` if given).
    """
    check_comm(comm)
    x = check_array(x)
    check_op(op, x.dtype)
    check_algorithm(algorithm)
    if algorithm == "auto":   # on a Topology, hierarchical/torus when predicted faster (hierarchical.py)
        algorithm = choose_by_topology(comm, x.nbytes) or choose_algorithm(
            x.nbytes, x.size, comm.world_size, shared_bytes=shared_area_bytes(comm),
            windows=has_windows(comm))
    if algorithm == "mpi":              # MPI_Allreduce itself, for comparison (MPI backend only)
        result = working_buffer(x, out)
        result[...] = mpi_allreduce(comm, x, op)
        return result
    table = TOPOLOGY_ALGORITHMS if algorithm in TOPOLOGY_ALGORITHMS else SHARED if algorithm in SHARED \
        else ALGORITHMS
    result = working_buffer(x, out)
    flat = result.reshape(-1)            # a view: the algorithms work on the result's memory
    if comm.world_size > 1:
        call = f"allreduce(algorithm={algorithm!r}, op={op!r}, size={x.size}, dtype={dtype_name(x.dtype)})"
        with agreement(comm, call):
            reduced = table[algorithm](comm, flat, "sum" if op == "mean" else op)
        if reduced is not flat:          # naive and the topology algorithms build a new array
            flat[...] = reduced
    finish(flat, op, comm.world_size, x.shape)
    return result


def working_buffer(x: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    """The array the result is written to, holding x's values: a new copy, or ``out`` (checked first)."""
    if out is None:
        return np.array(x, copy=True, order="C")
    if not isinstance(out, np.ndarray):
        raise TypeError(f"out must be a numpy array, got {type(out).__name__}")
    if out.shape != x.shape or out.dtype != x.dtype:
        raise ValueError(f"out must have x's shape {x.shape} and dtype {x.dtype}, "
                         f"got {out.shape} {out.dtype}")
    if not out.flags.c_contiguous or not out.flags.writeable:
        raise ValueError("out must be a writeable C-contiguous array")
    same = out is x or (out.__array_interface__["data"][0] == x.__array_interface__["data"][0]
                        and out.strides == x.strides)     # (``out is x``: in place, as buckets call it)
    if not same:
        if np.shares_memory(out, x):
            raise ValueError("out overlaps x without being x itself: pass out=x for an in-place allreduce")
        out[...] = x
    return out

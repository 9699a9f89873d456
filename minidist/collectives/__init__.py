"""Collective communication on the simulated cluster, written only with send/recv/sendrecv.

    from minidist.collectives import allreduce, broadcast, reduce, gather, scatter, allgather
    from minidist.collectives import reduce_scatter, alltoall, barrier

``allreduce(comm, x, op="sum", algorithm="ring")`` offers the algorithms of the lectures: naive,
parameter_server, ring, tree, recursive_doubling, rabenseifner, and auto (MPICH's rule). Their α-β costs
are in ``minidist.collectives.cost``.
"""

from minidist.collectives.allreduce import ALGORITHMS, allreduce, choose_algorithm
from minidist.collectives.hierarchical import TOPOLOGY_ALGORITHMS
from minidist.collectives.partial import sum_gradients, sum_partial_gradients
from minidist.collectives.primitives import (
                                             allgather,
                                             alltoall,
                                             barrier,
                                             broadcast,
                                             gather,
                                             pairwise_allreduce,
                                             reduce,
                                             reduce_scatter,
                                             scatter,
)

__all__ = ["ALGORITHMS", "TOPOLOGY_ALGORITHMS", "allgather", "allreduce", "alltoall", "barrier", "broadcast",
           "choose_algorithm", "gather", "pairwise_allreduce", "reduce", "reduce_scatter", "scatter",
           "sum_gradients", "sum_partial_gradients"]

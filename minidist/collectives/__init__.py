"""Collective communication on the simulated cluster, written only with send/recv/sendrecv.

    from minidist.collectives import allreduce, broadcast, reduce, gather, scatter, allgather
    from minidist.collectives import reduce_scatter, alltoall, barrier
    from minidist.collectives import bruck_allgather, chain_broadcast, dissemination_barrier
    from minidist.collectives import permute, ring_gemm, van_de_geijn_broadcast

``allreduce(comm, x, op="sum", algorithm="ring")`` offers the algorithms of the lectures: naive,
parameter_server, ring, tree, recursive_doubling, rabenseifner, double_tree (NCCL's two binary trees),
and auto (MPICH's rule). Their α-β costs
(and pairwise_allreduce's, alltoall's) are described once, as the rounds they send, in
``minidist.sim.collective_rounds``, priced by ``minidist.sim.collective_cost``. ``shared_empty(comm,
shape, dtype)`` gives an array in the cluster's shared memory, which ``algorithm="shared_memory"``
reduces without copying it between processes.
"""

from minidist.collectives.allreduce import ALGORITHMS, allreduce, choose_algorithm
from minidist.collectives.bruck import bruck_allgather
from minidist.collectives.chain import chain_broadcast
from minidist.collectives.dissemination import dissemination_barrier
from minidist.collectives.double_tree import double_tree_allreduce
from minidist.collectives.hierarchical import TOPOLOGY_ALGORITHMS
from minidist.collectives.partial import sum_gradients, sum_partial_gradients
from minidist.collectives.permute import permute
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
from minidist.collectives.ring_gemm import ring_gemm
from minidist.collectives.shared_memory import shared_empty
from minidist.collectives.van_de_geijn import van_de_geijn_broadcast

__all__ = ["ALGORITHMS", "TOPOLOGY_ALGORITHMS", "allgather", "allreduce", "alltoall", "barrier", "broadcast",
           "bruck_allgather", "chain_broadcast", "choose_algorithm", "dissemination_barrier",
           "double_tree_allreduce", "gather", "pairwise_allreduce", "permute", "reduce", "reduce_scatter",
           "ring_gemm", "scatter", "shared_empty", "sum_gradients", "sum_partial_gradients",
           "van_de_geijn_broadcast"]

"""The replicated parameters of an expert-parallel model: averaging gradients after backward.

Every rank's loss is the mean over its own tokens, and the global loss the mean of those (equal batches):
L = (1/W) Σ_r L_r over the W ranks. So after each rank's backward

* a replicated parameter (embeddings, attention, norms, the router: everything but the experts) holds
  ∂L_r/∂θ on rank r  →  all-reduce over the W ranks, divide by W (plain data parallelism);
* an expert holds Σ_{r in its expert group} ∂L_r/∂θ already — the all-to-all brought it every token of
  its group — so it only needs the sum over its copies in the other expert groups (``replica_comm``,
  expert + data parallelism; none when the whole world is one expert group), then the division by W.

This is the data-parallel piece of expert parallelism, kept apart: the step runner takes it over later.
"""

from __future__ import annotations

from minidist.nn import Module, Parameter
from minidist.parallel.hybrid import allreduce_gradients

from .expert_parallel import ExpertParallelMoE


def expert_parameters(model: Module) -> list[Parameter]:
    """The parameters of the experts this rank holds, in model order."""
    return [p for m in model.modules() if isinstance(m, ExpertParallelMoE) for p in m.expert_parameters()]


def replicated_parameters(model: Module) -> list[Parameter]:
    """Every other parameter: the same on every rank, so data parallel."""
    experts = {id(p) for p in expert_parameters(model)}
    return [p for p in model.parameters() if id(p) not in experts]


def average_gradients(comm, model: Module, replica_comm=None) -> None:
    """Turn each rank's gradients of its own loss into the gradient of the global mean loss, in place.

    comm: every rank that trains the model (W ranks); replica_comm: the ranks holding the same experts
    (None: each expert lives on one rank only).
    """
    world = comm.world_size
    replicated = replicated_parameters(model)
    allreduce_gradients(comm, replicated)
    experts = expert_parameters(model)
    if replica_comm is not None:
        allreduce_gradients(replica_comm, experts)
    for p in replicated + experts:
        p.grad /= world

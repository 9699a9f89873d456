"""The replicated parameters of an expert-parallel model: averaging gradients after backward.

Every rank's loss is the mean over its own tokens, and the global loss the mean of those (equal batches):
L = (1/W) Σ_r L_r over the W ranks. So after each rank's backward

* a replicated parameter (embeddings, attention, norms, the router: everything but the experts) holds
  ∂L_r/∂θ on rank r  →  all-reduce over the W ranks, divide by W (plain data parallelism);
* an expert holds Σ_{r in its expert group} ∂L_r/∂θ already — the all-to-all brought it every token of
  its group — so it only needs the sum over its copies in the other expert groups (``replica_comm``,
  expert + data parallelism; none when the whole world is one expert group), then the division by the
  number of different token sets (W, or W/M when M model-parallel ranks share their tokens).

This is the data-parallel piece of expert parallelism, kept apart from the runner's data-parallel
attachments: those sum *every* parameter over *one* group of identical replicas and split the batch
themselves, while here two parameter sets go over two groups with two divisors, on batches the layout
already gave each rank. ``AverageGradients`` attaches it to the step runner (its ``end_backward``).
"""

from __future__ import annotations

from minidist.collectives import sum_gradients
from minidist.nn import Module, MoE, Parameter
from minidist.nn.runner import Attachment

from .expert_parallel import ExpertParallelMoE


def expert_parameters(model: Module) -> list[Parameter]:
    """The parameters of the experts this rank holds (whole or sliced), in model order."""
    return [p for m in model.modules() if isinstance(m, (MoE, ExpertParallelMoE))
            for expert in m.experts for p in expert.parameters()]


def replicated_parameters(model: Module) -> list[Parameter]:
    """Every other parameter: the same on every rank, so data parallel."""
    experts = {id(p) for p in expert_parameters(model)}
    return [p for p in model.parameters() if id(p) not in experts]


def average_gradients(comm, model: Module, replica_comm=None, token_sets: int | None = None) -> None:
    """Turn each rank's gradients of its own loss into the gradient of the global mean loss, in place.

    comm: every rank that trains the model (W ranks); replica_comm: the ranks holding the same experts
    (None: each expert lives on one rank only); token_sets: how many different batches the W ranks train
    on (W unless model-parallel ranks share one: then every token set is counted M times in comm's sum).
    """
    world, token_sets = comm.world_size, _check_token_sets(comm, token_sets)
    replicated = replicated_parameters(model)
    sum_gradients(comm, replicated, algorithm="ring")       # one flat ring all-reduce
    for p in replicated:
        p.grad /= world
    experts = expert_parameters(model)
    if replica_comm is not None:
        sum_gradients(replica_comm, experts, algorithm="ring")
    for p in experts:
        p.grad /= token_sets


def _check_token_sets(comm, token_sets: int | None) -> int:
    world = comm.world_size
    token_sets = world if token_sets is None else int(token_sets)
    if token_sets < 1 or world % token_sets:
        raise ValueError(f"token_sets must divide the world size {world}, got {token_sets}")
    return token_sets


class AverageGradients(Attachment):
    """``average_gradients(comm, model, replica_comm, token_sets)`` run by the step runner at end_backward,
    when every gradient of the pass is in (a pipeline: once, after its whole table)."""

    def __init__(self, comm, model: Module, replica_comm=None, token_sets: int | None = None):
        self.comm, self.model, self.replica_comm = comm, model, replica_comm
        self.token_sets = _check_token_sets(comm, token_sets)

    def end_backward(self) -> None:
        average_gradients(self.comm, self.model, self.replica_comm, self.token_sets)

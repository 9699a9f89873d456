"""What a collective costs on the α-β clock: one exact pricer of the schedules, and the slides' formula.

The model (the "Hardware Accelerators for Training DNNs" tutorial, collectives; the "Distributed DL
Part II" slides, T_comm), as the cluster's clock charges it (minidist/cluster/ledger.py): a send of b bytes
occupies the sender for α + bβ (α: latency, β: seconds per byte, 1/β the bandwidth) and stamps the message
with the sender's clock after it; a receive ends at max(own clock, that stamp); reducing b bytes costs bγ
(γ is the formula's only: the cluster does not charge reductions).

    price(schedule(algorithm, P), n, itemsize, link)      exact: every rank's messages, bytes and clock
    collective_seconds(algorithm, P, n, itemsize, link)   its time, the slowest rank's clock

``price`` replays a schedule (collective_rounds.py: who sends which chunk to whom at each step) rank by
rank on that clock, with the chunks np.array_split really makes: it is exact for every P and every n,
and the tests check it against the ledger and clock of real runs. Every algorithm's cost is this one walk
of its rounds; the planner (minidist.plan) and the lessons call it.

``allreduce_cost`` is the slides' closed form, for a student to read and for sizes too large to walk
(P in the thousands: minidist.plan.predict). P ranks, an array of n bytes. Per rank:

    algorithm           steps      messages sent        bytes sent              time (γ = 0)
    naive               P − 1      P − 1                (P − 1) n               (P − 1)(α + nβ)
    parameter_server    2          root P − 1, else 1   root (P − 1) n, else n  P (α + nβ)
    ring, pairwise      2(P − 1)   2(P − 1)             2 (P − 1)/P · n         2(P − 1) α + 2 (P − 1)/P · nβ
    tree                2 log2 P   see below            messages · n            2 log2 P (α + nβ)
    recursive_doubling  log2 P     log2 P               log2 P · n              log2 P (α + nβ)
    rabenseifner        2 log2 P   2 log2 P             2 (P − 1)/P · n         2 log2 P α + 2 (P − 1)/P · nβ

The reductions add γ per byte on the critical path: (P − 1) nγ for naive and the parameter server,
(P − 1)/P · nγ for ring, pairwise and Rabenseifner, log2 P · nγ for tree and recursive doubling.

The tree's root sends log2 P messages, a leaf 1 (2(P − 1) in all). The parameter server takes P (α + nβ):
the workers send in parallel, a receive costs the receiver nothing, then the root sends P − 1 times.

The formula is ``price``'s result (the tests check it) when P is a power of two (tree, recursive
doubling, Rabenseifner; otherwise log2 P reads ⌈log2 P⌉ and the numbers are the textbook's
approximation) and the array's element count divides by P (ring, pairwise, Rabenseifner). The ring's
time hardly grows with P (bandwidth-bound, large n); the tree's latency term grows only as log P.
"""

from __future__ import annotations

from dataclasses import dataclass

from minidist.cluster import LinkModel
from minidist.collectives.pieces import split_offsets

from .collective_rounds import Schedule, schedule

ALGORITHMS = ("naive", "parameter_server", "ring", "tree", "recursive_doubling", "rabenseifner")
FORMULAS = (*ALGORITHMS, "pairwise")  # allreduce_cost's: pairwise_allreduce has the ring's formula


@dataclass(frozen=True)
class Traffic:
    """What each rank sent and received (lists by rank, bytes are payload) and the simulated time."""

    steps: int
    messages_sent: list
    bytes_sent: list
    messages_received: list
    bytes_received: list
    finish: list  # each rank's clock at the end (seconds)

    @property
    def time(self) -> float:
        return max(self.finish)


def price(plan: Schedule, n: int, itemsize: int, link: LinkModel) -> Traffic:
    """Replay ``plan`` for an array of n elements of itemsize bytes on ``link``'s α-β clock, exactly."""
    if not isinstance(link, LinkModel):
        raise TypeError(f"link must be a minidist.cluster.LinkModel, got {type(link).__name__}")
    p, bounds = plan.world_size, split_offsets(n, plan.parts)
    programs = [[] for _ in range(p)]  # each rank's operations in the order its code performs them
    for step in plan.steps:
        for t in step:
            programs[t.src].append(("send", t))
        for t in step:
            programs[t.dst].append(("recv", t))
    clock, arrivals = [0.0] * p, {}  # arrivals[(src, dst)]: FIFO of arrival times in flight
    counts = {k: [0] * p for k in ("ms", "bs", "mr", "br")}
    position = [0] * p
    while any(position[r] < len(programs[r]) for r in range(p)):
        progressed = False
        for r in range(p):
            while position[r] < len(programs[r]):
                kind, t = programs[r][position[r]]
                nbytes = int(bounds[t.hi] - bounds[t.lo]) * itemsize
                if kind == "send":  # the ledger's send, the same operations in the same order
                    clock[r] = clock[r] + link.alpha + nbytes * link.beta
                    arrivals.setdefault((r, t.dst), []).append(clock[r])
                    counts["ms"][r] += 1
                    counts["bs"][r] += nbytes
                else:
                    queue = arrivals.get((t.src, r))
                    if not queue:
                        break  # wait for the sender
                    clock[r] = max(clock[r], queue.pop(0))
                    counts["mr"][r] += 1
                    counts["br"][r] += nbytes
                position[r] += 1
                progressed = True
        if not progressed:
            raise RuntimeError(f"schedule {plan.algorithm} deadlocks")  # a bug in collective_rounds.py
    return Traffic(len(plan.steps), counts["ms"], counts["bs"], counts["mr"], counts["br"], clock)


def collective_seconds(algorithm: str, world_size: int, elements: int, itemsize: int,
                       link: LinkModel) -> float:
    """Simulated seconds of ``algorithm`` (collective_rounds.COLLECTIVES) over world_size ranks on an array
    of ``elements`` elements of itemsize bytes: the slowest rank's clock (0 for one rank)."""
    return price(schedule(algorithm, world_size), elements, itemsize, link).time


@dataclass(frozen=True)
class Cost:
    """Closed-form cost: per-rank lists of messages and bytes sent and received, and the time."""

    algorithm: str
    steps: int
    messages_sent: list
    bytes_sent: list
    messages_received: list
    bytes_received: list
    time: float


def _log2(p: int) -> int:
    """⌈log2 p⌉ (exact for powers of two; the textbook's approximation otherwise)."""
    return (p - 1).bit_length()


def tree_children(rank: int, world_size: int) -> int:
    """Number of children of ``rank`` in the binomial tree rooted at 0."""
    limit = rank & -rank if rank else world_size  # masks below the lowest set bit (all masks for the root)
    return sum(1 for k in range(world_size.bit_length()) if (1 << k) < limit and rank + (1 << k) < world_size)


def allreduce_cost(algorithm: str, world_size: int, nbytes: int, alpha: float, beta: float,
                   gamma: float = 0.0) -> Cost:
    """The slides' closed-form α-β-γ cost of allreduce over world_size ranks of an nbytes-byte array
    (module docstring: exact, ``price``'s, only where it says so)."""
    p, n = world_size, nbytes
    if algorithm not in FORMULAS:
        raise ValueError(f"algorithm must be one of {FORMULAS}, got {algorithm!r}")
    if p < 1 or n < 0:
        raise ValueError(f"need world_size >= 1 and nbytes >= 0, got {world_size}, {nbytes}")
    if p == 1:
        return Cost(algorithm, 0, [0], [0], [0], [0], 0.0)
    if algorithm == "naive":
        sent = [(p - 1) * n] * p
        return Cost(algorithm, p - 1, [p - 1] * p, sent, [p - 1] * p, sent,
                    (p - 1) * (alpha + n * beta) + (p - 1) * n * gamma)
    if algorithm == "parameter_server":
        sent = [(p - 1) * n] + [n] * (p - 1)
        messages = [p - 1] + [1] * (p - 1)
        time = p * (alpha + n * beta) + (p - 1) * n * gamma
        return Cost(algorithm, 2, messages, sent, messages, sent, time)
    if algorithm in ("ring", "pairwise"):
        sent = [2 * (p - 1) * n / p] * p
        return Cost(algorithm, 2 * (p - 1), [2 * (p - 1)] * p, sent, [2 * (p - 1)] * p, sent,
                    2 * (p - 1) * alpha + 2 * (p - 1) / p * n * beta + (p - 1) / p * n * gamma)
    steps = _log2(p)
    if algorithm == "tree":
        messages = [1 + tree_children(r, p) for r in range(p)]
        messages[0] -= 1  # the root has no parent to send to
        received = [1 + tree_children(r, p) for r in range(p)]
        received[0] -= 1  # ... nor receives the total from one
        return Cost(algorithm, 2 * steps, messages, [m * n for m in messages], received,
                    [m * n for m in received], 2 * steps * (alpha + n * beta) + steps * n * gamma)
    if algorithm == "recursive_doubling":
        return Cost(algorithm, steps, [steps] * p, [steps * n] * p, [steps] * p, [steps * n] * p,
                    steps * (alpha + n * beta) + steps * n * gamma)
    sent = [2 * (p - 1) * n / p] * p  # rabenseifner
    return Cost(algorithm, 2 * steps, [2 * steps] * p, sent, [2 * steps] * p, sent,
                2 * steps * alpha + 2 * (p - 1) / p * n * beta + (p - 1) / p * n * gamma)

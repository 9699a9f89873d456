"""The α-β-γ cost of every allreduce algorithm, in closed form.

The model (the "Hardware Accelerators for Training DNNs" tutorial, collectives; the "Distributed DL
Part II" slides, T_comm): sending a message of b bytes costs α + bβ on the sender's link (α: latency,
β: seconds per byte, 1/β the bandwidth); a receive completes when the message has arrived; reducing
b bytes costs bγ. P ranks, an array of n bytes. Per rank:

    algorithm           steps      messages sent        bytes sent              time (γ = 0)
    naive               P − 1      P − 1                (P − 1) n               (P − 1)(α + nβ)
    parameter_server    2          root P − 1, else 1   root (P − 1) n, else n  P (α + nβ)
    ring                2(P − 1)   2(P − 1)             2 (P − 1)/P · n         2(P − 1) α + 2 (P − 1)/P · nβ
    tree                2 log2 P   see below            messages · n            2 log2 P (α + nβ)
    recursive_doubling  log2 P     log2 P               log2 P · n              log2 P (α + nβ)
    rabenseifner        2 log2 P   2 log2 P             2 (P − 1)/P · n         2 log2 P α + 2 (P − 1)/P · nβ

The reductions add γ per byte on the critical path: (P − 1) nγ for naive and the parameter server,
(P − 1)/P · nγ for ring and Rabenseifner, log2 P · nγ for tree and recursive doubling.

The tree's root sends log2 P messages, a leaf 1 (2(P − 1) in all). The parameter server takes P (α + nβ):
the workers send in parallel, a receive costs the receiver nothing, then the root sends P − 1 times.

The formulas are exact when P is a power of two (for tree, recursive doubling, Rabenseifner; otherwise
log2 P reads ⌈log2 P⌉ and the numbers are the textbook's approximation) and the array's element count
divides by P (ring, Rabenseifner). schedule.simulate gives the exact numbers for every case; the tests
check both against the cluster's ledger and clock (which does not charge reductions: γ = 0). The ring's
time hardly grows with P (bandwidth-bound, large n); the tree's latency term grows only as log P.
"""

from __future__ import annotations

from dataclasses import dataclass

ALGORITHMS = ("naive", "parameter_server", "ring", "tree", "recursive_doubling", "rabenseifner")


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
    """The closed-form α-β-γ cost of allreduce over world_size ranks of an nbytes-byte array."""
    p, n = world_size, nbytes
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
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
    if algorithm == "ring":
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

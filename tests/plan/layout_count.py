"""The layouts the planner's check may run, enumerated by brute force from the rules that make a layout
runnable — independently of ``minidist.plan.check.runnable_layouts``, so that counts in the tests are
derived, not typed.

A layout of a GPT with ``layers`` blocks (units: the embeddings, the blocks, ln_f, the head = layers + 3)
is (data D, pipeline P, context C, tensor T, expert E, schedule, micro-batches M) with:
- D·P·C·T·E ≤ max_ranks; E divides the experts (E = 1 for a dense model, E ≥ 2 for a Switch model);
- P ≤ units (a stage holds at least one unit);
- C = 1, or the sequence splits into 2C zigzag chunks: seq % (2C) == 0;
- T divides the heads and d_ff;
- the batch splits over the data and expert ranks: batch % (D·E) == 0, rows = batch / (D·E);
- schedules: "1f1b" alone when P = 1; else 1f1b, zb-h1, interleaved (2 chunks per rank: 2P ≤ units),
  chimera (P even);
- M divides rows and M ≥ P; interleaved and chimera need M a multiple of P.
"""

from __future__ import annotations

import itertools

CHUNKS = 2


def brute_force_layouts(layers, heads, d_ff, seq, batch, experts=0, max_ranks=8):
    """Every runnable layout as a tuple (D, P, C, T, E, schedule, M)."""
    units, sizes = layers + 3, range(1, max_ranks + 1)
    expert_sizes = [e for e in sizes if e >= 2 and experts % e == 0] if experts else [1]
    found = []
    for d, p, c, t, e in itertools.product(sizes, sizes, sizes, sizes, expert_sizes):
        if d * p * c * t * e > max_ranks or p > units or batch % (d * e):
            continue
        if (c > 1 and seq % (2 * c)) or heads % t or d_ff % t:
            continue
        rows = batch // (d * e)
        for schedule in ("1f1b", "zb-h1", "interleaved", "chimera") if p > 1 else ("1f1b",):
            if (schedule == "interleaved" and CHUNKS * p > units) or (schedule == "chimera" and p % 2):
                continue
            multiple = p if schedule in ("interleaved", "chimera") else 1
            found += [(d, p, c, t, e, schedule, m) for m in range(p, rows + 1)
                      if rows % m == 0 and m % multiple == 0]
    return found


def as_tuple(layout) -> tuple:
    """A GridLayout as the tuple brute_force_layouts returns."""
    return (layout.data, layout.pipe, layout.context, layout.tensor, layout.expert, layout.schedule,
            layout.micro_batches)


def fewest_micro_batches(layouts: list[tuple]) -> set[tuple]:
    """Of each (D, P, C, T, E, schedule), the layout with the smallest M."""
    best: dict[tuple, tuple] = {}
    for lay in layouts:
        if lay[:6] not in best or lay[6] < best[lay[:6]][6]:
            best[lay[:6]] = lay
    return set(best.values())

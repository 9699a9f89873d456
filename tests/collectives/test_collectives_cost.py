"""The ledger and the simulated clock agree with the schedules and the textbook formulas, exactly.

- minidist.sim.collective_cost.price of minidist.sim.collective_rounds.schedule (any P, any n) == what the
  cluster's ledger and clock recorded, for every rank, for every allreduce algorithm, pairwise_allreduce
  and alltoall;
- allreduce_cost (the slides' closed form) == price where the formulas are exact;
- the formulas of the issue, written out once more in the test: ring 2(P−1)/P·n bytes and 2(P−1)
  messages per rank, naive (P−1)·n, parameter server root (P−1)·n / workers n, recursive doubling
  log2(P)·n, Rabenseifner 2(P−1)/P·n, tree 2(P−1)·n in total;
- every schedule really is an allreduce: replaying it symbolically, each rank ends with every chunk
  containing every rank's contribution exactly once.
"""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist.cluster import LinkModel, run
from minidist.collectives import allreduce, alltoall, pairwise_allreduce, van_de_geijn_broadcast
from minidist.sim.collective_cost import FORMULAS, allreduce_cost, collective_seconds, price
from minidist.sim.collective_rounds import COLLECTIVES, chunk_sizes, schedule

LINK = LinkModel(alpha=2e-6, beta=1e-9)
LENGTHS = (0, 1, 5, 840, 1001)  # 840 divides by 1..8; 1001 and 5 do not; 0 and 1 are shorter than P


def _measure(comm, lengths, dtype=np.float32):
    """Ledger and clock differences of every algorithm on every length (clocks aligned by barriers)."""
    out = {}
    for n in lengths:
        x = np.ones(n, dtype)
        for algorithm in COLLECTIVES:
            comm.barrier()
            s, t = vars(comm.stats).copy(), comm.clock
            if algorithm == "pairwise":
                pairwise_allreduce(comm, x)
            elif algorithm == "alltoall":  # piece j of the array to rank j
                alltoall(comm, np.array_split(x, comm.world_size))
            elif algorithm == "van_de_geijn":  # a broadcast from rank 0
                van_de_geijn_broadcast(comm, x, root=0)
            else:
                allreduce(comm, x, algorithm=algorithm)
            out[algorithm, n] = ({k: v - s[k] for k, v in vars(comm.stats).items()}, comm.clock - t)
    return out


def _ledger(model, r: int) -> dict:
    """Rank r's line of comm.stats, as the priced schedule says it."""
    return {"bytes_sent": model.bytes_sent[r], "bytes_received": model.bytes_received[r],
            "messages_sent": model.messages_sent[r], "messages_received": model.messages_received[r]}


# P = 1 never reaches the exercise bodies (nothing to send), so only P >= 2 carries their marks.
EXERCISE_MARKS = [pytest.mark.exercise("ring_allreduce"), pytest.mark.exercise("parameter_server_allreduce"),
                  pytest.mark.exercise("tree_allreduce")]


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [1] + [pytest.param(p, marks=EXERCISE_MARKS) for p in range(2, 9)])
def test_ledger_and_clock_match_schedule_and_formulas(world_size):
    p = world_size
    results = run(_measure, p, LENGTHS, link=LINK)
    for n in LENGTHS:
        for algorithm in COLLECTIVES:
            model = price(schedule(algorithm, p), n, 4, LINK)
            for r in range(p):
                stats, elapsed = results[r][algorithm, n]
                assert stats == _ledger(model, r), (algorithm, n, r)
                assert math.isclose(elapsed, model.finish[r], rel_tol=1e-9, abs_tol=1e-15), (algorithm, n, r)
            pow2 = p & (p - 1) == 0
            if algorithm in FORMULAS and n % p == 0 and (pow2 or algorithm in ("naive", "parameter_server",
                                                                               "ring", "pairwise")):
                formula = allreduce_cost(algorithm, p, 4 * n, LINK.alpha, LINK.beta)
                sent = [results[r][algorithm, n][0]["bytes_sent"] for r in range(p)]
                messages = [results[r][algorithm, n][0]["messages_sent"] for r in range(p)]
                received = [results[r][algorithm, n][0]["bytes_received"] for r in range(p)]
                assert sent == formula.bytes_sent and messages == formula.messages_sent, (algorithm, n)
                assert received == formula.bytes_received, (algorithm, n)
                slowest = max(results[r][algorithm, n][1] for r in range(p))
                assert math.isclose(slowest, formula.time, rel_tol=1e-9, abs_tol=1e-15), (algorithm, n)
                check_textbook_formula(algorithm, p, 4 * n, sent, messages, received)


def check_textbook_formula(algorithm, p, nbytes, sent, messages, received):
    """The issue's formulas, independently of cost.py."""
    if p == 1:
        assert sent == [0] and messages == [0]
        return
    log2p = p.bit_length() - 1
    if algorithm == "ring":
        assert sent == [2 * (p - 1) * nbytes // p] * p and messages == [2 * (p - 1)] * p
    elif algorithm == "naive":
        assert sent == [(p - 1) * nbytes] * p and messages == [p - 1] * p
    elif algorithm == "parameter_server":
        assert sent[0] == received[0] == (p - 1) * nbytes
        assert sent[1:] == received[1:] == [nbytes] * (p - 1)
    elif algorithm == "recursive_doubling":
        assert sent == [log2p * nbytes] * p and messages == [log2p] * p
    elif algorithm == "rabenseifner":
        assert sent == [2 * (p - 1) * nbytes // p] * p and messages == [2 * log2p] * p
    elif algorithm == "tree":
        assert sum(sent) == 2 * (p - 1) * nbytes and sum(messages) == 2 * (p - 1)


@settings(max_examples=6)  # each example starts P processes
@given(p=st.integers(1, 8), n=st.integers(0, 2000), dtype=st.sampled_from([np.int16, np.float32, np.float64]))
def test_price_is_the_ledger_and_clock_any_size(p, n, dtype):
    results = run(_measure, p, [n], dtype, link=LINK)
    for algorithm in COLLECTIVES:
        model = price(schedule(algorithm, p), n, np.dtype(dtype).itemsize, LINK)
        for r in range(p):
            stats, elapsed = results[r][algorithm, n]
            assert stats == _ledger(model, r), (algorithm, p, n, r)
            assert math.isclose(elapsed, model.finish[r], rel_tol=1e-9, abs_tol=1e-15), (algorithm, p, n, r)


@given(log2p=st.integers(0, 6), chunks=st.integers(0, 50), itemsize=st.sampled_from([2, 4, 8]),
       algorithm=st.sampled_from(FORMULAS))
def test_closed_form_equals_schedule(log2p, chunks, itemsize, algorithm):
    p = 1 << log2p
    n = p * chunks
    model = price(schedule(algorithm, p), n, itemsize, LinkModel(3e-6, 2e-9))
    formula = allreduce_cost(algorithm, p, n * itemsize, 3e-6, 2e-9)
    assert formula.bytes_sent == model.bytes_sent and formula.messages_sent == model.messages_sent
    assert formula.bytes_received == model.bytes_received
    assert formula.messages_received == model.messages_received
    assert formula.steps == model.steps
    assert math.isclose(formula.time, model.time, rel_tol=1e-12, abs_tol=1e-18)


@given(p=st.integers(2, 40), n=st.integers(0, 200),
       algorithm=st.sampled_from(["naive", "parameter_server", "ring", "pairwise"]))
def test_closed_form_equals_schedule_any_world_size(p, n, algorithm):
    n -= n % p  # these four formulas need only P | n
    model = price(schedule(algorithm, p), n, 4, LinkModel(1e-6, 1e-9))
    formula = allreduce_cost(algorithm, p, 4 * n, 1e-6, 1e-9)
    assert formula.bytes_sent == model.bytes_sent and math.isclose(formula.time, model.time, rel_tol=1e-12)


@given(p=st.integers(1, 24), algorithm=st.sampled_from(FORMULAS))
def test_every_schedule_is_an_allreduce(p, algorithm):
    """Replay with sets of contributors: every rank ends with all P contributions in every chunk, once."""
    plan = schedule(algorithm, p)
    held = [[{r: 1} for _ in range(plan.parts)] for r in range(p)]  # held[rank][chunk] = {contributor: count}
    for step in plan.steps:
        # a step's messages leave before it lands; naive sends each rank's own input
        snapshot = ([[{r: 1} for _ in range(plan.parts)] for r in range(p)] if plan.own_input
                    else [[dict(c) for c in chunks] for chunks in held])
        for t in step:
            for c in range(t.lo, t.hi):
                incoming = snapshot[t.src][c]
                if t.reduce:
                    for k, v in incoming.items():
                        held[t.dst][c][k] = held[t.dst][c].get(k, 0) + v
                else:
                    held[t.dst][c] = dict(incoming)
    for r in range(p):
        for c in range(plan.parts):
            assert held[r][c] == {k: 1 for k in range(p)}, (algorithm, p, r, c)


@given(p=st.integers(1, 24))
def test_double_tree_schedule_is_an_allreduce(p):
    """Symbolic replay as above: chunk 0 on tree A, chunk 1 on tree B, every contribution once."""
    plan = schedule("double_tree", p)
    held = [[{r: 1} for _ in range(2)] for r in range(p)]
    for step in plan.steps:
        snapshot = [[dict(c) for c in chunks] for chunks in held]
        for t in step:
            incoming = snapshot[t.src][t.lo]
            if t.reduce:
                for k, v in incoming.items():
                    held[t.dst][t.lo][k] = held[t.dst][t.lo].get(k, 0) + v
            else:
                held[t.dst][t.lo] = dict(incoming)
    assert all(held[r][c] == {k: 1 for k in range(p)} for r in range(p) for c in range(2)), p


@given(p=st.integers(1, 40), n=st.integers(0, 300), itemsize=st.sampled_from([1, 4, 8]))
def test_double_tree_and_van_de_geijn_closed_forms(p, n, itemsize):
    """double_tree: 4(P − 1) messages and 2(P − 1)·n elements in all, at most 4 messages and 4⌈n/2⌉ per
    rank. van_de_geijn (P | n): root 2(P − 1) messages and 2(P − 1)/P·n, the others P − 1 and (P − 1)/P·n."""
    tree = price(schedule("double_tree", p), n, itemsize, LINK)
    assert sum(tree.messages_sent) == sum(tree.messages_received) == 4 * (p - 1)
    assert sum(tree.bytes_sent) == sum(tree.bytes_received) == 2 * (p - 1) * n * itemsize
    assert max(tree.messages_sent) <= 4 and max(tree.bytes_sent) <= 4 * -(-n // 2) * itemsize
    n -= n % p
    vdg = price(schedule("van_de_geijn", p), n, itemsize, LINK)
    share = (p - 1) * n // p * itemsize
    assert vdg.bytes_sent == [2 * share] + [share] * (p - 1) if p > 1 else vdg.bytes_sent == [0]
    assert vdg.messages_sent == ([2 * (p - 1)] + [p - 1] * (p - 1) if p > 1 else [0])
    closed = 2 * (p - 1) * LINK.alpha + 2 * share * LINK.beta
    assert math.isclose(vdg.time, closed, rel_tol=1e-12, abs_tol=1e-18)


def test_collective_seconds_waits_for_the_larger_piece():
    link = LinkModel(alpha=1e-6, beta=1e-9)
    for p in (2, 4, 8):                          # 2(P − 1)(α + β·n/P) for n = 24 words of 8 bytes
        closed = 2 * (p - 1) * (link.alpha + link.beta * 8 * 24 / p)
        for algorithm in ("ring", "pairwise"):
            assert collective_seconds(algorithm, p, 24, 8, link) == pytest.approx(closed, rel=1e-12)
    # 5 words over 2 ranks: pieces of 3 and 2; each round waits for the larger piece
    assert collective_seconds("ring", 2, 5, 8, link) == pytest.approx(2 * (link.alpha + 24 * link.beta))
    assert collective_seconds("ring", 1, 5, 8, link) == 0.0


def test_chunk_sizes_follow_array_split():
    plan = schedule("ring", 4)
    assert list(chunk_sizes(plan, 10)) == [len(a) for a in np.array_split(np.arange(10), 4)]


@given(p=st.integers(1, 8), n=st.integers(0, 100))
def test_alltoall_schedule_delivers_piece_j_to_rank_j(p, n):
    plan = schedule("alltoall", p)
    got = sorted((t.src, t.dst, t.lo) for step in plan.steps for t in step)
    assert got == [(r, j, j) for r in range(p) for j in range(p) if j != r]
    assert collective_seconds("alltoall", p, n, 4, LINK) == price(plan, n, 4, LINK).time


def test_cost_rejects_bad_arguments():
    with pytest.raises(ValueError, match="algorithm"):
        allreduce_cost("butterfly", 4, 10, 1e-6, 1e-9)
    with pytest.raises(ValueError, match="world_size"):
        schedule("ring", 0)
    with pytest.raises(TypeError, match="link"):
        price(schedule("ring", 2), 4, 4, 1e-6)

"""Diagnosing the ring all-reduce in its own terms: which phase, step, rank and chunk went wrong.

Every element of rank q's chunk c holds B^q + K·(c + 1)·C^q (int64; B = P + 1, K = B^P, C = P² + 1,
P <= 5). A sum of such values keeps, in base B, how often each rank was added and, above K in base C,
the sum of the chunk tags each rank gave: a value names the ranks summed and which chunk each gave. A wrapped
communicator snapshots the array after every ``sendrecv`` (one per ring step, as the statement asks) and
records how many elements each step sent; the reference schedule, replayed on sets of ranks, says what
every chunk must hold after every step:
    reduce-scatter step s: rank r adds chunk (r − s − 1) mod P from r − 1; it then holds ranks r − s − 1 .. r
    all-gather: every rank ends with every chunk summed over all P ranks.
"""

import numpy as np

from minidist.collectives.pieces import split_offsets
from minidist.collectives.ring import ring_allgather, ring_reduce_scatter


def bases(p: int) -> tuple[int, int, int]:
    """(B, K, C): rank digits in base B = P + 1 below K = B^P; chunk digits in base C = P² + 1 above."""
    if not 1 <= p <= 5:
        raise ValueError(f"p={p}: the (rank, chunk) code fits int64 for 1 <= P <= 5")
    return p + 1, (p + 1) ** p, p * p + 1


def code(p: int, rank: int, chunk: int) -> int:
    b, k, c = bases(p)
    return b ** rank + k * (chunk + 1) * c ** rank


def encoded(p: int, n: int, rank: int) -> np.ndarray:
    """Rank ``rank``'s contribution: shape (n,), int64, each chunk's elements naming (rank, chunk)."""
    bounds = split_offsets(n, p)
    out = np.empty(n, np.int64)
    for c in range(p):
        out[bounds[c]:bounds[c + 1]] = code(p, rank, c)
    return out


def describe(p: int, value: int) -> str:
    """What a value holds, e.g. "chunk 2 summed over ranks [0, 3]" or "rank 0's chunk 2 + rank 3's chunk 3"
    (a rank added twice is listed twice)."""
    b, k, c = bases(p)
    high, low = divmod(int(value), k)
    terms = []
    for q in range(p):
        low, count = divmod(low, b)
        high, chunks = divmod(high, c)
        if count and chunks % count == 0:
            terms += [(q, chunks // count - 1)] * count
        elif count or chunks:
            return f"{value}, a value no sum of rank contributions gives"
    if not terms or low or high:
        return f"{value}, a value no sum of rank contributions gives"
    if len({chunk for _, chunk in terms}) == 1:
        return f"chunk {terms[0][1]} summed over ranks {[q for q, _ in terms]}"
    return " + ".join(f"rank {q}'s chunk {chunk}" for q, chunk in terms)


class SnoopingComm:
    """The communicator, with every sendrecv recorded: (elements sent, a copy of flat afterwards)."""

    def __init__(self, comm, flat: np.ndarray):
        self._comm, self._flat, self.steps = comm, flat, []

    def __getattr__(self, name):
        return getattr(self._comm, name)

    def sendrecv(self, sendbuf, *args, **kwargs):
        got = self._comm.sendrecv(sendbuf, *args, **kwargs)
        self.steps.append((int(np.asarray(sendbuf).size), self._flat.copy()))
        return got


def ring_trace(comm, n: int, op: str = "sum"):
    """Worker: run the two phases on encoded data; ([(sent, flat) per reduce-scatter step],
    flat after it, [(sent, flat) per all-gather step], flat after it). A phase that raises is named."""
    p, r = comm.world_size, comm.rank
    flat = encoded(p, n, r) if op == "sum" else np.full(n, r + 1, np.int64)
    out = []
    for phase, run_phase, args in (("reduce-scatter", ring_reduce_scatter, (op,)),
                                   ("all-gather", ring_allgather, ())):
        snoop = SnoopingComm(comm, flat)
        try:
            run_phase(snoop, flat, *args)
        except Exception as err:
            raise AssertionError(f"rank {r}: {phase} (step {len(snoop.steps)}) raised "
                                 f"{type(err).__name__}: {err}") from err
        out += [snoop.steps, flat.copy()]
    return out


def expected_sets(p: int) -> list[list[list[set[int]]]]:
    """[step][rank][chunk] -> the ranks a chunk is summed over after reduce-scatter step s."""
    state = [[{r} for _ in range(p)] for r in range(p)]
    history = []
    for s in range(p - 1):
        new = [[set(c) for c in rank] for rank in state]
        for r in range(p):
            c = (r - s - 1) % p
            new[(r + 1) % p][c] |= state[r][c]
        state = new
        history.append(state)
    return history


def chunk_message(p: int, values: np.ndarray, c: int, want: set[int]) -> str | None:
    """None when a chunk holds chunk c summed over exactly ``want``; else what it holds instead."""
    expected = sum(code(p, q, c) for q in want)
    if values.size == 0 or np.all(values == expected):
        return None
    seen = sorted({describe(p, v) for v in np.unique(values)})
    return "; ".join(seen) if len(seen) <= 2 else f"{len(seen)} different values ({seen[0]}; ...)"


def diagnose_ring(results, n: int) -> str | None:
    """The first wrong thing in ring_trace's results (one per rank), said in the algorithm's terms."""
    p = len(results)
    bounds = split_offsets(n, p)
    size = [int(bounds[c + 1] - bounds[c]) for c in range(p)]
    history = expected_sets(p)
    everyone = set(range(p))
    for r, (rs_steps, _, _, _) in enumerate(results):
        if p > 1 and rs_steps and len(rs_steps) != p - 1:
            return (f"reduce-scatter on rank {r}: {len(rs_steps)} sendrecv steps; the ring takes "
                    f"P − 1 = {p - 1}")
    for s in range(p - 1):
        for r, (rs_steps, _, _, _) in enumerate(results):
            if len(rs_steps) <= s:
                continue
            sent, flat = rs_steps[s]
            sent_chunk = (r - s - 1) % p
            if sent != size[sent_chunk]:
                return (f"reduce-scatter step {s}: rank {r} sent {sent} elements; a ring step sends one "
                        f"chunk, chunk {sent_chunk} of {size[sent_chunk]} elements")
            for c in range(p):
                want = history[s][r][c]
                seen = chunk_message(p, flat[bounds[c]:bounds[c + 1]], c, want)
                if seen:
                    return (f"after reduce-scatter step {s}, rank {r} should hold the partial sum of "
                            f"chunk {c} over ranks {sorted(want)}; it holds {seen}")
    for r, (_, after_rs, _, _) in enumerate(results):
        seen = chunk_message(p, after_rs[bounds[r]:bounds[r + 1]], r, everyone)
        if seen:
            return (f"after reduce-scatter, ring_chunk(flat, P, {r}) on rank {r} should be the full sum of "
                    f"chunk {r} over ranks {sorted(everyone)}; it holds {seen}")
    for r, (_, _, ag_steps, after_ag) in enumerate(results):
        if p > 1 and len(ag_steps) not in (0, p - 1):
            return f"all-gather on rank {r}: {len(ag_steps)} sendrecv steps; the ring takes P − 1 = {p - 1}"
        for s, (sent, _) in enumerate(ag_steps):
            if sent != size[(r - s) % p]:
                return (f"all-gather step {s}: rank {r} sent {sent} elements; a ring step sends one chunk, "
                        f"chunk {(r - s) % p} of {size[(r - s) % p]} elements")
        for c in range(p):
            seen = chunk_message(p, after_ag[bounds[c]:bounds[c + 1]], c, everyone)
            if seen:
                return f"after all-gather, rank {r} lacks chunk {c} (the full sum); it holds {seen}"
    return None


def diagnose_ring_op(results, n: int, op: str) -> str | None:
    """ring_trace with op "max"/"min" (rank r contributes r + 1): chunk r on rank r after reduce-scatter."""
    p = len(results)
    bounds = split_offsets(n, p)
    want = p if op == "max" else 1
    for r, (_, after_rs, _, _) in enumerate(results):
        chunk = after_rs[bounds[r]:bounds[r + 1]]
        if chunk.size and not np.all(chunk == want):
            hint = " (the sum: op= was not applied)" if chunk[0] == p * (p + 1) // 2 else ""
            return (f"with op={op!r}, after reduce-scatter ring_chunk(flat, P, {r}) on rank {r} should be "
                    f"the {op} over the ranks' values 1..{p}, {want}; it holds {int(chunk[0])}{hint}")
    return None

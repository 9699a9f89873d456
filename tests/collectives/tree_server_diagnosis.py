"""Diagnosing the tree and parameter-server all-reduces in their own terms: which tree level, which
rank's gradient is missing.

Rank q contributes (P + 1)^q in every element (int64): a sum keeps, in base P + 1, how often each rank
was added, so every message names the ranks summed in it. A wrapped communicator records every send
(peer, a copy of the message) of a rank; the schedules say what each message must hold:
    tree reduce, level k: rank r with lowest set bit 2^k sends ranks [r, r + 2^k) to r − 2^k
    tree broadcast: every rank ends with all P ranks, received from its parent r − 2^k
    parameter server: every worker sends its own gradient to the root only; the root's total (each
    message it sends back) holds every rank once.
"""

import numpy as np

from minidist.collectives.allreduce import parameter_server_allreduce
from minidist.collectives.tree import tree_allreduce


def ranks_in(p: int, value: int) -> list[int]:
    """The ranks summed into a value, a rank added twice listed twice ([] if no sum gives it)."""
    ranks, rest = [], int(value)
    for q in range(p):
        rest, count = divmod(rest, p + 1)
        ranks += [q] * count
    return ranks if rest == 0 else []


def said(p: int, values: np.ndarray) -> str:
    """"ranks [0, 1]" for a message or array holding that sum everywhere; else its distinct values."""
    distinct = np.unique(values)
    if distinct.size == 1:
        return f"ranks {ranks_in(p, distinct[0])}"
    return "a mix: " + ", ".join(f"ranks {ranks_in(p, v)}" for v in distinct[:3])


class RecordingComm:
    """The communicator, with every send recorded as (dst, a copy of the message)."""

    def __init__(self, comm):
        self._comm, self.sent = comm, []

    def __getattr__(self, name):
        return getattr(self._comm, name)

    def send(self, buf, dst, *args, **kwargs):
        self.sent.append((int(dst), np.array(buf, copy=True)))
        return self._comm.send(buf, dst, *args, **kwargs)


def traffic_trace(comm, algorithm: str, n: int, op: str = "sum"):
    """Worker: run "tree" or "parameter_server" on the coded data; (sends, the result)."""
    p, r = comm.world_size, comm.rank
    flat = np.full(n, (p + 1) ** r if op == "sum" else r + 1, np.int64)
    recorder = RecordingComm(comm)
    function = {"tree": tree_allreduce, "parameter_server": parameter_server_allreduce}[algorithm]
    try:
        result = function(recorder, flat, op)
    except Exception as err:
        raise AssertionError(f"rank {r}: {algorithm} raised {type(err).__name__}: {err}") from err
    return recorder.sent, np.array(result)


def diagnose_tree(results) -> str | None:
    """The first wrong message or result of traffic_trace(..., "tree"), by tree level."""
    p = len(results)
    for r in range(1, p):
        low = r & -r
        sent = results[r][0]
        want = list(range(r, min(r + low, p)))
        level = low.bit_length() - 1
        if not sent:
            return (f"tree reduce, level {level}: rank {r} sent nothing; it should send ranks {want} to "
                    f"rank {r - low}")
        dst, message = sent[0]
        if dst != r - low:
            return (f"tree reduce, level {level}: rank {r} sent its partial sum to rank {dst}; its parent is "
                    f"rank {r - low} (r − 2^{level})")
        if said(p, message) != f"ranks {want}":
            return (f"tree reduce, level {level}: rank {r} should send rank {r - low} the partial sum over "
                    f"ranks {want}; it sent {said(p, message)}")
    for r in range(p):
        got = said(p, results[r][1])
        if got != f"ranks {list(range(p))}":
            parent = f"from its parent rank {r - (r & -r)}" if r else "(the root, after the reduce)"
            return (f"tree broadcast: rank {r} should end with the full sum over ranks {list(range(p))} "
                    f"{parent}; it holds {got}")
    return None


def diagnose_server(results, root: int = 0) -> str | None:
    """The first wrong message or result of traffic_trace(..., "parameter_server"): whose gradient."""
    p, everyone = len(results), list(range(len(results)))
    for r in range(p):
        if r == root:
            continue
        sent = results[r][0]
        if [dst for dst, _ in sent] != [root]:
            return (f"parameter server: worker rank {r} sent to ranks {[dst for dst, _ in sent]}; a worker "
                    f"sends its gradient once, to the server (rank {root})")
        if said(p, sent[0][1]) != f"ranks [{r}]":
            return (f"parameter server: worker rank {r} should send its own gradient; it sent "
                    f"{said(p, sent[0][1])}")
    for dst, message in results[root][0]:
        got = ranks_in(p, message.flat[0]) if message.size else everyone
        if got != everyone:
            missing = sorted(set(everyone) - set(got))
            twice = sorted({q for q in got if got.count(q) > 1})
            what = (f"lacks rank(s) {missing}'s gradient" if missing else "") + \
                   (" and " if missing and twice else "") + (f"counts rank(s) {twice} twice" if twice else "")
            what = what or "is " + said(p, message)
            return f"parameter server: the total the server sends rank {dst} {what}"
    for r in range(p):
        if said(p, results[r][1]) != f"ranks {everyone}":
            return (f"parameter server: rank {r} should end with the sum over ranks {everyone}; it holds "
                    f"{said(p, results[r][1])}")
    return None


def diagnose_op(results, op: str) -> str | None:
    """traffic_trace with op "max"/"min" (rank r contributes r + 1): every rank's result."""
    p = len(results)
    want = p if op == "max" else 1
    for r, (_, result) in enumerate(results):
        if result.size and not np.all(result == want):
            hint = " (the sum: op= was not applied)" if result.flat[0] == p * (p + 1) // 2 else ""
            return (f"with op={op!r}, rank {r} should end with the {op} over the ranks' values 1..{p}, "
                    f"{want}; it holds {int(result.flat[0])}{hint}")
    return None

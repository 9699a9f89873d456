"""The overlap of gradient communication with the backward pass: closed-form schedule and pictures.

``DataParallel`` (data_parallel.py) keeps two streams per rank on the simulated clock: the compute
stream (forward, then backward layer by layer, each backward twice its forward) and the communication
stream (the bucket allreduces, one after the other, each starting when its last gradient is ready):

    T_step = max(end of backward, end of the last allreduce)
    bucket k starts at max(end of bucket k−1, time its last gradient is ready)

``step_time`` computes exactly that from per-layer forward times and per-bucket communication times, so a
lesson can sweep P = 1..64 without starting 64 processes. The "Distributed Deep Learning (Part II)"
slides' form, for the ring:

    T_comm = 2 Σ_i (α(P − 1) + β (P − 1)/P |W_i|)          (|W_i| in bytes, one allreduce per layer)

``save_overlap_chrome`` writes both streams of every rank as a Chrome trace.
"""

from __future__ import annotations

from pathlib import Path

from minidist.cluster import Span, Trace
from minidist.sim.memory import save_chrome


def step_time(forward_seconds: list[float], bucket_ready_layer: list[int], bucket_seconds: list[float],
              overlap: bool = True, delayed_seconds: float = 0.0) -> float:
    """Simulated time of one data-parallel step.

    forward_seconds[i]: layer i's forward time (backward = 2x). bucket_ready_layer[k]: the layer whose
    backward completes bucket k (buckets in issue order). bucket_seconds[k]: its allreduce time.
    delayed_seconds: the last step's delayed bucket (delayed.py), allreduced from the step's start.
    """
    t = sum(forward_seconds)
    done = {}
    for i in reversed(range(len(forward_seconds))):
        t += 2 * forward_seconds[i]
        done[i] = t
    free = delayed_seconds        # the comm stream's free time (a bucket starts after the forward anyway)
    for layer, seconds in zip(bucket_ready_layer, bucket_seconds):
        free = max(free, done[layer] if overlap else t) + seconds
    return max(t, free)


def save_overlap_chrome(trace: Trace, compute_spans: list[list[Span]], path: str | Path) -> Path:
    """Chrome trace (Perfetto): per rank one track for compute, one for communication; times in us."""
    events = []
    for rank in range(len(compute_spans)):
        for tid, name in ((2 * rank, f"rank {rank} compute"), (2 * rank + 1, f"rank {rank} comm")):
            events.append({"name": "thread_name", "ph": "M", "pid": 0, "tid": tid, "args": {"name": name}})
        comm = [s for s in trace.rank_spans(rank) if s.kind in ("send", "recv")]    # its sends and recvs
        for tid, spans in ((2 * rank, compute_spans[rank]), (2 * rank + 1, comm)):
            for s in spans:
                events.append({"name": s.label, "cat": s.kind, "ph": "X", "pid": 0, "tid": tid,
                               "ts": s.start * 1e6, "dur": (s.end - s.start) * 1e6,
                               "args": {"peer": s.peer, "bytes": s.nbytes}})
    return save_chrome(path, events)

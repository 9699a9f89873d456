"""Hogwild!: P processes run SGD on one parameter array in shared memory, without any lock.

Niu, Recht, Ré, Wright, "Hogwild!: A Lock-Free Approach to Parallelizing Stochastic Gradient Descent"
(the "Hardware Accelerators for Training DNNs" slides: "Hogwild! — asynchronous on shared memory";
"Scaling Deep Learning": "don't synchronize, just overwrite parameters opportunistically"). When each
example touches only a few of the d coordinates, two processes rarely write the same coordinate at once,
and the rare overwritten update hardly matters. Here, sparse logistic regression (y in {−1, +1}):

    for each example (indices e, values v, label y) of this process:
        m = Σ_i w[e_i] v_i;   w[e] ← w[e] + lr · y · σ(−y m) · v      (read, compute, write: no lock)

A *conflict* is a write to coordinates that another process wrote between this process's read and its
write; a version counter per coordinate detects it (the count itself is racy: an estimate). The locked
variant holds one lock around read-compute-write, so it has no conflict and no parallelism.
These are real processes on real cores: this is the one place the clock is the wall clock.
"""

from __future__ import annotations

import ctypes
import time
from contextlib import nullcontext
from typing import NamedTuple

import multiprocess
import numpy as np

from minidist.collectives.pieces import split_range
from minidist.nn.checks import check_count, check_real


class SparseProblem(NamedTuple):
    index: np.ndarray     # (N, m) int64: the nonzero coordinates of each example
    value: np.ndarray     # (N, m) float64: their values
    label: np.ndarray     # (N,) float64 in {−1, +1}
    dim: int              # d


def sparse_problem(examples: int, dim: int, nonzeros: int, rng: np.random.Generator) -> SparseProblem:
    """Synthetic sparse logistic regression: labels from a hidden weight vector, m nonzeros per example."""
    if not 0 < nonzeros <= dim or examples < 1:
        raise ValueError(f"sparse_problem needs examples >= 1 and 0 < nonzeros <= dim, got {examples}, "
                         f"{nonzeros}, {dim}")
    truth = rng.standard_normal(dim)
    index = np.stack([rng.choice(dim, nonzeros, replace=False) for _ in range(examples)])
    value = rng.standard_normal((examples, nonzeros))
    label = np.where(np.sum(truth[index] * value, axis=1) >= 0, 1.0, -1.0)
    return SparseProblem(index, value, label, dim)


def loss(problem: SparseProblem, w: np.ndarray) -> float:
    """Mean logistic loss log(1 + exp(−y·m)) of w on the problem."""
    margin = problem.label * np.sum(w[problem.index] * problem.value, axis=1)
    return float(np.mean(np.logaddexp(0.0, -margin)))


def _worker(problem, rank, processes, epochs, lr, weights, versions, lock, seed, start, counts) -> None:
    w = np.frombuffer(weights, dtype=np.float64)
    version = np.frombuffer(versions, dtype=np.int64)
    rng = np.random.default_rng(seed)
    lo, hi = split_range(len(problem.label), processes, rank)
    conflicts = 0
    start.wait()
    for _ in range(epochs):
        for i in lo + rng.permutation(hi - lo):
            e, v, y = problem.index[i], problem.value[i], problem.label[i]
            with lock:                                       # Hogwild!: a nullcontext, no lock at all
                seen = version[e].copy()
                m = float(w[e] @ v)
                w[e] += lr * y / (1.0 + np.exp(y * m)) * v   # y·σ(−y m)·v
                if np.any(version[e] != seen):               # someone wrote here since we read
                    conflicts += 1
                version[e] += 1
    counts[rank] = conflicts


def hogwild(problem: SparseProblem, processes: int, epochs: int, lr: float, *, lock: bool = False,
            seed: int = 0, timeout: float = 300.0) -> dict:
    """Train w (starting at 0) with ``processes`` OS processes sharing it; returns
    {"w", "loss", "updates", "seconds" (wall clock), "updates_per_second", "conflicts"}.

    Each process takes its contiguous share of the examples (collectives.pieces), in its own random order
    each epoch (seeded by SeedSequence(seed).spawn).
    """
    processes, epochs = check_count(processes, "hogwild: processes"), check_count(epochs, "hogwild: epochs")
    if processes > len(problem.label):
        raise ValueError(f"hogwild: {processes} processes for {len(problem.label)} examples: "
                         f"one would have none")
    check_real(lr, "hogwild: lr", 0, strict=True)
    ctx = multiprocess.get_context("fork")
    weights = ctx.RawArray(ctypes.c_double, problem.dim)
    versions = ctx.RawArray(ctypes.c_int64, problem.dim)
    counts = ctx.RawArray(ctypes.c_int64, processes)
    start = ctx.Event()
    the_lock = ctx.Lock() if lock else nullcontext()
    seeds = np.random.SeedSequence(seed).spawn(processes)
    procs = [ctx.Process(target=_worker, args=(problem, r, processes, epochs, lr, weights, versions, the_lock,
                                              seeds[r], start, counts)) for r in range(processes)]
    for p in procs:
        p.start()
    time.sleep(0.2)                       # let every process reach start.wait(): startup is not timed
    began = time.perf_counter()
    start.set()
    try:
        for p in procs:
            p.join(timeout)
        seconds = time.perf_counter() - began
        if any(p.exitcode != 0 for p in procs):
            raise RuntimeError(f"hogwild: a process failed (exit codes {[p.exitcode for p in procs]})")
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join()
    w = np.frombuffer(weights, dtype=np.float64).copy()
    updates = epochs * len(problem.label)
    conflicts = int(np.sum(np.frombuffer(counts, dtype=np.int64)))
    return {"w": w, "loss": loss(problem, w), "updates": updates, "seconds": seconds,
            "updates_per_second": updates / seconds, "conflicts": conflicts}

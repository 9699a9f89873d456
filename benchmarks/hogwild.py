"""Hogwild! updates per second on this machine: P = 1 vs P = 2 lock-free processes (and one lock).

Target (issue 20): P = 2 lock-free processes make >= 1.7x the updates per second of P = 1. Real
processes on real cores (minidist.parallel.asynchronous.hogwild), sparse logistic regression where each
example touches 10 of 10,000 coordinates. Wall clock, best of --repeats runs each; the load of the machine
(os.getloadavg) is printed with the result, because two busy processes need two idle cores.

    PYTHONPATH=. python benchmarks/hogwild.py [--examples 20000] [--epochs 2] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os

import numpy as np

from minidist.parallel.asynchronous import hogwild, sparse_problem


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=20000)
    parser.add_argument("--dim", type=int, default=10000)
    parser.add_argument("--nonzeros", type=int, default=10)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    problem = sparse_problem(args.examples, args.dim, args.nonzeros, np.random.default_rng(0))
    hogwild(problem, 1, 1, 0.5)                                      # warm the cores up
    print(f"load average before: {os.getloadavg()[0]:.1f}; {args.examples} examples x {args.epochs} epochs, "
          f"d = {args.dim}, {args.nonzeros} nonzeros each")
    best = {}
    for name, processes, lock in [
        ("P = 1", 1, False),
        ("P = 2, no lock", 2, False),
        ("P = 2, one lock", 2, True),
    ]:
        runs = [hogwild(problem, processes, args.epochs, 0.5, lock=lock, seed=r) for r in range(args.repeats)]
        out = max(runs, key=lambda o: o["updates_per_second"])
        best[name] = out["updates_per_second"]
        rates = ", ".join(f"{o['updates_per_second']:.0f}" for o in runs)
        print(
            f"{name:>16}: {out['updates_per_second']:9.0f} updates/s (runs: {rates}), "
            f"loss {out['loss']:.4f}, "
            f"conflicts {out['conflicts']} of {out['updates']}"
        )
    print(f"P = 2 lock-free / P = 1: {best['P = 2, no lock'] / best['P = 1']:.2f}x (target >= 1.7x); "
          f"P = 2 locked / P = 1: {best['P = 2, one lock'] / best['P = 1']:.2f}x; "
          f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()

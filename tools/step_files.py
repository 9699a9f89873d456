"""Which files of minidist one ``parallelize(...).train_step`` enters, measured by tracing it.

    python tools/step_files.py                    data 2 × tensor 2, the second step (the first builds)
    python tools/step_files.py --first            the first step: the split, the executor and the step
    python tools/step_files.py --data 2 --pipeline 2 --tensor 2

On every rank of a cluster of data × pipeline × tensor processes a tiny float64 GPT (vocabulary 11,
8 positions, 2 blocks, d = 8, 2 heads) is handed to ``parallelize``; one step runs with ``sys.setprofile``
(and ``threading.setprofile``: the cluster's helper threads) recording every Python function call whose
code lies in a file under minidist/. The files are the union over the ranks, printed with the number of
distinct functions entered in each, in three parts: the path of the step (what parallelize composes:
parallel/, the runner, collectives/, the optimizer, the clock, ...), the model's own layers (nn/ but the
runner: one process enters them too) and the simulated cluster (cluster/: the machine the messages cross).
lessons/ONE_GRADIENT.md quotes what it prints.
"""

from __future__ import annotations

import argparse
import sys
import threading
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = str(ROOT / "minidist") + "/"


def _traced_step(comm, sizes: dict, first: bool) -> dict[str, set[str]]:
    """Run one train_step under the profiler; {file relative to the root: {functions entered}}."""
    from minidist.nn import GPT, CrossEntropyLoss
    from minidist.optim import AdamW
    from minidist.parallel import Mesh, parallelize

    gpt = GPT(11, 8, 2, 8, 2, rng=np.random.default_rng(0), dtype=np.float64)
    trainer = parallelize(gpt, Mesh(comm, **sizes), loss_fn=CrossEntropyLoss(),
                          optimizer=lambda params: AdamW(params, lr=1e-3))
    x, y = np.random.default_rng(1).integers(0, 11, size=(2, 8, 8))
    if not first:
        trainer.train_step(x, y)                                 # the build: not the hot path
    entered: dict[str, set[str]] = {}

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(PACKAGE):
            path = frame.f_code.co_filename[len(str(ROOT)) + 1:]
            entered.setdefault(path, set()).add(frame.f_code.co_name)

    threading.setprofile(profile)
    sys.setprofile(profile)
    try:
        trainer.train_step(x, y)
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    return entered


def part(path: str) -> str:
    """Which of the three parts a file of minidist/ belongs to."""
    if path.startswith("minidist/cluster/"):
        return "cluster"
    if path.startswith("minidist/nn/") and path != "minidist/nn/runner.py":
        return "model"
    return "path"


PARTS = {"path": "the step's path", "model": "the model's layers (nn/)", "cluster": "the simulated cluster"}


def files_entered(data: int = 2, pipeline: int = 1, tensor: int = 2, first: bool = False) -> dict[str, int]:
    """{file under minidist/: functions entered in it} for one train_step, the union over the ranks."""
    sys.path.insert(0, str(ROOT))
    from minidist.cluster import run

    sizes = {"data": data, "pipeline": pipeline, "tensor": tensor}
    union: dict[str, set[str]] = {}
    for entered in run(_traced_step, data * pipeline * tensor, sizes, first, timeout=120):
        for path, functions in entered.items():
            union.setdefault(path, set()).update(functions)
    return {path: len(functions) for path, functions in sorted(union.items())}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for axis, size in (("data", 2), ("pipeline", 1), ("tensor", 2)):
        parser.add_argument(f"--{axis}", type=int, default=size)
    parser.add_argument("--first", action="store_true", help="trace the first step (it builds the split)")
    args = parser.parse_args(argv)
    files = files_entered(args.data, args.pipeline, args.tensor, args.first)
    step = "the first" if args.first else "the second"
    print(f"files of minidist/ entered by {step} train_step of a data {args.data} × pipeline {args.pipeline} "
          f"× tensor {args.tensor} GPT (functions entered in each):")
    for key, title in PARTS.items():
        mine = {path: n for path, n in files.items() if part(path) == key}
        print(f"{title}: {len(mine)} files")
        for path, functions in mine.items():
            print(f"{functions:6d}  {path}")
    print(f"in all {len(files)} files, {sum(files.values())} functions")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

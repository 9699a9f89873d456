"""Which files of minidist one ``parallelize(...).train_step`` enters, measured by tracing it.

    python tools/step_files.py                    data 2 × tensor 2, the second step (the first builds)
    python tools/step_files.py --first            the first step: the split, the executor and the step
    python tools/step_files.py --data 2 --pipeline 2 --tensor 2
    python tools/step_files.py --functions      the names of the functions entered in each file

On every rank of a cluster of data × pipeline × tensor processes a tiny float64 GPT (vocabulary 11,
8 positions, 2 blocks, d = 8, 2 heads) is handed to ``parallelize``; one step runs with ``sys.setprofile``
(and ``threading.setprofile``: the cluster's helper threads) recording every Python function call whose
code lies in a file under minidist/. The files are the union over the ranks, printed with the number of
distinct functions entered in each, in three parts:

    added by parallel training   the files the step enters that one process's step of the same GPT
                                 (forward, loss, backward, AdamW's step, traced the same way) does not,
                                 outside cluster/: the path lessons/ONE_GRADIENT.md walks
    one process's too            the model's layers, the loss, the optimizer
    the simulated cluster        cluster/: the machine the messages cross

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


def _gpt_and_batch():
    from minidist.nn import GPT

    gpt = GPT(11, 8, 2, 8, 2, rng=np.random.default_rng(0), dtype=np.float64)
    return gpt, np.random.default_rng(1).integers(0, 11, size=(2, 8, 8))


def _traced_step(comm, sizes: dict | None, first: bool) -> dict[str, set[str]]:
    """Run one step under the profiler; {file relative to the root: {functions entered}}. sizes None:
    one process's step (no comm), as the tests' reference writes it."""
    from minidist.nn import CrossEntropyLoss
    from minidist.optim import AdamW
    from minidist.parallel import Mesh, parallelize

    gpt, (x, y) = _gpt_and_batch()
    if sizes is None:
        loss_fn, optimizer = CrossEntropyLoss(), AdamW(gpt.parameters(), lr=1e-3)

        def step(x, y):
            gpt.zero_grad()
            loss_fn.forward(gpt.forward(x), y)
            gpt.backward(loss_fn.backward())
            optimizer.step()
    else:
        trainer = parallelize(gpt, Mesh(comm, **sizes), loss_fn=CrossEntropyLoss(),
                              optimizer=lambda params: AdamW(params, lr=1e-3))
        step = trainer.train_step
    if not first:
        step(x, y)                                               # the build: not the hot path
    entered: dict[str, set[str]] = {}

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(PACKAGE):
            path = frame.f_code.co_filename[len(str(ROOT)) + 1:]
            entered.setdefault(path, set()).add(frame.f_code.co_name)

    threading.setprofile(profile)
    sys.setprofile(profile)
    try:
        step(x, y)
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    return entered


PARTS = {"path": "added by parallel training", "one": "one process's too", "cluster": "the simulated cluster"}


def part(path: str, one_process: set[str]) -> str:
    """Which of PARTS a file of minidist/ belongs to, given the files one process's step enters."""
    if path.startswith("minidist/cluster/"):
        return "cluster"
    return "one" if path in one_process else "path"


def one_process_files() -> set[str]:
    """The files of minidist/ one process's step of the same GPT enters (its second step, or first)."""
    sys.path.insert(0, str(ROOT))
    return set(_traced_step(None, None, False))


def files_entered(data: int = 2, pipeline: int = 1, tensor: int = 2, first: bool = False) -> dict[str, set]:
    """{file under minidist/: {functions entered in it}} for one train_step, the union over the ranks."""
    sys.path.insert(0, str(ROOT))
    from minidist.cluster import run

    sizes = {"data": data, "pipeline": pipeline, "tensor": tensor}
    union: dict[str, set[str]] = {}
    for entered in run(_traced_step, data * pipeline * tensor, sizes, first, timeout=120):
        for path, functions in entered.items():
            union.setdefault(path, set()).update(functions)
    return dict(sorted(union.items()))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for axis, size in (("data", 2), ("pipeline", 1), ("tensor", 2)):
        parser.add_argument(f"--{axis}", type=int, default=size)
    parser.add_argument("--first", action="store_true", help="trace the first step (it builds the split)")
    parser.add_argument("--functions", action="store_true", help="name the functions entered in each file")
    args = parser.parse_args(argv)
    files, one_process = files_entered(args.data, args.pipeline, args.tensor, args.first), one_process_files()
    step = "the first" if args.first else "the second"
    print(f"files of minidist/ entered by {step} train_step of a data {args.data} × pipeline {args.pipeline} "
          f"× tensor {args.tensor} GPT (functions entered in each):")
    for key, title in PARTS.items():
        mine = {path: n for path, n in files.items() if part(path, one_process) == key}
        print(f"{title}: {len(mine)} files")
        for path, functions in mine.items():
            names = "  " + ", ".join(sorted(functions)) if args.functions else ""
            print(f"{len(functions):6d}  {path}{names}")
    print(f"in all {len(files)} files, {sum(map(len, files.values()))} functions")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

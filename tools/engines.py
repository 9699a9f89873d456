"""Which executor runs a parallelize(...) Trainer's step, for each pipeline size, measured by tracing it.

    python tools/engines.py         prints, per pipeline size, the executors its layouts ran

Issue 53: one engine per pipeline size — with one pipeline rank the split model runs through one
StepRunner, with more through the one Pipeline executor, whatever the other options (ZeRO stage, mixed
precision, sequence parallelism, micro-batches, the other axes). On 4 ranks, every layout of LAYOUTS
takes two steps of a tiny float64 GPT (float32 with mixed precision; a Switch Transformer where it has an
expert axis); the second is traced with sys.setprofile, recording which executor entry point code
under minidist/parallel/compose/ called: ``StepRunner.forward_backward`` (nn/runner.py) or
``Pipeline.train_step`` (pipeline/pipeline.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = str(ROOT / "minidist" / "parallel" / "compose") + "/"
EXECUTORS = {("runner.py", "forward_backward"): "StepRunner", ("pipeline.py", "train_step"): "Pipeline"}

# (mesh sizes, parallelize's options, a Switch model?) on 4 ranks
LAYOUTS = [
    (dict(data=4), {}, False),
    (dict(data=2, tensor=2), {}, False),
    (dict(data=2, tensor=2), dict(sequence_parallel=True), False),
    (dict(data=4), dict(zero=1), False),
    (dict(data=2, tensor=2), dict(zero=2), False),
    (dict(data=4), dict(zero=3), False),
    (dict(data=4), dict(mixed={}), False),
    (dict(data=4), dict(micro_batches=2), False),
    (dict(data=2, context=2), {}, False),
    (dict(data=2, expert=2), {}, True),
    (dict(data=2, pipeline=2), {}, False),
    (dict(pipeline=2, tensor=2), dict(micro_batches=2, schedule="gpipe"), False),
    (dict(data=2, pipeline=2), dict(zero=1, micro_batches=2), False),
    (dict(pipeline=2, expert=2), dict(micro_batches=2, schedule="zb-h1"), True),
]


def _model(switch: bool, groups: int, dtype):
    from minidist.nn import GPT, SwitchTransformer

    rng = np.random.default_rng(0)
    if switch:
        return SwitchTransformer(11, 8, 2, 8, 2, 2, 16, groups=groups, rng=rng, dtype=dtype)
    return GPT(11, 8, 2, 8, 2, rng=rng, dtype=dtype)


def _executors(comm) -> list[tuple[int, str]]:
    """(pipeline size, the executors its second step entered from compose/) for every layout."""
    from minidist.nn import CrossEntropyLoss
    from minidist.optim import AdamW
    from minidist.parallel import Mesh, parallelize
    from minidist.precision import BF16

    x, y = np.random.default_rng(1).integers(0, 11, size=(2, 8, 8))
    out = []
    for sizes, options, switch in LAYOUTS:
        options = {**options, "mixed": dict(fmt=BF16)} if "mixed" in options else options
        groups = sizes.get("data", 1) * sizes.get("expert", 1) * options.get("micro_batches", 1)
        dtype = np.float32 if "mixed" in options else np.float64       # (FP32 masters)
        trainer = parallelize(_model(switch, groups, dtype), Mesh(comm, **sizes), loss_fn=CrossEntropyLoss(),
                              optimizer=lambda params: AdamW(params, lr=1e-3), **options)
        trainer.train_step(x, y)
        seen: set[str] = set()

        def profile(frame, event, arg, seen=seen):
            if event == "call" and frame.f_back is not None and \
                    frame.f_back.f_code.co_filename.startswith(COMPOSE):
                key = (Path(frame.f_code.co_filename).name, frame.f_code.co_name)
                if key in EXECUTORS:
                    seen.add(EXECUTORS[key])

        sys.setprofile(profile)
        try:
            trainer.train_step(x, y)
        finally:
            sys.setprofile(None)
        out += [(sizes.get("pipeline", 1), name) for name in seen]
    return out


def engines() -> dict[int, set[str]]:
    """{pipeline size: the executors the Trainer ran for it}, the union over LAYOUTS and the ranks."""
    sys.path.insert(0, str(ROOT))
    from minidist.cluster import run

    found: dict[int, set[str]] = {}
    for rank in run(_executors, 4, timeout=300):
        for size, name in rank:
            found.setdefault(size, set()).add(name)
    return found


if __name__ == "__main__":
    for size, names in sorted(engines().items()):
        print(f"pipeline size {size}: {', '.join(sorted(names))}")

"""``python -m minidist train``: a small GPT (``--experts E``: a Switch Transformer) trained on CPython's
help() text (minidist.data.load_text: characters are tokens) on the simulated cluster, in any layout of the
five axes — ``Mesh`` + ``parallelize``, nothing else of the parallel package.

    python -m minidist train                                      # data 2 × tensor 2, 2 blocks, d = 64
    python -m minidist train --data 2 --pipeline 2 --tensor 2 --micro-batches 4 --check
    python -m minidist train --data 2 --expert 4 --check          # a Switch model: 4 experts a layer
    python -m minidist train --resume --steps 100 --data 4         # on from runs/train, another layout
    python -m minidist train --restarts 2 --save-every 10          # a rank lost: on from the last checkpoint

It prints a line per step (the loss: cross-entropy + router losses; simulated and wall time of the step),
the validation loss on held-out text every --eval-every steps and at the end, and a sample of generated
text; it writes loss.png and the checkpoint into --out (train_files.py). ``--check`` runs the same steps
again in this process on the unsplit model and prints the largest differences of the parameters and the
losses: in float64 a layout trains like one process to rounding (≤ 1e-9, else the exit status is 1).

Checkpoints are minidist.checkpoint's (weights and AdamW's moments, per rank; train_files.py): --resume goes
on from the newest, in any layout, as if never stopped; ``--restarts N`` runs through
checkpoint.run_resilient: when a rank dies the run restarts from the newest checkpoint, up to N times, and
prints each failure. Test hook: MINIDIST_TRAIN_KILL="RANK:STEP" makes rank RANK die before step STEP, once.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

import numpy as np

from minidist.checkpoint import run_resilient
from minidist.cluster import ClusterError, run
from minidist.data import load_text
from minidist.nn.checks import count_option

from .train_files import CHECKPOINTS, plot_losses, saved_run
from .train_loop import AXES, build_model, one_process, train_on_rank, validation_batches, validation_loss

# The model's shape: with --resume these come from the checkpoint (given again, they must agree).
MODEL = {"layers": 2, "d_model": 64, "heads": 4, "block": 32, "experts": None, "d_ff": None,
         "dtype": "float64", "seed": 0}
DEFAULT_LAYOUT = {"data": 2, "tensor": 2}
CHECK_TOLERANCE = 1e-9           # float64: the largest parameter or loss difference a correct layout keeps


def add_parser(sub) -> argparse.ArgumentParser:
    """The ``train`` command of python -m minidist (returned)."""
    p = sub.add_parser("train", help="train a small GPT or Switch model in any layout (--check: one process)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)

    def count(minimum: int) -> dict:                  # an integer option >= minimum, shown as N
        return dict(type=count_option(minimum), metavar="N")

    layout = p.add_argument_group("layout (the product is the number of simulated ranks; without any of the "
                                  "five axes: data 2 × tensor 2, else an axis not given is 1)")
    for axis in AXES:
        layout.add_argument(f"--{axis}", **count(1))
    layout.add_argument("--ranks", **count(1), help="the cluster's size (default: the product)")
    layout.add_argument("--zero", type=int, default=0, choices=(0, 1, 2, 3), help="ZeRO stage (default 0)")
    layout.add_argument("--schedule", default="1f1b", help="pipeline schedule: gpipe, 1f1b, interleaved, "
                        "zb-h1, chimera (default 1f1b)")
    layout.add_argument("--micro-batches", **count(1), default=1, help="per token set (default 1)")
    layout.add_argument("--chunks", **count(1), default=2, help="interleaved: stages per rank (default 2)")
    layout.add_argument("--sequence-parallel", action="store_true",
                        help="the tensor axis also splits the tokens between its all-reduces")
    model = p.add_argument_group("model (default: 2 blocks, d = 64, 4 heads, 32 characters, float64, seed 0)")
    model.add_argument("--layers", **count(1))
    model.add_argument("--d-model", **count(1))
    model.add_argument("--heads", **count(1))
    model.add_argument("--block", **count(1), help="characters per window (the context)")
    model.add_argument("--experts", **count(0), help="> 0: a Switch Transformer with that many experts per "
                       "layer (default: --expert's size if > 1, else 0: a dense GPT)")
    model.add_argument("--d-ff", **count(1), help="an expert's hidden width (default 4·d)")
    model.add_argument("--dtype", choices=("float32", "float64"))
    model.add_argument("--seed", **count(0), help="the weights, the batches, the sample")
    run = p.add_argument_group("training")
    run.add_argument("--steps", **count(1), default=300, help="default 300")
    run.add_argument("--batch", **count(1), default=32, help="windows per step (default 32)")
    run.add_argument("--lr", type=positive, default=3e-3, help="AdamW's learning rate (default 3e-3)")
    run.add_argument("--eval-every", **count(1), default=50, help="default 50")
    run.add_argument("--sample", **count(0), default=200, help="characters to generate (default 200)")
    run.add_argument("--prompt", default="The ", help="the sample's start (default 'The ')")
    run.add_argument("--out", type=Path, default=Path("runs/train"), help="default runs/train")
    run.add_argument("--resume", action="store_true", help="go on from the newest checkpoint in --out (the "
                     "model's flags come from it; weights and AdamW's moments, onto any layout)")
    run.add_argument("--save-every", **count(1), help="steps between checkpoints (default: --eval-every)")
    run.add_argument("--restarts", **count(0), default=0, help="restart from the newest checkpoint when a "
                     "rank dies, up to N times (default 0)")
    run.add_argument("--check", action="store_true", help="rerun the steps in one process and compare")
    p.set_defaults(func=cmd_train)
    return p


def positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def fail(message) -> int:
    print(f"python -m minidist train: error: {message}", file=sys.stderr)
    return 2


def configure(args, corpus):
    """(config, start step, history) from the flags and, with --resume, the newest checkpoint."""
    step, history, saved = 0, {"train": [], "val": []}, {}
    if args.resume:
        step, saved, history = saved_run(args.out)
    given = {axis: getattr(args, axis) for axis in AXES if getattr(args, axis) is not None}
    config = {axis: given.get(axis, 1) if given else DEFAULT_LAYOUT.get(axis, 1) for axis in AXES}
    config.update({key: getattr(args, key) for key in ("zero", "schedule", "micro_batches", "chunks",
                                                       "sequence_parallel", "steps", "batch", "lr",
                                                       "eval_every")})
    config["save_every"] = args.save_every or args.eval_every
    for key, default in MODEL.items():
        flag = getattr(args, key)
        if saved and flag is not None and flag != saved[key]:
            raise ValueError(f"--{key.replace('_', '-')} {flag} differs from the checkpoint's {saved[key]}")
        config[key] = saved[key] if saved else default if flag is None else flag
    if config["experts"] is None:              # an expert axis, and no --experts: one expert per rank
        config["experts"] = config["expert"] if config["expert"] > 1 else 0
    if args.ranks is not None and args.ranks != ranks(config):
        raise ValueError(f"the layout {layout_text(config)} has {ranks(config)} ranks, "
                         f"--ranks says {args.ranks}")
    if args.out.exists() and not args.out.is_dir():
        raise ValueError(f"--out {args.out} is a file, not a folder")
    if config["block"] >= len(corpus.val):
        raise ValueError(f"--block must be below the {len(corpus.val)} held-out characters")
    corpus.encode(args.prompt)                 # ValueError for a character the corpus does not have
    build_model(config, corpus.vocab_size)     # ValueError for a shape the model refuses (heads vs d, ...)
    return config, step, history


def ranks(config: dict) -> int:
    return int(np.prod([config[axis] for axis in AXES]))


def layout_text(config: dict) -> str:
    sizes = [f"{axis} {config[axis]}" for axis in AXES if config[axis] > 1]
    return " × ".join(sizes) or "one rank"


def cmd_train(args) -> int:
    """The command, on one BLAS thread (small products: more threads only wait on each other)."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1, user_api="blas"):
        return train(args)


def train(args) -> int:
    corpus = load_text()
    try:
        config, start_step, history = configure(args, corpus)
    except (FileNotFoundError, ValueError) as err:
        return fail(err)
    model = build_model(config, corpus.vocab_size)
    print(f"{model!r}: {model.num_parameters():,} parameters, {config['dtype']}; {corpus!r}")
    print(f"layout {layout_text(config)} = {ranks(config)} ranks, schedule {config['schedule']}, "
          f"micro-batches {config['micro_batches']}, zero {config['zero']}; {config['steps']} steps of "
          f"{config['batch']} × {config['block']} characters, AdamW lr {config['lr']:g}"
          + (f", from step {start_step}" if start_step else ""), flush=True)
    started, last, out = time.perf_counter(), start_step + config["steps"], str(args.out)
    if not args.resume and (args.out / CHECKPOINTS).exists():
        shutil.rmtree(args.out / CHECKPOINTS)          # a new run: the last one's checkpoints go
    work = (train_on_rank, ranks(config), config, corpus, out, last, history)
    try:
        if args.restarts:
            done = run_resilient(*work, root=args.out / CHECKPOINTS, restarts=args.restarts, timeout=None)
            results = done.results
            if done.failures:
                print(done.report(), flush=True)
        else:
            results = run(*work, timeout=None)
    except ClusterError as lost:                       # a rank died (and the restarts ran out)
        print(f"python -m minidist train: error: {str(lost).splitlines()[0]}", file=sys.stderr)
        return 1
    if "refused" in (results[0] or {}):
        return fail(results[0]["refused"])
    record, wall = results[0], time.perf_counter() - started
    history = record["history"]
    print(f"{config['steps']} steps in {wall:.1f} s wall, {sum(s for _, s in record['sim']) * 1e3:.2f} ms "
          f"simulated; validation {record['val'][-1][1]:.4f} (unigram baseline {corpus.unigram_loss():.4f})")
    report_sample(config, corpus, record["state"], args.prompt, args.sample)
    objective = "cross-entropy + router losses" if config["experts"] else "cross-entropy"
    figure = plot_losses(args.out, history, f"{type(model).__name__}, {layout_text(config)}", objective)
    print(f"wrote {args.out / CHECKPOINTS} (step {last}) and {figure}")
    return report_check(config, corpus, out, start_step, record) if args.check else 0


def report_sample(config: dict, corpus, state: dict, prompt: str, length: int) -> None:
    """Print ``length`` characters sampled after ``prompt`` from the trained model (temperature 0.8, top-k 10,
    seeded)."""
    if not length:
        return
    model = build_model(config, corpus.vocab_size, evaluation=True)
    model.load_state_dict(state)
    tokens = model.generate(corpus.encode(prompt)[None], length, temperature=0.8, top_k=10,
                            rng=np.random.default_rng([config["seed"], 3]))
    print(f"sample (temperature 0.8, top-k 10):\n{corpus.decode(tokens[0])}")


def report_check(config: dict, corpus, out: str, start_step: int, record: dict) -> int:
    """Run the steps in one process; print the largest differences; 1 if float64 and one of them is beyond
    the tolerance."""
    started = time.perf_counter()
    state, losses = one_process(config, corpus, out, start_step, start_step + config["steps"])
    params = max(float(np.max(np.abs(record["state"][name] - value))) for name, value in state.items())
    loss = max((abs(a - dict(losses)[step]) for step, a in record["losses"]), default=0.0)
    val = validation_loss(build_model(config, corpus.vocab_size, evaluation=True), state,
                          validation_batches(corpus, config))
    print(f"check: one process, same weights, batches and AdamW ({time.perf_counter() - started:.1f} s): "
          f"largest parameter difference {params:.3e}, largest loss difference {loss:.3e}, "
          f"validation {val:.4f}")
    if config["dtype"] == "float64" and max(params, loss) > CHECK_TOLERANCE:
        print(f"check FAILED: {max(params, loss):.3e} > {CHECK_TOLERANCE:g}", file=sys.stderr)
        return 1
    if config["dtype"] == "float32":
        print("(float32: the split model sums in another order, and AdamW magnifies the rounding where a "
              "gradient is near 0; --dtype float64 checks to 1e-9)")
    return 0

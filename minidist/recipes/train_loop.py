"""What ``python -m minidist train`` runs: the model, the batches, one rank's loop, and one process's.

Every rank builds the same unsplit model from the same seed and hands it to ``parallelize`` with a
``Mesh`` of the layout; every rank draws the same global batch of step s (windows of the training text at
offsets from ``default_rng([seed, 1, s])``) and ``train_step`` takes its share. ``one_process`` runs the
same steps on the unsplit model — same initial weights, same batches, same AdamW, loss = cross-entropy +
router losses — which is what ``--check`` compares with.

A Switch Transformer routes its tokens in groups, each with its own capacity and balance loss. The mesh
routes each micro-batch of each of the data × expert token sets as one group, so the model is built with
groups = data × expert × micro_batches, and one process, routing the whole batch in that many contiguous
groups, routes the same tokens together. With a context axis a group is a rank's zigzag positions, which
no contiguous grouping matches: there the model drops no token (capacity factor = experts) and has no
balance loss (its z-loss is a mean over tokens, whatever the groups), so that one process still agrees.
Validation and sampling run an unsplit copy that drops no token (capacity factor = experts, one group).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

from minidist.checkpoint import latest, load, save
from minidist.checkpoint.manifest import step_dir
from minidist.nn import GPT, CrossEntropyLoss, SwitchTransformer
from minidist.optim import AdamW
from minidist.parallel import Mesh, parallelize

from .train_files import CHECKPOINTS, load_unsplit

AXES = ("data", "pipeline", "tensor", "context", "expert")
SWITCH_ROUTING = dict(capacity_factor=1.25, aux_loss_coef=0.01, z_loss_coef=0.001)


def routing(config: dict) -> dict:
    """The Switch layers' routing keywords for this layout (module docstring)."""
    if config["context"] > 1:
        return dict(capacity_factor=float(config["experts"]), aux_loss_coef=0.0, z_loss_coef=0.001)
    return dict(SWITCH_ROUTING)


def build_model(config: dict, vocab_size: int, *, evaluation: bool = False) -> GPT:
    """The unsplit model of ``config``, initialised from its seed (the same on every rank). evaluation:
    the copy validation and sampling run (a Switch model in one group, dropping no token)."""
    rng, dtype = np.random.default_rng(config["seed"]), np.dtype(config["dtype"]).type
    shape = (vocab_size, config["block"], config["layers"], config["d_model"], config["heads"])
    if not config["experts"]:
        return GPT(*shape, rng=rng, dtype=dtype)
    options = routing(config)
    groups = config["data"] * config["expert"] * config["micro_batches"]
    if evaluation:
        options["capacity_factor"], groups = float(config["experts"]), 1
    return SwitchTransformer(*shape, config["experts"], config["d_ff"], groups=groups, **options, rng=rng,
                             dtype=dtype)


def train_batch(corpus, config: dict, step: int) -> tuple[np.ndarray, np.ndarray]:
    """The global batch of ``step`` (1, 2, ...): x, y (batch, block) int64, a function of seed and step only
    (so a resumed run and one process draw the same)."""
    rng = np.random.default_rng([config["seed"], 1, step])
    return corpus.windows("train", config["batch"], config["block"], rng)


def validation_batches(corpus, config: dict, count: int = 4, rows: int = 32) -> list:
    """``count`` batches of ``rows`` windows of the held-out text, the same at every evaluation."""
    rng = np.random.default_rng([config["seed"], 2])
    return [corpus.windows("val", rows, config["block"], rng) for _ in range(count)]


def validation_loss(model: GPT, state: dict, batches: list) -> float:
    """Mean cross-entropy (nats per character) of ``model`` with weights ``state`` on ``batches``."""
    model.load_state_dict(state)
    model.eval()
    loss_fn = CrossEntropyLoss()
    return float(np.mean([loss_fn.forward(model.forward(x), y) for x, y in batches]))


def make_optimizer(config: dict):
    """parameters -> AdamW(lr) (weight decay 0.01, torch's default): the one optimizer both runs use."""
    return lambda params: AdamW(params, lr=config["lr"])


def kill_hook(out: Path, rank: int, step: int) -> None:
    """MINIDIST_TRAIN_KILL="RANK:STEP" (a test hook): rank RANK dies (os._exit(1)) before step STEP, once per
    --out (it leaves out/killed-RANK-STEP), so a --restarts run resumes and does not meet it again."""
    target = os.environ.get("MINIDIST_TRAIN_KILL")
    marker = Path(out) / f"killed-{target.replace(':', '-')}" if target else None
    if target and target == f"{rank}:{step}" and not marker.exists():
        marker.touch()
        os._exit(1)


def train_on_rank(comm, config: dict, corpus, out: str, end_step: int, history: dict):
    """One rank of the run: parallelize, resume from out/checkpoints' newest checkpoint (weights, AdamW's
    moments, the history) if there is one, train up to ``end_step``, saving a checkpoint every
    ``save_every`` steps and at the end. Rank 0 prints a line per step and the validation loss before
    training (once the first step has run: a layout refused there computes nothing), every ``eval_every``
    steps and at the end, and returns {"losses", "val", "sim", "wall", "state", "history", "start"}
    (this attempt's (step, value) lists, the final full state dict, the run's whole history, the step it
    started from); the other ranks return None. A layout parallelize refuses returns {"refused": its
    message} on every rank."""
    model, root = build_model(config, corpus.vocab_size), Path(out) / CHECKPOINTS
    try:
        trainer = parallelize(model, Mesh(comm, **{axis: config[axis] for axis in AXES}),
                              loss_fn=CrossEntropyLoss(), optimizer=make_optimizer(config),
                              micro_batches=config["micro_batches"], schedule=config["schedule"],
                              chunks=config["chunks"], zero=config["zero"],
                              sequence_parallel=config["sequence_parallel"])
        start = 0
        if latest(root) is not None:                    # (load builds the split: a refusal comes here)
            saved = load(trainer, root)
            start, history = saved["step"], saved["extra"]["history"]
    except (TypeError, ValueError) as refused:        # the same refusal on every rank, before any message
        return {"refused": str(refused)}
    lead = comm.rank == 0
    record = {"losses": [], "val": [], "sim": [], "wall": []}
    evaluator = build_model(config, corpus.vocab_size, evaluation=True)
    val = validation_batches(corpus, config)

    def evaluate(step: int, state: dict) -> None:
        if lead:
            record["val"].append((step, validation_loss(evaluator, state, val)))
            history["val"].append(list(record["val"][-1]))
            print(f"step {step:5d}  validation {record['val'][-1][1]:.4f}", flush=True)

    initial = trainer.full_state_dict() if start == 0 else None     # evaluated once step 1 ran
    steps = range(start + 1, end_step + 1)
    state = trainer.full_state_dict() if not steps else None
    for step in steps:
        kill_hook(out, comm.rank, step)
        x, y = train_batch(corpus, config, step)
        clock, wall = comm.clock, time.perf_counter()
        try:
            loss = trainer.train_step(x, y)
        except ValueError as refused:                  # the first step builds the split model
            if step == steps[0]:
                return {"refused": str(refused)}
            raise
        sim, wall = comm.clock - clock, time.perf_counter() - wall
        for name, value in (("losses", loss), ("sim", sim), ("wall", wall)):
            record[name].append((step, value))
        history["train"].append([step, loss])
        if initial is not None:                        # the layout trains: the validation before it
            evaluate(0, initial)
            initial = None
        if lead:
            print(f"step {step:5d}  loss {loss:.4f}  simulated {sim * 1e3:8.3f} ms  "
                  f"wall {wall * 1e3:6.0f} ms", flush=True)
        if step % config["eval_every"] == 0 or step == steps[-1]:
            state = trainer.full_state_dict()          # collective: every rank takes part
            evaluate(step, state)
        if step % config["save_every"] == 0 or step == steps[-1]:
            save(trainer, root, step, extra={"config": config, "history": history})   # (rank 0's is kept)
    return {**record, "state": state, "history": history, "start": start} if lead else None


def one_process(config: dict, corpus, out: str, start_step: int, end_step: int):
    """The same steps on the unsplit model in this process, from the checkpoint of ``start_step`` (its
    weights and AdamW's moments) when it is not 0: (its state_dict, [(step, objective)])."""
    model = build_model(config, corpus.vocab_size)
    optimizer, loss_fn, losses = make_optimizer(config)(model.parameters()), CrossEntropyLoss(), []
    if start_step:
        load_unsplit(model, optimizer, step_dir(Path(out) / CHECKPOINTS, start_step))
    for step in range(start_step + 1, end_step + 1):
        x, y = train_batch(corpus, config, step)
        model.zero_grad()
        loss = loss_fn.forward(model.forward(x), y)
        losses.append((step, loss + getattr(model, "router_loss", 0.0)))
        model.backward(loss_fn.backward())
        optimizer.step()
    return model.state_dict(), losses

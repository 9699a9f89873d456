"""What a Trainer's first step builds (trainer.py runs the steps): the split model, this rank's share of
the objective, and one engine:

    pipeline = 1   one StepRunner steps the units through the rank's micro-batches, with its attachments:
                   the data attachment (data_attachment), mixed precision (MixedPrecisionTrainer), the
                   clock (ComputeCharges: charged as a pipeline stage is) and the activation peak
                   (sim.memory.ActivationPeak: what the stage's ledger would count)
    pipeline > 1   the Pipeline executor runs the task table over the same units, each stage through its
                   own StepRunner; its data attachment per stage (sent while the stage's last backward
                   runs) or once after the table (overlap=False, ZeRO-1)

With overlap=False (and ZeRO-1) the data attachment runs in one empty pass once the compute is done: the
step the planner's minidist mode prices.
"""

from __future__ import annotations

from minidist.nn import Sequential
from minidist.nn.runner import StepRunner
from minidist.precision.mixed import MixedPrecisionTrainer
from minidist.sim.compute import ComputeCharges
from minidist.sim.memory import ActivationPeak

from ..data import GradientSync, ZeroSync
from ..pipeline.pipeline import Pipeline
from .split_model import split_for_mesh
from .state import label_elements, owners, restore_values


def build(trainer, seq_len: int) -> None:
    """Split trainer.model for sequences of seq_len, share out the objective, build the engine (once;
    collective: every rank of the mesh calls it)."""
    trainer.seq_len, trainer.named = seq_len, label_elements(trainer.model)
    trainer.units = split_for_mesh(trainer.model, trainer.mesh, seq_len,
                                   sequence_parallel=trainer.sequence_parallel)
    per_pass = 1.0 if trainer.table is not None else 1 / trainer.micro_batches   # the executor weights 1/M
    trainer.loss = trainer.take_share(per_pass)
    if trainer.table is None:
        build_one_stage(trainer)
    else:
        build_pipeline(trainer)


def restore(trainer, params) -> None:
    """The held parameters get their real values back; which elements each holds, and who owns each."""
    trainer.held = list({id(p): p for p in params}.values())
    trainer.labels = restore_values(trainer.named, trainer.held)
    trainer.owner = owners(trainer.mesh.comm, trainer.labels, sum(v.size for _, _, v in trainer.named))


def build_one_stage(trainer) -> None:
    restore(trainer, trainer.units.parameters())
    zero, mixed = trainer.zero, trainer.mixed
    in_runner = zero >= 2 or mixed is not None or (zero == 0 and trainer.overlap)
    if zero:
        sync = data_attachment(trainer, trainer.units, zero=zero)
        trainer.optimizer = sync.optimizer
    else:
        trainer.optimizer = trainer.make_optimizer(trainer.held)
        if mixed is not None:
            whole = Sequential(trainer.units)       # casts at the model's input and output, as on the GPT
            trainer.recipe = MixedPrecisionTrainer(whole, trainer.optimizer, trainer.loss, **mixed)
        sync = data_attachment(trainer, trainer.units, mixed=trainer.recipe, overlap=trainer.overlap)
    trainer.activations = ActivationPeak(trainer.units)
    clock = ComputeCharges(trainer.mesh.comm, overlap=False, after=True, label="")
    attachments = ([sync] if in_runner else []) + ([trainer.recipe] if trainer.recipe else [])
    trainer.runner = StepRunner(trainer.units, trainer.loss, [*attachments, clock, trainer.activations])
    trainer.after_passes = [] if in_runner else [sync]


def build_pipeline(trainer) -> None:
    stage_sync = None
    if trainer.zero == 0 and trainer.overlap:      # each stage's buckets sent while its last backward runs
        def stage_sync(k, stage):
            return [data_attachment(trainer, stage)]
    trainer.pipeline = Pipeline(trainer.mesh.group("pipeline"), trainer.units, loss_fn=trainer.loss,
                                schedule=trainer.table, num_micro_batches=trainer.micro_batches,
                                stage_attachments=stage_sync)
    restore(trainer, trainer.pipeline.parameters())
    mine = Sequential(*(trainer.pipeline.stages[k] for k in sorted(trainer.pipeline.stages)))
    if trainer.zero or not trainer.overlap:        # once after the table (ZeRO-1: reduce-scatter at step)
        trainer.pipeline.attachments.append(data_attachment(trainer, mine, zero=trainer.zero, overlap=False))
    trainer.optimizer = trainer.syncs[-1].optimizer if trainer.zero else trainer.make_optimizer(trainer.held)


def data_attachment(trainer, module, *, zero: int = 0, mixed=None, overlap: bool = True):
    """The data axis's attachment on ``module``'s parameters (the one place it is built): partial sums,
    then DDP's buckets (zero=0, GradientSync) or the ZeRO stage (ZeroSync) over the data group."""
    data = trainer.mesh.group("data")
    if zero:
        sync = ZeroSync(module, data, stage=zero, make_optimizer=trainer.make_optimizer,
                        bucket_bytes=trainer.bucket_bytes)
    else:
        sync = GradientSync(module, data, bucket_bytes=trainer.bucket_bytes, overlap=overlap, mixed=mixed,
                            inf_group=trainer.mesh.comm)
    trainer.syncs.append(sync)
    return sync

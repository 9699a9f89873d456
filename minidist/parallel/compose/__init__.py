"""parallelize: any subset of data (ZeRO-1, 2, 3; mixed precision), pipeline (any schedule), tensor
(+ sequence), context and expert parallelism on one GPT or Switch Transformer and one Mesh.

    refusals.py     every check made before the model is touched
    split_model.py  split_for_mesh: the transforms for a mesh, the model as its units
    trainer.py      the Trainer's step: the batch cut in one place, the engine run, the loss share gathered
    build.py        what the first step builds: the split, a StepRunner or the Pipeline, their attachments
    state.py        which elements each rank holds; the full state dict
"""

from __future__ import annotations

from minidist.parallel.data.buckets import DEFAULT_BUCKET_BYTES

from .refusals import check_parallelize
from .split_model import split_for_mesh
from .trainer import Trainer

__all__ = ["Trainer", "parallelize", "split_for_mesh"]


def parallelize(model, mesh, *, loss_fn, optimizer, micro_batches: int = 1, schedule: str = "1f1b",
                chunks: int = 2, zero: int = 0, mixed: dict | None = None, sequence_parallel: bool = False,
                overlap: bool = True, bucket_bytes: int | None = DEFAULT_BUCKET_BYTES) -> Trainer:
    """A Trainer of ``model`` over ``mesh`` that trains like one process. The recipe:

        from minidist.parallel import Mesh, parallelize
        mesh = Mesh(comm, data=2, tensor=2)            # inside minidist.cluster.run(fn, 4): comm is the world
        trainer = parallelize(gpt, mesh, loss_fn=CrossEntropyLoss(),
                              optimizer=lambda params: AdamW(params, lr=1e-3))
        loss = trainer.train_step(x, y)          # the GLOBAL batch on every rank; the global objective back
        state = trainer.full_state_dict()        # = gpt.state_dict() after the same steps in one process

    model: an unsplit nn.GPT or nn.SwitchTransformer, dropout 0, built the same on every rank (a Switch
    model's ``groups`` = data × expert × micro_batches: its routing groups are the mesh's). mesh: a Mesh
    (mesh.py: data, pipeline, context, expert, tensor). loss_fn: e.g. CrossEntropyLoss(). optimizer: a
    function parameters -> optimizer (called with this rank's parameters, or its ZeRO shards).
    micro_batches: M per token set (gradient accumulation with one pipeline rank). schedule: a name of
    pipeline/registry.SYNCHRONOUS (interleaved: ``chunks`` stages per rank), moot with one pipeline rank.
    zero: the data axis's ZeRO stage (0: DDP's allreduce; 2, 3: without a pipeline axis). mixed: None, or
    MixedPrecisionTrainer's keywords (``dict(fmt=BF16, scaler=...)``; zero=0, no pipeline axis, M = 1).
    sequence_parallel: the tensor axis also splits the tokens between its all-reduces (Korthikanti et
    al.). overlap: the data group's buckets go out while backward runs (False: one reduction after the
    step's backward, as the planner's minidist mode prices it); bucket_bytes: their capacity.

    How the mesh splits the work: token set s = d·E + j (data rank d, expert rank j) trains rows
    [s·N/S, (s+1)·N/S) of the batch, S = D·E, each row's zigzag positions split over the C context ranks;
    the model is split by split_for_mesh (the blocks over the tensor group — Megatron; the embeddings, ln_f
    and the head whole on every rank —, ring attention over the context group, the experts over the
    expert group) and, with P > 1 pipeline ranks, its units cut into the table's stages. Each rank's loss
    is its share 1/(S·C) of the global mean; the data attachment sums the partial gradients (context,
    expert) and reduces over the data group. The refusals (refusals.py) come before the model is touched.
    """
    table = check_parallelize(model, mesh, loss_fn=loss_fn, optimizer=optimizer, micro_batches=micro_batches,
                              schedule=schedule, chunks=chunks, zero=zero, mixed=mixed,
                              sequence_parallel=sequence_parallel, overlap=overlap, bucket_bytes=bucket_bytes)
    return Trainer(model, mesh, loss_fn=loss_fn, make_optimizer=optimizer, table=table,
                   micro_batches=micro_batches, zero=zero, mixed=mixed, sequence_parallel=sequence_parallel,
                   overlap=overlap, bucket_bytes=bucket_bytes)

"""``expert_parallel``: spread the experts of every MoE layer of a Switch Transformer (or of one block)
over the e ranks of a group, in place (GShard, Switch Transformer).

    blocks.mlp   nn.MoE -> ExpertParallelMoE: E/e experts kept, the router replicated, tokens to their
                 expert's rank and back by all-to-all (expert_parallel.py)

Each rank of the group trains on its own rows of the batch, so every parameter outside the experts
(embeddings, attention, norms, routers, head) holds a gradient over this rank's rows only: the transform
appends the group to its ``partial_over``. An expert's gradient is already the sum over the group's rows
(the all-to-all brought them), so experts are not marked. Each rank's objective must be its share 1/e of
the global mean — its cross-entropy and each MoE's router-loss coefficients scaled by 1/e — so that the
partial sums add up to the gradient of the mean.
"""

from __future__ import annotations

from minidist.nn import GPT, Module, MoE, TransformerBlock

from .expert_parallel import ExpertParallelMoE


def expert_parallel(model: Module, group) -> Module:
    """Split every MoE layer of ``model`` (an nn.SwitchTransformer or an nn.TransformerBlock whose mlp is an
    nn.MoE; the same on every rank, possibly tensor-parallel already) over ``group``; returns it."""
    if isinstance(model, GPT):
        blocks = model.blocks
    elif isinstance(model, TransformerBlock):
        blocks = [model]
    else:
        raise TypeError(f"expert_parallel splits an nn.SwitchTransformer or an nn.TransformerBlock, got "
                        f"{type(model).__name__}")
    if not any(isinstance(block.mlp, MoE) for block in blocks):
        raise ValueError("expert_parallel needs a model with MoE layers (an nn.SwitchTransformer); a dense "
                         "GPT has no experts to spread")
    for block in blocks:
        if isinstance(block.mlp, MoE):
            block.mlp = ExpertParallelMoE(group, block.mlp)
    experts = {id(p) for block in blocks if isinstance(block.mlp, ExpertParallelMoE)
               for p in block.mlp.expert_parameters()}
    model.label_parameters()                 # names for the optimizers' refusal of a partial gradient
    for p in model.parameters():
        if id(p) not in experts:
            p.partial_over.append(group)     # replicated, but fed this rank's rows only
    return model

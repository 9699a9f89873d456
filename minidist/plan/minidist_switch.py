"""The planner's minidist mode for a Switch Transformer on a mesh with an expert axis (parallelize).

A Switch block on rank (tensor q of t, context k of c, expert j of e) holds the attention split over t,
both LayerNorms and the router (d·E, whole), and E/e of the E experts, each Megatron-split over t. What it
costs follows the code the cluster runs (parallel/expert/expert_parallel.py, compose/split_model.py,
parallel/expert/transform.py).

Routing decides how many rows cross the all-to-alls and reach each expert; it can be known without running
only when it does not depend on the data. So the check routes every token to every expert: top-k with
k = E and capacity factor E (C = ceil(E·n/E) = n slots, nothing dropped). Each expert then receives
exactly the n = b·T/c tokens of each of the e ranks of its group: R = e·n rows per local expert, E·n per
rank. (Top-1 routing's loads depend on the tokens: this module refuses k < E.) Per block and micro-batch:

    compute     attention's FLOPs / t (the split block's flops) + the experts': 2·(E·n)·(2·d·f/t) forward,
                twice that backward (ExpertParallelMoE._charge); the router and the norms are not charged
    all-to-all  collectives.alltoall: e − 1 rounds, each one sendrecv per rank (α + β·bytes); forward the
                counts (E/e int64 to each peer), the dispatch and the combine (n·E/e rows of d each),
                backward the two token all-to-alls again
    tensor      attention's g forward and f backward (n·d words), and per local expert its MegatronMLP's
                g forward and f backward (R·d words): pairwise all-reduces over t
    context     ring attention as the dense block's
    step end    the partial sums: one pairwise all-reduce of every parameter on this rank over the context
                group, one of the replicated parameters (all but the experts) over the expert group; then
                the data group's all-reduce as for a GPT
    activations per block (itemsize i): the norms and the attention as a tensor_parallel block keeps them
                (tensor/transformer_cost.py), the router's input n·d·i, the counts 2·8·E, the combined
                outputs E·n·d·i, and per local expert (R·d + 3·R·f/t)·i (its input, GELU's input and cdf,
                the second Linear's input); the Routing record is no array the ledger counts
"""

from __future__ import annotations

from minidist.cluster import Device, LinkModel
from minidist.parallel.tensor.transformer_cost import block_activation_bytes
from minidist.sim.collective_cost import collective_seconds

from .minidist_clock import ring_attention_seconds
from .model import ModelSpec


def check_switch(spec: ModelSpec, expert: int) -> None:
    """Refuse what this module cannot price exactly (module docstring)."""
    if not spec.moe or spec.top_k != spec.experts:
        raise ValueError(f"minidist mode prices a Switch model whose routing is known without running: "
                         f"top_k = experts (every token to every expert), got experts = {spec.experts}, "
                         f"top_k = {spec.top_k}")
    if spec.experts % expert:
        raise ValueError(f"expert = {expert} must divide experts = {spec.experts}")


def switch_block_params(spec: ModelSpec, tensor: int, expert: int) -> int:
    """Parameters of one Switch block on a rank: attention (4d² + 3d)/t + d (proj bias whole), the norms
    4d, the router d·E, and E/e experts of (2df + f)/t + d (the second bias whole)."""
    d, f, big_e = spec.d_model, spec.ff, spec.experts
    experts = big_e // expert * ((2 * d * f + f) // tensor + d)
    return (4 * d * d + 3 * d) // tensor + 5 * d + d * big_e + experts


def switch_block_arrays(spec: ModelSpec, expert: int) -> int:
    """Parameter arrays of one Switch block on a rank: 8 of attention and norms, the router, 4 per expert."""
    return 9 + 4 * (spec.experts // expert)


def switch_replicated_params(spec: ModelSpec, tensor: int, expert: int) -> int:
    """Of switch_block_params, those summed over the expert group (partial_over: all but the experts)."""
    d, f, big_e = spec.d_model, spec.ff, spec.experts
    return switch_block_params(spec, tensor, expert) - big_e // expert * ((2 * d * f + f) // tensor + d)


def switch_block_activation_bytes(spec: ModelSpec, micro_batch: int, tensor: int, expert: int,
                                  itemsize: int = 8, context: int = 1) -> int:
    """Bytes one Switch block keeps for backward after one micro-batch's forward (module docstring)."""
    b, T, d, i, big_e = micro_batch, spec.seq // context, spec.d_model, itemsize, spec.experts
    n = b * T
    dense = block_activation_bytes(b, T, d, spec.heads, spec.ff, tensor, 0, i, False)
    attention = dense["layernorm"] + dense["attention"] - (T * T if context > 1 else 0)  # ring: no mask
    experts = big_e * n * (d + 3 * spec.ff // tensor) * i        # E/e experts of R = e·n rows
    return attention + n * d * i + 2 * 8 * big_e + big_e * n * d * i + experts


def alltoall_seconds(nbytes: int, parts: int, link: LinkModel) -> float:
    """collectives.alltoall, ``nbytes`` to each peer: round s, rank r sends to r + s (parts − 1 rounds)."""
    return collective_seconds("alltoall", parts, parts * nbytes, 1, link)


def switch_block_seconds(spec: ModelSpec, block, micro_batch: int, tensor: int, expert: int, context: int,
                         device: Device, link: LinkModel, itemsize: int = 8) -> tuple[float, float]:
    """(forward, backward) seconds of one Switch block (``block``: the SwitchTransformer's, whole) on
    one micro-batch of b sequences (module docstring)."""
    b, T, d, big_e = micro_batch, spec.seq // context, spec.d_model, spec.experts
    n, local = b * T, big_e // expert
    attention = block.attn.flops((b, T, d)) // tensor / device.flops
    experts = 2 * big_e * n * (2 * d * spec.ff // tensor) / device.flops
    tokens = alltoall_seconds(n * local * d * itemsize, expert, link)
    reduces = collective_seconds("pairwise", tensor, n * d, itemsize, link) + \
        local * collective_seconds("pairwise", tensor, expert * n * d, itemsize, link)
    forward = attention + experts + alltoall_seconds(8 * local, expert, link) + 2 * tokens + reduces
    backward = 2 * attention + 2 * experts + 2 * tokens + reduces
    if context > 1:
        ring = ring_attention_seconds(b, spec.seq, spec.heads // tensor, d // spec.heads, context,
                                      device.flops, link)
        forward, backward = forward + ring[0], backward + ring[1]
    return forward, backward

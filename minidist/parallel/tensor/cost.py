"""How many words model, data and hybrid parallelism move per training step, and memory per device.

The "Distributed Deep Learning (Part II)" slides ("Model vs Data Parallelism?") give, for an
MLP whose layer i has width d_i, batch B, P processes and inverse bandwidth β:

    T_comm(model) = Σ_{i=1..L} β(P−1)·B·d_i/P  +  2·Σ_{i=2..L} β(P−1)·B·d_i/P
                    └─ all-gather of outputs ─┘    └─ all-reduce of input gradients ─┘
    T_comm(data)  = Σ_{i=1..L} β(P−1)·d_i²/P

``seed_t_comm_model`` and ``seed_t_comm_data`` are these formulas. The ``*_words`` functions count what
the code sends (the ledger's numbers) as words summed over all P ranks, exact for any split: a ring
all-gather moves every piece P−1 hops, an all-reduce every chunk P−1 hops twice. For L square d×d layers
without biases, P dividing d and B, one rank's share is T_comm(model)/β; data parallelism's 2·T_comm(data)/β
(the factor 2 of the slides' own T_comm(batch), dropped on their comparison slide).

``widths = [d_0, d_1, ..., d_L]``: layer i maps d_{i−1} → d_i. The slides' ∇X term for layer i is the
gradient of that layer's input, of width d_{i−1} (equal to d_i for square layers).
"""

from __future__ import annotations

from collections.abc import Sequence

from minidist.nn.checks import is_count


def _check(widths: Sequence[int], batch: int, parts: int) -> list[int]:
    if len(widths) < 2 or not all(is_count(d) for d in [*widths, batch, parts]):
        raise ValueError(f"widths must be [d_0, ..., d_L] (L >= 1); widths, batch and P integers >= 1, got "
                         f"{widths}, batch={batch}, P={parts}")
    return [int(d) for d in widths]


def seed_t_comm_model(widths: Sequence[int], batch: int, parts: int, beta: float = 1.0) -> float:
    """The slides' T_comm(model) for layers of output widths d_1..d_L (β = 1: words per rank)."""
    d = _check(widths, batch, parts)[1:]
    gather = sum(beta * (parts - 1) * batch * di / parts for di in d)
    reduce = 2 * sum(beta * (parts - 1) * batch * di / parts for di in d[1:])
    return gather + reduce


def seed_t_comm_data(widths: Sequence[int], parts: int, beta: float = 1.0) -> float:
    """The slides' T_comm(data) = Σ β(P−1)·d_i²/P over the layers' output widths d_1..d_L."""
    d = _check(widths, 1, parts)[1:]
    return sum(beta * (parts - 1) * di * di / parts for di in d)


def column_parallel_words(widths: Sequence[int], batch: int, parts: int, input_grad: bool = False) -> int:
    """Words sent per step, summed over ranks, by ``column_parallel_mlp`` (the slides' scheme). Forward:
    all-gather of each layer's output, (P−1)·B·d_i. Backward: ring all-reduce of each layer's input
    gradient, 2(P−1)·B·d_{i−1}, for layers 2..L (and layer 1 too when input_grad).
    """
    d = _check(widths, batch, parts)
    gather = sum((parts - 1) * batch * di for di in d[1:])
    first = 1 if input_grad else 2
    reduce = sum(2 * (parts - 1) * batch * d[i - 1] for i in range(first, len(d)))
    return gather + reduce


def megatron_words(widths: Sequence[int], batch: int, parts: int, input_grad: bool = False) -> int:
    """Words sent per step, summed over ranks, by ``megatron_parallel_mlp``: the layers pair into blocks
    (d_{2k} → d_{2k+1} → d_{2k+2}); per block a forward all-reduce of its output, 2(P−1)·B·d_{2k+2}, and a
    backward all-reduce of its input gradient, 2(P−1)·B·d_{2k}, except the first block's (unless input_grad).
    """
    d = _check(widths, batch, parts)
    if (len(d) - 1) % 2:
        raise ValueError("a Megatron MLP pairs its layers, so it needs an even number of layers; "
                         f"got widths {d}")
    total = 0
    for k in range(0, len(d) - 1, 2):
        total += 2 * (parts - 1) * batch * d[k + 2]
        if k > 0 or input_grad:
            total += 2 * (parts - 1) * batch * d[k]
    return total


def data_parallel_words(num_parameters: int, parts: int) -> int:
    """Words sent per step, summed over ranks, by a ring all-reduce of every gradient: 2(P−1)·|W|."""
    return 2 * (parts - 1) * int(num_parameters)


def hybrid_words(model_words_at_full_batch: int, shard_parameters: Sequence[int], data_parallel: int) -> int:
    """Words per step, summed over all D·M ranks, of the hybrid on a D × M grid.

    Model-parallel part: each of the D groups runs the model-parallel scheme on its share B_j of the batch;
    the words are linear in B, so the D groups together move what one group would at the full batch B:
    pass ``*_words(widths, B, M)``. Data-parallel part: the M data groups each all-reduce one rank's shard
    of the gradients (shard_parameters[p] words for model rank p): Σ_p 2(D−1)·|shard_p|.
    """
    return int(model_words_at_full_batch) + sum(data_parallel_words(n, data_parallel)
                                                for n in shard_parameters)


def memory_words_per_device(widths: Sequence[int], batch: int, data: int, tensor: int,
                            optimizer_states: int = 0) -> dict[str, float]:
    """Words one device holds, for the slides' column scheme on a mesh of data = D × tensor = T ranks
    (D = P, T = 1 is data parallelism): weights Σ d_{i−1}·d_i / T, gradients the same, optimizer
    optimizer_states × weights (0 SGD, 1 momentum, 2 Adam), activations (B/D)·Σ d_i (every layer's whole
    input and output, kept for backward)."""
    d = _check(widths, batch, data * tensor)
    weights = sum(d[i - 1] * d[i] for i in range(1, len(d))) / tensor
    activations = batch / data * sum(d)
    memory = {"weights": weights, "gradients": weights, "optimizer": optimizer_states * weights,
              "activations": activations}
    memory["total"] = sum(memory.values())
    return memory

"""ZeRO-3 in the planner's minidist mode: the bytes a rank sends over its data group in one step of
``parallelize(..., zero=3)`` (minidist/parallel/data/zero_sync.py: FSDP, one unit's parameters a group).

Rank r of the D data ranks holds piece r of each unit's n_u parameters (np.array_split's pieces, s_u =
split_sizes(n_u, D)[r]). Each micro-batch's forward of a unit gathers them (collectives.allgather, pairwise:
r sends its piece to each of the D − 1 others) and its backward gathers them again; the unit's gradient,
summed over the step's M micro-batches, is reduce-scattered once (pairwise: r sends every piece but its own):

    bytes_r = itemsize · Σ_u (2·M·(D − 1)·s_u + n_u − s_u)

With M = 1 and pieces of Ψ/D that is 3·(D − 1)/D·Ψ·itemsize, the ZeRO paper's 3Ψ (predict.data_bytes: 1.5×
ZeRO-1's 2Ψ); every further micro-batch gathers the weights twice more. The units are a tensor rank's
(minidist_mode.unit_params). parallelize refuses ZeRO-2/3 with a pipeline axis, so there is no pipeline here.
"""

from __future__ import annotations

from minidist.collectives.pieces import split_sizes

from .minidist_mode import unit_params
from .model import ModelSpec


def zero3_data_bytes(spec: ModelSpec, data: int, rank: int, micro_batches: int = 1, tensor: int = 1,
                     itemsize: int = 8) -> int:
    """Bytes rank ``rank`` of ``data`` ranks sends over the data group in one ZeRO-3 step of spec's GPT
    (dense: a Switch model's units are not priced here), M = micro_batches, its units split over
    ``tensor`` ranks, parameters of ``itemsize`` bytes (module docstring)."""
    if spec.moe:
        raise ValueError(f"ZeRO-3's bytes are priced for a dense GPT, got {spec.experts} experts")
    for name, value in (("data", data), ("micro_batches", micro_batches), ("itemsize", itemsize)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < data:
        raise ValueError(f"rank must be an integer in [0, {data}), got {rank!r}")
    total = 0
    for n in unit_params(spec, tensor):
        if n:
            mine = split_sizes(n, data)[rank]
            total += 2 * micro_batches * (data - 1) * mine + n - mine
    return itemsize * total

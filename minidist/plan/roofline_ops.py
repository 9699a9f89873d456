"""A training step priced operation by operation on a GPU's achieved roofs (gpus.py): why a step takes
longer than its FLOPs at peak.

Every op has FLOPs and bytes moved to and from HBM; its time is the larger of FLOPs / achieved FLOP/s and
bytes / achieved bandwidth (Williams et al., "Roofline", 2008), so each op says which roof binds it.

    matmul   C (m × n) = A (m × k) · B (k × n) in BF16, as NVIDIA's "Matrix Multiplication Background
             User's Guide" describes cuBLAS: output tiles of 256 × 128, 128 × 256 or 128 × 128 (the fastest
             of the three); tile quantization (a partial tile costs a whole one), wave quantization (the
             tiles run in waves of one per SM; the last wave's idle SMs cost); fewer tiles than SMs split
             the k loop over SMs (split-K, CUTLASS's "Efficient GEMM in CUDA": "partitioning the reduction
             dimension K across threadblocks" when M·N is small; here in pieces of >= 1024). The
             operands stream in under the math (roofline: max), the result is stored after the tile's
             last k-step (epilogue: + 2mn / bandwidth). ``mainloop`` is the rate that makes this model give
             the measured 8192³ figure exactly. Forward y = x·W, dX = dy·Wᵀ, dW = xᵀ·dy: three matmuls
    attention FlashAttention-2 at its measured speed (gpus.py), its I/O: q, k, v, o (forward); q, k, v,
             o, do read, dq (FP32 accumulator), dk, dv written (backward). ``attention="eager"`` (no
             FlashAttention: PyTorch's math path, Megatron-LM before 2022): QKᵀ and PV as batched matmuls
             over the full s × s scores (the mask saves nothing) at the matmul rate, then the scores in HBM:
             per score 13 bytes forward (QKᵀ writes 2, the fused scale-mask-softmax reads and writes 4,
             dropout 5 with its mask, PV reads 2), 19 backward (dP 2, P for dV 2, dropout 5, softmax 6,
             dS read twice 4)
    elementwise  by bytes: the residual stream in FP32 (4d bytes a token), what a matmul reads or writes
             in BF16 (2d; 2f for the MLP's hidden), under PyTorch autocast with bias-free-of-charge
             matmuls (bias in cuBLAS's epilogue). ``fused`` (torch.compile) joins each residual add with
             the next LayerNorm and its cast, bias with GELU, and a LayerNorm's backward with the residual
             gradient's sum; ``eager`` runs each as its own kernel, each reading and writing HBM
    head     the logits matmuls and cross-entropy over b·T × V logits: fused reads them twice forward
             (max, sum of exponentials), once backward and writes their gradient (8 bytes a logit); eager
             casts them to FP32, log-softmax, a dense FP32 gradient, its backward, the cast back (36 bytes)
    embeddings  gathers of token and position rows (FP32), backward a scatter-add into a zeroed V × d
             FP32 gradient
    optimizer   the gradients' accumulation over M micro-batches (each after the first adds into the held
             gradients: read both, write one; PyTorch's .grad and Megatron-LM's main_grad do the same),
             fused AdamW over FP32 weights: reads weight, gradient, m, v, writes weight, m, v (28 bytes
             a parameter, per step). The casts as the modelled run does them: 16-bit weights beside FP32
             masters (Megatron, weights "bf16") cast once per step after the update (read 4, write 2: 6
             bytes a parameter of the rank's shard); PyTorch autocast over FP32 parameters (weights
             "autocast") casts each weight to BF16 at every micro-batch's forward and its gradient back
             to FP32 (12 bytes a parameter, per micro-batch): its parameters are FP32, so it must
             cast them again for every micro-batch
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache, lru_cache

from .gpus import GPU
from .model import ModelSpec

TILES = ((256, 128), (128, 256), (128, 128))
SPLIT_K = 1024
LAUNCH = 1e-6   # s between back-to-back kernels of one stream (Gray 2019, "Getting Started with CUDA Graphs")


@dataclass(frozen=True)
class Op:
    """One kernel: its name, FLOPs, HBM bytes, seconds and the roof that binds it."""

    name: str
    flops: float
    nbytes: float
    seconds: float
    roof: str


def quantization(gpu: GPU, m: int, n: int, k: int, tile: tuple[int, int]) -> float:
    """Useful share of the SMs' work: m·n over the tiles' area (tile quantization) times the work units
    over whole waves of SMs (wave quantization); fewer tiles than SMs split k into whole pieces
    (split-K, at least SPLIT_K deep each), one unit per tile and piece."""
    tm, tn = tile
    tiles = math.ceil(m / tm) * math.ceil(n / tn)
    pieces = max(1, min(gpu.sms // tiles, k // SPLIT_K)) if tiles < gpu.sms else 1
    units = tiles * pieces
    return (m * n) / (tiles * tm * tn) * units / (math.ceil(units / gpu.sms) * gpu.sms)


@cache
def mainloop(gpu: GPU) -> float:
    """The math rate for which matmul(8192, 8192, 8192) takes what was measured (gpu.matmul)."""
    n = 8192
    flops, store = 2 * n ** 3, 2 * n * n / gpu.copy
    q = max(quantization(gpu, n, n, n, tile) for tile in TILES)
    return flops / (q * (flops / gpu.matmul - store))


def matmul(gpu: GPU, name: str, m: int, n: int, k: int) -> Op:
    """C (m × n) = A (m × k) · B (k × n), BF16: max(math, operand stream) + the result's store."""
    flops, operands, result = 2 * m * n * k, 2 * (m * k + k * n), 2 * m * n
    rate = mainloop(gpu)
    best = min(((flops / (rate * quantization(gpu, m, n, k, t)), operands / gpu.copy) for t in TILES),
               key=lambda pair: max(pair))
    seconds = max(best) + result / gpu.copy + LAUNCH
    return Op(name, flops, operands + result, seconds, "compute" if best[0] >= best[1] else "memory")


def by_bytes(gpu: GPU, name: str, nbytes: float, flops: float = 0.0, kernels: int = 1) -> Op:
    """A memory-bound pass of ``kernels`` kernels moving nbytes."""
    return Op(name, flops, nbytes, nbytes / gpu.copy + kernels * LAUNCH, "memory")


def attention(gpu: GPU, batch: int, seq: int, heads: int, head_dim: int, queries: int,
              kernel: str = "flash") -> list[Op]:
    """Causal FlashAttention-2 (or eager attention) of ``heads`` heads over sequences of seq, for
    ``queries`` of them per sequence (seq / cp with context parallelism): forward and backward."""
    forward = 4 * batch * heads * seq * queries * head_dim / 2
    tensor = 2 * batch * queries * heads * head_dim                      # one of q, k, v, o in BF16
    if kernel == "eager":
        scores = batch * heads * queries * seq
        return [Op(label, 2 * k * forward, per * scores + 4 * tensor, 2 * k * forward / gpu.matmul
                   + (per * scores + 4 * tensor) / gpu.copy + 4 * LAUNCH, "memory")
                for label, k, per in (("attention (eager) fwd", 1, 13), ("attention (eager) bwd", 2, 19))]
    ops = []
    for label, flops, nbytes, backward in (("attention fwd", forward, 4 * tensor, False),
                                           ("attention bwd", 2.5 * forward, 8 * tensor + 4 * tensor, True)):
        compute, memory = flops / gpu.attention_rate(seq, backward), nbytes / gpu.copy
        roof = "attention" if compute >= memory else "memory"
        ops.append(Op(label, flops, nbytes, max(compute, memory) + LAUNCH, roof))
    return ops


# Elementwise bytes per token, as (name, bytes forward, bytes backward, over the whole width d) in terms of
# d and f (module doc); the whole-width ones (LayerNorms, residual adds, the row-parallel outputs' bias
# gradients) are what sequence parallelism splits over the tensor ranks, the rest is split by heads or f.
def elementwise(d: int, f: int, fused: bool) -> list[tuple[str, float, float, bool]]:
    if fused:
        return [("add+layernorm x2", 2 * 12 * d, 2 * 22 * d, True), ("bias+gelu", 4 * f, 6 * f, False),
                ("qkv grad concat", 0, 12 * d, False), ("bias grads", 0, 6 * d, False),
                ("bias grads (proj, fc2)", 0, 4 * d, True)]
    return [("layernorm x2", 2 * 8 * d, 2 * 20 * d, True), ("cast to bf16 x2", 2 * 6 * d, 2 * 6 * d, True),
            ("attention transpose", 4 * d, 4 * d, False),
            ("residual add x2", 2 * 10 * d, 2 * (6 + 12) * d, True),
            ("gelu", 4 * f, 6 * f, False), ("qkv grad concat", 0, 12 * d, False),
            ("bias grads", 0, 6 * d + 2 * f, False), ("bias grads (proj, fc2)", 0, 4 * d, True)]


@lru_cache(maxsize=4096)   # the planner asks again for every layout of the same shapes
def layer_ops(model: ModelSpec, gpu: GPU, micro_batch: int, tp: int = 1, cp: int = 1,
              fused: bool = True, attention_kernel: str = "flash", sequence_parallel: bool = True
              ) -> tuple[Op, ...]:
    """One transformer block, forward and backward, on one rank: micro_batch sequences, its tp share of
    heads and widths (and of the whole-width elementwise tokens with sequence parallelism; without it every
    tensor rank runs those on all its tokens), its cp share of the tokens."""
    d, f, s = model.d_model, model.ff, model.seq // cp
    tokens = micro_batch * s
    routed = tokens * (model.top_k if model.moe else 1)        # rows through the MLPs (k experts a token)
    ops = []
    for name, n, k, rows in (("qkv", 3 * d // tp, d, tokens), ("proj", d, d // tp, tokens),
                             ("fc1", f // tp, d, routed), ("fc2", d, f // tp, routed)):
        ops += [matmul(gpu, f"{name} fwd", rows, n, k), matmul(gpu, f"{name} dX", rows, k, n),
                matmul(gpu, f"{name} dW", k, n, rows)]
    ops += attention(gpu, micro_batch, model.seq, model.heads // tp, d // model.heads, s, attention_kernel)
    for name, forward, backward, whole in elementwise(d, f * (model.top_k if model.moe else 1), fused):
        share = 1 if whole and not sequence_parallel else tp
        if forward:
            ops.append(by_bytes(gpu, f"{name} fwd", forward * tokens / share))
        ops.append(by_bytes(gpu, f"{name} bwd", backward * tokens / share))
    return tuple(ops)


@lru_cache(maxsize=4096)
def head_ops(model: ModelSpec, gpu: GPU, micro_batch: int, tp: int = 1, cp: int = 1,
             fused: bool = True) -> tuple[Op, ...]:
    """The final LayerNorm, the logits' matmuls and cross-entropy over the vocabulary (tp splits V)."""
    d, V, tokens = model.d_model, model.vocab // tp, micro_batch * model.seq // cp
    norm = (12 * d, 22 * d) if fused else (24 * d, 44 * d)
    return (by_bytes(gpu, "final layernorm fwd", norm[0] * tokens / tp),
            by_bytes(gpu, "final layernorm bwd", norm[1] * tokens / tp),
            matmul(gpu, "logits fwd", tokens, V, d), matmul(gpu, "logits dX", tokens, d, V),
            matmul(gpu, "logits dW", d, V, tokens),
            by_bytes(gpu, "cross-entropy", (8 if fused else 36) * tokens * V, 5 * tokens * V))


@lru_cache(maxsize=4096)
def embedding_ops(model: ModelSpec, gpu: GPU, micro_batch: int, cp: int = 1,
                  fused: bool = True) -> tuple[Op, ...]:
    """Token and position gathers (FP32 rows) and their backward scatter-add into a zeroed V × d gradient."""
    d, tokens = model.d_model, micro_batch * model.seq // cp
    return (by_bytes(gpu, "embedding gathers", (12 if fused else 28) * d * tokens),
            by_bytes(gpu, "embedding grads", 12 * d * tokens + 4 * model.vocab * d))


def optimizer_ops(gpu: GPU, params: float, sharded_params: float, micro_batches: int,
                  weights: str = "bf16") -> tuple[Op, ...]:
    """The gradients' accumulation: each micro-batch after the first adds its weight gradients of all
    ``params`` into those held (read both, write one: 6 bytes each at 16 bits with weights "bf16", 12 in
    FP32 under autocast); fused AdamW over ``sharded_params`` (28 bytes each); the casts: of the shard once
    per step (weights "bf16", 6 bytes each) or of all ``params`` per micro-batch (weights "autocast", 12
    bytes each)."""
    casts = 6 * sharded_params if weights == "bf16" else 12 * params * micro_batches
    width, adds = (2 if weights == "bf16" else 4), params * (micro_batches - 1)
    return (by_bytes(gpu, "gradient accumulation", 3 * width * adds, adds, kernels=int(micro_batches > 1)),
            by_bytes(gpu, "weight casts", casts),
            by_bytes(gpu, "adamw (fused)", 28 * sharded_params, 18 * sharded_params))


def seconds(ops) -> float:
    return sum(op.seconds for op in ops)

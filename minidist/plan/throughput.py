"""What a predicted step gives a reader to compare with a paper: tokens/s per GPU, model FLOP/s per GPU, MFU.

Model FLOPs are Narayanan et al. 2021's count ("Efficient Large-Scale Language Model Training on GPU
Clusters Using Megatron-LM", section 5.1) for a GPT of l layers, width h, sequence s, vocabulary V, batch
B, its MLP 4h wide: with full recomputation (four passes over each layer: the paper's Table 1)

    F = 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h))

and without it (three passes: the model FLOPs that MFU counts) F' = 72·B·s·l·h²·(1 + s/(6h) + V/(12·l·h)).
tflops_per_gpu is F' / (step · devices), tflops_per_gpu_recompute F / (step · devices), whatever the layout
recomputes; mfu = tflops_per_gpu / the data sheet's peak.
"""

from __future__ import annotations

from .model import ModelSpec


def narayanan_flops(model: ModelSpec, recompute: bool = True) -> float:
    """Narayanan's FLOPs per step: with full recomputation (96 ...) or without (72 ...)."""
    B, s, l, h, V = model.batch, model.seq, model.layers, model.d_model, model.vocab
    if recompute:
        return 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
    return 72 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h))


def throughput(model: ModelSpec, step_s: float, devices: int, peak: float) -> dict[str, float]:
    """tokens_per_s_per_gpu, tflops_per_gpu (without recomputation), tflops_per_gpu_recompute, mfu."""
    model_flops = narayanan_flops(model, recompute=False) / (step_s * devices)
    return {"tokens_per_s_per_gpu": model.batch * model.seq / (step_s * devices),
            "tflops_per_gpu": model_flops / 1e12,
            "tflops_per_gpu_recompute": narayanan_flops(model) / (step_s * devices) / 1e12,
            "mfu": model_flops / peak}

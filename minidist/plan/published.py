"""Numbers published for real training runs, to print beside the planner's predictions (lesson 19).

Each entry names its source by title and keeps only what the source states; what is derived says so.

    Llama 2      Touvron et al. 2023, "Llama 2: Open Foundation and Fine-Tuned Chat Models": 7B and 70B
                 pretrained on 2.0T tokens, 4k context, a global batch of 4M tokens (Table 1), on NVIDIA
                 A100-80GB, 184,320 and 1,720,320 GPU hours (section 2.2.1). The parallel layout is not
                 reported. Derived: tokens per second per GPU = tokens / (GPU hours · 3600), and model FLOPs
                 utilisation 6·N·tokens / (GPU hours · 3600 · 312 TFLOP/s), N the nominal 7e9 / 70e9
                 (6N: Kaplan et al.; 312 TFLOP/s: the A100's dense BF16 peak)
    LLaMA        Touvron et al. 2023, "LLaMA: Open and Efficient Foundation Language Models" (section 2.4):
                 "When training a 65B-parameter model, our code processes around 380 tokens/sec/GPU on 2048
                 A100 GPU with 80GB of RAM"; 1.4T tokens, 2048-token context, batch of 4M tokens (Table 2)
    NeMo         NVIDIA NeMo Framework 24.09 documentation, "Performance Summary for Large Language Models"
                 (pre-training at FP8): LLAMA2-7B on 8 GPUs (TP 1, PP 1), LLAMA2-70B on 64 GPUs (TP 4,
                 PP 4, virtual pipeline 20), a global batch of 128 sequences of 4096, micro-batch 1; tokens
                 and model TFLOP/s per GPU. The table names neither the GPU, nor the optimizer sharding, nor
                 the recomputation
    Megatron-LM  Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using
                 Megatron-LM" (abstract): a 1T-parameter GPT on 3072 A100 GPUs at 502 petaFLOP/s, 52% of
                 peak per GPU. The Megatron-LM README's table (measured as in Korthikanti et al. 2022,
                 "Reducing Activation Recomputation in Large Transformer Models"; data parallel size 1):
                 model FLOPs utilisation 41.5% (22B), 51.4% (175B), 56.0% (530B), 56.3% (1T)

    Megatron-LM Table 1 (MEGATRON_TABLE1): ten GPT runs on Selene (DGX A100 80GB), V = 51200, s = 2048,
                 TFLOP/s per GPU counted with full recomputation (96·B·s·l·h²(...), throughput.py). The rows
                 1.7B, 18.4B and 145.6B as minidist issue 54 quotes the paper; the other seven transcribed
                 from arXiv 2104.04473's Table 1 and re-checked against two public text transcriptions of that
                 table (reading notes on GitHub, not the paper's own text): GPUs, t, p, batch and TFLOP/s per
                 GPU agree in all ten rows, as do their percentages of peak and aggregate petaFLOP/s

Left out: the Ultra-Scale Playbook's memory-calculator results (not found in a text source).
"""

from __future__ import annotations

from dataclasses import dataclass

A100_BF16_PEAK = 312e12      # dense FLOP/s (the vendor's data sheet; report.PRESETS uses the same)

LLAMA2 = "Touvron et al. 2023, \"Llama 2: Open Foundation and Fine-Tuned Chat Models\""
LLAMA1 = "Touvron et al. 2023, \"LLaMA: Open and Efficient Foundation Language Models\""
NEMO = "NVIDIA NeMo Framework 24.09, \"Performance Summary for Large Language Models\""
MEGATRON = "Narayanan et al. 2021, \"Efficient Large-Scale Language Model Training on GPU Clusters Using " \
           "Megatron-LM\""
MEGATRON_README = "Megatron-LM README (Korthikanti et al. 2022, \"Reducing Activation Recomputation in " \
                  "Large Transformer Models\")"


@dataclass(frozen=True)
class TrainingRun:
    """A published pre-training run: what the source states (None: not stated)."""

    source: str
    model: str
    parameters: float                     # nominal
    gpu: str | None
    tokens: float | None = None           # trained on
    gpu_hours: float | None = None
    seq: int | None = None
    batch_sequences: int | None = None
    gpus: int | None = None
    tp: int | None = None
    pp: int | None = None
    virtual_stages: int | None = None
    tokens_per_gpu_second: float | None = None
    model_tflops_per_gpu: float | None = None
    mfu: float | None = None              # as the source states it

    def derived_tokens_per_gpu_second(self) -> float:
        """Stated, or tokens / (GPU hours · 3600)."""
        if self.tokens_per_gpu_second is not None:
            return self.tokens_per_gpu_second
        self._need("tokens per GPU-second")
        return self.tokens / (self.gpu_hours * 3600)

    def derived_mfu(self, peak: float = A100_BF16_PEAK) -> float:
        """Stated, or 6·N·tokens / (GPU hours · 3600 · peak)."""
        if self.mfu is not None:
            return self.mfu
        self._need("model FLOPs utilisation")
        return 6 * self.parameters * self.tokens / (self.gpu_hours * 3600 * peak)


    def _need(self, what: str) -> None:
        if self.tokens is None or self.gpu_hours is None:
            raise ValueError(f"{self.model} ({self.source}): the source states neither {what} nor the "
                             "tokens and GPU hours to derive it from")


RUNS = {
    "llama2-7b": TrainingRun(LLAMA2, "Llama 2 7B", 7e9, "A100-80GB", tokens=2.0e12, gpu_hours=184_320,
                             seq=4096, batch_sequences=1024),
    "llama2-70b": TrainingRun(LLAMA2, "Llama 2 70B", 70e9, "A100-80GB", tokens=2.0e12, gpu_hours=1_720_320,
                              seq=4096, batch_sequences=1024),
    "llama-65b": TrainingRun(LLAMA1, "LLaMA 65B", 65e9, "A100-80GB", tokens=1.4e12, seq=2048,
                             batch_sequences=2048, gpus=2048, tokens_per_gpu_second=380),
    "nemo-llama2-7b": TrainingRun(NEMO, "LLAMA2-7B", 7e9, None, seq=4096, batch_sequences=128, gpus=8, tp=1,
                                  pp=1, tokens_per_gpu_second=16934, model_tflops_per_gpu=780),
    "nemo-llama2-70b": TrainingRun(NEMO, "LLAMA2-70B", 70e9, None, seq=4096, batch_sequences=128, gpus=64,
                                   tp=4, pp=4, virtual_stages=20, tokens_per_gpu_second=1728,
                                   model_tflops_per_gpu=768),
    "megatron-1t": TrainingRun(MEGATRON, "GPT 1T", 1e12, "A100", gpus=3072,     # TFLOP/s: 502 PFLOP/s / 3072
                               model_tflops_per_gpu=502e15 / 3072 / 1e12, mfu=0.52),
}

# model FLOPs utilisation by model size, data parallel size 1 (MEGATRON_README)
MEGATRON_MFU = {"22B": 0.415, "175B": 0.514, "530B": 0.560, "1T": 0.563}

# Narayanan et al. 2021, Table 1: (billions of parameters, heads, hidden h, layers l, tensor t, pipeline p,
# GPUs, batch B, TFLOP/s per GPU)
MEGATRON_TABLE1 = ((1.7, 24, 2304, 24, 1, 1, 32, 512, 137), (3.6, 32, 3072, 30, 2, 1, 64, 512, 138),
                   (7.5, 32, 4096, 36, 4, 1, 128, 512, 142), (18.4, 48, 6144, 40, 8, 1, 256, 1024, 135),
                   (39.1, 64, 8192, 48, 8, 2, 512, 1536, 138), (76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140),
                   (145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148),
                   (310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155),
                   (529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163),
                   (1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163))

"""Time GPT training steps on a CUDA GPU with PyTorch and print them beside the planner's predictions.

    PYTHONPATH=. python benchmarks/planner_gpu.py [--shapes all|issue] [--steps 10] [--warmup 3]

Exactly as issue 44 measured (benchmarks/planner_gpu.md): bf16 autocast, scaled_dot_product_attention
(is_causal=True), fused AdamW, learned position embeddings, a GELU MLP of 4d, untied head, one
micro-batch of B sequences, the mean of ``steps`` steps after ``warmup`` warm-ups (torch.cuda.synchronize
around them), eager and torch.compile. The prediction: ``python -m minidist plan ... --devices 1
--hardware h100 --micro-batch B`` (``--eager`` for the eager column), whose H100 figures are only right
on an H100. Each run also records its peak memory (torch.cuda.max_memory_allocated over the timed steps,
reset after the warm-ups) beside the planner's peak (plan/memory.py, weights "autocast": this model's FP32
parameters under autocast). ``--shapes all`` adds shapes the planner was not tuned on (other L, d, T, B,
V). Without CUDA (or without torch) it prints why and exits 0.
"""

from __future__ import annotations

import argparse
import sys
import time

from minidist.plan import Layout, ModelSpec, hardware, predict_memory
from minidist.plan.predict import predict_time

# (layers, d_model, heads, seq, batch, vocab); the first two are the issue's table
ISSUE = [(12, 768, 12, 1024, 16, 50304), (24, 1024, 16, 1024, 8, 50304)]
MORE = [(12, 768, 12, 2048, 8, 50304), (12, 768, 12, 512, 32, 50304), (12, 1536, 12, 1024, 8, 50304),
        (12, 768, 12, 1024, 16, 32000), (6, 768, 12, 1024, 32, 50304), (24, 2048, 16, 1024, 4, 50304)]


def gpt(torch, L: int, d: int, heads: int, T: int, V: int):
    tnn, F = torch.nn, torch.nn.functional

    class Block(tnn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = tnn.LayerNorm(d), tnn.LayerNorm(d)
            self.qkv, self.proj = tnn.Linear(d, 3 * d), tnn.Linear(d, d)
            self.fc1, self.fc2 = tnn.Linear(d, 4 * d), tnn.Linear(4 * d, d)

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
            q, k, v = (z.view(b, t, heads, d // heads).transpose(1, 2) for z in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))

    class GPT(tnn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = tnn.Embedding(V, d), tnn.Embedding(T, d)
            self.blocks = tnn.ModuleList(Block() for _ in range(L))
            self.ln_f, self.head = tnn.LayerNorm(d), tnn.Linear(d, V, bias=False)

        def forward(self, idx, targets):
            x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
            for block in self.blocks:
                x = block(x)
            logits = self.head(self.ln_f(x))
            return F.cross_entropy(logits.view(-1, V), targets.view(-1))

    return GPT()


def time_step(torch, shape, compiled: bool, steps: int, warmup: int) -> tuple[float, float]:
    """Mean milliseconds of one training step, and the peak GB allocated during the timed steps."""
    L, d, heads, T, B, V = shape
    model = gpt(torch, L, d, heads, T, V).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    run = torch.compile(model) if compiled else model
    idx = torch.randint(0, V, (B, T), device="cuda")
    targets = torch.randint(0, V, (B, T), device="cuda")

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = run(idx, targets)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / steps * 1e3, torch.cuda.max_memory_allocated() / 1e9


def predicted_ms(shape, fused: bool) -> float:
    model = ModelSpec(*shape)
    hw = hardware("h100", 1, 1, fused=fused, weights="autocast")      # FP32 parameters under autocast
    return predict_time(model, Layout(micro_batch=model.batch), hw)["total"] * 1e3


def predicted_gb(shape) -> float:
    model = ModelSpec(*shape)
    return predict_memory(model, Layout(micro_batch=model.batch), weights="autocast")["total"] / 1e9


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", choices=("issue", "all"), default="issue", help="which shapes to time")
    parser.add_argument("--steps", type=int, default=10, help="timed steps (default 10)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first (default 3)")
    args = parser.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("skipped: torch is not installed")
        return 0
    if not torch.cuda.is_available():
        print("skipped: no CUDA device (the planner's figures are an H100's; run this on one)")
        return 0
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; predictions for an H100 SXM 80GB")
    print(f"{'L':>3}{'d':>6}{'T':>6}{'B':>4}{'V':>7}  {'eager ms':>9}{'pred':>8}{'ratio':>7}  "
          f"{'compile ms':>10}{'pred':>8}{'ratio':>7}  {'peak GB eager':>13}{'compile':>8}{'pred':>7}")
    for shape in ISSUE + (MORE if args.shapes == "all" else []):
        L, d, _, T, B, V = shape
        eager, eager_gb = time_step(torch, shape, False, args.steps, args.warmup)
        compiled, compiled_gb = time_step(torch, shape, True, args.steps, args.warmup)
        pe, pc = predicted_ms(shape, False), predicted_ms(shape, True)
        print(f"{L:>3}{d:>6}{T:>6}{B:>4}{V:>7}  {eager:>9.2f}{pe:>8.2f}{pe / eager:>7.2f}  "
              f"{compiled:>10.2f}{pc:>8.2f}{pc / compiled:>7.2f}  {eager_gb:>13.2f}{compiled_gb:>8.2f}"
              f"{predicted_gb(shape):>7.2f}", flush=True)
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())

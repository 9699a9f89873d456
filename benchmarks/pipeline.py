"""Pipeline parallelism: real wall-clock of a GPipe step at P = 2, and simulated-clock speedups.

    python benchmarks/pipeline.py            # from the repository root, with PYTHONPATH=. if not installed

Part 1 (wall-clock, this machine): a compute-heavy MLP (8 × Linear(1024, 1024) + ReLU, batch 256,
float32), one SGD step. Single process (one rank, one BLAS thread, as each pipeline rank has) vs GPipe
on two ranks with M = 4 micro-batches. The ideal speedup is P·M/(M+P−1) = 1.6; the two ranks share the
machine's two cores with whatever else runs, and messages are real copies through shared memory. CPU
seconds per rank are printed too: they show the work divided even when a busy machine hides it.
torch (one thread), if installed, is timed on the same step as a peer.

Part 2 (simulated clock): for P = 2..8 stages and M = 4P micro-batches, a model of P equal stages (four
Linear(256, 256) + ReLU blocks each) on a device of 10 GFLOP/s (about one core of this machine) joined by
NVLink-like links (α = 5 µs, 25 GB/s). Speedup = T(1 device) / T(P stages) against the bubble formula
P·M/(M+P−1) = P·(1 − (P−1)/(M+P−1)); it must agree within 2% (communication is the difference).
"""

from __future__ import annotations

import time

import numpy as np

from minidist.cluster import Device, LinkModel, run
from minidist.nn import Linear, MSELoss, ReLU, Sequential
from minidist.optim import SGD
from minidist.parallel.pipeline import Pipeline


def mlp(blocks: int, width: int, seed: int = 0) -> Sequential:
    rng, layers = np.random.default_rng(seed), []
    for _ in range(blocks):
        layers += [Linear(width, width, rng=rng), ReLU()]
    return Sequential(*layers)


def timed_steps(comm, blocks, width, batch, M, steps):
    """Per SGD step on this pipeline (P = comm.world_size): wall-clock and CPU seconds of this rank;
    also the simulated clock of the last step."""
    data = np.random.default_rng(1)
    x = data.normal(size=(batch, width)).astype(np.float32)
    target = data.normal(size=(batch, width)).astype(np.float32)
    pipe = Pipeline(comm, mlp(blocks, width), loss_fn=MSELoss(), num_micro_batches=M, schedule="gpipe")
    optimizer = SGD(pipe.parameters(), lr=1e-3)
    times, cpu = [], []
    for _ in range(steps + 1):  # the first step warms up caches and allocations
        comm.barrier()
        start, start_cpu, clock = time.perf_counter(), time.process_time(), comm.clock
        pipe.train_step(x, target, optimizer)
        cpu.append(time.process_time() - start_cpu)
        comm.barrier()
        times.append(time.perf_counter() - start)
    return times[1:], comm.clock - clock, cpu[1:]


def torch_step_seconds(blocks, width, batch, steps):
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(1)
    layers = []
    for _ in range(blocks):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, target = torch.randn(batch, width), torch.randn(batch, width)
    times = []
    for _ in range(steps + 1):
        start = time.perf_counter()
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), target).backward()
        optimizer.step()
        times.append(time.perf_counter() - start)
    return float(np.median(times[1:]))


def wall_clock(rounds: int = 3, steps: int = 3) -> None:
    blocks, width, batch, M = 8, 1024, 256, 4
    print(f"Part 1 — wall-clock of one SGD step, {blocks} x Linear({width}, {width}) + ReLU, batch {batch}, "
          f"float32; {rounds} interleaved rounds of {steps} steps, medians")
    single, pipelined, single_cpu, rank_cpu = [], [], [], [[], []]
    for _ in range(rounds):  # interleaved, so that a burst of load elsewhere hits both alike
        one = run(timed_steps, 1, blocks, width, batch, 1, steps, timeout=600)[0]
        single += one[0]
        single_cpu += one[2]
        per_rank = run(timed_steps, 2, blocks, width, batch, M, steps, timeout=600)
        pipelined += np.max([r[0] for r in per_rank], axis=0).tolist()
        for r in range(2):
            rank_cpu[r] += per_rank[r][2]
    single_s, pipelined_s = float(np.median(single)), float(np.median(pipelined))
    ideal = 2 * M / (M + 2 - 1)
    print(f"  single process (1 rank, 1 BLAS thread)   {single_s * 1e3:8.1f} ms")
    print(f"  GPipe, P = 2, M = {M}                      {pipelined_s * 1e3:8.1f} ms   "
          f"speedup {single_s / pipelined_s:.2f}x (ideal P·M/(M+P−1) = {ideal:.2f}x)")
    print(f"  CPU seconds per step: single {np.median(single_cpu) * 1e3:.0f} ms; GPipe rank 0 "
          f"{np.median(rank_cpu[0]) * 1e3:.0f} ms, rank 1 {np.median(rank_cpu[1]) * 1e3:.0f} ms "
          f"(each stage does half the work; waiting does not use CPU)")
    torch_time = torch_step_seconds(blocks, width, batch, steps)
    if torch_time is not None:
        print(f"  torch, 1 thread (peer)                   {torch_time * 1e3:8.1f} ms   "
              f"minidist single / torch = {single_s / torch_time:.2f}")


def simulated(max_stages: int = 8) -> None:
    device, link, width, blocks_per_stage, per_micro_batch = Device(flops=1e10), LinkModel(), 256, 4, 16
    print(f"\nPart 2 — simulated clock: stages of {blocks_per_stage} x Linear({width}) + ReLU, M = 4P, "
          f"{per_micro_batch} samples per micro-batch,\n  device {device.flops:.0e} FLOP/s, link α = "
          f"{link.alpha * 1e6:.0f} µs, {1 / link.beta / 1e9:.0f} GB/s")
    print("   P    M   T(1) ms   T(P) ms   speedup   P·M/(M+P−1)   difference")
    worst = 0.0
    for P in range(2, max_stages + 1):
        M = 4 * P
        args = (P * blocks_per_stage, width, M * per_micro_batch)
        one = run(timed_steps, 1, *args, 1, 1, device=device, link=link, timeout=600)[0][1]
        many = max(r[1] for r in run(timed_steps, P, *args, M, 1, device=device, link=link, timeout=600))
        speedup, formula = one / many, P * M / (M + P - 1)
        worst = max(worst, abs(speedup / formula - 1))
        print(f"  {P:2d}  {M:3d}  {one * 1e3:8.2f}  {many * 1e3:8.2f}  {speedup:8.3f}  {formula:12.3f}   "
              f"{speedup / formula - 1:+.2%}")
    print(f"  largest difference from the formula: {worst:.2%} (must be < 2%)")
    assert worst < 0.02


if __name__ == "__main__":
    wall_clock()
    simulated()

"""Step time of ZeRO-1, ZeRO-2 and ZeRO-3/FSDP against DataParallel at P = 2: wall clock and simulated clock.

    PYTHONPATH=$PWD python benchmarks/zero.py [--steps 5] [--world-size 2]

Every strategy trains the same fp32 MLP with Adam on the same global batches. DataParallel runs with
overlap=False (the sharded wrappers charge communication after compute, without a second stream), so the
simulated clocks compare the same machine model. For ZeRO-3 the script also predicts its extra simulated
time over ZeRO-1 from its extra bytes and messages alone: Δt ≈ α·Δmessages + β·Δbytes.
"""

import argparse
import time

import numpy as np

from minidist.cluster import LinkModel, run
from minidist.nn import CrossEntropyLoss, Linear, ReLU, Sequential
from minidist.optim import Adam
from minidist.parallel.data import DataParallel
from minidist.parallel.data.zero import ZeRO

WIDTHS = [512, 1024, 1024, 10]


def mlp(seed=0):
    rng, layers = np.random.default_rng(seed), []
    for i, (a, b) in enumerate(zip(WIDTHS[:-1], WIDTHS[1:])):
        layers += [Linear(a, b, rng=rng)] + ([ReLU()] if i < len(WIDTHS) - 2 else [])
    return Sequential(*layers)


def bench(comm, strategy, steps):
    rng = np.random.default_rng(1)
    batches = [(rng.normal(size=(64, WIDTHS[0])).astype(np.float32), rng.integers(0, 10, size=64))
               for _ in range(steps + 1)]
    model = mlp()
    if strategy == "DP":
        wrapper = DataParallel(comm, model, Adam(model.parameters()), CrossEntropyLoss(), overlap=False)
    else:
        wrapper = ZeRO(
            comm, model, lambda ps: Adam(ps), CrossEntropyLoss(), stage=int(strategy[-1])
        )
    wrapper.train_step(*batches[0])                            # warm-up: buffers, optimizer state
    comm.barrier()
    clock, sent, msgs, wall = comm.clock, comm.stats.bytes_sent, comm.stats.messages_sent, time.perf_counter()
    for x, y in batches[1:]:
        wrapper.train_step(x, y)
    comm.barrier()
    return ((time.perf_counter() - wall) / steps, (comm.clock - clock) / steps,
            (comm.stats.bytes_sent - sent) // steps, (comm.stats.messages_sent - msgs) // steps)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--world-size", type=int, default=2)
    args = parser.parse_args()
    link = LinkModel()
    psi = sum(a * b + b for a, b in zip(WIDTHS[:-1], WIDTHS[1:]))
    print(f"MLP {WIDTHS}: Ψ = {psi} fp32 parameters ({4 * psi / 2**20:.1f} MiB), Adam, global batch 64, "
          f"P = {args.world_size}, {args.steps} timed steps")
    print(
        f"{'strategy':9s} {'wall ms/step':>13s} {'simulated ms/step':>18s} {'bytes sent/rank':>16s} "
        f"{'messages':>9s}"
    )
    rows = {}
    for strategy in ("DP", "ZeRO-1", "ZeRO-2", "ZeRO-3"):
        results = run(bench, args.world_size, strategy, args.steps, timeout=600)
        wall = max(r[0] for r in results)
        simulated, sent, msgs = results[0][1], results[0][2], results[0][3]
        rows[strategy] = (wall, simulated, sent, msgs)
        print(f"{strategy:9s} {wall * 1e3:13.1f} {simulated * 1e3:18.4f} {sent:16d} {msgs:9d}")
    (_, t1, b1, m1), (_, t3, b3, m3) = rows["ZeRO-1"], rows["ZeRO-3"]
    predicted = link.alpha * (m3 - m1) + link.beta * (b3 - b1)
    print(
        f"ZeRO-3 over ZeRO-1: {b3 - b1} more bytes, {m3 - m1} more messages; simulated "
        f"{(t3 - t1) * 1e3:.4f} ms more per step, predicted from bytes and messages {predicted * 1e3:.4f} ms "
        f"(ratio {(t3 - t1) / predicted:.3f})"
    )


if __name__ == "__main__":
    main()

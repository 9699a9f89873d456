# %% [markdown]
# # 04 — A cluster on one computer
#
# **Goal.** Meet the machine every later lesson runs on: a *cluster* of simulated accelerators, each an
# operating-system process with its own memory, joined by links. We look at the machine model (devices,
# links, the alpha-beta cost of a message), measure what a message really costs on this computer, pass a
# token around a ring and draw its timeline, and see what happens when a rank fails.
#
# The picture from the slides "Distributed Deep Learning (Part II)" and "Hardware Accelerators for
# Training DNNs": many accelerators — a V100 has 16 GB of HBM2 at 900 GB/s and 300 GB/s of NVLink — each
# computing on its own memory, and a program that decides who sends what to whom. Sending a message of
# n bytes over a link costs
#
#     T(n) = alpha + beta * n        (alpha: latency, seconds;  beta: seconds per byte = 1 / bandwidth)
#
# which is the building block of the slide's cost of ring allreduce,
# T_comm = 2 * sum_i (alpha (P-1) + beta (P-1)/P |W_i|).

# %%
import tempfile
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from minidist.cluster import ClusterError, Device, LinkModel, run, run_traced
from minidist.sim.plots import figures_dir, plot_timeline, save_figure

FIGURES = figures_dir()  # figures/, or $MINIDIST_FIGURES (the tests use a temporary folder)

# %% [markdown]
# ## The machine model
#
# `minidist.cluster.run(fn, P)` starts P processes ("ranks"); each calls `fn(comm)`. Besides moving real
# NumPy arrays through shared memory, every rank keeps a *simulated clock*: a `send` of n bytes occupies
# the sender for alpha + n beta of a `LinkModel`; a `recv` completes at max(own clock, arrival);
# `comm.compute(flops)` charges flops / `Device.flops`. The defaults model a V100-class device and one
# NVLink-class link.

# %%
link, device = LinkModel(), Device()
print(f"link:   alpha = {link.alpha * 1e6:.1f} us,  beta = 1/({1 / link.beta / 1e9:.0f} GB/s)")
print(f"device: {device.flops / 1e12:.1f} TFLOP/s, {device.memory / 2**30:.0f} GiB")
half = link.alpha / link.beta          # the size at which latency and bandwidth terms are equal
print(f"a message of {half / 1e3:.0f} kB costs as much in latency as in bandwidth; "
      f"a 100 MB gradient takes {link.time(100e6) * 1e3:.2f} ms")
assert abs(link.time(half) - 2 * link.alpha) < 1e-15

# %% [markdown]
# ## Hello, cluster
#
# Each rank knows its `rank` and the `world_size`; `run` returns what each rank's function returned, in
# rank order.

# %%
print(run(lambda comm: f"rank {comm.rank} of {comm.world_size}", 4))

# %% [markdown]
# ## Ping-pong: what a message really costs here
#
# Rank 0 sends n bytes to rank 1, which sends them back; half the round trip is the one-way time. Small
# messages measure the latency alpha, big ones the bandwidth 1/beta. The real numbers of this computer
# (shared memory, Python on both ends, other programs competing for 2 cores) are far from an NVLink's —
# which is why the lessons use the simulated clock for cost arguments, and real runs only for correctness.
#
# The ranks first bounce a small message a few thousand times, untimed: a rank that waits sleeps (it
# never burns a core), and the cores of a virtual machine run slower for a while after sleeping, so the
# first round trips measure waking up rather than messaging. The times differ from run to run, so
# figures/04_pingpong.png is not committed (.gitignore); every other figure is the same bytes each run.


# %%
def round_trip(comm, x):
    if comm.rank == 0:
        comm.send(x, 1)
        comm.recv(1, out=x)
    else:
        comm.recv(0, out=x)
        comm.send(x, 0)


def pingpong(comm, sizes, reps):
    """One-way time of each message size, best of ``reps`` round trips (10x more below 16 KiB)."""
    small = np.zeros(64, np.uint8)
    for _ in range(3000):                   # warm-up, not timed
        round_trip(comm, small)
    times = []
    for n in sizes:
        x = np.zeros(n, np.uint8)
        best = float("inf")
        for _ in range(reps * 10 if n <= 16 * 1024 else reps):
            start = time.perf_counter()
            round_trip(comm, x)
            best = min(best, (time.perf_counter() - start) / 2)
        times.append(best)
    return times


sizes = [64, 1024, 16 * 1024, 256 * 1024, 2**20, 4 * 2**20, 16 * 2**20]
measured = np.array(run(pingpong, 2, sizes, 20)[0])
alpha_real = measured[0]                                  # the smallest message: all latency
beta_real = 1 / max(n / t for n, t in zip(sizes, measured))    # the best bandwidth reached
print(f"{'bytes':>10s} {'one-way (us)':>13s} {'GB/s':>7s}")
for n, t in zip(sizes, measured):
    print(f"{n:10d} {t * 1e6:13.1f} {n / t / 1e9:7.2f}")
print(f"this computer: alpha ~ {alpha_real * 1e6:.0f} us, 1/beta ~ {1 / beta_real / 1e9:.1f} GB/s   "
      f"(model: {link.alpha * 1e6:.0f} us, {1 / link.beta / 1e9:.0f} GB/s)")
assert np.all(measured > 0) and measured[-1] > measured[0], "a 16 MiB message must take longer than 64 B"

fig, ax = plt.subplots(figsize=(6, 4))
ax.loglog(sizes, measured * 1e6, "o-", label="measured here (shared memory)")
grid = np.logspace(np.log10(sizes[0]), np.log10(sizes[-1]), 50)
ax.loglog(grid, (alpha_real + beta_real * grid) * 1e6, "--", label="alpha + n beta from these measurements")
ax.loglog(grid, np.array([link.time(n) for n in grid]) * 1e6, ":", label="model link (LinkModel())")
ax.set_xlabel("message size (bytes)")
ax.set_ylabel("one-way time (us)")
ax.set_title("ping-pong between two ranks")
ax.legend()
fig.tight_layout()
save_figure(fig, "04_pingpong.png", dpi=120)

# %% [markdown]
# ## A token around a ring
#
# Rank 0 starts a token (an integer array); every rank adds one, "computes" for a while, and passes it
# to the right: rank r sends to (r+1) mod P and receives from (r-1) mod P. After two laps the token is
# back at rank 0 with value 2P. On the simulated clock each hop costs compute + alpha + n beta, so two
# laps take exactly 2P (c + alpha + 8 beta) — the whole ring waits on one token at a time.

# %%
P, FLOPS_PER_HOP = 6, 2e8


def token_ring(comm, laps):
    right, left = (comm.rank + 1) % comm.world_size, (comm.rank - 1) % comm.world_size
    token = np.zeros(1, np.int64)
    for lap in range(laps):
        if comm.rank != 0 or lap > 0:
            token = comm.recv(left)
        token = token + 1
        comm.compute(FLOPS_PER_HOP, label=f"work on token (lap {lap})")
        comm.send(token, right)
    if comm.rank == 0:
        token = comm.recv(left)
    return int(token[0])


results, trace = run_traced(token_ring, P, 2)
hop = FLOPS_PER_HOP / device.flops + link.time(8)
print(f"token after two laps: {results[0]} (expected {2 * P}); simulated time {trace.clocks[0] * 1e6:.2f} us "
      f"= 2P (c + alpha + 8 beta) = {2 * P * hop * 1e6:.2f} us")
assert results[0] == 2 * P
assert np.isclose(trace.clocks[0], 2 * P * hop, rtol=1e-12)
assert [s.bytes_sent for s in trace.stats] == [16] * P          # two 8-byte messages per rank
plot_timeline(trace, path=FIGURES / "04_ring_timeline.png", title=f"a token around a ring of {P} ranks")
chrome = trace.save_chrome(Path(tempfile.gettempdir()) / "04_ring_trace.json")
print(f"Chrome trace (open in https://ui.perfetto.dev): {chrome}")

# %% [markdown]
# In the figure each rank is busy (green compute, blue send) only while it holds the token and waits
# (orange receive) the rest of the time: a ring carries one message at a time. Ring *allreduce* (lesson
# 05) keeps every link busy at once by cutting the data into P pieces.
#
# To watch the messages go by, set `MINIDIST_VERBOSE=1`: each send and receive prints a line
# `rank 2 -> 3  tag 0  8 B  step 1`.

# %% [markdown]
# ## When a rank fails
#
# Real clusters lose nodes. In minidist a rank that raises, exits or is killed makes `run` raise
# `ClusterError` naming the rank, with its traceback; the other ranks are stopped and nothing is left
# behind. A *deadlock* — here both ranks receive first, so each waits for a message the other will never
# send — is noticed within a poll (50 ms) of the moment every rank is asleep and no message is on its
# way: the ranks raise `DeadlockError`, saying what each rank waits for. (A rank stuck in an endless loop
# of its own is no deadlock — it is running; for that `run(..., timeout=)` stops the run.)


# %%
def faulty(comm):
    if comm.rank == 2:
        return 1 // (comm.rank - 2)       # rank 2 divides by zero
    return comm.recv(2)                  # the others wait for a message from rank 2 that never comes


start = time.monotonic()
try:
    run(faulty, 4)
except ClusterError as error:
    print(str(error).splitlines()[0], f"(after {time.monotonic() - start:.2f} s)")
    print("\n".join(str(error).splitlines()[-3:]))
    assert error.rank == 2 and "ZeroDivisionError" in str(error)


def deadlock(comm):
    other = 1 - comm.rank
    comm.recv(other)            # both wait for the other to send first
    comm.send(np.zeros(1), other)


start = time.monotonic()
try:
    run(deadlock, 2)
except ClusterError as error:
    print(str(error).splitlines()[0], f"(after {time.monotonic() - start:.2f} s)")
    assert "DeadlockError: deadlock" in str(error) and "rank 0 waits for recv from rank 1" in str(error)
    assert time.monotonic() - start < 5.0, "a deadlock is reported at once, not at the timeout"

# %% [markdown]
# **What to remember.** A message costs alpha + n beta; the simulated clock adds these up exactly so that
# later lessons can compare algorithms by formula. Real messages on this computer cost about ten
# microseconds and a few GB/s. A failing rank, or a deadlock, stops the whole run with its traceback,
# never a hang.

# %% [markdown]
# ## The same code on a real cluster
#
# Under `mpiexec -n P python script.py` the very same `run` starts no processes: the MPI processes are
# the ranks, messages travel through MPI, and every process gets all the results (README, "Run on a
# real cluster"). Below, one allreduce (recursive doubling: the ring is lesson 05's exercise) runs on both
# backends: the sums, the bytes counted and the simulated clocks agree, because the clock models the machine,
# not this computer. (Skipped when MPI is not installed: `pip install -e ".[mpi]"`.)

# %%
import ast  # noqa: E402

import minidist  # noqa: E402
from minidist.cluster.mpi_launch import launch, mpi_available  # noqa: E402

SAME_COLLECTIVE = f"""
import os
import sys
sys.path.insert(0, {str(Path(minidist.__file__).parents[1])!r})
import numpy as np
from minidist.cluster import run
from minidist.collectives import allreduce

def ring_sum(comm):
    total = allreduce(comm, np.arange(1000.0) * (comm.rank + 1), algorithm="recursive_doubling")
    return float(total.sum()), comm.stats.bytes_sent, comm.clock

if __name__ == "__main__":
    results = run(ring_sum, 2)                  # under mpiexec: every MPI process gets the whole list
    if os.environ.get("PMI_RANK", "0") == "0":  # so one process prints it (MPICH names each one's rank)
        print(results)
"""
namespace: dict = {}
exec(SAME_COLLECTIVE, namespace)              # the program's functions, here in this process
on_shared_memory = run(namespace["ring_sum"], 2)
print("simulated cluster:", on_shared_memory)
if mpi_available():
    with tempfile.TemporaryDirectory() as folder:
        script = Path(folder) / "same_collective.py"
        script.write_text(SAME_COLLECTIVE)
        job = launch(2, [str(script)], timeout=120, capture=True)
    assert job.returncode == 0, job.stderr
    on_mpi = ast.literal_eval(job.stdout.splitlines()[0])
    print("MPI (mpiexec -n 2):", on_mpi)
    assert on_mpi == on_shared_memory
else:
    print("MPI is not installed (pip install -e \".[mpi]\"): the MPI half is skipped")

# %% [markdown]
# # 20 — Feeding data fast: the input pipeline
#
# **Goal.** Every lesson so far had its data in memory already. A real training step first has to *get*
# its batch: read it from disk, decode it, collate it — and while that happens the accelerator waits. We
# put a price on that wait on the simulated clock, split an epoch between ranks with a distributed
# sampler, load batches in parallel worker processes, and read only the columns a model needs from a
# columnar file.
#
# The slides "Scaling Up Training" (*Feed Data Fast*): **columnar data** — Apache Parquet on disk,
# Apache Arrow in memory; **parallel workers** — multiprocessing, multithreading (Spark, HuggingFace
# Datasets, Petastorm, TensorFlow Datasets do it for you); and a warning: "**primary memory is a
# bottleneck!**" A loader that keeps k·q batches in flight holds k·q batches in memory.

# %%
import os
import tempfile
import time

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from minidist.data import DistributedSampler, Loader, batched, load_digits
from minidist.data.input_clock import simulate_input_pipeline
from minidist.sim.plots import figures_dir, save_figure

FIGURES = figures_dir()  # figures/, or $MINIDIST_FIGURES (the tests use a temporary folder)
DATA = load_digits()

# %% [markdown]
# ## 1. When does a step wait for its data?
#
# A step computes for C seconds; loading one batch takes L seconds on one worker. The loader
# (`minidist.data.loader.Loader`, like torch's DataLoader) gives batch i to worker i mod k and lets every
# worker hold q requests ahead of the loop. `simulate_input_pipeline` plays that loop on a simulated
# clock, event by event, and the two rules come out of it:
#
#     q >= 1:  step time = max(C, L / k)       (loading hides behind computing once L/k <= C)
#     q = 0:   step time = C + L               (the batch is asked for when it is needed: a stall of L)
#
# Here C = 10 ms and L = 30 ms (a batch read and decoded on one core).

# %%
C, L, STEPS = 0.010, 0.030, 60
print(f"{'workers k':>9} {'prefetch q':>10} {'step (ms)':>9} {'formula':>8} {'stall/step (ms)':>15}")
step_times = {}
for k in range(7):
    for q in (0, 1, 2):
        if k == 0 and q > 0:
            continue                                   # k = 0 loads in the loop: nothing to prefetch
        t = simulate_input_pipeline(STEPS, C, L, workers=k, prefetch=q)
        steady = t.steady_step_time(last=12)
        formula = C + L if k == 0 or q == 0 else max(C, L / k)
        assert abs(steady - formula) < 1e-12
        step_times[k, q] = steady
        print(f"{k:>9} {q:>10} {steady * 1e3:>9.1f} {formula * 1e3:>8.1f} "
              f"{t.stall[-12:].mean() * 1e3:>15.1f}")

# The stall when nothing is prefetched: every step waits the whole L, however many workers there are.
assert all(abs(step_times[k, 0] - (C + L)) < 1e-12 for k in (0, 1, 2, 3, 4, 6))
# With prefetching, three workers (L / k = C) are enough: the step runs at the speed of computing.
assert np.allclose([step_times[3, 1], step_times[6, 2], step_times[1, 1]], [C, C, L], rtol=1e-12)

# %% [markdown]
# The timelines make it visible: with q = 0 the loop idles (grey) while one worker loads; with k = 3 and
# q = 2 the three workers load the next batches while the loop computes, and after the first batch (the
# pipeline has to fill) no step waits.

# %%
fig, axes = plt.subplots(3, 1, figsize=(10, 6.6), gridspec_kw={"height_ratios": [1.3, 2.2, 2.4]})
for ax, (k, q) in zip(axes[:2], ((1, 0), (3, 2))):
    n = 24                                             # more than fit in the 250 ms shown
    t = simulate_input_pipeline(n, C, L, workers=k, prefetch=q)
    for i in range(n):
        ax.barh(0, C * 1e3, left=t.step_start[i] * 1e3, color="tab:green", edgecolor="black", lw=0.3)
        ax.barh(0, t.stall[i] * 1e3, left=(t.step_start[i] - t.stall[i]) * 1e3, color="lightgray",
                edgecolor="black", lw=0.3)
        ax.barh(1 + t.worker[i], L * 1e3, left=t.load_start[i] * 1e3, color="tab:blue", edgecolor="black",
                lw=0.3)
        ax.text((t.load_start[i] + L / 2) * 1e3, 1 + t.worker[i], str(i), ha="center", va="center",
                fontsize=7, color="white", clip_on=True)
    ax.set_yticks(range(k + 1), ["training loop"] + [f"worker {w}" for w in range(k)])
    ax.invert_yaxis()
    ax.set_xlim(0, 250)
    ax.set_title(f"k = {k} worker{'s' if k > 1 else ''}, prefetch q = {q}: a step every "
                 f"{step_times[k, q] * 1e3:.0f} ms (numbers: batch index)", fontsize=10)
for color, label in (("tab:green", "compute (C = 10 ms)"), ("lightgray", "waiting for data"),
                     ("tab:blue", "load a batch (L = 30 ms)")):
    axes[0].barh([0], [0], color=color, label=label)
fig.legend(loc="upper center", ncol=3, fontsize="small")
axes[1].set_xlabel("simulated time (ms)")
ks = np.arange(1, 7)
axes[2].plot(ks, [step_times[k, 0] * 1e3 for k in ks], "o-", label="q = 0 (on demand): C + L")
axes[2].plot(ks, [step_times[k, 1] * 1e3 for k in ks], "s-", label="q = 1: max(C, L/k)")
axes[2].axhline(C * 1e3, color="gray", lw=0.8, ls=":", label="compute alone (C)")
axes[2].set(xlabel="workers k", ylabel="step time (ms)", xticks=ks, ylim=(0, 45))
axes[2].legend(fontsize="x-small")
fig.tight_layout(rect=(0, 0, 1, 0.95))
save_figure(fig, "20_input_stall.png")
plt.close(fig)

# %% [markdown]
# ## 2. Splitting an epoch between ranks: the distributed sampler
#
# With data parallelism (lesson 06) each of P ranks must see a *different* part of every epoch, and the
# ranks must agree on the split without talking. torch's `DistributedSampler` rule, which
# `minidist.data.sampler.DistributedSampler` follows: a permutation of range(N) drawn from (seed, epoch) —
# the same on every rank —, padded by wrapping around to a multiple of P (or cut, with `drop_last`),
# then rank r takes every P-th index starting at r. `set_epoch(e)` reshuffles.

# %%
N, P = 10, 4
for drop_last in (False, True):
    shards = [DistributedSampler(N, P, r, shuffle=False, drop_last=drop_last).indices() for r in range(P)]
    print(f"N = {N}, P = {P}, drop_last = {drop_last}: " + "  ".join(f"rank {r}: {s.tolist()}"
                                                                    for r, s in enumerate(shards)))
padded = np.concatenate([DistributedSampler(N, P, r, shuffle=False).indices() for r in range(P)])
assert sorted(padded.tolist()) == [0, 0, 1, 1, *range(2, 10)]       # 12 = 4·3 slots: 0 and 1 twice

epochs = []
for epoch in range(3):
    samplers = [DistributedSampler(len(DATA.y_train), P, r, seed=2026) for r in range(P)]
    for s in samplers:
        s.set_epoch(epoch)
    shards = [s.indices() for s in samplers]
    everything = np.concatenate(shards)                    # 4 · 360 = 1,440 slots, every image at least once
    assert len(everything) == 1440 and np.array_equal(np.unique(everything), np.arange(len(DATA.y_train)))
    epochs.append(shards[0])
    print(f"epoch {epoch}: rank 0 starts with {shards[0][:6].tolist()} ({len(shards[0])} indices per rank)")
assert not np.array_equal(epochs[0], epochs[1])                          # a new order every epoch
print(f"1,437 images over 4 ranks: {4 * 360 - 1437} padded slots (359.25 -> 360 per rank)")

# %% [markdown]
# ## 3. Loading in worker processes
#
# `Loader(fetch, batches, num_workers=k, prefetch=q)` runs `fetch(indices)` in k processes. Here fetch
# reads the images and "augments" them with a random shift of one pixel, drawn from a generator seeded by
# the batch's first index — so a batch is the same whichever worker makes it: the loader's batches are
# bitwise the same for k = 0 (in the loop), 1 and 3.

# %%


def augmented(idx):
    rng = np.random.default_rng(int(idx[0]))
    images = DATA.x_train[idx].reshape(-1, 8, 8)
    shifts = rng.integers(-1, 2, size=(len(idx), 2))
    shifted = np.stack([np.roll(im, tuple(s), axis=(0, 1)) for im, s in zip(images, shifts)])
    return shifted.reshape(len(idx), 64), DATA.y_train[idx]


sampler = DistributedSampler(len(DATA.y_train), 2, 0, seed=7)
batches = batched(sampler.indices(), 32)
reference = list(Loader(augmented, batches, num_workers=0))
for k in (1, 3):
    got = list(Loader(augmented, batches, num_workers=k, prefetch=2))
    assert all(a[0].tobytes() == b[0].tobytes() and np.array_equal(a[1], b[1])
               for a, b in zip(reference, got))
print(f"{len(batches)} batches of rank 0's half of the epoch: bitwise equal for k = 0, 1, 3")

# %% [markdown]
# Now real time. A fetch that waits 20 ms (a disk or a network read) and a "step" of 10 ms: in the loop
# every step costs about 30 ms; with three workers the reads overlap the steps and each other. (Measured
# on this computer: the numbers vary from run to run; the assertion leaves a wide margin.)

# %%


def slow_read(idx):
    time.sleep(0.020)
    return DATA.x_train[idx]


SLOW_STEPS = 40
small_batches = batched(sampler.indices(), 8)[:SLOW_STEPS]


def epoch_seconds(k):
    """Seconds from the first batch to the end of the epoch (starting the workers is not counted: on a
    busy machine it alone can take longer than the epoch)."""
    start = None
    for _ in Loader(slow_read, small_batches, num_workers=k, prefetch=2):
        start = time.perf_counter() if start is None else start
        time.sleep(0.010)                              # the training step
    return time.perf_counter() - start


in_loop, three_workers = epoch_seconds(0), epoch_seconds(3)
steps = SLOW_STEPS - 1                                 # the first batch's read is before the clock starts
print(f"{steps} steps: in the loop {in_loop * 1e3:.0f} ms ({in_loop / steps * 1e3:.1f} ms/step), "
      f"3 workers {three_workers * 1e3:.0f} ms ({three_workers / steps * 1e3:.1f} ms/step)")
assert in_loop > steps * 0.030 and three_workers < 0.75 * in_loop

# %% [markdown]
# ## 4. Columnar data: read only the columns you need
#
# A Parquet file stores each column of a row group as one contiguous *column chunk* and lists where
# every chunk lies in its footer. A model that needs 2 of a table's 20 columns reads 2 chunks per row
# group. We write 20 columns of 20,000 float64 values and count the bytes the reader pulls from the file
# (`columnar.CountingFile`) against the chunk sizes in pyarrow's own metadata. (Needs the optional
# extra: `pip install -e ".[data]"`; without pyarrow this section only says so.)

# %%
try:
    import pyarrow
except ImportError:
    pyarrow = None
    print('pyarrow is not installed: pip install -e ".[data]" to run this section')

if pyarrow is not None:
    from minidist.data.columnar import CountingFile, column_chunk_bytes, read_columns, write_parquet

    rng = np.random.default_rng(0)
    table = {f"feature_{i:02d}": rng.normal(size=20_000) for i in range(19)}
    table["label"] = rng.integers(0, 10, size=20_000)
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "table.parquet")
        write_parquet(path, table, row_group_size=5_000)
        measured = {}
        for name, columns in (("2 of 20", ["feature_03", "label"]), ("all 20", None)):
            f = CountingFile(path)
            data = read_columns(f, columns)
            f.close()
            measured[name] = (f.bytes_read, column_chunk_bytes(path, columns), len(data))
        file_bytes = os.path.getsize(path)
    for name, (read, chunks, n) in measured.items():
        print(f"{name:>7} columns: read {read:>9,} bytes, "
              f"their column chunks {chunks:>9,} bytes ({n} columns)")
    (two, chunks_two, _), (everything, chunks_all, _) = measured["2 of 20"], measured["all 20"]
    print(f"the file: {file_bytes:,} bytes, of which {file_bytes - chunks_all:,} footer and magic numbers")
    assert chunks_two * 10 == chunks_all                      # equal columns: exactly a tenth
    assert chunks_two <= two < 1.2 * chunks_two + 65_536       # the chunks, plus the footer pyarrow reads
    assert two < 0.15 * everything
    # On the clock of section 1, loading time is proportional to bytes: L = 30 ms for all 20 columns
    # becomes about 3.5 ms for 2, below C — one worker keeps up.
    small_load = L * two / everything
    fast = simulate_input_pipeline(STEPS, C, small_load, workers=1, prefetch=1)
    print(f"L = {small_load * 1e3:.1f} ms with 2 columns: one worker, "
          f"step {fast.steady_step_time(12) * 1e3:.1f} ms")
    assert abs(fast.steady_step_time(12) - C) < 1e-12

# %% [markdown]
# ## What to remember
#
# * Step time = max(C, L/k) with prefetching, C + L without: add workers until L/k <= C, and prefetch.
# * Every rank reads its own shard of every epoch; the shards are a pure function of (seed, epoch), so the
#   ranks agree without communicating, and padding keeps them equal in length.
# * Columnar storage turns "read 2 of 20 columns" into reading about 2/20 of the bytes.
# * Prefetching costs memory: k·q batches in flight ("primary memory is a bottleneck").
#
# ## Exercise
#
# * `distributed_sampler` — rank r's indices for one epoch, torch's rule (permutation from (seed, epoch),
#   pad by wrapping around or drop, every P-th index from r). Check:
#   `python -m pytest --exercise distributed_sampler`.

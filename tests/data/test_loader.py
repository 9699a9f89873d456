"""Loader: the same batches bitwise for any number of workers; a worker's error ends the epoch with its
traceback; nothing is left behind (processes, pipes, shared memory) after an error or an epoch cut short."""

import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from minidist.data.loader import Loader, LoaderError
from minidist.data.sampler import DistributedSampler, batched

ROOT = Path(__file__).resolve().parents[2]
X = np.random.default_rng(0).normal(size=(103, 5)).astype(np.float32)
Y = np.arange(103, dtype=np.int64)


def fetch(idx):
    """A batch with an 'augmentation' drawn from the batch's own indices: the same whichever worker
    runs it."""
    noise = np.random.default_rng(int(idx[0])).normal(size=(len(idx), 5)).astype(np.float32)
    return X[idx] + noise, Y[idx]


def failing_fetch(idx):
    if 40 in idx:
        raise ValueError("bad record 40")
    return X[idx]


def open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def shm_mappings(pid="self") -> set[str]:
    maps = Path(f"/proc/{pid}/maps").read_text().splitlines()
    return {line.split()[-1] for line in maps if "/dev/shm" in line}


def held() -> tuple[set[str], set[str]]:
    """What this process holds before an epoch: open files, shared memory mapped (earlier tests' too)."""
    return open_fds(), shm_mappings()


def assert_nothing_left(loader, before):
    """No worker alive (reaped, not zombies), no pipe left open, no shared memory newly mapped."""
    fds_before, shm_before = before
    for pid in loader.worker_pids:
        assert not Path(f"/proc/{pid}").exists(), f"worker {pid} outlived its epoch"
    assert open_fds() <= fds_before, "a pipe of the loader is still open"
    assert shm_mappings() <= shm_before, "the loader left shared memory mapped"


def epoch_batches(k, q=2):
    order = np.random.default_rng(3).permutation(len(Y))[:52]      # (no sampler: it is an exercise)
    return list(Loader(fetch, batched(order, 8), num_workers=k, prefetch=q))


def test_same_batches_bitwise_for_0_1_3_workers():
    reference = epoch_batches(0)
    assert len(reference) == 7                      # 52 indices, batches of 8
    for k, q in ((1, 1), (3, 2), (3, 1)):
        got = epoch_batches(k, q)
        assert len(got) == len(reference)
        for (xa, ya), (xb, yb) in zip(reference, got, strict=True):
            assert xa.tobytes() == xb.tobytes() and np.array_equal(ya, yb)


def test_a_worker_that_raises_ends_the_epoch_with_its_traceback():
    fds = held()
    loader = Loader(failing_fetch, batched(np.arange(100), 10), num_workers=3, prefetch=2)
    firsts = []
    with pytest.raises(LoaderError, match="worker 1 raised ValueError: bad record 40") as info:
        for batch in loader:
            firsts.append(float(batch[0, 0]))
    # batches 0..3 arrive, in order, before the bad one
    assert firsts == [float(X[i, 0]) for i in (0, 10, 20, 30)]
    assert info.value.worker == 1 and info.value.batch == 4
    assert "failing_fetch" in info.value.details and 'raise ValueError("bad record 40")' in str(info.value)
    assert_nothing_left(loader, fds)


def test_an_epoch_cut_short_stops_every_worker():
    fds = held()
    loader = Loader(fetch, batched(np.arange(100), 5), num_workers=3, prefetch=2)
    for i, _ in enumerate(loader):
        if i == 1:                  # mid-epoch: the workers hold nothing new in /dev/shm (a fork inherits
            for pid in loader.worker_pids:                          # what this process had mapped before)
                opened = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
                assert any(link.startswith("pipe:") for link in opened)
                assert not any("/dev/shm" in link for link in opened)
                assert shm_mappings(pid) <= fds[1]
        if i == 2:
            break
    assert len(loader.worker_pids) == 3
    assert_nothing_left(loader, fds)
    with pytest.raises(KeyError):                   # an exception in the loop body: the same
        for _ in loader:
            raise KeyError("stop")
    assert_nothing_left(loader, fds)


def test_a_worker_that_dies_or_hangs_ends_the_epoch():
    def dies(idx):
        if 30 in idx:
            os._exit(3)
        return idx

    loader = Loader(dies, batched(np.arange(50), 10), num_workers=2)
    with pytest.raises(LoaderError, match=r"worker 1 ended \(exit code 3\) while loading batch 3"):
        list(loader)

    def hangs(idx):
        signal.pause() if 0 in idx else None        # sleeps until terminated; SIGINT is ignored
        return idx

    fds = held()
    loader = Loader(hangs, batched(np.arange(20), 10), num_workers=2, timeout=0.5)
    with pytest.raises(LoaderError, match="worker 0 did not deliver batch 0 within 0.5 s"):
        list(loader)
    assert_nothing_left(loader, fds)


def test_ctrl_c_while_waiting_leaves_nothing_behind():
    """A real SIGINT reaches the parent while it waits for a slow worker (in a fresh interpreter)."""
    script = textwrap.dedent("""
        import os, signal, threading, time
        import numpy as np
        from minidist.data.loader import Loader
        def slow(idx):
            time.sleep(30)
        loader = Loader(slow, [np.arange(4)] * 6, num_workers=3)
        threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT)).start()
        t0 = time.monotonic()
        try:
            list(loader)
        except KeyboardInterrupt:
            print("interrupted", round(time.monotonic() - t0), *loader.worker_pids)
    """)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60,
                         check=False)
    assert out.returncode == 0, out.stderr
    word, seconds, *pids = out.stdout.split()
    assert word == "interrupted" and int(seconds) < 10 and len(pids) == 3
    time.sleep(0.1)
    assert not [p for p in pids if Path(f"/proc/{p}").exists()]


def spawn_fetch(idx):
    return np.asarray(idx) * 2


def test_spawn_start_method():
    got = list(Loader(spawn_fetch, batched(np.arange(9), 4), num_workers=2, start_method="spawn"))
    assert [g.tolist() for g in got] == [[0, 2, 4, 6], [8, 10, 12, 14], [16]]
    with pytest.raises(TypeError, match="cannot be pickled"):
        Loader(Unpicklable(), [np.arange(2)], num_workers=1, start_method="spawn")


class Unpicklable:
    def __call__(self, idx):
        return idx

    def __reduce__(self):
        raise TypeError("no")


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="num_workers must be an integer >= 0"):
        Loader(fetch, [], num_workers=-1)
    with pytest.raises(ValueError, match="prefetch must be an integer >= 1"):
        Loader(fetch, [], num_workers=2, prefetch=0)
    with pytest.raises(TypeError, match="fetch must be a function"):
        Loader(3, [])
    with pytest.raises(ValueError, match="timeout"):
        Loader(fetch, [], timeout=0)
    assert list(Loader(fetch, [], num_workers=2)) == []


def test_timeout_inf_means_no_limit_and_a_bool_is_not_seconds():
    """inf is "no limit" as for the cluster's run (it used to reach selectors and overflow there); True
    used to be taken as 1 s."""
    loader = Loader(fetch, batched(np.arange(4), 2), num_workers=1, timeout=math.inf)
    assert loader.timeout is None
    assert [y.tolist() for _, y in loader] == [[0, 1], [2, 3]]
    for bad, error in ((True, TypeError), ("1", TypeError), (math.nan, ValueError), (-1.0, ValueError)):
        with pytest.raises(error, match="Loader timeout"):
            Loader(fetch, [], timeout=bad)


def sampled_loader(k: int, rank: int = 1) -> Loader:
    return Loader(fetch, DistributedSampler(len(Y), 3, rank, seed=7), batch_size=8, num_workers=k)


def test_a_loader_resumed_from_its_state_gives_the_rest_of_the_run():
    """Two epochs of a sampler's batches, cut after every batch count c: a fresh loader given the state
    (with 0 or 2 workers) hands out exactly the batches an uninterrupted loader hands out after c."""
    whole = sampled_loader(0)
    reference = [y.tolist() for _ in range(2) for _, y in whole]
    assert len(reference) == 10 and reference[0] != reference[5]        # 35 a rank, 5 batches; reshuffled
    for cut in (0, 3, 5, 7):
        first, seen = sampled_loader(0), []
        while len(seen) < cut:
            for _, y in first:
                seen.append(y.tolist())
                if len(seen) == cut:
                    break
        state = first.state_dict()
        assert state["epoch"] * 5 + state["position"] == cut
        second = sampled_loader(2 if cut == 3 else 0)
        second.load_state_dict(json.loads(json.dumps(state)))
        while second.epoch < 2:
            seen += [y.tolist() for _, y in second]
        assert seen == reference, cut


def test_a_loader_refuses_the_state_of_another_loader():
    loader, state = sampled_loader(0), sampled_loader(0).state_dict()
    for change, message in (({"position": 6}, "position 6 is past the epoch's 5 batches"),
                            ({"sampler": dict(state["sampler"], seed=8)}, "seed = 8"),
                            ({"sampler": None}, "this loader has one"), ({"epoch": -1}, "loader epoch")):
        with pytest.raises(ValueError, match=message):
            loader.load_state_dict(dict(state, **change))
    assert loader.state_dict() == state
    with pytest.raises(ValueError, match="batch_size goes with a DistributedSampler"):
        Loader(fetch, batched(np.arange(4), 2), batch_size=2)

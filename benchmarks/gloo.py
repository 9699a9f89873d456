"""torch.distributed over gloo as a peer in the benchmarks: one worker process per rank on a free local
port, each a copy of the benchmark script itself started with the worker's arguments; rank 0 prints
``RESULT <json>`` and that is what comes back."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_gloo_workers(world_size: int, arguments: Callable[[int, int], list[str]]):
    """Start ``python <arguments(rank, port)>`` for every rank, wait for all of them and return the JSON
    rank 0 printed after ``RESULT``; None without torch.distributed's gloo backend or if a rank failed."""
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    if not dist.is_available() or not dist.is_gloo_available():
        return None
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    workers = [subprocess.Popen([sys.executable, *arguments(rank, port)], stdout=subprocess.PIPE, text=True,
                                env=env) for rank in range(world_size)]
    outputs = [w.communicate(timeout=1800)[0] for w in workers]
    lines = [line for line in outputs[0].splitlines() if line.startswith("RESULT ")]
    if not lines or any(w.returncode != 0 for w in workers):
        return None
    return json.loads(lines[-1][len("RESULT "):])

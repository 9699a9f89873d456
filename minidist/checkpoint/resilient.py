"""run_resilient: a cluster run that survives a lost rank by restarting from its last checkpoint.

    for attempt in 0 .. restarts:
        run(fn, world_size, *args)          a rank that raises, exits or is killed ends it: ClusterError
        on ClusterError: note the failure and the newest complete checkpoint under ``root``; start again

``fn(comm, *args)`` itself resumes: it loads ``root``'s newest checkpoint when there is one
(``resume``) and saves every few steps (save_load.save). The snapshots and rollback of the slides
("fault tolerance is practically handled by snapshots and rollback"): the work lost to a failure is the
steps since the last snapshot. Elastic: ``world_size`` may list each attempt's world size (e.g. [4, 2]:
restart on 2 ranks); the load re-splits the checkpoint onto the smaller mesh ``fn`` builds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from minidist.cluster import ClusterError, run

from .manifest import latest, read_manifest
from .save_load import load


@dataclass
class Failure:
    """One failed attempt: its number, the ClusterError's message (it names the rank) and the step of
    the checkpoint the next attempt resumed from (0: from the start)."""
    attempt: int
    error: str
    resumed_from: int


@dataclass
class ResilientRun:
    """What run_resilient returns: results (fn's, in rank order, of the attempt that finished) and the
    failures before it."""
    results: list
    failures: list[Failure] = field(default_factory=list)

    def report(self) -> str:
        lines = [f"attempt {f.attempt} failed: {f.error.splitlines()[0]}; resumed from step "
                 f"{f.resumed_from}" for f in self.failures]
        return "\n".join(lines + [f"finished after {len(self.failures)} restart(s)"])


def last_step(root) -> int:
    """The step of the newest complete checkpoint under root (0 when there is none)."""
    directory = latest(Path(root))
    return 0 if directory is None else read_manifest(directory)["step"]


def run_resilient(fn, world_size, *args, root, restarts: int = 1, **options) -> ResilientRun:
    """Run ``fn(comm, *args)`` on world_size ranks (cluster.run, with ``options``); when a rank fails,
    start again, up to ``restarts`` times; ``fn`` resumes from root's newest checkpoint. world_size: an int,
    or a list giving attempt k the world size world_size[min(k, len - 1)] (elastic). Raises the last
    ClusterError, with every failure listed, when the restarts run out."""
    if not isinstance(restarts, int) or restarts < 0:
        raise ValueError(f"restarts must be an integer >= 0, got {restarts!r}")
    sizes = list(world_size) if isinstance(world_size, (list, tuple)) else [world_size]
    if not sizes or not all(isinstance(n, int) and n >= 1 for n in sizes):
        raise ValueError(f"world_size must be an integer >= 1 or a list of them, got {world_size!r}")
    failures: list[Failure] = []
    for attempt in range(restarts + 1):
        try:
            ranks = sizes[min(attempt, len(sizes) - 1)]
            return ResilientRun(run(fn, ranks, *args, **options), failures)
        except ClusterError as e:
            failures.append(Failure(attempt, str(e), last_step(root)))
            if attempt == restarts:
                report = ResilientRun([], failures).report().rsplit("\n", 1)[0]
                raise ClusterError(f"run_resilient: {restarts + 1} attempts failed:\n{report}",
                                   rank=e.rank) from e
    raise AssertionError("unreachable")


def resume(trainer, root, *, rngs: dict | None = None, loader=None) -> int:
    """Load root's newest complete checkpoint into trainer (and rngs, loader) if there is one; returns the
    step to go on from (0: none saved yet)."""
    if latest(Path(root)) is None:
        return 0
    return load(trainer, root, rngs=rngs, loader=loader)["step"]

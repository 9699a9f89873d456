"""The only communication a pipeline needs: point-to-point between the ranks that run neighbouring stages.

Activations flow forward (stage k → k+1), their gradients backward (k+1 → k); no collective is involved
("Distributed Deep Learning (Part II)" slides: "No collective, only P2P"). Per micro-batch of n samples at
a boundary with activations of shape (n, *feature): one activation forward and one gradient of the same
shape backward, n · prod(feature) · itemsize bytes each way.

Tags: F(m, k) sends its output with tag 2·(m·S + k + 1), B(m, k) its input gradient with
2·(m·S + k − 1) + 1: unique within a step, so a message read for the wrong task fails loudly. A channel
between two ranks is FIFO: the receiver knows the sender's row of the table, so it reads messages in the
order they were sent and keeps one that arrives before its task needs it. Pairing (1F1B's steady state):
when a task sends to the rank its next task receives from, both travel in one sendrecv — two plain sends
toward each other could both wait for room in a full mailbox; sendrecv never deadlocks.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from .schedule import Schedule, Task, stage_ops


def message_of(task: Task, rank_of: dict, num_stages: int) -> tuple[int, int] | None:
    """(destination rank, tag) of what task sends: F an activation to stage k + 1, B a gradient to k − 1."""
    _, kind, m, k = task
    if kind == "F" and k < num_stages - 1:
        return rank_of[m, k + 1], 2 * (m * num_stages + k + 1)
    if kind == "B" and k > 0:
        return rank_of[m, k - 1], 2 * (m * num_stages + k - 1) + 1
    return None


def source_of(task: Task, rank_of: dict, num_stages: int) -> tuple[int, int] | None:
    """(source rank, tag) of what task receives: F(m, k > 0) stage k − 1's output, B(m, k < S − 1) the
    gradient of its output from stage k + 1."""
    _, kind, m, k = task
    if kind == "F" and k > 0:
        return rank_of[m, k - 1], 2 * (m * num_stages + k)
    if kind == "B" and k < num_stages - 1:
        return rank_of[m, k + 1], 2 * (m * num_stages + k) + 1
    return None


class StageLinks:
    """This rank's messages for one pass over its row of the table.

    comm: the communicator; schedule: the whole table (every rank's row: the order of what arrives);
    rank_of: {(micro_batch, stage): rank}; num_stages: S.
    """

    def __init__(self, comm, schedule: Schedule, rank_of: dict, num_stages: int):
        self.comm, self.rank_of, self.S = comm, rank_of, num_stages
        row = stage_ops(schedule, comm.rank)
        self._then = dict(zip(row, row[1:] + [None]))              # the task after each task of this row
        self.expected: dict[int, deque] = {src: deque() for src in range(comm.world_size)}
        for src in range(comm.world_size):
            for task in stage_ops(schedule, src):
                sent = message_of(task, rank_of, num_stages)
                if sent is not None and sent[0] == comm.rank != src:
                    self.expected[src].append(sent[1])
        self.local: dict[int, np.ndarray] = {}                     # messages between this rank's stages
        self.early: dict[int, np.ndarray] = {}                     # tag -> message read before its task

    def recv(self, task: Task) -> np.ndarray:
        """The input of F(m, k) or the output gradient of B(m, k)."""
        src, tag = source_of(task, self.rank_of, self.S)
        if src == self.comm.rank:
            return self.local.pop(tag)
        while tag not in self.early:
            next_tag = self.expected[src].popleft()
            self.early[next_tag] = self.comm.recv(src, tag=next_tag)
        return self.early.pop(tag)

    def send(self, task: Task, array: np.ndarray) -> None:
        """What task produced (its output, or its input gradient) to the rank that needs it, paired with
        the next message from that rank when this rank's next task receives from it."""
        sent = message_of(task, self.rank_of, self.S)
        if sent is None:
            return
        dst, tag = sent
        if dst == self.comm.rank:
            self.local[tag] = array
            return
        then = self._then[task]
        needs = None if then is None else source_of(then, self.rank_of, self.S)
        if needs is not None and needs[0] == dst and self.expected[dst] and self.expected[dst][0] == needs[1]:
            self.expected[dst].popleft()                           # the very message the next task needs
            self.early[needs[1]] = self.comm.sendrecv(np.ascontiguousarray(array), dst, dst, sendtag=tag,
                                                      recvtag=needs[1])
        else:
            self.comm.send(np.ascontiguousarray(array), dst, tag=tag)

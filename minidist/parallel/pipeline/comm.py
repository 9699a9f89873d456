"""The only communication a pipeline needs: point-to-point between neighbouring stages.

Stage s runs on rank s. Activations flow forward (s → s+1), their gradients backward (s+1 → s); no
collective is involved ("Distributed Deep Learning (Part II)" slides: "No collective, only
P2P"). The tag is the micro-batch index, so a schedule that sends micro-batches out of the order the
receiver expects fails loudly (the cluster names both tags) instead of mixing activations up.

Per micro-batch of n samples at a boundary with activations of shape (n, *feature): one activation
forward and one gradient of the same shape backward, n · prod(feature) · itemsize bytes each way.
"""

from __future__ import annotations

import numpy as np

from .schedule import Op


def send_activation(comm, activation: np.ndarray, micro_batch: int) -> None:
    """Forward: this stage's output for micro_batch goes to the next stage (rank + 1)."""
    comm.send(np.ascontiguousarray(activation), comm.rank + 1, tag=micro_batch)


def recv_activation(comm, micro_batch: int) -> np.ndarray:
    """Forward: the previous stage's output (rank − 1) for micro_batch, the input of this stage."""
    return comm.recv(comm.rank - 1, tag=micro_batch)


def send_gradient(comm, grad_input: np.ndarray, micro_batch: int) -> None:
    """Backward: dLoss/d(this stage's input) goes back to the previous stage (rank − 1)."""
    comm.send(np.ascontiguousarray(grad_input), comm.rank - 1, tag=micro_batch)


def recv_gradient(comm, micro_batch: int) -> np.ndarray:
    """Backward: dLoss/d(this stage's output) from the next stage (rank + 1)."""
    return comm.recv(comm.rank + 1, tag=micro_batch)


def send_activation_recv_gradient(comm, activation: np.ndarray, micro_batch: int, grad_micro_batch: int):
    """F(m) then B(j) on this stage, B(j) then F(m) on the next (1F1B's steady state): exchange both
    messages at once. Two plain sends toward each other could both wait for room in a full mailbox;
    sendrecv progresses both directions together, so this never deadlocks, whatever the size."""
    return comm.sendrecv(np.ascontiguousarray(activation), comm.rank + 1, comm.rank + 1,
                         sendtag=micro_batch, recvtag=grad_micro_batch)


def send_gradient_recv_activation(comm, grad_input: np.ndarray, micro_batch: int, act_micro_batch: int):
    """The other side of send_activation_recv_gradient: B(m) here, then F(k) from the previous stage."""
    return comm.sendrecv(np.ascontiguousarray(grad_input), comm.rank - 1, comm.rank - 1,
                         sendtag=micro_batch, recvtag=act_micro_batch)


class StageLinks:
    """This stage's messages for one pass over its row of the schedule, with 1F1B's pairing in one place.

    comm: the communicator (stage s = rank s); ops: row s of the schedule, in order.

    Pairing: when a send goes to the neighbour that the *next* op in the row receives from, both
    travel in one sendrecv (send_activation_recv_gradient and its other side: why, see there) and the
    received message waits here until that op asks for it.
    """

    def __init__(self, comm, ops: list[Op]):
        self.comm = comm
        self._then = dict(zip(ops, ops[1:] + [None]))  # the op after each op in this row
        self._early: dict[tuple[str, int], np.ndarray] = {}  # (kind, micro-batch) -> message fetched early

    def recv_activation(self, micro_batch: int) -> np.ndarray:
        """The input of F(micro_batch), from stage s − 1."""
        early = self._early.pop(("F", micro_batch), None)
        return recv_activation(self.comm, micro_batch) if early is None else early

    def recv_gradient(self, micro_batch: int) -> np.ndarray:
        """The output gradient of B(micro_batch), from stage s + 1."""
        early = self._early.pop(("B", micro_batch), None)
        return recv_gradient(self.comm, micro_batch) if early is None else early

    def send_activation(self, activation: np.ndarray, micro_batch: int) -> None:
        """F(micro_batch)'s output to stage s + 1 (paired with the gradient the next op needs, if any)."""
        then = self._then[Op(self.comm.rank, "F", micro_batch)]
        if then is not None and then.kind == "B":
            self._early["B", then.micro_batch] = send_activation_recv_gradient(
                self.comm, activation, micro_batch, then.micro_batch)
        else:
            send_activation(self.comm, activation, micro_batch)

    def send_gradient(self, grad_input: np.ndarray, micro_batch: int) -> None:
        """B(micro_batch)'s input gradient to stage s − 1 (paired with the activation the next op needs)."""
        then = self._then[Op(self.comm.rank, "B", micro_batch)]
        if then is not None and then.kind == "F":
            self._early["F", then.micro_batch] = send_gradient_recv_activation(
                self.comm, grad_input, micro_batch, then.micro_batch)
        else:
            send_gradient(self.comm, grad_input, micro_batch)

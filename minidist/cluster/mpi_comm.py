"""The Communicator over MPI: the same methods, checks, stats, clock and traces, another transport.

``MPICommunicator`` is a ``Communicator`` whose messages travel through mpi4py instead of shared-memory
mailboxes. A message is the same header as on the simulated cluster (header.py: tag, collective call,
dtype, shape, arrival time on the simulated clock) followed by the payload's bytes, so any dtype and
shape travels (bool, float16, datetimes: all as bytes), and the receiver checks it exactly as comm.py
does (``MessageMismatchError``):

- a short message (payload <= ``SHORT_BYTES``) is one MPI message, header and payload packed together;
- a longer one is its header, then the payload straight from the array into ``out`` (no copy when out
  is C-contiguous and no ``op`` is given), as a second MPI message with its own tag.

``send`` stays eager up to the run's ``mailbox_bytes`` (MPI_Isend of a copy), as on the simulated
cluster; longer messages wait for the receiver. Barrier, ``all_equal`` and ``split`` use MPI's own
collectives; the simulated clock, ``comm.stats`` and the spans are charged exactly as comm.py charges
them, so the same program gives the same counts and clocks on both backends.
"""

from __future__ import annotations

import hashlib
import os
import time

import numpy as np

from .checks import OPS, check_out, check_payload, check_separate, check_tag
from .comm import Communicator, _destination
from .header import HEADER_WITH_SHAPE, NDIM_BYTE, Meta, pack_header, read_header
from .layout import HEADER_BYTES
from .ledger import Ledger, Stats, _size

SHORT_BYTES = 64 * 1024           # payloads up to this size travel in the header's message
WHOLE, HEAD, BODY = 1, 2, 3       # MPI tags: a packed short message, a long one's header, its payload
MPI_OPS = {"sum": "SUM", "max": "MAX", "min": "MIN", "prod": "PROD"}


class MPICommunicator(Communicator):
    """A group of MPI ranks that exchange NumPy arrays. Built by ``run`` under MPI; sub-groups by ``split``.

    mpi_comm: the mpi4py communicator of this group; ranks: the run's ranks of its members (new-rank
    order); waiting: a one-item list where the rank writes what it waits for (the watchdog prints it).
    """

    def __init__(self, MPI, mpi_comm, ledger: Ledger, ranks: list[int], comm_id: int = 0,
                 eager_bytes: int = 2 * 2**20, waiting: list | None = None):
        self._MPI, self._mpi, self._ledger, self._id = MPI, mpi_comm, ledger, comm_id
        self._ranks = list(ranks)
        self.rank, self.world_size = mpi_comm.Get_rank(), mpi_comm.Get_size()
        self.stats = Stats()
        self._call, self._call_name, self._splits = 0, "", 0
        self._verbose = os.environ.get("MINIDIST_VERBOSE", "") not in ("", "0")
        self._eager, self._waiting = eager_bytes, waiting if waiting is not None else [""]
        self._seq = [0] * self.world_size
        self._pending: list = []               # (request, buffer) of eager sends still in flight
        self._inbox = bytearray(HEADER_BYTES + SHORT_BYTES + 64)
        self._status, self._BYTE = MPI.Status(), MPI.BYTE

    def __repr__(self) -> str:
        return f"MPICommunicator(rank={self.rank}, world_size={self.world_size}, world_ranks={self._ranks})"

    # -- point to point ---------------------------------------------------------------------------------
    def send(self, array: np.ndarray, dst: int, tag: int = 0) -> None:
        """As ``Communicator.send``: returns once the message is on its way (a copy up to the eager
        limit; a longer message waits for the receiver)."""
        world_dst, data, tag = self._peer(dst, "dst"), check_payload(array), check_tag(tag)
        arrival = self._ledger.send(data.nbytes, world_dst)
        self._post(data, dst, tag, arrival, eager=True)
        self._count_send(data, dst, world_dst, tag)

    def recv(self, src: int, tag: int = 0, out: np.ndarray | None = None, op: str | None = None,
             base: np.ndarray | None = None) -> np.ndarray:
        """As ``Communicator.recv``: the next message from ``src``, checked, into ``out`` (with ``op``:
        out = op(base or out, incoming))."""
        _, tag, ufunc = self._peer(src, "src"), check_tag(tag), check_out(out, op, base)      # (checks src)
        if base is not None:
            check_separate(out, base)
        return self._receive(src, tag, out, ufunc, base)

    def sendrecv(self, sendbuf: np.ndarray, dst: int, src: int, sendtag: int = 0, recvtag: int = 0,
                 out: np.ndarray | None = None, op: str | None = None,
                 base: np.ndarray | None = None) -> np.ndarray:
        """As ``Communicator.sendrecv``: send to ``dst`` and receive from ``src`` at once."""
        world_dst, data, sendtag = self._peer(dst, "dst"), check_payload(sendbuf), check_tag(sendtag)
        _, recvtag, ufunc = self._peer(src, "src"), check_tag(recvtag), check_out(out, op, base)
        if out is not None:
            check_separate(out, base, sendbuf)
        arrival = self._ledger.send(data.nbytes, world_dst)
        if data.nbytes <= SHORT_BYTES:           # the usual short case: one MPI_Sendrecv
            self._count_send(data, dst, world_dst, sendtag)
            self._wait(self._mpi.Sendrecv, [self._pack(data, dst, sendtag, arrival), self._BYTE], dst, WHOLE,
                       [self._inbox, self._BYTE], src, self._MPI.ANY_TAG, self._status,
                       what=f"sendrecv with ranks {dst} and {src}")
            return self._receive(src, recvtag, out, ufunc, base, arrived=True)
        requests = self._post(data, dst, sendtag, arrival, eager=False)
        self._count_send(data, dst, world_dst, sendtag)
        result = self._receive(src, recvtag, out, ufunc, base)
        if requests:
            self._wait(self._MPI.Request.Waitall, requests, what=f"send to rank {dst}")
        return result

    # -- agreement: barrier, all_equal, split -------------------------------------------------------------
    def barrier(self) -> None:
        """As ``Communicator.barrier``: every clock jumps to the latest (MPI_Allreduce of the clocks)."""
        latest = self._wait(self._mpi.allreduce, self._ledger.clock, self._MPI.MAX, what="barrier")
        self._ledger.record("barrier", latest, "barrier")

    def all_equal(self, value: int) -> bool:
        """As ``Communicator.all_equal``: True on every rank iff every rank passed the same int."""
        mine = np.array([int(value), -int(value)], dtype=np.int64)
        low_high = np.empty(2, np.int64)
        self._wait(self._mpi.Allreduce, mine, low_high, self._MPI.MAX, what="all_equal")
        return int(low_high[0]) == -int(low_high[1])

    def split(self, color: int | None, key: int | None = None) -> MPICommunicator | None:
        """As ``Communicator.split`` (MPI_Comm_split: new ranks ordered by key, ties by old rank)."""
        if color is not None and not isinstance(color, (int, np.integer)):
            raise TypeError(f"split expects an int color or None, got {type(color).__name__}")
        key = self.rank if key is None else int(key)
        mpi_color = self._MPI.UNDEFINED if color is None else int(color)
        new = self._wait(self._mpi.Split, mpi_color, key, what="split")
        self._splits += 1
        if color is None:
            return None
        ranks = [self._ranks[r] for r in new.allgather(self.rank)]
        digest = hashlib.blake2b(repr((self._id, self._splits, int(color))).encode(), digest_size=8)
        comm_id = int.from_bytes(digest.digest(), "little") >> 1
        return MPICommunicator(self._MPI, new, self._ledger, ranks, comm_id,
                               self._eager, self._waiting)

    def mpi_allreduce(self, flat: np.ndarray, op: str) -> np.ndarray:
        """MPI_Allreduce of the 1-D array ``flat`` in place (op: sum/max/min/prod); returns flat.
        For comparison only: not counted in stats nor charged to the simulated clock."""
        self._wait(self._mpi.Allreduce, self._MPI.IN_PLACE, flat, getattr(self._MPI, MPI_OPS[op]),
                   what="MPI_Allreduce")
        return flat

    # -- the transport ------------------------------------------------------------------------------------
    def _post(self, data: np.ndarray, dst: int, tag: int, arrival: float, eager: bool) -> list:
        """Start sending ``data`` with its header; return the requests the caller must still complete."""
        MPI, nbytes = self._MPI, data.nbytes
        if nbytes <= SHORT_BYTES:
            packed = self._pack(data, dst, tag, arrival)
            self._pending.append((self._mpi.Isend([packed, MPI.BYTE], dst, WHOLE), packed))
            self._prune()
            return []
        self._seq[dst] += 1
        header = pack_header(self._seq[dst], self._id, self._call, tag, data, arrival, 0)
        head = self._mpi.Isend([header, MPI.BYTE], dst, HEAD)
        if eager and nbytes <= self._eager:      # a copy, so the caller may change its array at once
            body = data.reshape(-1).view(np.uint8).copy()
            self._pending += [(head, header), (self._mpi.Isend([body, MPI.BYTE], dst, BODY), body)]
            self._prune()
            return []
        body = self._mpi.Isend([data.reshape(-1).view(np.uint8), MPI.BYTE], dst, BODY)
        if eager:
            self._wait(MPI.Request.Waitall, [head, body], what=f"send to rank {dst} (until it receives)")
            return []
        return [head, body]

    def _pack(self, data: np.ndarray, dst: int, tag: int, arrival: float) -> bytes:
        """A short message as one buffer: header, padding to a multiple of 64 bytes, payload."""
        self._seq[dst] += 1
        header = pack_header(self._seq[dst], self._id, self._call, tag, data, arrival, 0)
        return b"".join((header, bytes(_payload_offset(data.ndim) - len(header)), data.tobytes()))

    def _receive(self, src: int, tag: int, out, ufunc, base, arrived: bool = False) -> np.ndarray:
        """Receive the next message from ``src`` (``arrived``: its first part is in the inbox already):
        its header, checked, then its payload into place."""
        status = self._status
        if not arrived:
            self._wait(self._mpi.Recv, [self._inbox, self._BYTE], src, self._MPI.ANY_TAG, status,
                       what=f"recv from rank {src} (tag {tag})")
        meta = _read(self._inbox)
        self._check_header(src, tag, meta, out)
        target, how, onto = _destination(meta, out, ufunc, base)
        if status.Get_tag() == WHOLE:
            start = _payload_offset(len(meta.shape))
            incoming = np.frombuffer(self._inbox, np.uint8, meta.nbytes, start).view(meta.dtype)
            incoming = incoming.reshape(meta.shape)
        elif how is None:                        # straight into place
            incoming = None
            self._wait(self._mpi.Recv, [target.reshape(-1).view(np.uint8), self._MPI.BYTE], src, BODY,
                       what=f"recv from rank {src} (tag {tag})")
        else:
            incoming = np.empty(meta.shape, meta.dtype)
            self._wait(self._mpi.Recv, [incoming.reshape(-1).view(np.uint8), self._MPI.BYTE], src, BODY,
                       what=f"recv from rank {src} (tag {tag})")
        if incoming is not None:
            if how is None:
                target[...] = incoming
            else:
                how(target if onto is None else onto, incoming, out=target)
        return self._received(src, tag, meta, target, out, ufunc, base)

    def _wait(self, call, *args, what: str = ""):
        """Run a blocking MPI call, with what this rank waits for written down for the watchdog."""
        self._waiting[0] = what
        result = call(*args)
        self._waiting[0] = ""
        return result

    def _prune(self) -> None:
        """Forget eager sends that have completed (their buffers can go)."""
        if len(self._pending) > 32:
            self._pending = [(r, b) for r, b in self._pending if not r.Test()]

    def finish(self, deadline: float) -> None:
        """At the end of the run: let the eager sends still in flight complete (until ``deadline``,
        time.monotonic(); then leave them, as a message nobody receives)."""
        while self._pending and time.monotonic() < deadline:
            self._pending = [(r, b) for r, b in self._pending if not r.Test()]
            if self._pending:
                time.sleep(0.001)

    def _count_send(self, data: np.ndarray, dst: int, world_dst: int, tag: int) -> None:
        self.stats.bytes_sent += data.nbytes
        self.stats.messages_sent += 1
        if self._verbose:
            print(f"rank {self.rank} -> {dst}  tag {tag}  {_size(data.nbytes)}  step {self._seq[dst]}",
                  flush=True)


def _payload_offset(ndim: int) -> int:
    """Where the payload starts in a packed message: after the header, at a multiple of 64 bytes."""
    return -(-HEADER_WITH_SHAPE[ndim].size // 64) * 64


def _read(inbox: bytearray) -> Meta:
    return read_header(memoryview(inbox), 0)


assert NDIM_BYTE < HEADER_BYTES and set(MPI_OPS) == set(OPS)

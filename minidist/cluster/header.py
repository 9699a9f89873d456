"""What rides in the first slot of every message: its header.

    seq, comm, call, tag, nbytes, arrival, kind, ndim, dtype name, shape[0], ..., shape[ndim - 1]

``seq`` numbers the messages from one rank to another; ``comm`` is the communicator's id (sub-
communicators from ``split`` have their own), ``call`` the checksum of the collective call in progress
(0: a plain send; see ``Communicator.collective``), ``arrival`` the message's arrival time on the
simulated clock, ``kind`` a user message or one of the communicator's own (barrier, split, all_equal),
with the REMOTE bit set when the payload stays in the sender's array (cross_memory.py).
The dtype travels as its whole name ('<f4', '<m8[25s]'), the shape as one int64 per dimension.
"""

from __future__ import annotations

import functools
import struct
from typing import NamedTuple

import numpy as np

from .layout import HEADER_BYTES, MAX_DIMS

DTYPE_CHARS = 32       # the longest dtype name numpy makes is 17 characters: "<m8[2147483647as]"
# seq, comm, call, tag, nbytes, arrival, kind, ndim, dtype name (``call``: see Communicator.collective)
HEADER = struct.Struct(f"<QQQqQdii{DTYPE_CHARS}s")
# HEADER followed by the shape, one Struct per number of dimensions (packed and unpacked in one call)
HEADER_WITH_SHAPE = [struct.Struct(HEADER.format + "q" * ndim) for ndim in range(MAX_DIMS + 1)]
assert HEADER_WITH_SHAPE[MAX_DIMS].size <= HEADER_BYTES
NDIM_BYTE = struct.calcsize("<QQQqQdi")          # where ndim sits in the header (its low byte: ndim <= 32)
REMOTE = 1 << 30                 # a bit of ``kind``: the payload stays in the sender's memory (messages.py)


class Meta(NamedTuple):
    """A message header as the receiver sees it (the fields in the header's order)."""

    seq: int
    comm: int
    call: int
    tag: int
    nbytes: int
    arrival: float
    kind: int
    dtype: np.dtype
    shape: tuple
    remote: bool = False     # the payload stays in the sender's array: the slot holds its pid and address

    def describe(self) -> str:
        return f"tag {self.tag}, {self.dtype} {self.shape}, {self.nbytes} bytes"


def pack_header(seq: int, comm: int, call: int, tag: int, data: np.ndarray, arrival: float,
                kind: int) -> bytes:
    """The header of a message of ``data`` (C-contiguous, up to 32 dims) as bytes for its first slot."""
    return HEADER_WITH_SHAPE[data.ndim].pack(seq, comm, call, tag, data.nbytes, arrival, kind, data.ndim,
                                             _dtype_code(data.dtype), *data.shape)


def read_header(buf, offset: int) -> Meta:
    """The header at byte ``offset`` of the shared block ``buf`` (a memoryview)."""
    ndim = buf[offset + NDIM_BYTE]          # read first: it says which Struct unpacks the rest
    fields = HEADER_WITH_SHAPE[ndim].unpack_from(buf, offset)       # ..., kind, ndim, dtype code, *shape
    kind = fields[6]
    if kind & REMOTE:
        return Meta(*fields[:6], kind & ~REMOTE, _dtype(fields[8]), fields[9:], True)
    return Meta._make((*fields[:7], _dtype(fields[8]), fields[9:], False))


@functools.lru_cache(maxsize=256)
def _dtype(code: bytes) -> np.dtype:
    """The dtype of a header's code: b'<f4\\0\\0...' -> float32."""
    return np.dtype(code.rstrip(b"\0").decode())


@functools.lru_cache(maxsize=256)
def _dtype_code(dtype: np.dtype) -> bytes:
    """A dtype as the header carries it: float32 -> b'<f4' (the array-interface string, whole)."""
    code = dtype.str.encode()
    if len(code) > DTYPE_CHARS:       # checks.check_payload refuses these before anything is sent
        raise ValueError(f"a dtype name of at most {DTYPE_CHARS} characters can be sent, got {dtype.str!r}")
    return code

"""Argument checks of the Communicator: every bad argument gets a TypeError/ValueError saying what was
expected, before anything is sent or received. Each check starts with a fast path for the usual case
(plain ints, arrays of a dtype already seen), because a short message costs only a few microseconds
and these checks run on every one.
"""

from __future__ import annotations

import numpy as np

from .header import DTYPE_CHARS

OPS = {"sum": np.add, "max": np.maximum, "min": np.minimum, "prod": np.multiply}


class MessageMismatchError(ValueError):
    """The next message from a rank is not the one the receiver asked for (tag, dtype or shape)."""


def check_payload(array) -> np.ndarray:
    """The array to send (C-contiguous: a copy if ``array`` is not), or TypeError/ValueError."""
    if type(array) is np.ndarray and array.dtype in _SENDABLE and array.flags.c_contiguous \
            and array.ndim <= 32:                                            # the usual case
        return array
    if isinstance(array, np.generic):
        array = np.asarray(array)
    if not isinstance(array, np.ndarray):
        raise TypeError(f"send expects a numpy array, got {type(array).__name__}")
    if array.dtype.hasobject or array.dtype.fields is not None or np.dtype(array.dtype.str) != array.dtype:
        raise TypeError(f"send expects a numeric, bool or string dtype, got {array.dtype} (views such as "
                        f"x.view(np.uint16) carry other types)")
    if len(array.dtype.str) > DTYPE_CHARS:
        raise ValueError(f"send carries a dtype's name in at most {DTYPE_CHARS} characters; "
                         f"{array.dtype.str!r} has {len(array.dtype.str)}")
    if array.ndim > 32:
        raise ValueError(f"send supports up to 32 dimensions, got {array.ndim}")
    _SENDABLE.add(array.dtype)
    return array if array.flags.c_contiguous else np.ascontiguousarray(array).reshape(array.shape)


_SENDABLE: set[np.dtype] = set()      # dtypes that passed the checks above once


def check_tag(tag) -> int:
    """``tag`` as an int in [0, 2**62), or ValueError."""
    if type(tag) is int and 0 <= tag < 2**62:
        return tag
    if not isinstance(tag, (int, np.integer)) or isinstance(tag, bool) or not 0 <= tag < 2**62:
        raise ValueError(f"tag must be an int >= 0, got {tag!r}")
    return int(tag)


def check_out(out, op, base):
    """Check recv's ``out``, ``op`` and ``base``; return the ufunc of ``op`` (None: plain copy)."""
    if op is None and base is None and (out is None or type(out) is np.ndarray and out.flags.writeable):
        return None                                                 # the usual case
    if out is not None and not isinstance(out, np.ndarray):
        raise TypeError(f"out must be a numpy array, got {type(out).__name__}")
    if out is not None and not out.flags.writeable:
        raise ValueError("out must be writeable")
    ufunc = _check_op(op, out)
    if base is not None:
        _check_base(base, out, op)
    return ufunc


def check_separate(out, base, sendbuf=None) -> None:
    """Refuse overlapping buffers (ValueError): ``out`` (what is received into) must share no memory with
    ``sendbuf`` (sendrecv's outgoing array) nor with ``base`` — except that ``base`` may be ``out`` itself
    (the same view: ``out = op(out, incoming)``). A message streams through the mailbox segment by
    segment, so overlapping buffers would mix old and new values; MPI forbids them too."""
    if out is None:
        return
    if sendbuf is not None and np.shares_memory(sendbuf, out):
        raise ValueError("sendrecv's send array and out= overlap (they share memory): the message would "
                         "overwrite what is still being sent; receive into another array")
    if base is not None and base is not out and np.shares_memory(base, out) and not (
            base.__array_interface__ == out.__array_interface__):
        raise ValueError("base= and out= overlap (they share memory) without being the same array; pass "
                         "out itself as base, or arrays that do not overlap")


def _check_base(base, out, op) -> None:
    if op is None:
        raise ValueError("base= is what op= combines with the message: give op= too")
    if not isinstance(base, np.ndarray):
        raise TypeError(f"base must be a numpy array, got {type(base).__name__}")
    if out is not None and (base.shape != out.shape or base.dtype != out.dtype):
        raise ValueError(f"base must have out's dtype and shape {out.dtype} {out.shape}, got {base.dtype} "
                         f"{base.shape}")


def _check_op(op, out):
    if op is None:
        return None
    if op not in OPS:
        raise ValueError(f"op must be one of {sorted(OPS)} or None, got {op!r}")
    if out is None:
        raise ValueError(f"op={op!r} combines into out=: give the array to combine into")
    return OPS[op]

"""Diagnosing ErrorFeedback.compress in its own terms: which step, and whether the message or the
residual went wrong, with what the wrong residual reads as.

Error feedback (Seide et al.'s 1-bit SGD, Lin et al.'s DGC): c_t = g_t + r_(t−1), message_t =
encode(c_t), r_t = c_t − decode(message_t). With a top-k codec on integer gradients every value is exact,
so each step's decoded message and residual are compared bitwise with these three lines.
"""

import numpy as np

from minidist.parallel.compression import TopK

#: three steps of a 5-element gradient, chosen so that top-2 leaves a different residual every step
GRADIENTS = np.array([[4.0, -1.0, 2.0, 0.0, -3.0],
                      [-1.0, 3.0, 1.0, 2.0, 2.0],
                      [1.0, -2.0, -4.0, 1.0, 0.0]])
N, K = GRADIENTS.shape[1], 2


def _reads_as(got: np.ndarray, g: np.ndarray, c: np.ndarray, sent: np.ndarray, previous: np.ndarray) -> str:
    """What a wrong residual is, among the usual slips."""
    slips = {"g_t − decode(message): r_(t−1) was not added to the gradient": g - sent,
             "decode(message) − c_t: the sign is flipped": sent - c,
             "r_(t−1) + c_t − decode(message): added to the old residual instead of replacing it":
                 previous + c - sent,
             "r_(t−1): the residual was not updated": previous}
    for name, value in slips.items():
        if np.array_equal(got, value):
            return f", which is {name}"
    return ""


def diagnose_error_feedback(error_feedback_class) -> str | None:
    """The first step at which ``error_feedback_class(TopK(5, k=2))`` sends or keeps the wrong thing."""
    what = f"ErrorFeedback(TopK(n={N}, k={K})), gradients {GRADIENTS.tolist()}"
    codec = TopK(N, k=K, dtype=np.float64)
    ef = error_feedback_class(TopK(N, k=K, dtype=np.float64))
    residual = np.zeros(N)
    for t, g in enumerate(GRADIENTS, start=1):
        c = g + residual
        sent = codec.decode(codec.encode(c))
        try:
            message = ef.compress(g.copy())
        except Exception as err:  # noqa: BLE001 - the message names what was raised
            return f"{what}: step {t}: compress raised {type(err).__name__}: {err}"
        got = ef.decode(message)
        if not np.array_equal(got, sent):
            return (f"{what}: step {t}: the message should be the top-{K} of c_{t} = g_{t} + r_{t - 1} = "
                    f"{c.tolist()}, decoding to {sent.tolist()}; it decodes to {got.tolist()}")
        kept = np.asarray(ef.residual, dtype=np.float64)
        if kept.shape != (N,) or not np.array_equal(kept, c - sent):
            off = "" if kept.shape != (N,) else f" (element {int(np.flatnonzero(kept != c - sent)[0])} off)"
            return (f"{what}: step {t}: the residual r_{t} should be c_{t} − decode(message) = "
                    f"{(c - sent).tolist()}; it is {kept.tolist()}{off}"
                    f"{_reads_as(kept, g, c, sent, residual) if kept.shape == (N,) else ''}")
        residual = c - sent
    return None

"""Diagnosing a backward pass in its own terms: which of dX, dW, db is wrong and the first index off.

Each gradient is compared with float64 central differences of L = Σ g ⊙ f(x) (g random, as
minidist.nn.gradcheck does); the first array off (dX, then the parameters in order) is reported with its
first wrong index, expected and got. A second backward must add into the parameters' .grad (2× the first).
"""

import numpy as np

from minidist.nn.gradcheck import numerical_gradient

NAMES = {"input": "dX", "weight": "dW", "bias": "db"}


def first_off(name: str, got: np.ndarray, want: np.ndarray, rtol: float = 1e-6) -> str | None:
    """None when got matches want on the scale of the whole array; else where it first differs."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if got.shape != want.shape:
        return f"{name}: shape {got.shape}, expected {want.shape}"
    scale = max(np.abs(want).max(initial=0.0), 1e-30)
    off = np.abs(got - want) > rtol * scale
    if not off.any():
        return None
    i = tuple(int(k) for k in np.argwhere(off)[0])
    return (f"{name}: first index off {i}: expected {want[i]:.6g}, got {got[i]:.6g} "
            f"({int(off.sum())} of {off.size} elements off)")


def diagnose_backward(module, x: np.ndarray, rng: np.random.Generator, what: str) -> str | None:
    """The first wrong gradient of ``module`` at float64 input x, named dX / dW / db (or d<name>)."""
    upstream = rng.standard_normal(module.forward(x).shape)

    def loss() -> float:
        return float(np.sum(upstream * module.forward(x)))

    module.zero_grad()
    module.forward(x)
    dx = module.backward(upstream)
    analytic = {name: p.grad.copy() for name, p in module.named_parameters()}
    if dx is not None:
        wrong = first_off("dX", dx, numerical_gradient(loss, x))
        if wrong:
            return f"{what} backward: {wrong}"
    for name, p in module.named_parameters():
        label = NAMES.get(name.split(".")[-1], f"d{name}")
        wrong = first_off(label, analytic[name], numerical_gradient(loss, p.data))
        if wrong:
            return f"{what} backward: {wrong}"
    module.forward(x)
    module.backward(upstream)
    for name, p in module.named_parameters():
        label = NAMES.get(name.split(".")[-1], f"d{name}")
        if first_off(label, p.grad, 2 * analytic[name]):
            return (f"{what} backward: a second backward should add into {name}.grad ({label} twice); it "
                    f"holds {first_off(label, p.grad, 2 * analytic[name])} — add, do not assign")
    return None


def softmax_jacobian_product(y: np.ndarray, dy: np.ndarray, axis: int) -> np.ndarray:
    """Jᵀ·dy with the Jacobian diag(y) − y·yᵀ of every softmax row along ``axis`` built explicitly."""
    y_rows, dy_rows = np.moveaxis(y, axis, -1), np.moveaxis(dy, axis, -1)
    jacobian = np.einsum("...i,ij->...ij", y_rows, np.eye(y_rows.shape[-1])) - \
        np.einsum("...i,...j->...ij", y_rows, y_rows)
    return np.moveaxis(np.einsum("...ij,...j->...i", jacobian, dy_rows), -1, axis)


def diagnose_softmax_backward(softmax_backward, rng: np.random.Generator) -> str | None:
    """The first axis along which softmax_backward(y, dy, axis) differs from Jᵀ·dy, with its index."""
    x = rng.standard_normal((2, 3, 4))
    for axis in (-1, 0, 1):
        y = np.exp(x - x.max(axis=axis, keepdims=True))
        y /= y.sum(axis=axis, keepdims=True)
        dy = rng.standard_normal(x.shape)
        wrong = first_off("dx", softmax_backward(y, dy, axis=axis), softmax_jacobian_product(y, dy, axis))
        if wrong:
            return f"softmax_backward along axis {axis} of shape {x.shape}: {wrong}"
    return None


def diagnose_cross_entropy(loss_class, rng: np.random.Generator) -> str | None:
    """The first dlogits of ``loss_class().backward()`` off from central differences of the mean loss,
    for (N, C) and (B, T, C) logits, named by shape and first index (expected: (softmax − onehot) / N)."""
    for shape in ((4, 3), (1, 5), (2, 3, 4)):
        logits = 3 * rng.standard_normal(shape)
        target = rng.integers(0, shape[-1], shape[:-1])
        criterion = loss_class()
        criterion.forward(logits, target)
        got = criterion.backward()
        want = numerical_gradient(lambda z=logits, t=target: loss_class().forward(z, t), logits)
        wrong = first_off("dlogits", got, want)
        if wrong:
            n = int(np.prod(shape[:-1]))
            return (f"CrossEntropyLoss backward, logits {shape}, N = {n} positions: {wrong} "
                    f"(expected (softmax − onehot(t)) / {n})")
    return None


LSTM_GATES = "ifgo"


def diagnose_lstm_cell(cell_forward, cell_backward, rng: np.random.Generator) -> str | None:
    """The first of dgates (by gate i, f, g, o) and dc_prev that lstm_cell_backward gets wrong, against
    central differences of L = Σ gh ⊙ h + Σ gc ⊙ c through lstm_cell_forward, with the first index off."""
    n, hidden = 3, 2
    gates, c_prev = rng.standard_normal((n, 4 * hidden)), rng.standard_normal((n, hidden))
    gh, gc = rng.standard_normal((n, hidden)), rng.standard_normal((n, hidden))

    def loss() -> float:
        h, c, _ = cell_forward(gates, c_prev)
        return float(np.sum(gh * h) + np.sum(gc * c))

    dgates, dc_prev = cell_backward(gh, gc, cell_forward(gates, c_prev)[2])
    want_gates, want_c = numerical_gradient(loss, gates), numerical_gradient(loss, c_prev)
    if np.shape(dgates) != want_gates.shape:
        return f"lstm_cell_backward: dgates shape {np.shape(dgates)}, expected {want_gates.shape} (N, 4H)"
    for k, gate in enumerate(LSTM_GATES):
        cols = slice(k * hidden, (k + 1) * hidden)
        wrong = first_off(f"dgates of gate {gate} (columns {cols.start}:{cols.stop})",
                          np.asarray(dgates)[:, cols], want_gates[:, cols], rtol=1e-6)
        if wrong:
            return f"lstm_cell_backward (N={n}, H={hidden}, gates i, f, g, o): {wrong}"
    wrong = first_off("dc_prev", dc_prev, want_c)
    return f"lstm_cell_backward (N={n}, H={hidden}): {wrong}" if wrong else None

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

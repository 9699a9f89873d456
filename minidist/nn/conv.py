"""Convolution, pooling and flattening on NCHW images, vectorised with im2col.

Shapes (PyTorch's names): x (N, C, H, W), weight (O, C, kh, kw), bias (O,), y (N, O, Ho, Wo) with
    Ho = ⌊(H + 2·ph − kh) / sh⌋ + 1,   Wo = ⌊(W + 2·pw − kw) / sw⌋ + 1.

im2col turns the convolution into matrix products. Output pixel (i, j) of sample n sees the window
xp[n, :, i·sh : i·sh+kh, j·sw : j·sw+kw] of the zero-padded input xp; written as a column of K = C·kh·kw
numbers, the Ho·Wo windows of sample n form X_n (K, Ho·Wo). With W = weight as a matrix (O, K):

Forward:   Y_n = W · X_n + b                 (O, Ho·Wo)  = y[n] reshaped; the result is NCHW already
Backward:  dW  = Σ_n dY_n · X_nᵀ             (O, K)      "the weight update performs a convolution on
           db  = Σ_n Σ_pixels dY_n                        large images to create small windows of kernels"
           dX_n = Wᵀ · dY_n                  (K, Ho·Wo), then col2im: every window's column is added
                                                          back onto the pixels it was read from.

The batch's columns lie side by side, X = [X_1 … X_N] (K, N·Ho·Wo): dW = dY·Xᵀ is one product, the sum over
n its inner dimension. dX puts the batch last (K, Ho·Wo·N): col2im adds rows of Wo·N numbers, not Wo (NumPy
pays per row: rows of 14 made col2im slower than the product); the NCHW dx is one transposed copy at the end.

These are the three-layer formulas in column form (dX = Wᵀ·dY, dW = dY·Xᵀ; the HOT CHIPS tutorial
"Fundamentals of Scaling out DL Training"), with the windows as the batch: "if you ignore the convolution
with sliding window, the operation is identical to MLP" (the "Hardware Accelerators for Training Deep Neural
Networks" slides, "Dualities in Training Convolution Layers"). The windows are read with
``numpy.lib.stride_tricks.sliding_window_view``, so there is no Python loop over pixels; col2im and the
pools loop over the kh·kw kernel offsets only, each step handling that offset of every window at once.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from minidist.nn.checks import is_count

from .module import Module, Parameter, check_float_array, resolve_rng


def _pair(value, name: str, minimum: int) -> tuple[int, int]:
    """An int or a pair of ints -> (height value, width value), each >= minimum."""
    pair = (value, value) if isinstance(value, (int, np.integer)) else tuple(value)
    if len(pair) != 2 or not all(is_count(v, minimum) for v in pair):
        raise ValueError(f"{name} must be an int >= {minimum} or a pair of them, got {value!r}")
    return int(pair[0]), int(pair[1])


def _check_image(x, what: str, channels: int | None, kernel, padding) -> tuple[int, int]:
    """Validate an NCHW float input; return the padded height and width."""
    check_float_array(x, what, ndim=4)
    if channels is not None and x.shape[1] != channels:
        raise ValueError(f"{what}: expected {channels} channels (input of shape (N, {channels}, H, W)), "
                         f"got shape {x.shape}")
    hp, wp = x.shape[2] + 2 * padding[0], x.shape[3] + 2 * padding[1]
    if kernel[0] > hp or kernel[1] > wp:
        raise ValueError(f"{what}: kernel {kernel} is larger than the padded input ({hp}, {wp}) "
                         f"(input {x.shape[2:]}, padding {padding})")
    return hp, wp


def _pad(x: np.ndarray, padding: tuple[int, int], value: float = 0.0) -> np.ndarray:
    (ph, pw), (n, c, h, w) = padding, x.shape
    if ph == 0 and pw == 0:
        return x
    xp = np.full((n, c, h + 2 * ph, w + 2 * pw), value, dtype=x.dtype)
    xp[:, :, ph:ph + h, pw:pw + w] = x  # (np.pad does the same, at 2-3× the time)
    return xp


def _windows(xp: np.ndarray, kernel: tuple[int, int], stride: tuple[int, int]) -> np.ndarray:
    """A view (N, C, Ho, Wo, kh, kw) of every kernel window of the padded input; nothing is copied."""
    return sliding_window_view(xp, kernel, axis=(2, 3))[:, :, ::stride[0], ::stride[1]]


def _output_size(size: int, kernel: int, stride: int) -> int:
    return (size - kernel) // stride + 1  # size already includes the padding


class Conv2d(Module):
    """2-D cross-correlation (torch.nn.Conv2d), weight initialised U(−1/√fan_in, 1/√fan_in) as PyTorch.

    kernel_size, stride and padding are ints or (height, width) pairs; padding adds zeros.
    ``input_grad=False`` skips dx (its product and col2im; backward returns None), as Linear's: the step
    runner sets it on a network's first layer, whose input is the batch.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0,
                 bias: bool = True, *, rng: np.random.Generator | None = None, dtype=np.float32,
                 input_grad: bool = True):
        if int(in_channels) < 1 or int(out_channels) < 1:
            raise ValueError(f"Conv2d needs in_channels, out_channels >= 1, "
                             f"got {in_channels}, {out_channels}")
        rng = resolve_rng(rng)
        self.in_channels, self.out_channels = int(in_channels), int(out_channels)
        self.kernel_size = _pair(kernel_size, "Conv2d kernel_size", 1)
        self.stride = _pair(stride, "Conv2d stride", 1)
        self.padding = _pair(padding, "Conv2d padding", 0)
        kh, kw = self.kernel_size
        bound = 1.0 / np.sqrt(in_channels * kh * kw)
        self.weight = Parameter(rng.uniform(-bound, bound, (out_channels, in_channels, kh, kw)).astype(dtype))
        self.bias = Parameter(rng.uniform(-bound, bound, out_channels).astype(dtype)) if bias else None
        self.input_grad = bool(input_grad)
        self._cols: np.ndarray | None = None

    def forward(self, x: np.ndarray) -> np.ndarray:
        """x: input, shape (N, C, H, W); returns y, shape (N, O, Ho, Wo)."""
        _check_image(x, "Conv2d input", self.in_channels, self.kernel_size, self.padding)
        n, _, ho, wo = self.output_shape(x.shape)
        self.remember_output_shape((n, self.out_channels, ho, wo))
        windows = _windows(_pad(x, self.padding), self.kernel_size, self.stride)  # (N, C, Ho, Wo, kh, kw)
        # im2col: X_n has one column per output pixel and one row per (c, di, dj); X_n = cols[:, n]. This copy
        # is the memory the layer keeps for backward: kh·kw times the input, for stride 1.
        self._cols = windows.transpose(1, 4, 5, 0, 2, 3).reshape(-1, n, ho * wo)  # (K, N, Ho·Wo)
        self._input_shape = x.shape
        w_mat = self.weight.data.reshape(self.out_channels, -1)                   # W, (O, K)
        y = w_mat @ self._cols.transpose(1, 0, 2)  # (N, O, Ho·Wo): W·X_n, a product per sample on a view
        if self.bias is not None:
            y += self.bias.data[:, None]
        return y.reshape(n, self.out_channels, ho, wo)

    def backward(self, dy: np.ndarray) -> np.ndarray | None:
        """dy: upstream gradient, shape (N, O, Ho, Wo); returns dx, shape (N, C, H, W) (None with
        input_grad=False); adds dW (O, C, kh, kw) into weight.grad and db (O,) into bias.grad."""
        self.check_upstream(dy)
        # BEGIN SOLUTION conv2d_backward
        n, c, h, w = self._input_shape
        (kh, kw), (sh, sw), (ph, pw) = self.kernel_size, self.stride, self.padding
        o, ho, wo = self.out_channels, dy.shape[2], dy.shape[3]
        dy_mat = dy.reshape(n, o, ho * wo).transpose(1, 0, 2).reshape(o, -1)     # dY, (O, N·Ho·Wo)
        cols = self._cols.reshape(-1, n * ho * wo)                                # X, (K, N·Ho·Wo)
        self.weight.grad += (dy_mat @ cols.T).reshape(self.weight.shape)          # dW = dY·Xᵀ = Σ_n dY_n·X_nᵀ
        if self.bias is not None:
            self.bias.grad += dy.sum(axis=(0, 2, 3))
        if not self.input_grad:
            return None
        dy_last = dy.transpose(1, 2, 3, 0).reshape(o, -1)                     # dY batch last, (O, Ho·Wo·N)
        dx_cols = (self.weight.data.reshape(o, -1).T @ dy_last).reshape(c, kh, kw, ho, wo, n)  # Wᵀ·dY
        # col2im: offset (di, dj) of window (i, j) was read from xp[n, :, i·sh + di, j·sw + dj]
        dxp = np.zeros((c, h + 2 * ph, w + 2 * pw, n), dtype=dx_cols.dtype)      # padded dx, batch last
        for di in range(kh):
            for dj in range(kw):
                dxp[:, di:di + sh * ho:sh, dj:dj + sw * wo:sw] += dx_cols[:, di, dj]
        return np.ascontiguousarray(dxp[:, ph:ph + h, pw:pw + w].transpose(3, 0, 1, 2))  # NCHW
        # END SOLUTION

    def output_shape(self, input_shape: tuple[int, ...]) -> tuple[int, int, int, int]:
        n, _, h, w = input_shape
        return (n, self.out_channels,
                _output_size(h + 2 * self.padding[0], self.kernel_size[0], self.stride[0]),
                _output_size(w + 2 * self.padding[1], self.kernel_size[1], self.stride[1]))

    def flops(self, input_shape: tuple[int, ...]) -> int:
        """Forward FLOPs 2·N·O·Ho·Wo·C·kh·kw (multiply-add = 2; the bias is not counted, as in
        torch.utils.flop_counter). Backward costs twice that."""
        n, o, ho, wo = self.output_shape(input_shape)
        return 2 * n * o * ho * wo * self.in_channels * self.kernel_size[0] * self.kernel_size[1]

    def __repr__(self) -> str:
        return (f"Conv2d({self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}, padding={self.padding}, bias={self.bias is not None})")


class _Pool2d(Module):
    """Shared set-up of the pools: kernel, stride (default: the kernel), padding <= kernel / 2.

    Both pools visit the kh·kw kernel offsets (di, dj): the slice
    xp[:, :, di : di + sh·Ho : sh, dj : dj + sw·Wo : sw] holds that offset of every window, (N, C, Ho, Wo).
    """

    name = "Pool2d"

    def __init__(self, kernel_size, stride=None, padding=0):
        self.kernel_size = _pair(kernel_size, f"{self.name} kernel_size", 1)
        self.stride = self.kernel_size if stride is None else _pair(stride, f"{self.name} stride", 1)
        self.padding = _pair(padding, f"{self.name} padding", 0)
        if any(2 * p > k for p, k in zip(self.padding, self.kernel_size)):
            raise ValueError(f"{self.name}: padding {self.padding} must be at most half the kernel "
                             f"{self.kernel_size} (as in PyTorch)")

    def _padded(self, x: np.ndarray, pad_value: float) -> np.ndarray:
        _check_image(x, f"{self.name} input", None, self.kernel_size, self.padding)
        self._input_shape = x.shape
        self.remember_output_shape(self.output_shape(x.shape))
        return _pad(x, self.padding, pad_value)

    def _offsets(self) -> list[tuple[slice, ...]]:
        """Index of the slice at each kernel offset, in order (di, dj) = (0, 0), (0, 1), ..."""
        _, _, ho, wo = self.output_shape(self._input_shape)
        (kh, kw), (sh, sw) = self.kernel_size, self.stride
        return [(slice(None), slice(None), slice(di, di + sh * ho, sh), slice(dj, dj + sw * wo, sw))
                for di in range(kh) for dj in range(kw)]

    def _unpad(self, dxp: np.ndarray) -> np.ndarray:
        (ph, pw), (h, w) = self.padding, self._input_shape[2:]
        return dxp[:, :, ph:ph + h, pw:pw + w]

    def output_shape(self, input_shape: tuple[int, ...]) -> tuple[int, int, int, int]:
        n, c, h, w = input_shape
        return (n, c, _output_size(h + 2 * self.padding[0], self.kernel_size[0], self.stride[0]),
                _output_size(w + 2 * self.padding[1], self.kernel_size[1], self.stride[1]))

    def flops(self, input_shape: tuple[int, ...]) -> int:
        """kh·kw − 1 comparisons (max) or additions (average) per output, plus one division (average)."""
        n, c, ho, wo = self.output_shape(input_shape)
        per_output = self.kernel_size[0] * self.kernel_size[1] - 1 + isinstance(self, AvgPool2d)
        return n * c * ho * wo * per_output

    def __repr__(self) -> str:
        return f"{self.name}(kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding})"


class MaxPool2d(_Pool2d):
    """Maximum over each window (torch.nn.MaxPool2d; padding counts as −∞).

    Backward sends dy to the position of each window's maximum (the first one on a tie, as PyTorch).
    It keeps the (padded) input and the output; no copy of the input when there is no padding.
    """

    name = "MaxPool2d"

    def forward(self, x: np.ndarray) -> np.ndarray:
        """x: input, shape (N, C, H, W); returns y, shape (N, C, Ho, Wo)."""
        self._xp = self._padded(x, pad_value=-np.inf)
        offsets = self._offsets()
        self._y = self._xp[offsets[0]].copy()
        for index in offsets[1:]:
            np.maximum(self._y, self._xp[index], out=self._y)
        return self._y

    def backward(self, dy: np.ndarray) -> np.ndarray:
        """dy: upstream gradient, shape (N, C, Ho, Wo); returns dx, shape (N, C, H, W)."""
        self.check_upstream(dy)
        disjoint = all(s >= k for s, k in zip(self.stride, self.kernel_size))  # no pixel in two windows
        (sh, sw), (ho, wo) = self.stride, dy.shape[2:]  # tiled: every pixel in one window, all of dx written
        tiled = self.stride == self.kernel_size and self._xp.shape[2:] == (sh * ho, sw * wo)
        dxp = (np.empty if tiled else np.zeros)(self._xp.shape, dtype=dy.dtype)
        routed, hit = np.zeros(dy.shape, dtype=bool), np.empty(dy.shape, dtype=bool)  # routed: max found
        for index in self._offsets():
            np.equal(self._xp[index], self._y, out=hit)
            np.greater(hit, routed, out=hit)      # hit and not routed: the first offset holding the max wins
            routed |= hit
            if disjoint:                          # each pixel receives once: write, do not add
                np.multiply(dy, hit, out=dxp[index])
            else:
                dxp[index] += dy * hit
        return self._unpad(dxp)


class AvgPool2d(_Pool2d):
    """Mean over each window (torch.nn.AvgPool2d with count_include_pad=True: padding zeros count)."""

    name = "AvgPool2d"

    def forward(self, x: np.ndarray) -> np.ndarray:
        """x: input, shape (N, C, H, W); returns y, shape (N, C, Ho, Wo)."""
        xp = self._padded(x, pad_value=0.0)
        offsets = self._offsets()
        total = xp[offsets[0]].copy()
        for index in offsets[1:]:
            total += xp[index]
        return total / (self.kernel_size[0] * self.kernel_size[1])

    def backward(self, dy: np.ndarray) -> np.ndarray:
        """dy: upstream gradient, shape (N, C, Ho, Wo); returns dx, shape (N, C, H, W)."""
        self.check_upstream(dy)
        share = dy / (self.kernel_size[0] * self.kernel_size[1])  # every pixel of a window gets 1/(kh·kw)
        dxp = np.zeros((*dy.shape[:2], *(s + 2 * p for s, p in zip(self._input_shape[2:], self.padding))),
                       dtype=dy.dtype)
        for index in self._offsets():
            dxp[index] += share
        return self._unpad(dxp)


class Flatten(Module):
    """Collapse dimensions start_dim..end_dim into one (torch.nn.Flatten; default: all but the batch)."""

    def __init__(self, start_dim: int = 1, end_dim: int = -1):
        self.start_dim, self.end_dim = int(start_dim), int(end_dim)

    def forward(self, x: np.ndarray) -> np.ndarray:
        """x: input, e.g. shape (N, C, H, W); returns y, e.g. shape (N, C·H·W) (dimensions start_dim..end_dim
        collapsed into one)."""
        check_float_array(x, "Flatten input")
        start, end = self.start_dim % max(x.ndim, 1), self.end_dim % max(x.ndim, 1)
        if x.ndim == 0 or start > end:
            raise ValueError(f"Flatten(start_dim={self.start_dim}, end_dim={self.end_dim}) cannot flatten "
                             f"an input of shape {x.shape}")
        self._input_shape = x.shape
        y = x.reshape(*x.shape[:start], -1, *x.shape[end + 1:])
        self.remember_output_shape(y.shape)
        return y

    def backward(self, dy: np.ndarray) -> np.ndarray:
        """dy: upstream gradient, shape of y; returns dx, shape of x (a reshape)."""
        self.check_upstream(dy)
        return dy.reshape(self._input_shape)

    def flops(self, input_shape: tuple[int, ...]) -> int:
        return 0  # a reshape moves no data

    def __repr__(self) -> str:
        return f"Flatten(start_dim={self.start_dim}, end_dim={self.end_dim})"

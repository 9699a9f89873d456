"""The pre-LayerNorm transformer block (GPT-2's arrangement): attention and an MLP, each on a residual.

    h = x + attn(ln1(x))                      (B, T, d)
    y = h + dropout(mlp(ln2(h)))              mlp = Linear d -> d_ff, GELU, Linear d_ff -> d (d_ff = 4d)
Backward: a residual passes its gradient through unchanged and adds the branch's,
    dh = dy + ln2.backward(mlp.backward(dropout.backward(dy)))
    dx = dh + ln1.backward(attn.backward(dh))
Cost per token (forward): attention 8d² + 4Td FLOPs, MLP 4·d·d_ff = 16d²; parameters 4d² + 2·d·d_ff
(+ biases and the two LayerNorms' 4d) = 12d² + 13d with d_ff = 4d.
"""

from __future__ import annotations

import numpy as np

from minidist.nn.checks import check_count

from .activation import GELU, Dropout
from .attention import CausalSelfAttention
from .linear import Linear
from .module import Module, Sequential, check_float_array, resolve_rng
from .norm import LayerNorm


class TransformerBlock(Module):
    """x + attn(ln1(x)), then h + mlp(ln2(h)); sub-layers ``ln1``, ``attn``, ``ln2``, ``mlp`` (a Sequential
    Linear, GELU, Linear), ``mlp_drop`` — parameters() lists them in that order."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int | None = None, dropout: float = 0.0, *,
                 rng: np.random.Generator | None = None, dtype=np.float32):
        d_ff = 4 * check_count(d_model, "TransformerBlock d_model") if d_ff is None else d_ff
        d_ff = check_count(d_ff, "TransformerBlock d_ff")
        rng = resolve_rng(rng)
        self.d_model, self.d_ff = int(d_model), d_ff
        attn = CausalSelfAttention(d_model, n_heads, dropout, rng=rng, dtype=dtype)  # validates d, heads
        self.ln1 = LayerNorm(self.d_model, dtype=dtype)
        self.attn = attn
        self.ln2 = LayerNorm(self.d_model, dtype=dtype)
        self.mlp = Sequential(Linear(self.d_model, d_ff, rng=rng, dtype=dtype), GELU(),
                              Linear(d_ff, self.d_model, rng=rng, dtype=dtype))
        self.mlp_drop = Dropout(dropout, rng=rng)

    def forward(self, x: np.ndarray) -> np.ndarray:
        """x: input, shape (B, T, d_model); returns y, shape (B, T, d_model)."""
        check_float_array(x, "TransformerBlock input", ndim=3)
        if x.shape[-1] != self.d_model:
            raise ValueError(f"TransformerBlock expects input of shape (B, T, {self.d_model}), got {x.shape}")
        self.remember_output_shape(x.shape)
        h = x + self.attn.forward(self.ln1.forward(x))
        return h + self.mlp_drop.forward(self.mlp.forward(self.ln2.forward(h)))

    def backward(self, dy: np.ndarray) -> np.ndarray:
        """dy: upstream gradient, shape (B, T, d_model); returns dx, shape (B, T, d_model); every sub-layer
        adds its parameters' gradients."""
        self.check_upstream(dy)
        dh = dy + self.ln2.backward(self.mlp.backward(self.mlp_drop.backward(dy)))
        return dh + self.ln1.backward(self.attn.backward(dh))

    def flops(self, input_shape: tuple[int, ...]) -> int:
        """Forward matmul FLOPs for (B, T, d): attention's 8·B·T·d² + 4·B·T²·d plus the MLP's 4·B·T·d·d_ff.
        A split attention or MLP (minidist.parallel) has its own ``flops``, this rank's share: the block
        asks its sub-modules, so a split block counts the products its rank performs."""
        b, t, d = input_shape
        mlp = self.mlp.flops(input_shape) if hasattr(self.mlp, "flops") else 4 * b * t * d * self.d_ff
        return self.attn.flops(input_shape) + mlp

    def __repr__(self) -> str:
        return f"TransformerBlock(d_model={self.d_model}, n_heads={self.attn.n_heads}, d_ff={self.d_ff})"

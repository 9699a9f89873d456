"""Instance normalisation (Ulyanov, Vedaldi & Lempitsky, "Instance Normalization: The Missing Ingredient for
Fast Stylization", 2016): normalise each (sample, channel) over its spatial positions — GroupNorm with one
channel per group (the "Hardware Accelerators for Training DNNs" slides draw it beside Batch, Layer and
Group Norm):

    μ_nc = mean_hw(x_nc),  σ²_nc = var_hw(x_nc),  y_nc = γ_c (x_nc − μ_nc) / √(σ²_nc + ε) + β_c

As torch.nn.InstanceNorm2d: affine=False by default, no running statistics (the same statistics in
training and eval). The forward and backward are GroupNorm's (norm.py).
"""

from __future__ import annotations

import numpy as np

from .norm import GroupNorm


class InstanceNorm2d(GroupNorm):
    """Instance normalisation of (N, C, H, W) images: one (μ, σ²) per sample and channel.

    num_features: C; eps > 0; affine: learnable γ, β of shape (C,) (default False, as torch).
    """

    def __init__(self, num_features: int, eps: float = 1e-5, affine: bool = False, *, dtype=np.float32):
        super().__init__(num_features, num_features, eps=eps, affine=affine, dtype=dtype)

    def forward(self, x: np.ndarray) -> np.ndarray:
        """x: (N, C, H, W); returns y, shape of x."""
        if not isinstance(x, np.ndarray) or x.ndim != 4:
            raise ValueError(f"InstanceNorm2d input: expected shape (N, {self.num_channels}, H, W), "
                             f"got {getattr(x, 'shape', type(x).__name__)}")
        return super().forward(x)

    def __repr__(self) -> str:
        return f"InstanceNorm2d({self.num_channels}, eps={self.eps}, affine={self.weight is not None})"

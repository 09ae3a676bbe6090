"""Norms: the one RMSNorm (DeepSeek, Kimi) and, built on it, the gated RMSNorm on a delta-rule
layer's output."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from gpt2k3.checks import check_positive_float, check_positive_int


class RMSNorm(nn.Module):
    """``y = w * x / sqrt(mean(x^2) + eps)`` over the last dimension (no mean subtraction, no bias)."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(check_positive_int(dim, "dim")))
        self.eps = check_positive_float(eps, "eps")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


class GatedRMSNorm(RMSNorm):
    """:class:`RMSNorm` times an output gate: ``forward(x, g=None) = RMSNorm(x) * act(g)``.

    The output norm of the delta-rule layers, applied per head: ``act`` is SiLU (Gated
    DeltaNet), sigmoid (KDA) or nothing (``activation=None``, DeltaNet).
    """

    _ACTS = {"silu": F.silu, "sigmoid": torch.sigmoid, None: None}

    def __init__(self, dim: int, eps: float = 1e-5, activation: str | None = None):
        if activation not in self._ACTS:
            raise ValueError(f"activation must be one of {list(self._ACTS)}, got {activation!r}")
        super().__init__(dim, eps)
        self.activation = activation

    def forward(self, x: torch.Tensor, g: torch.Tensor | None = None) -> torch.Tensor:
        y = super().forward(x)
        if self.activation is None:
            return y
        if g is None:
            raise ValueError(f"g (the output gate) is required with activation={self.activation!r}")
        return y * self._ACTS[self.activation](g)

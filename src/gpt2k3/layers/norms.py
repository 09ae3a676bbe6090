"""Norms: RMSNorm (DeepSeek, Kimi) and the gated RMSNorm on a linear-attention layer's output."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from gpt2k3.checks import check_int, check_positive_float, check_positive_int


class RMSNorm(nn.Module):
    """``y = w * x / sqrt(mean(x^2) + eps)`` over the last dimension (no mean subtraction, no bias)."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        check_positive_int(dim, "dim")
        check_positive_float(eps, "eps")
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


class GatedRMSNorm(nn.Module):
    """RMSNorm over the last axis with a learned gain, optionally times an output gate.

    ``forward(x, g=None) = x / sqrt(mean(x^2) + eps) * weight * act(g)``, with ``act`` SiLU
    (Gated DeltaNet), sigmoid (KDA) or nothing (``activation=None``, DeltaNet).
    """

    _ACTS = {"silu": F.silu, "sigmoid": torch.sigmoid, None: None}

    def __init__(self, dim: int, eps: float = 1e-5, activation: str | None = None):
        super().__init__()
        if activation not in self._ACTS:
            raise ValueError(f"activation must be one of {list(self._ACTS)}, got {activation!r}")
        if not (isinstance(eps, (int, float)) and not isinstance(eps, bool) and eps > 0):
            raise ValueError(f"eps must be a positive number, got {eps!r}")
        self.weight = nn.Parameter(torch.ones(check_int(dim, "dim", 1)))
        self.eps, self.activation = float(eps), activation

    def forward(self, x: torch.Tensor, g: torch.Tensor | None = None) -> torch.Tensor:
        y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight
        if self.activation is not None:
            if g is None:
                raise ValueError(f"g (the output gate) is required with activation={self.activation!r}")
            y = y * self._ACTS[self.activation](g)
        return y

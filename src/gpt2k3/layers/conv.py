"""The causal short convolution in front of the linear-attention family's q, k, v projections:
the package's one :class:`ShortConv`, used by every layer and experiment that needs one."""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from gpt2k3.checks import check_int


class ShortConv(nn.Module):
    """Depthwise causal convolution over time, then SiLU; keeps its last inputs for decoding.

    ``forward(x, state)`` takes ``x`` of shape ``(B, T, C)`` and the previous ``state``
    ``(B, C, kernel_size - 1)`` (``None``: zeros, i.e. nothing before the first token) and
    returns ``(y, new_state)``. Output ``t`` is ``silu(sum_j w[:, j] * x[t - K + 1 + j])``, so
    processing a sequence in pieces, carrying the state, equals processing it at once.
    """

    def __init__(self, channels: int, kernel_size: int = 4):
        super().__init__()
        self.channels = check_int(channels, "channels", 1)
        self.kernel_size = check_int(kernel_size, "kernel_size", 1)
        self.weight = nn.Parameter(torch.empty(channels, 1, kernel_size))
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))  # nn.Conv1d's default

    def forward(self, x: torch.Tensor, state: torch.Tensor | None = None):
        B, T, C = x.shape
        K = self.kernel_size
        xt = x.transpose(1, 2)  # (B, C, T): conv1d convolves the last axis
        if state is None:
            state = xt.new_zeros(B, C, K - 1)
        elif tuple(state.shape) != (B, C, K - 1):
            raise ValueError(f"conv state must have shape (B, C, kernel_size - 1) = "
                             f"({B}, {C}, {K - 1}); got {tuple(state.shape)}")
        if T == 0:  # no new input: no output, the same tail
            return x, state
        full = torch.cat([state.to(xt.dtype), xt], dim=-1)  # (B, C, K - 1 + T)
        y = F.conv1d(full, self.weight.to(xt.dtype), groups=C)  # (B, C, T)
        return F.silu(y).transpose(1, 2), full[..., full.shape[-1] - (K - 1):]

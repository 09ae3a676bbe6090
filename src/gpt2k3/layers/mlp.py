"""Channel mixers: GPT-2's GELU MLP, the SwiGLU experts of DeepSeek and Kimi, and Kimi K3's
SiTU-GLU.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from gpt2k3.accounting.k3_mechanisms import SITU_BETA, SITU_LINEAR_BETA
from gpt2k3.checks import check_finite_number, check_int, check_positive_int, check_situ
from gpt2k3.config import GPTConfig


#: The activations :class:`MLP` accepts, by name (GPT-2 uses the tanh form of GELU).
MLP_ACTIVATIONS = {"gelu_tanh": lambda: nn.GELU(approximate="tanh"), "gelu": nn.GELU,
                   "relu": nn.ReLU, "silu": nn.SiLU}


class MLP(nn.Module):
    """Position-wise feed-forward network ``n_embd -> hidden -> n_embd``: GPT-2's MLP.

    ``hidden`` defaults to GPT-2's ``4 n_embd`` and ``activation`` to its tanh-form GELU; the
    text experiments change ``hidden`` to match parameter counts. The names ``c_fc``/``c_proj``
    are GPT-2's checkpoint names, so Hugging Face state dicts load unchanged.
    """

    def __init__(self, config: GPTConfig, hidden: int | None = None,
                 activation: str = "gelu_tanh"):
        super().__init__()
        hidden = 4 * config.n_embd if hidden is None else check_positive_int(hidden, "hidden")
        if activation not in MLP_ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(MLP_ACTIVATIONS)}, "
                             f"got {activation!r}")
        self.c_fc = nn.Linear(config.n_embd, hidden, bias=config.bias)
        self.act = MLP_ACTIVATIONS[activation]()
        self.c_proj = nn.Linear(hidden, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(self.act(self.c_fc(x))))


class SwiGLU(nn.Module):
    """``down_proj( silu(gate_proj x) * up_proj x )``, no biases."""

    def __init__(self, n_embd: int, d_hidden: int) -> None:
        super().__init__()
        check_positive_int(n_embd, "n_embd")
        check_positive_int(d_hidden, "d_hidden")
        self.gate_proj = nn.Linear(n_embd, d_hidden, bias=False)
        self.up_proj = nn.Linear(n_embd, d_hidden, bias=False)
        self.down_proj = nn.Linear(d_hidden, n_embd, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def situ_reference(gate: float, up: float, beta: float = SITU_BETA,
                   linear_beta: float = SITU_LINEAR_BETA) -> float:
    """SiTU-GLU of one pair of plain floats: the definition, written once more with ``math``.

    The sigmoid is written ``1 / (1 + e^-g)`` for ``g >= 0`` and ``e^g / (1 + e^g)`` below, so
    ``e`` is never raised to a large positive power (``situ_reference(-1000, 1)`` is 0, not an
    OverflowError)."""
    e = math.exp(-abs(gate))
    sigmoid = 1 / (1 + e) if gate >= 0 else e / (1 + e)
    return beta * math.tanh(gate / beta) * sigmoid * linear_beta * math.tanh(up / linear_beta)


def situ(gate: torch.Tensor, up: torch.Tensor, beta: float = SITU_BETA,
         linear_beta: float | None = SITU_LINEAR_BETA) -> torch.Tensor:
    """SiTU-GLU: ``beta tanh(gate/beta) sigmoid(gate) * linear_beta tanh(up/linear_beta)``.

    SGLang 0.5.23 ``srt/layers/activation.py``, ``SituAndMul.forward_native`` (computed in
    float32 or wider, returned in the input dtype); ``linear_beta=None`` leaves ``up``
    unclipped. Near 0 it is SwiGLU's ``silu(gate) * up`` (``beta tanh(g/beta) ~ g``); the gate
    factor never exceeds ``beta`` and the up factor never exceeds ``linear_beta`` in size, so one
    large pre-activation cannot blow up the product as it can in SwiGLU.
    """
    beta, linear_beta = check_situ(gate, up, beta, linear_beta)
    dtype = torch.promote_types(gate.dtype, torch.float32)
    g, u = gate.to(dtype), up.to(dtype)
    g = beta * torch.tanh(g / beta) * torch.sigmoid(g)
    if linear_beta is not None:
        u = linear_beta * torch.tanh(u / linear_beta)
    return (g * u).to(gate.dtype)


class SituGLU(nn.Module):
    """``down_proj(situ(gate_proj x, up_proj x))``, no biases: K3's dense MLP and every expert
    (SGLang ``KimiK3MLP``); the same three matrices as :class:`gpt2k3.layers.mlp.SwiGLU`."""

    def __init__(self, n_embd: int, d_hidden: int, beta: float = SITU_BETA,
                 linear_beta: float | None = SITU_LINEAR_BETA) -> None:
        super().__init__()
        check_int(n_embd, "n_embd", 1)
        check_int(d_hidden, "d_hidden", 1)
        self.beta = check_finite_number(beta, "beta", 1)
        self.linear_beta = (None if linear_beta is None
                            else check_finite_number(linear_beta, "linear_beta", 1))
        self.gate_proj = nn.Linear(n_embd, d_hidden, bias=False)
        self.up_proj = nn.Linear(n_embd, d_hidden, bias=False)
        self.down_proj = nn.Linear(d_hidden, n_embd, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(situ(self.gate_proj(x), self.up_proj(x), self.beta, self.linear_beta))

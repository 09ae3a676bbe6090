r"""DeltaNet, Gated DeltaNet and Kimi Delta Attention as layers that drop into the GPT block.

Each layer replaces GPT-2's softmax attention in :class:`gpt2k3.model.Block`::

    model = GPT(config, mixer=lambda c, i: KDA(c))

and runs the body of the ops' fast form, :func:`gpt2k3.ops.gated_delta.chunkwise`
(:func:`gpt2k3.ops.delta.chunkwise` for DeltaNet), past its door's value checks.
Around the mixer they share one recipe (that of the papers and of flash-linear-attention's
layers, Yang & Zhang, 2024):

1. **Projections** ``q, k = x W_q, x W_k`` (``H`` heads of ``Dk`` channels) and
   ``v = x W_v`` (``H`` heads of ``Dv = expand_v * Dk``), without biases.
2. **A short causal convolution** (optional, kernel 4 by default): a depthwise convolution over
   time of each projected channel, so each token's q, k, v also see the few tokens before it.
   Then SiLU on all three.
3. **L2-normalised q and k** per head, so that a read ``k S`` of one stored association returns
   its value exactly (chapter 4) and the delta update stays a contraction.
4. **Write strength** ``beta_t = sigmoid(x_t W_beta)``, one per head and token.
5. **A forget gate** (not in DeltaNet), computed in log space:

   * Gated DeltaNet (Yang, Kautz & Hatamizadeh, 2025), Mamba2-style, one scalar per head:
     :func:`gdn_log_decay`, ``-exp(A_log) * softplus(x_t W_a + dt_bias)``, ``(B, H, T)``;
   * KDA (Kimi Team, 2025), one value per key channel from a *low-rank* projection
     ``W_f = W_f^down W_f^up`` (rank ``Dv``):
     :func:`kda_log_decay`, ``-exp(A_log) * softplus(x_t W_f + dt_bias)``, ``(B, H, T, Dk)``.

   ``exp(A_log) > 0`` and ``softplus >= 0``, so ``log alpha <= 0``: a decay in ``(0, 1]``.
6. **Output**: per-head RMSNorm of the mixer's output, multiplied by an output gate --
   ``silu(x W_g)`` in Gated DeltaNet, ``sigmoid(x W_g^down W_g^up)`` (low rank) in KDA,
   none in DeltaNet -- then the output projection ``o_proj`` back to ``n_embd``.

Decoding keeps a fixed-size :class:`DeltaState` per layer in its :class:`gpt2k3.cache.StateCache`:
the ``(B, H, Dk, Dv)`` matrix ``S`` and, with the convolution, the last ``conv_size - 1``
projected inputs of q, k and v. Feeding a sequence in any pieces -- all at once, a prompt then
one token at a time -- gives the same outputs to float rounding (the tests check it), and the
state's size does not depend on how many tokens it has seen.

The parameter shapes and initialisations follow flash-linear-attention's ``DeltaNet``,
``GatedDeltaNet`` and ``KimiDeltaAttention`` layers (read, not imported: they need Triton).
Inside :class:`gpt2k3.model.GPT`, the model's own initialisation re-draws every ``nn.Linear``
weight from ``N(0, 0.02)``; ``A_log``, ``dt_bias``, the convolution and the norms keep theirs.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from gpt2k3.archs import K3_GATE_LOWER_BOUND
from gpt2k3.cache import StateCache, check_layer_cache
from gpt2k3.checks import (check_finite_number, check_gdn_gate, check_int, check_kda_gate,
                          check_layer_input, check_positive_float, checked, is_real)
from gpt2k3.config import GPTConfig
from gpt2k3.layers.conv import ShortConv
from gpt2k3.layers.norms import GatedRMSNorm
from gpt2k3.ops import delta, gated_delta

__all__ = ["DeltaState", "DeltaLayer", "DeltaNet", "GatedDeltaNet", "KDA", "gdn_log_decay", "kda_log_decay",
           "bounded_log_decay", "BoundedKDA"]


class DeltaState(NamedTuple):
    """The decode state of one delta-family layer (a tuple, so ``StateCache.nbytes`` counts it).

    ``S``: the ``(B, H, Dk, Dv)`` memory (float32 or wider). ``conv``: the convolution states of
    q, k and v, each ``(B, channels, conv_size - 1)``, or ``None`` without a convolution.
    """

    S: torch.Tensor
    conv: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None


@checked(check_gdn_gate)
def gdn_log_decay(x: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor) -> torch.Tensor:
    """Gated DeltaNet's log decay, one per head (Mamba2's): ``-exp(A_log) * softplus(x + dt_bias)``.

    ``x = x W_a`` is ``(B, T, H)``, ``A_log`` and ``dt_bias`` one number per head ``(H,)``. The
    result, in float32 or wider, is ``<= 0``: a decay ``alpha = exp(g)`` in ``(0, 1]``, no floor.
    """
    dtype = torch.promote_types(x.dtype, torch.float32)
    x, A_log, dt_bias = (t.to(dtype) for t in (x, A_log, dt_bias))
    return -A_log.exp() * F.softplus(x + dt_bias)


@checked(check_kda_gate)
def kda_log_decay(x: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor) -> torch.Tensor:
    """Kimi Linear's log decay, one per key channel: ``-exp(A_log) * softplus(x + dt_bias)``.

    ``x = x W_f^down W_f^up`` is ``(B, T, H, Dk)`` (fla-core's layout), ``A_log`` one number per
    head ``(H,)``, ``dt_bias`` one per channel ``(H * Dk,)``. The result, in float32 or wider,
    is ``<= 0`` with no floor: fla-core's ``naive_kda_gate`` (``fla/ops/kda/gate.py``).
    """
    dtype = torch.promote_types(x.dtype, torch.float32)
    x, A_log, dt_bias = (t.to(dtype) for t in (x, A_log, dt_bias))
    return -A_log.exp()[:, None] * F.softplus(x + dt_bias.view(x.shape[2:]))  # (H, Dk) per channel


@checked(check_kda_gate)
def bounded_log_decay(x: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,
                      lower_bound: float = K3_GATE_LOWER_BOUND) -> torch.Tensor:
    """K3's per-channel log decay ``lower_bound * sigmoid(exp(A_log) * (x + dt_bias))``.

    Arguments as in :func:`kda_log_decay`. The result, in float32 or wider, lies in
    ``(lower_bound, 0)``: a channel keeps at least ``exp(lower_bound)`` of its state per step
    (``e^-5`` ~ 0.67% for K3) and never more than all of it -- unlike :func:`kda_log_decay`,
    which has no floor. fla-core 0.6.0's ``naive_kda_lowerbound_gate`` (``fla/ops/kda/gate.py``),
    config field ``linear_attn_config.gate_lower_bound``.
    """
    dtype = torch.promote_types(x.dtype, torch.float32)
    x, A_log, dt_bias = (t.to(dtype) for t in (x, A_log, dt_bias))
    return lower_bound * torch.sigmoid(A_log.exp()[:, None] * (x + dt_bias.view(x.shape[2:])))


def mamba2_dt_bias(n: int) -> torch.Tensor:
    """Mamba2's step-size bias: ``softplus^-1(dt)`` with ``dt`` log-uniform in ``[0.001, 0.1]``
    (floored at ``1e-4``), ``n`` of them. Gated DeltaNet draws one per head; KDA one per key
    channel, as flash-linear-attention's layer does from 0.5.0 on (0.4.2 and earlier: zeros)."""
    dt = torch.exp(torch.rand(n) * (math.log(0.1) - math.log(0.001)) + math.log(0.001))
    dt = dt.clamp_min(1e-4)
    return dt + torch.log(-torch.expm1(-dt))  # softplus^-1(dt)


def check_delta_layer_call(layer, x, cache=None) -> None:
    """The door of :meth:`DeltaLayer.forward`: ``x`` ``(B, T, n_embd)`` in the weights' dtype,
    ``cache`` ``None`` or a :class:`StateCache` holding nothing yet or a :class:`DeltaState`."""
    check_layer_input(x, "x", layer.n_embd, next(layer.parameters()).dtype,
                      shape=f"(B, T, n_embd={layer.n_embd})", finite=False)
    check_layer_cache(layer, cache)
    if cache is not None and cache.state is not None and not isinstance(cache.state, DeltaState):
        raise ValueError(f"the cached state must be a DeltaState, got {type(cache.state).__name__}")


class DeltaLayer(nn.Module):
    """What DeltaNet, Gated DeltaNet and KDA share; subclasses add a gate and an output gate."""

    #: activation of the output gate (None: no output gate)
    output_gate: str | None = None
    cache_types = (StateCache,)  #: the layer caches it accepts

    def __init__(self, config, *, n_head: int | None = None, head_dim: int | None = None,
                 expand_v: float = 1.0, conv_size: int = 4, norm_eps: float = 1e-5,
                 chunk_size: int = 64):
        super().__init__()
        if not isinstance(config, GPTConfig):
            raise ValueError(f"config must be a GPTConfig, got {type(config).__name__}")
        H = config.n_head if n_head is None else check_int(n_head, "n_head", 1)
        Dk = config.head_dim if head_dim is None else check_int(head_dim, "head_dim", 1)
        if not is_real(expand_v) or expand_v <= 0 \
                or not float(Dk * expand_v).is_integer():
            raise ValueError(f"expand_v must be a positive number with head_dim * expand_v an "
                             f"integer (head_dim = {Dk}), got {expand_v!r}")
        check_int(conv_size, "conv_size", 0)
        check_positive_float(norm_eps, "norm_eps")
        self.chunk_size = check_int(chunk_size, "chunk_size", 1)
        self.n_embd, self.n_head, self.head_k_dim = config.n_embd, H, Dk
        self.head_v_dim = int(Dk * expand_v)
        self.key_dim, self.value_dim = H * Dk, H * self.head_v_dim
        d = config.n_embd

        self.q_proj = nn.Linear(d, self.key_dim, bias=False)
        self.k_proj = nn.Linear(d, self.key_dim, bias=False)
        self.v_proj = nn.Linear(d, self.value_dim, bias=False)
        self.conv_size = conv_size
        if conv_size:
            self.q_conv = ShortConv(self.key_dim, conv_size)
            self.k_conv = ShortConv(self.key_dim, conv_size)
            self.v_conv = ShortConv(self.value_dim, conv_size)
        self.b_proj = nn.Linear(d, H, bias=False)
        self.o_norm = GatedRMSNorm(self.head_v_dim, eps=norm_eps, activation=self.output_gate)
        self.o_proj = nn.Linear(self.value_dim, d, bias=False)

    # ---------------------------------------------------------------- pieces, public for tests
    def _heads(self, t: torch.Tensor, dim: int) -> torch.Tensor:
        """``(B, T, H * dim) -> (B, H, T, dim)``."""
        B, T, _ = t.shape
        return t.view(B, T, self.n_head, dim).transpose(1, 2)

    def qkv(self, x: torch.Tensor, conv_state=None):
        """``q, k`` ``(B, H, T, Dk)`` (L2-normalised), ``v`` ``(B, H, T, Dv)`` and the new conv state."""
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        if self.conv_size:
            cq, ck, cv = conv_state if conv_state is not None else (None, None, None)
            q, cq = self.q_conv(q, cq)
            k, ck = self.k_conv(k, ck)
            v, cv = self.v_conv(v, cv)
            conv_state = (cq, ck, cv)
        else:
            q, k, v = F.silu(q), F.silu(k), F.silu(v)
        q = F.normalize(self._heads(q, self.head_k_dim), dim=-1, eps=1e-6)
        k = F.normalize(self._heads(k, self.head_k_dim), dim=-1, eps=1e-6)
        return q, k, self._heads(v, self.head_v_dim), conv_state

    def beta(self, x: torch.Tensor) -> torch.Tensor:
        """Write strengths ``sigmoid(x W_beta)``, shape ``(B, H, T)``."""
        return torch.sigmoid(self.b_proj(x)).transpose(1, 2)

    def log_alpha(self, x: torch.Tensor) -> torch.Tensor | None:
        """The forget gate in log space (``None``: no gate, plain DeltaNet)."""
        return None

    def _output_gate(self, x: torch.Tensor) -> torch.Tensor | None:
        return None

    def new_cache(self, batch: int, max_len: int | None = None, *, dtype=None, device=None) -> StateCache:
        """An empty fixed-size state (a :class:`DeltaState` after the first tokens); it has no
        length limit, and its shapes come from the tokens it sees."""
        return StateCache(batch, max_len)

    # ---------------------------------------------------------------- forward
    @checked(check_delta_layer_call)
    def forward(self, x: torch.Tensor, cache: StateCache | None = None) -> torch.Tensor:
        """``x`` ``(B, T, n_embd)`` -> ``(B, T, n_embd)``; with its cache (:meth:`new_cache`),
        continue from the cached state and store the new one."""
        prev = cache.state if cache is not None else None
        B, T, _ = x.shape
        if T == 0:  # nothing to mix, nothing to remember
            return x.new_zeros(B, 0, self.n_embd)
        q, k, v, conv = self.qkv(x, prev.conv if prev is not None else None)
        S, beta, g = None if prev is None else prev.S, self.beta(x), self.log_alpha(x)
        if g is None:  # inside this door the ops run their bodies alone: no check, no device wait
            o, S = delta.chunkwise(q, k, v, beta, initial_state=S, chunk_size=self.chunk_size)
        else:
            o, S = gated_delta.chunkwise(q, k, v, beta, g, initial_state=S, chunk_size=self.chunk_size)
        if cache is not None:
            cache.extend(DeltaState(S, conv), T)
        out_gate = self._output_gate(x)
        o = self.o_norm(o.transpose(1, 2), None if out_gate is None else out_gate.view(B, T, self.n_head, -1))
        return self.o_proj(o.reshape(B, T, self.value_dim))

    def state_numbers(self, batch: int = 1) -> int:
        """Numbers held by this layer's decode state: ``H Dk Dv`` plus the conv tails."""
        conv = (self.conv_size - 1) * (2 * self.key_dim + self.value_dim) if self.conv_size else 0
        return batch * (self.n_head * self.head_k_dim * self.head_v_dim + conv)


_DeltaLayer = DeltaLayer  # the earlier, private name, kept so old imports work


class DeltaNet(DeltaLayer):
    """DeltaNet (Schlag et al., 2021; Yang et al., 2024): the delta rule, no forget gate.

    Output: per-head RMSNorm, no output gate (flash-linear-attention's default).
    Keyword arguments: ``n_head`` / ``head_dim`` (default: the config's), ``expand_v``,
    ``conv_size`` (0: no convolution), ``norm_eps``, ``chunk_size``.
    """


class GatedDeltaNet(DeltaLayer):
    """Gated DeltaNet (Yang, Kautz & Hatamizadeh, 2025): one Mamba2-style decay per head and token.

    ``log alpha_t = -exp(A_log) * softplus(x_t W_a + dt_bias)``, shape ``(B, H, T)``. At
    initialisation ``A ~ U(0, 16)`` and ``softplus(dt_bias)`` is log-uniform in
    ``[0.001, 0.1]``, so heads start with a wide range of memory lengths. Output gate
    ``silu(x W_g)``. Keyword arguments as in :class:`DeltaNet`.
    """

    output_gate = "silu"

    def __init__(self, config, **kwargs):
        super().__init__(config, **kwargs)
        H = self.n_head
        self.a_proj = nn.Linear(self.n_embd, H, bias=False)
        A = torch.empty(H).uniform_(0, 16).clamp_min(1e-4)  # clamp: log(0) would be -inf
        self.A_log = nn.Parameter(A.log())
        self.dt_bias = nn.Parameter(mamba2_dt_bias(H))  # one step size per head
        self.g_proj = nn.Linear(self.n_embd, self.value_dim, bias=False)

    def log_alpha(self, x: torch.Tensor) -> torch.Tensor:
        """:func:`gdn_log_decay` of ``x W_a``, shape ``(B, H, T)``, in float32 or wider."""
        return gdn_log_decay(self.a_proj(x), self.A_log, self.dt_bias).transpose(1, 2)

    def _output_gate(self, x):
        return self.g_proj(x)


class KDA(DeltaLayer):
    """Kimi Delta Attention (Kimi Team, 2025): a decay per key channel from a low-rank projection.

    ``log alpha_t = -exp(A_log[h]) * softplus(x_t W_f^down W_f^up + dt_bias)``, shape
    ``(B, H, T, Dk)``: row ``i`` of each head's state fades at its own rate. ``W_f^down`` maps
    ``n_embd -> Dv`` and ``W_f^up`` maps ``Dv -> H Dk``. At initialisation ``A ~ U(1, 16)`` and
    ``softplus(dt_bias)`` log-uniform in ``[0.001, 0.1]`` per channel (:func:`mamba2_dt_bias`,
    flash-linear-attention's ``KimiDeltaAttention`` from 0.5.0 on, read at 0.5.0 and 0.5.2). Output gate ``sigmoid(x W_g^down W_g^up)``, also low rank. Keyword
    arguments as in :class:`DeltaNet`.

    flash-linear-attention's layer gives the output gate's up-projection a bias; the released
    Kimi Linear model has none, and neither does this layer, so that its parameter count is the
    one :func:`gpt2k3.accounting.count_params` gives a KDA layer.
    """

    output_gate = "sigmoid"

    def __init__(self, config, **kwargs):
        super().__init__(config, **kwargs)
        d, H, r = self.n_embd, self.n_head, self.head_v_dim
        self.f_proj = nn.Sequential(nn.Linear(d, r, bias=False), nn.Linear(r, self.key_dim, bias=False))
        self.A_log = nn.Parameter(torch.empty(H).uniform_(1, 16).log())
        self.dt_bias = nn.Parameter(mamba2_dt_bias(self.key_dim))  # one per key channel
        self.g_proj = nn.Sequential(nn.Linear(d, r, bias=False), nn.Linear(r, self.value_dim, bias=False))

    def log_alpha(self, x: torch.Tensor) -> torch.Tensor:
        """:func:`kda_log_decay` of ``x W_f``, shape ``(B, H, T, Dk)``, in float32 or wider."""
        B, T, _ = x.shape
        f = self.f_proj(x).view(B, T, self.n_head, self.head_k_dim)
        return kda_log_decay(f, self.A_log, self.dt_bias).transpose(1, 2)

    def _output_gate(self, x):
        return self.g_proj(x)


class BoundedKDA(KDA):
    """Kimi Delta Attention as in K3 (SGLang ``KimiK3DeltaAttention``): the bounded decay of
    :func:`bounded_log_decay` and a **full-rank** sigmoid output gate ``sigmoid(x W_g)``,
    ``W_g`` of ``n_embd x H Dv`` (``use_full_rank_gate``), in place of :class:`KDA`'s
    ``-exp(A_log) softplus(...)`` and low-rank gate. Everything else -- projections, short
    convolution, L2-normalised q and k, write strength, gated RMSNorm, ``o_proj``, the
    :class:`~gpt2k3.layers.deltanet.DeltaState` it keeps in a cache -- is :class:`KDA`'s.

    Keyword arguments: ``lower_bound`` (default -5.0, K3's) and those of :class:`KDA`.
    """

    def __init__(self, config, *, lower_bound: float = K3_GATE_LOWER_BOUND, **kwargs):
        super().__init__(config, **kwargs)
        self.lower_bound = check_finite_number(lower_bound, "lower_bound", -1)
        self.g_proj = nn.Linear(self.n_embd, self.value_dim, bias=False)  # full rank

    def log_alpha(self, x: torch.Tensor) -> torch.Tensor:
        """:func:`bounded_log_decay` of ``x W_f``, shape ``(B, H, T, Dk)``, in float32 or wider."""
        B, T, _ = x.shape
        f = self.f_proj(x).view(B, T, self.n_head, self.head_k_dim)
        return bounded_log_decay(f, self.A_log, self.dt_bias, self.lower_bound).transpose(1, 2)

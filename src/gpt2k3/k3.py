r"""What Kimi K3 adds, built from the book's parts: a tiny Kimi K3 you can train and decode.

Kimi K3 (Kimi Team 2026, "Kimi K3: Open Frontier Intelligence", arXiv:2607.24653; config.json of
``moonshotai/Kimi-K3``; SGLang 0.5.23 ``srt/models/kimi_k3.py``) is Kimi Linear's hybrid -- KDA
layers with a multi-head latent attention (MLA) layer every fourth -- plus six mechanisms. Each
is here as a small, readable piece, with a reference form beside the form the model uses where
the two differ, and the config field it follows:

1. :func:`bounded_log_decay` and :class:`BoundedKDA` -- KDA's decay bounded below
   (``linear_attn_config.gate_lower_bound``, -5.0) and its full-rank sigmoid output gate
   (``linear_attn_config.use_full_rank_gate``).
2. :class:`GatedNoPEMLA` -- MLA without rotary positions (``mla_use_nope``) and with a
   full-rank sigmoid gate on its output (``mla_use_output_gate``).
3. :class:`LatentMoE` -- routed experts working at a narrower width behind a down projection,
   their weighted sum RMS-normalised in that width and then projected up
   (``routed_expert_hidden_size``, ``latent_moe_use_norm``); shared experts at full width;
   sigmoid router with top-k.
4. :func:`situ` and :class:`SituGLU` -- the SiTU-GLU activation (``hidden_act: "situ"``,
   ``activation_situ_beta`` 4.0, ``activation_situ_linear_beta`` 25.0).
5. :func:`depth_mix_reference`, :func:`depth_mix` and :class:`DepthMix` -- Attention Residuals
   (Kimi Team, "Attention Residuals", arXiv:2603.15031; ``attn_res_block_size``).
6. :class:`AttnResidual` -- Attention Residuals as the decoder's residual part.
7. :func:`k3_model` and :func:`tiny_k3` -- a K3 assembled from these parts on the book's one
   decoder :class:`gpt2k3.gpt2.GPT` (the same class as GPT-2), decoded by
   :func:`gpt2k3.gpt2.generate` through its layers' caches, with a ``spec`` attribute, an
   :class:`gpt2k3.accounting.ArchSpec` that :func:`gpt2k3.accounting.count_params` counts to the
   parameter.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import torch.nn as nn

from ._validate import check_finite_number, check_int
from .accounting import ArchSpec, kda_layers_from_full_attn
from .accounting.k3_mechanisms import SITU_BETA, SITU_LINEAR_BETA
from .archs import KIMI_K3_CONFIG
from .gpt2 import GPT, GPTConfig
from .layers.delta import KDA
from .mixers.mla import MLA, LatentCache, MLAConfig, RMSNorm
from .moe import MoEConfig, Router

__all__ = [
    "K3_GATE_LOWER_BOUND", "K3_RMS_NORM_EPS", "SITU_BETA", "SITU_LINEAR_BETA", "K3_FULL_ATTN_EVERY",
    "bounded_log_decay", "BoundedKDA", "GatedNoPEMLA", "GatedRoPEMLA",
    "situ", "situ_reference", "SituGLU", "LatentMoEConfig", "LatentMoE",
    "depth_mix_reference", "depth_mix", "DepthMix",
    "k3_schedule", "AttnResidual", "k3_model", "tiny_k3",
]

#: ``linear_attn_config.gate_lower_bound`` of Kimi K3's config.json.
K3_GATE_LOWER_BOUND = KIMI_K3_CONFIG["linear_attn_config.gate_lower_bound"][0]
#: ``rms_norm_eps`` of Kimi K3's config.json (``gpt2k3.archs.KIMI_K3_CONFIG``), which SGLang
#: 0.5.23 gives its RMSNorms as ``config.rms_norm_eps``: the layer norms, MLA's latent norms,
#: the routed experts' latent norm and the Attention-Residual score norms (KDA's output norm
#: takes 1e-5 as its constructor default). ``KimiLinearConfig``'s own default is 1e-6.
K3_RMS_NORM_EPS = KIMI_K3_CONFIG["rms_norm_eps"][0]
# SITU_BETA, SITU_LINEAR_BETA (``activation_situ_beta`` / ``activation_situ_linear_beta``) come
# from gpt2k3.accounting.k3_mechanisms, which reads them off gpt2k3.archs.KIMI_K3_CONFIG.
#: K3's ``full_attn_layers`` are every 4th layer (1-based) plus the last one.
K3_FULL_ATTN_EVERY = 4


# ============================================================================ 1. bounded KDA decay
def bounded_log_decay(x: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,
                      lower_bound: float = K3_GATE_LOWER_BOUND) -> torch.Tensor:
    """K3's per-channel log-decay ``g = lower_bound * sigmoid(exp(A_log) * (x + dt_bias))``.

    ``x`` is the forget-gate pre-activation ``(B, T, H, Dk)`` (fla-core's layout), ``A_log`` one
    number per head ``(H,)``, ``dt_bias`` one per channel ``(H * Dk,)``. The result, in float32
    or wider, lies in ``(lower_bound, 0)``: a channel keeps at least ``exp(lower_bound)`` of its
    state per step (``e^-5`` ~ 0.67% for K3) and never more than all of it -- unlike Kimi
    Linear's ``-exp(A_log) * softplus(x + dt_bias)``, which has no floor. This is fla-core 0.6.0's
    ``naive_kda_lowerbound_gate`` (``fla/ops/kda/gate.py``), config field
    ``linear_attn_config.gate_lower_bound``.
    """
    bound = check_finite_number(lower_bound, "lower_bound", -1)
    if not isinstance(x, torch.Tensor) or x.dim() != 4:
        raise ValueError(f"x must be a (B, T, H, Dk) tensor, got "
                         f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
    H, Dk = x.shape[-2:]
    if not isinstance(A_log, torch.Tensor) or tuple(A_log.shape) != (H,):
        raise ValueError(f"A_log must have shape (H,) = ({H},), got "
                         f"{tuple(getattr(A_log, 'shape', ()))}")
    if not isinstance(dt_bias, torch.Tensor) or tuple(dt_bias.shape) != (H * Dk,):
        raise ValueError(f"dt_bias must have shape (H * Dk,) = ({H * Dk},), got "
                         f"{tuple(getattr(dt_bias, 'shape', ()))}")
    dtype = torch.promote_types(x.dtype, torch.float32)
    z = x.to(dtype) + dt_bias.to(dtype).view(H, Dk)
    return bound * torch.sigmoid(A_log.to(dtype).exp()[:, None] * z)


class BoundedKDA(KDA):
    """Kimi Delta Attention as in K3 (SGLang ``KimiK3DeltaAttention``): the bounded decay of
    :func:`bounded_log_decay` and a **full-rank** sigmoid output gate ``sigmoid(x W_g)``,
    ``W_g`` of ``n_embd x H Dv`` (``use_full_rank_gate``), in place of :class:`KDA`'s
    ``-exp(A_log) softplus(...)`` and low-rank gate. Everything else -- projections, short
    convolution, L2-normalised q and k, write strength, gated RMSNorm, ``o_proj``, the
    :class:`~gpt2k3.layers.delta.DeltaState` it keeps in a cache -- is :class:`KDA`'s.

    Keyword arguments: ``lower_bound`` (default -5.0, K3's) and those of :class:`KDA`.
    """

    def __init__(self, config, *, lower_bound: float = K3_GATE_LOWER_BOUND, **kwargs):
        super().__init__(config, **kwargs)
        self.lower_bound = check_finite_number(lower_bound, "lower_bound", -1)
        self.g_proj = nn.Linear(self.n_embd, self.value_dim, bias=False)  # full rank

    def log_alpha(self, x: torch.Tensor) -> torch.Tensor:
        """The bounded log-decay, shape ``(B, H, T, Dk)``, in float32 or wider."""
        B, T, _ = x.shape
        f = self.f_proj(x).view(B, T, self.n_head, self.head_k_dim)
        return bounded_log_decay(f, self.A_log, self.dt_bias, self.lower_bound).transpose(1, 2)


# ============================================================================ 2. gated NoPE MLA
class GatedNoPEMLA(MLA):
    """Multi-head latent attention as in K3 (SGLang ``KimiK3MLAAttention``).

    Two changes to :class:`gpt2k3.mixers.mla.MLA`:

    * **NoPE** (``mla_use_nope: true``): nothing is rotated. The ``qk_rope_head_dim`` part of
      each query and the shared key (still produced by ``q_b_proj`` and ``kv_a_proj_with_mqa``,
      and still cached beside the latent) is used as it is, so no score is a function of
      position: order reaches the layer through the causal mask (a causal NoPE stack can
      recover positions from it; Kazemnejad et al. 2023, arXiv:2305.19466) and through the KDA
      layers' recurrence and convolution.
    * **Output gate** (``mla_use_output_gate: true``): the concatenated head outputs are
      multiplied by ``sigmoid(x W_g)``, ``W_g`` (``g_proj``) of ``d_model x n_heads v_head_dim``,
      before ``o_proj``.

    As a token mixer of :class:`gpt2k3.gpt2.GPT` it is :class:`~gpt2k3.mixers.mla.MLA`'s
    ``forward(x, cache=None)`` with its own :class:`~gpt2k3.mixers.mla.LatentCache`; the gate
    enters every form (training, expanded decode, absorbed decode).
    """

    def __init__(self, cfg: MLAConfig) -> None:
        if not isinstance(cfg, MLAConfig):
            raise ValueError(f"cfg must be an MLAConfig, got {type(cfg).__name__}")
        super().__init__(cfg)
        self.g_proj = nn.Linear(cfg.d_model, cfg.n_heads * cfg.v_head_dim, bias=False)

    def _rope(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return x  # NoPE: the "rope" part is an unrotated shared key

    def _gated_merge(self, o: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """``o_proj(concat_heads(o) * sigmoid(g_proj(x)))``; ``o`` ``(B, H, T, v_head_dim)``."""
        b, _, t, _ = o.shape
        return self.o_proj(o.transpose(1, 2).reshape(b, t, -1) * torch.sigmoid(self.g_proj(x)))

    def _attend_expanded(self, x, c_kv, k_rope, q_start):
        q_nope, q_rope = self._queries(x, self._positions(q_start, x.shape[1]))
        q = torch.cat((q_nope, q_rope), dim=-1)
        k, v = self._expand(c_kv, k_rope)
        p = self._causal_softmax((q @ k.transpose(-2, -1)) * self.cfg.softmax_scale, q_start)
        return self._gated_merge(p @ v, x)

    def decode_absorbed(self, x_t: torch.Tensor, cache: LatentCache) -> torch.Tensor:
        """:meth:`MLA.decode_absorbed` with the output gate: attention in the latent space."""
        x, squeeze = self._as_3d(x_t)
        self._check_x(x, "x_t")
        start = self._write(x, cache)
        c_kv, k_rope = cache.view()
        q_nope, q_rope = self._queries(x, self._positions(start, x.shape[1]))
        w_uk, w_uv = self._up_weights()
        scores = torch.einsum("bhtr,bsr->bhts", torch.einsum("bhtn,hnr->bhtr", q_nope, w_uk), c_kv)
        scores = scores + torch.einsum("bhtd,bsd->bhts", q_rope, k_rope)
        p = self._causal_softmax(scores * self.cfg.softmax_scale, start)
        o = torch.einsum("bhtr,hvr->bhtv", torch.einsum("bhts,bsr->bhtr", p, c_kv), w_uv)
        out = self._gated_merge(o, x)
        return out[:, 0] if squeeze else out


class GatedRoPEMLA(GatedNoPEMLA):
    """A control, not a K3 layer: :class:`GatedNoPEMLA` with DeepSeek's rotation put back.

    The same parameters (its state dict loads into a :class:`GatedNoPEMLA` and back) and the
    same output gate; only the ``qk_rope_head_dim`` part of the queries and the shared key is
    rotated by position, as in :class:`gpt2k3.mixers.mla.MLA`. Comparing the two isolates the
    one change NoPE makes.
    """

    def _rope(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return MLA._rope(self, x, positions)


# ============================================================================ 4. SiTU-GLU
def situ_reference(gate: float, up: float, beta: float = SITU_BETA,
                   linear_beta: float = SITU_LINEAR_BETA) -> float:
    """SiTU-GLU of one pair of plain floats: the definition, written once more with ``math``."""
    return (beta * math.tanh(gate / beta) / (1 + math.exp(-gate))
            * linear_beta * math.tanh(up / linear_beta))


def situ(gate: torch.Tensor, up: torch.Tensor, beta: float = SITU_BETA,
         linear_beta: float | None = SITU_LINEAR_BETA) -> torch.Tensor:
    """SiTU-GLU: ``beta tanh(gate/beta) sigmoid(gate) * linear_beta tanh(up/linear_beta)``.

    SGLang 0.5.23 ``srt/layers/activation.py``, ``SituAndMul.forward_native`` (computed in
    float32 or wider, returned in the input dtype); ``linear_beta=None`` leaves ``up``
    unclipped. Near 0 it is SwiGLU's ``silu(gate) * up`` (``beta tanh(g/beta) ~ g``); the gate
    factor never exceeds ``beta`` and the up factor never exceeds ``linear_beta`` in size, so one
    large pre-activation cannot blow up the product as it can in SwiGLU.
    """
    beta = check_finite_number(beta, "beta", 1)
    if linear_beta is not None:
        linear_beta = check_finite_number(linear_beta, "linear_beta", 1)
    if not isinstance(gate, torch.Tensor) or not isinstance(up, torch.Tensor) \
            or gate.shape != up.shape:
        raise ValueError(f"gate and up must be tensors of one shape, got "
                         f"{tuple(getattr(gate, 'shape', ()))} and "
                         f"{tuple(getattr(up, 'shape', ()))}")
    dtype = torch.promote_types(gate.dtype, torch.float32)
    g, u = gate.to(dtype), up.to(dtype)
    g = beta * torch.tanh(g / beta) * torch.sigmoid(g)
    if linear_beta is not None:
        u = linear_beta * torch.tanh(u / linear_beta)
    return (g * u).to(gate.dtype)


class SituGLU(nn.Module):
    """``down_proj(situ(gate_proj x, up_proj x))``, no biases: K3's dense MLP and every expert
    (SGLang ``KimiK3MLP``); the same three matrices as :class:`gpt2k3.moe.SwiGLU`."""

    def __init__(self, d_model: int, d_hidden: int, beta: float = SITU_BETA,
                 linear_beta: float | None = SITU_LINEAR_BETA) -> None:
        super().__init__()
        check_int(d_model, "d_model", 1)
        check_int(d_hidden, "d_hidden", 1)
        self.beta = check_finite_number(beta, "beta", 1)
        self.linear_beta = (None if linear_beta is None
                            else check_finite_number(linear_beta, "linear_beta", 1))
        self.gate_proj = nn.Linear(d_model, d_hidden, bias=False)
        self.up_proj = nn.Linear(d_model, d_hidden, bias=False)
        self.down_proj = nn.Linear(d_hidden, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(situ(self.gate_proj(x), self.up_proj(x), self.beta, self.linear_beta))


# ============================================================================ 3. latent MoE
@dataclass
class LatentMoEConfig:
    """Sizes of one K3 MoE layer (config.json names in brackets).

    ``d_model`` [hidden_size], ``latent_dim`` [routed_expert_hidden_size] (``<= d_model``),
    ``latent_norm`` [latent_moe_use_norm], ``n_routed_experts`` [num_experts],
    ``n_shared_experts`` [num_shared_experts], ``top_k`` [num_experts_per_token], ``d_expert``
    [moe_intermediate_size], ``routed_scaling_factor``, the SiTU constants, and ``norm_eps``
    [rms_norm_eps] for the latent RMSNorm.
    """

    d_model: int
    latent_dim: int
    n_routed_experts: int
    n_shared_experts: int
    top_k: int
    d_expert: int
    latent_norm: bool = True
    routed_scaling_factor: float = 1.0
    situ_beta: float = SITU_BETA
    situ_linear_beta: float | None = SITU_LINEAR_BETA
    norm_eps: float = K3_RMS_NORM_EPS

    def __post_init__(self) -> None:
        for name in ("d_model", "latent_dim", "n_routed_experts", "top_k", "d_expert"):
            check_int(getattr(self, name), name, 1)
        check_int(self.n_shared_experts, "n_shared_experts", 0)
        check_finite_number(self.norm_eps, "norm_eps", 1)
        if self.latent_dim > self.d_model:
            raise ValueError(f"latent_dim ({self.latent_dim}) must be <= d_model "
                             f"({self.d_model}): the latent MoE projects tokens down, not up")
        if self.top_k > self.n_routed_experts:
            raise ValueError(f"top_k ({self.top_k}) must be <= n_routed_experts "
                             f"({self.n_routed_experts})")
        if not isinstance(self.latent_norm, bool):
            raise ValueError(f"latent_norm must be a bool, got {self.latent_norm!r}")

    def router_config(self) -> MoEConfig:
        """The router's rule, :class:`gpt2k3.moe.MoEConfig`: sigmoid scores (``noaux_tc``),
        top-k, weights renormalised and scaled, no expert groups."""
        return MoEConfig(d_model=self.d_model, n_routed_experts=self.n_routed_experts,
                         n_shared_experts=self.n_shared_experts, top_k=self.top_k,
                         d_expert=self.d_expert, score_func="sigmoid", norm_topk_prob=True,
                         routed_scaling_factor=self.routed_scaling_factor)


class LatentMoE(nn.Module):
    """K3's mixture of experts with latent experts (SGLang ``KimiK3MoE``), ``(B, T, d)`` in and
    out::

        z = x W_down                                              d_model -> latent_dim
        y = shared(x) + W_up RMSNorm( sum_{e in TopK(x)} w_e(x) expert_e(z) )

    The router (:class:`gpt2k3.moe.Router`, sigmoid scores) reads the full-width ``x``; the
    shared experts (one :class:`SituGLU` of width ``n_shared_experts * d_expert``) work at full
    width; only the routed experts work at ``latent_dim`` -- each is ``3 latent_dim d_expert``
    instead of ``3 d_model d_expert``, and a token's ``top_k`` experts read the raw projection
    ``z`` and write into a ``latent_dim``-wide sum. The RMSNorm (``latent_norm``) acts on that
    weighted sum, after the experts and before the one up projection -- SGLang's order on every
    path (``_reduce_latent``: tensor-parallel partial sums are reduced in latent space *before*
    the norm, since a norm of a sum is not a sum of norms). Because RMSNorm divides out the
    sum's overall scale, ``routed_scaling_factor`` and the top-k renormalisation change the
    routed output only through the norm's ``eps``. Parameter names follow SGLang:
    ``routed_expert_down_proj``, ``routed_expert_norm``, ``routed_expert_up_proj``.

    :meth:`forward` batches each expert's tokens; :meth:`forward_loop_reference` is the
    definition, one token and one expert at a time.
    """

    def __init__(self, cfg: LatentMoEConfig) -> None:
        super().__init__()
        if not isinstance(cfg, LatentMoEConfig):
            raise ValueError(f"cfg must be a LatentMoEConfig, got {type(cfg).__name__}")
        self.cfg = cfg
        act = dict(beta=cfg.situ_beta, linear_beta=cfg.situ_linear_beta)
        self.gate = Router(cfg.router_config())
        self.routed_expert_down_proj = nn.Linear(cfg.d_model, cfg.latent_dim, bias=False)
        self.routed_expert_norm = (RMSNorm(cfg.latent_dim, cfg.norm_eps) if cfg.latent_norm
                                   else nn.Identity())
        self.experts = nn.ModuleList(SituGLU(cfg.latent_dim, cfg.d_expert, **act)
                                     for _ in range(cfg.n_routed_experts))
        self.routed_expert_up_proj = nn.Linear(cfg.latent_dim, cfg.d_model, bias=False)
        self.shared_experts = (SituGLU(cfg.d_model, cfg.n_shared_experts * cfg.d_expert, **act)
                               if cfg.n_shared_experts else None)

    def _check_x(self, x) -> torch.Tensor:
        if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[-1] != self.cfg.d_model:
            shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"x must have shape (B, T, d_model={self.cfg.d_model}), got {shape}")
        return x.reshape(-1, x.shape[-1])

    def down(self, flat: torch.Tensor) -> torch.Tensor:
        """``x W_down``: what the routed experts read, ``(N, latent_dim)`` -- not normalised."""
        return self.routed_expert_down_proj(flat)

    def up(self, routed_sum: torch.Tensor) -> torch.Tensor:
        """``W_up RMSNorm(routed_sum)``: the routed experts' weighted sum ``(N, latent_dim)``,
        normalised in latent space (when ``latent_norm``), projected back to ``d_model``."""
        return self.routed_expert_up_proj(self.routed_expert_norm(routed_sum))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Batched form: each expert runs once on all the tokens routed to it (in latent space)."""
        flat = self._check_x(x)
        weights, indices = self.gate(flat)                                  # (N, k), (N, k)
        z = self.down(flat)
        acc = torch.zeros_like(z)
        order = indices.flatten().argsort(stable=True)                      # slots by expert
        token_of, weight_of = order // self.cfg.top_k, weights.flatten()[order]
        ends = torch.bincount(indices.flatten(), minlength=self.cfg.n_routed_experts).cumsum(0)
        start = 0
        for e, end in enumerate(ends.tolist()):
            if end > start:
                tok = token_of[start:end]
                acc.index_add_(0, tok, self.experts[e](z[tok]) * weight_of[start:end, None])
            start = end
        out = self.up(acc)                       # one norm and one up projection of the sum
        if self.shared_experts is not None:
            out = out + self.shared_experts(flat)
        return out.view_as(x)

    def forward_loop_reference(self, x: torch.Tensor) -> torch.Tensor:
        """The definition, one token and one expert at a time:
        ``shared(x) + W_up RMSNorm(sum_j w_j expert_{i_j}(x W_down))``."""
        flat = self._check_x(x)
        rows = []
        for n in range(flat.shape[0]):
            xn = flat[n:n + 1]
            weights, indices = self.gate(xn)
            z = self.routed_expert_down_proj(xn)
            routed = torch.zeros_like(z)
            for w, e in zip(weights[0], indices[0].tolist()):
                routed = routed + w * self.experts[e](z)
            routed = self.routed_expert_up_proj(self.routed_expert_norm(routed))
            shared = (self.shared_experts(xn) if self.shared_experts is not None
                      else torch.zeros_like(xn))
            rows.append(shared + routed)
        return torch.cat(rows).view_as(x)


# ======================================================================= 5. Attention Residuals
def _check_sources(sources, name: str = "sources"):
    if isinstance(sources, torch.Tensor) or not isinstance(sources, (list, tuple)) or not sources \
            or any(not isinstance(s, torch.Tensor) or s.shape != sources[0].shape for s in sources):
        raise ValueError(f"{name} must be a non-empty list of tensors of one shape (..., d)")


def depth_mix_reference(sources, query: torch.Tensor, norm_weight: torch.Tensor,
                        eps: float = K3_RMS_NORM_EPS) -> torch.Tensor:
    """Attention Residuals, the definition: one source at a time.

    ``sources`` is a list of ``(..., d)`` tensors -- the block snapshots and the current
    block's running sum. Each is RMS-normalised (gain ``norm_weight``) and scored against the
    learned vector ``query``: ``s_i = <RMSNorm(source_i), query>``. The output is
    ``sum_i softmax(s)_i * source_i``: the weights mix the *raw* sources. (SGLang 0.5.23
    ``srt/layers/attn_residual.py``, ``aggregate_stream_torch``: ``score_norm``, then
    ``score_proj``, a ``d -> 1`` linear map whose weight is ``query``.)
    """
    _check_sources(sources)
    scores = []
    for s in sources:
        normed = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + eps) * norm_weight
        scores.append((normed * query).sum(-1))
    top = scores[0]
    for s in scores[1:]:
        top = torch.maximum(top, s)
    exps = [torch.exp(s - top) for s in scores]
    total = sum(exps)
    out = torch.zeros_like(sources[0])
    for e, s in zip(exps, sources):
        out = out + (e / total)[..., None] * s
    return out


def depth_mix(sources, query: torch.Tensor, norm_weight: torch.Tensor,
              eps: float = K3_RMS_NORM_EPS) -> torch.Tensor:
    """:func:`depth_mix_reference` in one stacked computation (the form the model uses):
    sources stacked ``(R, ..., d)``, scores ``(R, ...)``, softmax over ``R`` in float32 or
    wider."""
    _check_sources(sources)
    rows = torch.stack(list(sources))
    normed = rows * torch.rsqrt(rows.pow(2).mean(-1, keepdim=True) + eps) * norm_weight
    scores = normed @ query
    p = scores.to(torch.promote_types(scores.dtype, torch.float32)).softmax(dim=0)
    return (p[..., None].to(rows.dtype) * rows).sum(0)


class DepthMix(nn.Module):
    """One Attention-Residual read: an RMSNorm gain ``norm.weight`` and a query vector
    ``query`` (both ``d_model``; SGLang ``self_attention_res_norm`` / ``self_attention_res_proj``,
    ``mlp_res_norm`` / ``mlp_res_proj``, ``output_attn_res_norm`` / ``output_attn_res_proj``).
    The query starts at zero, as in the Attention Residuals paper, so an untrained read
    averages its sources uniformly. ``eps`` defaults to K3's ``rms_norm_eps``."""

    def __init__(self, d_model: int, eps: float = K3_RMS_NORM_EPS) -> None:
        super().__init__()
        self.norm = RMSNorm(check_int(d_model, "d_model", 1), check_finite_number(eps, "eps", 1))
        self.query = nn.Parameter(torch.zeros(d_model))

    def forward(self, sources) -> torch.Tensor:
        return depth_mix(sources, self.query, self.norm.weight, self.norm.eps)

    @torch.no_grad()
    def weights(self, sources) -> torch.Tensor:
        """The softmax weights over the sources, ``(R, ...)`` (for figures)."""
        _check_sources(sources)
        rows = torch.stack(list(sources))
        normed = self.norm(rows)
        return (normed @ self.query).softmax(dim=0)


# ============================================================================ 6. the tiny K3
def k3_schedule(n_layer: int, every: int = K3_FULL_ATTN_EVERY) -> tuple[str, ...]:
    """Each layer's token mixer by K3's rule: ``"mla"`` at every ``every``-th layer (1-based)
    and at the last one, ``"kda"`` elsewhere. ``k3_schedule(93)`` puts MLA at 4, 8, ..., 92 and
    93 -- K3's ``linear_attn_config.full_attn_layers``: 24 MLA layers, 69 KDA layers."""
    check_int(n_layer, "n_layer", 1)
    check_int(every, "every", 1)
    full = sorted(set(range(every, n_layer + 1, every)) | {n_layer})
    kda = set(kda_layers_from_full_attn(n_layer, full))
    return tuple("kda" if i in kda else "mla" for i in range(n_layer))


class AttnResidual(nn.Module):
    """Attention Residuals as the residual part of :class:`gpt2k3.gpt2.GPT` (``residual=``).

    The stream is not one running sum. Sources: a bank of snapshots and the current block's
    running sum ``partial``. At layer ``i`` with ``i % block_size == 0`` (``block_size`` counts
    decoder layers, as SGLang's ``attn_res_block_size`` does) a block closes: the
    embedding (``i = 0``) or the finished block's sum joins the bank and ``partial`` restarts
    empty. Each sub-layer reads ``DepthMix(bank + [partial])`` (then its own pre-norm) and adds
    its output to ``partial``; the head reads ``final(bank + [partial])``. (SGLang
    ``KimiK3DecoderLayer`` and ``AttnResidual``: ``is_block_write_layer = layer_idx %
    attn_res_block_size == 0``.) Each layer has two :class:`DepthMix` -- ``attn_mix[i]`` and
    ``mlp_mix[i]`` -- and the stack one more, ``final``. It acts on each token alone, so it
    needs no cache.
    """

    def __init__(self, n_layer: int, d_model: int, block_size: int,
                 eps: float = K3_RMS_NORM_EPS) -> None:
        super().__init__()
        self.block_size = check_int(block_size, "block_size", 1)
        check_int(n_layer, "n_layer", 1)
        self.attn_mix = nn.ModuleList(DepthMix(d_model, eps) for _ in range(n_layer))
        self.mlp_mix = nn.ModuleList(DepthMix(d_model, eps) for _ in range(n_layer))
        self.final = DepthMix(d_model, eps)

    def forward(self, blocks, x: torch.Tensor, caches) -> torch.Tensor:
        if len(blocks) != len(self.attn_mix):
            raise ValueError(f"blocks must hold {len(self.attn_mix)} blocks, got {len(blocks)}")
        bank, partial = [], None
        for i, (block, cache) in enumerate(zip(blocks, caches)):
            if i % self.block_size == 0:                   # a block closes: snapshot it
                bank.append(x if i == 0 else partial)
                partial = None
            sources = bank if partial is None else bank + [partial]
            a = block.mix_tokens(self.attn_mix[i](sources), cache)
            partial = a if partial is None else partial + a
            partial = partial + block.mix_channels(self.mlp_mix[i](bank + [partial]))
        return self.final(bank + [partial])


def k3_model(config: GPTConfig, spec: ArchSpec, *, situ_beta: float = SITU_BETA,
             situ_linear_beta: float | None = SITU_LINEAR_BETA,
             norm_eps: float = K3_RMS_NORM_EPS) -> GPT:
    """The book's one decoder (:class:`gpt2k3.gpt2.GPT`) with Kimi K3's parts, as ``spec`` says:

    * token mixers by ``spec.layer_mixers``: :class:`BoundedKDA` or :class:`GatedNoPEMLA`;
    * channel mixers: a dense :class:`SituGLU` for the first ``first_k_dense`` layers
      (``first_k_dense_replace``), a :class:`LatentMoE` after;
    * RMSNorm everywhere, each with ``norm_eps`` (K3's ``rms_norm_eps``, 1e-5); no position
      table (NoPE everywhere); an untied head (``tie_word_embeddings: false``);
    * with ``attn_res_block_size > 0``, :class:`AttnResidual` as the residual part.

    The model gets ``spec`` and ``schedule`` attributes. :func:`gpt2k3.gpt2.generate` decodes it
    through its layers' caches (latents for MLA, fixed states for KDA) like any other model.
    """
    if not isinstance(config, GPTConfig):
        raise ValueError(f"config must be a GPTConfig, got {type(config).__name__}")
    if not isinstance(spec, ArchSpec):
        raise ValueError(f"spec must be an ArchSpec, got {type(spec).__name__}")
    if spec.n_layer != config.n_layer or spec.d_model != config.n_embd:
        raise ValueError(f"spec ({spec.n_layer} layers, d_model {spec.d_model}) must match config "
                         f"({config.n_layer} layers, n_embd {config.n_embd})")
    schedule = tuple("kda" if k == "kda" else "mla" for k in spec.layer_mixers)
    config = replace(config, position="none", tie_embeddings=False)
    mla_cfg = MLAConfig(d_model=spec.d_model, n_heads=spec.n_head,
                        q_lora_rank=spec.q_lora_rank, kv_lora_rank=spec.kv_lora_rank,
                        qk_nope_head_dim=spec.qk_nope_head_dim,
                        qk_rope_head_dim=spec.qk_rope_head_dim, v_head_dim=spec.v_head_dim,
                        max_len=config.block_size, norm_eps=norm_eps)
    d = config.n_embd
    act = dict(beta=situ_beta, linear_beta=situ_linear_beta)
    moe_cfg = LatentMoEConfig(
        d_model=d, latent_dim=spec.moe_latent_dim, n_routed_experts=spec.n_routed_experts,
        n_shared_experts=spec.n_shared_experts, top_k=spec.top_k, d_expert=spec.d_expert,
        latent_norm=spec.moe_latent_norm, situ_beta=situ_beta,
        situ_linear_beta=situ_linear_beta, norm_eps=norm_eps)

    def mixer(cfg: GPTConfig, i: int) -> nn.Module:
        if schedule[i] == "mla":
            return GatedNoPEMLA(mla_cfg)
        return BoundedKDA(cfg, n_head=spec.kda_n_head, head_dim=spec.kda_head_dim,
                          conv_size=spec.kda_conv_kernel, lower_bound=spec.kda_gate_lower_bound,
                          norm_eps=norm_eps)

    def mlp(cfg: GPTConfig, i: int) -> nn.Module:
        return SituGLU(d, spec.ffn_dim, **act) if i < spec.first_k_dense else LatentMoE(moe_cfg)

    residual = (AttnResidual(config.n_layer, d, spec.attn_res_block_size, norm_eps)
                if spec.attn_res_block_size else None)
    model = GPT(config, mixer=mixer, mlp=mlp, norm=lambda dim: RMSNorm(dim, norm_eps),
                residual=residual)
    model.spec, model.schedule = spec, schedule
    return model


def tiny_k3(config: GPTConfig, *, kda_n_head: int | None = None, kda_head_dim: int | None = None,
            kda_conv_kernel: int = 4, gate_lower_bound: float = K3_GATE_LOWER_BOUND,
            q_lora_rank: int | None = 32, kv_lora_rank: int = 16, qk_nope_head_dim: int = 8,
            qk_rope_head_dim: int = 4, v_head_dim: int = 8, n_routed_experts: int = 8,
            n_shared_experts: int = 2, top_k: int = 2, d_expert: int = 16,
            moe_latent_dim: int | None = None, moe_latent_norm: bool = True,
            first_k_dense: int = 1, d_ff: int | None = None, attn_res_block_size: int = 2,
            full_attn_every: int = K3_FULL_ATTN_EVERY, situ_beta: float = SITU_BETA,
            situ_linear_beta: float | None = SITU_LINEAR_BETA) -> GPT:
    """A tiny Kimi K3 of ``config``'s width, depth, heads, vocabulary and context.

    K3's rules at a small size: MLA at every 4th layer (1-based) and the last, bounded-gate KDA
    elsewhere (:func:`k3_schedule`); gated NoPE MLA; the first ``first_k_dense`` layers dense
    (:class:`SituGLU` of width ``d_ff``, default ``4 n_embd``), latent MoE with shared experts
    after (``moe_latent_dim`` defaults to ``n_embd // 2``, K3's 7,168 -> 3,584); Attention
    Residuals with block size ``attn_res_block_size`` (0: plain residual); no positions; untied
    head; no biases anywhere (``config.bias`` is not used). KDA heads default to the config's.
    The returned model's ``spec`` is the :class:`~gpt2k3.accounting.ArchSpec` describing it.
    """
    if not isinstance(config, GPTConfig):
        raise ValueError(f"config must be a GPTConfig, got {type(config).__name__}")
    d = config.n_embd
    check_finite_number(gate_lower_bound, "gate_lower_bound", -1)
    check_int(attn_res_block_size, "attn_res_block_size", 0)
    check_int(first_k_dense, "first_k_dense", 0)
    if first_k_dense > config.n_layer:
        raise ValueError(f"first_k_dense ({first_k_dense}) must be <= config.n_layer "
                         f"({config.n_layer})")
    latent = d // 2 if moe_latent_dim is None else check_int(moe_latent_dim, "moe_latent_dim", 1)
    if latent > d:
        raise ValueError(f"moe_latent_dim ({latent}) must be <= config.n_embd ({d})")
    if not 1 <= check_int(top_k, "top_k", 1) <= check_int(n_routed_experts, "n_routed_experts", 1):
        raise ValueError(f"top_k ({top_k}) must be <= n_routed_experts ({n_routed_experts})")
    schedule = k3_schedule(config.n_layer, full_attn_every)
    spec = ArchSpec(
        name="tiny Kimi K3", vocab_size=config.vocab_size, n_layer=config.n_layer, d_model=d,
        n_head=config.n_head, d_ff=d_ff, max_positions=config.block_size, bias=False,
        norm="rmsnorm", tied_embeddings=False, mlp="situ", position="none", attention="mla",
        q_lora_rank=q_lora_rank, kv_lora_rank=kv_lora_rank, qk_nope_head_dim=qk_nope_head_dim,
        qk_rope_head_dim=qk_rope_head_dim, v_head_dim=v_head_dim,
        kda_layers=tuple(i for i, k in enumerate(schedule) if k == "kda"),
        kda_n_head=config.n_head if kda_n_head is None else kda_n_head,
        kda_head_dim=config.head_dim if kda_head_dim is None else kda_head_dim,
        kda_conv_kernel=kda_conv_kernel, n_routed_experts=n_routed_experts,
        n_shared_experts=n_shared_experts, top_k=top_k, d_expert=d_expert,
        first_k_dense=first_k_dense, mla_output_gate=True, kda_full_rank_gate=True,
        kda_gate_lower_bound=float(gate_lower_bound), moe_latent_dim=latent,
        moe_latent_norm=moe_latent_norm, attn_res_block_size=attn_res_block_size,
        source="gpt2k3.k3.tiny_k3: Kimi K3's rules at a tiny size")
    return k3_model(config, spec, situ_beta=situ_beta, situ_linear_beta=situ_linear_beta)

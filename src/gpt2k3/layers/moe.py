"""Mixture of experts with a top-k router and shared experts (DeepSeek-V3 / Kimi K2 style).

For a token ``x`` (size ``n_embd``) the layer returns::

    y = shared(x) + sum_{e in TopK(x)} w_e(x) * expert_e(x)

* Every expert is a SwiGLU MLP: ``down( silu(gate x) * (up x) )`` with hidden width ``d_expert``.
* ``shared`` is always on; ``n_shared_experts`` shared experts are stored as one SwiGLU of width
  ``n_shared_experts * d_expert`` (the sum of several SwiGLUs equals one wide SwiGLU).
* The router scores every routed expert: ``s = softmax(x W_g^T)`` or ``s = sigmoid(x W_g^T)``.
  The ``top_k`` experts are *selected* on ``s + b``, where ``b`` is DeepSeek-V3's
  ``e_score_correction_bias`` (auxiliary-loss-free load balancing; used only with sigmoid
  scores, and only for selection, never in the weights). The *weights* are the unbiased scores of
  the chosen experts, renormalised to sum to 1 when ``norm_topk_prob``, then multiplied by
  ``routed_scaling_factor``.
* Group-limited routing (DeepSeek-V3): experts are split into ``n_group`` equal groups, each
  group is rated by the sum of its two best (biased) scores, only the best ``topk_group`` groups
  stay eligible, and the top-k is taken among their experts. ``n_group=1`` switches it off.
  (DeepSeek-V2 rated a group by its single best softmax score; that variant is not modelled:
  the top-two sum is used for both score functions.)

Sources: shared plus fine-grained routed experts are DeepSeekMoE's (Dai et al., 2024,
arXiv:2401.06066), used in DeepSeek-V2 (arXiv:2405.04434); sigmoid scores, the selection-only
bias and its update rule are DeepSeek-V3's (arXiv:2412.19437, section 2.1.2; Wang et al., 2024,
arXiv:2408.15664); Kimi K2 and Kimi Linear reuse the same router.  ``tests/test_moe.py`` checks
this module against Hugging Face's ``DeepseekV3MoE``.

:meth:`MoE.forward_loop_reference` is the definition (one token at a time); :meth:`MoE.forward`
is the fast form (:func:`dispatch`: for each expert, gather its tokens, run them as one batch,
``index_add`` the weighted results back).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from gpt2k3.accounting.k3_mechanisms import SITU_BETA, SITU_LINEAR_BETA
from gpt2k3.archs import K3_RMS_NORM_EPS
from gpt2k3.checks import (check_bool, check_finite_number, check_float_tensor, check_int,
                          check_layer_input, check_positive_float, checked)
from gpt2k3.layers.mlp import SituGLU, SwiGLU
from gpt2k3.layers.norms import RMSNorm

__all__ = ["MoEConfig", "Router", "dispatch", "dispatch_dense", "MoE", "LatentMoEConfig",
           "LatentMoE", "quantile_bias", "quantile_bias_reference", "quantile_bias_histogram"]


@dataclass
class MoEConfig:
    """Sizes and routing rule of one MoE layer (DeepSeek-V3 names in brackets).

    ``n_embd`` [hidden_size], ``n_routed_experts``, ``n_shared_experts`` (may be 0),
    ``top_k`` [num_experts_per_tok], ``d_expert`` [moe_intermediate_size],
    ``score_func`` ``'softmax'`` (DeepSeek-V2, Mixtral-like) or ``'sigmoid'`` (DeepSeek-V3, Kimi K2),
    ``norm_topk_prob``, ``routed_scaling_factor``, and group-limited routing ``n_group`` /
    ``topk_group`` (1 / 1 = off).
    """

    n_embd: int
    n_routed_experts: int
    n_shared_experts: int
    top_k: int
    d_expert: int
    score_func: str = "sigmoid"
    norm_topk_prob: bool = True
    routed_scaling_factor: float = 1.0
    n_group: int = 1
    topk_group: int = 1

    def __post_init__(self) -> None:
        for name in ("n_embd", "n_routed_experts", "top_k", "d_expert", "n_group", "topk_group"):
            check_int(getattr(self, name), name, 1)
        check_int(self.n_shared_experts, "n_shared_experts", 0)
        if self.top_k > self.n_routed_experts:
            raise ValueError(f"top_k={self.top_k} must be <= n_routed_experts={self.n_routed_experts}")
        if self.score_func not in ("softmax", "sigmoid"):
            raise ValueError(f"score_func must be 'softmax' or 'sigmoid', got {self.score_func!r}")
        check_bool(self.norm_topk_prob, "norm_topk_prob")
        check_positive_float(self.routed_scaling_factor, "routed_scaling_factor")
        if self.n_routed_experts % self.n_group:
            raise ValueError(
                f"n_group={self.n_group} must divide n_routed_experts={self.n_routed_experts}"
            )
        if self.topk_group > self.n_group:
            raise ValueError(f"topk_group={self.topk_group} must be <= n_group={self.n_group}")
        group_size = self.n_routed_experts // self.n_group
        if self.top_k > self.topk_group * group_size:
            raise ValueError(
                f"top_k={self.top_k} exceeds the {self.topk_group * group_size} experts in "
                f"topk_group={self.topk_group} groups of {group_size}"
            )

    @property
    def hidden_size(self) -> int:
        """Alias of ``n_embd`` (the Hugging Face name)."""
        return self.n_embd

    @classmethod
    def deepseek_v3(cls) -> "MoEConfig":
        """DeepSeek-V3 MoE layer.

        From the config.json of deepseek-ai/DeepSeek-V3: ``n_routed_experts`` 256,
        ``n_shared_experts`` 1, ``num_experts_per_tok`` 8, ``moe_intermediate_size`` 2048,
        ``scoring_func`` sigmoid, ``norm_topk_prob`` true, ``routed_scaling_factor`` 2.5,
        ``n_group`` 8, ``topk_group`` 4 (transformers' ``DeepseekV3Config`` defaults agree).
        The sizes come from :data:`gpt2k3.archs.DEEPSEEK_V3` (:meth:`from_spec`), the one place
        they are written; the routing rule is not part of a spec and is given here.
        """
        from gpt2k3.archs import DEEPSEEK_V3

        return cls.from_spec(DEEPSEEK_V3, score_func="sigmoid", norm_topk_prob=True,
                             routed_scaling_factor=2.5, n_group=8, topk_group=4)

    @classmethod
    def kimi_k2(cls) -> "MoEConfig":
        """Kimi K2 MoE layer: 384 experts, no expert groups.

        From the config.json of moonshotai/Kimi-K2-Instruct: ``n_routed_experts`` 384,
        ``n_shared_experts`` 1, ``num_experts_per_tok`` 8, ``moe_intermediate_size`` 2048,
        ``scoring_func`` sigmoid, ``norm_topk_prob`` true, ``routed_scaling_factor`` 2.827,
        ``n_group`` 1, ``topk_group`` 1.  The sizes come from :data:`gpt2k3.archs.KIMI_K2`
        (:meth:`from_spec`); the routing rule is given here.
        """
        from gpt2k3.archs import KIMI_K2

        return cls.from_spec(KIMI_K2, score_func="sigmoid", norm_topk_prob=True,
                             routed_scaling_factor=2.827, n_group=1, topk_group=1)

    @classmethod
    def from_spec(cls, spec, **overrides) -> "MoEConfig":
        """One MoE layer of an :class:`gpt2k3.accounting.ArchSpec` with routed experts.

        ``n_embd``, ``n_routed_experts``, ``n_shared_experts``, ``top_k`` and ``d_expert`` come
        from the spec; the routing rule (``score_func``, ``norm_topk_prob``,
        ``routed_scaling_factor``, ``n_group``, ``topk_group``) keeps its defaults unless given
        in ``overrides``.  A latent MoE (``moe_latent_dim > 0``, Kimi K3) is not a plain
        :class:`MoEConfig` and raises ``ValueError``.
        """
        from gpt2k3.accounting import ArchSpec

        if not isinstance(spec, ArchSpec) or not spec.is_moe:
            raise ValueError(f"spec must be an ArchSpec with n_routed_experts > 0, got {spec!r}")
        if spec.moe_latent_dim:
            raise ValueError(f"spec {spec.name!r} has a latent MoE (moe_latent_dim="
                             f"{spec.moe_latent_dim}); a plain MoEConfig cannot express it")
        sizes = dict(n_embd=spec.n_embd, n_routed_experts=spec.n_routed_experts,
                     n_shared_experts=spec.n_shared_experts, top_k=spec.top_k,
                     d_expert=spec.d_expert)
        return cls(**{**sizes, **overrides})


def check_router_input(router, x) -> None:
    """The door of :meth:`Router.forward`: tokens ``x`` ``(N, n_embd)`` in the router's dtype
    (shapes and types only, so no host sync)."""
    check_layer_input(x, "x", router.cfg.n_embd, router.weight.dtype, ndim=2,
                      shape=f"(N, n_embd={router.cfg.n_embd})", finite=False)


def check_update_bias(router, load, step=1e-3) -> None:
    """The door of :meth:`Router.update_bias`: ``load`` ``(n_routed_experts,)``, ``step`` a finite
    number ``> 0``."""
    n = router.cfg.n_routed_experts
    if not isinstance(load, torch.Tensor) or tuple(load.shape) != (n,):
        raise ValueError(f"load must be a tensor of shape (n_routed_experts={n},), got "
                         f"{getattr(load, 'shape', type(load).__name__)}")
    check_finite_number(step, "step", 1)


class Router(nn.Module):
    """Linear gate without bias plus top-k selection (see the module docstring for the rule).

    ``weight`` is ``(n_routed_experts, n_embd)``; ``e_score_correction_bias`` is a buffer of
    size ``n_routed_experts`` that shifts *selection* only, and only for sigmoid scores.
    """

    def __init__(self, cfg: MoEConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.weight = nn.Parameter(torch.empty(cfg.n_routed_experts, cfg.n_embd))
        nn.init.normal_(self.weight, std=cfg.n_embd ** -0.5)
        self.register_buffer("e_score_correction_bias", torch.zeros(cfg.n_routed_experts))

    def scores(self, x: torch.Tensor) -> torch.Tensor:
        """Affinities ``(N, E)`` of tokens ``x`` ``(N, n_embd)`` to every routed expert."""
        logits = F.linear(x, self.weight)
        return logits.softmax(dim=-1) if self.cfg.score_func == "softmax" else logits.sigmoid()

    @checked(check_router_input)
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Route tokens ``x`` ``(N, n_embd)``; return ``weights`` and ``indices``, both ``(N, top_k)``."""
        cfg = self.cfg
        s = self.scores(x)
        choice = s + self.e_score_correction_bias.to(s.dtype) if cfg.score_func == "sigmoid" else s
        if cfg.n_group > 1:
            n, size = s.shape[0], cfg.n_routed_experts // cfg.n_group
            grouped = choice.view(n, cfg.n_group, size)
            group_score = grouped.topk(min(2, size), dim=-1).values.sum(-1)            # (N, n_group)
            keep = torch.zeros_like(group_score, dtype=torch.bool)
            keep.scatter_(1, group_score.topk(cfg.topk_group, dim=-1).indices, True)
            choice = grouped.masked_fill(~keep[..., None], float("-inf")).view(n, -1)
        indices = choice.topk(cfg.top_k, dim=-1).indices
        weights = s.gather(1, indices)
        if cfg.norm_topk_prob:
            weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
        return weights * cfg.routed_scaling_factor, indices

    @torch.no_grad()
    def assignment(self, x: torch.Tensor) -> torch.Tensor:
        """The routing of tokens ``x`` ``(N, n_embd)`` as a dense ``(N, n_routed_experts)`` matrix:
        entry ``(n, e)`` is the weight token ``n`` gives expert ``e`` (0 if ``e`` was not chosen)."""
        weights, indices = self(x)
        out = torch.zeros(x.shape[0], self.cfg.n_routed_experts, dtype=weights.dtype,
                          device=weights.device)
        return out.scatter_(1, indices, weights)

    @checked(check_update_bias)
    @torch.no_grad()
    def update_bias(self, load: torch.Tensor, step: float = 1e-3) -> None:
        """DeepSeek-V3's auxiliary-loss-free balancing step: ``b_e += step * sign(mean load - load_e)``.

        Overloaded experts become less likely to be selected, underloaded ones more likely.
        ``load`` is ``(n_routed_experts,)`` tokens per expert (``MoE.last_load``); ``step`` a
        finite number ``> 0`` (a NaN step would turn every bias into NaN, and the bias is saved
        with the model). :func:`quantile_bias` is Kimi K3's replacement for this rule.
        """
        load = load.to(self.e_score_correction_bias.dtype)
        self.e_score_correction_bias += step * torch.sign(load.mean() - load)


# ====================================================================== Quantile Balancing
def check_quantile_bias(scores, bias, k, bins=None) -> None:
    """The door of the Quantile Balancing functions: ``scores`` a finite ``(m, n)`` float
    tensor, ``bias`` ``(n,)``, ``1 <= k < n``, ``bins`` (histogram form) an int ``>= 2``."""
    check_float_tensor(scores, "scores", 2)
    m, n = scores.shape
    if m < 1:
        raise ValueError(f"scores must hold at least one token (m >= 1), got shape {tuple(scores.shape)}")
    if not isinstance(bias, torch.Tensor) or tuple(bias.shape) != (n,):
        raise ValueError(f"bias must be a tensor of shape (n={n},), got "
                         f"{getattr(bias, 'shape', type(bias).__name__)}")
    check_int(k, "k", 1)
    if k >= n:
        raise ValueError(f"k must be < n (the number of experts, {n}), got {k}")
    if bins is not None:
        check_int(bins, "bins", 2)
    if not bool(torch.isfinite(scores).all()) or not bool(torch.isfinite(bias).all()):
        raise ValueError("scores and bias must be finite (no NaN or inf)")


def qb_margins(scores: torch.Tensor, bias: torch.Tensor, k: int) -> tuple[torch.Tensor, int]:
    """Eq. 14's margins ``s_ij - alpha_i`` ``(m, n)``, with ``alpha_i`` token ``i``'s
    ``(k+1)``-th largest biased score (the cutoff of Top-(k+1) routing), and the rank from the
    top, ``q + 1`` for ``q = m k / n``, of the margin each expert's threshold sits at."""
    m, n = scores.shape
    alpha = (scores + bias).topk(k + 1, dim=-1).values[:, -1:]          # (m, 1): the cutoffs
    rank = m - math.floor((m - 1) * (1 - k / n))                        # q + 1 when q is whole
    return scores - alpha, rank


@checked(check_quantile_bias)
def quantile_bias_reference(scores: torch.Tensor, bias: torch.Tensor, k: int) -> torch.Tensor:
    """Eq. 14 one expert at a time: sort each expert's margins, put its threshold at the
    ``(q+1)``-th largest, so that ``q = m k / n`` margins stay above it. The definition that
    :func:`quantile_bias` (one call for all experts) is tested against."""
    margins, rank = qb_margins(scores, bias, k)
    b_hat = torch.stack([-margins[:, j].sort(descending=True).values[rank - 1]
                         for j in range(scores.shape[1])])
    return b_hat - b_hat.mean()


@checked(check_quantile_bias)
def quantile_bias(scores: torch.Tensor, bias: torch.Tensor, k: int) -> torch.Tensor:
    """Kimi K3's Quantile Balancing (report, section 2.3.3, Eq. 14): the next bias ``(n,)``.

    ``scores`` ``(m, n)`` are the batch's router scores after the sigmoid, ``bias`` the one
    they were routed with. Each expert's new bias is minus the ``(1 - k/n)``-quantile of its
    margins ``s_ij - alpha_i`` over the batch, so that its target load ``q = m k / n`` of
    them clear the cutoffs; then all biases are centred (a common offset changes no Top-k).
    """
    margins, rank = qb_margins(scores, bias, k)
    b_hat = -margins.kthvalue(scores.shape[0] - rank + 1, dim=0).values
    return b_hat - b_hat.mean()


@checked(check_quantile_bias)
def quantile_bias_histogram(scores: torch.Tensor, bias: torch.Tensor, k: int,
                            bins: int = 256) -> torch.Tensor:
    """:func:`quantile_bias` from bin counts, as a multi-device run computes it: each device
    counts its tokens' margins into ``bins`` equal bins per expert, one all-reduce sums the
    counts, and each threshold is read off the pooled counts. The bins span every possible
    margin, ``[-1 - max b, 1 - min b]`` (scores lie in ``(0, 1)``), which every device knows
    from the shared bias alone; the result is within one bin width of the exact quantile."""
    margins, rank = qb_margins(scores, bias, k)
    n = scores.shape[1]
    lo, hi = -1 - bias.max(), 1 - bias.min()
    width = (hi - lo) / bins
    which = ((margins - lo) / width).floor().long().clamp(0, bins - 1)       # (m, n)
    counts = torch.bincount((which + bins * torch.arange(n, device=which.device)).flatten(),
                            minlength=n * bins).view(n, bins)  # (n, bins): what is all-reduced
    at_or_above = counts.flip(-1).cumsum(-1).flip(-1)          # margins in this bin or higher
    j = (at_or_above >= rank).sum(-1, keepdim=True) - 1        # the bin of the rank-th largest
    c = counts.gather(1, j)
    r = rank - (at_or_above.gather(1, j) - c)                  # its rank inside that bin
    j, r, c = (t.to(scores.dtype) for t in (j, r, c))
    threshold = lo + width * (j + 1 - (r - 0.5) / c)           # spread evenly over the bin
    b_hat = -threshold.squeeze(1)
    return b_hat - b_hat.mean()


def dispatch(x: torch.Tensor, weights: torch.Tensor, indices: torch.Tensor,
             experts: nn.ModuleList) -> torch.Tensor:
    """``out[n] = sum_j weights[n, j] * experts[indices[n, j]](x[n])``, one batched call per
    expert: the one expert dispatch of :class:`MoE` and :class:`LatentMoE`.

    ``x`` is ``(N, width)``, ``weights`` and ``indices`` ``(N, top_k)`` from a :class:`Router`.
    With fewer routes than experts (a decode step) it runs :func:`dispatch_dense` instead,
    which reads nothing back to the host.
    """
    if indices.numel() < len(experts):
        return dispatch_dense(x, weights, indices, experts)
    # Sort the N*k (token, slot) assignments by expert, so that each expert reads one
    # contiguous run of them.
    order = indices.flatten().argsort(stable=True)
    token_of, weight_of = order // indices.shape[1], weights.flatten()[order]
    ends = torch.bincount(indices.flatten(), minlength=len(experts)).cumsum(0).tolist()
    out, start = torch.zeros_like(x), 0
    for expert, end in zip(experts, ends):
        if end > start:
            tok = token_of[start:end]
            out.index_add_(0, tok, expert(x[tok]) * weight_of[start:end, None])
        start = end
    return out


def dispatch_dense(x: torch.Tensor, weights: torch.Tensor, indices: torch.Tensor,
                   experts: nn.ModuleList) -> torch.Tensor:
    """:func:`dispatch` without reading the routes on the host: every expert runs on every
    token, weighted by what the token gives it (0 if it did not choose it). Cheap when there
    are few tokens, as in a decode step; a decode step must not wait on the device."""
    gate = torch.zeros(x.shape[0], len(experts), dtype=weights.dtype, device=x.device)
    gate.scatter_(1, indices, weights)                                  # (N, n_experts)
    out = torch.zeros_like(x)
    for e, expert in enumerate(experts):
        out = out + gate[:, e, None] * expert(x)
    return out


def check_moe_input(layer, x) -> None:
    """The door of an MoE layer's forms (:class:`MoE`, :class:`LatentMoE`): ``x`` ``(B, T,
    n_embd)`` in the router's dtype. Shapes and types only, so no host sync."""
    check_layer_input(x, "x", layer.cfg.n_embd, layer.gate.weight.dtype,
                      shape=f"(B, T, n_embd={layer.cfg.n_embd})", finite=False)


class MoE(nn.Module):
    """Routed SwiGLU experts plus always-on shared experts; ``(B, T, n_embd) -> (B, T, n_embd)``.

    Parameter names match Hugging Face's DeepSeek-V3 MoE except that routed experts are separate
    modules ``experts[e].{gate,up,down}_proj`` instead of packed 3-D tensors.
    """

    def __init__(self, cfg: MoEConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.gate = Router(cfg)
        self.experts = nn.ModuleList(
            SwiGLU(cfg.n_embd, cfg.d_expert) for _ in range(cfg.n_routed_experts)
        )
        self.shared_experts = (SwiGLU(cfg.n_embd, cfg.d_expert * cfg.n_shared_experts)
                               if cfg.n_shared_experts else None)
        self.last_load: torch.Tensor | None = None  # tokens per expert in the latest forward

    def _load(self, indices: torch.Tensor) -> torch.Tensor:
        return torch.bincount(indices.flatten(), minlength=self.cfg.n_routed_experts)

    @checked(check_moe_input)
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Fast form: one batched call per expert over the tokens routed to it.

        Sets ``self.last_load`` to the tokens-per-expert counts ``(n_routed_experts,)``.
        """
        flat = x.reshape(-1, x.shape[-1])
        weights, indices = self.gate(flat)                                 # (N, k), (N, k)
        out = dispatch(flat, weights, indices, self.experts)
        if self.shared_experts is not None:
            out = out + self.shared_experts(flat)
        self.last_load = self._load(indices)
        return out.view_as(x)

    @checked(check_moe_input)
    def forward_loop_reference(self, x: torch.Tensor) -> torch.Tensor:
        """The definition, one token at a time: ``y = shared(x) + sum_j w_j expert_{i_j}(x)``."""
        flat = x.reshape(-1, x.shape[-1])
        rows = []
        for n in range(flat.shape[0]):
            xn = flat[n:n + 1]
            weights, indices = self.gate(xn)
            y = self.shared_experts(xn) if self.shared_experts is not None else torch.zeros_like(xn)
            for w, e in zip(weights[0], indices[0].tolist()):
                y = y + w * self.experts[e](xn)
            rows.append(y)
        return torch.cat(rows).view_as(x)

    @checked(check_moe_input)
    @torch.no_grad()
    def load_stats(self, x: torch.Tensor) -> torch.Tensor:
        """Tokens routed to each expert for ``x`` ``(B, T, n_embd)``.

        Returns ``(n_routed_experts,)`` integer counts that sum to ``B * T * top_k``.
        """
        _, indices = self.gate(x.reshape(-1, x.shape[-1]))
        return self._load(indices)


# ============================================================================ 3. latent MoE
@dataclass
class LatentMoEConfig:
    """Sizes of one K3 MoE layer (config.json names in brackets).

    ``n_embd`` [hidden_size], ``latent_dim`` [routed_expert_hidden_size] (``<= n_embd``),
    ``latent_norm`` [latent_moe_use_norm], ``n_routed_experts`` [num_experts],
    ``n_shared_experts`` [num_shared_experts], ``top_k`` [num_experts_per_token], ``d_expert``
    [moe_intermediate_size], ``routed_scaling_factor``, the SiTU constants, and ``norm_eps``
    [rms_norm_eps] for the latent RMSNorm.
    """

    n_embd: int
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
        for name in ("n_embd", "latent_dim", "n_routed_experts", "top_k", "d_expert"):
            check_int(getattr(self, name), name, 1)
        check_int(self.n_shared_experts, "n_shared_experts", 0)
        check_finite_number(self.norm_eps, "norm_eps", 1)
        if self.latent_dim > self.n_embd:
            raise ValueError(f"latent_dim ({self.latent_dim}) must be <= n_embd "
                             f"({self.n_embd}): the latent MoE projects tokens down, not up")
        if self.top_k > self.n_routed_experts:
            raise ValueError(f"top_k ({self.top_k}) must be <= n_routed_experts "
                             f"({self.n_routed_experts})")
        check_bool(self.latent_norm, "latent_norm")

    def router_config(self) -> MoEConfig:
        """The router's rule, :class:`gpt2k3.layers.moe.MoEConfig`: sigmoid scores (``noaux_tc``),
        top-k, weights renormalised and scaled, no expert groups."""
        return MoEConfig(n_embd=self.n_embd, n_routed_experts=self.n_routed_experts,
                         n_shared_experts=self.n_shared_experts, top_k=self.top_k,
                         d_expert=self.d_expert, score_func="sigmoid", norm_topk_prob=True,
                         routed_scaling_factor=self.routed_scaling_factor)



class LatentMoE(nn.Module):
    """K3's mixture of experts with latent experts (SGLang ``KimiK3MoE``), ``(B, T, d)`` in and
    out::

        z = x W_down                                              n_embd -> latent_dim
        y = shared(x) + W_up RMSNorm( sum_{e in TopK(x)} w_e(x) expert_e(z) )

    The router (:class:`gpt2k3.layers.moe.Router`, sigmoid scores) reads the full-width ``x``; the
    shared experts (one :class:`SituGLU` of width ``n_shared_experts * d_expert``) work at full
    width; only the routed experts work at ``latent_dim`` -- each is ``3 latent_dim d_expert``
    instead of ``3 n_embd d_expert``, and a token's ``top_k`` experts read the raw projection
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
        self.routed_expert_down_proj = nn.Linear(cfg.n_embd, cfg.latent_dim, bias=False)
        self.routed_expert_norm = (RMSNorm(cfg.latent_dim, cfg.norm_eps) if cfg.latent_norm
                                   else nn.Identity())
        self.experts = nn.ModuleList(SituGLU(cfg.latent_dim, cfg.d_expert, **act)
                                     for _ in range(cfg.n_routed_experts))
        self.routed_expert_up_proj = nn.Linear(cfg.latent_dim, cfg.n_embd, bias=False)
        self.shared_experts = (SituGLU(cfg.n_embd, cfg.n_shared_experts * cfg.d_expert, **act)
                               if cfg.n_shared_experts else None)

    def down(self, flat: torch.Tensor) -> torch.Tensor:
        """``x W_down``: what the routed experts read, ``(N, latent_dim)`` -- not normalised."""
        return self.routed_expert_down_proj(flat)

    def up(self, routed_sum: torch.Tensor) -> torch.Tensor:
        """``W_up RMSNorm(routed_sum)``: the routed experts' weighted sum ``(N, latent_dim)``,
        normalised in latent space (when ``latent_norm``), projected back to ``n_embd``."""
        return self.routed_expert_up_proj(self.routed_expert_norm(routed_sum))

    @checked(check_moe_input)
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Batched form: each expert runs once on all the tokens routed to it (in latent space)."""
        flat = x.reshape(-1, x.shape[-1])                                   # (N, n_embd)
        weights, indices = self.gate(flat)                                  # (N, k), (N, k)
        routed = dispatch(self.down(flat), weights, indices, self.experts)  # in latent space
        out = self.up(routed)                    # one norm and one up projection of the sum
        if self.shared_experts is not None:
            out = out + self.shared_experts(flat)
        return out.view_as(x)

    @checked(check_moe_input)
    def forward_loop_reference(self, x: torch.Tensor) -> torch.Tensor:
        """The definition, one token and one expert at a time:
        ``shared(x) + W_up RMSNorm(sum_j w_j expert_{i_j}(x W_down))``."""
        flat = x.reshape(-1, x.shape[-1])
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

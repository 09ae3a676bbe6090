r"""What Kimi K3 adds, built from the book's parts: a tiny Kimi K3 you can train and decode.

Kimi K3 (Kimi Team 2026, "Kimi K3: Open Frontier Intelligence", arXiv:2607.24653; config.json of
``moonshotai/Kimi-K3``; SGLang 0.5.23 ``srt/models/kimi_k3.py``) is Kimi Linear's hybrid -- KDA
layers with a multi-head latent attention (MLA) layer every fourth -- plus six mechanisms. Each
is here as a small, readable piece, with a reference form beside the form the model uses where
the two differ, and the config field it follows:

1. :func:`bounded_log_decay` and :class:`BoundedKDA` -- KDA's decay bounded below
   (``linear_attn_config.gate_lower_bound``, -5.0) and its full-rank sigmoid output gate
   (``linear_attn_config.use_full_rank_gate``).
2. :class:`gpt2k3.layers.mla.MLA` with ``rope=False`` -- no rotary positions
   (``mla_use_nope``) -- and ``output_gate=True``, a full-rank sigmoid gate on its output
   (``mla_use_output_gate``).
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
   decoder :class:`gpt2k3.model.GPT` (the same class as GPT-2), decoded by
   :func:`gpt2k3.model.generate` through its layers' caches, with a ``spec`` attribute, an
   :class:`gpt2k3.accounting.ArchSpec` that :func:`gpt2k3.accounting.count_params` counts to the
   parameter.
"""

from __future__ import annotations

from dataclasses import replace

import torch.nn as nn

from gpt2k3.accounting import ArchSpec, hybrid_layers
from gpt2k3.accounting.k3_mechanisms import SITU_BETA, SITU_LINEAR_BETA
from gpt2k3.archs import K3_GATE_LOWER_BOUND, K3_RMS_NORM_EPS
from gpt2k3.checks import check_finite_number, check_int
from gpt2k3.config import GPTConfig
from gpt2k3.layers.deltanet import BoundedKDA
from gpt2k3.layers.mla import MLA, MLAConfig
from gpt2k3.layers.mlp import SituGLU
from gpt2k3.layers.moe import LatentMoE, LatentMoEConfig
from gpt2k3.layers.norms import RMSNorm
from gpt2k3.layers.residual import AttnResidual
from gpt2k3.model import GPT

__all__ = ["SITU_BETA", "SITU_LINEAR_BETA", "K3_FULL_ATTN_EVERY", "k3_model", "tiny_k3"]

# SITU_BETA, SITU_LINEAR_BETA (``activation_situ_beta`` / ``activation_situ_linear_beta``) come
# from gpt2k3.accounting.k3_mechanisms, which reads them off gpt2k3.archs.KIMI_K3_CONFIG.
#: K3's ``full_attn_layers`` are every 4th layer (1-based) plus the last one.
K3_FULL_ATTN_EVERY = 4


# ============================================================================ 6. the tiny K3
def k3_model(config: GPTConfig, spec: ArchSpec, *, situ_beta: float = SITU_BETA,
             situ_linear_beta: float | None = SITU_LINEAR_BETA,
             norm_eps: float = K3_RMS_NORM_EPS) -> GPT:
    """The book's one decoder (:class:`gpt2k3.model.GPT`) with Kimi K3's parts, as ``spec`` says:

    * token mixers by ``spec.layer_mixers``: :class:`BoundedKDA`, or :class:`MLA` without
      positions and with the spec's ``mla_output_gate``;
    * channel mixers: a dense :class:`SituGLU` for the first ``first_k_dense`` layers
      (``first_k_dense_replace``), a :class:`LatentMoE` after;
    * RMSNorm everywhere, each with ``norm_eps`` (K3's ``rms_norm_eps``, 1e-5); no position
      table (NoPE everywhere); an untied head (``tie_word_embeddings: false``);
    * with ``attn_res_block_size > 0``, :class:`AttnResidual` as the residual part.

    The model gets ``spec`` and ``schedule`` attributes. :func:`gpt2k3.model.generate` decodes it
    through its layers' caches (latents for MLA, fixed states for KDA) like any other model.
    """
    if not isinstance(config, GPTConfig):
        raise ValueError(f"config must be a GPTConfig, got {type(config).__name__}")
    if not isinstance(spec, ArchSpec):
        raise ValueError(f"spec must be an ArchSpec, got {type(spec).__name__}")
    if spec.n_layer != config.n_layer or spec.n_embd != config.n_embd:
        raise ValueError(f"spec ({spec.n_layer} layers, n_embd {spec.n_embd}) must match config "
                         f"({config.n_layer} layers, n_embd {config.n_embd})")
    schedule = tuple("kda" if k == "kda" else "mla" for k in spec.layer_mixers)
    config = replace(config, position="none", tie_embeddings=False)
    mla_cfg = MLAConfig(n_embd=spec.n_embd, n_heads=spec.n_head,
                        q_lora_rank=spec.q_lora_rank, kv_lora_rank=spec.kv_lora_rank,
                        qk_nope_head_dim=spec.qk_nope_head_dim,
                        qk_rope_head_dim=spec.qk_rope_head_dim, v_head_dim=spec.v_head_dim,
                        max_len=config.block_size, norm_eps=norm_eps, rope=False,
                        output_gate=spec.mla_output_gate)
    d = config.n_embd
    act = dict(beta=situ_beta, linear_beta=situ_linear_beta)
    moe_cfg = LatentMoEConfig(
        n_embd=d, latent_dim=spec.moe_latent_dim, n_routed_experts=spec.n_routed_experts,
        n_shared_experts=spec.n_shared_experts, top_k=spec.top_k, d_expert=spec.d_expert,
        latent_norm=spec.moe_latent_norm, situ_beta=situ_beta,
        situ_linear_beta=situ_linear_beta, norm_eps=norm_eps)

    def mixer(cfg: GPTConfig, i: int) -> nn.Module:
        if schedule[i] == "mla":
            return MLA(mla_cfg)
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

    K3's rules at a small size: MLA at every ``full_attn_every``-th layer (1-based) and the
    last, bounded-gate KDA elsewhere (:func:`gpt2k3.accounting.hybrid_layers`, the book's one
    schedule); gated NoPE MLA; the first ``first_k_dense`` layers dense
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
    kda_layers = hybrid_layers(config.n_layer, check_int(full_attn_every, "full_attn_every", 1) - 1)
    spec = ArchSpec(
        name="tiny Kimi K3", vocab_size=config.vocab_size, n_layer=config.n_layer, n_embd=d,
        n_head=config.n_head, d_ff=d_ff, max_positions=config.block_size, bias=False,
        norm="rmsnorm", tied_embeddings=False, mlp="situ", position="none", attention="mla",
        q_lora_rank=q_lora_rank, kv_lora_rank=kv_lora_rank, qk_nope_head_dim=qk_nope_head_dim,
        qk_rope_head_dim=qk_rope_head_dim, v_head_dim=v_head_dim,
        kda_layers=kda_layers,
        kda_n_head=config.n_head if kda_n_head is None else kda_n_head,
        kda_head_dim=config.head_dim if kda_head_dim is None else kda_head_dim,
        kda_conv_kernel=kda_conv_kernel, n_routed_experts=n_routed_experts,
        n_shared_experts=n_shared_experts, top_k=top_k, d_expert=d_expert,
        first_k_dense=first_k_dense, mla_output_gate=True, kda_full_rank_gate=True,
        kda_gate_lower_bound=float(gate_lower_bound), moe_latent_dim=latent,
        moe_latent_norm=moe_latent_norm, attn_res_block_size=attn_res_block_size,
        source="gpt2k3.models.k3.tiny_k3: Kimi K3's rules at a tiny size")
    return k3_model(config, spec, situ_beta=situ_beta, situ_linear_beta=situ_linear_beta)

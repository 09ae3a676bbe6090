"""Published architectures as data (:class:`gpt2k3.accounting.ArchSpec` values).

Each spec carries its ``source``.  The GPT-2 sizes are those of OpenAI's released
checkpoints (Radford et al., 2019; the ``config.json`` files of the ``gpt2``,
``gpt2-medium``, ``gpt2-large`` and ``gpt2-xl`` checkpoints): vocabulary 50,257,
1,024 learned positions, LayerNorm with bias, head tied to the token embedding.

The mixture-of-experts models are transcribed from the ``config.json`` published with their
weights on Hugging Face (field names in brackets below):

* ``DEEPSEEK_V3`` -- ``deepseek-ai/DeepSeek-V3`` (DeepSeek-AI, 2024, arXiv:2412.19437); the same
  sizes are the defaults of ``transformers.DeepseekV3Config``.  The count is the main model;
  the released weights add one multi-token-prediction module (11.5B unique parameters,
  ``num_nextn_predict_layers``) used only for speculative decoding, which is not counted.
* ``KIMI_K2`` -- ``moonshotai/Kimi-K2-Instruct`` (Kimi Team, 2025, arXiv:2507.20534), a
  ``DeepseekV3ForCausalLM``: DeepSeek-V3's layout with 64 heads, 384 experts, one dense layer,
  a 163,840-token vocabulary.
* ``KIMI_LINEAR_48B`` -- ``moonshotai/Kimi-Linear-48B-A3B-Instruct`` (Kimi Team, 2025,
  arXiv:2510.26692): 27 layers, KDA in 20 of them and MLA in 7 (``linear_attn_config``:
  ``full_attn_layers`` 4, 8, ..., 24, 27, 1-based), MLA without positional encoding
  (``mla_use_nope``), MLA queries without a low-rank bottleneck (``q_lora_rank: null``).

``PUBLISHED`` holds the headline sizes the model cards and reports state (rounded), so the
chapters can set them beside the exact counts.

``K3_SCALE`` (chapter 8) is *not* a published configuration: it is an illustrative model of
about 2.8 trillion parameters in the Kimi Linear style, built from Kimi K2's published sizes
and Kimi Linear's published layer design, with two sizes chosen to reach 2.8T.
``K3_ASSUMPTIONS`` lists every choice with its status and source.  ``KIMI_LINEAR_CLAIMS``
holds the efficiency claims of the Kimi Linear report that chapter 8 checks against the
accounting, quoted as published.
"""

from __future__ import annotations

from .accounting import ArchSpec, hybrid_layers

__all__ = ["GPT2_SMALL", "GPT2_MEDIUM", "GPT2_LARGE", "GPT2_XL", "GPT2_FAMILY", "DEEPSEEK_V3",
           "KIMI_K2", "KIMI_LINEAR_48B", "MOE_MODELS", "PUBLISHED", "K3_TOTAL_PARAMS",
           "K3_SCALE", "K3_ASSUMPTIONS", "KIMI_LINEAR_CLAIMS", "gpt2_multiples",
           "gpt2_to_k3_steps", "spec_from_gpt_config", "hf_config", "hf_meta_model"]

_GPT2_SOURCE = ("Radford et al. 2019, 'Language Models are Unsupervised Multitask Learners'; "
                "sizes from the released checkpoints' config.json")


def _gpt2(name: str, n_layer: int, n_head: int, d_model: int) -> ArchSpec:
    return ArchSpec(name=name, vocab_size=50257, n_layer=n_layer, d_model=d_model, n_head=n_head,
                    max_positions=1024, bias=True, norm="layernorm", tied_embeddings=True,
                    source=_GPT2_SOURCE)


GPT2_SMALL = _gpt2("GPT-2 small", 12, 12, 768)
GPT2_MEDIUM = _gpt2("GPT-2 medium", 24, 16, 1024)
GPT2_LARGE = _gpt2("GPT-2 large", 36, 20, 1280)
GPT2_XL = _gpt2("GPT-2 XL", 48, 25, 1600)
GPT2_FAMILY = (GPT2_SMALL, GPT2_MEDIUM, GPT2_LARGE, GPT2_XL)

#: DeepSeek-V3 (671B total, 37B activated): MLA in every layer, 3 dense layers then 58 MoE
#: layers of 256 routed experts (8 per token) and 1 shared expert.
DEEPSEEK_V3 = ArchSpec(
    name="DeepSeek-V3", vocab_size=129280, n_layer=61, d_model=7168, n_head=128, d_ff=18432,
    max_positions=163840, bias=False, norm="rmsnorm", tied_embeddings=False, mlp="swiglu",
    position="rope", attention="mla", q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128,
    qk_rope_head_dim=64, v_head_dim=128, n_routed_experts=256, n_shared_experts=1, top_k=8,
    d_expert=2048, first_k_dense=3,
    source=("DeepSeek-AI 2024, 'DeepSeek-V3 Technical Report' (arXiv:2412.19437); config.json of "
            "deepseek-ai/DeepSeek-V3 (= transformers' DeepseekV3Config defaults)"))

#: Kimi K2 (about 1T total, 32B activated): DeepSeek-V3's architecture with half the heads,
#: 384 routed experts, one dense layer and a larger vocabulary.
KIMI_K2 = DEEPSEEK_V3.with_(
    name="Kimi K2", vocab_size=163840, n_head=64, max_positions=131072, n_routed_experts=384,
    first_k_dense=1,
    source=("Kimi Team 2025, 'Kimi K2: Open Agentic Intelligence' (arXiv:2507.20534); config.json "
            "of moonshotai/Kimi-K2-Instruct"))

#: Kimi Linear 48B-A3B: 20 KDA + 7 MLA layers (3:1 hybrid, last layer MLA), 1 dense layer
#: then 26 MoE layers of 256 routed experts (8 per token) and 1 shared expert.
KIMI_LINEAR_48B = ArchSpec(
    name="Kimi Linear 48B-A3B", vocab_size=163840, n_layer=27, d_model=2304, n_head=32,
    d_ff=9216, max_positions=1048576, bias=False, norm="rmsnorm", tied_embeddings=False,
    mlp="swiglu", position="none", attention="mla", q_lora_rank=None, kv_lora_rank=512,
    qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
    kda_layers=hybrid_layers(27, 3), kda_n_head=32, kda_head_dim=128, kda_conv_kernel=4,
    n_routed_experts=256, n_shared_experts=1, top_k=8, d_expert=1024, first_k_dense=1,
    source=("Kimi Team 2025, 'Kimi Linear: An Expressive, Efficient Attention Architecture' "
            "(arXiv:2510.26692); config.json of moonshotai/Kimi-Linear-48B-A3B-Instruct"))

MOE_MODELS = (DEEPSEEK_V3, KIMI_K2, KIMI_LINEAR_48B)

#: Headline sizes as published (rounded by their authors): total and activated parameters
#: and where they are stated.
PUBLISHED = {
    "DeepSeek-V3": {"total": 671e9, "active": 37e9,
                    "where": "DeepSeek-V3 technical report, abstract"},
    "Kimi K2": {"total": 1e12, "active": 32e9,
                "where": "moonshotai/Kimi-K2-Instruct model card"},
    "Kimi Linear 48B-A3B": {"total": 48e9, "active": 3e9,
                            "where": "Kimi Linear report and model name (48B-A3B)"},
}

#: The headline size of the Kimi-K3-scale model the book ends with (about 2.8
#: trillion parameters, the source article's figure; ``K3_SCALE`` is a configuration of it).
K3_TOTAL_PARAMS = 2.8e12

#: An illustrative Kimi-K3-scale configuration (about 2.81T parameters, 40.6B active): Kimi
#: K2's widths and experts, Kimi Linear's 3:1 KDA/MLA layer design, 63 layers and 1,024
#: routed experts.  Every choice and its source is in ``K3_ASSUMPTIONS``.
K3_SCALE = KIMI_K2.with_(
    name="K3-scale", n_layer=63, n_routed_experts=1024, position="none", max_positions=1 << 20,
    kda_layers=hybrid_layers(63, 3), kda_n_head=64, kda_head_dim=128, kda_conv_kernel=4,
    source=("Illustrative, not published: Kimi K2's sizes (config.json of "
            "moonshotai/Kimi-K2-Instruct), Kimi Linear's layer design (arXiv:2510.26692), depth "
            "and expert count chosen to reach ~2.8T; see K3_ASSUMPTIONS"))

#: Every choice behind ``K3_SCALE``: ``what`` it sets, the ``value``, its ``status``
#: (``"given"``: the book's premise about Kimi K3; ``"carried over"``: published for an
#: earlier Kimi model and kept; ``"assumed"``: chosen here) and ``why``.  The values are
#: written from the specs, so they cannot drift from them.
K3_ASSUMPTIONS = (
    {"what": "total parameters", "value": f"about {K3_TOTAL_PARAMS / 1e12:g} trillion",
     "status": "given", "why": "the source article's headline figure for Kimi K3"},
    {"what": "design", "value": "Kimi Linear's: KDA and MLA layers in a hybrid schedule, MoE",
     "status": "given", "why": "the book's premise: K3 scales up the Kimi Linear design"},
    {"what": "width and vocabulary",
     "value": (f"d_model {K3_SCALE.d_model:,}; {K3_SCALE.n_head} heads; vocabulary "
               f"{K3_SCALE.vocab_size:,}; untied head; RMSNorm; no biases"),
     "status": "carried over", "why": "Kimi K2's config.json"},
    {"what": "MLA sizes",
     "value": (f"latent {K3_SCALE.kv_lora_rank} + {K3_SCALE.qk_rope_head_dim}; q_lora_rank "
               f"{K3_SCALE.q_lora_rank:,}; qk_nope {K3_SCALE.qk_nope_head_dim}; "
               f"v {K3_SCALE.v_head_dim}"),
     "status": "carried over", "why": "Kimi K2's config.json"},
    {"what": "experts",
     "value": (f"SwiGLU experts of width {K3_SCALE.d_expert:,}; {K3_SCALE.n_shared_experts} "
               f"shared; top-{K3_SCALE.top_k}; {K3_SCALE.first_k_dense} leading dense "
               f"layer{'s' if K3_SCALE.first_k_dense != 1 else ''} (d_ff {K3_SCALE.d_ff:,})"),
     "status": "carried over", "why": "Kimi K2's config.json"},
    {"what": "layer schedule", "value": "3 KDA : 1 MLA, last layer MLA",
     "status": "carried over", "why": "Kimi Linear 48B-A3B (full_attn_layers 4, 8, ..., 27)"},
    {"what": "positions",
     "value": f"none in MLA (NoPE); context {K3_SCALE.max_positions:,} tokens",
     "status": "carried over", "why": "Kimi Linear (mla_use_nope, model_max_length)"},
    {"what": "KDA heads",
     "value": (f"{K3_SCALE.kda_n_head} heads of {K3_SCALE.kda_head_dim} channels, short "
               f"convolution of {K3_SCALE.kda_conv_kernel}"),
     "status": "assumed",
     "why": (f"Kimi Linear's rule (as many KDA heads as MLA heads, width "
             f"{KIMI_LINEAR_48B.kda_head_dim}) at K2's {KIMI_K2.n_head} heads")},
    {"what": "depth",
     "value": (f"{K3_SCALE.n_layer} layers: {K3_SCALE.n_kda_layers} KDA, "
               f"{K3_SCALE.n_attention_layers} MLA"),
     "status": "assumed",
     "why": (f"K2 has {KIMI_K2.n_layer}; {K3_SCALE.n_layer} keeps the 3:1 schedule and lands "
             f"near {K3_TOTAL_PARAMS / 1e12:g}T")},
    {"what": "routed experts", "value": f"{K3_SCALE.n_routed_experts:,} per MoE layer",
     "status": "assumed",
     "why": (f"K2 has {KIMI_K2.n_routed_experts}; {K3_SCALE.n_routed_experts:,} (a power of "
             f"two, easy to shard) lands within 1% of {K3_TOTAL_PARAMS / 1e12:g}T")},
)

#: Efficiency claims of the Kimi Linear technical report (Kimi Team 2025, arXiv:2510.26692)
#: for Kimi Linear 48B-A3B against a full-MLA model of the same size, quoted as published.
KIMI_LINEAR_CLAIMS = {
    "kv_cache_reduction": 0.75,          # "reducing KV cache usage by up to 75%"
    "context": 1 << 20,                  # "1M" tokens
    "tpot_ms": {"Kimi Linear": 1.84, "MLA": 11.48},   # time per output token at 1M
    "tpot_speedup": 6.3,                 # "6.3x faster TPOT compared to MLA"
    "throughput_speedup": 6.0,           # "up to 6x decoding throughput for a 1M context"
    "batch1_speedup": (2.2, 2.3),        # at batch size 1
    "short_context": 4096,               # "similar speed as full attention" (MMLU-Pro, 4k)
    "where": ("Kimi Linear technical report (arXiv:2510.26692): abstract (75%, 6x), figure 1 "
              "(similar speed to full attention at 4k; TPOT at 1M: 1.84 ms vs 11.48 ms, 6.3x) "
              "and the efficiency comparison (6.3x attributed to the larger batches the smaller "
              "cache allows; about 2.2-2.3x at batch 1)"),
}


def gpt2_multiples(total: float = K3_TOTAL_PARAMS) -> dict[str, float]:
    """How many GPT-2 smalls fit in ``total`` parameters, two ways.

    ``"headline"``: against GPT-2 small rounded to 124M, whole models (the source article's
    22,580 for 2.8T); ``"exact"``: against its exact 124,439,808 parameters (a float).
    """
    from .accounting import count_params

    if isinstance(total, bool) or not isinstance(total, (int, float)) or not total > 0:
        raise ValueError(f"total must be a positive number of parameters, got {total!r}")
    exact = count_params(GPT2_SMALL).total
    rounded = round(exact, -6)
    return {"gpt2": exact, "gpt2_rounded": rounded, "headline": int(total // rounded),
            "exact": total / exact}


def gpt2_to_k3_steps() -> list[tuple[str, str, ArchSpec]]:
    """GPT-2 small to ``K3_SCALE`` one architectural change at a time.

    Returns ``(change, what it does, spec after it)``: first GPT-2 small, then GPT-2's
    architecture at K3's sizes (learned positions for a million tokens, LayerNorm with
    biases, a tied head, a GELU MLP four times as wide, MHA), then each change that turns
    it into ``K3_SCALE``.  The last spec has exactly ``K3_SCALE``'s shapes.
    """
    k3 = K3_SCALE
    gpt2_big = GPT2_SMALL.with_(
        name="GPT-2 at K3's sizes", vocab_size=k3.vocab_size, n_layer=k3.n_layer,
        d_model=k3.d_model, n_head=k3.n_head, max_positions=k3.max_positions)
    positions = gpt2_big.with_(name="+ no learned positions", position="none")
    norms = positions.with_(name="+ RMSNorm, no biases", norm="rmsnorm", bias=False)
    head = norms.with_(name="+ untied head", tied_embeddings=False)
    swiglu = head.with_(name="+ SwiGLU MLP", mlp="swiglu", d_ff=k3.d_ff)
    mla = swiglu.with_(name="+ MLA", attention="mla", q_lora_rank=k3.q_lora_rank,
                       kv_lora_rank=k3.kv_lora_rank, qk_nope_head_dim=k3.qk_nope_head_dim,
                       qk_rope_head_dim=k3.qk_rope_head_dim, v_head_dim=k3.v_head_dim)
    hybrid = mla.with_(name="+ 3:1 KDA hybrid", kda_layers=k3.kda_layers,
                       kda_n_head=k3.kda_n_head, kda_head_dim=k3.kda_head_dim,
                       kda_conv_kernel=k3.kda_conv_kernel)
    moe = hybrid.with_(name="+ MoE (= K3-scale)", n_routed_experts=k3.n_routed_experts,
                       n_shared_experts=k3.n_shared_experts, top_k=k3.top_k,
                       d_expert=k3.d_expert, first_k_dense=k3.first_k_dense)
    return [
        ("GPT-2 small", "the 2019 baseline", GPT2_SMALL),
        ("scale", "K3's width, depth, vocabulary, context", gpt2_big),
        ("position encoding", "learned table → none (NoPE)", positions),
        ("normalisation", "LayerNorm, biases → RMSNorm, none", norms),
        ("head", "tied → untied", head),
        ("activation", "GELU MLP (4d) → SwiGLU", swiglu),
        ("attention", "MHA → MLA", mla),
        ("mixer", "MLA everywhere → 3 KDA : 1 MLA", hybrid),
        ("FFN → MoE", f"dense → {k3.n_routed_experts:,} experts, top-{k3.top_k}, "
                      f"{k3.n_shared_experts} shared", moe),
    ]


def spec_from_gpt_config(config, name: str = "custom") -> ArchSpec:
    """The :class:`ArchSpec` of a :class:`gpt2k3.gpt2.GPTConfig` (to count a model we can build)."""
    return ArchSpec(name=name, vocab_size=config.vocab_size, n_layer=config.n_layer,
                    d_model=config.n_embd, n_head=config.n_head, max_positions=config.block_size,
                    bias=config.bias, norm="layernorm", tied_embeddings=True)


def hf_config(spec: ArchSpec):
    """A Hugging Face ``transformers`` configuration with the shapes of ``spec``.

    Three families are expressible: GPT-2 (``GPT2Config``: MHA, GELU MLP, LayerNorm with biases,
    learned positions, tied head), DeepSeek-V3 (``DeepseekV3Config``: MLA, SwiGLU, RMSNorm, no
    biases, untied head, dense or MoE with one shared-expert width) and Kimi Linear
    (``KimiLinearConfig``: the same with KDA layers).  Anything else raises ``ValueError``.
    Only shapes are set; routing constants and RoPE settings keep transformers' defaults.
    """
    import transformers

    if not isinstance(spec, ArchSpec):
        raise ValueError(f"spec must be an ArchSpec, got {type(spec).__name__}")
    if spec.attention == "mha" and spec.mlp == "gelu" and not spec.kda_layers and not spec.is_moe:
        if (spec.norm, spec.position, spec.tied_embeddings, spec.bias, spec.d_head, spec.d_ff) != (
                "layernorm", "learned", True, True, None, None):
            raise ValueError(f"{spec.name}: a GPT-2 config needs LayerNorm with bias, learned "
                             "positions, a tied head and the default head and MLP widths")
        return transformers.GPT2Config(vocab_size=spec.vocab_size, n_positions=spec.max_positions,
                                       n_embd=spec.d_model, n_layer=spec.n_layer,
                                       n_head=spec.n_head)
    if (spec.attention, spec.mlp, spec.norm, spec.bias, spec.tied_embeddings) != (
            "mla", "swiglu", "rmsnorm", False, False):
        raise ValueError(f"{spec.name}: only GPT-2-, DeepSeek-V3- and Kimi-Linear-shaped specs "
                         "have a transformers config here")
    common = dict(vocab_size=spec.vocab_size, hidden_size=spec.d_model, intermediate_size=spec.ffn_dim,
                  num_hidden_layers=spec.n_layer, num_attention_heads=spec.n_head,
                  num_key_value_heads=spec.n_head, q_lora_rank=spec.q_lora_rank,
                  kv_lora_rank=spec.kv_lora_rank, qk_nope_head_dim=spec.qk_nope_head_dim,
                  qk_rope_head_dim=spec.qk_rope_head_dim, v_head_dim=spec.v_head_dim,
                  tie_word_embeddings=False)
    moe = spec.is_moe
    experts = dict(moe_intermediate_size=spec.d_expert if moe else 1,
                   n_shared_experts=spec.n_shared_experts if moe else 1,
                   first_k_dense_replace=spec.first_k_dense if moe else spec.n_layer)
    if spec.kda_layers:
        if spec.kda_conv_kernel < 1:
            raise ValueError(f"{spec.name}: KimiLinearConfig needs kda_conv_kernel >= 1")
        full = [i + 1 for i in range(spec.n_layer) if i not in spec.kda_layers]
        return transformers.KimiLinearConfig(
            **common, **experts, num_experts=spec.n_routed_experts or 1,
            num_experts_per_token=spec.top_k or 1,
            linear_attn_config={"full_attn_layers": full,
                                "kda_layers": [i + 1 for i in spec.kda_layers],
                                "head_dim": spec.kda_head_dim, "num_heads": spec.kda_n_head,
                                "short_conv_kernel_size": spec.kda_conv_kernel})
    return transformers.DeepseekV3Config(
        **common, **experts, n_routed_experts=spec.n_routed_experts or 1,
        num_experts_per_tok=spec.top_k or 1, n_group=1, topk_group=1,
        max_position_embeddings=spec.max_positions or 4096)


def hf_meta_model(spec: ArchSpec):
    """``spec`` built as a ``transformers`` causal LM on the ``meta`` device: every parameter
    has its shape and no storage, so any size is instant and free (see :func:`hf_config`)."""
    import torch
    import transformers

    config = hf_config(spec)
    cls = {"gpt2": transformers.GPT2LMHeadModel, "deepseek_v3": transformers.DeepseekV3ForCausalLM,
           "kimi_linear": transformers.KimiLinearForCausalLM}[config.model_type]
    with torch.device("meta"):
        return cls(config)

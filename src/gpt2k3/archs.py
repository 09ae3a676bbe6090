"""Published architectures as data (:class:`gpt2k3.accounting.ArchSpec` values).

Each spec carries its ``source``.  The GPT-2 sizes are those of OpenAI's released
checkpoints (Radford et al., 2019; the ``config.json`` files of the ``gpt2``,
``gpt2-medium``, ``gpt2-large`` and ``gpt2-xl`` checkpoints): vocabulary 50,257,
1,024 learned positions, LayerNorm with bias, head tied to the token embedding.

The mixture-of-experts models are transcribed from the ``config.json`` published with their
weights on Hugging Face (field names in brackets below):

* ``DEEPSEEK_V3`` -- ``deepseek-ai/DeepSeek-V3`` (DeepSeek-AI, 2024, arXiv:2412.19437); the same
  sizes are the defaults of ``transformers.DeepseekV3Config``.  The count is the main model
  (the report's 671B); the released weights add one multi-token-prediction module
  (``num_nextn_predict_layers`` 1, :func:`gpt2k3.accounting.params.mtp_params`), which the
  model card's 685B includes.
* ``KIMI_K2`` -- ``moonshotai/Kimi-K2-Instruct`` (Kimi Team, 2025, arXiv:2507.20534), a
  ``DeepseekV3ForCausalLM``: DeepSeek-V3's layout with 64 heads, 384 experts, one dense layer,
  a 163,840-token vocabulary, and no MTP layer (``num_nextn_predict_layers`` 0).
* ``KIMI_LINEAR_48B`` -- ``moonshotai/Kimi-Linear-48B-A3B-Instruct`` (Kimi Team, 2025,
  arXiv:2510.26692): 27 layers, KDA in 20 of them and MLA in 7 (``linear_attn_config``:
  ``full_attn_layers`` 4, 8, ..., 24, 27, 1-based), MLA without positional encoding
  (``mla_use_nope``), MLA queries without a low-rank bottleneck (``q_lora_rank: null``).
* ``KIMI_K3`` -- ``moonshotai/Kimi-K3`` (Kimi Team, 2026, arXiv:2607.24653): 93 layers, KDA in
  69 and MLA in 24 (``full_attn_layers`` 4, 8, ..., 92, 93), MLA with an output gate and no
  positional encoding, KDA with a full-rank output gate and a bounded decay, 896 latent
  experts (16 per token) and 2 shared ones, SiTU-GLU, Attention Residuals in blocks of 12,
  and a 27-layer vision tower (``KIMI_K3_VISION``).  ``KIMI_K3_CONFIG`` transcribes the
  fields with the source of each, and ``KIMI_K3_CHECKPOINT`` what the released checkpoint
  stores.  Its count: 2,779,484,393,568 parameters (report: 2.78T), 104,189,530,208 activated
  without the embedding table (report: 104.2B; the book's ``active`` keeps the table in).
  Each KDA layer's ``A_log`` is counted once per head (SGLang's reading); the checkpoint
  stores 128 numbers per layer, and whether they are one per head (96 used) or one per key
  channel (all 128 used, shared by the heads) is open -- see :data:`KIMI_K3_A_LOG`.

``PUBLISHED`` holds the headline sizes the model cards and reports state (rounded), so the
chapters can set them beside the exact counts; ``MTP_LAYERS`` the multi-token-prediction
layers each release ships.  ``K3_TOTAL_PARAMS`` is the book's source article's headline for
Kimi K3 (2.8 trillion); ``KIMI_LINEAR_CLAIMS`` holds the efficiency claims of the Kimi Linear
report that chapter 9 checks against the accounting, quoted as published, with where each
one is stated.  ``DEEPSEEK_V3_WEIGHTS_DOC`` and ``KIMI_LINEAR_ACTIVE_CONVENTION`` quote what
two sources say about counting activated parameters.
"""

from __future__ import annotations

from gpt2k3.accounting import ArchSpec, VisionTower, hybrid_layers
from gpt2k3.checks import check_positive_number

__all__ = ["CODE_READ", "GPT2_SMALL", "GPT2_MEDIUM", "GPT2_LARGE", "GPT2_XL", "GPT2_FAMILY", "DEEPSEEK_V3",
           "KIMI_K2", "KIMI_LINEAR_48B", "MOE_MODELS", "KIMI_K3", "KIMI_K3_CONFIG",
           "KIMI_K3_VISION", "KIMI_K3_CHECKPOINT", "PUBLISHED", "MTP_LAYERS",
           "K3_TOTAL_PARAMS", "KIMI_LINEAR_CLAIMS", "KIMI_LINEAR_ACTIVE_CONVENTION",
           "DEEPSEEK_V3_WEIGHTS_DOC", "KIMI_K3_A_LOG", "gpt2_multiples", "gpt2_to_k3_steps",
           "spec_from_gpt_config"]

_GPT2_SOURCE = ("Radford et al. 2019, 'Language Models are Unsupervised Multitask Learners'; "
                "sizes from the released checkpoints' config.json")


def _gpt2(name: str, n_layer: int, n_head: int, n_embd: int) -> ArchSpec:
    return ArchSpec(name=name, vocab_size=50257, n_layer=n_layer, n_embd=n_embd, n_head=n_head,
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
    name="DeepSeek-V3", vocab_size=129280, n_layer=61, n_embd=7168, n_head=128, d_ff=18432,
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
    name="Kimi Linear 48B-A3B", vocab_size=163840, n_layer=27, n_embd=2304, n_head=32,
    d_ff=9216, max_positions=1048576, bias=False, norm="rmsnorm", tied_embeddings=False,
    mlp="swiglu", position="none", attention="mla", q_lora_rank=None, kv_lora_rank=512,
    qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
    kda_layers=hybrid_layers(27, 3), kda_n_head=32, kda_head_dim=128, kda_conv_kernel=4,
    n_routed_experts=256, n_shared_experts=1, top_k=8, d_expert=1024, first_k_dense=1,
    source=("Kimi Team 2025, 'Kimi Linear: An Expressive, Efficient Attention Architecture' "
            "(arXiv:2510.26692); config.json of moonshotai/Kimi-Linear-48B-A3B-Instruct"))

MOE_MODELS = (DEEPSEEK_V3, KIMI_K2, KIMI_LINEAR_48B)

# ----------------------------------------------------------------------------- Kimi K3
# Sources, in order of authority:
#  [card]   the moonshotai/Kimi-K3 model card: 2.8T total, 104B activated (rounded; every
#           count in the book is checked against the report's Table 1, not against the card).
#  [report] Kimi Team 2026, "Kimi K3: Open Frontier Intelligence" (arXiv:2607.24653), Table 1:
#           2.78T total, 104.2B activated.
#  [config] the public config.json of moonshotai/Kimi-K3 (a KimiK3Config: text_config, a
#           KimiLinearConfig, and vision_config), as transcribed in public code that loads
#           it; every value that sets a shape agrees with the sources below.
#  [sglang] SGLang 0.5.23 (PyPI): srt/configs/kimi_k3.py (KimiK3VisionConfig defaults: patch
#           14, 64x64 position table, 27 layers, width 1024, qkv 1536, MLP 4096, 12 heads,
#           2x2 merge, no biases, RMSNorm), srt/configs/kimi_linear.py (the text-config
#           fields), srt/models/kimi_k3.py (KimiK3MLAAttention: g_proj of
#           hidden x heads*v_head_dim; KimiK3DeltaAttention: q/k/v/g projections, b_proj,
#           f_a/f_b, dt_bias per channel, A_log read per head (the checkpoint stores
#           [head_dim]; SGLang uses the first num_heads -- an open question, see
#           KIMI_K3_A_LOG) -- conv 3 x projection x kernel, o_norm
#           of head_dim, o_proj; KimiK3MoE: router 896 x hidden, shared experts as one MLP
#           of moe_intermediate_size * num_shared_experts at full width, routed experts at
#           routed_expert_hidden_size behind routed_expert_down_proj / _up_proj and
#           routed_expert_norm; KimiK3DecoderLayer: self_attention_res_norm / _proj and
#           mlp_res_norm / _proj per layer; KimiK3LinearModel: output_attn_res_norm / _proj),
#           srt/layers/attn_residual.py (the depth mixture; at most 8 block snapshots),
#           srt/layers/activation.py (SituAndMul.forward_native), srt/models/kimi_k3_vl.py
#           (the vision tower and projector).
#  [fla]    fla-core 0.6.0 fla/ops/kda/gate.py: naive_kda_lowerbound_gate, the bounded decay.
#  [corroboration] third-party public code transcribing the released checkpoint: a
#           safetensors tensor listing (tokenspeed's Kimi K3 checkpoint-plan test: A_log
#           (128,), e_score_correction_bias (896,), experts w1/w3 packed (3072, 1792) with
#           scales (3072, 112), w2 (3584, 1536) / (3584, 96), vision wqkv (4608, 1024)) and
#           several config transcriptions agreeing on every shape-setting value below.
# Left open by these sources:
#  * config.json's values come from transcriptions of it (SGLang's config classes and the
#    third-party code above), which agree on every value that sets a shape.
#  * The report does not state how it counts activated parameters.  The count reproduces
#    104.2B only without the input-embedding table, the convention the Kimi Linear report
#    states for its own MoE models ("excluding embeddings", KIMI_LINEAR_ACTIVE_CONVENTION);
#    the round headlines of DeepSeek-V3 (37B), K2 (32B) and Kimi Linear (3B) are too round
#    to tell the two apart (and K2's report figure, 32.6B, matches neither).  Whether the 2.78T includes the vision tower is open -- with
#    it 2,779,931,752,544, without 2,779,484,393,568, both 2.78T.
#  * A_log: 128 stored numbers per KDA layer for 96 heads; read per head (SGLang, vLLM) or
#    per key channel (a hypothetical reading).  See KIMI_K3_A_LOG.
#  * Values that change no count: activation_situ_beta / _linear_beta (4.0 / 25.0, from the
#    config transcriptions; SGLang's config defaults are None), and routed_scaling_factor
#    (third parties transcribe 1.0 and 2.5).

#: Kimi K3's text configuration as published, field by field (config.json names, 1-based layer
#: lists as there), with the source of each value.
KIMI_K3_CONFIG = {
    "vocab_size": (163840, "config; sglang KimiLinearConfig default"),
    "hidden_size": (7168, "config"),
    "num_hidden_layers": (93, "config"),
    "num_attention_heads": (96, "config"),
    "tie_word_embeddings": (False, "config"),
    "max_position_embeddings": (1048576, "config"),
    "num_nextn_predict_layers": (0, "config: no MTP layer shipped"),
    "q_lora_rank": (1536, "config"),
    "kv_lora_rank": (512, "config"),
    "qk_nope_head_dim": (128, "config"),
    "qk_rope_head_dim": (64, "config (the 64 channels exist; mla_use_nope: no rotation)"),
    "v_head_dim": (128, "config"),
    "mla_use_nope": (True, "config"),
    "mla_use_output_gate": (True, "config; sglang KimiK3MLAAttention.g_proj"),
    "linear_attn_config.full_attn_layers": ((*range(4, 93, 4), 93), "config"),
    "linear_attn_config.num_heads": (96, "config"),
    "linear_attn_config.head_dim": (128, "config"),
    "linear_attn_config.short_conv_kernel_size": (4, "config"),
    "linear_attn_config.use_full_rank_gate": (True, "config; sglang KimiK3DeltaAttention"),
    "linear_attn_config.gate_lower_bound": (-5.0, "config; fla naive_kda_lowerbound_gate"),
    "num_experts": (896, "config"),
    "num_experts_per_token": (16, "config"),
    "num_shared_experts": (2, "config"),
    "moe_intermediate_size": (3072, "config"),
    "routed_expert_hidden_size": (3584, "config"),
    "latent_moe_use_norm": (True, "config"),
    "first_k_dense_replace": (1, "config"),
    "intermediate_size": (33792, "config (the dense first layer)"),
    "moe_router_activation_func": ("sigmoid", "config (noaux_tc routing)"),
    "hidden_act": ("situ", "config; sglang SituAndMul"),
    "activation_situ_beta": (4.0, "config; sglang SituAndMul"),
    "activation_situ_linear_beta": (25.0, "config; sglang SituAndMul"),
    "attn_res_block_size": (12, "config; arXiv:2603.15031"),
    "rms_norm_eps": (1e-5, "config"),
}


def _k3(field: str):
    return KIMI_K3_CONFIG[field][0]


#: Kimi K3's vision tower (MoonViT-V2, 27 layers, about 0.40B in its blocks) and projector:
#: the vision_config of moonshotai/Kimi-K3, equal to SGLang 0.5.23's KimiK3VisionConfig
#: defaults.
KIMI_K3_VISION = VisionTower(
    n_layer=27, n_embd=1024, n_head=12, qkv_dim=1536, d_ff=4096, patch_size=14,
    pos_emb_height=64, pos_emb_width=64, merge_kernel=(2, 2), in_channels=3,
    source=("vision_config of moonshotai/Kimi-K3 (vt_num_hidden_layers 27, vt_hidden_size 1024, "
            "vt_num_attention_heads 12, qkv_hidden_size 1536, vt_intermediate_size 4096, "
            "patch_size 14, init_pos_emb_height/width 64, merge_kernel_size [2, 2], no biases, "
            "RMSNorm); SGLang 0.5.23 srt/configs/kimi_k3.py and srt/models/kimi_k3_vl.py"))

#: Kimi K3 (2.78T total, 104.2B activated): 93 layers, 69 KDA + 24 MLA (MLA every fourth
#: layer and the last two), one dense SiTU-GLU layer then 92 latent-MoE layers of 896 routed
#: experts (16 per token) and 2 shared experts, Attention Residuals in blocks of 12.
KIMI_K3 = ArchSpec(
    name="Kimi K3", vocab_size=_k3("vocab_size"), n_layer=_k3("num_hidden_layers"),
    n_embd=_k3("hidden_size"), n_head=_k3("num_attention_heads"),
    d_ff=_k3("intermediate_size"), max_positions=_k3("max_position_embeddings"), bias=False,
    norm="rmsnorm", tied_embeddings=_k3("tie_word_embeddings"), mlp=_k3("hidden_act"),
    position="none", attention="mla", q_lora_rank=_k3("q_lora_rank"),
    kv_lora_rank=_k3("kv_lora_rank"), qk_nope_head_dim=_k3("qk_nope_head_dim"),
    qk_rope_head_dim=_k3("qk_rope_head_dim"), v_head_dim=_k3("v_head_dim"),
    # full_attn_layers (4, 8, ..., 92, 93) is Kimi Linear's 3:1 rule: tests check the two agree
    kda_layers=hybrid_layers(_k3("num_hidden_layers"), 3),
    kda_n_head=_k3("linear_attn_config.num_heads"), kda_head_dim=_k3("linear_attn_config.head_dim"),
    kda_conv_kernel=_k3("linear_attn_config.short_conv_kernel_size"),
    n_routed_experts=_k3("num_experts"), n_shared_experts=_k3("num_shared_experts"),
    top_k=_k3("num_experts_per_token"), d_expert=_k3("moe_intermediate_size"),
    first_k_dense=_k3("first_k_dense_replace"), mla_output_gate=_k3("mla_use_output_gate"),
    kda_full_rank_gate=_k3("linear_attn_config.use_full_rank_gate"),
    kda_gate_lower_bound=_k3("linear_attn_config.gate_lower_bound"),
    moe_latent_dim=_k3("routed_expert_hidden_size"), moe_latent_norm=_k3("latent_moe_use_norm"),
    attn_res_block_size=_k3("attn_res_block_size"), vision=KIMI_K3_VISION,
    source=("Kimi Team 2026, 'Kimi K3: Open Frontier Intelligence' (arXiv:2607.24653); "
            "config.json of moonshotai/Kimi-K3; layer shapes as in SGLang 0.5.23 "
            "srt/models/kimi_k3.py"))

#: What the released Kimi K3 checkpoint stores (a public listing: 96 safetensors shards,
#: text model and vision tower), and the packing that relates it to ``KIMI_K3``: routed
#: experts in MXFP4 (4-bit, two per uint8, one uint8 scale per 32 weights), every other
#: tensor one element per number; ``A_log`` stored at ``kda_head_dim`` (128) per KDA layer
#: (how many of them the model uses is open: :data:`KIMI_K3_A_LOG`); each MoE layer's
#: ``e_score_correction_bias`` stored.  See :func:`gpt2k3.accounting.stored_elements`.
KIMI_K3_CHECKPOINT = {
    "stored_elements": 1_503_647_073_024, "shards": 96, "expert_bits": 4, "group_size": 32,
    "a_log_stored": 128, "router_bias": True, "include_vision": True,
    "where": ("a public listing of the released checkpoint's safetensors (96 shards); tensor "
              "shapes corroborated by third-party checkpoint listings (see the comment above "
              "KIMI_K3_CONFIG)"),
}

#: The versions of other projects' code that the book's statements about that code were read
#: at (the pinned ``transformers`` and ``fla-core`` are read from the installed packages).
CODE_READ = {"SGLang": "SGLang 0.5.23",
             "vLLM": "vLLM's main branch at commit cabd15f"}

#: Kimi K3's ``A_log``, an open question.  The checkpoint stores ``kda_head_dim`` (128) numbers
#: per KDA layer, and the layer has ``kda_n_head`` (96) heads.  Two public readings:
#:
#: * ``"per head"`` -- SGLang 0.5.23 (``srt/models/kimi_k3.py``) and vLLM (main branch at
#:   commit cabd15f, ``vllm/models/kimi_k3/nvidia/kda.py``, an ``A_log`` of ``num_heads`` loaded from the
#:   stored vector's first entries): one decay scale per head, the first 96 stored numbers
#:   used, 32 unused.  The book's count (:func:`gpt2k3.accounting.count_params`) and layers
#:   follow it.
#: * ``"per key channel"`` -- a public SGLang-derived port's ``kimi_linear.py``, whose comment
#:   reads "Kimi-K3 stores one decay coefficient per key channel, shared by all heads
#:   (checkpoint shape: [head_dim]), rather than one per head": ``A_log`` of ``head_dim``,
#:   all 128 used, broadcast over the heads.
#:
#: The stored count is the same either way; the parameters the model uses differ by
#: ``n_kda_layers * (kda_head_dim - kda_n_head)`` (:func:`gpt2k3.accounting.a_log_readings`).
KIMI_K3_A_LOG = {
    "stored_per_layer": KIMI_K3_CHECKPOINT["a_log_stored"],
    "readings": {
        "per head": "SGLang 0.5.23 srt/models/kimi_k3.py; vLLM vllm/models/kimi_k3/nvidia/kda.py",
        "per key channel": ("a public SGLang-derived port, python/sglang/srt/models/"
                            "kimi_linear.py: 'one decay coefficient per key channel, shared by "
                            "all heads (checkpoint shape: [head_dim])'"),
    },
}

#: Headline sizes as published (rounded by their authors): total and activated parameters
#: and where they are stated.
PUBLISHED = {
    "DeepSeek-V3": {"total": 671e9, "active": 37e9, "card_total": 685e9,
                    "where": ("DeepSeek-V3 technical report, abstract (671B / 37B); the "
                              "deepseek-ai/DeepSeek-V3 model card: 685B, the main model and "
                              "its MTP module")},
    "Kimi K2": {"total": 1e12, "active": 32e9, "report_total": 1.04e12,
                "report_active": 32.6e9,
                "where": ("moonshotai/Kimi-K2-Instruct model card (1T / 32B); the Kimi K2 "
                          "technical report (arXiv:2507.20534): 1.04T total, 32.6B "
                          "activated")},
    "Kimi Linear 48B-A3B": {"total": 48e9, "active": 3e9,
                            "where": "Kimi Linear report and model name (48B-A3B)"},
    "Kimi K3": {"total": 2.78e12, "active": 104.2e9, "card_total": 2.8e12, "card_active": 104e9,
                "where": ("Kimi K3 technical report (arXiv:2607.24653), Table 1; the "
                          "moonshotai/Kimi-K3 model card rounds to 2.8T / 104B")},
}

#: Multi-token-prediction layers each release ships (``num_nextn_predict_layers`` of its
#: config.json): DeepSeek-V3 one (counted outside its 671B), Kimi K2 and Kimi K3 none.
MTP_LAYERS = {"DeepSeek-V3": 1, "Kimi K2": 0, "Kimi K3": KIMI_K3_CONFIG["num_nextn_predict_layers"][0]}

#: The headline size of Kimi K3 in the book's source article (about 2.8 trillion parameters;
#: the model card's 2.8T, the report's 2.78T; ``KIMI_K3`` is the published configuration).
K3_TOTAL_PARAMS = 2.8e12

#: Efficiency claims of the Kimi Linear technical report (Kimi Team 2025, arXiv:2510.26692v2)
#: for Kimi Linear 48B-A3B against a full-MLA model of the same size, quoted as published.
#: The report states neither the hardware, nor the batch sizes (except Figure 7's batch 1),
#: nor the number formats behind these times.
KIMI_LINEAR_CLAIMS = {
    "kv_cache_reduction": 0.75,          # abstract: "reducing KV cache usage by up to 75%"
    "context": 1 << 20,                  # "1M" tokens
    # Figure 1(b) caption: "This enables larger batches, yielding a 6.3x faster TPOT
    # (1.84ms vs. 11.48ms) than MLA at 1M tokens"; section 6.3 calls the 6.3x "a theoretical
    # decoding speedup of up to 6.3x"
    "tpot_ms": {"Kimi Linear": 1.84, "MLA": 11.48},
    "tpot_speedup": 6.3,
    "throughput_speedup": 6.0,           # abstract: "up to 6x decoding throughput for a 1M context"
    # Figure 7(b), "batch size = 1": annotated 2.2x at 1M; section 6.3: "a 2.3x speedup at a
    # 1M token context"
    "batch1_speedup": (2.2, 2.3),
    "short_context": 4096,               # Figure 1(a): MMLU-Pro (4k), "at similar speed"
    # Figure 1(a): RULER (128k context length), "3.98x acceleration" in decoding against MLA
    "ruler_context": 1 << 17,
    "ruler_speedup": 3.98,
    "where": ("Kimi Linear technical report (arXiv:2510.26692v2): abstract (75%, 6x); Figure 1 "
              "(a: similar speed at MMLU-Pro's 4k, 3.98x decoding acceleration at RULER's 128k; "
              "b: TPOT at 1M, 1.84 ms vs 11.48 ms, 6.3x, which the larger batches enable); "
              "Figure 7(b) at batch size 1 (2.2x at 1M) and section 6.3 (2.3x at 1M; the 6.3x "
              "'a theoretical decoding speedup')"),
}

#: How the Kimi Linear report counts activated parameters: Table 2 (its scaling-law MoE models),
#: footnote †, quoted in full.  The same team's convention, stated; Kimi K3's report states none.
KIMI_LINEAR_ACTIVE_CONVENTION = {
    "quote": "Denotes the number of activated parameters in our MoE models, excluding embeddings.",
    "where": "Kimi Linear technical report (arXiv:2510.26692v2), Table 2, footnote †",
}

#: DeepSeek-V3's weight documentation on the main model's activated parameters, quoted in full
#: (``README_WEIGHTS.md`` of github.com/deepseek-ai/DeepSeek-V3, "Main Model Weights",
#: "Parameter Count"), with its numbers as data.  The architecture's own count does not
#: reproduce it: 36.63B without the embedding table, 37.55B with both table and head
#: (:func:`gpt2k3.accounting.count_params`).
DEEPSEEK_V3_WEIGHTS_DOC = {
    "quote": ("Activation parameters: 36.7B (including 0.9B for Embedding and 0.9B for the "
              "output Head)"),
    "active": 36.7e9, "embedding": 0.9e9, "head": 0.9e9,
    "where": "README_WEIGHTS.md of github.com/deepseek-ai/DeepSeek-V3, Main Model Weights",
}


def gpt2_multiples(total: float = K3_TOTAL_PARAMS) -> dict[str, float]:
    """How many GPT-2 smalls fit in ``total`` parameters, two ways.

    ``"headline"``: against GPT-2 small rounded to 124M, whole models (the source article's
    22,580 for 2.8T); ``"exact"``: against its exact 124,439,808 parameters (a float).
    """
    from gpt2k3.accounting import count_params

    check_positive_number(total, "total", "finite number of parameters")
    exact = count_params(GPT2_SMALL).total
    rounded = round(exact, -6)
    return {"gpt2": exact, "gpt2_rounded": rounded, "headline": int(total // rounded),
            "exact": total / exact}


def gpt2_to_k3_steps() -> list[tuple[str, str, ArchSpec]]:
    """GPT-2 small to the published Kimi K3 (``KIMI_K3``), one architectural change at a time.

    Returns ``(change, what it does, spec after it)``: first GPT-2 small, then GPT-2's
    architecture at K3's sizes (learned positions for a million tokens, LayerNorm with
    biases, a tied head, a GELU MLP four times as wide, MHA with K3's 96 heads of 128 for
    keys, queries and values alike: an attention width of 12,288, where GPT-2 makes heads
    times head width equal to the model width; K3's 7,168 does not divide into 96 heads), then
    the changes chapters 2 to 7 built (positions, norms, head, SwiGLU, MLA, the KDA hybrid,
    the mixture of experts) and the five chapter 8 added (latent experts, output gates, the
    bounded decay, SiTU-GLU, Attention Residuals).  The last spec has exactly ``KIMI_K3``'s
    fields, its vision tower included (which no step's count includes).
    """
    k3 = KIMI_K3
    gpt2_big = GPT2_SMALL.with_(
        name="GPT-2 at K3's sizes", vocab_size=k3.vocab_size, n_layer=k3.n_layer,
        n_embd=k3.n_embd, n_head=k3.n_head, d_head=k3.v_head_dim,
        max_positions=k3.max_positions)
    positions = gpt2_big.with_(name="+ no positions (NoPE)", position="none")
    norms = positions.with_(name="+ RMSNorm, no biases", norm="rmsnorm", bias=False)
    head = norms.with_(name="+ untied head", tied_embeddings=False)
    swiglu = head.with_(name="+ SwiGLU MLP", mlp="swiglu", d_ff=k3.d_ff)
    mla = swiglu.with_(name="+ MLA", attention="mla", d_head=None, q_lora_rank=k3.q_lora_rank,
                       kv_lora_rank=k3.kv_lora_rank, qk_nope_head_dim=k3.qk_nope_head_dim,
                       qk_rope_head_dim=k3.qk_rope_head_dim, v_head_dim=k3.v_head_dim)
    hybrid = mla.with_(name="+ 3:1 KDA hybrid", kda_layers=k3.kda_layers,
                       kda_n_head=k3.kda_n_head, kda_head_dim=k3.kda_head_dim,
                       kda_conv_kernel=k3.kda_conv_kernel)
    moe = hybrid.with_(name="+ MoE", n_routed_experts=k3.n_routed_experts,
                       n_shared_experts=k3.n_shared_experts, top_k=k3.top_k,
                       d_expert=k3.d_expert, first_k_dense=k3.first_k_dense)
    latent = moe.with_(name="+ latent experts", moe_latent_dim=k3.moe_latent_dim,
                       moe_latent_norm=k3.moe_latent_norm)
    gates = latent.with_(name="+ output gates", mla_output_gate=k3.mla_output_gate,
                         kda_full_rank_gate=k3.kda_full_rank_gate)
    bounded = gates.with_(name="+ bounded decay", kda_gate_lower_bound=k3.kda_gate_lower_bound)
    situ = bounded.with_(name="+ SiTU-GLU", mlp=k3.mlp)
    attn_res = situ.with_(name="+ Attention Residuals (= Kimi K3)",
                          attn_res_block_size=k3.attn_res_block_size, vision=k3.vision)
    return [
        ("GPT-2 small", "the 2019 baseline", GPT2_SMALL),
        ("scale", f"K3's width, depth, vocabulary, context; MHA with K3's {k3.n_head} heads of "
                  f"{k3.v_head_dim} (attention width {k3.n_head * k3.v_head_dim:,})", gpt2_big),
        ("position encoding", "learned table → none (NoPE)", positions),
        ("normalisation", "LayerNorm, biases → RMSNorm, none", norms),
        ("head", "tied → untied", head),
        ("activation", "GELU MLP (4d) → SwiGLU", swiglu),
        ("attention", f"MHA → MLA (keys of {k3.qk_nope_head_dim} + {k3.qk_rope_head_dim} "
                      f"per head)", mla),
        ("mixer", "MLA everywhere → 3 KDA : 1 MLA", hybrid),
        ("FFN → MoE", f"dense → {k3.n_routed_experts:,} experts, top-{k3.top_k}, "
                      f"{k3.n_shared_experts} shared", moe),
        ("latent experts", f"routed experts at width {k3.moe_latent_dim:,}, not "
                           f"{k3.n_embd:,}", latent),
        ("output gates", "a sigmoid gate on MLA; KDA's gate full-rank", gates),
        ("bounded decay", f"KDA's log-decay floored at {k3.kda_gate_lower_bound:g}", bounded),
        ("SiTU-GLU", "SwiGLU → SiTU-GLU (clipped)", situ),
        ("Attention Residuals", f"residual sum → attention over depth, blocks of "
                                f"{k3.attn_res_block_size}", attn_res),
    ]


def spec_from_gpt_config(config, name: str = "custom") -> ArchSpec:
    """The :class:`ArchSpec` of a :class:`gpt2k3.config.GPTConfig` (to count a model we can build)."""
    return ArchSpec(name=name, vocab_size=config.vocab_size, n_layer=config.n_layer,
                    n_embd=config.n_embd, n_head=config.n_head, max_positions=config.block_size,
                    bias=config.bias, norm="layernorm", tied_embeddings=True)


#: ``linear_attn_config.gate_lower_bound`` of Kimi K3's config.json.
K3_GATE_LOWER_BOUND = KIMI_K3_CONFIG["linear_attn_config.gate_lower_bound"][0]

#: ``rms_norm_eps`` of Kimi K3's config.json (``gpt2k3.archs.KIMI_K3_CONFIG``), which SGLang
#: 0.5.23 gives its RMSNorms as ``config.rms_norm_eps``: the layer norms, MLA's latent norms,
#: the routed experts' latent norm and the Attention-Residual score norms (KDA's output norm
#: takes 1e-5 as its constructor default). ``KimiLinearConfig``'s own default is 1e-6.
K3_RMS_NORM_EPS = KIMI_K3_CONFIG["rms_norm_eps"][0]

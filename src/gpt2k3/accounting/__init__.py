"""Analytic accounting: parameters, cache and state bytes, bytes moved and FLOPs per token.

An :class:`ArchSpec` describes a decoder-only architecture as data; the functions here count
what it costs without building it, so the same code counts GPT-2 small and models far too large
to instantiate.  Every count is checked against real modules in the tests: our
:class:`gpt2k3.model.GPT` and Hugging Face's ``GPT2LMHeadModel`` for the GPT-2 family, and
``DeepseekV3ForCausalLM`` / ``KimiLinearForCausalLM`` built on PyTorch's ``meta`` device (no
memory) for DeepSeek-V3, Kimi K2 and Kimi Linear.

What a spec can describe
------------------------
* **Token mixers, per layer.**  Every layer is either a softmax-attention layer of the kind
  ``attention`` -- ``"mha"`` (one K/V head per query head), ``"gqa"`` (``n_kv_head`` shared K/V
  heads) or ``"mla"`` (multi-head latent attention: the cache holds one latent per token) -- or,
  if its 0-based index is in ``kda_layers``, a Kimi Delta Attention layer, whose memory of the
  past is a fixed-size state instead of a growing cache.  :func:`hybrid_layers` writes the
  Kimi-Linear-style schedule "``ratio`` KDA layers, then one attention layer".
* **Feed-forward blocks, per layer.**  A dense MLP (``"gelu"``: two matrices, GPT-2;
  ``"swiglu"``: three, everything after) of width ``d_ff``, or -- from layer ``first_k_dense``
  on, when ``n_routed_experts > 0`` -- a mixture of experts: a router, ``n_shared_experts``
  always-on SwiGLU experts and ``n_routed_experts`` routed SwiGLU experts of width ``d_expert``,
  of which each token uses ``top_k``.
* LayerNorm (weight and bias) or RMSNorm (weight only); learned, rotary or no positions;
  a head tied to the token embedding or not.
* **What Kimi K3 adds** (see :class:`ArchSpec`): output gates on MLA and full-rank output
  gates on KDA, KDA's bounded decay, latent experts (routed experts working at a narrower
  width behind a down/up projection and an RMSNorm), SiTU-GLU, Attention Residuals (a learned
  softmax over depth instead of the running residual sum), and a vision tower counted on a
  line of its own.  :data:`PART_COMPONENTS` gives each new piece its own line.

Active parameters
-----------------
``count_params(spec).active`` is the number of parameters that take part in processing one
token: **every parameter except the routed experts the router did not pick**.  Concretely:
token embeddings (the whole table counts, although a token reads one row of it), position
embeddings, attention and linear-attention layers, dense MLPs, the router, the shared experts,
``top_k`` routed experts per MoE layer, the norms and the head.  For a dense model it equals the
total.  The tests check it against the modules of the meta-device models.  Kimi K3's
report states no convention for its 104.2B activated (Table 1), but that figure is this count
minus the token-embedding table, 104,189,530,208 -- the convention the Kimi Linear report states
for its own MoE models ("excluding embeddings", Table 2) -- with the untied
head, the norms, the Attention-Residual vectors, the output gates, the latent projections and
the two shared experts all in (105.36B with the table).  The round headlines of DeepSeek-V3
(37B), Kimi K2 (32B) and Kimi Linear (3B) cannot tell the two conventions apart, and DeepSeek's
weight documentation is no help: its "36.7B (including 0.9B for Embedding and 0.9B for the
output Head)" (:data:`gpt2k3.archs.DEEPSEEK_V3_WEIGHTS_DOC`) is neither this count (37.55B)
nor this count without the table (36.63B).  The book keeps the table in and says so
(:attr:`ParamCount.active_without_embedding` is the convention of the published figures).  Kimi
K3's 2.78T total is the language model's 2,779,484,393,568, and stays 2.78T with the vision
tower (0.45B), which is never active for a text token and is counted apart
(:attr:`ParamCount.vision`).  What a token
*reads* and *multiplies* is narrower -- one embedding row, no norm arithmetic to speak of -- and
is what :func:`decode_bytes` and :func:`flops_per_token` use
(``ParamCount.matmul_active``).

DeepSeek-V3's router also carries a per-expert bias (``e_score_correction_bias``, auxiliary-loss-
free balancing).  It is updated by a rule, not by gradients, and Hugging Face stores it as a
buffer, not a parameter; it is not counted here (256 numbers per MoE layer; Kimi K3: 896 per
MoE layer, 82,432 in all -- too few to move either published figure).  A checkpoint does
store it: :func:`stored_elements` counts what a released checkpoint holds, packed experts,
scales and such buffers included.

Hardware, memory and time (chapter 9)
-------------------------------------
:class:`Hardware` describes an accelerator: :data:`H200` holds NVIDIA's datasheet figures,
:data:`H200_MEASURED` the bandwidth measured on one, and :data:`H200_BAND` pairs them;
:data:`FLASHMLA_H800` quotes FlashMLA's compute-bound rule for MLA decoding and its peak.
:func:`serving_memory`, :func:`devices_needed` and :func:`max_batch` say what fits;
:func:`roofline` turns bytes (:func:`decode_bytes`, the one bytes-per-step model, with the
experts a batch wakes up) and FLOPs into a lower bound on the time of a decode step, and
:func:`roofline_band` brackets it between datasheet and measured bandwidth;
:func:`serving_plan` lays a model out over devices by tensor and expert parallelism, and
:func:`plan_roofline` times a step by the plan's busiest device.

The package, one small torch-free module per idea
-------------------------------------------------
``spec`` (:class:`ArchSpec`, :class:`VisionTower`, the one layer schedule
:func:`hybrid_layers`, :func:`hybrid_spec`), ``params`` (:func:`count_params`,
:func:`stored_elements`), ``memory`` (KV-cache and state bytes; :func:`mixer_state_numbers`
is the one state-size function, float32 states by default), ``decay`` (KDA's log-decay),
``decode`` (:func:`decode_bytes`), ``flops``, ``hardware``, ``serving`` and ``units``
(:data:`DTYPE_BYTES`).  Every public name is importable from ``gpt2k3.accounting``.
"""

from __future__ import annotations

from gpt2k3.accounting.decay import kda_log_decay, kda_log_decay_range
from gpt2k3.accounting.decode import (CacheTraffic, DecodeBytes, cache_bound_context, decode_bytes,
    decode_bytes_per_token, decode_cache_traffic, expected_distinct_experts,
    weight_and_cache_bytes, weights_cache_crossing, weights_read_per_step)
from gpt2k3.accounting.flops import flops_per_token, mla_decode_costs
from gpt2k3.accounting.hardware import (FLASHMLA_H800, H200, H200_BAND, H200_DATASHEET,
    H200_MEASURED, H200_MEASUREMENTS, Hardware)
from gpt2k3.accounting.memory import (hybrid_cache_bytes, kv_cache_bytes, kv_numbers_per_layer,
    kv_numbers_per_token, memory_per_sequence, mixer_state_numbers, mla_cache_variants,
    state_bytes, state_numbers_per_layer)
from gpt2k3.accounting.params import (COMPONENTS, DETAIL_COMPONENTS, PART_COMPONENTS,
    PART_OF_DETAIL, ParamCount, checkpoint_bytes, count_params, mtp_params,
    a_log_readings, packed_bytes_per_weight, stored_elements)
from gpt2k3.accounting.experts import expected_busiest_experts, expected_busiest_experts_sampled
from gpt2k3.accounting.serving import (WEIGHT_FORMATS, Roofline, ServingPlan, devices_needed,
    hybrid_speedups, max_batch,
    plan_roofline, roofline, roofline_band, serving_memory, serving_plan, tpot_readings,
    weight_format)
from gpt2k3.accounting.spec import (ATTENTION_KINDS, MLPS, NORMS, POSITIONS, ArchSpec, VisionTower,
    full_attention, hybrid_layers, hybrid_spec, ratio_label)
from gpt2k3.accounting.units import DTYPE_BYTES, STATE_DTYPE_BYTES, dtype_bytes

__all__ = [
    # spec
    "ArchSpec", "VisionTower", "ATTENTION_KINDS", "NORMS", "MLPS", "POSITIONS",
    "hybrid_layers", "hybrid_spec", "full_attention",
    "ratio_label",
    # parameters
    "ParamCount", "count_params", "stored_elements", "a_log_readings", "COMPONENTS", "DETAIL_COMPONENTS",
    "PART_COMPONENTS", "PART_OF_DETAIL", "mtp_params", "packed_bytes_per_weight",
    "checkpoint_bytes",
    # memory: cache and state
    "kv_cache_bytes", "kv_numbers_per_layer", "kv_numbers_per_token", "mixer_state_numbers",
    "state_bytes", "state_numbers_per_layer", "memory_per_sequence", "hybrid_cache_bytes",
    "mla_cache_variants", "kda_log_decay", "kda_log_decay_range",
    # bytes and FLOPs of a decode step
    "expected_distinct_experts", "weights_read_per_step", "DecodeBytes", "decode_bytes",
    "decode_bytes_per_token", "weight_and_cache_bytes", "cache_bound_context",
    "weights_cache_crossing", "CacheTraffic", "decode_cache_traffic",
    "flops_per_token", "mla_decode_costs",
    # hardware, the roofline and serving plans
    "Hardware", "H200", "H200_MEASURED", "H200_BAND", "H200_DATASHEET", "H200_MEASUREMENTS",
    "FLASHMLA_H800",
    "serving_memory", "devices_needed", "max_batch", "Roofline", "roofline", "roofline_band",
    "hybrid_speedups", "ServingPlan", "serving_plan", "plan_roofline", "WEIGHT_FORMATS",
    "weight_format", "tpot_readings", "expected_busiest_experts",
    "expected_busiest_experts_sampled",
    # units
    "DTYPE_BYTES", "STATE_DTYPE_BYTES", "dtype_bytes",
]

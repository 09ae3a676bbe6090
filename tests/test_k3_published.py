"""Kimi K3 as published: the exact count, the published headlines, the released checkpoint.

Every expected number here is written out from the configuration's numbers (transcribed once
below, from the public ``config.json`` of ``moonshotai/Kimi-K3`` and the module layout of
SGLang 0.5.23's ``srt/models/kimi_k3.py``), component by component, *without* calling
``count_params`` or any spec property, so a wrong formula in :mod:`gpt2k3.accounting` or a
wrong value in :mod:`gpt2k3.archs` fails here instead of being copied into the test.

Published figures checked: 2.78T total / 104.2B activated (technical report, Table 1; model
card 2.8T / 104B) and 1,503,647,073,024 stored elements in the released checkpoint (routed
experts in MXFP4).  Oracles: the same model assembled on PyTorch's ``meta`` device from
``transformers``' Kimi Linear / DeepSeek-V3 modules plus the K3 modules SGLang lists; the
bounded decay against fla-core's ``naive_kda_lowerbound_gate`` and transformers'
``Glm5NextTextForgetGate`` (an independent implementation of the same bounded gate).
"""

from __future__ import annotations

import ast
import copy
import math

import pytest

from gpt2k3.accounting import (DETAIL_COMPONENTS, PART_COMPONENTS, PART_OF_DETAIL, ArchSpec,
    VisionTower, count_params, decode_bytes_per_token, flops_per_token, hybrid_layers,
    kda_log_decay, kda_log_decay_range, kv_cache_bytes,
    kv_numbers_per_layer, kv_numbers_per_token, mla_decode_costs, state_bytes,
    state_numbers_per_layer, stored_elements, weights_read_per_step)
from gpt2k3.archs import (DEEPSEEK_V3, GPT2_FAMILY, GPT2_SMALL, KIMI_K2, KIMI_K3,
    KIMI_K3_CHECKPOINT, KIMI_K3_CONFIG, KIMI_K3_VISION, KIMI_LINEAR_48B, PUBLISHED)

# ----------------------------------------------------------------------------- the config
V, D, L = 163_840, 7_168, 93                       # vocab_size, hidden_size, num_hidden_layers
H, QL, KVL, DN, DR, DV = 96, 1_536, 512, 128, 64, 128  # MLA: heads, q/kv lora, nope, rope, v
KH, KD, KC = 96, 128, 4                            # KDA: heads, head_dim, short conv kernel
E, TOPK, SHARED, F, W = 896, 16, 2, 3_072, 3_584   # experts, per token, shared, width, latent
DFF = 33_792                                       # intermediate_size of the dense layer 0
MLA_1BASED = [*range(4, 93, 4), 93]                # linear_attn_config.full_attn_layers
N_MLA, N_KDA, N_MOE, N_DENSE = 24, 69, 92, 1
# vision_config: 27 blocks of width 1024, qkv 1536, MLP 4096; patch 14; 64 x 64 positions; 2x2
VL, VD, VQ, VF, VP, VPOS, VM = 27, 1_024, 1_536, 4_096, 14, 64 * 64, 1_024 * 4

P = KH * KD                                        # KDA projection width, 12,288
MLA = (D * QL + QL + QL * H * (DN + DR)            # q_a_proj, q_a_layernorm, q_b_proj
       + D * (KVL + DR) + KVL                      # kv_a_proj_with_mqa, kv_a_layernorm
       + KVL * H * (DN + DV) + H * DV * D)         # kv_b_proj, o_proj
MLA_GATE = D * H * DV                              # g_proj (mla_use_output_gate)
KDA = (3 * D * P + 3 * P * KC                      # q/k/v_proj, q/k/v_conv1d
       + D * KD + KD * P + P + KH                  # f_a_proj, f_b_proj, dt_bias, A_log
       + D * KH + KD + P * D)                      # b_proj, o_norm, o_proj
KDA_GATE = D * P                                   # g_proj (use_full_rank_gate)
EXPERT = 3 * W * F                                 # one routed expert (w1, w2, w3) at width W
MOE_FRONT = E * D                                  # router (gate.weight)
LATENT = D * W + W * D + W                         # routed_expert_down/up_proj, _norm
SHARED_MLP = 3 * D * (SHARED * F)                  # shared_experts (one MLP of 2 x 3072)
DENSE = 3 * D * DFF
ATTN_RES = L * 4 * D + 2 * D                       # *_res_norm + *_res_proj; output pair
NORMS = (2 * L + 1) * D                            # input/post_attention_layernorm; norm
EMB = HEAD = V * D
VISION = (3 * VP * VP * VD + VPOS * VD             # patch conv, position table
          + VL * (2 * VD + VD * 3 * VQ + VQ * VD + 2 * VD * VF) + VD   # blocks, final norm
          + VM * VM + VM * D + D)                  # projector and its post norm

TOTAL = (EMB + HEAD + N_MLA * (MLA + MLA_GATE) + N_KDA * (KDA + KDA_GATE) + N_DENSE * DENSE
         + N_MOE * (MOE_FRONT + LATENT + SHARED_MLP + E * EXPERT) + ATTN_RES + NORMS)
ACTIVE = TOTAL - N_MOE * (E - TOPK) * EXPERT


def test_the_spec_is_the_published_config():
    k = KIMI_K3
    assert (k.vocab_size, k.n_embd, k.n_layer, k.n_head) == (V, D, L, H)
    assert (k.q_lora_rank, k.kv_lora_rank, k.qk_nope_head_dim, k.qk_rope_head_dim,
            k.v_head_dim) == (QL, KVL, DN, DR, DV)
    assert (k.kda_n_head, k.kda_head_dim, k.kda_conv_kernel) == (KH, KD, KC)
    assert (k.n_routed_experts, k.top_k, k.n_shared_experts, k.d_expert, k.moe_latent_dim,
            k.d_ff, k.first_k_dense) == (E, TOPK, SHARED, F, W, DFF, 1)
    assert k.mla_output_gate and k.kda_full_rank_gate and k.moe_latent_norm
    assert k.kda_gate_lower_bound == -5.0 and k.attn_res_block_size == 12
    assert (k.mlp, k.norm, k.position, k.tied_embeddings, k.bias) == (
        "situ", "rmsnorm", "none", False, False)
    # the schedule: MLA at 4, 8, ..., 92 and 93 (1-based), KDA everywhere else
    mla = [i + 1 for i, m in enumerate(k.layer_mixers) if m == "mla"]
    assert mla == MLA_1BASED and (k.n_attention_layers, k.n_kda_layers) == (N_MLA, N_KDA)
    assert k.layer_mixers[-2:] == ("mla", "mla") and k.layer_mixers[0] == "kda"
    assert k.kda_layers == hybrid_layers(L, 3)          # the Kimi Linear rule gives it
    # and the config's own list of full-attention layers (1-based) is exactly the rule's
    full = KIMI_K3_CONFIG["linear_attn_config.full_attn_layers"][0]
    assert tuple(i for i in range(L) if i + 1 not in set(full)) == k.kda_layers
    assert (k.n_dense_layers, k.n_moe_layers) == (N_DENSE, N_MOE)
    assert list(KIMI_K3_CONFIG["linear_attn_config.full_attn_layers"][0]) == MLA_1BASED
    assert all(len(v) == 2 and v[1] for v in KIMI_K3_CONFIG.values())  # each value has a source
    v = KIMI_K3_VISION
    assert (v.n_layer, v.n_embd, v.qkv_dim, v.d_ff, v.n_head, v.patch_size) == (
        VL, VD, VQ, VF, 12, VP)
    assert "Kimi K3" in k.source and "arXiv:2607.24653" in k.source


def test_exact_count_component_by_component():
    c = count_params(KIMI_K3)
    expected = {
        "token embeddings": EMB, "position embeddings": 0,
        "softmax attention": N_MLA * MLA, "softmax-attention output gates": N_MLA * MLA_GATE,
        "linear attention": N_KDA * KDA, "linear-attention output gates": N_KDA * KDA_GATE,
        "dense MLP": DENSE, "router": N_MOE * MOE_FRONT, "latent projections": N_MOE * LATENT,
        "shared experts": N_MOE * SHARED_MLP, "routed experts": N_MOE * E * EXPERT,
        "attention residuals": ATTN_RES, "norms": NORMS, "head": HEAD,
    }
    assert c.parts == expected
    assert c.total == TOTAL == 2_779_484_393_568
    assert c.active == ACTIVE == 105_363_935_328
    assert c.active_parts == dict(expected, **{"routed experts": N_MOE * TOPK * EXPERT})
    # the coarser views fold the new lines in and still add up
    for name in DETAIL_COMPONENTS:
        assert c.detail[name] == sum(c.parts[p] for p in PART_COMPONENTS
                                     if PART_OF_DETAIL[p] == name)
    assert sum(c.breakdown.values()) == sum(c.detail.values()) == c.total
    assert sum(c.active_detail.values()) == c.active
    assert c.detail["routed experts"] == N_MOE * E * EXPERT          # only the routed experts
    assert c.detail["router"] == N_MOE * (MOE_FRONT + LATENT)
    # the vision tower: its own line, outside total and active
    assert c.vision == VISION == 447_358_976
    assert c.vision_detail["blocks"] == 396_417_024   # "roughly 0.4B" (report, section 2.4)
    assert c.total_with_vision == TOTAL + VISION


def test_the_published_headlines_and_their_convention():
    """2.78T / 104.2B (report, Table 1), 2.8T / 104B (model card): the language model's total,
    and the activated parameters without the token-embedding table (the untied head in)."""
    c, pub = count_params(KIMI_K3), PUBLISHED["Kimi K3"]
    assert round(c.total / 1e12, 2) == pub["total"] / 1e12 == 2.78
    assert round(c.active_without_embedding / 1e9, 1) == pub["active"] / 1e9 == 104.2
    assert c.active_without_embedding == ACTIVE - EMB == 104_189_530_208
    assert round(c.total / 1e12, 1) == 2.8 and round(c.active_without_embedding / 1e9) == 104
    # the vision tower does not move the total at the published precision ...
    assert round(c.total_with_vision / 1e12, 2) == 2.78
    # ... and the other conventions miss the activated figure: this is the one that fits
    assert round(c.active / 1e9, 1) == 105.4                       # embedding table kept
    assert round((c.active - EMB - HEAD) / 1e9, 1) == 103.0         # head dropped as well
    assert round((c.active_without_embedding + VISION) / 1e9, 1) == 104.6   # vision in
    # router biases (a buffer; 82,432 numbers) are too few to matter either way
    assert round((c.active_without_embedding + N_MOE * E) / 1e9, 1) == 104.2
    # the same convention reproduces the earlier models' headlines
    for spec in (DEEPSEEK_V3, KIMI_K2, KIMI_LINEAR_48B):
        got = count_params(spec).active_without_embedding
        assert round(got / 1e9) == round(PUBLISHED[spec.name]["active"] / 1e9), spec.name


def test_the_checkpoint_stored_element_count():
    """1,503,647,073,024 elements: every parameter once, the routed experts packed (4-bit,
    two per uint8, plus a uint8 scale per 32 weights), the router biases, A_log stored at 128
    (head_dim) per KDA layer where 96 (heads) are used, and the vision tower."""
    routed = N_MOE * E * EXPERT
    # per expert matrix, as listed: w1/w3 (3072, 3584) -> packed (3072, 1792) + scale
    # (3072, 112); w2 (3584, 3072) -> (3584, 1536) + (3584, 96)
    per_expert = 2 * (F * W // 2 + F * W // 32) + (W * F // 2 + W * F // 32)
    assert per_expert == 2 * (3072 * 1792 + 3072 * 112) + (3584 * 1536 + 3584 * 96)
    expected = (TOTAL - routed + N_MOE * E * per_expert
                + N_MOE * E                              # e_score_correction_bias
                + N_KDA * (KD - KH)                      # A_log stored as (128,)
                + VISION)
    assert expected == KIMI_K3_CHECKPOINT["stored_elements"] == 1_503_647_073_024
    kwargs = {k: KIMI_K3_CHECKPOINT[k] for k in ("expert_bits", "group_size", "a_log_stored",
                                                  "router_bias", "include_vision")}
    got = stored_elements(KIMI_K3, **kwargs)
    assert got["total"] == expected
    assert got["packed experts"] == routed // 2 and got["expert scales"] == routed // 32
    assert (got["router biases"], got["A_log beyond one per head"]) == (82_432, 2_208)
    # without the packing rule the listing is nowhere near: the experts are the bulk
    assert stored_elements(KIMI_K3)["total"] == TOTAL + VISION + N_MOE * E
    with pytest.raises(ValueError):
        stored_elements(KIMI_K3, expert_bits=4, group_size=1000)   # does not divide 3072
    with pytest.raises(ValueError):
        stored_elements(KIMI_K3, expert_bits=3)
    with pytest.raises(ValueError):
        stored_elements(KIMI_K3, a_log_stored=64)                  # fewer than the heads


def test_each_new_piece_removed_costs_exactly_its_formula():
    total = count_params(KIMI_K3).total
    off = {
        "mla_output_gate": (dict(mla_output_gate=False), N_MLA * MLA_GATE),
        "kda_full_rank_gate": (dict(kda_full_rank_gate=False),
                               N_KDA * (KDA_GATE - (D * KD + KD * P))),
        "attn_res": (dict(attn_res_block_size=0), ATTN_RES),
        "latent": (dict(moe_latent_dim=0, moe_latent_norm=False),
                   N_MOE * (LATENT + E * (EXPERT - 3 * D * F))),
        "latent norm": (dict(moe_latent_norm=False), N_MOE * W),
        "second shared expert": (dict(n_shared_experts=1), N_MOE * 3 * D * F),
        "bounded gate": (dict(kda_gate_lower_bound=None), 0),       # same parameters
        "SiTU -> SwiGLU": (dict(mlp="swiglu"), 0),                   # same three matrices
        "vision": (dict(vision=None), 0),                            # outside the total
    }
    for name, (change, cost) in off.items():
        assert total - count_params(KIMI_K3.with_(**change)).total == cost, name


def test_earlier_specs_are_untouched():
    for spec in (*GPT2_FAMILY, DEEPSEEK_V3, KIMI_K2, KIMI_LINEAR_48B):
        c = count_params(spec)
        assert spec.k3_features == ()
        for name in ("softmax-attention output gates", "latent projections",
                     "attention residuals"):
            assert c.parts[name] == 0, (spec.name, name)
        assert c.vision == 0 and c.total_with_vision == c.total
        assert sum(c.parts.values()) == c.total and sum(c.active_parts.values()) == c.active
    assert count_params(GPT2_SMALL).total == 124_439_808
    assert set(KIMI_K3.k3_features) == {"mla_output_gate", "kda_full_rank_gate",
                                        "kda_gate_lower_bound", "moe_latent_dim",
                                        "moe_latent_norm", "attn_res_block_size", "vision", "mlp"}


# ----------------------------------------------------------------------------- cache, state, decode
def test_cache_and_state_bytes():
    one_m = 1 << 20
    assert kv_numbers_per_layer(KIMI_K3) == KVL + DR == 576
    assert kv_numbers_per_token(KIMI_K3) == N_MLA * 576
    assert kv_cache_bytes(KIMI_K3, one_m) == N_MLA * 576 * one_m * 2          # bf16: 27 GiB
    assert kv_cache_bytes(KIMI_K3, one_m) == 27 * 2 ** 30
    assert state_numbers_per_layer(KIMI_K3) == {"recurrent": KH * KD * KD,
                                                "conv": (KC - 1) * 3 * P}
    assert state_bytes(KIMI_K3, 1, 4) == N_KDA * (KH * KD * KD + (KC - 1) * 3 * P) * 4
    assert state_bytes(KIMI_K3, 3, 4) == 3 * state_bytes(KIMI_K3, 1, 4)


def test_decode_bytes_and_flops_per_token():
    ctx = 1 << 20
    # batch 1: every weight except the embedding table (one row read) and the 880 experts
    # per MoE layer nobody picked
    weights = ACTIVE - EMB + D
    assert weights_read_per_step(KIMI_K3, 1) == pytest.approx(weights, rel=1e-12)
    state = N_KDA * (KH * KD * KD + (KC - 1) * 3 * P) * 4
    expected = weights * 0.5 + N_MLA * 576 * ctx * 2 + 2 * state
    assert decode_bytes_per_token(KIMI_K3, ctx, 1, weight_bytes=0.5, cache_bytes=2,
                                  state_dtype_bytes=4) == pytest.approx(expected, rel=1e-12)
    # the weights a token is multiplied through: every matrix it meets, the head included;
    # no lookups, norm gains, AttnRes vectors, A_log or dt_bias
    mla_mm = MLA - QL - KVL + MLA_GATE
    kda_mm = KDA - P - KH - KD + KDA_GATE
    moe_mm = MOE_FRONT + 2 * D * W + SHARED_MLP + TOPK * EXPERT
    matmul = N_MLA * mla_mm + N_KDA * kda_mm + DENSE + N_MOE * moe_mm + HEAD
    assert count_params(KIMI_K3).matmul_active == matmul
    absorbed = mla_decode_costs(KIMI_K3)["absorbed"]["flops"]
    assert absorbed == 2 * H * (KVL + DR) + 2 * H * KVL
    assert flops_per_token(KIMI_K3, ctx) == (2 * matmul + N_MLA * absorbed * ctx
                                             + N_KDA * 7 * KH * KD * KD)


# ----------------------------------------------------------------------------- impossible specs
def test_impossible_k3_style_specs_raise():
    with pytest.raises(ValueError, match="kda_layers"):
        KIMI_K3.with_(kda_layers=(*KIMI_K3.kda_layers, L))       # 0-based index 93
    with pytest.raises(ValueError, match="moe_latent_dim"):
        KIMI_K3.with_(moe_latent_dim=D + 1)                       # latent wider than the model
    with pytest.raises(ValueError, match="moe_latent_norm"):
        KIMI_K3.with_(moe_latent_dim=0)                           # a norm on no latent
    with pytest.raises(ValueError, match="moe_latent_dim"):
        KIMI_LINEAR_48B.with_(n_routed_experts=0, top_k=0, n_shared_experts=0,
                              moe_latent_dim=64)                  # no experts to be latent
    for bound in (0.0, 0, 5.0, math.nan, -math.inf, True, "-5"):
        with pytest.raises(ValueError, match="kda_gate_lower_bound"):
            KIMI_K3.with_(kda_gate_lower_bound=bound)             # not a negative bound
    with pytest.raises(ValueError, match="mla_output_gate"):
        GPT2_SMALL.with_(mla_output_gate=True)                    # the gate is MLA's
    for name, bad in (("attn_res_block_size", -12), ("attn_res_block_size", 1.5),
                      ("moe_latent_dim", -1), ("kda_full_rank_gate", 1), ("vision", "MoonViT")):
        with pytest.raises(ValueError, match=name):
            KIMI_K3.with_(**{name: bad})
    with pytest.raises(ValueError, match="qkv_dim"):
        VisionTower(n_layer=2, n_embd=8, n_head=3, qkv_dim=16, d_ff=8, patch_size=2,
                    pos_emb_height=2, pos_emb_width=2)
    with pytest.raises(ValueError, match="merge_kernel"):
        VisionTower(n_layer=2, n_embd=8, n_head=2, qkv_dim=16, d_ff=8, patch_size=2,
                    pos_emb_height=2, pos_emb_width=2, merge_kernel=(2,))
    with pytest.raises(ValueError, match="lower_bound"):
        kda_log_decay(0.0, lower_bound=0.0)
    with pytest.raises(ValueError):
        kda_log_decay_range(DEEPSEEK_V3)                          # no KDA layers
    assert isinstance(KIMI_K3.with_(attn_res_block_size=200), ArchSpec)   # one block is fine


# ----------------------------------------------------------------------------- the bounded decay
def test_bounded_decay_range_and_limits():
    low, high = kda_log_decay_range(KIMI_K3)
    assert (low, high) == (-5.0, 0.0)
    assert kda_log_decay_range(KIMI_LINEAR_48B) == (-math.inf, 0.0)
    for x in (-6.0, -3.0, 0.0, 0.7, 3.0, 6.0):     # (far out, float64 rounds onto the bounds)
        for a in (-2.0, 0.0, 1.0):
            g = kda_log_decay(x, a, 0.25, -5.0)
            assert -5.0 < g < 0.0
    assert kda_log_decay(0.0, 0.0, 0.0, -5.0) == -2.5            # sigmoid(0) = 1/2
    assert kda_log_decay(40.0, 0.0, 0.0, -5.0) == pytest.approx(-5.0)   # fastest forgetting
    assert kda_log_decay(-40.0, 0.0, 0.0, -5.0) == pytest.approx(0.0, abs=1e-15)
    # Kimi Linear's gate has no floor: it forgets as fast as its input asks
    assert kda_log_decay(40.0, 0.0, 0.0) == pytest.approx(-40.0)
    assert kda_log_decay(0.0) == pytest.approx(-math.log(2.0))


def _fla_gate_functions():
    """``naive_kda_gate`` and ``naive_kda_lowerbound_gate`` from fla-core's
    ``fla/ops/kda/gate.py``.  That file imports triton at the top (absent on CPU machines), so
    the two pure-PyTorch functions are taken out of its source by name and run alone."""
    torch = pytest.importorskip("torch")
    from fla_oracle import fla_package_dir

    path = fla_package_dir() / "ops" / "kda" / "gate.py"
    if not path.is_file():
        raise FileNotFoundError(f"fla-core is installed but has no {path}")
    tree = ast.parse(path.read_text())
    wanted = {"naive_kda_gate", "naive_kda_lowerbound_gate"}
    funcs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in wanted]
    assert {f.name for f in funcs} == wanted, "the fla gate references moved"
    namespace = {"torch": torch, "F": torch.nn.functional}
    exec(compile(ast.Module(body=funcs, type_ignores=[]), str(path), "exec"), namespace)
    return namespace["naive_kda_gate"], namespace["naive_kda_lowerbound_gate"]


def test_bounded_decay_matches_fla_core():
    torch = pytest.importorskip("torch")
    naive_gate, naive_bounded = _fla_gate_functions()
    gen = torch.Generator().manual_seed(0)
    heads, dk = 3, 4
    x = torch.randn(2, 5, heads, dk, generator=gen, dtype=torch.float64) * 6
    a_log = torch.randn(heads, generator=gen, dtype=torch.float64)         # one per head
    dt_bias = torch.randn(heads * dk, generator=gen, dtype=torch.float64)   # one per channel
    bound = KIMI_K3.kda_gate_lower_bound
    ours_b = torch.tensor([[[[kda_log_decay(x[b, t, h, c].item(), a_log[h].item(),
                                            dt_bias[h * dk + c].item(), bound)
                              for c in range(dk)] for h in range(heads)] for t in range(5)]
                           for b in range(2)], dtype=torch.float64)
    ours_u = torch.tensor([[[[kda_log_decay(x[b, t, h, c].item(), a_log[h].item(),
                                            dt_bias[h * dk + c].item())
                              for c in range(dk)] for h in range(heads)] for t in range(5)]
                           for b in range(2)], dtype=torch.float64)
    theirs_b = naive_bounded(x, a_log, dt_bias, lower_bound=bound, output_dtype=torch.float64)
    theirs_u = naive_gate(x, a_log, dt_bias, output_dtype=torch.float64)
    # fla computes in float32 (``g.float()``) whatever the input: float32 agreement
    torch.testing.assert_close(ours_b, theirs_b, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ours_u, theirs_u, rtol=1e-5, atol=1e-6)
    # inside [bound, 0] (float32's sigmoid saturates onto the ends for large inputs)
    assert bool(((theirs_b >= bound) & (theirs_b <= 0)).all()) and theirs_b.min() < bound + 0.1


def test_bounded_decay_matches_transformers_forget_gate():
    """transformers' Glm5NextTextForgetGate implements the same bounded gate (with the
    low-rank f_a/f_b projection in front): parameter shapes and values agree with ours."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    glm = pytest.importorskip("transformers.models.glm5_next.modeling_glm5_next")
    from transformers.models.glm5_next.configuration_glm5_next import Glm5NextTextConfig
    from transformers.models.kimi_linear.modeling_kimi_linear import KimiLinearForgetGate

    import transformers

    # at K3's sizes, on the meta device: the bounded gate has Kimi Linear's parameters
    big = Glm5NextTextConfig(hidden_size=D, linear_head_dim=KD, linear_num_heads=KH,
                             linear_lower_bound=KIMI_K3.kda_gate_lower_bound)
    lin = transformers.KimiLinearConfig(
        hidden_size=D, num_attention_heads=H, num_hidden_layers=2,
        linear_attn_config={"full_attn_layers": [2], "kda_layers": [1], "head_dim": KD,
                            "num_heads": KH, "short_conv_kernel_size": KC})
    with torch.device("meta"):
        bounded, unbounded = glm.Glm5NextTextForgetGate(big), KimiLinearForgetGate(lin)
    n = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert n(bounded) == n(unbounded) == D * KD + KD * P + P + KH
    assert bounded.A_log.numel() == KH and bounded.dt_bias.numel() == P
    # values, on a small gate with random weights
    small = Glm5NextTextConfig(hidden_size=8, linear_head_dim=4, linear_num_heads=2,
                               linear_lower_bound=-5.0)
    torch.manual_seed(0)
    gate = glm.Glm5NextTextForgetGate(small).double()
    with torch.no_grad():
        for p in gate.parameters():
            p.copy_(torch.randn_like(p))
        h = torch.randn(1, 3, 8, dtype=torch.float64) * 3
        out = gate(h)                                           # (1, 3, heads, head_dim)
        pre = gate.f_b_proj(gate.f_a_proj(h)).view(1, 3, 2, 4)
    ours = torch.tensor([[[[kda_log_decay(pre[0, t, hh, c].item(), gate.A_log[hh].item(),
                                          gate.dt_bias[hh * 4 + c].item(), -5.0)
                            for c in range(4)] for hh in range(2)] for t in range(3)]],
                        dtype=torch.float64)
    # the gate computes in float32 (``.float()``): float32 agreement
    torch.testing.assert_close(out.double(), ours, rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------- meta-device oracle
def _k3_assembled_on_meta():
    """Kimi K3's language model on the meta device: transformers' Kimi Linear model with K3's
    config (its MLA, KDA, MoE, MLP, norm modules), then changed into SGLang's K3 layout --
    MLA ``g_proj``; KDA ``g_proj`` in place of ``g_a_proj``/``g_b_proj``; routed experts at the
    latent width behind ``routed_expert_down_proj``/``_up_proj``/``_norm``; each layer's
    ``self_attention_res_norm``/``_proj`` and ``mlp_res_norm``/``_proj``; the model's
    ``output_attn_res_norm``/``_proj``."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from transformers.models.kimi_linear import modeling_kimi_linear as kl

    config = transformers.KimiLinearConfig(
        vocab_size=V, hidden_size=D, intermediate_size=DFF, moe_intermediate_size=F,
        num_hidden_layers=L, num_attention_heads=H, num_key_value_heads=H, num_experts=E,
        num_experts_per_token=TOPK, num_shared_experts=SHARED, first_k_dense_replace=1,
        q_lora_rank=QL, kv_lora_rank=KVL, qk_nope_head_dim=DN, qk_rope_head_dim=DR,
        v_head_dim=DV, tie_word_embeddings=False,
        linear_attn_config={"full_attn_layers": MLA_1BASED,
                            "kda_layers": [i for i in range(1, L + 1) if i not in MLA_1BASED],
                            "head_dim": KD, "num_heads": KH, "short_conv_kernel_size": KC})
    latent = copy.deepcopy(config)
    latent.hidden_size = W
    linear = lambda i, o: torch.nn.Linear(i, o, bias=False)  # noqa: E731
    with torch.device("meta"):
        model = transformers.KimiLinearForCausalLM(config)
        for layer in model.model.layers:
            attn = layer.self_attn
            if isinstance(attn, kl.KimiLinearAttention):
                attn.g_proj = linear(D, H * DV)
            else:
                del attn.g_a_proj, attn.g_b_proj
                attn.g_proj = linear(D, P)
            if isinstance(layer.mlp, kl.KimiLinearMoE):
                layer.mlp.experts = kl.KimiLinearExperts(latent)
                layer.mlp.routed_expert_down_proj = linear(D, W)
                layer.mlp.routed_expert_norm = kl.KimiLinearRMSNorm(W)
                layer.mlp.routed_expert_up_proj = linear(W, D)
            layer.self_attention_res_norm = kl.KimiLinearRMSNorm(D)
            layer.self_attention_res_proj = linear(D, 1)
            layer.mlp_res_norm = kl.KimiLinearRMSNorm(D)
            layer.mlp_res_proj = linear(D, 1)
        model.model.output_attn_res_norm = kl.KimiLinearRMSNorm(D)
        model.model.output_attn_res_proj = linear(D, 1)
    return model, kl


def test_count_equals_k3_assembled_from_transformers_modules():
    model, kl = _k3_assembled_on_meta()
    n = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    c = count_params(KIMI_K3)
    assert n(model) == c.total
    layers = model.model.layers
    mla = [x.self_attn for x in layers if isinstance(x.self_attn, kl.KimiLinearAttention)]
    kda = [x.self_attn for x in layers if not isinstance(x.self_attn, kl.KimiLinearAttention)]
    moe = [x.mlp for x in layers if isinstance(x.mlp, kl.KimiLinearMoE)]
    assert (len(mla), len(kda), len(moe)) == (N_MLA, N_KDA, N_MOE)
    assert c.parts["softmax-attention output gates"] == sum(n(a.g_proj) for a in mla)
    assert c.detail["softmax attention"] == sum(n(a) for a in mla)
    assert c.parts["linear-attention output gates"] == sum(n(a.g_proj) for a in kda)
    assert c.detail["linear attention"] == sum(n(a) for a in kda)
    assert c.parts["router"] == sum(n(m.gate) for m in moe)
    assert c.parts["latent projections"] == sum(
        n(m.routed_expert_down_proj) + n(m.routed_expert_norm) + n(m.routed_expert_up_proj)
        for m in moe)
    assert c.parts["shared experts"] == sum(n(m.shared_experts) for m in moe)
    assert c.parts["routed experts"] == sum(n(m.experts) for m in moe)
    assert c.parts["dense MLP"] == sum(n(x.mlp) for x in layers if x.mlp not in moe)
    assert c.parts["attention residuals"] == n(model.model.output_attn_res_norm) + n(
        model.model.output_attn_res_proj) + sum(
        n(x.self_attention_res_norm) + n(x.self_attention_res_proj) + n(x.mlp_res_norm)
        + n(x.mlp_res_proj) for x in layers)
    assert c.parts["norms"] == n(model.model.norm) + sum(
        n(x.input_layernorm) + n(x.post_attention_layernorm) for x in layers)
    assert c.parts["token embeddings"] == n(model.model.embed_tokens)
    assert c.parts["head"] == n(model.lm_head)
    # active: everything but the experts a token does not use (the router's bias is a buffer)
    per_expert = n(moe[0].experts) // E
    assert per_expert == KIMI_K3.expert_params
    assert c.active == n(model) - N_MOE * (E - TOPK) * per_expert
    assert sum(b.numel() for m in moe for b in m.gate.buffers()) == N_MOE * E  # stored, uncounted


def test_mla_and_moe_pieces_equal_deepseek_v3_modules():
    """The same pieces from a second family: DeepSeek-V3's MLA at K3's sizes plus the output
    gate; its expert bank at the latent width; its router and shared-expert MLP."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as ds

    cfg = transformers.DeepseekV3Config(
        hidden_size=D, num_attention_heads=H, num_key_value_heads=H, q_lora_rank=QL,
        kv_lora_rank=KVL, qk_nope_head_dim=DN, qk_rope_head_dim=DR, v_head_dim=DV,
        n_routed_experts=E, num_experts_per_tok=TOPK, moe_intermediate_size=F,
        n_shared_experts=SHARED, intermediate_size=DFF, n_group=1, topk_group=1)
    latent = copy.deepcopy(cfg)
    latent.hidden_size = W
    n = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    c = count_params(KIMI_K3)
    with torch.device("meta"):
        attn = ds.DeepseekV3Attention(cfg, layer_idx=0)
        gate = torch.nn.Linear(D, H * DV, bias=False)
        experts = ds.DeepseekV3Experts(latent)
        router = ds.DeepseekV3TopkRouter(cfg)
        shared = ds.DeepseekV3MLP(cfg, intermediate_size=F * SHARED)
        dense = ds.DeepseekV3MLP(cfg)
    assert c.detail["softmax attention"] == N_MLA * (n(attn) + n(gate))
    assert c.parts["routed experts"] == N_MOE * n(experts)
    assert c.parts["router"] == N_MOE * n(router)
    assert router.e_score_correction_bias.numel() == E
    assert c.parts["shared experts"] == N_MOE * n(shared)
    assert c.parts["dense MLP"] == n(dense)


def test_a_log_readings_store_the_same_and_use_different_counts():
    """The checkpoint's ``A_log`` (128 numbers per KDA layer, 96 heads) under both public
    readings: per head (SGLang, vLLM: 96 used) and per key channel (all 128 used).  The stored
    count is the same; the used counts differ by 69 * 32, the checkpoint listing's extra."""
    from gpt2k3.accounting import a_log_readings
    from gpt2k3.archs import KIMI_K3_A_LOG

    r = a_log_readings(KIMI_K3, KIMI_K3_CHECKPOINT["a_log_stored"])
    assert KIMI_K3_A_LOG["stored_per_layer"] == KD == 128 and KH == 96
    assert r["per head"]["stored"] == r["per key channel"]["stored"] == N_KDA * KD
    assert (r["per head"]["used"], r["per head"]["unused"]) == (N_KDA * KH, N_KDA * (KD - KH))
    assert (r["per key channel"]["used"], r["per key channel"]["unused"]) == (N_KDA * KD, 0)
    assert r["per head"]["unused"] == stored_elements(
        KIMI_K3, a_log_stored=128)["A_log beyond one per head"] == 2_208
    # the parameter count follows the per-head reading; the other adds 2,208 and rounds the same
    c = count_params(KIMI_K3)
    assert round((c.active_without_embedding + r["per head"]["unused"]) / 1e9, 1) == 104.2
    assert set(KIMI_K3_A_LOG["readings"]) == {"per head", "per key channel"}
    with pytest.raises(ValueError):
        a_log_readings(KIMI_K3, 96)           # fewer than the key channels
    with pytest.raises(ValueError):
        a_log_readings(KIMI_K3, 128.0)


def test_quoted_conventions_and_the_counts_beside_them():
    """DeepSeek's weight documentation, quoted in full, against DeepSeek-V3's own count (it
    matches neither reading); the Kimi Linear report's stated convention; and Kimi Linear's
    speed claims with where each is stated."""
    from gpt2k3.archs import (DEEPSEEK_V3_WEIGHTS_DOC, KIMI_LINEAR_48B,
                              KIMI_LINEAR_ACTIVE_CONVENTION, KIMI_LINEAR_CLAIMS)

    doc = DEEPSEEK_V3_WEIGHTS_DOC
    assert doc["quote"] == ("Activation parameters: 36.7B (including 0.9B for Embedding and 0.9B "
                            "for the output Head)")
    ds = count_params(DEEPSEEK_V3)
    assert round(ds.detail["token embeddings"] / 1e9, 1) == doc["embedding"] / 1e9 == 0.9
    assert round(ds.detail["head"] / 1e9, 1) == doc["head"] / 1e9 == 0.9
    assert round(ds.active / 1e9, 2) == 37.55 != doc["active"] / 1e9             # both in
    assert round(ds.active_without_embedding / 1e9, 2) == 36.63                   # table out
    assert "excluding embeddings" in KIMI_LINEAR_ACTIVE_CONVENTION["quote"]
    c = KIMI_LINEAR_CLAIMS
    assert (c["ruler_context"], c["ruler_speedup"]) == (1 << 17, 3.98)
    assert "theoretical" in c["where"] and "Figure 7(b)" in c["where"]
    # the RULER figure exceeds even the ratio of the caches: no equal-batch reading reaches it
    assert KIMI_LINEAR_48B.n_layer / KIMI_LINEAR_48B.n_attention_layers < c["ruler_speedup"]


def test_flashmla_rule_and_the_h200_thresholds():
    """FlashMLA's compute-bound rule, quoted with its numbers (the deep-dive's 865 TFLOP/s
    throttled peak and 3.35 TB/s, giving 128 heads), and the same rule on an H200 as chapter 9
    applies it: 103 heads at the datasheet's peak, 90 with the H800's throttling assumed."""
    from gpt2k3.accounting import FLASHMLA_H800 as fm, H200, mla_decode_costs

    for key, text in (("bandwidth", "3.35 TB/s"), ("peak_flops", "990 TFlops"),
                      ("throttled_flops", "~865 TFlops")):
        assert text in fm["peak_quote"], key
    assert "\\frac{865}{3.35} = 128" in fm["rule_quote"]
    assert "3000 GB/s" in fm["achieved_quote"] and "660 TFLOPS" in fm["achieved_quote"]
    assert (fm["bandwidth"], fm["peak_flops"], fm["throttled_flops"]) == (3.35e12, 990e12, 865e12)
    assert abs(fm["throttled_flops"] / fm["bandwidth"] / 2 - fm["heads"]) < 2   # 129.1, given as 128
    assert round(100 * fm["achieved_flops"] / fm["peak_flops"]) == 67
    throttle = fm["throttled_flops"] / fm["peak_flops"]
    assert round(H200.ridge / 2) == 103 and round(throttle * H200.ridge / 2) == 90
    # K3's 96 heads lie between the two; its exact intensity sits on the throttled ridge
    a = mla_decode_costs(KIMI_K3)["absorbed"]
    intensity = a["flops"] / (2 * a["numbers"])
    assert intensity == pytest.approx(96 * (512 + 576) / 576)
    assert throttle * H200.ridge / 2 < KIMI_K3.n_head < H200.ridge / 2
    assert abs(intensity / (throttle * H200.ridge) - 1) < 0.01 < 1 - intensity / H200.ridge


def test_the_model_card_rounds_the_report():
    pub = PUBLISHED["Kimi K3"]
    assert round(pub["total"] / 1e12, 1) == pub["card_total"] / 1e12 == 2.8
    assert round(pub["active"] / 1e9) == pub["card_active"] / 1e9 == 104


def test_the_scale_step_keeps_k3s_heads_and_both_mha_baselines():
    """Chapter 9's walk scales GPT-2 with K3's 96 heads of 128 (12,288 wide, not n_embd);
    its MLA step is 42.7x against that MHA, 53.3x against chapter 7's convention (the same
    heads with MLA's 192-dimensional keys)."""
    from gpt2k3.accounting import kv_numbers_per_token
    from gpt2k3.accounting.memory import mla_cache_variants
    from gpt2k3.archs import gpt2_to_k3_steps

    steps = {change: spec for change, _, spec in gpt2_to_k3_steps()}
    scale, mla = steps["scale"], steps["attention"]
    assert (scale.n_head, scale.head_dim) == (96, 128) and scale.n_head * scale.head_dim == 12_288
    assert scale.n_embd == 7168 and scale.n_embd % scale.n_head != 0
    assert kv_numbers_per_token(scale) == 93 * 2 * 96 * 128 == 2_285_568
    assert kv_numbers_per_token(mla) == 93 * 576
    same_heads = mla_cache_variants(mla)["MHA, same heads"]
    assert same_heads == 96 * (128 + 64 + 128)
    assert round(kv_numbers_per_token(scale) / kv_numbers_per_token(mla), 1) == 42.7
    assert round(same_heads / 576, 1) == 53.3
    what = dict((c, w) for c, w, _ in gpt2_to_k3_steps())
    assert "96 heads of 128" in what["scale"] and "12,288" in what["scale"]

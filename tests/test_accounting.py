"""count_params against real modules (built on the meta device: no memory)."""

import pytest
import torch

from gpt2k3.accounting import COMPONENTS, ArchSpec, count_params, kv_cache_bytes
from gpt2k3.archs import GPT2_FAMILY, GPT2_SMALL, K3_TOTAL_PARAMS, spec_from_gpt_config
from gpt2k3.model import GPT
from gpt2k3.config import GPTConfig


def _config(spec):
    return GPTConfig(block_size=spec.max_positions, vocab_size=spec.vocab_size, n_layer=spec.n_layer,
                     n_head=spec.n_head, n_embd=spec.n_embd)


@pytest.mark.parametrize("spec", GPT2_FAMILY, ids=lambda s: s.name)
def test_gpt2_family_counts_equal_built_models(spec):
    with torch.device("meta"):
        model = GPT(_config(spec))
    c = count_params(spec)
    assert c.total == model.num_params() == c.active
    assert sum(c.breakdown.values()) == c.total
    assert tuple(c.breakdown) == COMPONENTS
    blocks = model.transformer.h
    assert c.breakdown["attention"] == sum(p.numel() for b in blocks for p in b.attn.parameters())
    assert c.breakdown["MLP"] == sum(p.numel() for b in blocks for p in b.mlp.parameters())
    assert c.breakdown["position embeddings"] == model.transformer.wpe.weight.numel()
    assert c.breakdown["head"] == 0


@pytest.mark.parametrize("spec", GPT2_FAMILY, ids=lambda s: s.name)
def test_gpt2_family_counts_equal_hugging_face(spec):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(n_layer=spec.n_layer, n_head=spec.n_head, n_embd=spec.n_embd,
                                  vocab_size=spec.vocab_size, n_positions=spec.max_positions)
    with torch.device("meta"):
        hf = transformers.GPT2LMHeadModel(cfg)
    assert count_params(spec).total == sum(p.numel() for p in hf.parameters())


def test_gpt2_small_is_the_published_size():
    # 124,439,808 is GPT-2 small's size as every framework counts it; this pins the
    # formula, the meta-model tests above pin it to real modules.
    assert count_params(GPT2_SMALL).total == 124_439_808


def test_untied_head_and_rmsnorm_and_no_bias():
    s = GPT2_SMALL.with_(tied_embeddings=False)
    assert count_params(s).breakdown["head"] == s.vocab_size * s.n_embd
    r = GPT2_SMALL.with_(norm="rmsnorm", bias=False)
    assert count_params(r).breakdown["norms"] == (2 * 12 + 1) * 768
    assert count_params(r).breakdown["attention"] == 12 * 4 * 768 * 768


def test_spec_from_gpt_config_matches_the_model():
    cfg = GPTConfig(block_size=64, vocab_size=300, n_layer=3, n_head=2, n_embd=32, bias=False)
    with torch.device("meta"):
        model = GPT(cfg)
    assert count_params(spec_from_gpt_config(cfg)).total == model.num_params()


@pytest.mark.parametrize("field,value", [("n_layer", 0), ("n_embd", -8), ("vocab_size", 1.5),
                                         ("n_head", 0), ("d_ff", 0), ("max_positions", -1),
                                         ("norm", "batchnorm")])
def test_arch_spec_rejects_bad_fields(field, value):
    with pytest.raises(ValueError, match=field):
        GPT2_SMALL.with_(**{field: value})


def test_arch_spec_rejects_indivisible_heads():
    with pytest.raises(ValueError, match="divisible"):
        GPT2_SMALL.with_(n_head=7)


def test_count_params_rejects_non_spec():
    with pytest.raises(ValueError, match="ArchSpec"):
        count_params({"n_layer": 12})


def test_kv_cache_bytes():
    # K and V, 12 layers, 768 channels, fp16
    assert kv_cache_bytes(GPT2_SMALL, 1024) == 2 * 12 * 768 * 1024 * 2
    assert kv_cache_bytes(GPT2_SMALL, 10, batch=3, dtype_bytes=4) == 2 * 12 * 768 * 10 * 3 * 4
    with pytest.raises(ValueError, match="context_len"):
        kv_cache_bytes(GPT2_SMALL, -1)
    with pytest.raises(ValueError, match="dtype_bytes"):
        kv_cache_bytes(GPT2_SMALL, 1, dtype_bytes=0)


def test_the_headline_ratio():
    exact = K3_TOTAL_PARAMS / count_params(GPT2_SMALL).total
    headline = K3_TOTAL_PARAMS // round(count_params(GPT2_SMALL).total, -6)
    assert int(headline) == 22_580
    assert round(exact) == 22_501
    assert isinstance(ArchSpec.field_names(), tuple)


# ----------------------------------------------------------------------------- chapter 7:
# MLA, MoE, linear-state layers, cache / state bytes, bytes moved and FLOPs per token
from gpt2k3.accounting import (DETAIL_COMPONENTS, ParamCount, decode_bytes_per_token,
    flops_per_token, hybrid_layers, kv_numbers_per_layer, kv_numbers_per_token, mla_decode_costs,
    state_bytes, state_numbers_per_layer)
from gpt2k3.archs import DEEPSEEK_V3, KIMI_K2, KIMI_LINEAR_48B, MOE_MODELS, PUBLISHED  # noqa: E402

ALL_SPECS = (*GPT2_FAMILY, *MOE_MODELS)

#: A small hybrid MoE model: every kind of layer, cheap to reason about.
TINY = ArchSpec(name="tiny", vocab_size=100, n_layer=6, n_embd=16, n_head=4, d_ff=40,
                bias=False, norm="rmsnorm", tied_embeddings=False, mlp="swiglu", position="rope",
                attention="mla", q_lora_rank=8, kv_lora_rank=6, qk_nope_head_dim=4,
                qk_rope_head_dim=2, v_head_dim=5, kda_layers=(0, 1, 3, 4), kda_n_head=2,
                kda_head_dim=3, kda_conv_kernel=4, n_routed_experts=8, n_shared_experts=2, top_k=3,
                d_expert=7, first_k_dense=2)


@pytest.mark.parametrize("spec", ALL_SPECS, ids=lambda s: s.name)
def test_breakdowns_add_up(spec):
    c = count_params(spec)
    assert isinstance(c, ParamCount)
    assert tuple(c.breakdown) == COMPONENTS and tuple(c.detail) == DETAIL_COMPONENTS
    assert sum(c.breakdown.values()) == sum(c.detail.values()) == c.total
    assert sum(c.active_detail.values()) == c.active <= c.total
    assert c.breakdown["attention"] == c.detail["softmax attention"] + c.detail["linear attention"]
    assert c.breakdown["MLP"] == sum(c.detail[k] for k in ("dense MLP", "router", "shared experts",
                                                            "routed experts"))
    assert 0 < c.matmul_active <= c.active + spec.vocab_size * spec.n_embd


def test_tiny_hybrid_counts_by_hand():
    d = 16
    mla = d * 8 + 8 + 8 * 4 * 6 + d * (6 + 2) + 6 + 6 * 4 * (4 + 5) + 4 * 5 * d
    kda = 3 * d * 6 + 4 * 3 * 6 + 2 + d * 3 + 3 * 6 + 6 + d * 2 + d * 3 + 3 * 6 + 3 + 6 * d
    c = count_params(TINY)
    assert TINY.layer_mixers == ("kda", "kda", "mla", "kda", "kda", "mla")
    assert c.detail["softmax attention"] == 2 * mla
    assert c.detail["linear attention"] == 4 * kda
    assert c.detail["dense MLP"] == 2 * 3 * d * 40
    assert c.detail["router"] == 4 * 8 * d
    assert c.detail["shared experts"] == 4 * 2 * 3 * d * 7
    assert c.detail["routed experts"] == 4 * 8 * 3 * d * 7
    assert c.active_detail["routed experts"] == 4 * 3 * 3 * d * 7
    assert c.detail["norms"] == (2 * 6 + 1) * d
    assert c.detail["head"] == c.detail["token embeddings"] == 100 * d
    assert c.active == c.total - 4 * (8 - 3) * 3 * d * 7


@pytest.mark.parametrize("spec", GPT2_FAMILY, ids=lambda s: s.name)
def test_dense_models_are_fully_active(spec):
    c = count_params(spec)
    assert c.active == c.total and c.active_detail == c.detail
    # GPT-2 multiplies through its attention and MLP weights and the (tied) head
    d, L = spec.n_embd, spec.n_layer
    assert c.matmul_active == L * (4 * d * d + 8 * d * d) + spec.vocab_size * d


def test_published_moe_models_are_sparse_as_reported():
    for spec in MOE_MODELS:
        c, pub = count_params(spec), PUBLISHED[spec.name]
        # within the rounding of the published headline (and of its convention)
        assert abs(c.total / pub["total"] - 1) < 0.05, spec.name
        assert abs(c.active / pub["active"] - 1) < 0.2, spec.name
    # DeepSeek-V3: each MoE layer's active experts are exactly as wide as its dense MLP
    assert (DEEPSEEK_V3.top_k + DEEPSEEK_V3.n_shared_experts) * DEEPSEEK_V3.d_expert == DEEPSEEK_V3.d_ff


def test_hybrid_layers():
    assert hybrid_layers(27, 3) == KIMI_LINEAR_48B.kda_layers
    attention = [i + 1 for i in range(27) if i not in hybrid_layers(27, 3)]
    assert attention == [4, 8, 12, 16, 20, 24, 27]  # Kimi Linear's full_attn_layers (1-based)
    assert hybrid_layers(8, 0) == ()
    assert hybrid_layers(8, 100) == tuple(range(7))  # the last layer always attends
    assert hybrid_layers(1, 3) == ()
    for bad in ((0, 3), (8, -1), (8, 1.5)):
        with pytest.raises(ValueError):
            hybrid_layers(*bad)


def test_a_k3_shaped_spec_is_expressible():
    """Issue 8's K3_SCALE: a hybrid KDA:MLA schedule with MoE, at any ratio."""
    for ratio in (0, 1, 3, 7, 15):
        spec = KIMI_LINEAR_48B.with_(n_layer=64, kda_layers=hybrid_layers(64, ratio),
                                     n_routed_experts=512, top_k=16)
        assert spec.n_attention_layers == 64 - len(hybrid_layers(64, ratio))
        assert count_params(spec).total > count_params(KIMI_LINEAR_48B).total


# ------------------------------------------------------------------ cache and state
def test_kv_cache_bytes_mha_gqa_mla_and_linear_layers():
    gqa = GPT2_SMALL.with_(attention="gqa", n_kv_head=4)
    assert kv_numbers_per_layer(gqa) == 2 * 4 * 64
    assert kv_cache_bytes(gqa, 100) == 12 * 2 * 4 * 64 * 100 * 2
    assert kv_numbers_per_layer(DEEPSEEK_V3) == 512 + 64 == 576
    assert kv_cache_bytes(DEEPSEEK_V3, 1000, batch=2) == 61 * 576 * 1000 * 2 * 2
    assert kv_numbers_per_token(KIMI_LINEAR_48B) == 7 * 576  # only the 7 MLA layers grow
    assert kv_numbers_per_token(KIMI_K2) == kv_numbers_per_token(DEEPSEEK_V3)
    all_kda = KIMI_LINEAR_48B.with_(kda_layers=tuple(range(27)))
    assert kv_cache_bytes(all_kda, 1 << 20, batch=64) == 0
    assert kv_cache_bytes(DEEPSEEK_V3, 10, dtype_bytes=0.5) == 61 * 576 * 10 // 2  # int4


@pytest.mark.parametrize("spec", [GPT2_SMALL, DEEPSEEK_V3, KIMI_LINEAR_48B], ids=lambda s: s.name)
def test_cache_grows_linearly_and_state_not_at_all(spec):
    a, b = kv_cache_bytes(spec, 1000), kv_cache_bytes(spec, 3000)
    assert b == 3 * a and kv_cache_bytes(spec, 0) == 0
    assert state_bytes(spec, batch=4) == 4 * state_bytes(spec)


def test_state_bytes():
    per_layer = state_numbers_per_layer(KIMI_LINEAR_48B)
    assert per_layer == {"recurrent": 32 * 128 * 128, "conv": 3 * 3 * 32 * 128}
    assert state_bytes(KIMI_LINEAR_48B, batch=2, dtype_bytes=4) == 20 * (524288 + 36864) * 2 * 4
    no_conv = KIMI_LINEAR_48B.with_(kda_conv_kernel=0)
    # float32 by default (STATE_DTYPE_BYTES): exactly H x Dk x Dv per layer, 4 bytes each
    assert STATE_DTYPE_BYTES == 4
    assert state_bytes(no_conv) == 20 * 32 * 128 * 128 * 4
    assert state_bytes(no_conv, dtype_bytes=2) == 20 * 32 * 128 * 128 * 2
    assert state_bytes(DEEPSEEK_V3) == state_bytes(GPT2_SMALL) == 0
    with pytest.raises(ValueError, match="batch"):
        state_bytes(KIMI_LINEAR_48B, batch=-1)
    with pytest.raises(ValueError, match="dtype_bytes"):
        state_bytes(KIMI_LINEAR_48B, dtype_bytes=0)


# ------------------------------------------------------------------ bytes moved and FLOPs
def test_decode_bytes_dense_model():
    s, d = GPT2_SMALL, GPT2_SMALL.n_embd
    c = count_params(s)
    weights = c.total - 1024 * d  # the tied table is read by the head; one position row
    assert decode_bytes_per_token(s, 0) == (weights + d) * 2
    assert decode_bytes_per_token(s, 0, batch=8) == (weights + 8 * d) * 2 / 8
    assert decode_bytes_per_token(s, 500) - decode_bytes_per_token(s, 0) == kv_cache_bytes(s, 500)
    assert decode_bytes_per_token(s, 0, weight_bytes=0.5) == (weights + d) * 0.5


def test_decode_bytes_moe_reads_more_experts_as_the_batch_grows():
    s = DEEPSEEK_V3
    c, d, expert = count_params(s), s.n_embd, 3 * s.n_embd * s.d_expert
    batch1 = c.active - c.detail["token embeddings"] + d  # one embedding row
    assert decode_bytes_per_token(s, 0) == pytest.approx(batch1 * 2, rel=1e-12)
    per_step = [decode_bytes_per_token(s, 0, batch=b) * b for b in (1, 2, 8, 64, 4096)]
    assert per_step == sorted(per_step)  # more tokens, more distinct experts read per step
    everything = c.total - c.detail["token embeddings"] + 4096 * d
    assert per_step[-1] == pytest.approx(everything * 2, rel=1e-9)
    assert per_step[1] / 2 < per_step[0]  # but less per token
    # the expected distinct experts for two tokens: E (1 - (1 - k/E)^2)
    two = s.n_moe_layers * 256 * (1 - (1 - 8 / 256) ** 2) * expert
    assert per_step[1] == pytest.approx((batch1 - s.n_moe_layers * 8 * expert + two + d) * 2)


def test_decode_bytes_linear_layers_move_their_state_not_a_growing_cache():
    s = KIMI_LINEAR_48B
    grow = decode_bytes_per_token(s, 2000) - decode_bytes_per_token(s, 1000)
    assert grow == kv_cache_bytes(s, 1000) == 7 * 576 * 1000 * 2
    c = count_params(s)
    weights = c.active - c.detail["token embeddings"] + s.n_embd
    assert state_bytes(s) > 0  # read and written back once per step, whatever the context
    assert decode_bytes_per_token(s, 0) == pytest.approx(weights * 2 + 2 * state_bytes(s), rel=1e-12)


@pytest.mark.parametrize("spec", ALL_SPECS, ids=lambda s: s.name)
def test_flops_at_zero_context_are_twice_the_matmul_weights(spec):
    state = 7 * spec.kda_n_head * spec.kda_head_dim ** 2 * spec.n_kda_layers
    assert flops_per_token(spec, 0) == 2 * count_params(spec).matmul_active + state


def test_flops_context_terms():
    s = GPT2_SMALL
    assert flops_per_token(s, 1000) - flops_per_token(s, 0) == 12 * 4 * 768 * 1000
    costs = mla_decode_costs(DEEPSEEK_V3)
    assert costs["absorbed"] == {"numbers": 576, "flops": 2 * 128 * (512 + 64) + 2 * 128 * 512}
    assert costs["mha_cache"] == {"numbers": 40_960, "flops": 2 * 128 * 192 + 2 * 128 * 128}
    assert costs["naive"]["flops"] == 2 * 512 * 128 * 256 + costs["mha_cache"]["flops"]
    for absorbed, form in ((True, "absorbed"), (False, "naive")):
        grow = (flops_per_token(DEEPSEEK_V3, 100, mla_absorbed=absorbed)
                - flops_per_token(DEEPSEEK_V3, 0, mla_absorbed=absorbed))
        assert grow == 61 * costs[form]["flops"] * 100
    kl = KIMI_LINEAR_48B
    per_position = mla_decode_costs(kl)["absorbed"]["flops"]
    assert flops_per_token(kl, 10) - flops_per_token(kl, 0) == 7 * per_position * 10  # 7 MLA layers
    with pytest.raises(ValueError, match="mla"):
        mla_decode_costs(GPT2_SMALL)
    with pytest.raises(ValueError, match="context_len"):
        flops_per_token(s, -1)
    with pytest.raises(ValueError, match="mla_absorbed"):
        flops_per_token(DEEPSEEK_V3, 1, mla_absorbed="yes")


@pytest.mark.parametrize("kwargs, field", [
    (dict(context_len=-1), "context_len"), (dict(batch=0), "batch"),
    (dict(weight_bytes=0), "weight_bytes"), (dict(cache_bytes=-2), "cache_bytes"),
    (dict(batch=2.0), "batch"),
])
def test_decode_bytes_validates(kwargs, field):
    args = {"context_len": 10, **kwargs}
    with pytest.raises(ValueError, match=field):
        decode_bytes_per_token(DEEPSEEK_V3, **args)


# ------------------------------------------------------------------ impossible specs
@pytest.mark.parametrize("changes, field", [
    (dict(top_k=300), "top_k"),                      # more active than total experts
    (dict(top_k=0), "top_k"),
    (dict(n_routed_experts=-8), "n_routed_experts"),
    (dict(d_expert=0), "d_expert"),
    (dict(d_expert=-1), "d_expert"),
    (dict(first_k_dense=62), "first_k_dense"),
    (dict(n_shared_experts=-1), "n_shared_experts"),
    (dict(kv_lora_rank=0), "kv_lora_rank"),
    (dict(kv_lora_rank=-512), "kv_lora_rank"),
    (dict(qk_rope_head_dim=63), "qk_rope_head_dim"),
    (dict(v_head_dim=0), "v_head_dim"),
    (dict(qk_nope_head_dim=0, qk_rope_head_dim=0), "qk_nope_head_dim"),
    (dict(q_lora_rank=0), "q_lora_rank"),
    (dict(attention="linear"), "attention"),
    (dict(mlp="relu"), "mlp"),
    (dict(position="alibi"), "position"),
    (dict(kda_layers=(61,)), "kda_layers"),
    (dict(kda_layers=(3, 3), kda_n_head=2, kda_head_dim=4), "kda_layers"),
    (dict(kda_layers=(0,)), "kda_n_head"),
    (dict(kda_layers="0,1"), "kda_layers"),
    (dict(kda_conv_kernel=-1), "kda_conv_kernel"),
    (dict(tied_embeddings=1), "tied_embeddings"),
])
def test_impossible_moe_specs_name_the_field(changes, field):
    with pytest.raises(ValueError, match=field):
        DEEPSEEK_V3.with_(**changes)


@pytest.mark.parametrize("changes, field", [
    (dict(attention="gqa", n_kv_head=5), "n_kv_head"),   # 5 does not divide 12 heads
    (dict(n_kv_head=4), "n_kv_head"),                    # mha must have n_head K/V heads
    (dict(n_kv_head=0), "n_kv_head"),
    (dict(d_head=-64), "d_head"),
    (dict(top_k=2), "top_k"),                            # experts per token without experts
    (dict(n_shared_experts=1), "n_shared_experts"),
])
def test_impossible_dense_specs_name_the_field(changes, field):
    with pytest.raises(ValueError, match=field):
        GPT2_SMALL.with_(**changes)


def test_schedules_follow_the_layer_count():
    with pytest.raises(ValueError, match="kda_layers"):
        KIMI_LINEAR_48B.with_(n_layer=20)  # layer 25 would not exist
    assert KIMI_LINEAR_48B.with_(kda_layers=[3, 1, 2]).kda_layers == (1, 2, 3)
    gqa12 = GPT2_SMALL.with_(attention="gqa", n_kv_head=12)  # GQA with a K/V head per query head
    assert count_params(gqa12) == count_params(GPT2_SMALL)
    assert kv_cache_bytes(gqa12, 7) == kv_cache_bytes(GPT2_SMALL, 7)
    # explicit head widths lift the divisibility rule
    assert GPT2_SMALL.with_(n_head=7, d_head=64).head_dim == 64


def test_mla_and_moe_fields_are_ignored_by_other_kinds():
    dense = DEEPSEEK_V3.with_(attention="mha", n_routed_experts=0, top_k=0, n_shared_experts=0)
    assert count_params(dense).detail["router"] == 0
    assert kv_numbers_per_layer(dense) == 2 * 128 * 56


def test_param_components_figure():
    from gpt2k3.book.figures import PARAM_SPECS, param_components

    fig = param_components(active=3)
    (slider,) = fig.layout.sliders
    assert [s.label for s in slider.steps] == [s.name.replace(" 48B-A3B", "") for s in PARAM_SPECS]
    for step, spec in zip(slider.steps, PARAM_SPECS):
        c = count_params(spec)
        data, layout, traces = step.args
        assert list(traces) == [2, 3]
        assert data["x"][0] == [c.detail[n] or None for n in DETAIL_COMPONENTS]
        assert data["x"][1] == [c.active_detail[n] or None for n in DETAIL_COMPONENTS]
        assert f"{c.total:,}" in layout["title.text"] and f"{c.active:,}" in layout["title.text"]
    assert list(fig.data[0].x) == [count_params(s).total for s in PARAM_SPECS]
    assert list(fig.data[1].x) == [count_params(s).active for s in PARAM_SPECS]
    assert list(fig.data[2].x) == slider.steps[3].args[0]["x"][0]  # opens on DeepSeek-V3
    assert fig.layout.xaxis.type == fig.layout.xaxis2.type == "log"
    assert fig.layout.xaxis.title.text and fig.layout.xaxis2.title.text
    with pytest.raises(ValueError, match="specs"):
        param_components([])


def test_moe_explorer_keeps_top_k_within_the_experts_and_redraws():
    import plotly.graph_objects as go

    from gpt2k3.book.widgets import moe_explorer

    box = moe_explorer()
    c = box.controls
    assert "671,026,404,352" in box.current.layout.title.text
    c["experts"].value = 16
    assert c["top_k"].max == 16 and c["top_k"].value <= 16
    c["top_k"].value = 2
    assert isinstance(box.current, go.Figure)
    spec = DEEPSEEK_V3.with_(n_routed_experts=16, top_k=2)
    assert f"{count_params(spec).active:,}" in box.current.layout.title.text
    c["context"].value = 1 << 20
    assert "1,048,576-token" in box.current.layout.title.text
    with pytest.raises(ValueError, match="MoE"):
        moe_explorer(GPT2_SMALL)


# ----------------------------------------------------------------------------- chapter 9:
# hardware, serving memory, the roofline and serving plans
import math  # noqa: E402

from gpt2k3.archs import GPT2_XL  # noqa: E402
from gpt2k3.accounting import (H200, H200_BAND, H200_MEASURED, H200_MEASUREMENTS,
    STATE_DTYPE_BYTES, Hardware, ServingPlan, devices_needed, max_batch, memory_per_sequence,
    plan_roofline, roofline, roofline_band, serving_memory, serving_plan, weights_read_per_step)


def test_h200_is_the_datasheet_and_the_band_brackets_it_with_the_measurement():
    # NVIDIA's datasheet: 141 GB HBM3e, 4.8 TB/s, ~989 TFLOP/s dense BF16
    assert (H200.memory_bytes, H200.bandwidth, H200.peak_flops) == (141e9, 4.8e12, 989e12)
    assert H200.ridge == pytest.approx(989 / 4.8)
    assert H200.per_machine == 8 and "datasheet" in H200.source
    # measured: a decode step over a 1M-token bf16 cache reads at 4.55 TB/s; copy 4.20 TB/s
    assert H200_MEASURED.bandwidth == H200_MEASUREMENTS["decode_read_bandwidth"]
    assert round(H200_MEASURED.bandwidth / 1e12, 2) == 4.55
    assert round(H200_MEASUREMENTS["copy_bandwidth"] / 1e12, 2) == 4.20
    assert (H200_MEASURED.memory_bytes, H200_MEASURED.peak_flops) == (141e9, 989e12)
    assert "measured" in H200_MEASURED.source and H200_BAND == {"datasheet": H200,
                                                                "measured": H200_MEASURED}
    band = roofline_band(KIMI_LINEAR_48B, 1 << 20, 1)
    assert band["datasheet"] == roofline(KIMI_LINEAR_48B, 1 << 20, 1, H200)
    assert band["measured"].memory_s == pytest.approx(band["datasheet"].memory_s * 4.8e12
                                                      / H200_MEASURED.bandwidth)
    assert band["datasheet"].step_s < band["measured"].step_s
    with pytest.raises(ValueError, match="band"):
        roofline_band(KIMI_LINEAR_48B, 1, 1, band={})
    for bad in (dict(memory_bytes=0), dict(bandwidth=-1.0), dict(peak_flops=float("inf")),
                dict(per_machine=0)):
        field = next(iter(bad))
        with pytest.raises(ValueError, match=field):
            Hardware(**{"name": "x", "memory_bytes": 1.0, "bandwidth": 1.0, "peak_flops": 1.0,
                        **bad})


def test_h200_measurements_are_the_copied_results_file():
    from gpt2k3.book import results

    anchor = results.load(H200_MEASUREMENTS["file"])
    assert anchor["device"] == "NVIDIA H200"
    assert H200_MEASUREMENTS["copy_bandwidth"] == anchor["copy_TBps"] * 1e12
    (row,) = [r for r in anchor["decode"] if r["N"] == H200_MEASUREMENTS["decode_context"]
              and r["B"] == H200_MEASUREMENTS["decode_batch"]]
    assert H200_MEASUREMENTS["decode_read_bandwidth"] == row["mha_TBps"] * 1e12
    assert H200_MEASUREMENTS["decode_ms"] == row["mha_ms"]
    # the effective bandwidth is the cache bytes over the time: 32 heads x 128, bf16, K and V
    n, h, d = row["N"], H200_MEASUREMENTS["decode_heads"], H200_MEASUREMENTS["decode_head_dim"]
    assert 2 * n * h * d * 2 / (row["mha_ms"] / 1e3) == pytest.approx(row["mha_TBps"] * 1e12)


def test_decode_bytes_state_is_float32_unless_told():
    s = KIMI_LINEAR_48B
    base = decode_bytes_per_token(s, 1000)
    assert decode_bytes_per_token(s, 1000, state_dtype_bytes=4) == base
    assert base - decode_bytes_per_token(s, 1000, state_dtype_bytes=2) == pytest.approx(
        2 * state_bytes(s, 1, 2))  # read and written: twice the extra bytes of a float32 state
    with pytest.raises(ValueError, match="state_dtype_bytes"):
        decode_bytes_per_token(s, 1000, state_dtype_bytes=0)


def testweights_read_per_step_is_the_weight_part_of_thedecode_bytes():
    for spec in (GPT2_SMALL, DEEPSEEK_V3, KIMI_LINEAR_48B):
        for b in (1, 7, 300):
            weights = weights_read_per_step(spec, b)
            assert decode_bytes_per_token(spec, 0, b, state_dtype_bytes=1) == pytest.approx(
                weights * 2 / b + 2 * state_bytes(spec, 1, 1))
    with pytest.raises(ValueError, match="batch"):
        weights_read_per_step(GPT2_SMALL, 0)


def test_serving_memory_and_devices_needed():
    s, n, b = KIMI_LINEAR_48B, 1 << 17, 6
    m = serving_memory(s, n, b, weight_bytes=1, cache_bytes=2, state_dtype_bytes=4)
    assert m["weights"] == count_params(s).total
    assert m["cache"] == kv_cache_bytes(s, n, b, 2) and m["state"] == state_bytes(s, b, 4)
    assert m["total"] == m["weights"] + m["cache"] + m["state"]
    assert memory_per_sequence(s, n) == kv_cache_bytes(s, n) + state_bytes(s, 1, 4)
    k = devices_needed(s, n, b, weight_bytes=1)
    assert (k - 1) * H200.memory_bytes < m["total"] <= k * H200.memory_bytes
    assert devices_needed(GPT2_SMALL, 10) == 1


@pytest.mark.parametrize("spec, n", [(KIMI_LINEAR_48B, 1 << 20), (KIMI_LINEAR_48B, 4096),
                                     (DEEPSEEK_V3.with_(n_layer=8, first_k_dense=1), 32768)],
                         ids=["kimi-1M", "kimi-4K", "small-v3"])
def test_max_batch_is_the_last_batch_that_fits(spec, n):
    for devices in (1, 3):
        b = max_batch(spec, n, n_devices=devices)
        cap = devices * H200.memory_bytes
        if b == 0:  # the weights alone do not fit
            assert serving_memory(spec, n, 0)["weights"] > cap - memory_per_sequence(spec, n)
            continue
        assert serving_memory(spec, n, b)["total"] <= cap < serving_memory(spec, n, b + 1)["total"]
    assert max_batch(DEEPSEEK_V3, 10) == 0  # 1.3 TB of bf16 weights do not fit in 141 GB
    with pytest.raises(ValueError, match="context_len"):
        max_batch(GPT2_SMALL, 0)
    with pytest.raises(ValueError, match="n_devices"):
        max_batch(GPT2_SMALL, 10, n_devices=0)


def test_roofline_is_the_larger_of_bytes_and_flops():
    s = KIMI_LINEAR_48B
    r = roofline(s, 1 << 20, batch=4)
    assert r.bytes_per_step == pytest.approx(4 * decode_bytes_per_token(s, 1 << 20, 4,
                                                                        state_dtype_bytes=4))
    assert r.flops_per_step == 4 * flops_per_token(s, 1 << 20)
    assert r.memory_s == r.bytes_per_step / H200.bandwidth
    assert r.compute_s == r.flops_per_step / H200.peak_flops
    assert r.step_s == max(r.memory_s, r.compute_s) and r.per_token_s == r.step_s / 4
    assert r.bound == "memory" and r.intensity < H200.ridge
    two = roofline(s, 1 << 20, batch=4, n_devices=2)
    assert two.step_s == pytest.approx(r.step_s / 2)
    # a dense model at a huge batch and a short context is limited by compute
    big = roofline(GPT2_XL, 16, batch=4096)
    assert big.bound == "compute" and big.intensity > H200.ridge
    with pytest.raises(ValueError, match="hardware"):
        roofline(s, 10, hardware="H200")
    with pytest.raises(ValueError, match="n_devices"):
        roofline(s, 10, n_devices=0)


def test_serving_plan_is_the_smallest_layout_that_fits():
    s = DEEPSEEK_V3
    for tp, wb in ((1, 2), (8, 1)):
        plan = serving_plan(s, 32768, 16, tp=tp, weight_bytes=wb)
        assert isinstance(plan, ServingPlan) and plan.n_devices % tp == 0
        assert plan.per_device["total"] <= H200.memory_bytes
        assert plan.ep == plan.n_devices and plan.dp * tp == plan.n_devices
        assert plan.machines == math.ceil(plan.n_devices / 8)
        assert plan.experts_per_device == math.ceil(256 / plan.n_devices)
        assert plan.per_device["total"] == pytest.approx(sum(
            v for k, v in plan.per_device.items() if k != "total"))
        if plan.n_devices > tp:  # tp devices fewer do not fit
            assert serving_plan(s, 32768, 16, tp=tp, weight_bytes=wb,
                                max_devices=plan.n_devices - tp) is None
        assert plan.n_devices >= devices_needed(s, 32768, 16, weight_bytes=wb)


def test_serving_plan_keeps_an_mla_latent_whole_on_every_tensor_parallel_rank():
    mla = KIMI_LINEAR_48B.with_(kda_layers=())
    mha = mla.with_(attention="mha", d_head=128)
    for spec in (mla, mha):
        one = serving_plan(spec, 4096, 1, tp=1).per_device["cache"]
        eight = serving_plan(spec, 4096, 1, tp=8).per_device["cache"]
        assert one == kv_cache_bytes(spec, 4096)
        assert eight == (one if spec.attention == "mla" else one / 8)
    # a single sequence whose cache outgrows a device has no plan
    assert serving_plan(DEEPSEEK_V3, 1 << 22, 1, tp=8) is None
    with pytest.raises(ValueError, match="tp"):
        serving_plan(GPT2_SMALL, 10, tp=16)
    with pytest.raises(ValueError, match="batch"):
        serving_plan(GPT2_SMALL, 10, batch=0)


def test_plan_roofline_on_one_device_is_the_roofline():
    for spec, n, b in ((KIMI_LINEAR_48B, 8192, 4), (GPT2_XL, 1024, 32)):
        plan = serving_plan(spec, n, b)
        assert plan.n_devices == 1
        got, want = plan_roofline(spec, plan, n, b), roofline(spec, n, b)
        assert got.bytes_per_step == pytest.approx(want.bytes_per_step, rel=1e-12)
        assert got.flops_per_step == pytest.approx(want.flops_per_step, rel=1e-12)


def test_plan_roofline_is_set_by_the_busiest_device():
    s = DEEPSEEK_V3
    plan = serving_plan(s, 1 << 17, 1, tp=8)
    busy, ideal = plan_roofline(s, plan, 1 << 17, 1), roofline(s, 1 << 17, 1,
                                                               n_devices=plan.n_devices)
    # at batch 1 one group works and a token's 8 experts sit on a few devices: far from ideal
    assert busy.step_s > 2 * ideal.step_s
    # the busiest device reads at least the whole latent cache and its share of shared weights
    c = count_params(s)
    shared = (c.total - c.detail["routed experts"]) * 2 / 8
    assert busy.bytes_per_step > kv_cache_bytes(s, 1 << 17) + 0.9 * shared
    with pytest.raises(ValueError, match="plan"):
        plan_roofline(s, None, 10, 1)


# ------------------------------------------------------------------ chapter 7 and 9 additions:
# MTP modules, packed experts, checkpoint bytes, the released format in the serving functions
def test_mtp_params_is_deepseek_v3s_mtp_layer():
    """DeepSeek-V3's config: one MTP module (num_nextn_predict_layers 1) = one more MoE
    decoder layer + eh_proj (2d x d) + enorm, hnorm, shared_head.norm + the shared embedding
    and head, which the checkpoint stores again.  Written out from the config's numbers."""
    from gpt2k3.accounting.params import mtp_params
    from gpt2k3.archs import MTP_LAYERS

    d, V, H, QL, KVL, DN, DR, DV = 7168, 129280, 128, 1536, 512, 128, 64, 128
    E, SH, FE = 256, 1, 2048
    mla = (d * QL + QL + QL * H * (DN + DR) + d * (KVL + DR) + KVL + KVL * H * (DN + DV)
           + H * DV * d)
    moe = E * d + SH * 3 * d * FE + E * 3 * d * FE
    layer = mla + moe + 2 * d
    m = mtp_params(DEEPSEEK_V3)
    assert m["decoder layer"] == layer and m["eh_proj"] == 2 * d * d and m["norms"] == 3 * d
    assert m["embedding copy"] == m["head copy"] == V * d
    assert m["unique"] == layer + 2 * d * d + 3 * d
    assert m["with copies"] == m["unique"] + 2 * V * d
    assert m["active"] == mla + E * d + SH * 3 * d * FE + 8 * 3 * d * FE + 2 * d + 2 * d * d + 3 * d
    assert mtp_params(DEEPSEEK_V3, 2)["unique"] == 2 * m["unique"]
    # 671B + the MTP module as the checkpoint stores it = the model card's 685B
    total = count_params(DEEPSEEK_V3).total
    assert round(total / 1e9) == 671 and abs((total + m["with copies"]) / 685e9 - 1) < 0.001
    assert MTP_LAYERS == {"DeepSeek-V3": 1, "Kimi K2": 0, "Kimi K3": 0}
    # Kimi K2 ships none; its report's 1.04T is the main model plus one MTP layer counted
    # DeepSeek's way (unique); with the copies it would round to 1.05T
    k2 = count_params(KIMI_K2).total
    mk2 = mtp_params(KIMI_K2)
    assert round(k2 / 1e12, 2) == 1.03 and round((k2 + mk2["unique"]) / 1e12, 2) == 1.04
    assert round((k2 + mk2["with copies"]) / 1e12, 2) == 1.05
    assert PUBLISHED["Kimi K2"]["report_total"] == 1.04e12
    with pytest.raises(ValueError, match="spec"):
        mtp_params("DeepSeek-V3")
    with pytest.raises(ValueError, match="n_layers"):
        mtp_params(DEEPSEEK_V3, 0)


def test_router_biases_are_checkpoint_tensors_a_parameter_count_leaves_out():
    from gpt2k3.accounting import stored_elements

    assert stored_elements(KIMI_K2)["router biases"] == 60 * 384 == 23_040
    assert stored_elements(KIMI_K2)["total"] == count_params(KIMI_K2).total + 23_040
    assert stored_elements(KIMI_K2, router_bias=False)["total"] == count_params(KIMI_K2).total


def test_packed_bytes_and_checkpoint_bytes():
    from gpt2k3.accounting import stored_elements
    from gpt2k3.accounting.params import checkpoint_bytes, packed_bytes_per_weight

    assert packed_bytes_per_weight() == 0.53125
    assert packed_bytes_per_weight(8, 32, 8) == 1 + 1 / 32
    for bad in (dict(bits=3), dict(group_size=0), dict(scale_bits=7)):
        with pytest.raises(ValueError, match=next(iter(bad))):
            packed_bytes_per_weight(**bad)
    e = stored_elements(DEEPSEEK_V3, expert_bits=4)
    b = checkpoint_bytes(DEEPSEEK_V3, 4)
    assert b["routed experts"] == e["packed experts"] + e["expert scales"]
    assert b["other tensors"] == 2 * (e["total"] - e["packed experts"] - e["expert scales"])
    assert b["total"] == b["routed experts"] + b["other tensors"]
    assert checkpoint_bytes(GPT2_SMALL, None, router_bias=False)["total"] == 2 * 124_439_808
    with pytest.raises(ValueError, match="other_bytes"):
        checkpoint_bytes(GPT2_SMALL, None, other_bytes=0)


def test_expert_bytes_default_to_the_weight_format():
    s, n = DEEPSEEK_V3, 4096
    for fn in (serving_memory, devices_needed):
        assert fn(s, n, 2, weight_bytes=1) == fn(s, n, 2, weight_bytes=1, expert_bytes=1)
    assert max_batch(s, n, n_devices=16) == max_batch(s, n, n_devices=16, expert_bytes=2)
    assert roofline(s, n, 8) == roofline(s, n, 8, expert_bytes=2)
    # dense models have no routed experts: the expert format changes nothing
    assert roofline(GPT2_XL, n, 8, expert_bytes=0.5) == roofline(GPT2_XL, n, 8)
    c = count_params(s)
    m = serving_memory(s, 0, 0, weight_bytes=2, expert_bytes=0.5)["weights"]
    assert m == (c.total - c.parts["routed experts"]) * 2 + c.parts["routed experts"] * 0.5
    plan = serving_plan(s, 32768, 16, tp=8, expert_bytes=0.5)
    assert plan.n_devices <= serving_plan(s, 32768, 16, tp=8).n_devices
    r = plan_roofline(s, plan, 32768, 16, expert_bytes=0.5)
    assert r.bytes_per_step < plan_roofline(s, plan, 32768, 16).bytes_per_step


# ------------------------------------------------------------------ the busiest device (ch. 9)


def test_distinct_experts_distribution_has_the_closed_form_mean():
    from gpt2k3.accounting.decode import expected_distinct_experts
    from gpt2k3.accounting.experts import (
        _distinct_experts_distribution as distinct_experts_distribution)
    for e, k, b in ((896, 16, 1), (896, 16, 64), (8, 2, 3), (5, 5, 2)):
        p = distinct_experts_distribution(e, k, b)
        assert sum(p) == pytest.approx(1.0, abs=1e-9)
        mean = sum(d * q for d, q in enumerate(p))
        assert mean == pytest.approx(expected_distinct_experts(e, k, b), rel=1e-9)
    assert distinct_experts_distribution(896, 16, 1)[16] == pytest.approx(1.0)


def test_expected_busiest_experts_exact_small_cases():
    from itertools import combinations, product
    from gpt2k3.accounting.experts import _busiest_experts as expected_busiest_experts
    # 8 experts on 4 devices, one token picks 2: both land on one device with chance 4/28
    assert expected_busiest_experts(8, 2, 1, 4) == pytest.approx(1 + 4 / 28, rel=1e-9)
    # brute force over every routing of 2 tokens, 7 experts on 3 devices (3, 2, 2)
    owner = [0, 0, 0, 1, 1, 2, 2]
    picks = list(combinations(range(7), 3))
    total = 0
    for a, b in product(picks, repeat=2):
        load = [0, 0, 0]
        for x in set(a) | set(b):
            load[owner[x]] += 1
        total += max(load)
    assert expected_busiest_experts(7, 3, 2, 3) == pytest.approx(total / len(picks) ** 2,
                                                                 rel=1e-9)


def test_expected_busiest_experts_matches_sampling_and_bounds():
    from gpt2k3.accounting.decode import expected_distinct_experts
    from gpt2k3.accounting.experts import _busiest_experts as expected_busiest_experts
    from gpt2k3.accounting.experts import (
        _busiest_experts_sampled as expected_busiest_experts_sampled)
    for e, k, b, n in ((896, 16, 1, 56), (896, 16, 64, 176), (64, 6, 4, 8)):
        exact = expected_busiest_experts(e, k, b, n)
        sampled = expected_busiest_experts_sampled(e, k, b, n, trials=300, seed=1)
        assert exact == pytest.approx(sampled, abs=0.15)
        mean = expected_distinct_experts(e, k, b) / n
        assert mean <= exact <= -(-e // n)
    # one device: the busiest is everyone; every expert picked: each device is full
    assert expected_busiest_experts(896, 16, 8, 1) == pytest.approx(
        expected_distinct_experts(896, 16, 8), rel=1e-9)
    assert expected_busiest_experts(896, 16, 4096, 56) == pytest.approx(16.0, rel=1e-9)
    # Kimi K3 at batch 1 on 56 devices: about 2 experts, seven times the mean load
    assert expected_busiest_experts(896, 16, 1, 56) == pytest.approx(2.02, abs=0.01)
    # the arguments are checked once, at the public, spec-based entries below
    # the public, spec-based forms
    from gpt2k3.accounting import experts, serving
    from gpt2k3.archs import KIMI_K3
    assert experts.expected_busiest_experts(KIMI_K3, 1, 56) == expected_busiest_experts(896, 16, 1, 56)
    assert experts.expected_busiest_experts_sampled(KIMI_K3, 1, 56, trials=200) == pytest.approx(
        experts.expected_busiest_experts(KIMI_K3, 1, 56), abs=0.2)
    assert experts.expected_busiest_experts(GPT2_SMALL, 8, 4) == 0.0
    for bad in (dict(batch=0), dict(batch=1.5), dict(n_devices=0), dict(n_devices=1.5),
                dict(spec=None)):
        args = {**dict(spec=KIMI_K3, batch=1, n_devices=56), **bad}
        with pytest.raises(ValueError, match=next(iter(bad))):
            experts.expected_busiest_experts(**args)
    with pytest.raises(ValueError, match="seed"):
        experts.expected_busiest_experts_sampled(KIMI_K3, seed=1.5)
    with pytest.raises(ValueError, match="trials"):
        experts.expected_busiest_experts_sampled(KIMI_K3, trials=0)


def test_expected_busiest_experts_work_is_bounded_whatever_the_batch(monkeypatch):
    """The distinct-expert law is built token by token only until it has saturated: the number
    of one-token steps depends on the experts and top-k, never on the batch, so a batch of
    2**62 costs what a batch of a few thousand does, and gives the same (saturated) answer."""
    from gpt2k3.accounting import experts, serving
    from gpt2k3.archs import KIMI_K3
    e, k = KIMI_K3.n_routed_experts, KIMI_K3.top_k
    cap = experts._saturation_batch(e, k)
    assert cap < 4000 and e * (1 - k / e) ** cap < 2.0 ** -60      # saturated at the cap
    steps = []
    one_token = experts._one_token
    monkeypatch.setattr(experts, "_one_token", lambda *a: steps.append(1) or one_token(*a))
    huge = experts.expected_busiest_experts(KIMI_K3, 2 ** 62, 56)
    assert 0 < len(steps) <= cap
    assert huge == pytest.approx(16.0, rel=1e-12)                     # every expert picked
    steps.clear()
    assert experts.expected_busiest_experts(KIMI_K3, 1, 56) > 1 and len(steps) == 1
    # below the cap nothing changed: token by token, as before
    p_small = experts._distinct_experts_distribution(8, 2, 3)
    assert sum(p_small) == pytest.approx(1.0, abs=1e-12)
    assert experts._saturation_batch(5, 5) == 1
    for e2, k2 in ((8, 2), (64, 6), (896, 16)):
        c2 = experts._saturation_batch(e2, k2)
        assert experts._distinct_experts_distribution(e2, k2, 10 ** 18) == \
            experts._distinct_experts_distribution(e2, k2, c2)


def test_plan_roofline_reads_the_busiest_devices_experts():
    from gpt2k3.accounting.experts import expected_busiest_experts
    from gpt2k3.archs import KIMI_K3
    s, n_ctx = KIMI_K3, 1 << 20
    plan = serving_plan(s, n_ctx, 1, tp=8)
    got = plan_roofline(s, plan, n_ctx, 1)
    c = count_params(s)
    shared = (c.total - c.detail["routed experts"]) * 2 / 8
    busiest = expected_busiest_experts(s, 1, plan.n_devices)
    experts = s.n_moe_layers * busiest * s.expert_params * 2
    # the rest of what the device reads: its share of the always-read weights and the cache
    assert got.bytes_per_step > experts + kv_cache_bytes(s, n_ctx) + 0.9 * shared
    mean = s.n_moe_layers * plan.experts_per_device * s.top_k / s.n_routed_experts
    assert busiest * s.n_moe_layers > 5 * mean


def test_plan_roofline_parts_split_the_state_by_head_and_the_latent_not():
    """Chapter 9's batch-1 breakdown: the busiest device reads the whole MLA latent but only
    its 1/tp share of the KDA state (twice: read and written back); what is left beside the
    experts is its 1/tp share of the always-read weights, written out here from W(1)."""
    from gpt2k3.accounting.decode import weights_read_per_step
    from gpt2k3.accounting.experts import expected_busiest_experts
    from gpt2k3.archs import KIMI_K3
    s, n_ctx, tp = KIMI_K3, 1 << 20, 8
    plan = serving_plan(s, n_ctx, 1, tp=tp)
    step = plan_roofline(s, plan, n_ctx, 1)
    parts = step.bytes_by_part
    assert set(parts) == {"shared weights", "routed experts", "cache", "state"}
    assert sum(parts.values()) == pytest.approx(step.bytes_per_step, rel=1e-12)
    assert parts["cache"] == kv_cache_bytes(s, n_ctx)                  # the latent, whole
    assert s.kda_n_head % tp == 0
    assert parts["state"] == pytest.approx(2 * state_bytes(s) / tp, rel=1e-12)
    always = weights_read_per_step(s, 1) - s.n_moe_layers * s.top_k * s.expert_params
    assert parts["shared weights"] == pytest.approx(always * 2 / tp, rel=1e-12)
    busiest = expected_busiest_experts(s, 1, plan.n_devices)
    assert parts["routed experts"] == pytest.approx(
        s.n_moe_layers * busiest * s.expert_params * 2, rel=1e-12)
    # the roofline of a plain call carries no breakdown
    assert roofline(s, n_ctx, 1).bytes_by_part is None


# --- the accounting's front doors: flags are bools, numbers are finite ------------------------
_NOT_BOOLS = ["no", "", 0, 1, None, float("nan"), float("inf")]


@pytest.mark.parametrize("flag", ["router_bias", "include_vision"])
@pytest.mark.parametrize("value", _NOT_BOOLS)
def test_stored_elements_and_checkpoint_bytes_take_their_flags_as_bools(flag, value):
    """``include_vision="no"`` once counted the vision tower it was asked to leave out (a
    non-empty string is truthy): every flag is checked as a bool, and the error names it."""
    from gpt2k3.accounting import checkpoint_bytes, stored_elements
    from gpt2k3.archs import KIMI_K3
    for fn in (stored_elements, checkpoint_bytes):
        with pytest.raises(ValueError, match=flag):
            fn(KIMI_K3, **{flag: value})
    # the real bools still do what they say
    with_tower = stored_elements(KIMI_K3, include_vision=True)
    without = stored_elements(KIMI_K3, include_vision=False)
    assert with_tower["vision tower"] > 0 and without["vision tower"] == 0


@pytest.mark.parametrize("fn, arg", [
    ("flops_per_token", "mla_absorbed"), ("roofline", "mla_absorbed"),
    ("roofline_band", "mla_absorbed"), ("latent_moe_break_even", "stored")])
def test_every_accounting_flag_rejects_a_string(fn, arg):
    from gpt2k3 import accounting
    from gpt2k3.accounting import k3_mechanisms
    from gpt2k3.archs import KIMI_K3
    args = {"flops_per_token": (KIMI_K3, 4096), "roofline": (KIMI_K3, 4096),
            "roofline_band": (KIMI_K3, 4096), "latent_moe_break_even": (KIMI_K3,)}[fn]
    with pytest.raises(ValueError, match=arg):
        (getattr(accounting, fn, None) or getattr(k3_mechanisms, fn))(*args, **{arg: "no"})


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("call, arg", [
    (lambda a, s, v: a.decode_bytes(s, 4096, weight_bytes=v), "weight_bytes"),
    (lambda a, s, v: a.kv_cache_bytes(s, 4096, dtype_bytes=v), "dtype_bytes"),
    (lambda a, s, v: a.checkpoint_bytes(s, other_bytes=v), "other_bytes"),
    (lambda a, s, v: a.roofline(s, 4096, weight_bytes=v), "weight_bytes"),
    (lambda a, s, v: a.training.training_flops(v, 1e9), "n_params"),
    (lambda a, s, v: a.training.training_flops(1e9, v), "tokens"),
    (lambda a, s, v: a.H200.with_(bandwidth=v), "bandwidth"),
])
def test_accounting_numbers_reject_nan_and_inf_by_name(call, arg, value):
    from gpt2k3 import accounting
    import gpt2k3.accounting.training  # noqa: F401  (a.training below)
    from gpt2k3.archs import KIMI_K3
    with pytest.raises(ValueError, match=arg):
        call(accounting, KIMI_K3, value)


@pytest.mark.parametrize("field_name", ["name", "source"])
def test_spec_and_hardware_names_are_strings(field_name):
    from gpt2k3.accounting import H200
    from gpt2k3.archs import KIMI_K3
    for obj in (KIMI_K3, H200):
        with pytest.raises(ValueError, match=field_name):
            obj.with_(**{field_name: float("nan")})

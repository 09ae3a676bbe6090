"""Multi-head latent attention: decode paths agree with the training form, cache accounting,
input validation, and an oracle check against Hugging Face's DeepseekV3Attention."""

import dataclasses

import pytest
import torch

from gpt2k3.mixers.mla import (
    MLA,
    LatentCache,
    MLAConfig,
    apply_rope,
    latent_numbers_per_token,
    mha_equivalent_numbers_per_token,
)

SMALL = dict(d_model=32, n_heads=4, q_lora_rank=12, kv_lora_rank=10, qk_nope_head_dim=6,
             qk_rope_head_dim=4, v_head_dim=5, rope_theta=10000.0, max_len=16)


def make(seed=0, dtype=torch.float64, **overrides):
    torch.manual_seed(seed)
    cfg = MLAConfig(**{**SMALL, **overrides})
    model = MLA(cfg).to(dtype)
    with torch.no_grad():  # non-trivial norm gains so the RMSNorm weights are exercised
        for name, p in model.named_parameters():
            if "layernorm" in name:
                p.copy_(1 + 0.3 * torch.randn_like(p))
    return model


VARIANTS = [
    dict(),
    dict(q_lora_rank=None),
    dict(rope_interleave=False),
    dict(n_heads=1, kv_lora_rank=3, qk_rope_head_dim=2, v_head_dim=7),
]


@pytest.mark.parametrize("overrides", VARIANTS)
def test_prefill_and_both_decodes_match_forward(overrides):
    model = make(**overrides)
    B, T, T0 = 2, 9, 4
    x = torch.randn(B, T, model.cfg.d_model, dtype=torch.float64)
    with torch.no_grad():
        ref = model(x)
        naive, absorbed = model.new_cache(B), model.new_cache(B)
        torch.testing.assert_close(model.prefill(x[:, :T0], naive), ref[:, :T0], rtol=0, atol=1e-12)
        model.prefill(x[:, :T0], absorbed)
        for t in range(T0, T):
            y_naive = model.decode_naive(x[:, t], naive)
            y_abs = model.decode_absorbed(x[:, t], absorbed)
            assert y_naive.shape == (B, model.cfg.d_model)
            torch.testing.assert_close(y_naive, ref[:, t], rtol=0, atol=1e-12)
            torch.testing.assert_close(y_abs, ref[:, t], rtol=0, atol=1e-12)
    assert naive.length == absorbed.length == T
    torch.testing.assert_close(naive.c_kv, absorbed.c_kv, rtol=0, atol=0)
    torch.testing.assert_close(naive.k_rope, absorbed.k_rope, rtol=0, atol=0)


def test_float32_decode_agrees_to_rounding():
    model = make(dtype=torch.float32)
    x = torch.randn(3, 8, model.cfg.d_model)
    with torch.no_grad():
        ref = model(x)
        cache = model.new_cache(3)
        model.prefill(x[:, :1], cache)
        for t in range(1, 8):
            torch.testing.assert_close(model.decode_absorbed(x[:, t], cache), ref[:, t], rtol=1e-5, atol=1e-5)


def test_chunked_prefill_and_multi_token_absorbed_decode():
    model = make()
    x = torch.randn(2, 11, model.cfg.d_model, dtype=torch.float64)
    with torch.no_grad():
        ref = model(x)
        cache = model.new_cache(2)
        parts = [model.prefill(x[:, :3], cache), model.prefill(x[:, 3:7], cache),
                 model.decode_absorbed(x[:, 7:11], cache)]
    torch.testing.assert_close(torch.cat(parts, dim=1), ref, rtol=0, atol=1e-12)


def test_forward_is_causal():
    model = make()
    x = torch.randn(1, 8, model.cfg.d_model, dtype=torch.float64)
    x2 = x.clone()
    x2[:, 5:] = torch.randn_like(x2[:, 5:])
    with torch.no_grad():
        torch.testing.assert_close(model(x)[:, :5], model(x2)[:, :5], rtol=0, atol=0)


def test_absorbed_decode_never_decompresses_the_cache():
    """decode_absorbed reads kv_b_proj's weight but never runs it on cached latents."""
    model = make()
    calls = []
    model.kv_b_proj.register_forward_hook(lambda *a: calls.append(1))
    x = torch.randn(2, 5, model.cfg.d_model, dtype=torch.float64)
    with torch.no_grad():
        cache = model.new_cache(2)
        for t in range(5):
            model.decode_absorbed(x[:, t], cache)
    assert calls == []


def test_rope_is_a_relative_rotation():
    """RoPE preserves norms and makes q.k depend on positions only through their difference."""
    q, k = torch.randn(2, 8, dtype=torch.float64)
    for interleave in (True, False):
        def rot(v, p):
            return apply_rope(v[None], torch.tensor([p]), 100.0, interleave)[0]
        torch.testing.assert_close(rot(q, 7).norm(), q.norm())
        torch.testing.assert_close(rot(q, 9) @ rot(k, 4), rot(q, 105) @ rot(k, 100))


def test_cache_numbers_and_bytes():
    model = make(dtype=torch.float32)
    cache = model.new_cache(batch_size=3, max_len=16)
    cfg = model.cfg
    assert cache.numbers_per_token == cfg.kv_lora_rank + cfg.qk_rope_head_dim == latent_numbers_per_token(cfg)
    assert cache.nbytes == 3 * 16 * (cfg.kv_lora_rank + cfg.qk_rope_head_dim) * 4
    assert cache.c_kv.shape == (3, 16, cfg.kv_lora_rank) and cache.k_rope.shape == (3, 16, cfg.qk_rope_head_dim)
    assert LatentCache(1, 10, 8, 2, dtype=torch.bfloat16).nbytes == 10 * 10 * 2


def test_published_cache_sizes():
    v3 = MLAConfig.deepseek_v3()
    assert latent_numbers_per_token(v3) == 576
    assert mha_equivalent_numbers_per_token(v3) == 128 * (192 + 128) == 40_960
    k2 = MLAConfig.kimi_k2()
    assert latent_numbers_per_token(k2) == 576
    assert mha_equivalent_numbers_per_token(k2) == 64 * 320


@pytest.mark.parametrize("field, value", [
    ("qk_rope_head_dim", 5), ("qk_rope_head_dim", 0), ("kv_lora_rank", 0), ("kv_lora_rank", -4),
    ("q_lora_rank", 0), ("n_heads", 0), ("d_model", -1), ("v_head_dim", 0), ("qk_nope_head_dim", 0),
    ("max_len", 0), ("rope_theta", 0.0), ("n_heads", 2.0), ("norm_eps", 0.0),
])
def test_config_rejects_bad_values(field, value):
    with pytest.raises(ValueError, match=field):
        MLAConfig(**{**SMALL, field: value})


def test_writing_past_max_len_raises():
    model = make()
    x = torch.randn(1, 5, model.cfg.d_model, dtype=torch.float64)
    cache = model.new_cache(1, max_len=4)
    with pytest.raises(ValueError, match="max_len"):
        model.prefill(x, cache)
    assert cache.length == 0
    with torch.no_grad():
        model.prefill(x[:, :3], cache)
        model.decode_naive(x[:, 3], cache)
    for decode in (model.decode_naive, model.decode_absorbed):
        with pytest.raises(ValueError, match="max_len"):
            decode(x[:, 4], cache)
    assert cache.length == 4
    with pytest.raises(ValueError, match="max_len"):
        cache.append(torch.zeros(1, 1, model.cfg.kv_lora_rank), torch.zeros(1, 1, model.cfg.qk_rope_head_dim))


def test_bad_shapes_raise():
    model = make()
    with pytest.raises(ValueError, match="d_model"):
        model(torch.randn(1, 3, model.cfg.d_model + 1, dtype=torch.float64))
    with pytest.raises(ValueError, match="batch"):
        model.decode_absorbed(torch.randn(2, model.cfg.d_model, dtype=torch.float64), model.new_cache(1))
    cache = LatentCache(2, 4, 3, 2)
    with pytest.raises(ValueError, match="c_kv"):
        cache.append(torch.zeros(2, 1, 4), torch.zeros(2, 1, 2))
    with pytest.raises(ValueError, match="k_rope"):
        cache.append(torch.zeros(2, 1, 3), torch.zeros(2, 2, 2))
    with pytest.raises(ValueError, match="max_len"):
        LatentCache(1, 0, 3, 2)


# ----------------------------------------------------------------------------- oracle
@pytest.mark.parametrize("q_lora_rank", [32, None])
@pytest.mark.parametrize("rope_interleave", [True, False])
def test_matches_transformers_deepseek_v3_attention(q_lora_rank, rope_interleave):
    transformers = pytest.importorskip("transformers")
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import (
        DeepseekV3Attention,
        DeepseekV3RotaryEmbedding,
    )

    torch.manual_seed(0)
    hf_cfg = transformers.DeepseekV3Config(
        hidden_size=64, num_attention_heads=4, num_key_value_heads=4, q_lora_rank=q_lora_rank,
        kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8,
        rope_parameters={"rope_type": "default", "rope_theta": 500.0},  # no YaRN, so no mscale
        rope_interleave=rope_interleave, attention_bias=False, max_position_embeddings=64,
    )
    hf_cfg._attn_implementation = "eager"
    hf_attn = DeepseekV3Attention(hf_cfg, layer_idx=0).eval()

    cfg = MLAConfig(d_model=64, n_heads=4, q_lora_rank=q_lora_rank, kv_lora_rank=16, qk_nope_head_dim=8,
                    qk_rope_head_dim=4, v_head_dim=8, rope_theta=500.0, max_len=64,
                    rope_interleave=rope_interleave)
    ours = make(seed=1, dtype=torch.float32, **dataclasses.asdict(cfg))
    hf_attn.load_state_dict(ours.state_dict(), strict=True)

    B, T = 2, 12
    x = torch.randn(B, T, 64)
    pos = torch.arange(T)[None].expand(B, T)
    cos_sin = DeepseekV3RotaryEmbedding(hf_cfg)(x, pos)
    mask = torch.full((T, T), float("-inf")).triu(1)[None, None].expand(B, 1, T, T)
    with torch.no_grad():
        expected, _ = hf_attn(x, position_embeddings=cos_sin, attention_mask=mask)
        got = ours(x)
        cache = ours.new_cache(B)
        ours.prefill(x[:, :T - 3], cache)
        tail = torch.stack([ours.decode_absorbed(x[:, t], cache) for t in range(T - 3, T)], dim=1)
    assert (got - expected).abs().max().item() < 1e-5
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(tail, expected[:, T - 3:], rtol=1e-5, atol=1e-5)

"""Multi-head latent attention: decode paths agree with the training form, cache accounting,
input validation, MLA as a token mixer of the one decoder (with an MoE channel mixer), and an
oracle check against Hugging Face's DeepseekV3Attention."""

import dataclasses

import pytest
import torch

from gpt2k3.cache import LayerCache, ModelCache
from gpt2k3.model import GPT, generate
from gpt2k3.config import GPTConfig
from gpt2k3.cache import KVCache
from gpt2k3.layers.mla import (MLA, LatentCache, MLAConfig, apply_rope, latent_numbers_per_token,
    mha_equivalent_numbers_per_token)

SMALL = dict(n_embd=32, n_heads=4, q_lora_rank=12, kv_lora_rank=10, qk_nope_head_dim=6,
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
    x = torch.randn(B, T, model.cfg.n_embd, dtype=torch.float64)
    with torch.no_grad():
        ref = model(x)
        naive, absorbed = model.new_cache(B), model.new_cache(B)
        torch.testing.assert_close(model.prefill(x[:, :T0], naive), ref[:, :T0], rtol=0, atol=1e-12)
        model.prefill(x[:, :T0], absorbed)
        for t in range(T0, T):
            y_naive = model.extend(x[:, t], naive)
            y_abs = model.decode_absorbed(x[:, t], absorbed)
            assert y_naive.shape == (B, model.cfg.n_embd)
            torch.testing.assert_close(y_naive, ref[:, t], rtol=0, atol=1e-12)
            torch.testing.assert_close(y_abs, ref[:, t], rtol=0, atol=1e-12)
    assert naive.length == absorbed.length == T
    torch.testing.assert_close(naive.c_kv, absorbed.c_kv, rtol=0, atol=0)
    torch.testing.assert_close(naive.k_rope, absorbed.k_rope, rtol=0, atol=0)


def test_float32_decode_agrees_to_rounding():
    model = make(dtype=torch.float32)
    x = torch.randn(3, 8, model.cfg.n_embd)
    with torch.no_grad():
        ref = model(x)
        cache = model.new_cache(3)
        model.prefill(x[:, :1], cache)
        for t in range(1, 8):
            torch.testing.assert_close(model.decode_absorbed(x[:, t], cache), ref[:, t], rtol=1e-5, atol=1e-5)


def test_chunked_prefill_and_multi_token_absorbed_decode():
    model = make()
    x = torch.randn(2, 11, model.cfg.n_embd, dtype=torch.float64)
    with torch.no_grad():
        ref = model(x)
        cache = model.new_cache(2)
        parts = [model.prefill(x[:, :3], cache), model.prefill(x[:, 3:7], cache),
                 model.decode_absorbed(x[:, 7:11], cache)]
    torch.testing.assert_close(torch.cat(parts, dim=1), ref, rtol=0, atol=1e-12)


def test_forward_is_causal():
    model = make()
    x = torch.randn(1, 8, model.cfg.n_embd, dtype=torch.float64)
    x2 = x.clone()
    x2[:, 5:] = torch.randn_like(x2[:, 5:])
    with torch.no_grad():
        torch.testing.assert_close(model(x)[:, :5], model(x2)[:, :5], rtol=0, atol=0)


def test_absorbed_decode_never_decompresses_the_cache():
    """decode_absorbed reads kv_b_proj's weight but never runs it on cached latents."""
    model = make()
    calls = []
    model.kv_b_proj.register_forward_hook(lambda *a: calls.append(1))
    x = torch.randn(2, 5, model.cfg.n_embd, dtype=torch.float64)
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
    ("q_lora_rank", 0), ("n_heads", 0), ("n_embd", -1), ("v_head_dim", 0), ("qk_nope_head_dim", 0),
    ("max_len", 0), ("rope_theta", 0.0), ("n_heads", 2.0), ("norm_eps", 0.0),
])
def test_config_rejects_bad_values(field, value):
    with pytest.raises(ValueError, match=field):
        MLAConfig(**{**SMALL, field: value})


def test_writing_past_max_len_raises():
    model = make()
    x = torch.randn(1, 5, model.cfg.n_embd, dtype=torch.float64)
    cache = model.new_cache(1, max_len=4)
    with pytest.raises(ValueError, match="max_len"):
        model.prefill(x, cache)
    assert cache.length == 0
    with torch.no_grad():
        model.prefill(x[:, :3], cache)
        model.extend(x[:, 3], cache)
    for decode in (model.extend, model.decode_absorbed):
        with pytest.raises(ValueError, match="max_len"):
            decode(x[:, 4], cache)
    assert cache.length == 4
    with pytest.raises(ValueError, match="max_len"):
        cache.extend(torch.zeros(1, 1, model.cfg.kv_lora_rank), torch.zeros(1, 1, model.cfg.qk_rope_head_dim))
    with pytest.raises(ValueError, match="max_len"):  # the forward with a cache refuses it too
        model(x[:, 4:5], cache=cache)
    assert cache.length == 4


def test_bad_shapes_raise():
    model = make()
    with pytest.raises(ValueError, match="n_embd"):
        model(torch.randn(1, 3, model.cfg.n_embd + 1, dtype=torch.float64))
    with pytest.raises(ValueError, match="batch"):
        model.decode_absorbed(torch.randn(2, model.cfg.n_embd, dtype=torch.float64), model.new_cache(1))
    cache = LatentCache(2, 4, 3, 2)
    with pytest.raises(ValueError, match="c_kv"):
        cache.extend(torch.zeros(2, 1, 4), torch.zeros(2, 1, 2))
    with pytest.raises(ValueError, match="k_rope"):
        cache.extend(torch.zeros(2, 1, 3), torch.zeros(2, 2, 2))
    assert cache.length == 0  # refused writes move nothing
    with pytest.raises(ValueError, match="max_len"):
        LatentCache(1, 0, 3, 2)
    with pytest.raises(ValueError, match="cache must be a LatentCache"):
        model(torch.randn(1, 1, model.cfg.n_embd, dtype=torch.float64),
              cache=KVCache(1, model.cfg.n_heads, 4, model.cfg.v_head_dim, dtype=torch.float64))


# ----------------------------------------------------------------------------- the cache protocol
def test_latent_cache_speaks_the_layer_cache_protocol():
    cache = LatentCache(2, 8, 3, 2)
    assert isinstance(cache, LayerCache) and cache.length == 0 and cache.max_len == 8
    assert cache.used_nbytes == 0 and cache.nbytes == 2 * 8 * 5 * 4
    c_kv, k_rope = torch.randn(2, 3, 3), torch.randn(2, 3, 2)
    filled = cache.extend(c_kv, k_rope)  # writes, moves the length, returns the filled part
    assert cache.length == 3 and cache.used_nbytes == cache.nbytes * 3 // 8
    torch.testing.assert_close(filled[0], c_kv, rtol=0, atol=0)
    torch.testing.assert_close(filled[1], k_rope, rtol=0, atol=0)
    c2, r2 = cache.extend(c_kv[:, :1], k_rope[:, :1])
    assert c2.shape == (2, 4, 3) and r2.shape == (2, 4, 2)
    cache.check_room(4)
    with pytest.raises(ValueError, match="LatentCache overflow"):
        cache.check_room(5)
    cache.reset()
    assert cache.length == 0 and cache.used_nbytes == 0 and cache.nbytes == 2 * 8 * 5 * 4


@pytest.mark.parametrize("absorb", [True, False])
def test_forward_with_a_cache_continues_the_sequence(absorb):
    """``forward(x, cache)``: chunks and single tokens continue the cached sequence and equal
    the training form; one token goes through the absorbed form when ``absorb`` is set."""
    model = make()
    model.absorb = absorb
    x = torch.randn(2, 10, model.cfg.n_embd, dtype=torch.float64)
    paths = []
    model.decode_absorbed = (lambda f: lambda *a: paths.append("absorbed") or f(*a))(model.decode_absorbed)
    model.extend = (lambda f: lambda *a: paths.append("naive") or f(*a))(model.extend)
    with torch.no_grad():
        ref = model(x)
        cache = model.new_cache(2, 10)
        parts = [model(x[:, :4], cache=cache), model(x[:, 4:6], cache=cache)]
        parts += [model(x[:, t:t + 1], cache=cache) for t in range(6, 10)]
    torch.testing.assert_close(torch.cat(parts, dim=1), ref, rtol=0, atol=1e-12)
    assert cache.length == 10
    assert paths == ["naive", "naive"] + ["absorbed" if absorb else "naive"] * 4


def test_new_cache_sizes_dtype_and_default_length():
    model = make(dtype=torch.float32)
    default = model.new_cache(2)
    assert default.max_len == model.cfg.max_len and default.c_kv.dtype == torch.float32
    wide = model.new_cache(1, 5, dtype=torch.float64)
    assert wide.max_len == 5 and wide.c_kv.dtype == wide.k_rope.dtype == torch.float64
    with pytest.raises(TypeError):
        model.new_cache(1, 5, torch.float64)  # dtype and device are keyword-only


# ----------------------------------------------------------------------------- MLA in the decoder
GPT_CFG = GPTConfig(block_size=24, vocab_size=53, n_layer=3, n_head=4, n_embd=32)


def mla_moe_gpt(seed=0):
    """The one decoder with MLA as every block's token mixer and an MoE as its channel mixer."""
    from gpt2k3.layers.moe import MoE, MoEConfig

    torch.manual_seed(seed)
    mla = MLAConfig(**{**SMALL, "max_len": GPT_CFG.block_size})
    moe = MoEConfig(n_embd=GPT_CFG.n_embd, n_routed_experts=4, n_shared_experts=1, top_k=2,
                    d_expert=8)
    return GPT(GPT_CFG, mixer=lambda c, i: MLA(mla), mlp=lambda c, i: MoE(moe)).double().eval()


def test_mla_and_moe_in_the_decoder_decode_token_identically():
    from gpt2k3.layers.moe import MoE

    model = mla_moe_gpt()
    assert all(isinstance(b.attn, MLA) and isinstance(b.mlp, MoE) for b in model.transformer.h)
    idx = torch.randint(0, GPT_CFG.vocab_size, (2, 6), generator=torch.Generator().manual_seed(1))
    ref = generate(model, idx, 14, use_cache=False, temperature=0)
    assert torch.equal(generate(model, idx, 14, temperature=0), ref)  # model.new_cache, absorbed
    cache = model.new_cache(2, 20)
    assert isinstance(cache, ModelCache) and cache.kinds == ("LatentCache",) * 3
    assert torch.equal(generate(model, idx, 14, temperature=0, cache=cache), ref)
    assert cache.length == 19
    per_token = 2 * (SMALL["kv_lora_rank"] + SMALL["qk_rope_head_dim"]) * 8  # batch x numbers x fp64
    assert cache.used_nbytes == 3 * per_token * 19
    for block in model.transformer.h:  # the expanded decode gives the same tokens
        block.attn.absorb = False
    assert torch.equal(generate(model, idx, 14, temperature=0), ref)


def test_mla_and_moe_in_the_decoder_cached_logits_equal_the_full_forward():
    model = mla_moe_gpt(seed=2)
    idx = torch.randint(0, GPT_CFG.vocab_size, (2, 16), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        full = model(idx)
        cache = model.new_cache(2, 16)
        pieces = [model(idx[:, :5], cache=cache)] + [model(idx[:, t:t + 1], cache=cache)
                                                      for t in range(5, 16)]
        torch.testing.assert_close(torch.cat(pieces, dim=1), full, rtol=1e-10, atol=1e-10)
        with pytest.raises(ValueError, match="overflow|block_size"):
            model(idx[:, :1], cache=cache)
    assert cache.length == 16


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

    cfg = MLAConfig(n_embd=64, n_heads=4, q_lora_rank=q_lora_rank, kv_lora_rank=16, qk_nope_head_dim=8,
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


# ----------------------------------------------------------------------------- chapter 7
from gpt2k3.accounting import ArchSpec, count_params, kv_cache_bytes, kv_numbers_per_layer  # noqa: E402
from gpt2k3.archs import DEEPSEEK_V3, KIMI_K2, KIMI_LINEAR_48B  # noqa: E402
from gpt2k3.layers.mla import compare_decodes  # noqa: E402


@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-12), (torch.float32, 1e-5)])
def test_compare_decodes_reports_agreement(dtype, tol):
    model = make(dtype=dtype)
    x = torch.randn(2, 12, model.cfg.n_embd, dtype=dtype)
    diffs = compare_decodes(model, x, n_prefill=3)
    assert set(diffs) == {"naive_vs_absorbed", "naive_vs_forward", "absorbed_vs_forward", "scale"}
    assert diffs["scale"] > 0.01
    for key in ("naive_vs_absorbed", "naive_vs_forward", "absorbed_vs_forward"):
        assert 0 <= diffs[key] < tol * diffs["scale"]


def test_compare_decodes_sees_a_broken_absorption():
    model = make()
    x = torch.randn(1, 6, model.cfg.n_embd, dtype=torch.float64)
    original = model.up_weights
    model.up_weights = lambda: tuple(w * 1.1 for w in original())  # corrupt only the absorbed path
    assert compare_decodes(model, x)["naive_vs_absorbed"] > 1e-3


def test_compare_decodes_validates():
    model = make()
    x = torch.randn(1, 4, model.cfg.n_embd, dtype=torch.float64)
    for bad in (0, 4, 1.0):
        with pytest.raises(ValueError, match="n_prefill"):
            compare_decodes(model, x, n_prefill=bad)


@pytest.mark.parametrize("spec, published", [(DEEPSEEK_V3, MLAConfig.deepseek_v3()),
                                             (KIMI_K2, MLAConfig.kimi_k2())],
                         ids=["DeepSeek-V3", "Kimi K2"])
def test_published_configs_agree_with_the_specs(spec, published):
    from_spec = MLAConfig.from_spec(spec, rope_theta=published.rope_theta)
    assert from_spec == published
    assert latent_numbers_per_token(from_spec) == kv_numbers_per_layer(spec)


def test_from_spec_and_layer_count_agree_with_the_accounting():
    spec = ArchSpec(name="small mla", vocab_size=50, n_layer=3, n_embd=32, n_head=4, bias=False,
                    norm="rmsnorm", mlp="swiglu", position="rope", attention="mla",
                    **{k: SMALL[k] for k in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
                                             "qk_rope_head_dim", "v_head_dim")})
    for q_lora_rank in (SMALL["q_lora_rank"], None):
        s = spec.with_(q_lora_rank=q_lora_rank)
        layer = MLA(MLAConfig.from_spec(s))
        n = sum(p.numel() for p in layer.parameters())
        assert count_params(s).detail["softmax attention"] == s.n_layer * n
    assert MLAConfig.from_spec(KIMI_LINEAR_48B).q_lora_rank is None
    with pytest.raises(ValueError, match="mla"):
        MLAConfig.from_spec(spec.with_(attention="mha"))


def test_mla_cache_variants_and_figure():
    from gpt2k3.book.figures import mla_cache, mla_cache_variants

    v = mla_cache_variants(DEEPSEEK_V3)
    assert list(v.values()) == [576, 40_960, 2 * 8 * 128]
    fig = mla_cache(batches=(1, 8), max_context=1 << 14, active=1)
    (slider,) = fig.layout.sliders
    assert [s.label for s in slider.steps] == ["1", "8"]
    ctx = [1024, 2048, 4096, 8192, 16384]
    for step, b in zip(slider.steps, (1, 8)):
        data, layout, traces = step.args
        assert list(traces) == [0, 1, 2]
        assert data["x"][0] == ctx
        latent = [kv_cache_bytes(DEEPSEEK_V3, n, batch=b) / 1e9 for n in ctx]
        assert data["y"][0] == pytest.approx(latent, rel=1e-5)
        assert data["y"][1] == pytest.approx([y * 40_960 / 576 for y in latent], rel=1e-5)
        assert f"batch {b}" in layout["title.text"] and "71× more" in layout["title.text"]
    assert list(fig.data[0].y) == slider.steps[1].args[0]["y"][0]  # opens on batch 8
    assert fig.layout.xaxis.type == fig.layout.yaxis.type == "log"
    assert "GB" in fig.layout.yaxis.title.text and "tokens" in fig.layout.xaxis.title.text
    with pytest.raises(ValueError, match="mla"):
        mla_cache_variants(DEEPSEEK_V3.with_(attention="mha"))
    with pytest.raises(ValueError, match="batches"):
        mla_cache(batches=(0,))
    with pytest.raises(ValueError, match="max_context"):
        mla_cache(max_context=10)


@pytest.mark.parametrize("call, match", [
    (lambda x, p: apply_rope(x[..., :5], p, 100.0, True), "d even"),
    (lambda x, p: apply_rope(x, p, 100.0, "no"), "interleave"),
    (lambda x, p: apply_rope(x, p, 100.0, 0), "interleave"),
    (lambda x, p: apply_rope(x, p[:-1], 100.0, True), "positions"),
    (lambda x, p: apply_rope(x, p, float("nan"), True), "theta"),
    (lambda x, p: apply_rope(x.long(), p, 100.0, True), "float"),
])
def test_apply_rope_front_door(call, match):
    """An odd head size used to return a wider tensor, and interleave='no' to interleave."""
    x, p = torch.randn(2, 3, 6, dtype=torch.float64), torch.arange(3)
    with pytest.raises(ValueError, match=match):
        call(x, p)

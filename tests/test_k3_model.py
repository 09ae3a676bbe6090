"""What Kimi K3 adds, as modules (``gpt2k3.models.k3``): each mechanism against its definition or an
independent implementation, and a tiny K3 built on GPT-2's core that trains, decodes through its
cache token-identically, and is counted to the parameter by ``count_params``."""

from __future__ import annotations

import ast
import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from gpt2k3.accounting import count_params, kda_log_decay
from gpt2k3.archs import KIMI_K3
from gpt2k3.model import GPT, generate
from gpt2k3.config import GPTConfig
from gpt2k3.cache import ModelCache
from gpt2k3.archs import KIMI_K3_CONFIG
from gpt2k3.layers.residual import K3_RMS_NORM_EPS, AttnResidual, DepthMix
from gpt2k3.models.k3 import SITU_BETA, SITU_LINEAR_BETA, k3_model, tiny_k3
from gpt2k3.accounting import hybrid_layers
from gpt2k3.layers.deltanet import BoundedKDA, bounded_log_decay
from gpt2k3.layers.moe import LatentMoE, LatentMoEConfig
from gpt2k3.ops.depth import depth_mix, depth_mix_reference
from gpt2k3.layers.mlp import situ, situ_reference
from gpt2k3.layers.norms import GatedRMSNorm
from gpt2k3.cache import StateCache
from gpt2k3.layers.deltanet import DeltaState
from gpt2k3.layers.mla import MLA, LatentCache, MLAConfig
from gpt2k3.layers.norms import RMSNorm

CFG = GPTConfig(block_size=64, vocab_size=97, n_layer=5, n_head=2, n_embd=32)


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ============================================================================ 1. bounded decay
def _fla_bounded_gate():
    """fla-core's ``naive_kda_lowerbound_gate`` (``fla/ops/kda/gate.py``), taken out of the file's
    source by name because the file imports triton at the top (as in test_k3_published.py)."""
    from fla_oracle import fla_package_dir

    path = fla_package_dir() / "ops" / "kda" / "gate.py"
    if not path.is_file():
        raise FileNotFoundError(f"fla-core is installed but has no {path}")
    funcs = [n for n in ast.parse(path.read_text()).body
             if isinstance(n, ast.FunctionDef) and n.name == "naive_kda_lowerbound_gate"]
    assert len(funcs) == 1, "fla's bounded gate reference moved"
    namespace = {"torch": torch, "F": F}
    exec(compile(ast.Module(body=funcs, type_ignores=[]), str(path), "exec"), namespace)
    return namespace["naive_kda_lowerbound_gate"]


def test_bounded_log_decay_matches_fla_core_and_the_scalar_definition():
    naive_bounded = _fla_bounded_gate()
    g = _gen(1)
    H, Dk = 3, 4
    x = torch.randn(2, 5, H, Dk, generator=g, dtype=torch.float64) * 6
    a_log = torch.randn(H, generator=g, dtype=torch.float64)
    dt_bias = torch.randn(H * Dk, generator=g, dtype=torch.float64)
    ours = bounded_log_decay(x, a_log, dt_bias, KIMI_K3.kda_gate_lower_bound)
    theirs = naive_bounded(x, a_log, dt_bias, lower_bound=-5.0, output_dtype=torch.float64)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)   # fla computes in float32
    scalar = torch.tensor([kda_log_decay(x[b, t, h, c].item(), a_log[h].item(),
                                         dt_bias[h * Dk + c].item(), -5.0)
                           for b in range(2) for t in range(5) for h in range(H)
                           for c in range(Dk)], dtype=torch.float64).view_as(x)
    torch.testing.assert_close(ours, scalar, rtol=1e-12, atol=1e-12)
    assert ours.dtype == torch.float64
    assert bounded_log_decay(x.float(), a_log.float(), dt_bias.float()).dtype == torch.float32


def test_bounded_log_decay_limits_and_bad_input():
    H, Dk = 1, 3
    x = torch.tensor([-1e4, 0.0, 1e4]).view(1, 1, H, Dk)
    g = bounded_log_decay(x, torch.zeros(H), torch.zeros(H * Dk), -5.0).flatten()
    assert g.tolist() == pytest.approx([0.0, -2.5, -5.0])   # never forgets / half / floor
    with pytest.raises(ValueError, match="lower_bound"):
        bounded_log_decay(x, torch.zeros(H), torch.zeros(H * Dk), 0.0)
    with pytest.raises(ValueError, match="A_log"):
        bounded_log_decay(x, torch.zeros(2), torch.zeros(H * Dk))
    with pytest.raises(ValueError, match="dt_bias"):
        bounded_log_decay(x, torch.zeros(H), torch.zeros(H))
    with pytest.raises(ValueError, match="x must"):
        bounded_log_decay(x[0], torch.zeros(H), torch.zeros(H * Dk))


def test_bounded_kda_layer_gate_range_full_rank_gate_and_cache():
    torch.manual_seed(0)
    layer = BoundedKDA(CFG, lower_bound=-2.0).double()
    H, Dk, d = layer.n_head, layer.head_k_dim, CFG.n_embd
    assert isinstance(layer.g_proj, torch.nn.Linear)
    assert tuple(layer.g_proj.weight.shape) == (H * layer.head_v_dim, d)   # full rank
    x = torch.randn(2, 9, d, generator=_gen(2), dtype=torch.float64)
    la = layer.log_alpha(x * 1e3)
    assert la.shape == (2, H, 9, Dk) and bool(((la >= -2.0) & (la <= 0)).all())
    full = layer(x)
    cache = layer.new_cache(2)
    assert isinstance(cache, StateCache)
    pieces = [layer(x[:, :4], cache=cache)] + [layer(x[:, i:i + 1], cache=cache)
                                               for i in range(4, 9)]
    torch.testing.assert_close(torch.cat(pieces, 1), full, rtol=1e-10, atol=1e-10)
    assert cache.length == 9 and isinstance(cache.state, DeltaState)
    with pytest.raises(ValueError, match="lower_bound"):
        BoundedKDA(CFG, lower_bound=1.0)


# ============================================================================ 2. gated NoPE MLA
def _mla(**kw) -> MLA:
    """K3's MLA: no rotation, an output gate (``MLAConfig(rope=False, output_gate=True)``)."""
    torch.manual_seed(3)
    cfg = MLAConfig(n_embd=32, n_heads=4, q_lora_rank=16, kv_lora_rank=12, qk_nope_head_dim=8,
                    qk_rope_head_dim=4, v_head_dim=8, max_len=32, rope=False, output_gate=True,
                    **kw)
    m = MLA(cfg).double()
    for p in m.parameters():                      # weights of a visible size
        torch.nn.init.normal_(p, std=0.3, generator=_gen(4)) if p.dim() > 1 else None
    return m


def test_gated_nope_mla_cached_decodes_equal_the_full_forward():
    m = _mla()
    x = torch.randn(2, 10, 32, generator=_gen(5), dtype=torch.float64)
    full = m(x)
    naive, absorbed = m.new_cache(2, 10), m.new_cache(2, 10)
    first = m.prefill(x[:, :3], naive)
    m.prefill(x[:, :3], absorbed)
    dn = torch.stack([m.extend(x[:, i], naive) for i in range(3, 10)], 1)
    da = torch.stack([m.decode_absorbed(x[:, i], absorbed) for i in range(3, 10)], 1)
    torch.testing.assert_close(first, full[:, :3], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(dn, full[:, 3:], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(da, full[:, 3:], rtol=1e-12, atol=1e-12)
    # MLA's forward(x, cache): the token-mixer form, absorbed or expanded for single tokens
    for absorb in (True, False):
        m.absorb = absorb
        cache = m.new_cache(2, 10)
        steps = [m(x[:, :3], cache=cache)] + [m(x[:, i:i + 1], cache=cache) for i in range(3, 10)]
        torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-12, atol=1e-12)
        assert cache.length == 10


def test_nope_mla_sees_no_positions_and_the_gate_is_a_sigmoid():
    m = _mla()
    x = torch.randn(1, 7, 32, generator=_gen(6), dtype=torch.float64)
    # no position anywhere: the last token's output depends on the *set* of earlier tokens
    perm = torch.tensor([4, 0, 5, 2, 1, 3, 6])
    torch.testing.assert_close(m(x)[:, -1], m(x[:, perm])[:, -1], rtol=1e-12, atol=1e-12)
    # with RoPE and no gate (DeepSeek's layer) it does not hold
    rope = MLA(dataclasses.replace(m.cfg, rope=True, output_gate=False)).double()
    rope.load_state_dict({k: v for k, v in m.state_dict().items() if not k.startswith("g_proj")})
    assert (rope(x)[:, -1] - rope(x[:, perm])[:, -1]).abs().max() > 1e-6
    # nor with the gate kept and only the rotation put back: NoPE is what makes it hold
    gated_rope = MLA(dataclasses.replace(m.cfg, rope=True)).double()
    gated_rope.load_state_dict(m.state_dict())
    assert (gated_rope(x)[:, -1] - gated_rope(x[:, perm])[:, -1]).abs().max() > 1e-6
    # at a single token there is nothing to rotate against: the two layers agree
    torch.testing.assert_close(gated_rope(x[:, :1]), m(x[:, :1]), rtol=1e-12, atol=1e-12)
    # gate: g_proj = 0 gives sigmoid(0) = 1/2 of the ungated attention output
    with torch.no_grad():
        m.g_proj.weight.zero_()
    ungated = MLA(dataclasses.replace(m.cfg, output_gate=False)).double()
    ungated.load_state_dict({k: v for k, v in m.state_dict().items() if not k.startswith("g_proj")})
    torch.testing.assert_close(m(x), 0.5 * ungated(x), rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="cfg"):
        MLA("not a config")
    with pytest.raises(ValueError, match="output_gate"):
        MLAConfig(**{**dataclasses.asdict(m.cfg), "output_gate": 1})


def test_gated_rope_control_decodes_and_shares_the_parameters():
    m = _mla()
    ctl = MLA(dataclasses.replace(m.cfg, rope=True)).double()
    ctl.load_state_dict(m.state_dict())
    assert [k for k, _ in ctl.named_parameters()] == [k for k, _ in m.named_parameters()]
    x = torch.randn(2, 10, 32, generator=_gen(15), dtype=torch.float64)
    full = ctl(x)
    for absorb in (True, False):
        ctl.absorb = absorb
        cache = ctl.new_cache(2, 10)
        steps = [ctl(x[:, :3], cache=cache)] + [ctl(x[:, i:i + 1], cache=cache)
                                                for i in range(3, 10)]
        torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-12, atol=1e-12)


# ============================================================================ 4. SiTU-GLU
def test_situ_formula_matches_sglang_forward_native_and_its_definition():
    g = _gen(7)
    gate = torch.randn(50, generator=g, dtype=torch.float64) * 20
    up = torch.randn(50, generator=g, dtype=torch.float64) * 60
    ours = situ(gate, up)
    # SGLang 0.5.23 SituAndMul.forward_native, on the concatenated [gate | up] input
    xcat = torch.cat([gate, up])[None]
    d = xcat.shape[-1] // 2
    sg_gate, sg_up = xcat[..., :d].float(), xcat[..., d:].float()
    sg_gate = 4.0 * torch.tanh(sg_gate / 4.0) * torch.sigmoid(sg_gate)
    sg_up = 25.0 * torch.tanh(sg_up / 25.0)
    torch.testing.assert_close(ours.float(), (sg_gate * sg_up)[0], rtol=1e-5, atol=1e-5)
    ref = torch.tensor([situ_reference(a, b) for a, b in zip(gate.tolist(), up.tolist())],
                       dtype=torch.float64)
    torch.testing.assert_close(ours, ref, rtol=1e-12, atol=1e-12)
    assert (SITU_BETA, SITU_LINEAR_BETA) == (4.0, 25.0)


def test_situ_limits():
    small = torch.tensor([1e-3, -2e-3, 5e-4], dtype=torch.float64)
    up = torch.tensor([5e-3, -1e-2, 2e-2], dtype=torch.float64)
    # near zero: SwiGLU's silu(gate) * up (relative error ~ (x / beta)^2 / 3)
    torch.testing.assert_close(situ(small, up), F.silu(small) * up, rtol=1e-6, atol=0)
    big = torch.tensor([1e4, -1e4, 1e4], dtype=torch.float64)
    huge_up = torch.tensor([1e6, 1e6, -1e6], dtype=torch.float64)
    # gate saturates at beta (large positive) and 0 (large negative); up clips at linear_beta
    torch.testing.assert_close(situ(big, huge_up), torch.tensor([100.0, 0.0, -100.0],
                                                                dtype=torch.float64))
    many = torch.randn(1000, generator=_gen(8), dtype=torch.float64) * 1e3
    assert situ(many, many.flip(0)).abs().max() <= 4.0 * 25.0
    # linear_beta=None leaves up unclipped (SGLang's default SituAndMul(linear_beta=None))
    torch.testing.assert_close(situ(big, huge_up, linear_beta=None), 4.0 * huge_up * (big > 0))
    assert situ(small.bfloat16(), up.bfloat16()).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="beta"):
        situ(small, up, beta=0.0)
    with pytest.raises(ValueError, match="linear_beta"):
        situ(small, up, linear_beta=-1.0)
    with pytest.raises(ValueError, match="gate and up"):
        situ(small, up[:2])


# ============================================================================ 3. latent MoE
def _moe_cfg(**kw) -> LatentMoEConfig:
    return LatentMoEConfig(**{**dict(n_embd=24, latent_dim=12, n_routed_experts=6,
                                     n_shared_experts=2, top_k=2, d_expert=10), **kw})


@pytest.mark.parametrize("kw", [{}, {"n_shared_experts": 0}, {"latent_norm": False},
                                {"routed_scaling_factor": 2.5}])
def test_latent_moe_batched_equals_loop_reference_in_float64(kw):
    torch.manual_seed(9)
    moe = LatentMoE(_moe_cfg(**kw)).double()
    x = torch.randn(3, 7, 24, generator=_gen(10), dtype=torch.float64)
    torch.testing.assert_close(moe(x), moe.forward_loop_reference(x), rtol=1e-12, atol=1e-12)


def test_latent_moe_normalises_the_routed_sum_before_the_up_projection():
    """SGLang ``KimiK3MoE``'s order: the experts read the raw ``x W_down``; the RMSNorm acts on
    their weighted sum in latent space, before the one up projection."""
    torch.manual_seed(16)
    moe = LatentMoE(_moe_cfg()).double()
    with torch.no_grad():
        moe.routed_expert_norm.weight.copy_(torch.rand(12, generator=_gen(17), dtype=torch.float64)
                                            + 0.5)
    x = torch.randn(2, 5, 24, generator=_gen(18), dtype=torch.float64)
    flat = x.reshape(-1, 24)
    with torch.no_grad():
        weights, indices = moe.gate(flat)
        z = flat @ moe.routed_expert_down_proj.weight.T               # no norm before experts
        routed = torch.stack([sum(w * moe.experts[e](z[n:n + 1])[0]
                                  for w, e in zip(weights[n], indices[n].tolist()))
                              for n in range(flat.shape[0])])
        ms = routed.pow(2).mean(-1, keepdim=True)
        normed = routed / torch.sqrt(ms + K3_RMS_NORM_EPS) * moe.routed_expert_norm.weight
        expected = normed @ moe.routed_expert_up_proj.weight.T + moe.shared_experts(flat)
        torch.testing.assert_close(moe(x).reshape(-1, 24), expected, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(moe.forward_loop_reference(x).reshape(-1, 24), expected,
                                   rtol=1e-12, atol=1e-12)
        # the norm before the experts (the order this module had once) is a different function
        wrong = torch.stack([sum(w * moe.experts[e](moe.routed_expert_norm(z[n:n + 1]))[0]
                                 for w, e in zip(weights[n], indices[n].tolist()))
                             for n in range(flat.shape[0])])
        wrong = wrong @ moe.routed_expert_up_proj.weight.T + moe.shared_experts(flat)
        assert (wrong - expected).abs().max() > 1e-3
        assert torch.equal(moe.down(flat), z) and torch.allclose(moe.up(routed), expected
                                                                 - moe.shared_experts(flat))


def test_latent_norm_makes_the_routed_scale_irrelevant():
    """RMSNorm divides out the routed sum's overall scale: ``routed_scaling_factor`` changes
    the output only through the norm's eps -- scaling by ``c`` with eps ``e`` is exactly no
    scaling with eps ``e / c**2`` -- and, without the norm, scales the routed output."""
    x = torch.randn(3, 4, 24, generator=_gen(19), dtype=torch.float64)

    def out(factor, norm=True, eps=K3_RMS_NORM_EPS):
        torch.manual_seed(20)
        moe = LatentMoE(_moe_cfg(routed_scaling_factor=factor, latent_norm=norm,
                                 norm_eps=eps)).double()
        with torch.no_grad():
            return moe(x)

    torch.testing.assert_close(out(2.5), out(1.0, eps=K3_RMS_NORM_EPS / 2.5 ** 2),
                               rtol=1e-12, atol=1e-12)
    assert (out(1.0, norm=False) - out(2.5, norm=False)).abs().max() > 1e-3
    # once the routed sum is far above eps the factor is invisible
    torch.testing.assert_close(out(2.5, eps=1e-12), out(1.0, eps=1e-12), rtol=1e-6, atol=1e-9)


def test_k3_norms_use_k3s_rms_norm_eps():
    assert K3_RMS_NORM_EPS == KIMI_K3_CONFIG["rms_norm_eps"][0] == 1e-5
    torch.manual_seed(0)
    model = tiny_k3(CFG)
    norms = [m for m in model.modules() if isinstance(m, (RMSNorm, GatedRMSNorm))]
    kinds = {type(m.mlp.routed_expert_norm).__name__ for m in model.transformer.h[1:]}
    assert kinds == {"RMSNorm"} and len(norms) > 2 * CFG.n_layer
    assert {m.eps for m in norms} == {K3_RMS_NORM_EPS}
    assert {m.norm.eps for m in model.modules() if isinstance(m, DepthMix)} == {K3_RMS_NORM_EPS}
    other = k3_model(CFG, model.spec, norm_eps=1e-6)
    assert {m.eps for m in other.modules() if isinstance(m, (RMSNorm, GatedRMSNorm))} == {1e-6}
    with pytest.raises(ValueError, match="norm_eps"):
        _moe_cfg(norm_eps=0.0)
    with pytest.raises(ValueError, match="eps"):
        DepthMix(8, eps=-1.0)


def test_latent_moe_shapes_count_and_bad_config():
    cfg = _moe_cfg()
    moe = LatentMoE(cfg)
    d, w, E, f = cfg.n_embd, cfg.latent_dim, cfg.n_routed_experts, cfg.d_expert
    assert sum(p.numel() for p in moe.parameters()) == (
        E * d + 2 * d * w + w + cfg.n_shared_experts * 3 * d * f + E * 3 * w * f)
    assert tuple(moe.experts[0].gate_proj.weight.shape) == (f, w)        # experts are latent
    assert tuple(moe.shared_experts.gate_proj.weight.shape) == (2 * f, d)  # shared full width
    assert moe.gate.cfg.score_func == "sigmoid"
    with pytest.raises(ValueError, match="latent_dim"):
        _moe_cfg(latent_dim=25)
    with pytest.raises(ValueError, match="top_k"):
        _moe_cfg(top_k=7)
    with pytest.raises(ValueError, match="x must"):
        moe(torch.zeros(2, 23))


# ======================================================================= 5. Attention Residuals
def test_depth_mix_equals_its_reference_and_behaves_as_a_softmax_over_depth():
    g = _gen(11)
    sources = [torch.randn(2, 5, 16, generator=g, dtype=torch.float64) * (i + 1)
               for i in range(4)]
    query = torch.randn(16, generator=g, dtype=torch.float64)
    weight = torch.rand(16, generator=g, dtype=torch.float64) + 0.5
    torch.testing.assert_close(depth_mix(sources, query, weight),
                               depth_mix_reference(sources, query, weight), rtol=1e-12, atol=1e-12)
    # one source: the read is that source; a zero query: the plain mean of the sources
    torch.testing.assert_close(depth_mix(sources[:1], query, weight), sources[0])
    torch.testing.assert_close(depth_mix(sources, torch.zeros(16, dtype=torch.float64), weight),
                               sum(sources) / 4)
    # a query aligned with one (normalised) source picks it out; the *raw* source comes back
    big = 1e3 * F.normalize(sources[2][0, 0], dim=0)
    torch.testing.assert_close(depth_mix([s[0, 0] for s in sources], big, torch.ones(16,
                               dtype=torch.float64)), sources[2][0, 0])
    mix = DepthMix(16).double()
    assert torch.allclose(mix.weights(sources), torch.full((4, 2, 5), 0.25, dtype=torch.float64))
    with pytest.raises(ValueError, match="sources"):
        depth_mix([], query, weight)
    with pytest.raises(ValueError, match="sources"):
        depth_mix([sources[0], sources[0][:, :2]], query, weight)


# ============================================================================ 6. the tiny K3
def test_k3_schedule_is_the_published_rule():
    """K3's rule (MLA every 4th layer and the last) is the book's one schedule at ratio 3."""
    assert hybrid_layers(93, 3) == KIMI_K3.kda_layers
    sched = KIMI_K3.layer_mixers
    assert [i + 1 for i, k in enumerate(sched) if k == "mla"] == list(range(4, 93, 4)) + [93]
    assert (sched.count("mla"), sched.count("kda")) == (24, 69)
    for n_layer, every, want in ((5, 4, ("kda", "kda", "kda", "mla", "mla")),
                                 (8, 4, ("kda",) * 3 + ("mla",) + ("kda",) * 3 + ("mla",)),
                                 (5, 2, ("kda", "mla", "kda", "mla", "mla"))):
        cfg = GPTConfig(block_size=16, vocab_size=16, n_layer=n_layer, n_head=2, n_embd=16)
        assert tiny_k3(cfg, full_attn_every=every).schedule == want
    with pytest.raises(ValueError, match="full_attn_every"):
        tiny_k3(GPTConfig(block_size=16, vocab_size=16, n_layer=2, n_head=2, n_embd=16),
                full_attn_every=0)


@pytest.mark.parametrize("kw", [
    {},                                                        # block size 2: 3 blocks
    {"attn_res_block_size": 0},                                # plain residual: GPT's Block
    {"attn_res_block_size": 12, "first_k_dense": 0, "q_lora_rank": None},
    {"kda_conv_kernel": 0, "moe_latent_norm": False, "n_shared_experts": 0, "kda_n_head": 4,
     "kda_head_dim": 6, "d_ff": 40},
])
def test_count_params_of_the_spec_equals_the_built_module(kw):
    torch.manual_seed(0)
    model = tiny_k3(CFG, **kw)
    assert type(model) is GPT  # the book's one decoder, not a subclass
    assert count_params(model.spec).total == sum(p.numel() for p in model.parameters())
    # nothing to drop: K3 has no position table (TinyK3 used to drop the token table here)
    assert model.num_params(non_embedding=True) == model.num_params() == count_params(model.spec).total
    assert model.config.position == "none" and model.config.tie_embeddings is False
    if model.spec.attn_res_block_size:
        assert isinstance(model.residual, AttnResidual)
        assert model.residual.block_size == model.spec.attn_res_block_size
    else:
        assert model.residual is None
    assert model.spec.k3_features    # the spec really uses K3's fields
    assert model.lm_head.weight is not model.transformer.wte.weight
    assert "wpe" not in model.transformer


def test_the_tiny_k3_default_size_and_parts():
    torch.manual_seed(0)
    model = tiny_k3(CFG)
    assert sum(p.numel() for p in model.parameters()) == 89_558
    assert model.schedule == ("kda", "kda", "kda", "mla", "mla")
    h = model.transformer.h
    assert [type(b.attn).__name__ for b in h] == ["BoundedKDA"] * 3 + ["MLA"] * 2
    assert [type(b.mlp).__name__ for b in h] == ["SituGLU"] + ["LatentMoE"] * 4
    logits = model(torch.randint(0, 97, (2, 11), generator=_gen(12)))
    assert logits.shape == (2, 11, 97) and bool(torch.isfinite(logits).all())


def test_attention_residual_sources_follow_sglangs_block_rule():
    """The number of sources each read mixes is SGLang's: ``cdiv(i, S) + 1`` before layer i's
    attention, ``i // S + 2`` before its FFN, ``cdiv(n_layer, S) + 1`` at the output."""
    torch.manual_seed(0)
    cfg = GPTConfig(block_size=16, vocab_size=31, n_layer=7, n_head=2, n_embd=16)
    for S in (1, 2, 3, 12):
        model = tiny_k3(cfg, attn_res_block_size=S, d_expert=8)
        seen = []
        hooks = [m.register_forward_pre_hook(lambda mod, args, name=name: seen.append(
            (name, len(args[0])))) for name, m in model.named_modules() if isinstance(m, DepthMix)]
        model(torch.zeros(1, 3, dtype=torch.long))
        for hk in hooks:
            hk.remove()
        expected = []
        for i in range(cfg.n_layer):  # the DepthMix reads live in the residual part
            expected += [(f"residual.attn_mix.{i}", -(-i // S) + 1),
                         (f"residual.mlp_mix.{i}", i // S + 2)]
        expected.append(("residual.final", -(-cfg.n_layer // S) + 1))
        assert seen == expected


def test_attention_residual_part_and_k3_model_validate():
    torch.manual_seed(0)
    model = tiny_k3(CFG)
    res = model.residual
    assert len(res.attn_mix) == len(res.mlp_mix) == CFG.n_layer and isinstance(res.final, DepthMix)
    x = torch.zeros(1, 2, CFG.n_embd)
    with pytest.raises(ValueError, match="blocks must hold 5 blocks, got 4"):
        res(model.transformer.h[:4], x, [None] * 4)
    for args, match in (((0, 8, 2), "n_layer"), ((3, 8, 0), "block_size"), ((3, 0, 2), "n_embd")):
        with pytest.raises(ValueError, match=match):
            AttnResidual(*args)
    # k3_model rebuilds the same model from the spec
    torch.manual_seed(0)
    again = k3_model(CFG, model.spec)
    assert again.schedule == model.schedule and again.spec is model.spec
    assert again.num_params() == model.num_params()
    with pytest.raises(ValueError, match="config must be a GPTConfig"):
        k3_model("gpt2", model.spec)
    with pytest.raises(ValueError, match="spec must be an ArchSpec"):
        k3_model(CFG, "k3")
    with pytest.raises(ValueError, match="must match config"):
        k3_model(GPTConfig(block_size=64, vocab_size=97, n_layer=4, n_head=2, n_embd=32), model.spec)


def test_the_tiny_k3_trains_on_cpu():
    torch.manual_seed(0)
    model = tiny_k3(CFG)
    data = torch.arange(64).remainder(11).repeat(4, 1)[:, :33] + torch.arange(4)[:, None]
    x, y = data[:, :-1], data[:, 1:]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(12):
        loss = F.cross_entropy(model(x).reshape(-1, CFG.vocab_size), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[0] == pytest.approx(math.log(CFG.vocab_size), abs=0.3)   # starts near chance
    assert losses[-1] < 0.5 * losses[0]


def test_cached_forward_equals_the_full_forward_in_float64():
    torch.manual_seed(0)
    model = tiny_k3(CFG).double().eval()
    idx = torch.randint(0, 97, (2, 20), generator=_gen(13))
    full = model(idx)
    cache = model.new_cache(2, 20)
    assert isinstance(cache, ModelCache)
    assert cache.kinds == ("StateCache",) * 3 + ("LatentCache",) * 2   # by the K3 schedule
    pieces = [model(idx[:, :7], cache=cache)]
    nbytes = [cache.nbytes]
    for i in range(7, 20):
        pieces.append(model(idx[:, i:i + 1], cache=cache))
        nbytes.append(cache.nbytes)
    torch.testing.assert_close(torch.cat(pieces, 1), full, rtol=1e-10, atol=1e-10)
    assert cache.length == 20 and len(set(nbytes)) == 1      # preallocated latents, fixed states
    latents = [c for c in cache if isinstance(c, LatentCache)]
    states = [c.state for c in cache if isinstance(c, StateCache)]
    assert len(latents) == 2 and all(c.length == 20 for c in latents)
    assert len(states) == 3 and all(s.S.shape == (2, 2, 16, 16) for s in states)
    by_kind = cache.nbytes_by_kind()
    assert by_kind["LatentCache"] == sum(c.used_nbytes for c in latents) == 2 * 2 * 20 * (16 + 4) * 8
    assert by_kind["StateCache"] == sum(c.nbytes for c in cache if isinstance(c, StateCache))
    with pytest.raises(ValueError, match="overflow"):
        model(idx[:, :1], cache=cache)
    # the expanded MLA decode (the only one the old TinyK3 used) gives the same logits
    for block in model.transformer.h:
        block.attn.absorb = False
    cache.reset()
    naive = [model(idx[:, :7], cache=cache)] + [model(idx[:, i:i + 1], cache=cache)
                                                for i in range(7, 20)]
    torch.testing.assert_close(torch.cat(naive, 1), full, rtol=1e-10, atol=1e-10)


def test_greedy_decoding_is_token_identical_with_and_without_the_cache():
    torch.manual_seed(0)
    model = tiny_k3(CFG)
    prompt = torch.randint(0, 97, (2, 5), generator=_gen(14))
    cached = generate(model, prompt, 24, temperature=0)   # through model.new_cache
    uncached = generate(model, prompt, 24, use_cache=False, temperature=0)
    assert torch.equal(cached, uncached)
    cache = model.new_cache(2, 29)
    assert torch.equal(generate(model, prompt, 24, temperature=0, cache=cache), uncached)
    assert cache.length == 28


def test_bad_inputs_raise_value_errors_naming_the_argument():
    with pytest.raises(ValueError, match="gate_lower_bound"):
        tiny_k3(CFG, gate_lower_bound=0.0)
    with pytest.raises(ValueError, match="moe_latent_dim"):
        tiny_k3(CFG, moe_latent_dim=33)
    with pytest.raises(ValueError, match="top_k"):
        tiny_k3(CFG, top_k=9)
    with pytest.raises(ValueError, match="attn_res_block_size"):
        tiny_k3(CFG, attn_res_block_size=-1)
    with pytest.raises(ValueError, match="first_k_dense"):
        tiny_k3(CFG, first_k_dense=6)
    with pytest.raises(ValueError, match="config"):
        tiny_k3("gpt2")
    model = tiny_k3(CFG)
    with pytest.raises(ValueError, match="idx"):
        model(torch.zeros(2, 3))
    with pytest.raises(ValueError, match="token ids"):
        model(torch.full((1, 3), 97))
    # each layer takes only its own kind of cache (K3Cache refused the wrong layer index)
    cache = model.new_cache()
    x = torch.zeros(1, 1, CFG.n_embd)
    with pytest.raises(ValueError, match="cache must be a LatentCache"):
        model.transformer.h[4].attn(x, cache=cache[0])
    with pytest.raises(ValueError, match="cache must be a StateCache"):
        model.transformer.h[0].attn(x, cache=cache[4])
    with pytest.raises(ValueError, match=r"cache must be a StateCache for block 0 .*got KVCache"):
        model(torch.zeros(1, 1, dtype=torch.long), cache=GPT(CFG).new_cache())  # GPT-2's cache
    with pytest.raises(ValueError, match="max_len must be at most block_size"):
        model.new_cache(1, CFG.block_size + 1)



def test_the_models_door_checks_every_layer_caches_kind():
    """Inside the model's door the layers do not check again, so the model checks that each
    layer cache is one its token mixer accepts -- the MLA layer's too (block 4 of 5)."""
    torch.manual_seed(0)
    model = tiny_k3(CFG).eval()
    cache = model.new_cache(1)
    layers = list(cache.layers)
    layers[4] = StateCache(1, CFG.block_size)  # a KDA layer's kind of cache where MLA sits
    with torch.no_grad(), pytest.raises(ValueError, match=r"LatentCache for block 4 \(MLA"):
        model(torch.zeros(1, 1, dtype=torch.long), cache=ModelCache(layers))

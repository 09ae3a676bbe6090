"""Chapter "What Kimi K3 adds": the plain-float companions in ``gpt2k3.models.k3`` (Attention-Residual
reads, the bounded gate's diagonal blocks in fla's KDA kernel, fla's DPLR chunk rule,
latent-expert costs, SiTU's factors), the figures that lay them out, and the live explorers."""

from __future__ import annotations

import ast
import math

import pytest
import torch

from gpt2k3.accounting import count_params, flops_per_token, kda_log_decay
from gpt2k3.archs import KIMI_K3, KIMI_LINEAR_48B
from gpt2k3.book.figures import k3_adds as figs
from gpt2k3.experiments.forgetting import half_life
from gpt2k3.config import GPTConfig
from gpt2k3.accounting.k3_mechanisms import (FLA_KDA_CHUNK, FLA_KDA_GATE_SHIFT, FLA_KDA_SUB_CHUNK,
    FLOAT32_MAX_EXP, attn_res_reads, dplr_chunk_is_safe, dplr_largest_safe_chunk,
    kda_diagonal_block_exponents, kda_diagonal_block_fits_float32, kda_largest_diagonal_block,
    latent_moe_break_even, latent_moe_cost, situ_bound, situ_factors, swiglu_reference)
from gpt2k3.layers.residual import DepthMix
from gpt2k3.layers.mlp import situ, situ_reference
from gpt2k3.models.k3 import tiny_k3


# ------------------------------------------------------------------ Attention-Residual reads
def test_attn_res_reads_for_k3_and_the_limits():
    r = attn_res_reads(KIMI_K3.n_layer, KIMI_K3.attn_res_block_size)
    assert (r.n_blocks, r.last_block, r.max_sources, r.final) == (8, 9, 9, 9)
    assert len(r.reads) == 2 * 93 + 1 and r.sources_read == sum(r.attn) + sum(r.mlp) + r.final
    assert r.mean_sources == pytest.approx(r.sources_read / 187)
    # block size 1 keeps every layer apart; a block as deep as the stack keeps two sources
    assert attn_res_reads(93, 1).final == 94 and attn_res_reads(93, 1).max_sources == 94
    # the paper counts sub-layers: K3's 12 decoder layers are 24 of them; Full AttnRes keeps
    # every sub-layer's output, 2 * 93 + 1 sources at the head
    assert r.block_sublayers == 24 and r.full_sublayer_sources == 187 == len(r.reads)
    assert set(attn_res_reads(93, 93).reads) == {1, 2} and attn_res_reads(93, 200).final == 2
    with pytest.raises(ValueError, match="n_layer"):
        attn_res_reads(0, 12)
    with pytest.raises(ValueError, match="block_size"):
        attn_res_reads(93, 0)


@pytest.mark.parametrize("n_layer,block", [(7, 1), (7, 2), (7, 3), (5, 12)])
def test_attn_res_reads_are_what_the_model_mixes(n_layer, block):
    torch.manual_seed(0)
    cfg = GPTConfig(block_size=16, vocab_size=31, n_layer=n_layer, n_head=2, n_embd=16)
    model = tiny_k3(cfg, attn_res_block_size=block, d_expert=8)
    seen: dict[str, int] = {}
    hooks = [m.register_forward_pre_hook(lambda mod, args, name=name: seen.update({name: len(args[0])}))
             for name, m in model.named_modules() if isinstance(m, DepthMix)]
    model(torch.zeros(1, 3, dtype=torch.long))
    for h in hooks:
        h.remove()
    r = attn_res_reads(n_layer, block)
    assert len(seen) == 2 * n_layer + 1
    assert tuple(seen[f"residual.attn_mix.{i}"] for i in range(n_layer)) == r.attn
    assert tuple(seen[f"residual.mlp_mix.{i}"] for i in range(n_layer)) == r.mlp
    assert seen["residual.final"] == r.final


# ------------------------------------------------------------------ the bounded gate's blocks
def _fla_gate_bound_is_safe():
    """fla-core's ``gate_bound_is_safe`` (its DPLR kernels' rule), taken out of its file by name
    (the file imports triton at the top), with fla's ``RCP_LN2``."""
    from fla_oracle import fla_package_dir

    root = fla_package_dir()
    path = root / "ops" / "generalized_delta_rule" / "dplr" / "chunk.py"
    const = root / "ops" / "utils" / "constant.py"
    if not path.is_file() or not const.is_file():
        pytest.skip("this fla-core has no gate_bound_is_safe")
    namespace: dict = {}
    exec(const.read_text(), namespace)
    funcs = [n for n in ast.parse(path.read_text()).body
             if isinstance(n, ast.FunctionDef) and n.name == "gate_bound_is_safe"]
    assert len(funcs) == 1
    exec(compile(ast.Module(body=funcs, type_ignores=[]), str(path), "exec"), namespace)
    return namespace["gate_bound_is_safe"], namespace["RCP_LN2"]


def test_dplr_chunk_rule_is_fla_cores():
    pytest.importorskip("fla")
    theirs, rcp_ln2 = _fla_gate_bound_is_safe()
    from gpt2k3.accounting.k3_mechanisms import FLA_RCP_LN2

    assert FLA_RCP_LN2 == rcp_ln2
    for bound in (-0.5, -1.0, -2.5, -5.0, -7.0, -20.0, -100.0):
        for chunk in (1, 2, 8, 16, 32, 33, 34, 64, 128):
            assert dplr_chunk_is_safe(bound, chunk) == theirs(bound, chunk), (bound, chunk)


def test_dplr_largest_safe_chunk():
    assert dplr_largest_safe_chunk(KIMI_K3.kda_gate_lower_bound) == 32
    assert dplr_chunk_is_safe(-5.0, 16) and not dplr_chunk_is_safe(-5.0, 64)
    assert dplr_largest_safe_chunk(-1.0) == 128 and dplr_largest_safe_chunk(-100.0) == 0
    for bound in (-0.3, -2.0, -5.0, -9.0):
        c = dplr_largest_safe_chunk(bound)
        assert dplr_chunk_is_safe(bound, c) and not dplr_chunk_is_safe(bound, 2 * c)
    for bad in (0.0, 1.0, math.nan, -math.inf, True, "x"):
        with pytest.raises(ValueError, match="lower_bound"):
            dplr_largest_safe_chunk(bad)
    with pytest.raises(ValueError, match="chunk_size"):
        dplr_chunk_is_safe(-5.0, 0)


def test_kda_diagonal_block_exponents_are_fla_cores_bounds():
    # fla-core 0.6.0 chunk_kda_fwd_intra's docstring: BC=16, s=2, L=-5 -> exp(15) and exp(60)
    assert kda_diagonal_block_exponents(-5.0) == (15.0, 60.0)
    assert (FLA_KDA_CHUNK, FLA_KDA_SUB_CHUNK, FLA_KDA_GATE_SHIFT) == (64, 16, 2.0)
    assert kda_diagonal_block_fits_float32(-5.0, 16)
    assert not kda_diagonal_block_fits_float32(-5.0, 32)
    assert kda_largest_diagonal_block(KIMI_K3.kda_gate_lower_bound) == FLA_KDA_SUB_CHUNK
    assert FLOAT32_MAX_EXP == pytest.approx(88.7228, abs=1e-4)
    assert math.isfinite(float(torch.tensor(FLOAT32_MAX_EXP - 0.01).exp()))    # float32 holds
    assert float(torch.tensor(FLOAT32_MAX_EXP + 0.01).exp()) == math.inf      # and overflows
    assert kda_largest_diagonal_block(-1.0) == 64 and kda_largest_diagonal_block(-100.0) == 1
    for bound in (-0.3, -2.0, -5.0, -9.0):
        c = kda_largest_diagonal_block(bound)
        assert kda_diagonal_block_fits_float32(bound, c)
        assert not kda_diagonal_block_fits_float32(bound, 2 * c)
    for bad in (0.0, 1.0, math.nan, True):
        with pytest.raises(ValueError, match="lower_bound"):
            kda_diagonal_block_exponents(bad)
    with pytest.raises(ValueError, match="sub_chunk"):
        kda_diagonal_block_exponents(-5.0, 0)
    with pytest.raises(ValueError, match="shift"):
        kda_diagonal_block_exponents(-5.0, 16, 0.0)


def test_kda_diagonal_block_factors_meet_their_bounds():
    """The factorisation itself, in float64: for log-decays in [L, 0] over a sub-chunk, the
    query factors exp(G_i - C) and key factors exp(C - G_j) with C = G_0 - d stay under the
    returned exponents, reach the key bound when every decay sits on the floor, and multiply
    back to exp(G_i - G_j)."""
    g = torch.Generator().manual_seed(0)
    for bound, size in ((-5.0, 16), (-2.0, 32), (-9.0, 8)):
        q_exp, k_exp = kda_diagonal_block_exponents(bound, size)
        gates = [bound * torch.rand(64, size, generator=g, dtype=torch.float64),
                 torch.full((1, size), bound, dtype=torch.float64),     # all on the floor
                 torch.zeros(1, size, dtype=torch.float64)]              # no decay at all
        for gate in gates:
            G = gate.cumsum(-1)
            C = G[:, :1] - (size - 1) * FLA_KDA_GATE_SHIFT / 2
            assert float((G - C).max()) <= q_exp + 1e-9
            assert float((C - G).max()) <= k_exp + 1e-9
            i, j = torch.tril_indices(size, size)
            torch.testing.assert_close((G - C)[:, i].exp() * (C - G)[:, j].exp(),
                                       (G[:, i] - G[:, j]).exp(), rtol=1e-12, atol=0)
        floor = torch.full((size,), bound, dtype=torch.float64).cumsum(0)
        assert float((floor[0] - (size - 1) * FLA_KDA_GATE_SHIFT / 2 - floor).max()) == \
            pytest.approx(k_exp)


def test_fla_kda_kernel_constants():
    """fla-core's KDA intra-chunk kernel: 32- or 64-token chunks, 16-token sub-chunks, shift 2
    by default (read from the source, which imports triton)."""
    from fla_oracle import fla_package_dir

    path = fla_package_dir() / "ops" / "kda" / "chunk_intra.py"
    if not path.is_file():
        pytest.skip("this fla-core has no kda/chunk_intra.py")
    src = path.read_text()
    assert "BC = 16" in src and "chunk_size 32 or 64" in src
    assert "(-lower_bound if lower_bound is not None else 2.)" in src
    assert "keep diagonal-block exponentials within FP32 range" in src


# ------------------------------------------------------------------ latent experts
def test_latent_moe_cost_is_count_params():
    k3 = latent_moe_cost(KIMI_K3, KIMI_K3.moe_latent_dim)
    c = count_params(KIMI_K3)
    assert (k3.total, k3.active, k3.matmul_active) == (c.total, c.active, c.matmul_active)
    assert k3.flops_per_token == flops_per_token(KIMI_K3, 0)
    full = latent_moe_cost(KIMI_K3, 0)
    f = count_params(KIMI_K3.with_(moe_latent_dim=0, moe_latent_norm=False))
    assert (full.total, full.active) == (f.total, f.active)
    d, e, k, w = KIMI_K3.n_embd, KIMI_K3.n_routed_experts, KIMI_K3.top_k, KIMI_K3.d_expert
    s = KIMI_K3.n_shared_experts
    assert full.layer_total == e * d + s * 3 * d * w + e * 3 * d * w
    assert full.layer_active == e * d + s * 3 * d * w + k * 3 * d * w
    lat = KIMI_K3.moe_latent_dim
    assert k3.layer_total == e * d + 2 * d * lat + lat + s * 3 * d * w + e * 3 * lat * w
    assert k3.total < full.total and k3.flops_per_token < full.flops_per_token
    with pytest.raises(ValueError, match="latent_dim"):
        latent_moe_cost(KIMI_K3, KIMI_K3.n_embd + 1)
    with pytest.raises(ValueError, match="latent_dim"):
        latent_moe_cost(KIMI_K3, -1)
    with pytest.raises(ValueError, match="spec"):
        latent_moe_cost("K3", 10)
    with pytest.raises(ValueError, match="routed experts"):
        latent_moe_cost(KIMI_K3.with_(n_routed_experts=0, top_k=0, n_shared_experts=0,
                                      moe_latent_dim=0, moe_latent_norm=False), 10)


@pytest.mark.parametrize("spec", [KIMI_K3, KIMI_LINEAR_48B])
def test_latent_moe_break_even(spec):
    w = latent_moe_break_even(spec)
    full = latent_moe_cost(spec, 0).matmul_active
    assert latent_moe_cost(spec, math.floor(w)).matmul_active <= full
    assert latent_moe_cost(spec, min(spec.n_embd, math.floor(w) + 1)).matmul_active > full
    # for the parameters stored, all experts shrink: the break-even is much closer to n_embd
    ws = latent_moe_break_even(spec, stored=True)
    stored = latent_moe_cost(spec, 0).total
    assert w < ws < spec.n_embd
    assert latent_moe_cost(spec, math.floor(ws)).total <= stored
    assert latent_moe_cost(spec, min(spec.n_embd, math.floor(ws) + 1)).total > stored
    with pytest.raises(ValueError, match="spec"):
        latent_moe_break_even(None)
    with pytest.raises(ValueError, match="stored"):
        latent_moe_break_even(spec, stored="yes")


# ------------------------------------------------------------------ SiTU
def test_situ_factors_swiglu_and_bound():
    for g, u in ((0.3, -1.2), (-7.0, 40.0), (12.0, 3.0), (80.0, -900.0)):
        a, b = situ_factors(g, u)
        assert a * b == pytest.approx(situ_reference(g, u), rel=1e-12, abs=1e-15)
        assert abs(a) <= 4 and abs(b) <= 25 and abs(a * b) <= situ_bound()   # = in float64 far out
        assert situ_factors(g, u, linear_beta=None)[1] == u
    t = torch.tensor([[0.3, 5.0, -2.0]], dtype=torch.float64)
    up = torch.tensor([[1.0, -3.0, 30.0]], dtype=torch.float64)
    assert situ(t, up, linear_beta=None).tolist()[0] == pytest.approx(
        [situ_factors(g, u, linear_beta=None)[0] * u for g, u in zip(t[0].tolist(), up[0].tolist())])
    # near 0 SiTU is SwiGLU
    assert situ_reference(1e-3, 1e-3) == pytest.approx(swiglu_reference(1e-3, 1e-3), rel=1e-4)
    assert swiglu_reference(2.0, 3.0) == pytest.approx(2 / (1 + math.exp(-2)) * 3)
    assert situ_bound(4.0, 25.0) == 100.0
    for bad in (0.0, -1.0, math.inf, True):
        with pytest.raises(ValueError, match="beta"):
            situ_factors(1.0, 1.0, beta=bad)
    with pytest.raises(ValueError, match="gate"):
        situ_factors(math.nan, 1.0)
    with pytest.raises(ValueError, match="up"):
        swiglu_reference(1.0, math.inf)
    with pytest.raises(ValueError, match="linear_beta"):
        situ_bound(4.0, 0.0)


# ------------------------------------------------------------------ figures
def _slider_steps(fig):
    assert fig.layout.sliders, "no slider"
    return fig.layout.sliders[0].steps


def _distinct_step_data(fig) -> int:
    return len({repr(s.args[0]) for s in _slider_steps(fig)})


def test_attn_res_sources_figure():
    fig = figs.attn_res_sources()
    steps = _slider_steps(fig)
    assert [s.label for s in steps] == [str(b) for b in figs.ATTN_RES_BLOCK_SIZES]
    assert _distinct_step_data(fig) == len(steps)
    k3 = attn_res_reads(93, 12)
    active = fig.layout.sliders[0].active
    assert steps[active].label == "12"
    z = fig.data[0].z
    assert len(z) == k3.n_blocks + 1 and len(z[0]) == 94
    # column i: the read before layer i+1; its non-empty cells are 1/R for R sources
    for i in (0, 1, 12, 13, 92):
        col = [row[i] for row in z if row[i] is not None]
        assert len(col) == k3.attn[i] and all(v == pytest.approx(1 / k3.attn[i]) for v in col)
    assert len([row[-1] for row in z if row[-1] is not None]) == k3.final
    widest = fig.data[1]
    assert list(widest.y) == [attn_res_reads(93, s).max_sources
                              for s in sorted(figs.ATTN_RES_BLOCK_SIZES)]
    with pytest.raises(ValueError, match="block_size"):
        figs.attn_res_sources(block_sizes=[0])
    with pytest.raises(ValueError, match="block_sizes"):
        figs.attn_res_sources(block_sizes=[])
    with pytest.raises(ValueError, match="n_embd"):
        figs.attn_res_sources(n_embd=0)
    one = figs.attn_res_sources(10, [3])
    assert not one.layout.sliders and len(one.data[0].z) == attn_res_reads(10, 3).n_blocks + 1


def test_bounded_decay_figure():
    fig = figs.bounded_decay()
    steps = _slider_steps(fig)
    assert _distinct_step_data(fig) == len(steps) == 4
    xs = list(fig.data[0].x)
    a = 0.0
    assert steps[fig.layout.sliders[0].active].label == "0"
    for j in (0, 60, 120):
        g_k3 = kda_log_decay(xs[j], a, 0.0, -5.0)
        g_kl = kda_log_decay(xs[j], a, 0.0)
        assert fig.data[0].y[j] == pytest.approx(g_k3, rel=1e-5)
        assert fig.data[1].y[j] == pytest.approx(g_kl, rel=1e-5)
        assert fig.data[2].y[j] == pytest.approx(half_life(g_k3), rel=1e-5)
    assert all(-5 < y <= 0 for y in fig.data[0].y)
    assert min(fig.data[1].y) < -5                       # Kimi Linear's has no floor
    assert min(fig.data[2].y) > half_life(-5.0)
    with pytest.raises(ValueError, match="a_logs"):
        figs.bounded_decay(a_logs=[])
    with pytest.raises(ValueError, match="lower_bound"):
        figs.bounded_decay(lower_bound=1.0)
    with pytest.raises(ValueError, match="x_range"):
        figs.bounded_decay(x_range=(3, 3))
    assert not figs.bounded_decay([0.5]).layout.sliders


def test_latent_experts_figure():
    fig = figs.latent_experts()
    steps = _slider_steps(fig)
    assert _distinct_step_data(fig) == len(steps) == len(figs.LATENT_DIMS)
    assert steps[fig.layout.sliders[0].active].label == f"{KIMI_K3.moe_latent_dim:,}"
    k3, full = latent_moe_cost(KIMI_K3, KIMI_K3.moe_latent_dim), latent_moe_cost(KIMI_K3, 0)
    assert list(fig.data[0].y) == [k3.layer_total, k3.layer_active]
    assert list(fig.data[1].y) == [full.layer_total, full.layer_active]
    totals = list(fig.data[2].y)
    assert totals == pytest.approx([latent_moe_cost(KIMI_K3, w).total / full.total
                                    for w in sorted(figs.LATENT_DIMS)], rel=1e-5)
    assert fig.data[5].y[0] == pytest.approx(k3.flops_per_token / full.flops_per_token, rel=1e-5)
    with pytest.raises(ValueError, match="latent_dim"):
        figs.latent_experts(latent_dims=[KIMI_K3.n_embd + 1])
    with pytest.raises(ValueError, match="latent_dims"):
        figs.latent_experts(latent_dims=[0])
    with pytest.raises(ValueError, match="spec"):
        figs.latent_experts(spec="K3")


def test_situ_vs_swiglu_figure():
    fig = figs.situ_vs_swiglu()
    steps = _slider_steps(fig)
    assert _distinct_step_data(fig) == len(steps) == len(figs.SITU_BETAS)
    gs = list(fig.data[1].x)
    for j in (0, 40, 160):
        assert fig.data[1].y[j] == pytest.approx(situ_factors(gs[j], 0.0, 4.0, 25.0)[0],
                                                 rel=1e-5, abs=1e-12)
        assert fig.data[0].y[j] == pytest.approx(swiglu_reference(gs[j], 1.0), rel=1e-5,
                                                 abs=1e-12)
    assert max(fig.data[1].y) < 4 and list(fig.data[2].y) == [4, 4]
    assert max(abs(y) for y in fig.data[4].y) < 25
    with pytest.raises(ValueError, match="beta"):
        figs.situ_vs_swiglu(betas=[0.0])
    with pytest.raises(ValueError, match="gate_range"):
        figs.situ_vs_swiglu(gate_range=(1.0, -1.0))
    with pytest.raises(ValueError, match="points"):
        figs.situ_vs_swiglu(points=1)


# ------------------------------------------------------------------ live explorers
def test_explorers_build_and_redraw():
    from gpt2k3.book.widgets import k3_adds as w

    boxes = [w.attn_res_explorer(), w.bounded_decay_explorer(), w.latent_moe_explorer(),
             w.situ_explorer()]
    for box in boxes:
        assert box.current is not None and not hasattr(box.current, "value")  # a figure
    attn, decay, moe, act = boxes
    attn.controls["n_layer"].value = 10               # the block size follows the depth
    assert attn.controls["block"].max == 10 and attn.controls["block"].value == 10
    attn.controls["block"].value = 3
    assert attn.current.layout.sliders[0].steps[attn.current.layout.sliders[0].active].label == "3"
    decay.controls["a_log"].value = 2.0
    decay.controls["bound"].value = -1.0
    assert min(decay.current.data[0].y) >= -1          # (-1, 0), rounded to 6 digits
    moe.controls["experts"].value = 8                   # experts per token follow the count
    assert moe.controls["top_k"].max == 8 and moe.controls["top_k"].value == 8
    moe.controls["latent"].value = 256
    assert moe.current.data[0].y[0] == latent_moe_cost(
        KIMI_K3.with_(n_routed_experts=8, top_k=8), 256).layer_total
    act.controls["beta"].value = 0.25
    assert max(act.current.data[1].y) <= 0.25 and list(act.current.data[2].y) == [0.25, 0.25]


def test_k3_feature_rows():
    from gpt2k3.accounting.k3_mechanisms import K3_FEATURE_LABELS, k3_feature_rows

    rows = k3_feature_rows(KIMI_LINEAR_48B, KIMI_K3)
    assert [r[0] for r in rows] == list(K3_FEATURE_LABELS.values())
    by = {r[0]: r[1:] for r in rows}
    assert by["latent expert width"] == ["—", KIMI_K3.moe_latent_dim]
    assert by["KDA decay bounded below at"] == ["—", -5.0]
    assert by["gated MLP activation"] == ["swiglu", "situ"]
    assert by["positional encoding in attention"] == ["none", "none"]
    # every field K3 sets away from its default is in the table
    assert set(KIMI_K3.k3_features) - {"vision"} <= set(K3_FEATURE_LABELS)
    with pytest.raises(ValueError, match="specs"):
        k3_feature_rows()
    with pytest.raises(ValueError, match="specs"):
        k3_feature_rows(KIMI_K3, "K2")


# ------------------------------------------------------------------ Quantile Balancing
def test_balancing_runs_qb_balances_where_the_sign_rule_does_not():
    from gpt2k3.book.figures.k3_adds import balancing_runs, steps_to

    runs = balancing_runs(n_experts=64, top_k=4, tokens=512, steps=6, sign_steps=(1e-3, 1e-1))
    qb, slow = runs["history"]["QB"], runs["history"]["sign 0.001"]
    assert runs["names"] == ["QB", "sign 0.001", "sign 0.1"]
    assert qb["max_over_mean"][0] == slow["max_over_mean"][0]        # same first batch, bias 0
    assert qb["dead"][-1] == 0 and qb["max_over_mean"][-1] < 2 * runs["floor"]
    assert slow["max_over_mean"][-1] > 2 * qb["max_over_mean"][-1]
    assert steps_to([3.0, 1.2, 1.05], 1.1) == 3 and steps_to([3.0], 1.1) is None


def test_quantile_balancing_figure_has_one_slider_step_per_sign_step():
    from gpt2k3.book.figures.k3_adds import balancing_runs, quantile_balancing

    runs = balancing_runs(n_experts=32, top_k=2, tokens=128, steps=3, sign_steps=(1e-3, 1e-2))
    fig = quantile_balancing(runs)
    assert len(fig.layout.sliders[0].steps) == 2 and len(fig.data) == 5  # 2 rules x 2 + floor
    one = quantile_balancing(balancing_runs(32, 2, 128, 3, [1e-2]))
    assert not one.layout.sliders                                      # a live explorer's view
    with pytest.raises(ValueError, match="active"):
        quantile_balancing(runs, active=5)


def test_worked_example_and_schematic():
    from gpt2k3.book.figures.k3_adds import latent_moe_schematic, qb_worked_example

    ex = qb_worked_example()
    assert ex["load_before"] == [4, 3, 1, 0] and ex["load_after"] == [2, 2, 2, 2]
    fig = latent_moe_schematic()
    assert len(fig.layout.shapes) == 8
    # phone width (390 px, about 34 px per canvas unit): every label line fits its 2.7-unit box
    lines = [line for a in fig.layout.annotations if a.text for line in a.text.split("<br>")]
    assert lines and max(map(len, lines)) <= 14
    rects = [(s.x0, s.x1, s.y0, s.y1) for s in fig.layout.shapes]
    assert not any(a[0] < b[1] and b[0] < a[1] and a[2] < b[3] and b[2] < a[3]
                   for i, a in enumerate(rects) for b in rects[i + 1:])  # no two boxes overlap
    with pytest.raises(ValueError, match="spec"):
        latent_moe_schematic("K3")


def test_balancing_explorer_redraws():
    from gpt2k3.book.widgets.balancing import balancing_explorer

    ex = balancing_explorer()
    ex.controls["experts"].value = 8
    assert ex.controls["top_k"].max == 7 and ex.controls["top_k"].value <= 7

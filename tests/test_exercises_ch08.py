"""Chapter 8's exercise solutions state what they compute (``gpt2k3.book.exercises.ch08``)."""

from __future__ import annotations

import math

import pytest
import torch

from gpt2k3.accounting import count_params
from gpt2k3.accounting import k3_mechanisms as k3n
from gpt2k3.archs import KIMI_K3
from gpt2k3.book.exercises import ch08
from gpt2k3.layers.deltanet import bounded_log_decay


def test_8_1_latent_factors_match_the_counts():
    r = ch08.latent_moe_factors(KIMI_K3)
    assert r.routed_only == KIMI_K3.moe_latent_dim / KIMI_K3.n_embd == 0.5
    assert r.stored_formula == pytest.approx(r.stored_package, rel=1e-12)
    assert r.used_formula == pytest.approx(r.used_package, rel=1e-12)
    assert r.routed_only < r.stored_formula < r.used_formula < 1
    # at the break-even widths the latent layer costs what the full-width one does
    k, f, d, E = KIMI_K3.top_k, KIMI_K3.d_expert, KIMI_K3.n_embd, KIMI_K3.n_routed_experts
    w = r.break_even_used
    assert 2 * d * w + 3 * k * w * f == pytest.approx(3 * k * d * f)
    w = r.break_even_stored
    assert 2 * d * w + w + 3 * E * w * f == pytest.approx(3 * E * d * f)
    assert r.break_even_used == r.break_even_used_package
    assert r.break_even_stored == r.break_even_stored_package
    assert KIMI_K3.moe_latent_dim < r.break_even_used < r.break_even_stored < d


def test_8_2_widest_read_is_blocks_plus_one():
    for r in ch08.widest_reads(KIMI_K3.n_layer):
        assert r["predicted"] == r["counted"] == math.ceil(KIMI_K3.n_layer / r["block_size"]) + 1
    assert {r["block_size"]: r["counted"] for r in ch08.widest_reads(93, (6, 24))} == {6: 17, 24: 5}


def test_8_3_decay_crossings():
    rows = ch08.decay_crossings(a_logs=(-1.0, 0.0, 1.0, 2.0), lower_bound=-5.0, x_max=12.0)
    for r in rows:
        assert r["k3_at_0"] == pytest.approx(-2.5)
        assert r["linear_at_0"] == pytest.approx(-math.exp(r["a_log"]) * math.log(2))
        assert r["linear_at_crossing"] == pytest.approx(-5.0)
    assert [r["crosses_in_figure"] for r in rows] == [False, True, True, True]
    assert ch08.half_life_at_midpoint(-5.0) == pytest.approx(2 * math.log(2) / 5)


def test_8_4_channel_reading_of_a_log():
    r = ch08.compare_a_log_readings(KIMI_K3)
    assert r["stored_per_layer"] == KIMI_K3.kda_head_dim == 128
    assert (r["used_per_head_reading"], r["used_channel_reading"]) == (KIMI_K3.kda_n_head, KIMI_K3.kda_head_dim)
    assert r["extra_parameters"] == KIMI_K3.n_kda_layers * 32 == 2208
    assert r["vs_scalar"] <= 1e-12 and r["agree_when_equal"] <= 1e-12
    assert r["differ_otherwise"] > 0.1 and r["in_range"]
    # the extra parameters do not change the total as the report rounds it
    total = count_params(KIMI_K3).total
    assert f"{total / 1e12:.2f}" == f"{(total + r['extra_parameters']) / 1e12:.2f}"


def test_8_4_channel_reading_broadcasts_over_heads_and_checks_its_shape():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 3, 2, 4, generator=g, dtype=torch.float64)
    dt_bias = torch.zeros(8, dtype=torch.float64)
    a = torch.tensor([0.0, 1.0, -1.0, 2.0], dtype=torch.float64)
    out = ch08.bounded_log_decay_per_channel(x, a, dt_bias, -5.0)
    for h in range(2):  # every head uses the same A per channel
        assert torch.allclose(out[:, :, h], -5.0 * torch.sigmoid(a.exp() * x[:, :, h]), atol=1e-15)
    with pytest.raises(ValueError, match="A_log"):
        ch08.bounded_log_decay_per_channel(x, torch.zeros(2, dtype=torch.float64), dt_bias)
    with pytest.raises(ValueError, match="lower_bound"):
        ch08.bounded_log_decay_per_channel(x, a, dt_bias, 1.0)
    with pytest.raises(ValueError, match="dt_bias"):
        ch08.bounded_log_decay_per_channel(x, a, torch.zeros(3, dtype=torch.float64))
    # the per-head form is unchanged
    assert bounded_log_decay(x, torch.zeros(2, dtype=torch.float64), dt_bias, -5.0).shape == x.shape


def test_8_5_sign_rule_tradeoff():
    from gpt2k3.book.figures.k3_adds import balancing_runs

    runs = balancing_runs(n_experts=64, top_k=4, tokens=256, steps=6, sign_steps=(1e-3, 1e-1))
    rows = {r["rule"]: r for r in ch08.sign_rule_tradeoff(runs)}
    assert set(rows) == {"QB", "sign 0.001", "sign 0.1"}
    assert rows["QB"]["first_no_idle"] == 2
    assert rows["sign 0.001"]["last_idle"] >= rows["sign 0.1"]["last_idle"]
    assert all(0 <= r["swings"] <= 5 and r["largest_rise"] >= 1 for r in rows.values())
    with pytest.raises(ValueError, match="runs"):
        ch08.sign_rule_tradeoff({"history": {}})

"""Chapter 7's exercise solutions state what they compute (``gpt2k3.book.exercises.ch07``)."""

from __future__ import annotations

import math
import random

import pytest
import torch

from gpt2k3.accounting import H200, kv_cache_bytes
from gpt2k3.archs import DEEPSEEK_V3, KIMI_K2
from gpt2k3.book.exercises import ch07
from gpt2k3.layers.moe import MoE, MoEConfig, dispatch


def test_7_1_distinct_experts_formula():
    rows = ch07.distinct_experts((DEEPSEEK_V3, KIMI_K2), batches=(1, 8, 64, 256), trials=200)
    for r in rows:
        assert r.formula == pytest.approx(r.n_experts * (1 - (1 - r.top_k / r.n_experts) ** r.batch))
        assert r.package == pytest.approx(r.formula, abs=1e-9)
        assert r.exact_mean == pytest.approx(r.formula, rel=1e-6)
        if r.batch <= 64:
            assert r.simulated == pytest.approx(r.formula, rel=0.02)
        else:
            assert r.simulated is None
    at = {(r.model, r.batch): r for r in rows}
    assert at["DeepSeek-V3", 1].formula == pytest.approx(DEEPSEEK_V3.top_k)  # one token: its k experts
    assert 0.85 < at["DeepSeek-V3", 64].share < 0.9 and 0.7 < at["Kimi K2", 64].share < 0.8


def test_7_1_independent_simulation():
    # a simulation written here, not the package's: 300 batches of 8 tokens over 32 experts, top 4
    rng = random.Random(7)
    E, k, B = 32, 4, 8
    mean = sum(len({e for _ in range(B) for e in rng.sample(range(E), k)}) for _ in range(300)) / 300
    assert mean == pytest.approx(E * (1 - (1 - k / E) ** B), rel=0.03)


def test_7_2_heads_at_the_ridge():
    r = ch07.heads_at_ridge(DEEPSEEK_V3, tp=8, ridge=H200.ridge)
    assert r.per_head == pytest.approx((2 * 512 + 64) / (512 + 64))
    assert r.intensity_one_gpu == pytest.approx(128 * r.per_head)
    assert r.intensity_split == pytest.approx(r.intensity_one_gpu / 8)
    assert ch07.intensity_with_heads(DEEPSEEK_V3, math.floor(r.heads_at_ridge)) < H200.ridge \
        < ch07.intensity_with_heads(DEEPSEEK_V3, math.ceil(r.heads_at_ridge))
    assert r.heads_at_ridge == pytest.approx(r.ridge_over_two, rel=0.1)  # close to half the ridge
    assert r.intensity_split < H200.ridge < r.intensity_one_gpu
    assert ch07.heads_at_ridge(KIMI_K2).intensity_one_gpu < H200.ridge


def test_7_3_fill_context_scales_inversely_with_the_batch():
    rows = {r.batch: r for r in ch07.contexts_that_fill(DEEPSEEK_V3, batches=(1, 16, 64))}
    for b, r in rows.items():
        assert kv_cache_bytes(DEEPSEEK_V3, r.latent, b) <= H200.memory_bytes < kv_cache_bytes(DEEPSEEK_V3, r.latent + 1, b)
    assert rows[16].latent == pytest.approx(rows[64].latent * 4, abs=4)
    assert rows[16].mha < rows[16].latent // 70  # the MHA cache is 71x larger per token


def test_7_4_capacity_dispatch():
    r = ch07.capacity_drops(capacity_factors=(1.0, 1.25, 2.0), skews=(0.0, 0.2))
    even, skewed = r["by_skew"][0.0], r["by_skew"][0.2]
    assert r["balanced"] == 128 * 4 // 16
    for run in (even, skewed):
        assert sum(run["load"]) == 128 * 4
        assert run["at_busiest_vs_dispatch"] <= 1e-12
        for row in run["rows"]:
            assert row["dropped"] == sum(max(0, n - row["capacity"]) for n in run["load"])
            assert row["tokens_hit"] == row["tokens_expected"]
        shares = [row["dropped_share"] for row in run["rows"]]
        assert shares == sorted(shares, reverse=True)  # more capacity, fewer drops
    assert skewed["busiest"] > even["busiest"]
    assert all(s["dropped_share"] > e["dropped_share"] for s, e in zip(skewed["rows"], even["rows"]))


def test_7_4_capacity_zero_drops_everything_and_large_capacity_is_dispatch():
    cfg = MoEConfig(n_embd=8, n_routed_experts=4, n_shared_experts=0, top_k=2, d_expert=8)
    torch.manual_seed(0)
    moe = MoE(cfg).double()
    x = torch.randn(10, 8, dtype=torch.float64)
    with torch.no_grad():
        w, idx = moe.gate(x)
        assert torch.equal(ch07.dispatch_with_capacity(x, w, idx, moe.experts, 0), torch.zeros_like(x))
        assert torch.equal(ch07.dispatch_with_capacity(x, w, idx, moe.experts, 10), dispatch(x, w, idx, moe.experts))
    with pytest.raises(ValueError, match="capacity"):
        ch07.dispatch_with_capacity(x, w, idx, moe.experts, -1)

"""Chapter 9's exercise solutions give what their prose states, checked independently."""

from __future__ import annotations

import math

import pytest

from gpt2k3.accounting import count_params, decode_bytes, hybrid_layers
from gpt2k3.accounting.experts import expected_busiest_experts_sampled
from gpt2k3.archs import KIMI_K3
from gpt2k3.book.exercises import ch09

ONE_M = 1 << 20


def test_9_1_first_cache_bound_batch_at_a_million_tokens():
    over = ch09.cache_overtakes_weights(KIMI_K3, ONE_M)
    # one sequence never outweighs the weights within K3's context
    assert over.batch1_crossover > over.max_context == ONE_M
    b = over.first_batch
    at, below = decode_bytes(KIMI_K3, ONE_M, b), decode_bytes(KIMI_K3, ONE_M, b - 1)
    assert at.cache + at.state >= at.weights and below.cache + below.state < below.weights
    assert over.crossover_at <= ONE_M < over.crossover_before
    assert 0.5 <= over.cache_share < 0.51
    assert 128 < b < 256            # between two of Figure 9.3's doubling batches
    with pytest.raises(ValueError):
        ch09.cache_overtakes_weights(KIMI_K3, ONE_M, max_batch=8)


def test_9_2_distinct_experts_derived_simulated_and_per_device():
    de = ch09.distinct_experts(KIMI_K3, batch=64, n_devices=64, trials=400)
    E, k = KIMI_K3.n_routed_experts, KIMI_K3.top_k
    # inclusion-exclusion for one expert, written independently of the solution's formula
    p_missed = math.comb(E - 1, k) / math.comb(E, k)          # = 1 - k/E for one token
    assert de.derived == pytest.approx(E * (1 - p_missed ** 64), rel=1e-12)
    assert de.derived == pytest.approx(de.accounting, rel=1e-12)
    assert abs(de.simulated - de.derived) < 4 * de.simulated_se
    assert de.mean_per_device == pytest.approx(de.derived / 64)
    assert de.busiest_per_device > 1.3 * de.mean_per_device
    assert de.busiest_per_device <= math.ceil(E / 64)
    sampled = expected_busiest_experts_sampled(KIMI_K3, 64, 64, trials=300, seed=1)
    assert abs(sampled - de.busiest_per_device) < 0.2


def test_9_3_schedules_count_k3_and_its_variants():
    runs = ch09.k3_schedules((0, 1, 3, 7, 15, None), ONE_M)
    k3 = count_params(KIMI_K3)
    assert hybrid_layers(KIMI_K3.n_layer, 3) == KIMI_K3.kda_layers
    assert (runs[3]["total"], runs[3]["active"]) == (k3.total, k3.active_without_embedding)
    assert runs[0]["mla_layers"] == KIMI_K3.n_layer and runs[None]["kda_layers"] == KIMI_K3.n_layer
    kv = [runs[r]["kv_per_token"] for r in (0, 1, 3, 7, 15, None)]
    assert kv == sorted(kv, reverse=True) and kv[-1] == 0
    assert kv[0] == KIMI_K3.n_layer * 576 * 2 and kv[2] == runs[3]["mla_layers"] * 576 * 2
    assert abs(runs[None]["total"] / runs[0]["total"] - 1) < 0.01     # parameters hardly move
    big = [runs[r]["ms_batch1024"] for r in (0, 3, None)]
    one = [runs[r]["ms_batch1"] for r in (0, 3, None)]
    assert big == sorted(big, reverse=True) and big[0] / big[-1] > 10 > one[0] / one[-1]

"""Chapter 6's exercise solutions state what they compute (``gpt2k3.book.exercises.ch06``)."""

from __future__ import annotations

import math

import pytest
import torch

from gpt2k3.archs import KIMI_LINEAR_48B
from gpt2k3.book.exercises import ch06
from gpt2k3.experiments import forgetting
from gpt2k3.models.hybrid import hybrid_schedule


def test_6_1_the_two_clocks_rates_add():
    r = ch06.half_life_with_writes(log_alpha=-0.03, beta=0.5, d=16, trials=256)
    assert r.gate == pytest.approx(math.log(2) / 0.03)
    assert r.writes == pytest.approx(math.log(2) / -math.log(1 - 0.5 / 16))
    assert 1 / r.both == pytest.approx(1 / r.gate + 1 / r.writes)
    assert r.both < min(r.gate, r.writes)  # sooner than either clock alone
    # the exact expectation crosses one half between the two integers around the half-life
    assert r.crossing == math.ceil(r.both)
    assert r.expected_at_crossing <= 0.5 < forgetting.expected_signal([r.crossing - 1], 16,
                                                                      log_alpha=-0.03, beta=0.5)[0]
    assert abs(r.measured_at_crossing - r.expected_at_crossing) <= 0.05


def test_6_1_bad_input():
    with pytest.raises(ValueError, match="log_alpha"):
        ch06.half_life_with_writes(log_alpha=0.0)
    with pytest.raises(ValueError, match="beta"):
        ch06.half_life_with_writes(beta=0.0)


def test_6_2_derived_expectation():
    r = ch06.derive_expected_signal(d=16, log_alpha=-0.03, beta=0.5, keys=20000, trials=256)
    assert r["kk_vs_identity_over_d"] <= 0.005
    assert r["derived_vs_general"] <= 1e-12
    assert r["derived_vs_measured"] <= 0.05
    assert r["derived"] == pytest.approx([(math.exp(-0.03) * (1 - 0.5 / 16)) ** t for t in r["elapsed"]])


def test_6_3_hybrid_factor_is_layers_over_attention_layers():
    rows = ch06.hybrid_factors(KIMI_LINEAR_48B, ratios=(1, 3, 7), context_len=1 << 20)
    for r in rows:
        assert r.n_attention == hybrid_schedule(KIMI_LINEAR_48B.n_layer, r.ratio).count("attention")
        assert r.layers_over_attention == KIMI_LINEAR_48B.n_layer / r.n_attention
        assert r.factor < r.layers_over_attention < r.guess  # the states and the last layer
        assert r.factor == pytest.approx(r.layers_over_attention, rel=0.02)
    assert [r.n_attention for r in rows] == [14, 7, 4]


@pytest.mark.parametrize("gate", ["gdn", "kda"])
def test_6_4_a_reset_forgets_the_first_document(gate):
    r = ch06.compare_resets(T=96, boundary=40, D=16)
    assert r[gate]["vs_fresh"] <= 1e-12
    assert r[gate]["state_gap"] <= 1e-12
    assert r[gate]["chunkwise_vs_recurrent"] <= 1e-10
    assert r["delta_after_boundary"] > 0.1  # DeltaNet remembers the first document


def test_6_4_no_reset_is_the_chapters_recurrence():
    from gpt2k3.ops import gated_delta
    g = torch.Generator().manual_seed(0)
    q, k = (torch.nn.functional.normalize(torch.randn(1, 2, 10, 4, generator=g, dtype=torch.float64), dim=-1)
            for _ in range(2))
    v = torch.randn(1, 2, 10, 4, generator=g, dtype=torch.float64)
    beta = torch.rand(1, 2, 10, generator=g, dtype=torch.float64)
    la = -torch.rand(1, 2, 10, generator=g, dtype=torch.float64)
    o, S = ch06.recurrent_with_resets(q, k, v, beta, la, torch.zeros(1, 10, dtype=torch.bool))
    o_ref, S_ref = gated_delta.recurrent(q, k, v, beta, la)
    assert torch.equal(o, o_ref) and torch.equal(S, S_ref)
    with pytest.raises(ValueError, match="resets"):
        ch06.recurrent_with_resets(q, k, v, beta, la, torch.zeros(1, 9, dtype=torch.bool))
    with pytest.raises(ValueError, match="resets"):
        ch06.recurrent_with_resets(q, k, v, beta, la, torch.zeros(1, 10))
    with pytest.raises(ValueError, match="boundary"):
        ch06.compare_resets(T=10, boundary=10)

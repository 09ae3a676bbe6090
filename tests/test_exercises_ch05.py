"""Chapter 5's exercise solutions state what they compute (``gpt2k3.book.exercises.ch05``)."""

from __future__ import annotations

import math

import pytest
import torch

from gpt2k3.book.exercises import ch05
from gpt2k3.ops import delta
from gpt2k3.ops.wy import chunkwise_cost


def test_5_1_largest_chunk_under_twice_is_half_the_head_dimension():
    rows = ch05.largest_chunk_under_twice()
    assert [r.d for r in rows] == list(ch05.FIGURE_HEAD_DIMS)
    for r in rows:
        assert r.largest_chunk == r.d // 2
        # the grid's next chunk size is over: the crossing lies between d/2 and d
        assert chunkwise_cost(4096, r.d, r.d).flops_ratio > 2 > chunkwise_cost(4096, r.d // 2, r.d).flops_ratio
        # the ratio depends on C / d almost alone: the approximation holds to 1 %
        assert r.ratio_half_d == pytest.approx(r.approx_half_d, rel=0.01)
        assert r.ratio_d == pytest.approx(r.approx_d, rel=0.01)
    # the root the solution quotes
    x = (-15 + math.sqrt(261)) / 2
    assert 1 + 5 * x / 3 + x * x / 9 == pytest.approx(2)
    assert 0.5 < x < 1


def test_5_1_bad_input():
    with pytest.raises(ValueError, match="T"):
        ch05.largest_chunk_under_twice(T=0)
    with pytest.raises(ValueError, match="head dimension"):
        ch05.largest_chunk_under_twice(ds=(0,))


def test_5_2_two_token_ut_by_hand():
    r = ch05.two_token_ut(D=8, seed=3)
    for key in ("T_vs_hand", "w2_vs_recursion", "P_vs_H2H1", "P_vs_householder_product",
                "twice_w2_norm", "twice_u2_vs_v2_minus_v1"):
        assert r[key] <= 1e-12, key
    assert r["twice_T"] == [[1.0, 0.0], [pytest.approx(-1.0), 1.0]]
    assert 0 < abs(r["k1_dot_k2"]) < 1  # random keys: neither orthogonal nor equal


def test_5_3_tril_minus_one_reads_before_the_write():
    r = ch05.compare_read_first(T=100, chunk_sizes=(16, 64))
    assert all(100 % c for c in r["chunk_sizes"])  # the prose says neither divides T
    assert r["vs_read_first"] <= 1e-12
    assert r["same_final_state"] == 0
    assert r["vs_rule"] > 0.1  # reading first is a different function
    # independently: o_t = q_t S_{t-1}, with S_{t-1} from the chapter's recurrence on a prefix
    q, k, v, beta, S0 = ch05.random_delta_inputs(T=12, seed=1)
    o, _ = ch05.chunkwise_read_first(q, k, v, beta, initial_state=S0, chunk_size=5)
    for t in (0, 4, 5, 11):
        S_prev = S0 if t == 0 else delta.recurrent(q[:, :, :t], k[:, :, :t], v[:, :, :t], beta[:, :, :t],
                                                   initial_state=S0)[1]
        assert torch.allclose(o[:, :, t], (q[:, :, t, None, :] @ S_prev).squeeze(-2), atol=1e-12)


def test_5_4_wy_recursion_in_place_of_the_ut_transform():
    r = ch05.compare_wy(T=100, chunk_sizes=(7, 16, 64))
    assert r["vs_recurrent"] <= 1e-12
    assert r["steps"][16] == {"ut": 7, "wy": 107, "wy_batched": 23}
    for C, s in r["steps"].items():
        assert s["wy"] > r["T"] > s["ut"]  # more sequential steps than even the recurrence
        assert s["ut"] < s["wy_batched"] < s["wy"]  # batched over chunks: C rows, then the chunks


def test_changed_functions_keep_the_front_door():
    q, k, v, beta, S0 = ch05.random_delta_inputs(T=4)
    for f in (ch05.chunkwise_read_first, ch05.chunkwise_wy):
        with pytest.raises(ValueError, match="chunk_size"):
            f(q, k, v, beta, chunk_size=0)
        with pytest.raises(ValueError, match="beta"):
            f(q, k, v, beta[..., :-1])
    with pytest.raises(ValueError):
        ch05.recurrent_read_first(q, k, v[..., :2, :], beta)

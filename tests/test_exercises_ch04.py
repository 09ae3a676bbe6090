"""Chapter 4's exercise solutions (``gpt2k3.book.exercises.ch04``) give what their prose states."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gpt2k3.book.exercises import ch04
from gpt2k3.ops import delta


@pytest.mark.parametrize("beta", [0.5, 1.0, 1.5, 2.0])
def test_4_1_the_read_error_is_multiplied_by_one_minus_beta(beta):
    r = ch04.repeated_writes(beta, 6)
    assert r["off_line"] < 1e-12
    assert r["coefficient"] == pytest.approx(r["predicted"], abs=1e-12)


def test_4_1_beta_two_reflects_the_read_back_and_forth():
    c = ch04.repeated_writes(2.0, 5)["coefficient"]
    assert [round(1 + x, 9) for x in c] == [2.0, 0.0, 2.0, 0.0, 2.0]  # reads 2v, 0, 2v, ...
    assert abs(ch04.repeated_writes(1.0, 1)["coefficient"][0]) < 1e-12  # beta = 1: exact at once


@pytest.mark.parametrize("beta, norm", [(1.0, 1.0), (2.0, 1.0), (0.5, 1.0), (1.0, 2.0), (0.25, 2.0)])
def test_4_2_the_erase_matrix(beta, norm):
    f = ch04.erase_matrix(d=8, beta=beta, key_norm=norm)
    ev = sorted(f["eigenvalues"])
    assert f["along_k"] == pytest.approx(1 - beta * norm**2, abs=1e-12)
    assert ev[0] == pytest.approx(min(1.0, 1 - beta * norm**2), abs=1e-12)
    assert ev[1:] == pytest.approx([1.0] * 7, abs=1e-12)
    assert f["symmetry_gap"] < 1e-12
    assert (f["projection_gap"] < 1e-12) == (beta * norm**2 == 1.0)
    assert (f["involution_gap"] < 1e-12) == (beta * norm**2 == 2.0)
    assert (f["kills_k"] < 1e-12) == (beta * norm**2 == 1.0)


def test_4_3_one_pass_is_the_delta_rule_and_passes_are_kaczmarz():
    g = torch.Generator().manual_seed(3)
    q, k = (F.normalize(torch.randn(2, 3, 7, 8, generator=g, dtype=torch.float64), dim=-1) for _ in range(2))
    v = torch.randn(2, 3, 7, 8, generator=g, dtype=torch.float64)
    beta = torch.rand(2, 3, 7, generator=g, dtype=torch.float64)
    S0 = torch.randn(2, 3, 8, 8, generator=g, dtype=torch.float64)
    o1, S1 = ch04.recurrent_passes(q, k, v, beta, initial_state=S0)
    o_ref, S_ref = delta.recurrent(q, k, v, beta, initial_state=S0)
    torch.testing.assert_close((o1, S1), (o_ref, S_ref), rtol=0, atol=0)
    o3, S3 = ch04.recurrent_passes(q, k, v, beta, initial_state=S0, passes=3)
    S = S0
    for _ in range(3):
        o, S = delta.recurrent(q, k, v, beta, initial_state=S)
    torch.testing.assert_close((o3, S3), (o, S), rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="passes"):
        ch04.recurrent_passes(q, k, v, beta, passes=0)


def test_4_3_sweeps_reach_the_least_squares_state_only_when_it_is_exact():
    half = ch04.passes_to_least_squares(16, 8, (1, 10, 50))
    errs = [r["error"] for r in half["rows"]]
    assert errs == sorted(errs, reverse=True) and errs[-1] < 1e-6
    assert half["rows"][-1]["to_least_squares"] < 1e-5 and half["least_squares_error"] < 1e-10
    full = ch04.passes_to_least_squares(16, 16, (1, 50))
    assert full["least_squares_error"] < 1e-10 and 0.1 < full["rows"][-1]["error"] < full["rows"][0]["error"]
    over = ch04.passes_to_least_squares(16, 32, (50,))
    weak = ch04.passes_to_least_squares(16, 32, (200,), beta=0.1)
    ls = over["least_squares_error"]
    assert weak["least_squares_error"] == ls
    assert over["rows"][-1]["error"] > ls + 0.1
    assert ls <= weak["rows"][-1]["error"] < ls + 0.01

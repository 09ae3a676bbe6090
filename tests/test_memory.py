"""Associative memory: exact recall with orthogonal keys, interference with random ones."""

import pytest
import torch

from gpt2k3.experiments import memory
from gpt2k3.ops import delta, linear


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


# --------------------------------------------------------------------------- keys


def test_random_unit_keys():
    keys = memory.random_unit_keys(50, 8, gen())
    assert keys.shape == (50, 8) and keys.dtype == torch.float32
    torch.testing.assert_close(keys.norm(dim=-1), torch.ones(50))
    assert torch.equal(keys, memory.random_unit_keys(50, 8, gen()))  # reproducible


@pytest.mark.parametrize("n", [1, 5, 8])
def test_orthogonal_keys_are_orthonormal(n):
    keys = memory.orthogonal_keys(n, 8, gen(), dtype=torch.float64)
    assert keys.shape == (n, 8)
    torch.testing.assert_close(keys @ keys.T, torch.eye(n, dtype=torch.float64))


# --------------------------------------------------------------------------- writes reuse the mixers


def test_single_association_identity():
    """k (k^T v) = |k|^2 v: one association comes back scaled by the key's squared norm."""
    g = gen(1)
    k = torch.randn(1, 6, generator=g, dtype=torch.float64)
    v = torch.randn(1, 4, generator=g, dtype=torch.float64)
    S = memory.write_additive(k, v)
    torch.testing.assert_close(memory.read(S, k), k.norm() ** 2 * v)
    k_unit = k / k.norm()
    torch.testing.assert_close(memory.read(memory.write_additive(k_unit, v), k_unit), v)
    # with a unit key the delta rule (beta = 1) returns v exactly as well
    torch.testing.assert_close(memory.read(memory.write_delta(k_unit, v), k_unit), v)


def test_write_additive_is_the_linear_attention_state():
    keys = memory.random_unit_keys(7, 5, gen(2), dtype=torch.float64)
    values = torch.randn(7, 3, generator=gen(3), dtype=torch.float64)
    k = keys.abs()[None, None]  # linear attention's normalised form wants non-negative features
    _, (S, _) = linear.recurrent(k, k, values[None, None], normalize=False)
    torch.testing.assert_close(memory.write_additive(keys.abs(), values), S[0, 0])


@pytest.mark.parametrize("beta", [1.0, 0.3, "per-pair"])
def test_write_delta_is_the_sequential_rule(beta):
    keys = memory.random_unit_keys(9, 5, gen(4), dtype=torch.float64)
    values = torch.randn(9, 3, generator=gen(5), dtype=torch.float64)
    if beta == "per-pair":
        betas = torch.rand(9, generator=gen(6), dtype=torch.float64)
    else:
        betas = torch.full((9,), beta, dtype=torch.float64)
    S_ref = torch.zeros(5, 3, dtype=torch.float64)
    for k, v, b in zip(keys, values, betas):
        S_ref = S_ref + b * torch.outer(k, v - k @ S_ref)
    S = memory.write_delta(keys, values, betas if beta == "per-pair" else beta)
    torch.testing.assert_close(S, S_ref)
    k, v, b = keys[None, None], values[None, None], betas[None, None]  # one batch, one head
    _, S_mixer = delta.chunkwise(k, k, v, b, chunk_size=4)
    torch.testing.assert_close(S, S_mixer[0, 0])


# --------------------------------------------------------------------------- recall


@pytest.mark.parametrize("rule", ["additive", "delta"])
@pytest.mark.parametrize("n", [1, 7, 16])
def test_orthogonal_keys_recall_exactly_up_to_d(rule, n):
    keys = memory.orthogonal_keys(n, 16, gen(n))
    values = torch.randn(n, 16, generator=gen(100 + n))
    assert memory.retrieval_error(keys, values, rule) < 1e-5


def test_orthogonal_curves_are_flat_zero():
    for rule in ("additive", "delta"):
        curve = memory.error_curve(16, [1, 4, 8, 16], rule, key_kind="orthogonal", seed=3, trials=3)
        assert max(curve) < 1e-5


def test_random_keys_interfere():
    ns = [1, 2, 4, 8, 16, 32, 64]
    additive = memory.error_curve(16, ns, "additive", key_kind="random", seed=0, trials=8)
    delta_rule = memory.error_curve(16, ns, "delta", key_kind="random", beta=1.0, seed=0, trials=8)
    assert len(additive) == len(delta_rule) == len(ns)
    assert additive[0] < 1e-6 and delta_rule[0] < 1e-6  # one unit key: exact
    assert all(a < b for a, b in zip(additive, additive[1:]))  # interference grows with N
    assert additive[-1] > 1.5  # about sqrt((N - 1) / D) ~ 2 at N = 4 D
    # the delta rule interferes less once several pairs share the state
    assert all(d < a for d, a in zip(delta_rule[2:], additive[2:]))


def test_error_curve_is_deterministic():
    a = memory.error_curve(8, [2, 5], "delta", seed=7, trials=2)
    b = memory.error_curve(8, [2, 5], "delta", seed=7, trials=2)
    assert a == b and all(isinstance(x, float) for x in a)
    assert a != memory.error_curve(8, [2, 5], "delta", seed=8, trials=2)


def test_least_squares_is_exact_up_to_d_and_the_floor_beyond():
    d = 12
    for n in (3, 12):  # random keys are linearly independent up to n = d
        keys = memory.random_unit_keys(n, d, gen(n))
        values = torch.randn(n, d, generator=gen(50 + n))
        assert memory.retrieval_error(keys, values, "least_squares") < 1e-4
    keys = memory.random_unit_keys(40, d, gen(9), dtype=torch.float64)
    values = torch.randn(40, d, generator=gen(10), dtype=torch.float64)
    total = {rule: (memory.read(S, keys) - values).pow(2).sum().item()
             for rule, S in (("additive", memory.write_additive(keys, values)),
                             ("delta", memory.write_delta(keys, values)),
                             ("least_squares", memory.write_least_squares(keys, values)))}
    # no D x D state recalls 40 pairs in 12 dimensions with less total squared error
    assert total["least_squares"] < total["delta"] < total["additive"]
    assert total["least_squares"] > 1.0


def test_expected_additive_error_matches_measurement():
    d, ns = 64, [2, 16, 64, 128]
    measured = memory.error_curve(d, ns, "additive", seed=2, trials=16)
    for n, m in zip(ns, measured):
        assert 0.85 * memory.expected_additive_error(n, d) < m <= 1.02 * memory.expected_additive_error(n, d)
    assert memory.expected_additive_error(1, 5) == 0.0


def test_error_by_position_delta_keeps_the_newest():
    d, n = 16, 48
    delta_rule = memory.error_by_position(d, n, "delta", beta=1.0, seed=1, trials=8)
    additive = memory.error_by_position(d, n, "additive", seed=1, trials=8)
    assert len(delta_rule) == len(additive) == n
    assert delta_rule[-1] < 1e-5  # the last write is exact (unit key, beta = 1)
    assert sum(delta_rule[-4:]) < sum(delta_rule[:4])  # old pairs are the ones lost
    # the additive rule blurs every pair alike: no trend from oldest to newest
    assert abs(sum(additive[:n // 2]) - sum(additive[n // 2:])) < 0.15 * sum(additive)
    # the same draws as error_curve: its mean over pairs is the curve's value
    assert abs(sum(delta_rule) / n - memory.error_curve(d, [n], "delta", seed=1, trials=8)[0]) < 1e-6


def test_pair_errors_and_retrieval_error_agree():
    keys = memory.random_unit_keys(10, 6, gen(20))
    values = torch.randn(10, 4, generator=gen(21))
    for rule in memory.RULES:
        errs = memory.pair_errors(keys, values, rule)
        assert errs.shape == (10,)
        assert abs(errs.mean().item() - memory.retrieval_error(keys, values, rule)) < 1e-6


@pytest.mark.parametrize("beta", [0.0, 0.4, 1.0, 2.0])
def test_read_erase_write_is_one_delta_step(beta):
    g = gen(30)
    S = torch.randn(6, 4, generator=g, dtype=torch.float64)
    k = torch.randn(6, generator=g, dtype=torch.float64)
    k = k / k.norm()
    v = torch.randn(4, generator=g, dtype=torch.float64)
    step = memory.read_erase_write(S, k, v, beta)
    b = torch.full((1, 1, 1), beta, dtype=torch.float64)
    _, S_mixer = delta.recurrent(k[None, None, None], k[None, None, None], v[None, None, None], b,
                                 initial_state=S[None, None])
    torch.testing.assert_close(step.after, S_mixer[0, 0])
    torch.testing.assert_close(step.v_old, k @ S)
    torch.testing.assert_close(step.read_erased, (1 - beta) * step.v_old)  # unit key
    torch.testing.assert_close(step.read_after, (1 - beta) * step.v_old + beta * v)
    # directions orthogonal to k are untouched
    other = torch.randn(6, generator=g, dtype=torch.float64)
    other = other - (other @ k) * k
    torch.testing.assert_close(other @ step.after, other @ S)


# --------------------------------------------------------------------------- bad input


KEYS = memory.random_unit_keys(4, 3, gen())
VALUES = torch.randn(4, 2, generator=gen(1))


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: memory.orthogonal_keys(9, 8), r"n <= d"),
        (lambda: memory.random_unit_keys(-1, 8), r"n must be an int >= 0"),
        (lambda: memory.random_unit_keys(3, 0), r"d must be an int >= 1"),
        (lambda: memory.write_additive(KEYS, VALUES[:3]), r"values must have shape \(N, Dv\) with N = 4"),
        (lambda: memory.write_delta(KEYS, VALUES[None]), r"values must have 2 dimensions"),
        (lambda: memory.write_delta(KEYS, VALUES, torch.ones(3)), r"beta must be a float or a tensor"),
        (lambda: memory.read(torch.zeros(5, 2), KEYS), r"keys must have shape \(N, D\) with D = 5"),
        (lambda: memory.read(torch.zeros(3, 2, 1), KEYS), r"S must have 2 dimensions"),
        (lambda: memory.retrieval_error(KEYS, VALUES, rule="hebbian"), r"rule must be one of"),
        (lambda: memory.error_curve(8, [2], rule="hebbian"), r"rule must be one of"),
        (lambda: memory.error_curve(8, [2], key_kind="sparse"), r"key_kind must be one of"),
        (lambda: memory.error_curve(8, [4, 9], key_kind="orthogonal"), r"orthogonal keys need every n"),
        (lambda: memory.error_curve(8, [0]), r"each n in ns must be an int >= 1"),
        (lambda: memory.error_curve(8, [2], trials=0), r"trials must be an int >= 1"),
        (lambda: memory.write_delta(KEYS, VALUES, 2.5), r"beta \* \|\|k\|\|\^2 must be in \[0, 2\]"),
        (lambda: memory.write_delta(3 * KEYS, VALUES, 1.0), r"beta \* \|\|k\|\|\^2 must be in \[0, 2\]"),
        (lambda: memory.pair_errors(KEYS, torch.zeros_like(VALUES)), r"values must have no all-zero row"),
        (lambda: memory.retrieval_error(KEYS, VALUES * torch.tensor([[1.0], [0.0], [1.0], [1.0]])),
         r"values must have no all-zero row .* row 1 is zero"),
        (lambda: memory.pair_errors(KEYS, VALUES * float("nan")), r"values must be finite"),
        (lambda: memory.write_delta(KEYS, VALUES, "1"), r"beta must be a float or a tensor"),
        (lambda: memory.pair_errors(KEYS, VALUES, rule="hebbian"), r"rule must be one of"),
        (lambda: memory.write_least_squares(KEYS, VALUES[:2]), r"values must have shape \(N, Dv\)"),
        (lambda: memory.error_by_position(8, 9, key_kind="orthogonal"), r"orthogonal keys need every n"),
        (lambda: memory.error_by_position(8, 0), r"each n in ns must be an int >= 1"),
        (lambda: memory.expected_additive_error(0, 8), r"n must be an int >= 1"),
        (lambda: memory.read_erase_write(torch.zeros(3, 2), KEYS[0], VALUES[0], 3.0),
         r"beta must be a float in \[0, 2\]"),
        (lambda: memory.read_erase_write(torch.zeros(3, 2), KEYS[0], VALUES[0, :1]),
         r"k must have shape \(D,\)"),
        (lambda: memory.read_erase_write(torch.zeros(3, 2), KEYS, VALUES[0]), r"k must have 1 dimensions"),
    ],
)
def test_bad_input_raises(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_linear_attention_error_curve_is_chapter_3s_normalised_read():
    # one pair reads back exactly; with more, the normalised read averages all values and the
    # error tends to 1 whatever d is -- unlike the bare additive write, whose error falls with d
    one, few, many = memory.linear_attention_error_curve(64, [1, 2, 256], trials=4)
    assert one < 1e-12 and 0.3 < few < 1 and 0.9 < many < 1.05
    bare = memory.error_curve(64, [2], "additive", trials=4)[0]
    assert bare < few
    # the same read as ops.linear.recurrent at its last position, for one pair set
    gen = torch.Generator().manual_seed(0)
    keys = linear.elu1(torch.randn(1, 5, 8, generator=gen, dtype=torch.float64))
    values = torch.randn(1, 5, 8, generator=gen, dtype=torch.float64)
    err = memory.linear_attention_error_curve(8, [5], trials=1, seed=0)[0]
    _, (S, z) = linear.recurrent(keys[None], keys[None], values[None])
    reads = (keys[0] @ S[0, 0]) / (keys[0] @ z[0, 0])[:, None]
    assert abs(err - ((reads - values[0]).norm(dim=-1) / values[0].norm(dim=-1)).mean().item()) < 1e-12
    with pytest.raises(ValueError):
        memory.linear_attention_error_curve(8, [0])

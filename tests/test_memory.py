"""Associative memory: exact recall with orthogonal keys, interference with random ones."""

import pytest
import torch

from gpt2k3 import memory
from gpt2k3.mixers import delta, linear


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
    ],
)
def test_bad_input_raises(call, match):
    with pytest.raises(ValueError, match=match):
        call()

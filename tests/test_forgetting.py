"""Forgetting experiments: half-lives, exact idle decay, measured vs expected recall, ages."""

import math

import pytest
import torch

from gpt2k3.experiments import forgetting as fg


# --------------------------------------------------------------------------- half-life
def test_half_life():
    assert fg.half_life(0.0) == math.inf
    assert fg.half_life(-math.log(2)) == pytest.approx(1.0)
    assert fg.half_life(-0.01) == pytest.approx(69.3147, rel=1e-5)
    for t in (0.5, 3.0, 1000.0):
        assert fg.half_life(fg.log_alpha_for_half_life(t)) == pytest.approx(t)
    assert math.exp(fg.log_alpha_for_half_life(10)) ** 10 == pytest.approx(0.5)


@pytest.mark.parametrize("fn, arg, match", [(fg.half_life, 0.1, "log_alpha must be a number <= 0"),
                                            (fg.half_life, "x", "log_alpha must be"),
                                            (fg.log_alpha_for_half_life, 0, "tokens must be a positive"),
                                            (fg.log_alpha_for_half_life, -3, "tokens must be a positive")])
def test_half_life_bad_input(fn, arg, match):
    with pytest.raises(ValueError, match=match):
        fn(arg)


def test_split_channels():
    assert fg.split_channels(6, 2) == ([0, 1], [2, 3, 4, 5])
    with pytest.raises(ValueError, match="keep must be <= d = 4"):
        fg.split_channels(4, 5)


# --------------------------------------------------------------------------- one fact
def test_fresh_write_is_read_back_exactly():
    c = fg.fact_recall(8, 5, log_alpha=-0.3, beta=0.7, trials=6)
    assert c.elapsed == list(range(6))
    assert c.signal[0] == pytest.approx(1.0, abs=1e-12) and c.error[0] == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("la", [0.0, -0.05, -2.0, -20.0])
def test_gate_alone_is_exactly_alpha_to_the_t(la):
    c = fg.fact_recall(8, 40, log_alpha=la, distractors=False, trials=3)
    expected = [math.exp(la * t) for t in c.elapsed]
    assert c.signal == pytest.approx(expected, abs=1e-12)
    assert c.error == pytest.approx([1 - e for e in expected], abs=1e-12)
    assert fg.expected_signal(c.elapsed, 8, log_alpha=la, distractors=False) == pytest.approx(expected)


def test_channel_wise_gate_keeps_some_facts():
    keep, fast = fg.split_channels(8, 3)
    gate = [0.0] * 3 + [-0.2] * 5
    kept = fg.fact_recall(8, 30, log_alpha=gate, distractors=False, fact_channels=keep, trials=4)
    lost = fg.fact_recall(8, 30, log_alpha=gate, distractors=False, fact_channels=fast, trials=4)
    assert kept.signal == pytest.approx([1.0] * 31, abs=1e-12)
    assert lost.signal == pytest.approx([math.exp(-0.2 * t) for t in range(31)], abs=1e-12)


@pytest.mark.parametrize("kw", [
    dict(log_alpha=0.0, beta=0.5),
    dict(log_alpha=-0.05, beta=1.0),
    dict(log_alpha=[0.0] * 4 + [-0.3] * 4, beta=0.5, fact_channels=range(4)),
    dict(log_alpha=[0.0] * 4 + [-0.3] * 4, beta=0.8, fact_channels=range(8),
         distractor_channels=range(2, 8)),
])
def test_measured_recall_matches_its_expectation(kw):
    d, n = 8, 40
    c = fg.fact_recall(d, n, trials=1500, seed=3, **kw)
    expected = fg.expected_signal(c.elapsed, d, **kw)
    # the mean of 1500 streams: a few standard errors (the per-stream spread is below 1)
    assert max(abs(a - b) for a, b in zip(c.signal, expected)) < 0.06


def test_writes_in_other_channels_do_not_touch_a_fact():
    c = fg.fact_recall(8, 30, beta=1.0, fact_channels=range(3), distractor_channels=range(3, 8),
                       trials=5)
    assert c.signal == pytest.approx([1.0] * 31, abs=1e-12)
    assert c.error == pytest.approx([0.0] * 31, abs=1e-12)


def test_expected_signal_closed_forms():
    ts = [0, 1, 5, 30]
    assert fg.expected_signal(ts, 16, log_alpha=0.0, beta=0.5) == pytest.approx(
        [(1 - 0.5 / 16) ** t for t in ts])
    assert fg.expected_signal(ts, 16, log_alpha=-0.1, beta=0.5) == pytest.approx(
        [(math.exp(-0.1) * (1 - 0.5 / 16)) ** t for t in ts])
    assert fg.expected_signal(ts, 4, log_alpha=-math.inf, beta=0.5) == [1.0, 0.0, 0.0, 0.0]


def test_recall_is_deterministic():
    a = fg.fact_recall(8, 10, log_alpha=-0.1, trials=4, seed=7)
    assert a == fg.fact_recall(8, 10, log_alpha=-0.1, trials=4, seed=7)
    assert a != fg.fact_recall(8, 10, log_alpha=-0.1, trials=4, seed=8)


@pytest.mark.parametrize("kw, match", [
    (dict(log_alpha=0.2), "log_alpha must be <= 0"),
    (dict(log_alpha=[0.0] * 3), r"log_alpha must be a number .* or a sequence of d = 8 numbers"),
    (dict(log_alpha="fast"), "log_alpha must be a number"),
    (dict(beta=2.5), r"beta must be a number in \[0, 2\]"),
    (dict(trials=0), "trials must be an int >= 1"),
    (dict(fact_channels=[]), "fact_channels must be None or distinct channel indices"),
    (dict(fact_channels=[0, 8]), "fact_channels must be None or distinct"),
    (dict(distractor_channels=[1, 1]), "distractor_channels must be None or distinct"),
])
def test_fact_recall_bad_input(kw, match):
    with pytest.raises(ValueError, match=match):
        fg.fact_recall(8, 5, **kw)
    with pytest.raises(ValueError, match="d must be an int >= 1"):
        fg.fact_recall(0, 5)


# --------------------------------------------------------------------------- a whole stream
def test_recall_by_age():
    d, n = 16, 64
    add = fg.recall_by_age(d, n, rule="additive", trials=64)
    mean = sum(add.error) / n
    assert mean == pytest.approx(math.sqrt((n - 1) / d), rel=0.15)  # chapter 4's estimate
    dn = fg.recall_by_age(d, n, rule="delta", beta=1.0, trials=8)
    assert dn.age == list(range(n))
    assert dn.error[0] == pytest.approx(0.0, abs=1e-12)  # the last write is read back exactly
    assert sum(dn.error[:4]) < sum(dn.error[-4:])  # the newest pairs survive, the oldest do not
    gated_add = fg.recall_by_age(d, n, rule="additive", log_alpha=-0.1, trials=64)
    assert sum(gated_add.error[:8]) < sum(add.error[:8])  # a gate clears room for recent pairs


def test_recall_by_age_matches_direct_state():
    prof = fg.recall_by_age(4, 6, rule="additive", beta=0.5, log_alpha=-0.2, trials=1, seed=5)
    gen = torch.Generator().manual_seed(5)
    k = torch.nn.functional.normalize(torch.randn(1, 6, 4, generator=gen, dtype=torch.float64), dim=-1)
    v = torch.randn(1, 6, 4, generator=gen, dtype=torch.float64)
    S = sum(0.5 * math.exp(-0.2 * (5 - i)) * k[0, i:i + 1].T @ v[0, i:i + 1] for i in range(6))
    err = ((k[0] @ S - v[0]).norm(dim=-1) / v[0].norm(dim=-1)).flip(0)
    assert prof.error == pytest.approx(err.tolist())


def test_recall_by_age_full_reset_keeps_only_the_last_pair():
    """Issue #19: rule='additive' with log_alpha = -inf came back all NaN (-inf * 0 for the newest
    pair). A full reset before every write leaves exactly the last pair, written with beta = 1:
    S = k_last^T v_last for either rule, so both profiles are the same, and finite."""
    add, dn = (fg.recall_by_age(8, 10, rule=rule, beta=1.0, log_alpha=-math.inf, trials=4)
               for rule in ("additive", "delta"))
    for prof in (add, dn):
        assert all(math.isfinite(x) for x in prof.error + prof.signal)
        assert prof.error[0] == pytest.approx(0.0, abs=1e-12)
        assert prof.signal[0] == pytest.approx(1.0)
    assert add.error == pytest.approx(dn.error, abs=1e-12)
    assert add.signal == pytest.approx(dn.signal, abs=1e-12)


def test_recall_by_age_bad_input():
    with pytest.raises(ValueError, match="rule must be 'delta' or 'additive'"):
        fg.recall_by_age(4, 4, rule="least_squares")
    with pytest.raises(ValueError, match="n must be an int >= 1"):
        fg.recall_by_age(4, 0)

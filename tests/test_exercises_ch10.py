"""Chapter 10's exercise solutions give what their prose states, checked independently."""

from __future__ import annotations

import pytest

from gpt2k3.book.exercises import ch10
from gpt2k3.book.results import load
from gpt2k3.experiments import recall


@pytest.fixture(scope="module")
def data():
    return load("mqar.json")


def test_10_1_gated_deltanet_drops_most_past_D(data):
    drops = ch10.drop_past_D(data)
    fixed = {m: d["drop"] for m, d in drops.items() if m != "softmax"}
    assert max(fixed, key=fixed.get) == "gated_deltanet"
    assert min(fixed, key=fixed.get) == "deltanet"
    assert abs(drops["softmax"]["drop"]) < 0.1
    # independently: the stored final accuracies, averaged over the seeds by hand
    _, model, _ = recall.sweep_config(data)
    D = model.head_dim
    for m in drops:
        got = [recall.sweep_point(data, m, seed=s)[2 * D] for s in data["config"]["seeds"]]
        assert drops[m]["at_2D"] == pytest.approx(100 * sum(got) / len(got))


def test_10_2_cache_meets_a_deltanet_state_after_D_over_2_tokens(data):
    meet = ch10.cache_meets_state(data)
    _, model, _ = recall.sweep_config(data)
    assert meet["derived"] == meet["counted"] == model.head_dim // 2 and meet["equal"]
    T = meet["derived"]
    assert recall.state_numbers("softmax", model, T - 1) < recall.state_numbers("deltanet", model, T - 1)
    assert meet["pairs"] == min(t.n_pairs for t in recall.sweep_config(data)[0])


def test_10_3_hand_written_states_are_exact_to_D_and_not_past_it():
    sweep = ch10.written_memory_sweep((8, 16, 32), D=16)
    for P in (8, 16):
        assert all(sweep[P][r][part] == 1.0 for r in sweep[P] for part in sweep[P][r])
    add, dlt = sweep[32]["additive"], sweep[32]["delta"]
    assert add["all"] < 1 and dlt["all"] < 1
    assert add["all"] > dlt["all"]                      # the delta rule overwrites its oldest pairs
    assert dlt["newest"] > 0.9 > 0.3 > dlt["oldest"]
    assert abs(add["newest"] - add["oldest"]) < 0.15    # the additive rule spreads the overlap
    with pytest.raises(ValueError, match="rule"):
        ch10.written_memory_recall(8, "hebbian")


def test_initial_decay_rates_centre_on_the_slow_gate_biases(data):
    """The chapter's note on the gates' starting point: each bias is a rate in
    SLOW_GATE_RATES, and the input moves a token's rate around it, both ways."""
    import torch
    import torch.nn.functional as F

    from gpt2k3.book.figures.recall import initial_decay_rates
    from gpt2k3.experiments.mqar import mqar

    got = initial_decay_rates(data, seed=0)
    lo, hi = recall.SLOW_GATE_RATES
    assert 0 < got["low"] < lo <= got["median"] <= hi < got["high"] < 1
    # independently for Gated DeltaNet: A = exp(A_log) = 1, so a rate is softplus(x W_a + dt_bias)
    tasks, model, _ = recall.sweep_config(data)
    net = recall.build_model("gated_deltanet", tasks, model, seed=0)
    layers = [m for m in net.modules() if hasattr(m, "a_proj")]
    assert layers and all(torch.all(m.A_log == 0) for m in layers)
    seen = []
    hooks = [m.register_forward_pre_hook(
        lambda m, a: seen.append(F.softplus(m.a_proj(a[0]) + m.dt_bias).flatten())) for m in layers]
    with torch.no_grad():
        net(mqar(tasks[-1], 32, seed=0).inputs)
    for h in hooks:
        h.remove()
    rates = torch.cat(seen)
    assert rates.min() > 0 and lo <= rates.median() <= hi
    with pytest.raises(ValueError, match="share"):
        initial_decay_rates(data, share=1.0)
    with pytest.raises(ValueError, match="mixers"):
        initial_decay_rates(data, mixers=("deltanet",))

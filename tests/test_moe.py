"""Mixture of experts: the batched form equals the per-token definition, routing invariants,
load statistics, input validation, and an oracle check against Hugging Face's DeepseekV3MoE."""

import pytest
import torch

from gpt2k3.layers.moe import MoE, MoEConfig, Router
from gpt2k3.layers.mlp import SwiGLU

BASE = dict(n_embd=16, n_routed_experts=8, n_shared_experts=1, top_k=2, d_expert=12,
            score_func="sigmoid", norm_topk_prob=True, routed_scaling_factor=2.5)


def make(seed=0, dtype=torch.float64, **overrides):
    torch.manual_seed(seed)
    model = MoE(MoEConfig(**{**BASE, **overrides})).to(dtype)
    with torch.no_grad():
        model.gate.e_score_correction_bias.copy_(0.1 * torch.randn(model.cfg.n_routed_experts))
    return model


VARIANTS = [
    dict(),
    dict(score_func="softmax", norm_topk_prob=False, routed_scaling_factor=1.0),
    dict(score_func="softmax", top_k=3),
    dict(n_shared_experts=0, top_k=1),
    dict(n_shared_experts=2, norm_topk_prob=False),
    dict(n_routed_experts=12, n_group=4, topk_group=2, top_k=4),
    dict(n_routed_experts=6, n_group=6, topk_group=3, top_k=2),  # groups of one expert
    dict(top_k=8),
]


@pytest.mark.parametrize("overrides", VARIANTS)
def test_vectorised_equals_loop_reference(overrides):
    model = make(**overrides)
    x = torch.randn(3, 7, model.cfg.n_embd, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(model(x), model.forward_loop_reference(x), rtol=0, atol=1e-12)


def test_gradients_flow_to_experts_and_router():
    model = make()
    x = torch.randn(2, 5, model.cfg.n_embd, dtype=torch.float64)
    model(x).square().sum().backward()
    assert model.gate.weight.grad is not None and model.gate.weight.grad.abs().sum() > 0
    used = torch.nonzero(model.last_load).flatten().tolist()
    for e in range(model.cfg.n_routed_experts):
        g = model.experts[e].down_proj.weight.grad
        assert (g is not None and g.abs().sum() > 0) == (e in used)


@pytest.mark.parametrize("score_func", ["softmax", "sigmoid"])
def test_normalised_weights_sum_to_scaling_factor(score_func):
    model = make(score_func=score_func, routed_scaling_factor=2.5, top_k=3)
    weights, indices = model.gate(torch.randn(50, model.cfg.n_embd, dtype=torch.float64))
    assert weights.shape == indices.shape == (50, 3)
    torch.testing.assert_close(weights.sum(-1), torch.full((50,), 2.5, dtype=torch.float64))
    assert (weights > 0).all()
    assert all(len(set(row)) == 3 for row in indices.tolist())  # distinct experts per token


def test_unnormalised_weights_are_scaled_scores():
    model = make(norm_topk_prob=False, routed_scaling_factor=3.0)
    x = torch.randn(20, model.cfg.n_embd, dtype=torch.float64)
    weights, indices = model.gate(x)
    torch.testing.assert_close(weights, 3.0 * model.gate.scores(x).gather(1, indices))


def test_correction_bias_changes_selection_not_weights():
    model = make()
    x = torch.randn(40, model.cfg.n_embd, dtype=torch.float64)
    scores = model.gate.scores(x)
    with torch.no_grad():
        model.gate.e_score_correction_bias.zero_()
        model.gate.e_score_correction_bias[5] = 10.0
    weights, indices = model.gate(x)
    assert (indices == 5).any(-1).all()  # the boosted expert is always chosen
    chosen = scores.gather(1, indices)
    torch.testing.assert_close(weights, 2.5 * chosen / chosen.sum(-1, keepdim=True))


def test_softmax_router_ignores_correction_bias():
    model = make(score_func="softmax")
    x = torch.randn(30, model.cfg.n_embd, dtype=torch.float64)
    before = model.gate(x)
    with torch.no_grad():
        model.gate.e_score_correction_bias.zero_()
        model.gate.e_score_correction_bias[0] = 100.0
    after = model.gate(x)
    torch.testing.assert_close(before, after, rtol=0, atol=0)


def test_group_limited_routing_uses_at_most_topk_group_groups():
    model = make(n_routed_experts=16, n_group=4, topk_group=2, top_k=4)
    _, indices = model.gate(torch.randn(200, model.cfg.n_embd, dtype=torch.float64))
    groups_used = [len({i // 4 for i in row}) for row in indices.tolist()]
    assert max(groups_used) <= 2


def test_load_stats():
    model = make(top_k=3)
    B, T = 4, 9
    x = torch.randn(B, T, model.cfg.n_embd, dtype=torch.float64)
    load = model.load_stats(x)
    assert load.shape == (model.cfg.n_routed_experts,)
    assert load.sum().item() == B * T * 3
    assert model.last_load is None
    model(x)
    assert torch.equal(model.last_load, load)


def test_update_bias_pushes_towards_balance():
    router = Router(MoEConfig(**BASE))
    router.update_bias(torch.tensor([10, 0, 5, 5, 5, 5, 5, 5]), step=0.01)
    b = router.e_score_correction_bias
    assert b[0] < 0 < b[1] and b[2] == 0


def test_swiglu_definition():
    torch.manual_seed(0)
    m = SwiGLU(6, 10).double()
    x = torch.randn(4, 6, dtype=torch.float64)
    g, u = x @ m.gate_proj.weight.T, x @ m.up_proj.weight.T
    torch.testing.assert_close(m(x), (g * torch.sigmoid(g) * u) @ m.down_proj.weight.T)
    assert all(mod.bias is None for mod in (m.gate_proj, m.up_proj, m.down_proj))


@pytest.mark.parametrize("field, value", [
    ("top_k", 9), ("top_k", 0), ("n_routed_experts", 0), ("n_embd", -2), ("d_expert", 0),
    ("n_shared_experts", -1), ("score_func", "relu"), ("routed_scaling_factor", 0.0),
    ("n_group", 3), ("topk_group", 2), ("norm_topk_prob", 1),
])
def test_config_rejects_bad_values(field, value):
    with pytest.raises(ValueError, match=field):
        MoEConfig(**{**BASE, field: value})


def test_group_config_rejects_too_few_eligible_experts():
    with pytest.raises(ValueError, match="top_k"):
        MoEConfig(**{**BASE, "n_group": 4, "topk_group": 1, "top_k": 3})


def test_bad_input_shape_raises():
    model = make()
    with pytest.raises(ValueError, match="n_embd"):
        model(torch.randn(2, 3, 5, dtype=torch.float64))
    with pytest.raises(ValueError, match="x must"):
        model.load_stats(torch.randn(6, model.cfg.n_embd, dtype=torch.float64))


def test_published_configs_are_valid():
    assert MoEConfig.deepseek_v3().n_routed_experts == 256
    assert MoEConfig.kimi_k2().n_routed_experts == 384


# ----------------------------------------------------------------------------- oracle
@pytest.mark.parametrize("n_group, topk_group, norm", [(1, 1, True), (4, 2, True), (4, 2, False)])
def test_matches_transformers_deepseek_v3_moe(n_group, topk_group, norm):
    transformers = pytest.importorskip("transformers")
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE

    E, k, D, I, S = 16, 3, 32, 24, 2
    hf_cfg = transformers.DeepseekV3Config(
        hidden_size=D, moe_intermediate_size=I, n_routed_experts=E, num_experts_per_tok=k,
        n_shared_experts=S, n_group=n_group, topk_group=topk_group, norm_topk_prob=norm,
        routed_scaling_factor=2.5, hidden_act="silu",
    )
    hf = DeepseekV3MoE(hf_cfg).eval()
    ours = make(seed=3, dtype=torch.float32, n_embd=D, n_routed_experts=E, n_shared_experts=S, top_k=k,
                d_expert=I, score_func="sigmoid", norm_topk_prob=norm, routed_scaling_factor=2.5,
                n_group=n_group, topk_group=topk_group)
    with torch.no_grad():
        hf.gate.weight.copy_(ours.gate.weight)
        hf.gate.e_score_correction_bias.copy_(ours.gate.e_score_correction_bias)
        for e, ex in enumerate(ours.experts):
            hf.experts.gate_up_proj[e].copy_(torch.cat([ex.gate_proj.weight, ex.up_proj.weight]))
            hf.experts.down_proj[e].copy_(ex.down_proj.weight)
        hf.shared_experts.load_state_dict(ours.shared_experts.state_dict(), strict=True)

        x = torch.randn(3, 10, D)
        expected = hf(x)
        got = ours(x)
        _, hf_w, hf_idx = hf.gate(x)
        our_w, our_idx = ours.gate(x.reshape(-1, D))
    # same experts per token (top-k order is unspecified), same weights
    hf_idx, perm = hf_idx.sort(-1)
    our_idx, our_perm = our_idx.sort(-1)
    assert torch.equal(our_idx, hf_idx)
    torch.testing.assert_close(our_w.gather(1, our_perm), hf_w.gather(1, perm), rtol=1e-6, atol=1e-6)
    assert torch.equal(ours.last_load, torch.bincount(hf_idx.flatten(), minlength=E))
    assert (got - expected).abs().max().item() < 1e-5
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- chapter 7
from gpt2k3.accounting import ArchSpec, count_params  # noqa: E402
from gpt2k3.archs import DEEPSEEK_V3, KIMI_K2  # noqa: E402


@pytest.mark.parametrize("score_func", ["softmax", "sigmoid"])
def test_assignment_is_the_dense_routing_matrix(score_func):
    model = make(score_func=score_func, top_k=3)
    x = torch.randn(30, model.cfg.n_embd, dtype=torch.float64)
    a = model.gate.assignment(x)
    weights, indices = model.gate(x)
    assert a.shape == (30, model.cfg.n_routed_experts)
    assert ((a > 0).sum(-1) == 3).all()
    torch.testing.assert_close(a.gather(1, indices), weights)
    torch.testing.assert_close(a.sum(-1), torch.full((30,), 2.5, dtype=torch.float64))
    assert torch.equal((a > 0).sum(0), model.load_stats(x[None]))


@pytest.mark.parametrize("spec, published", [(DEEPSEEK_V3, MoEConfig.deepseek_v3()),
                                             (KIMI_K2, MoEConfig.kimi_k2())],
                         ids=["DeepSeek-V3", "Kimi K2"])
def test_published_configs_agree_with_the_specs(spec, published):
    assert (published.n_embd, published.n_routed_experts, published.n_shared_experts,
            published.top_k, published.d_expert) == (
        spec.n_embd, spec.n_routed_experts, spec.n_shared_experts, spec.top_k, spec.d_expert)


def test_module_parameters_agree_with_the_accounting():
    spec = ArchSpec(name="small moe", vocab_size=50, n_layer=4, n_embd=16, n_head=2, d_ff=40,
                    bias=False, norm="rmsnorm", mlp="swiglu", position="rope",
                    n_routed_experts=8, n_shared_experts=2, top_k=3, d_expert=12, first_k_dense=1)
    layer = MoE(MoEConfig(n_embd=16, n_routed_experts=8, n_shared_experts=2, top_k=3, d_expert=12))
    c = count_params(spec)
    n_moe = spec.n_moe_layers
    assert c.detail["router"] == n_moe * layer.gate.weight.numel()
    assert c.detail["shared experts"] == n_moe * sum(p.numel() for p in layer.shared_experts.parameters())
    assert c.detail["routed experts"] == n_moe * sum(p.numel() for p in layer.experts.parameters())
    per_expert = sum(p.numel() for p in layer.experts[0].parameters())
    assert c.active_detail["routed experts"] == n_moe * 3 * per_expert


def test_routing_counts_invariants():
    from gpt2k3.book.figures import routing_counts

    r = routing_counts(n_experts=12, top_k=3, n_tokens=40, n_topics=5)
    w = torch.tensor(r["weights"])
    assert w.shape == (40, 12)
    assert ((w > 0).sum(-1) == 3).all()
    torch.testing.assert_close(w.sum(-1), torch.ones(40, dtype=w.dtype), rtol=0, atol=5e-4)
    assert r["load"] == (w > 0).sum(0).tolist() and sum(r["load"]) == 40 * 3
    assert r["mean_load"] == 10 and r["max_over_mean"] == max(r["load"]) / 10
    assert r["topic"] == sorted(r["topic"]) and set(r["topic"]) == set(range(5))
    # deterministic, and top_k re-routes the same tokens through the same router
    assert routing_counts(n_experts=12, top_k=3, n_tokens=40, n_topics=5) == r
    r1 = routing_counts(n_experts=12, top_k=1, n_tokens=40, n_topics=5)
    top1 = torch.tensor(r1["weights"]).argmax(-1)
    assert (w.gather(1, top1[:, None]) > 0).all()  # the best expert stays chosen at k = 3


def test_bias_balancing_evens_out_the_load():
    from gpt2k3.book.figures import routing_counts

    before = routing_counts(top_k=2)
    after = routing_counts(top_k=2, balance_steps=50)
    assert before["max_over_mean"] > 2 and before["load"].count(0) > 0
    assert after["max_over_mean"] < before["max_over_mean"] / 2
    assert after["load"].count(0) == 0


@pytest.mark.parametrize("kwargs, field", [
    (dict(top_k=20), "top_k"), (dict(n_experts=0), "n_experts"), (dict(n_tokens=2, n_topics=3), "n_topics"),
    (dict(balance_steps=-1), "balance_steps"), (dict(seed=1.5), "seed"),
])
def test_routing_counts_validates(kwargs, field):
    from gpt2k3.book.figures import routing_counts

    with pytest.raises(ValueError, match=field):
        routing_counts(**kwargs)


def test_routing_figures_carry_each_steps_routing():
    from gpt2k3.book.figures import moe_balancing, moe_routing, routing_counts

    fig = moe_routing(top_ks=(1, 4), active=0, n_tokens=24)
    (slider,) = fig.layout.sliders
    assert [s.label for s in slider.steps] == ["1", "4"]
    for step, k in zip(slider.steps, (1, 4)):
        data, layout = step.args[:2]
        r = routing_counts(top_k=k, n_tokens=24)
        assert data["y"][1] == r["load"]
        assert data["y"][2] == [r["mean_load"]] * 2
        assert len(data["x"][0]) == len(data["y"][0]) == 24 * k  # one square per choice
        assert data["marker.color"][0] == [w for row in r["weights"] for w in row if w > 0]
        assert f"top-k = {k}" in layout["title.text"]
    assert list(fig.data[1].y) == slider.steps[0].args[0]["y"][1]
    single = moe_routing(top_ks=(3,))
    assert not single.layout.sliders and sum(single.data[1].y) == 48 * 3
    bal = moe_balancing(rounds=(0, 50))
    loads = [s.args[0]["y"][1] for s in bal.layout.sliders[0].steps]
    assert max(loads[1]) < max(loads[0])
    for bad in (dict(top_ks=()), dict(top_k=2)):
        with pytest.raises(ValueError):
            moe_routing(**bad)
    with pytest.raises(ValueError, match="balance_steps"):
        moe_balancing(balance_steps=3)


def test_routing_explorer_redraws_and_reports_bad_settings():
    import plotly.graph_objects as go

    from gpt2k3.book.widgets import routing_explorer

    box = routing_explorer()
    c = box.controls
    assert "top-k = 2" in box.current.layout.title.text
    c["balance_steps"].value = 30
    assert isinstance(box.current, go.Figure) and "idle experts: 0" in box.current.layout.title.text
    c["n_experts"].value = 4
    c["top_k"].value = 6  # more experts per token than exist: the slider's range follows
    assert c["top_k"].max == 4 and c["top_k"].value == 4
    assert isinstance(box.current, go.Figure) and "top-k = 4" in box.current.layout.title.text
    # a setting the render rejects is shown as a message, never as the stale figure
    box.render = lambda **kw: (_ for _ in ()).throw(ValueError("top_k must be <= n_experts"))
    box.redraw()
    assert "top_k" in box.current.value


# ------------------------------------------------------------------ Quantile Balancing
from gpt2k3.layers.moe import (dispatch, dispatch_dense, quantile_bias,  # noqa: E402
                               quantile_bias_histogram, quantile_bias_reference)


def _skewed_scores(m, n, skew, g, dtype=torch.float64):
    u = torch.randn(n, generator=g, dtype=dtype)
    return lambda: torch.sigmoid(skew * u + torch.randn(m, n, generator=g, dtype=dtype))


def _load(s, b, k):
    return torch.bincount((s + b).topk(k, dim=-1).indices.flatten(), minlength=s.shape[1])


def test_quantile_balancing_worked_example_balances_4310_to_2222():
    """The report's Fig. 5 shape: 8 tokens, 4 experts, k = 1."""
    from gpt2k3.book.figures.k3_adds import QB_EXAMPLE_SCORES, qb_worked_example

    s = torch.tensor(QB_EXAMPLE_SCORES, dtype=torch.float64)
    b = torch.zeros(4, dtype=torch.float64)
    assert _load(s, b, 1).tolist() == [4, 3, 1, 0]
    new = quantile_bias(s, b, 1)
    assert _load(s, new, 1).tolist() == [2, 2, 2, 2]
    torch.testing.assert_close(new, torch.tensor([-0.1375, -0.0375, 0.0625, 0.1125], dtype=torch.float64))
    torch.testing.assert_close(new, quantile_bias_reference(s, b, 1))
    assert abs(float(new.sum())) < 1e-12                      # mean-centred
    ex = qb_worked_example()
    assert ex["load_before"] == [4, 3, 1, 0] and ex["load_after"] == [2, 2, 2, 2]
    # each expert's threshold is its 3rd largest margin: exactly q = m k / n = 2 stay above it
    threshold = ex["margins"].sort(0, descending=True).values[2]
    assert ((ex["margins"] > threshold).sum(0) == 2).all()
    torch.testing.assert_close(new, threshold.mean() - threshold)


@pytest.mark.parametrize("m, n, k", [(64, 8, 2), (100, 12, 3), (37, 5, 1), (256, 64, 4)])
def test_quantile_bias_fast_equals_reference_and_histogram_within_a_bin(m, n, k):
    g = torch.Generator().manual_seed(m + n + k)
    s = _skewed_scores(m, n, 1.0, g)()
    b = 0.05 * torch.randn(n, generator=g, dtype=torch.float64)
    exact = quantile_bias(s, b, k)
    torch.testing.assert_close(exact, quantile_bias_reference(s, b, k), rtol=0, atol=1e-15)
    for bins in (64, 512):
        width = float((1 - b.min()) - (-1 - b.max())) / bins
        est = quantile_bias_histogram(s, b, k, bins)
        # each threshold within one bin; centring moves every bias by the same mean error
        assert float((est - exact).abs().max()) <= 2 * width
        assert abs(float(est.sum())) < 1e-9


def test_quantile_balancing_balances_a_skewed_router_where_the_sign_rule_does_not():
    """64 experts, top-4, fresh batches: a few QB updates bring max/mean load near 1; the
    sign rule at DeepSeek-V3's step (0.001) has hardly moved."""
    n, k, m = 64, 4, 4096
    g = torch.Generator().manual_seed(0)
    batch = _skewed_scores(m, n, 1.5, g)
    router = Router(MoEConfig(n_embd=1, n_routed_experts=n, n_shared_experts=0, top_k=k,
                              d_expert=1)).double()
    qb = hb = torch.zeros(n, dtype=torch.float64)
    q = m * k / n
    first = None
    for _ in range(5):
        s = batch()
        ld_qb, ld_hb = _load(s, qb, k), _load(s, hb, k)
        ld_sign = _load(s, router.e_score_correction_bias, k)
        first = first or float(ld_sign.max()) / q
        qb = quantile_bias(s, qb, k)
        hb = quantile_bias_histogram(s, hb, k, 256)   # the histogram form balances as well
        router.update_bias(ld_sign, 1e-3)
    assert first > 3
    for ld in (ld_qb, ld_hb):
        assert float(ld.max()) / q < 1.4 and int((ld == 0).sum()) == 0  # sampling noise: ~1.2
    assert float(ld_sign.max()) / q > 3 and int((ld_sign == 0).sum()) > 0


@pytest.mark.parametrize("call, match", [
    (lambda s, b: quantile_bias(s[0], b, 2), "scores"),
    (lambda s, b: quantile_bias(s, b[:-1], 2), "bias"),
    (lambda s, b: quantile_bias(s, b, 0), "k"),
    (lambda s, b: quantile_bias(s, b, 8), "k"),
    (lambda s, b: quantile_bias(s, b, True), "k"),
    (lambda s, b: quantile_bias(s.long(), b, 2), "scores"),
    (lambda s, b: quantile_bias(s[:0], b, 2), "scores"),
    (lambda s, b: quantile_bias(s.index_fill(0, torch.tensor([1]), float("nan")), b, 2), "finite"),
    (lambda s, b: quantile_bias_reference(s, b.fill_(float("inf")), 2), "finite"),
    (lambda s, b: quantile_bias_histogram(s, b, 2, 1), "bins"),
    (lambda s, b: quantile_bias_histogram(s, b, 2, 2.5), "bins"),
])
def test_quantile_bias_front_doors(call, match):
    s, b = torch.rand(16, 8, dtype=torch.float64), torch.zeros(8, dtype=torch.float64)
    with pytest.raises(ValueError, match=match):
        call(s, b)


@pytest.mark.parametrize("step", [float("nan"), float("inf"), -1e-3, 0.0, "0.001", True])
def test_update_bias_refuses_a_bad_step_and_keeps_the_bias(step):
    router = Router(MoEConfig(**BASE))
    with pytest.raises(ValueError, match="step"):
        router.update_bias(torch.tensor([10, 0, 5, 5, 5, 5, 5, 5]), step=step)
    assert torch.equal(router.e_score_correction_bias, torch.zeros(8))


def test_update_bias_refuses_a_load_of_the_wrong_shape():
    router = Router(MoEConfig(**BASE))
    with pytest.raises(ValueError, match="load"):
        router.update_bias(torch.ones(7), step=0.01)


def test_dense_dispatch_equals_the_sorted_dispatch():
    """The decode step's form (every expert on every token, no host read) equals the batched one."""
    model = make()
    x = torch.randn(20, model.cfg.n_embd, dtype=torch.float64)
    with torch.no_grad():
        w, i = model.gate(x)
        torch.testing.assert_close(dispatch_dense(x, w, i, model.experts),
                                   dispatch(x, w, i, model.experts), rtol=0, atol=1e-12)
        one = x[:1]                                  # 2 routes < 8 experts: dispatch goes dense
        w1, i1 = model.gate(one)
        torch.testing.assert_close(dispatch(one, w1, i1, model.experts),
                                   model.forward_loop_reference(one[None])[0] -
                                   model.shared_experts(one), rtol=0, atol=1e-12)

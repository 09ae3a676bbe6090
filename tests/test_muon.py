"""Muon and QK-clip against their formulas written out; the one training loop's optimizer choice.

* Newton--Schulz: the quintic maps each singular value by itself, keeps the singular vectors,
  and five steps put every singular value of at least ``||G||_F / 500`` in ``NS_BAND``.
* One and two Muon steps on a small matrix equal a hand-written float64 computation (Nesterov
  momentum, Moonshot's ``0.2 sqrt(max(A, B))`` scale, decoupled weight decay); the AdamW groups
  equal ``torch.optim.AdamW``.
* QK-clip: the recorded per-head maxima are the causal logits' maxima; after the clip the same
  inputs give logits at most ``tau``; heads under ``tau`` are not touched.
* ``fit`` with AdamW is bit-identical to the loop it replaced; with Muon and QK-clip it is
  ``train_step`` then ``qk_clip``.
"""

import math

import numpy as np
import pytest
import torch
import torch.nn as nn

from gpt2k3.experiments import corpus, muon, text_lm, train
from gpt2k3.experiments.muon import NS_BAND, MaxLogits, Muon, newton_schulz, qk_clip
from gpt2k3.experiments.text_lm import TextModelConfig
from gpt2k3.layers.attention import CausalSelfAttention

A, B, C = muon.NS_COEFFICIENTS
TINY = TextModelConfig(n_layer=2, n_embd=32, n_head=2, context=32, max_context=64)
DATA = corpus.encode("In the beginning God created the heaven and the earth. " * 60, torch.uint8)


def quintic(x: np.ndarray, steps: int = 5) -> np.ndarray:
    for _ in range(steps):
        x = A * x + B * x ** 3 + C * x ** 5
    return x


def ns_by_hand(G: np.ndarray, steps: int = 5) -> np.ndarray:
    """The iteration written out in float64: X <- a X + b (X X^T) X + c (X X^T)^2 X."""
    X = G.T if G.shape[0] > G.shape[1] else G
    X = X / (np.linalg.norm(X) + 1e-7)
    for _ in range(steps):
        S = X @ X.T
        X = A * X + B * S @ X + C * S @ S @ X
    return X.T if G.shape[0] > G.shape[1] else X


byte_loss = text_lm.byte_loss


def batches(seed=7, batch=4):
    gen = torch.Generator().manual_seed(seed)
    return lambda s: corpus.sample_batch(DATA, batch, TINY.context, gen)


# ------------------------------------------------------------------ Newton-Schulz
@pytest.mark.parametrize("shape", [(6, 10), (10, 6), (8, 8)])
def test_newton_schulz_maps_each_singular_value_and_keeps_the_vectors(shape):
    gen = torch.Generator().manual_seed(0)
    U, _ = torch.linalg.qr(torch.randn(shape[0], shape[0], generator=gen, dtype=torch.float64))
    V, _ = torch.linalg.qr(torch.randn(shape[1], shape[1], generator=gen, dtype=torch.float64))
    k = min(shape)
    s = torch.logspace(0, -2.5, k, dtype=torch.float64)  # spread over 2.5 decades
    G = U[:, :k] @ torch.diag(s) @ V[:, :k].T
    expected = U[:, :k] @ torch.diag(torch.from_numpy(quintic((s / s.norm()).numpy()))) @ V[:, :k].T
    out = newton_schulz(G.float()).double()
    assert out.dtype == torch.float64 and out.shape == shape
    assert (out - expected).abs().max() < 1e-5
    assert np.abs(ns_by_hand(G.numpy()) - expected.numpy()).max() < 1e-6  # the 1e-7 guard


def test_the_quintic_band_measured_on_the_scalar_map():
    x = np.logspace(np.log10(1 / 500), 0, 400_001)
    y = quintic(x)
    assert NS_BAND[0] <= y.min() and y.max() <= NS_BAND[1]
    assert y.min() < NS_BAND[0] + 0.01 and y.max() > NS_BAND[1] - 0.01  # the band is tight
    assert quintic(np.array([1 / 1000]))[0] < NS_BAND[0]  # smaller ones are not lifted as far


@pytest.mark.parametrize("shape", [(32, 96), (96, 32), (128, 384), (64, 256), (16, 16)])
def test_random_matrices_come_out_approximately_orthogonal(shape):
    G = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
    s0 = torch.linalg.svdvals(G)
    assert s0.min() / G.norm() >= 1 / 500 or shape == (16, 16)
    s = torch.linalg.svdvals(newton_schulz(G))
    if s0.min() / G.norm() >= 1 / 500:
        assert NS_BAND[0] <= s.min() and s.max() <= NS_BAND[1]


# ------------------------------------------------------------------ one Muon step, by hand
def test_two_muon_steps_equal_the_formula_written_out():
    gen = torch.Generator().manual_seed(3)
    W0 = torch.randn(3, 5, generator=gen, dtype=torch.float64)
    G1 = torch.randn(3, 5, generator=gen, dtype=torch.float64)
    G2 = torch.randn(3, 5, generator=gen, dtype=torch.float64)
    lr, wd, mu = 0.02, 0.1, 0.95
    w = nn.Parameter(W0.float().clone())
    opt = Muon([{"params": [w], "muon": True}], lr=lr, weight_decay=wd, momentum=mu)
    for g in (G1, G2):
        w.grad = g.float().clone()
        opt.step()
    # by hand, float64: buf <- mu buf + (1 - mu) g; Nesterov: (1 - mu) g + mu buf
    scale = 0.2 * math.sqrt(5)
    W, buf = W0.numpy().copy(), np.zeros((3, 5))
    for g in (G1.numpy(), G2.numpy()):
        buf = mu * buf + (1 - mu) * g
        O = ns_by_hand((1 - mu) * g + mu * buf)
        W = W * (1 - lr * wd) - lr * scale * O
    assert np.abs(w.detach().double().numpy() - W).max() < 1e-6
    assert torch.equal(w.grad, G2.float())  # the step leaves the gradient as it was


def test_without_nesterov_the_buffer_itself_is_orthogonalised():
    g = torch.randn(4, 3, generator=torch.Generator().manual_seed(4))
    buf = torch.zeros_like(g)
    out = muon.muon_direction(g, buf, 0.9, nesterov=False)
    assert torch.allclose(buf, 0.1 * g)
    assert torch.allclose(out, newton_schulz(0.1 * g), atol=1e-6)
    assert muon.rms_match((4, 3)) == pytest.approx(0.2 * 2.0)


def test_moonshots_sum_form_of_the_momentum_gives_the_same_directions():
    """Moonshot writes M <- mu M + g and orthogonalises mu M + g (Nesterov); the reference's
    average is that times (1 - mu) at every step, which the normalisation removes."""
    gen = torch.Generator().manual_seed(5)
    mu, buf, M = 0.95, torch.zeros(6, 4), torch.zeros(6, 4)
    for _ in range(4):
        g = torch.randn(6, 4, generator=gen)
        ours = muon.muon_direction(g, buf, mu)
        M = mu * M + g
        assert torch.allclose(ours, newton_schulz(mu * M + g), atol=1e-5)


def test_the_adamw_groups_equal_torch_adamw():
    gen = torch.Generator().manual_seed(5)
    init = [torch.randn(4, 3, generator=gen), torch.randn(3, generator=gen)]
    grads = [[torch.randn_like(t) for t in init] for _ in range(4)]
    ours = [nn.Parameter(t.clone()) for t in init]
    ref = [nn.Parameter(t.clone()) for t in init]
    opt_a = Muon([{"params": ours, "muon": False}], lr=0.01, weight_decay=0.1, betas=(0.9, 0.95))
    opt_b = torch.optim.AdamW(ref, lr=0.01, weight_decay=0.1, betas=(0.9, 0.95))
    for gs in grads:
        for p, q, g in zip(ours, ref, gs):
            p.grad, q.grad = g.clone(), g.clone()
        opt_a.step()
        opt_b.step()
    for p, q in zip(ours, ref):
        assert (p - q).abs().max() < 1e-6


def test_the_param_group_rule_on_the_byte_level_gpt2():
    net = text_lm.build_model("softmax", TINY, 0)
    groups = muon.muon_param_groups(net, 0.1)
    names = {id(p): n for n, p in net.named_parameters()}
    hidden = sorted(names[id(p)] for p in groups[0]["params"])
    assert groups[0]["muon"] and hidden == sorted(
        f"transformer.h.{i}.{m}.weight" for i in range(2)
        for m in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"))
    matrices = {names[id(p)] for p in groups[1]["params"]}
    assert matrices == {"transformer.wte.weight", "transformer.wpe.weight"}  # wte is the tied head
    assert not groups[1]["muon"] and groups[1]["weight_decay"] == 0.1
    assert all(p.dim() == 1 for p in groups[2]["params"]) and groups[2]["weight_decay"] == 0.0
    seen = [id(p) for g in groups for p in g["params"]]
    assert sorted(seen) == sorted(id(p) for p in net.parameters())  # each exactly once


@pytest.mark.parametrize("kwargs, match", [
    (dict(lr=0.0), "lr"), (dict(lr=math.nan), "lr"), (dict(weight_decay=-1.0), "weight_decay"),
    (dict(momentum=1.0), "momentum"), (dict(momentum=-0.1), "momentum"),
    (dict(nesterov="yes"), "nesterov"), (dict(ns_steps=0), "ns_steps"),
    (dict(betas=(0.9,)), "betas"), (dict(betas=(1.0, 0.9)), "betas"), (dict(eps=0.0), "eps"),
])
def test_bad_settings_are_refused_by_the_constructor(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Muon([nn.Parameter(torch.zeros(2, 2))], **kwargs)


def test_bad_groups_are_refused_by_the_constructor():
    with pytest.raises(ValueError, match="2-D"):
        Muon([{"params": [nn.Parameter(torch.zeros(3))], "muon": True}])
    with pytest.raises(ValueError, match="params"):
        Muon([])
    with pytest.raises(ValueError, match="params"):
        Muon([1.0, 2.0])
    with pytest.raises(ValueError, match="muon"):
        Muon([{"params": [nn.Parameter(torch.zeros(2, 2))], "muon": "yes"}])
    with pytest.raises(ValueError, match="lr"):
        Muon([{"params": [nn.Parameter(torch.zeros(2, 2))], "lr": -1.0}])
    with pytest.raises(ValueError, match="G"):
        newton_schulz(torch.zeros(3))
    with pytest.raises(ValueError, match="steps"):
        newton_schulz(torch.zeros(2, 2), steps=0)
    with pytest.raises(ValueError, match="net"):
        muon.muon_param_groups("net", 0.1)
    with pytest.raises(ValueError, match="net"):
        MaxLogits(nn.Linear(2, 2))

    class Rotated(CausalSelfAttention):  # a subclass may change q and k after c_attn
        pass

    net = text_lm.build_model("softmax", TINY, 0)
    net.transformer.h[0].attn = Rotated(net.config)
    with pytest.raises(ValueError, match="CausalSelfAttention"):
        MaxLogits(net)


# ------------------------------------------------------------------ QK-clip
def _loud(net, factor=30.0):
    """Scale every layer's query and key weights up, so that the logits are large."""
    with torch.no_grad():
        for block in net.transformer.h:
            C = block.attn.n_embd
            block.attn.c_attn.weight[:2 * C] *= factor
    return net


def _layer_inputs(net, idx):
    """Each attention layer's c_attn input for ``idx``, from a forward pass that builds a graph."""
    seen = []
    hooks = [b.attn.c_attn.register_forward_hook(lambda m, i, o: seen.append(i[0].detach()))
             for b in net.transformer.h]
    net(idx)
    for h in hooks:
        h.remove()
    return seen


def _logits_by_loops(layer, x):
    """Every causal logit of one layer, head by head, query by query: (H, B, T, T) with -inf."""
    q, k, _ = layer.c_attn(x).split(layer.n_embd, dim=2)
    H, D = layer.n_head, layer.n_embd // layer.n_head
    out = torch.full((H, x.shape[0], x.shape[1], x.shape[1]), -math.inf)
    for h in range(H):
        for i in range(x.shape[1]):
            for j in range(i + 1):
                qi, kj = q[:, i, h * D:(h + 1) * D], k[:, j, h * D:(h + 1) * D]
                out[h, :, i, j] = (qi * kj).sum(-1) / math.sqrt(D)
    return out


def test_recorded_maxima_are_the_causal_logits_maxima():
    net = _loud(text_lm.build_model("softmax", TINY, 0))
    idx = corpus.sample_batch(DATA, 2, TINY.context, torch.Generator().manual_seed(0))[0]
    with MaxLogits(net) as logits:
        xs = _layer_inputs(net, idx)
        for layer, s_max, x in zip(logits.layers, logits.latest, xs):
            with torch.no_grad():
                ref = _logits_by_loops(layer, x).amax(dim=(1, 2, 3))
            assert torch.allclose(s_max, ref, rtol=1e-5)
        before = [s.clone() for s in logits.latest]
        with torch.no_grad():
            net(idx[:, :5])  # an evaluation pass: not recorded
        assert all(torch.equal(a, b) for a, b in zip(before, logits.latest))
        assert logits.overall() == max(float(s.max()) for s in before)
    assert not net.transformer.h[0].attn.c_attn._forward_hooks  # closed


def test_after_the_clip_the_same_inputs_give_logits_at_most_tau():
    net = _loud(text_lm.build_model("softmax", TINY, 0))
    idx = corpus.sample_batch(DATA, 2, TINY.context, torch.Generator().manual_seed(0))[0]
    with MaxLogits(net) as logits:
        xs = _layer_inputs(net, idx)
        s_max = [s.clone() for s in logits.latest]
    tau = float(torch.cat(s_max).median())  # some heads above, some below
    weights = [b.attn.c_attn.weight.detach().clone() for b in net.transformer.h]
    gammas = qk_clip(logits, tau)
    for layer, x, s, gamma, w in zip(logits.layers, xs, s_max, gammas, weights):
        with torch.no_grad():
            after = muon.head_max_logits(layer.c_attn(x), layer.n_head)
        assert (after <= tau * (1 + 1e-5)).all()
        clipped = s > tau
        assert torch.allclose(after[clipped], torch.full_like(after[clipped], tau), rtol=1e-5)
        assert torch.allclose(after[~clipped], s[~clipped], rtol=1e-6)  # untouched heads
        assert torch.allclose(gamma, torch.where(clipped, tau / s, torch.ones_like(s)))
        C, D = layer.n_embd, layer.n_embd // layer.n_head
        for h in torch.nonzero(~clipped).flatten().tolist():  # their rows are bit-identical
            rows = [r for part in (0, C) for r in range(part + h * D, part + (h + 1) * D)]
            assert torch.equal(layer.c_attn.weight[rows], w[rows])
        assert torch.equal(layer.c_attn.weight[2 * C:], w[2 * C:])  # values never change
    assert any(bool((s > tau).any()) for s in s_max) and any(bool((s <= tau).any()) for s in s_max)


def test_qk_clip_refuses_bad_input():
    net = text_lm.build_model("softmax", TINY, 0)
    with MaxLogits(net) as logits:
        with pytest.raises(ValueError, match="forward pass"):
            qk_clip(logits, 1.0)
        net(torch.zeros(1, 4, dtype=torch.long))
        for tau in (0.0, -1.0, math.nan, math.inf, "1"):
            with pytest.raises(ValueError, match="tau"):
                qk_clip(logits, tau)
    with pytest.raises(ValueError, match="logits"):
        qk_clip("logits", 1.0)


# ------------------------------------------------------------------ the one training loop
def _old_fit(net, config, batch_at, n_steps):
    """The loop before the optimizer choice, kept here as the reference: AdamW built inline."""
    decay = [p for p in net.parameters() if p.dim() >= 2]
    no_decay = [p for p in net.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": config.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=config.lr, betas=config.betas)
    net.train()
    return [train.train_step(net, opt, byte_loss, batch_at(s), config.lr_at(s), config.grad_clip)
            for s in range(n_steps)]


def test_adamw_through_the_new_choice_is_bit_identical():
    cfg = train.TrainSettings(steps=12, warmup=2, batch_size=4)
    assert cfg.optimizer == "adamw" and cfg.qk_clip is None
    a, b = text_lm.build_model("softmax", TINY, 0), text_lm.build_model("softmax", TINY, 0)
    losses, _ = train.fit(a, cfg, batches(), byte_loss, 12)
    assert losses == _old_fit(b, cfg, batches(), 12)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert isinstance(train.make_optimizer(a, cfg), torch.optim.AdamW)


def test_fit_with_muon_and_qk_clip_is_train_step_then_the_clip():
    cfg = train.TrainSettings(steps=3, warmup=1, batch_size=4, lr=1e-2, optimizer="muon",
                              qk_clip=0.5)
    a, b = (_loud(text_lm.build_model("softmax", TINY, 0), 10.0) for _ in range(2))
    losses, _ = train.fit(a, cfg, batches(), byte_loss, 3)
    opt, batch_at, by_hand = train.make_optimizer(b, cfg), batches(), []
    assert isinstance(opt, Muon)
    b.train()
    with MaxLogits(b) as logits:
        for s in range(3):
            by_hand.append(train.train_step(b, opt, byte_loss, batch_at(s), cfg.lr_at(s),
                                            cfg.grad_clip))
            gammas = qk_clip(logits, 0.5)
    assert losses == by_hand and any(bool((g < 1).any()) for g in gammas)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert not a.transformer.h[0].attn.c_attn._forward_hooks  # fit removed its recorder


def test_muon_trains_the_byte_model():
    cfg = train.TrainSettings(steps=25, warmup=3, batch_size=4, lr=1e-2, optimizer="muon")
    net = text_lm.build_model("softmax", TINY, 0)
    losses, _ = train.fit(net, cfg, batches(), byte_loss, 25)
    assert all(math.isfinite(x) for x in losses) and losses[-1] < 0.6 * losses[0]


@pytest.mark.parametrize("kwargs, match", [
    (dict(optimizer="sgd"), "optimizer"), (dict(optimizer=None), "optimizer"),
    (dict(qk_clip=0.0), "qk_clip"), (dict(qk_clip=-1.0), "qk_clip"),
    (dict(qk_clip=math.nan), "qk_clip"), (dict(qk_clip="100"), "qk_clip"),
])
def test_train_settings_check_the_new_fields(kwargs, match):
    with pytest.raises(ValueError, match=match):
        train.TrainSettings(**kwargs)
    with pytest.raises(ValueError, match=match):
        text_lm.TextTrainConfig(**kwargs)


def test_fit_refuses_a_recorder_that_is_not_one():
    with pytest.raises(ValueError, match="logits"):
        train.fit(text_lm.build_model("softmax", TINY, 0), train.TrainSettings(steps=1, warmup=0),
                  batches(), byte_loss, 1, logits="not a recorder")


def test_step_flops_count_the_iteration_by_its_formula():
    """Per step of the quintic on an a x b matrix (a <= b): X X^T, its square and the product
    with X, 2 a^2 b + 2 a^3 + 2 a^2 b floating-point operations."""
    net = text_lm.build_model("softmax_conv", TINY, 0)
    x = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))
    out = muon.step_flops(net, text_lm.byte_loss, (x, x))
    shapes = [tuple(p.shape) for g in muon.muon_param_groups(net, 0.0) if g["muon"] for p in g["params"]]
    by_formula = sum(muon.NS_STEPS * (4 * min(s) ** 2 * max(s) + 2 * min(s) ** 3) for s in shapes)
    assert out["newton_schulz"] == by_formula
    assert out["forward_backward"] > 0


# ------------------------------------------------------------------ Per-Head Muon
def ns_whole_before_per_head(G, steps=5):
    """``newton_schulz`` as it was before it took ``heads``: one matrix, one norm."""
    X = G.to(torch.float32)
    tall = X.shape[0] > X.shape[1]
    if tall:
        X = X.T
    X = X / (X.norm() + 1e-7)
    for _ in range(steps):
        S = X @ X.T
        X = A * X + (B * S + C * S @ S) @ X
    return X.T if tall else X


@pytest.mark.parametrize("shape, heads", [((96, 20), 12), ((120, 16), 3), ((24, 24), 4)])
def test_per_head_newton_schulz_orthogonalises_each_block_on_its_own(shape, heads):
    gen = torch.Generator().manual_seed(1)
    G = torch.randn(shape, generator=gen)
    G[: shape[0] // heads] *= 100.0  # one loud head: it must not change the others
    blocks = torch.cat([newton_schulz(b) for b in G.split(shape[0] // heads)])
    assert torch.equal(newton_schulz(G, heads=heads), blocks)


@pytest.mark.parametrize("shape", [(384, 128), (128, 384), (40, 40)])
def test_one_head_is_the_whole_matrix_as_before(shape):
    G = torch.randn(shape, generator=torch.Generator().manual_seed(2))
    assert torch.equal(newton_schulz(G, heads=1), ns_whole_before_per_head(G))
    assert torch.equal(newton_schulz(G), newton_schulz(G, heads=1))


def test_newton_schulz_refuses_heads_that_do_not_divide_the_rows():
    with pytest.raises(ValueError, match="heads"):
        newton_schulz(torch.zeros(6, 4), heads=4)
    with pytest.raises(ValueError, match="heads"):
        newton_schulz(torch.zeros(6, 4), heads=0)
    with pytest.raises(ValueError, match="heads"):
        Muon([{"params": [nn.Parameter(torch.zeros(6, 4))], "muon": True, "heads": 4}])


TORCH_MUON = muon.TORCH_MUON_CHECK


def _one_step_each(shape, patch=None, steps=1):
    """The book's whole-matrix Muon and ``torch.optim.Muon`` (``adjust_lr_fn="match_rms_adamw"``,
    the rest at ``TORCH_MUON``) from the same matrix on the same gradients: both moves."""
    gen = torch.Generator().manual_seed(3)
    w0 = 0.1 * torch.randn(shape, generator=gen)
    ours, theirs = nn.Parameter(w0.clone()), nn.Parameter(w0.clone())
    opt_a = Muon([{"params": [ours], "muon": True}], **TORCH_MUON)
    opt_b = torch.optim.Muon([theirs], adjust_lr_fn="match_rms_adamw", **TORCH_MUON)
    for _ in range(steps):
        g = torch.randn(shape, generator=gen)
        ours.grad, theirs.grad = g.clone(), g.clone()
        opt_a.step()
        opt_b.step()
    assert torch.equal(opt_a.state[ours]["momentum_buffer"], opt_b.state[theirs]["momentum_buffer"])
    return (ours - w0).detach(), (theirs - w0).detach()


@pytest.mark.parametrize("shape", muon.TORCH_MUON_SHAPES)
def test_whole_matrix_muon_equals_torch_optim_muon(shape):
    """torch 2.13's Muon with ``adjust_lr_fn="match_rms_adamw"`` (its default, ``None``, scales
    by ``sqrt(max(1, A / B))`` instead), Nesterov momentum 0.95, weight decay 0.1, five steps of
    the same quintic: the same buffer bit for bit, the same step within the bfloat16 that torch
    runs Newton--Schulz in (3 % of the largest entry; cosine above 0.9995)."""
    ours, theirs = _one_step_each(shape)
    assert (ours - theirs).abs().max() < muon.TORCH_MUON_TOLERANCE * ours.abs().max()
    assert torch.nn.functional.cosine_similarity(ours.flatten(), theirs.flatten(), dim=0) > 0.9995


def test_with_torchs_own_iteration_the_rest_of_the_step_is_exact(monkeypatch):
    """Swap torch's bfloat16 Newton--Schulz into the book's optimizer: momentum, Nesterov
    look-ahead, scale and decoupled weight decay then agree to float32 rounding, two steps."""
    from torch.optim._muon import _zeropower_via_newtonschulz

    monkeypatch.setattr(muon, "newton_schulz", lambda G, steps, heads=1: _zeropower_via_newtonschulz(
        G, muon.NS_COEFFICIENTS, steps, 1e-7).float())
    ours, theirs = _one_step_each((64, 32), steps=2)
    assert (ours - theirs).abs().max() < 1e-6


def test_per_head_groups_cut_c_attn_into_its_q_k_v_heads():
    net = text_lm.build_model("softmax", TINY, 0)
    whole = muon.muon_param_groups(net, 0.1)
    split = muon.muon_param_groups(net, 0.1, per_head=True)
    names = {id(p): n for n, p in net.named_parameters()}
    head_group = [g for g in split if g.get("heads", 1) > 1]
    assert len(head_group) == 1 and head_group[0]["heads"] == 3 * TINY.n_head
    assert sorted(names[id(p)] for p in head_group[0]["params"]) == [
        f"transformer.h.{i}.attn.c_attn.weight" for i in range(2)]
    assert {id(p) for g in split for p in g["params"]} == {id(p) for g in whole for p in g["params"]}
    with pytest.raises(ValueError, match="per_head"):
        muon.muon_param_groups(net, 0.1, per_head="yes")


def test_one_per_head_step_is_each_block_orthogonalised_and_scaled_on_its_own():
    gen = torch.Generator().manual_seed(4)
    w0, g = 0.1 * torch.randn(48, 16, generator=gen), torch.randn(48, 16, generator=gen)
    w = nn.Parameter(w0.clone())
    opt = Muon([{"params": [w], "muon": True, "heads": 6}], lr=0.01, weight_decay=0.1)
    w.grad = g.clone()
    opt.step()
    update = g.lerp(0.05 * g, 0.95)  # Nesterov look-ahead from a zero buffer: buf = 0.05 g
    blocks = torch.cat([newton_schulz(b) for b in update.split(8)])
    expected = w0 * (1 - 0.01 * 0.1) - 0.01 * muon.rms_match((8, 16)) * blocks
    assert (w.detach() - expected).abs().max() < 1e-6


@pytest.mark.parametrize("loud, whole_spread", [(100.0, 1.5), (1e4, 50.0)])
def test_per_head_steps_give_every_head_the_same_scale(loud, whole_spread):
    """The report's argument in numbers: one head's momentum ``loud`` times the others'. The
    whole-matrix step gives the loud head about twice the others' RMS; past the quintic's reach
    (singular values under ``||G||_F / 500``) the quiet heads' steps shrink as well. Per head,
    every block's RMS is 0.2 within the quintic's band."""
    gen = torch.Generator().manual_seed(5)
    update = torch.randn(96, 32, generator=gen)
    update[:8] *= loud
    rms = muon.head_update_rms(update, 12)
    assert rms["input"].max() / rms["input"].min() > loud / 2
    assert rms["whole"].max() / rms["whole"].min() > whole_spread
    lo, hi = NS_BAND
    assert ((rms["per_head"] > 0.2 * lo) & (rms["per_head"] < 0.2 * hi)).all()


def test_fit_with_per_head_muon_trains_the_byte_model():
    net = text_lm.build_model("softmax", TINY, 0)
    cfg = train.TrainSettings(steps=4, lr=0.02, optimizer="muon_per_head", warmup=1)
    seen = []
    losses, _ = train.fit(net, cfg, batches(), byte_loss, 4, on_optimizer=seen.append)
    assert len(seen) == 1 and any(g.get("heads", 1) == 3 * TINY.n_head for g in seen[0].param_groups)
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0]

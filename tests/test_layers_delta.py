"""DeltaNet / Gated DeltaNet / KDA layers: decode state = full forward, gate forms, plumbing, errors."""

import math

import pytest
import torch
import torch.nn.functional as F

from gpt2k3.accounting import ArchSpec, count_params
from gpt2k3.model import GPT
from gpt2k3.config import GPTConfig
from gpt2k3.cache import KVCache
from gpt2k3.cache import StateCache
from gpt2k3.layers.deltanet import (KDA, BoundedKDA, DeltaNet, DeltaState, GatedDeltaNet, bounded_log_decay,
                                    gdn_log_decay, kda_log_decay)
from gpt2k3.layers.norms import GatedRMSNorm
from gpt2k3.layers.conv import ShortConv
from gpt2k3.models.hybrid import forward_in_pieces
from gpt2k3.ops import delta, gated_delta
from mixer_testing import count_host_syncs  # noqa: E402

LAYERS = [DeltaNet, GatedDeltaNet, KDA]
CFG = GPTConfig(block_size=64, vocab_size=97, n_layer=2, n_head=2, n_embd=16)


def make_layer(cls, seed=0, **kw):
    torch.manual_seed(seed)
    layer = cls(CFG, **kw).double()
    with torch.no_grad():  # larger weights than GPT's init, so every part of the layer matters
        for p in layer.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.3)
    return layer


def x_of(B=2, T=21, seed=1):
    return torch.randn(B, T, CFG.n_embd, generator=torch.Generator().manual_seed(seed),
                       dtype=torch.float64)


def pieces(layer, x, sizes):
    cache, outs, start = layer.new_cache(x.shape[0]), [], 0
    assert isinstance(cache, StateCache) and cache.state is None
    for s in sizes:
        outs.append(layer(x[:, start:start + s], cache=cache))
        start += s
    return torch.cat(outs, dim=1), cache


# --------------------------------------------------------------------------- decode = forward
@pytest.mark.parametrize("cls", LAYERS)
@pytest.mark.parametrize("kw", [{}, {"conv_size": 0}, {"conv_size": 2, "chunk_size": 5},
                                {"expand_v": 2, "head_dim": 4, "n_head": 3}])
@pytest.mark.parametrize("sizes", [[7] + [1] * 14, [2, 3, 1, 10, 5]])
def test_state_in_pieces_equals_whole_sequence(cls, kw, sizes):
    layer = make_layer(cls, **kw)
    x = x_of()
    with torch.no_grad():
        whole = layer(x)
        stepped, _ = pieces(layer, x, sizes)
    torch.testing.assert_close(stepped, whole, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("cls", LAYERS)
def test_gpt_prompt_then_decode_equals_full_forward(cls):
    torch.manual_seed(0)
    model = GPT(CFG, mixer=lambda c, i: cls(c)).double().eval()
    idx = torch.randint(0, CFG.vocab_size, (2, 30), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        full = model(idx)
    cache = model.new_cache(2)
    assert cache.kinds == ("StateCache",) * CFG.n_layer
    stepped, used = forward_in_pieces(model, idx, cache, [11] + [1] * 19)
    torch.testing.assert_close(stepped, full, atol=1e-12, rtol=1e-12)
    assert cache.length == 30 and all(isinstance(c.state, DeltaState) for c in cache)
    assert len(set(used)) == 1  # the state does not grow with the tokens seen


@pytest.mark.parametrize("cls", LAYERS)
@pytest.mark.parametrize("conv_size", [0, 4])
def test_state_size_is_fixed_and_counted(cls, conv_size):
    layer = make_layer(cls, conv_size=conv_size, expand_v=2)
    cache = layer.new_cache(3)
    with torch.no_grad():
        layer(x_of(B=3, T=9), cache=cache)
        after_prompt = cache.nbytes
        layer(x_of(B=3, T=1, seed=2), cache=cache)
    assert cache.length == 10 and cache.used_nbytes == cache.nbytes
    state = cache.state
    assert isinstance(state, DeltaState)
    assert state.S.shape == (3, layer.n_head, layer.head_k_dim, layer.head_v_dim)
    assert (state.conv is None) == (conv_size == 0)
    assert cache.nbytes == after_prompt == layer.state_numbers(batch=3) * 8  # float64


# --------------------------------------------------------------------------- the gates
def test_gated_deltanet_gate_is_mamba2_style():
    layer = make_layer(GatedDeltaNet)
    x = x_of()
    la = layer.log_alpha(x)
    assert la.shape == (2, CFG.n_head, 21)
    expected = -layer.A_log.exp() * F.softplus(layer.a_proj(x) + layer.dt_bias)  # (B, T, H)
    torch.testing.assert_close(la, expected.transpose(1, 2))
    assert (la <= 0).all()


def test_gated_deltanet_init_ranges():
    torch.manual_seed(0)
    layer = GatedDeltaNet(GPTConfig(n_layer=1, n_head=64, n_embd=64 * 8))
    A = layer.A_log.exp()
    dt = F.softplus(layer.dt_bias)
    assert (A > 0).all() and (A <= 16).all()
    assert (dt >= 1e-4).all() and (dt <= 0.1 + 1e-6).all()
    torch.testing.assert_close(dt.log().min(), torch.tensor(math.log(1e-3)), atol=1.0, rtol=0)


def test_kda_gate_is_low_rank_and_per_channel():
    layer = make_layer(KDA)
    x = x_of()
    down, up = layer.f_proj
    assert down.out_features == layer.head_v_dim and up.in_features == layer.head_v_dim
    assert up.out_features == layer.key_dim
    la = layer.log_alpha(x)
    assert la.shape == (2, CFG.n_head, 21, layer.head_k_dim)
    f = (up(down(x)) + layer.dt_bias).view(2, 21, CFG.n_head, layer.head_k_dim)
    expected = -layer.A_log.exp()[None, None, :, None] * F.softplus(f)
    torch.testing.assert_close(la, expected.transpose(1, 2))
    assert (la <= 0).all()


def _fla_kda_gate():
    """fla-core's ``naive_kda_gate`` (``fla/ops/kda/gate.py``), taken out of the file by name (the
    file imports triton at the top)."""
    import ast
    from fla_oracle import fla_package_dir

    path = fla_package_dir() / "ops" / "kda" / "gate.py"
    funcs = [n for n in ast.parse(path.read_text()).body
             if isinstance(n, ast.FunctionDef) and n.name == "naive_kda_gate"]
    assert len(funcs) == 1, "fla's KDA gate reference moved"
    namespace = {"torch": torch, "F": F}
    exec(compile(ast.Module(body=funcs, type_ignores=[]), str(path), "exec"), namespace)
    return namespace["naive_kda_gate"]


def test_decay_functions_follow_the_definitions_and_fla():
    g = torch.Generator().manual_seed(3)
    H, Dk = 3, 4
    x = 4 * torch.randn(2, 5, H, Dk, generator=g, dtype=torch.float64)
    A_log, dt_bias = torch.randn(H, generator=g, dtype=torch.float64), torch.randn(H * Dk, generator=g, dtype=torch.float64)
    ours = kda_log_decay(x, A_log, dt_bias)
    by_hand = -A_log.exp().view(H, 1) * F.softplus(x + dt_bias.view(H, Dk))
    torch.testing.assert_close(ours, by_hand, rtol=0, atol=0)
    theirs = _fla_kda_gate()(x, A_log, dt_bias, output_dtype=torch.float64)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)  # fla computes in float32
    # Gated DeltaNet's is the same formula with one channel per head
    a, b_h = x[..., 0], dt_bias[:H]
    torch.testing.assert_close(gdn_log_decay(a, A_log, b_h),
                               kda_log_decay(a[..., None], A_log, b_h)[..., 0], rtol=0, atol=0)
    assert (ours <= 0).all() and gdn_log_decay(a.float(), A_log.float(), b_h.float()).dtype == torch.float32
    assert kda_log_decay(x.half(), A_log, dt_bias).dtype == torch.float32  # x's dtype, at least float32
    # K3's bound changes only the squashing: a floor at lower_bound
    lo = bounded_log_decay(x, A_log, dt_bias, -2.0)
    assert ((lo > -2.0) & (lo < 0)).all()


@pytest.mark.parametrize("call, match", [
    (lambda: kda_log_decay(torch.zeros(2, 5, 3), torch.zeros(3), torch.zeros(12)), r"x must be a floating \(B, T, H, Dk\)"),
    (lambda: kda_log_decay(torch.zeros(2, 5, 3, 4), torch.zeros(2), torch.zeros(12)), r"A_log must have shape \(H,\)"),
    (lambda: kda_log_decay(torch.zeros(2, 5, 3, 4), torch.zeros(3), torch.zeros(3)), r"dt_bias must have shape \(H \* Dk,\)"),
    (lambda: gdn_log_decay(torch.zeros(2, 5, 3, 1), torch.zeros(3), torch.zeros(3)), r"x must be a floating \(B, T, H\)"),
    (lambda: gdn_log_decay(torch.zeros(2, 5, 3), torch.zeros(3), torch.zeros(4)), r"dt_bias must have shape \(H,\)"),
    (lambda: gdn_log_decay(torch.zeros(2, 5, 3, dtype=torch.long), torch.zeros(3), torch.zeros(3)), "x must be a floating"),
])
def test_decay_functions_reject_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_kda_initialisation_spreads_memory_lengths_as_mamba2():
    """flash-linear-attention >= 0.5.0: softplus(dt_bias) log-uniform in [0.001, 0.1] per
    channel, A ~ U(1, 16), so log alpha = -A dt at a zero input lies in [-1.6, -0.001]."""
    torch.manual_seed(0)
    layer = KDA(GPTConfig(n_layer=1))
    with torch.no_grad():
        la = layer.log_alpha(torch.zeros(1, 1, 768))
        dt = F.softplus(layer.dt_bias)
    assert dt.min() >= 1e-3 * (1 - 1e-5) and dt.max() <= 0.1 * (1 + 1e-5)
    assert la.max() <= -1e-3 + 1e-7 and la.min() >= -1.6 - 1e-6
    half_lives = math.log(2) / -la
    assert half_lives.max() > 100 and half_lives.min() < 2  # from under a token to hundreds


def test_deltanet_has_no_gate():
    assert make_layer(DeltaNet).log_alpha(x_of()) is None


@pytest.mark.parametrize("n_head, head_dim, n_embd, conv", [(12, 64, 768, 4), (3, 8, 20, 0),
                                                              (32, 128, 2304, 4)])
def test_kda_parameter_count_matches_accounting(n_head, head_dim, n_embd, conv):
    config = GPTConfig(n_layer=1, n_head=n_head if n_embd % n_head == 0 else 1, n_embd=n_embd)
    with torch.device("meta"):
        layer = KDA(config, n_head=n_head, head_dim=head_dim, conv_size=conv)
    spec = ArchSpec(name="kda", vocab_size=1, n_layer=1, n_embd=n_embd, n_head=1, bias=False,
                    norm="rmsnorm", kda_layers=(0,), kda_n_head=n_head, kda_head_dim=head_dim,
                    kda_conv_kernel=conv)
    assert count_params(spec).detail["linear attention"] == sum(p.numel() for p in layer.parameters())


# --------------------------------------------------------------------------- plumbing vs a reference
def reference_forward(layer, x):
    """The layer's forward written out independently: padded conv, recurrent mixer, norm, gate."""
    B, T, _ = x.shape
    H, Dk, Dv = layer.n_head, layer.head_k_dim, layer.head_v_dim

    def conv(proj, conv_mod):
        y = proj(x)
        if not layer.conv_size:
            return F.silu(y)
        K = layer.conv_size
        z = F.conv1d(y.transpose(1, 2), conv_mod.weight, padding=K - 1, groups=y.shape[-1])
        return F.silu(z[..., :T]).transpose(1, 2)

    q = conv(layer.q_proj, getattr(layer, "q_conv", None)).view(B, T, H, Dk).transpose(1, 2)
    k = conv(layer.k_proj, getattr(layer, "k_conv", None)).view(B, T, H, Dk).transpose(1, 2)
    v = conv(layer.v_proj, getattr(layer, "v_conv", None)).view(B, T, H, Dv).transpose(1, 2)
    q, k = q / q.norm(dim=-1, keepdim=True), k / k.norm(dim=-1, keepdim=True)
    beta = torch.sigmoid(layer.b_proj(x)).transpose(1, 2)
    la = layer.log_alpha(x)
    o = (delta.recurrent(q, k, v, beta)[0] if la is None
         else gated_delta.recurrent(q, k, v, beta, la)[0]).transpose(1, 2)  # (B, T, H, Dv)
    o = o / torch.sqrt(o.pow(2).mean(-1, keepdim=True) + layer.o_norm.eps) * layer.o_norm.weight
    if isinstance(layer, GatedDeltaNet):
        o = o * F.silu(layer.g_proj(x)).view(B, T, H, Dv)
    elif isinstance(layer, KDA):
        o = o * torch.sigmoid(layer.g_proj(x)).view(B, T, H, Dv)
    return layer.o_proj(o.reshape(B, T, H * Dv))


@pytest.mark.parametrize("cls", LAYERS)
@pytest.mark.parametrize("conv_size", [0, 3])
def test_forward_matches_written_out_reference(cls, conv_size):
    layer = make_layer(cls, conv_size=conv_size, chunk_size=8)
    with torch.no_grad():
        torch.testing.assert_close(layer(x_of()), reference_forward(layer, x_of()),
                                   atol=1e-12, rtol=1e-12)


def test_layers_train():
    torch.manual_seed(0)
    model = GPT(CFG, mixer=lambda c, i: KDA(c, chunk_size=4))
    idx = torch.randint(0, CFG.vocab_size, (2, 10))
    loss = F.cross_entropy(model(idx).flatten(0, 1), idx.flatten())
    loss.backward()
    attn = model.transformer.h[0].attn
    for p in (attn.A_log, attn.dt_bias, attn.f_proj[0].weight, attn.q_conv.weight, attn.b_proj.weight):
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0


# --------------------------------------------------------------------------- building blocks
@pytest.mark.parametrize("K", [1, 2, 4])
def test_short_conv_pieces_and_causality(K):
    torch.manual_seed(0)
    conv = ShortConv(5, K).double()
    x = torch.randn(2, 9, 5, dtype=torch.float64)
    y, state = conv(x)
    assert state.shape == (2, 5, K - 1)
    y1, s1 = conv(x[:, :4])
    y2, _ = conv(x[:, 4:5], s1)
    y3, _ = conv(x[:, 5:], _)
    torch.testing.assert_close(torch.cat([y1, y2, y3], 1), y)
    x2 = x.clone()
    x2[:, 6:] += 1.0  # a change at t = 6 does not reach earlier outputs
    torch.testing.assert_close(conv(x2)[0][:, :6], y[:, :6])


def test_gated_rms_norm():
    torch.manual_seed(0)
    x, g = torch.randn(3, 8), torch.randn(3, 8)
    for act, fn in (("silu", F.silu), ("sigmoid", torch.sigmoid), (None, lambda t: 1.0)):
        norm = GatedRMSNorm(8, eps=1e-5, activation=act)
        with torch.no_grad():
            norm.weight.uniform_(0.5, 2)
        expected = F.rms_norm(x, (8,), norm.weight, eps=1e-5) * fn(g)
        torch.testing.assert_close(norm(x, g if act else None), expected)


# --------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("kwargs, match", [
    ({"head_dim": 0}, "head_dim must be an int >= 1"),
    ({"n_head": 2.0}, "n_head must be an int >= 1"),
    ({"expand_v": 0.3}, "expand_v must be a positive number with head_dim"),
    ({"expand_v": -1}, "expand_v must be a positive number"),
    ({"conv_size": -1}, "conv_size must be an int >= 0"),
    ({"chunk_size": 0}, "chunk_size must be an int >= 1"),
    ({"norm_eps": 0}, "norm_eps must be a finite float > 0"),
])
@pytest.mark.parametrize("cls", LAYERS)
def test_bad_construction(cls, kwargs, match):
    with pytest.raises(ValueError, match=match):
        cls(CFG, **kwargs)


def test_bad_config_and_inputs():
    with pytest.raises(ValueError, match="config must be a GPTConfig"):
        KDA({"n_embd": 16})
    layer = make_layer(KDA)
    with pytest.raises(ValueError, match=r"x must have shape \(B, T, n_embd=16\)"):
        layer(torch.zeros(2, 3, 8, dtype=torch.float64))
    with pytest.raises(ValueError, match="x must have shape"):
        layer(torch.zeros(3, 16, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"cache must be a StateCache \(from new_cache\), got KVCache"):
        layer(x_of(), cache=KVCache(2, 2, 8, 8))
    cache = StateCache()
    cache.extend(torch.zeros(2, 2, 8, 8), 1)  # a bare matrix, not a DeltaState
    with pytest.raises(ValueError, match="must be a DeltaState"):
        layer(x_of(), cache=cache)
    assert cache.length == 1  # a refused state is left as it was
    cache = layer.new_cache(2)
    layer(x_of(B=2), cache=cache)
    with pytest.raises(ValueError, match=r"conv state must have shape|state must have shape"):
        layer(x_of(B=3), cache=cache)  # a state for another batch size
    with pytest.raises(ValueError, match="activation must be one of"):
        GatedRMSNorm(4, activation="relu")
    with pytest.raises(ValueError, match="g \\(the output gate\\) is required"):
        GatedRMSNorm(4, activation="silu")(torch.zeros(2, 4))
    with pytest.raises(ValueError, match="kernel_size must be an int >= 1"):
        ShortConv(4, 0)


@pytest.mark.parametrize("cls", LAYERS)
def test_generate_with_the_fixed_state(cls):
    """gpt2k3.model.generate decodes these layers through their states (``model.new_cache``, the
    default): same greedy tokens."""
    from gpt2k3.model import generate

    torch.manual_seed(0)
    model = GPT(CFG, mixer=lambda c, i: cls(c)).double()
    prompt = torch.randint(0, CFG.vocab_size, (2, 6), generator=torch.Generator().manual_seed(1))
    cached = generate(model, prompt, 10, temperature=0)
    assert torch.equal(cached, generate(model, prompt, 10, temperature=0, use_cache=False))
    cache = model.new_cache(2, 16)
    assert torch.equal(generate(model, prompt, 10, temperature=0, cache=cache), cached)
    assert cache.length == 15 and all(isinstance(c.state, DeltaState) for c in cache)


# ------------------------------------------------------------------ no host sync in a decode step

@pytest.mark.parametrize("layer", [DeltaNet, GatedDeltaNet, KDA, BoundedKDA])
def test_a_delta_model_decode_step_reads_nothing_back_to_the_host(monkeypatch, layer):
    """A 4-layer model of each delta kind decodes with no host sync per generated token: the
    layers check shapes when called and run the ops' bodies, which read no value."""
    from gpt2k3.model import generate

    torch.manual_seed(0)
    m = GPT(GPTConfig(block_size=64, vocab_size=97, n_layer=4, n_head=2, n_embd=16),
            mixer=lambda c, i: layer(c)).eval()
    idx = torch.randint(0, 97, (2, 5), generator=torch.Generator().manual_seed(0))
    counts = count_host_syncs(monkeypatch)
    per_call = []
    for n in (4, 12):
        counts["n"] = 0
        generate(m, idx, n, temperature=0.0)
        per_call.append(counts["n"])
    assert (per_call[1] - per_call[0]) / 8 == 0, per_call


@pytest.mark.parametrize("layer", [DeltaNet, GatedDeltaNet, KDA])
def test_zero_tokens_through_a_delta_layer(layer):
    """T = 0 gives an empty output and leaves the cache as it was."""
    lay = make_layer(layer)
    cache = lay.new_cache(2)
    lay(x_of(T=3), cache=cache)
    before = cache.state.S.clone()
    out = lay(x_of(T=0), cache=cache)
    assert out.shape == (2, 0, lay.n_embd) and torch.equal(cache.state.S, before)

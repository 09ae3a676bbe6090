"""Gated DeltaNet and KDA: chunkwise = recurrent, reductions, stability (T = 8,192), fla oracles,
bad input (shapes and dtypes at the door; the write-strength diagnostic)."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from fla_oracle import load_naive
from gpt2k3.checks import check_write_strength
from gpt2k3.ops import chunks, delta, gated_delta
from mixer_testing import assert_close, make_state, shapes  # noqa: E402

SETTINGS = settings(max_examples=25, deadline=None)


def make(B, H, T, Dk, Dv, seed=0, dtype=torch.float64, per_channel=False, max_decay=2.0):
    """Normalised q, k, values, beta in [0, 2] and a log decay g in [-max_decay, 0]."""
    g = torch.Generator().manual_seed(seed)
    q = F.normalize(torch.randn(B, H, T, Dk, generator=g, dtype=dtype), dim=-1)
    k = F.normalize(torch.randn(B, H, T, Dk, generator=g, dtype=dtype), dim=-1)
    v = torch.randn(B, H, T, Dv, generator=g, dtype=dtype)
    beta = 2 * torch.rand(B, H, T, generator=g, dtype=dtype)
    gate_shape = (B, H, T, Dk) if per_channel else (B, H, T)
    log_alpha = -max_decay * torch.rand(gate_shape, generator=g, dtype=dtype)
    return q, k, v, beta, log_alpha


# --------------------------------------------------------------------------- the definition


@pytest.mark.parametrize("per_channel", [False, True])
def test_recurrent_is_the_definition(per_channel):
    q, k, v, beta, la = make(1, 1, 7, 4, 3, seed=2, per_channel=per_channel)
    S = make_state(1, 1, 4, 3)
    o, S_end = gated_delta.recurrent(q, k, v, beta, la, initial_state=S)
    S_ref = S[0, 0]
    for t in range(7):
        alpha = la[0, 0, t].exp() * torch.ones(4, dtype=la.dtype)  # per key channel (row of S)
        S_ref = torch.diag(alpha) @ S_ref
        kt, vt = k[0, 0, t : t + 1], v[0, 0, t : t + 1]
        S_ref = S_ref + beta[0, 0, t] * kt.T @ (vt - kt @ S_ref)
        assert_close(o[0, 0, t], (q[0, 0, t : t + 1] @ S_ref)[0])
    assert_close(S_end[0, 0], S_ref)


# --------------------------------------------------------------------------- chunkwise = recurrent


@SETTINGS
@given(
    shape=shapes,
    chunk=st.integers(1, 17),
    per_channel=st.booleans(),
    with_state=st.booleans(),
    max_decay=st.sampled_from([0.05, 1.0, 8.0]),
    seed=st.integers(0, 2**16),
)
def test_chunkwise_equals_recurrent(shape, chunk, per_channel, with_state, max_decay, seed):
    B, H, T, Dk, Dv = shape
    q, k, v, beta, la = make(*shape, seed=seed, per_channel=per_channel, max_decay=max_decay)
    state = make_state(B, H, Dk, Dv, seed=seed + 1) if with_state else None
    o_rec, S_rec = gated_delta.recurrent(q, k, v, beta, la, initial_state=state)
    o_chk, S_chk = gated_delta.chunkwise(q, k, v, beta, la, chunk_size=chunk, initial_state=state)
    assert_close(o_chk, o_rec)
    assert_close(S_chk, S_rec)


@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("chunk_size", [16, 64, 128])
def test_chunk_sizes_float32(per_channel, chunk_size):
    q, k, v, beta, la = make(
        2, 2, 150, 16, 8, seed=chunk_size, dtype=torch.float32, per_channel=per_channel, max_decay=0.5
    )
    S0 = make_state(2, 2, 16, 8, dtype=torch.float32)
    o_rec, S_rec = gated_delta.recurrent(q, k, v, beta, la, initial_state=S0)
    o_chk, S_chk = gated_delta.chunkwise(q, k, v, beta, la, chunk_size=chunk_size, initial_state=S0)
    torch.testing.assert_close(o_chk, o_rec, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(S_chk, S_rec, atol=1e-5, rtol=1e-5)


@SETTINGS
@given(
    shape=shapes,
    chunk=st.integers(1, 17),
    split=st.integers(0, 40),
    per_channel=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_split_processing_with_state(shape, chunk, split, per_channel, seed):
    B, H, T, Dk, Dv = shape
    split = min(split, T)
    q, k, v, beta, la = make(*shape, seed=seed, per_channel=per_channel)
    S0 = make_state(B, H, Dk, Dv, seed=seed + 1)
    o_all, S_all = gated_delta.recurrent(q, k, v, beta, la, initial_state=S0)
    first = [x[:, :, :split] for x in (q, k, v, beta, la)]
    rest = [x[:, :, split:] for x in (q, k, v, beta, la)]
    o1, S1 = gated_delta.chunkwise(*first, chunk_size=chunk, initial_state=S0)
    o2, S2 = gated_delta.chunkwise(*rest, chunk_size=chunk, initial_state=S1)
    assert_close(torch.cat([o1, o2], dim=2), o_all)
    assert_close(S2, S_all)


# --------------------------------------------------------------------------- reductions


@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("T, chunk", [(1, 4), (37, 8), (64, 16)])
def test_zero_gate_is_deltanet(per_channel, T, chunk):
    q, k, v, beta, la = make(2, 2, T, 5, 3, seed=T, per_channel=per_channel)
    zeros = torch.zeros_like(la)
    S0 = make_state(2, 2, 5, 3)
    o_d, S_d = delta.recurrent(q, k, v, beta, initial_state=S0)
    o_g, S_g = gated_delta.recurrent(q, k, v, beta, zeros, initial_state=S0)
    assert torch.equal(o_g, o_d) and torch.equal(S_g, S_d)  # exp(0) = 1 exactly
    o_dc, S_dc = delta.chunkwise(q, k, v, beta, chunk_size=chunk, initial_state=S0)
    o_gc, S_gc = gated_delta.chunkwise(q, k, v, beta, zeros, chunk_size=chunk, initial_state=S0)
    assert_close(o_gc, o_dc)
    assert_close(S_gc, S_dc)


@pytest.mark.parametrize("form", ["recurrent", "chunkwise"])
def test_kda_with_channel_constant_gate_is_gated_deltanet(form):
    q, k, v, beta, la = make(2, 3, 45, 6, 4, seed=9)
    la_kda = la.unsqueeze(-1).expand(-1, -1, -1, 6)
    S0 = make_state(2, 3, 6, 4)
    fn = getattr(gated_delta, form)
    kw = {"chunk_size": 16} if form == "chunkwise" else {}
    o_gdn, S_gdn = fn(q, k, v, beta, la, initial_state=S0, **kw)
    o_kda, S_kda = fn(q, k, v, beta, la_kda, initial_state=S0, **kw)
    assert_close(o_kda, o_gdn)
    assert_close(S_kda, S_gdn)


@pytest.mark.parametrize("per_channel", [False, True])
def test_closed_gate_resets_the_state(per_channel):
    """g = -inf erases everything before it; the chunked form stays exact and finite."""
    q, k, v, beta, la = make(1, 2, 30, 4, 3, seed=12, per_channel=per_channel, max_decay=0.3)
    la[:, :, 13] = float("-inf")
    S0 = make_state(1, 2, 4, 3)
    o_rec, S_rec = gated_delta.recurrent(q, k, v, beta, la, initial_state=S0)
    o_chk, S_chk = gated_delta.chunkwise(q, k, v, beta, la, chunk_size=8, initial_state=S0)
    assert torch.isfinite(o_chk).all() and torch.isfinite(S_chk).all()
    assert_close(o_chk, o_rec)
    assert_close(S_chk, S_rec)
    # from token 13 on, the past (and the initial state) no longer matter
    tail = [x[:, :, 13:].clone() for x in (q, k, v, beta, la)]
    tail[4][:, :, 0] = 0.0
    o_tail, _ = gated_delta.chunkwise(*tail, chunk_size=8)
    assert_close(o_chk[:, :, 13:], o_tail)


# --------------------------------------------------------------------------- stability


def test_stable_at_8192_tokens():
    """The one long test (T = 8,192; benchmarks/gates.py runs 65,536): every output and state
    finite for DeltaNet with beta up to 2, and for both gate shapes at g = -50 and g = -inf on
    every token, where each token wipes the state before writing, so o_t = beta_t (q_t . k_t) v_t;
    a window of a weakly decaying run, restarted from its state, is reproduced token by token."""
    T, D = 8192, 16
    g = torch.Generator().manual_seed(0)
    q = F.normalize(torch.randn(1, 1, T, D, generator=g), dim=-1)
    k = F.normalize(torch.randn(1, 1, T, D, generator=g), dim=-1)
    v = torch.randn(1, 1, T, D, generator=g)
    beta = 2 * torch.rand(1, 1, T, generator=g)
    o, S = delta.chunkwise(q, k, v, beta, chunk_size=128)
    assert torch.isfinite(o).all() and torch.isfinite(S).all()
    assert S.norm() < 10 * v.abs().max() * D  # non-expansive steps: the state stays bounded
    wiped = (q * k).sum(-1, keepdim=True) * beta[..., None] * v
    for shape in ((1, 1, T), (1, 1, T, D)):
        for value in (-50.0, float("-inf")):
            o, S = gated_delta.chunkwise(q, k, v, beta, torch.full(shape, value))
            assert torch.isfinite(o).all() and torch.isfinite(S).all()
            torch.testing.assert_close(o, wiped, atol=1e-5, rtol=1e-5)
        la = -0.01 * torch.rand(shape, generator=g)
        o, S = gated_delta.chunkwise(q, k, v, beta, la)
        assert torch.isfinite(o).all() and torch.isfinite(S).all()
        start = T - 200
        _, S_mid = gated_delta.chunkwise(*(x[:, :, :start] for x in (q, k, v, beta, la)))
        o_tail, S_tail = gated_delta.recurrent(*(x[:, :, start:] for x in (q, k, v, beta, la)),
                                               initial_state=S_mid)
        torch.testing.assert_close(o[:, :, start:], o_tail, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(S, S_tail, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("value", [-50.0, float("-inf")])
@pytest.mark.parametrize("b", [0.0, 2.0])
def test_extremes_stay_finite_and_forms_agree(per_channel, value, b):
    """g = -50 or -inf on some tokens, beta = 0 or 2 everywhere, unit keys: finite, forms equal."""
    q, k, v, _, la = make(1, 2, 37, 4, 3, seed=15, per_channel=per_channel, max_decay=0.5)
    la[:, :, ::5] = value
    beta = torch.full((1, 2, 37), b, dtype=q.dtype)
    S0 = make_state(1, 2, 4, 3)
    o_rec, S_rec = gated_delta.recurrent(q, k, v, beta, la, initial_state=S0)
    o_chk, S_chk = gated_delta.chunkwise(q, k, v, beta, la, chunk_size=8, initial_state=S0)
    for x in (o_rec, S_rec, o_chk, S_chk):
        assert torch.isfinite(x).all()
    assert_close(o_chk, o_rec)
    assert_close(S_chk, S_rec)
    if b == 0.0 and value == float("-inf"):  # nothing written; the first -inf erased S0
        assert not S_rec.any() and not S_chk.any()


def test_beta_five_is_named_by_the_diagnostic():
    """Issue #19: beta = 5 turns the state to NaN by T = 200. The ops read no value at their door;
    :func:`gpt2k3.checks.check_write_strength` names the cause."""
    q, k, v, _, la = make(1, 1, 200, 8, 4, seed=16, max_decay=0.01)
    five = torch.full((1, 1, 200), 5.0, dtype=q.dtype)
    with pytest.raises(ValueError, match=r"beta \* \|\|k\|\|\^2 must be in \[0, 2\]"):
        check_write_strength(five, k)


def test_reference_form_shares_no_code_with_the_chunked_core(monkeypatch):
    q, k, v, beta, la = make(1, 2, 9, 3, 2, seed=17, per_channel=True)
    before = gated_delta.recurrent(q, k, v, beta, la)

    def broken(*args, **kwargs):
        raise AssertionError("the reference form must not call the chunked core")

    for name in ("unit_lower_inverse", "channel_decays", "chunk_decays", "intra_chunk",
                 "intra_chunk_gated", "pass_state"):
        monkeypatch.setattr(chunks, name, broken)
    after = gated_delta.recurrent(q, k, v, beta, la)
    assert torch.equal(before[0], after[0]) and torch.equal(before[1], after[1])


@pytest.mark.parametrize("per_channel", [False, True])
def test_precise_after_strong_decays(per_channel):
    """Tiny decays after very strong ones keep their digits (cumulative logs in float64)."""
    q, k, v, beta, _ = make(1, 2, 128, 8, 4, seed=13, dtype=torch.float32, per_channel=per_channel)
    shape = (1, 2, 128, 8) if per_channel else (1, 2, 128)
    g = torch.Generator().manual_seed(14)
    la = -1e-3 * torch.rand(shape, generator=g)
    la[:, :, :40] = -20.0  # the first 40 tokens of every chunk decay hard
    la[:, :, 64:104] = -20.0
    o_ref, S_ref = gated_delta.recurrent(q.double(), k.double(), v.double(), beta.double(), la.double())
    o, S = gated_delta.chunkwise(q, k, v, beta, la, chunk_size=64)
    torch.testing.assert_close(o.double(), o_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(S.double(), S_ref, atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------------------- fla oracles


def to_fla(x):
    """(B, H, T, ...) <-> fla's (B, T, H, ...) (a swap of axes 1 and 2, its own inverse)."""
    return x.transpose(1, 2).contiguous()


def test_fla_gated_delta_rule_recurrent():
    naive = load_naive("gated_delta_rule")
    q, k, v, beta, la = make(2, 3, 50, 16, 8, seed=41, dtype=torch.float32, max_decay=0.5)
    S0 = make_state(2, 3, 16, 8, dtype=torch.float32)
    o_ref, S_ref = naive.naive_recurrent_gated_delta_rule(
        to_fla(q), to_fla(k), to_fla(v), to_fla(beta), to_fla(la),
        scale=1.0, initial_state=S0, output_final_state=True,
    )
    o, S = gated_delta.chunkwise(q, k, v, beta, la, chunk_size=16, initial_state=S0)
    torch.testing.assert_close(o, to_fla(o_ref), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(S, S_ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("T", [64, 100])  # theirs pads a ragged last chunk
def test_fla_gated_delta_rule_chunk(T):
    naive = load_naive("gated_delta_rule")
    q, k, v, beta, la = make(2, 2, T, 16, 8, seed=42, dtype=torch.float32, max_decay=0.5)
    S0 = make_state(2, 2, 16, 8, dtype=torch.float32)
    o_ref, S_ref = naive.naive_chunk_gated_delta_rule(
        to_fla(q), to_fla(k), to_fla(v), to_fla(la), to_fla(beta), chunk_size=32, scale=1.0,
        initial_state=S0, output_final_state=True,
    )
    o, S = gated_delta.recurrent(q, k, v, beta, la, initial_state=S0)
    torch.testing.assert_close(o, to_fla(o_ref), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(S, S_ref, atol=1e-5, rtol=1e-5)


def test_fla_kda_recurrent():
    naive = load_naive("kda")
    q, k, v, beta, la = make(2, 3, 50, 16, 8, seed=43, dtype=torch.float32, per_channel=True)
    S0 = make_state(2, 3, 16, 8, dtype=torch.float32)
    o_ref, S_ref = naive.naive_recurrent_kda(
        to_fla(q), to_fla(k), to_fla(v), to_fla(la), to_fla(beta),
        scale=1.0, initial_state=S0, output_final_state=True,
    )
    o, S = gated_delta.chunkwise(q, k, v, beta, la, chunk_size=16, initial_state=S0)
    torch.testing.assert_close(o, to_fla(o_ref), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(S, S_ref, atol=1e-5, rtol=1e-5)


def test_fla_kda_chunk():
    naive = load_naive("kda")
    # theirs needs T % chunk_size == 0 and exponentiates g_i - g_j for i < j too, so keep the
    # decays moderate here (ours masks first; see the stability tests)
    q, k, v, beta, la = make(
        2, 2, 64, 16, 8, seed=44, dtype=torch.float32, per_channel=True, max_decay=0.2
    )
    S0 = make_state(2, 2, 16, 8, dtype=torch.float32)
    o_ref, S_ref = naive.naive_chunk_kda(
        to_fla(q), to_fla(k), to_fla(v), to_fla(la), to_fla(beta), scale=1.0, initial_state=S0,
        output_final_state=True, chunk_size=16,
    )
    o, S = gated_delta.recurrent(q, k, v, beta, la, initial_state=S0)
    torch.testing.assert_close(o, to_fla(o_ref), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(S, S_ref, atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------------------- bad input


SHAPE = r"must be a floating tensor of shape"


@pytest.mark.parametrize(
    "case, match",
    [
        ("shape_time", rf"g {SHAPE} \(2, 3, 5\) or \(2, 3, 5, 4\)"),
        ("shape_channels", rf"g {SHAPE}"),
        ("shape_ndim", rf"g {SHAPE}"),
        ("not_tensor", rf"g {SHAPE} .*got float"),
        ("missing", rf"g {SHAPE} .*got None"),
        ("int_gate", rf"g {SHAPE}"),
        ("beta_shape", rf"beta {SHAPE} \(2, 3, 5\)"),
        ("state_shape", rf"initial_state {SHAPE} \(2, 3, 4, 4\)"),
        ("v_heads", rf"v {SHAPE}"),
        ("k_ndim", rf"k {SHAPE}"),
    ],
)
def test_bad_input_raises(case, match):
    q, k, v, beta, la = make(2, 3, 5, 4, 4)
    state = None
    if case == "int_gate":
        la = torch.zeros(2, 3, 5, dtype=torch.long)
    elif case == "missing":
        la = None
    elif case == "shape_time":
        la = la[..., :4]
    elif case == "shape_channels":
        la = torch.zeros(2, 3, 5, 3)
    elif case == "shape_ndim":
        la = torch.zeros(2, 3, 5, 4, 1)
    elif case == "not_tensor":
        la = -0.1
    elif case == "beta_shape":
        beta = beta[..., None].expand(-1, -1, -1, 4)
    elif case == "state_shape":
        state = torch.zeros(2, 3, 5, 4)
    elif case == "v_heads":
        v = v[:, :1]
    elif case == "k_ndim":
        k = k[0]
    for fn in (gated_delta.recurrent, gated_delta.chunkwise):
        with pytest.raises(ValueError, match=match):
            fn(q, k, v, beta, la, initial_state=state)


@pytest.mark.parametrize("case", ["g_positive", "g_nan", "beta_big", "q_nan"])
def test_the_door_reads_no_value(case):
    """The door checks shapes and dtypes only, so a decode step never waits on the device: a log
    decay above 0, a NaN or a write strength outside [0, 2] is outside the ops' contract and is
    computed as given, by both forms alike (the layers produce g <= 0 and beta in [0, 1] by
    construction)."""
    q, k, v, beta, la = make(2, 3, 5, 4, 4)
    target, value = {"g_positive": (la, 0.5), "g_nan": (la, float("nan")),
                     "beta_big": (beta, 5.0), "q_nan": (q, float("nan"))}[case]
    target.view(-1)[3] = value
    o_rec, S_rec = gated_delta.recurrent(q, k, v, beta, la)
    o_chk, S_chk = gated_delta.chunkwise(q, k, v, beta, la, chunk_size=4)
    if case in ("g_nan", "q_nan"):
        assert not torch.isfinite(o_rec).all() and not torch.isfinite(o_chk).all()
    else:
        torch.testing.assert_close(o_chk, o_rec, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("chunk_size", [0, -64, 8.0, True])
def test_bad_chunk_size(chunk_size):
    q, k, v, beta, la = make(1, 1, 5, 3, 2)
    with pytest.raises(ValueError, match="chunk_size must be a positive int"):
        gated_delta.chunkwise(q, k, v, beta, la, chunk_size=chunk_size)


# --------------------------------------------------------------------------- added for chapter 6


@pytest.mark.parametrize("per_channel", [False, True])
def test_fla_recurrent_oracle_with_strong_decays(per_channel):
    """Decays anywhere in [-20, 0] per token, against fla's token-by-token references."""
    q, k, v, beta, _ = make(2, 2, 70, 16, 8, seed=45, dtype=torch.float32, per_channel=per_channel)
    g = torch.Generator().manual_seed(46)
    shape = (2, 2, 70, 16) if per_channel else (2, 2, 70)
    la = -20.0 * torch.rand(shape, generator=g)
    S0 = make_state(2, 2, 16, 8, dtype=torch.float32)
    if per_channel:
        o_ref, S_ref = load_naive("kda").naive_recurrent_kda(
            to_fla(q), to_fla(k), to_fla(v), to_fla(la), to_fla(beta),
            scale=1.0, initial_state=S0, output_final_state=True)
    else:
        o_ref, S_ref = load_naive("gated_delta_rule").naive_recurrent_gated_delta_rule(
            to_fla(q), to_fla(k), to_fla(v), to_fla(beta), to_fla(la),
            scale=1.0, initial_state=S0, output_final_state=True)
    o, S = gated_delta.chunkwise(q, k, v, beta, la, chunk_size=32, initial_state=S0)
    torch.testing.assert_close(o, to_fla(o_ref), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(S, S_ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("per_channel", [False, True])
def test_gradients_flow_and_both_forms_agree(per_channel):
    """The layers train through chunkwise: its gradients are the recurrent form's."""
    inputs = [x.requires_grad_() for x in make(1, 2, 11, 3, 2, seed=47, per_channel=per_channel,
                                               max_decay=1.0)]
    S0 = make_state(1, 2, 3, 2, seed=48).requires_grad_()
    weights = torch.randn(1, 2, 11, 2, generator=torch.Generator().manual_seed(49), dtype=torch.float64)

    def loss(fn, **kw):
        o, S = fn(*inputs, initial_state=S0, **kw)
        return (o * weights).sum() + S.square().sum()

    grads_c = torch.autograd.grad(loss(gated_delta.chunkwise, chunk_size=4), [*inputs, S0])
    grads_r = torch.autograd.grad(loss(gated_delta.recurrent), [*inputs, S0])
    for gc, gr in zip(grads_c, grads_r):
        assert_close(gc, gr)
    assert torch.autograd.gradcheck(lambda *xs: gated_delta.chunkwise(*xs, chunk_size=4)[0],
                                    [x.detach().requires_grad_() for x in inputs])


def test_low_precision_inputs():
    """bf16 inputs: outputs come back in bf16, the state in float32, close to a float32 run."""
    q, k, v, beta, la = make(1, 2, 40, 8, 4, seed=50, dtype=torch.float32, per_channel=True)
    o32, S32 = gated_delta.chunkwise(q, k, v, beta, la, chunk_size=16)
    o16, S16 = gated_delta.chunkwise(*(x.bfloat16() for x in (q, k, v, beta, la)), chunk_size=16)
    assert o16.dtype == torch.bfloat16 and S16.dtype == torch.float32
    torch.testing.assert_close(o16.float(), o32, atol=0.05, rtol=0.05)


# --------------------------------------------------------------------------- KDA's factorised scores


def _explicit_channel_scores(q, k, log_alpha):
    """The definition: A[i, j] = sum_d k_i k_j exp(g_i - g_j) (j < i), P the same with q (j <= i)."""
    g = log_alpha.double().clamp_min(-1e4).cumsum(-2)  # no -inf - -inf
    C = q.shape[-2]
    diff = g.unsqueeze(-2) - g.unsqueeze(-3)  # [i, j] = g_i - g_j
    lower = torch.ones(C, C, dtype=torch.bool).tril()
    decay = diff.masked_fill(~lower.unsqueeze(-1), float("-inf")).exp()
    A = ((k.double().unsqueeze(-2) * k.double().unsqueeze(-3)) * decay).sum(-1).tril(-1)
    P = ((q.double().unsqueeze(-2) * k.double().unsqueeze(-3)) * decay).sum(-1)
    return A, P, g.exp(), (g[..., -1:, :] - g).exp()


@pytest.mark.parametrize("C", [1, 2, 3, 16, 17, 64])
@pytest.mark.parametrize("max_decay", [0.05, 3.0, 30.0])
def test_channel_decays_equal_the_definition(C, max_decay):
    """The halving factorisation gives the per-pair decayed scores, for any chunk length."""
    g = torch.Generator().manual_seed(C)
    q, k = (torch.randn(2, 3, C, 5, generator=g, dtype=torch.float64) for _ in range(2))
    la = -max_decay * torch.rand(2, 3, C, 5, generator=g, dtype=torch.float64)
    got = chunks.channel_decays(q, k, la)
    for a, b in zip(got, _explicit_channel_scores(q, k, la)):
        assert torch.isfinite(a).all()
        assert_close(a, b)


def test_channel_decays_float32_keep_digits_after_strong_decays():
    """Products of per-token decays, never differences of large cumulative sums: a tiny decay
    right after a huge one is as precise as anywhere else (float32 against float64)."""
    g = torch.Generator().manual_seed(7)
    q, k = (torch.randn(4, 64, 8, generator=g) for _ in range(2))
    la = -1e-3 * torch.rand(4, 64, 8, generator=g)
    la[:, :20] = -40.0  # the chunk's first 20 tokens wipe everything before them
    la[1, 30] = float("-inf")  # a full reset mid-chunk
    got = chunks.channel_decays(q, k, la)
    for a, b in zip(got, _explicit_channel_scores(q, k, la)):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a.double(), b, atol=2e-6, rtol=2e-6)


def test_channel_decays_grad_path_equals_in_place_path():
    """With autograd recording, the factors are updated out of place; same values."""
    g = torch.Generator().manual_seed(8)
    q, k = (torch.randn(3, 12, 4, generator=g, dtype=torch.float64) for _ in range(2))
    la = -torch.rand(3, 12, 4, generator=g, dtype=torch.float64)
    with torch.no_grad():
        plain = chunks.channel_decays(q, k, la)
    tracked = chunks.channel_decays(q.requires_grad_(), k, la.requires_grad_())
    for a, b in zip(tracked, plain):
        assert_close(a.detach(), b)
    sum(x.sum() for x in tracked).backward()
    assert torch.isfinite(q.grad).all() and torch.isfinite(la.grad).all()


@pytest.mark.parametrize("per_channel", [False, True])
def test_public_fast_core_is_chunkwise_on_validated_inputs(per_channel):
    """gated_delta.chunked (no checks, no host sync) is what chunkwise runs after its one check."""
    q, k, v, beta, la = make(2, 3, 37, 8, 4, seed=18, per_channel=per_channel)
    S0 = torch.randn(2, 3, 8, 4, dtype=q.dtype, generator=torch.Generator().manual_seed(19))
    o, S = gated_delta.chunked(q, k, v, beta, la, S0, 16)
    o_chk, S_chk = gated_delta.chunkwise(q, k, v, beta, la, initial_state=S0, chunk_size=16)
    assert torch.equal(o, o_chk) and torch.equal(S, S_chk)
    o_rec, S_rec = gated_delta.recurrent(q, k, v, beta, la, initial_state=S0)
    assert_close(o, o_rec)
    assert_close(S, S_rec)
    o0, S0_ = gated_delta.chunked(q, k, v, beta, None, S0, 16)  # no decay: DeltaNet
    o_d, S_d = delta.chunkwise(q, k, v, beta, initial_state=S0, chunk_size=16)
    assert torch.equal(o0, o_d) and torch.equal(S0_, S_d)


@pytest.mark.parametrize("form", ["recurrent", "chunkwise"])
@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("empty", ["B", "H", "T"])
def test_empty_batch_heads_or_time_give_empty_results(form, per_channel, empty):
    B, H, T = (0 if empty == n else d for n, d in (("B", 2), ("H", 3), ("T", 5)))
    q, k, v, beta, la = make(B, H, T, 4, 3, seed=20, per_channel=per_channel)
    o, S = getattr(gated_delta, form)(q, k, v, beta, la)
    assert o.shape == (B, H, T, 3) and S.shape == (B, H, 4, 3) and not S.any()


def test_the_check_reads_no_values_while_a_cuda_graph_is_captured(monkeypatch):
    """During CUDA-graph capture (simulated here) the door behaves as ever: it reads shapes and
    dtypes, never a value (a capture cannot sync), so the public ops can be graphed."""
    q, k, v, beta, la = make(1, 2, 9, 4, 3, seed=21, per_channel=True)
    expected = gated_delta.recurrent(q, k, v, beta, la)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    for fn in (gated_delta.recurrent, gated_delta.chunkwise):
        o, S = fn(q, k, v, beta, la)
        assert_close(o, expected[0]) and assert_close(S, expected[1])
        fn(q, k, v, torch.full_like(beta, 5.0), la)  # not read: no ValueError, no sync
        with pytest.raises(ValueError, match="beta must be a floating tensor"):
            fn(q, k, v, 0.5, la)
    with pytest.raises(ValueError, match="chunk_size must be a positive int"):
        delta.chunkwise(q, k, v, beta, chunk_size=0)

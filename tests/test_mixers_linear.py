"""Linear attention: parallel = recurrent = chunkwise, causality, the seed's bug, the fla oracle."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from fla_oracle import load_naive
from gpt2k3 import seed
from gpt2k3.ops import linear
from mixer_testing import assert_close, shapes  # noqa: E402

SETTINGS = settings(max_examples=30, deadline=None)


def make(B, H, T, Dk, Dv, seed=0, dtype=torch.float64):
    """Feature-mapped q, k (positive) and v, from a fixed seed."""
    g = torch.Generator().manual_seed(seed)
    q = linear.elu1(torch.randn(B, H, T, Dk, generator=g, dtype=dtype))
    k = linear.elu1(torch.randn(B, H, T, Dk, generator=g, dtype=dtype))
    v = torch.randn(B, H, T, Dv, generator=g, dtype=dtype)
    return q, k, v


def make_state(B, H, Dk, Dv, seed=1, dtype=torch.float64):
    """A plausible incoming state: what some earlier positive keys would have left."""
    g = torch.Generator().manual_seed(seed)
    k0 = linear.elu1(torch.randn(B, H, 5, Dk, generator=g, dtype=dtype))
    v0 = torch.randn(B, H, 5, Dv, generator=g, dtype=dtype)
    return k0.transpose(-1, -2) @ v0, k0.sum(-2)


# --------------------------------------------------------------------------- equal forms


def test_elu1():
    x = torch.linspace(-30, 5, 101)
    assert torch.equal(linear.elu1(x), F.elu(x) + 1)
    assert (linear.elu1(x) >= 0).all()
    assert (linear.elu1(x[x > -16]) > 0).all()
    assert linear.elu1(torch.tensor(-20.0)) == 0  # (exp(x) - 1) + 1 rounds to 0 in float32


@SETTINGS
@given(shape=shapes, chunk=st.integers(1, 17), normalize=st.booleans(), seed=st.integers(0, 2**16))
def test_parallel_recurrent_chunkwise_agree(shape, chunk, normalize, seed):
    q, k, v = make(*shape, seed=seed)
    o_par, (S_par, z_par) = linear.parallel(q, k, v, normalize=normalize)
    o_rec, (S_rec, z_rec) = linear.recurrent(q, k, v, normalize=normalize)
    o_chk, (S_chk, z_chk) = linear.chunkwise(q, k, v, chunk_size=chunk, normalize=normalize)
    assert_close(o_rec, o_par)
    assert_close(S_par, S_rec)  # parallel returns the same final state
    assert_close(z_par, z_rec)
    assert_close(o_chk, o_rec)
    assert_close(S_chk, S_rec)
    assert_close(z_chk, z_rec)
    assert_close(S_rec, k.transpose(-1, -2) @ v)
    assert_close(z_rec, k.sum(-2))


@SETTINGS
@given(shape=shapes, chunk=st.integers(1, 17), split=st.integers(0, 40), seed=st.integers(0, 2**16))
def test_split_processing_with_state(shape, chunk, split, seed):
    """Running a prefix, then the rest from the returned state, equals one call."""
    B, H, T, Dk, Dv = shape
    split = min(split, T)
    q, k, v = make(*shape, seed=seed)
    state = make_state(B, H, Dk, Dv, seed=seed + 1)
    o_all, (S_all, z_all) = linear.recurrent(q, k, v, initial_state=state)
    o1, st1 = linear.chunkwise(q[:, :, :split], k[:, :, :split], v[:, :, :split], chunk_size=chunk,
                               initial_state=state)
    o2, (S2, z2) = linear.chunkwise(q[:, :, split:], k[:, :, split:], v[:, :, split:], chunk_size=chunk,
                                    initial_state=st1)
    assert_close(torch.cat([o1, o2], dim=2), o_all)
    assert_close(S2, S_all)
    assert_close(z2, z_all)
    # and the recurrent form splits the same way
    o3, st3 = linear.recurrent(q[:, :, :split], k[:, :, :split], v[:, :, :split], initial_state=state)
    o4, _ = linear.recurrent(q[:, :, split:], k[:, :, split:], v[:, :, split:], initial_state=st3)
    assert_close(torch.cat([o3, o4], dim=2), o_all)


@pytest.mark.parametrize("T", [1, 63, 64, 65, 200])
def test_chunkwise_float32_any_length(T):
    q, k, v = make(2, 2, T, 8, 8, seed=T, dtype=torch.float32)
    o_par = linear.parallel(q, k, v)[0]
    o_chk, _ = linear.chunkwise(q, k, v)
    assert o_chk.dtype == torch.float32
    torch.testing.assert_close(o_chk, o_par, atol=1e-5, rtol=1e-5)


def test_empty_sequence_keeps_state():
    q, k, v = make(1, 2, 0, 3, 4)
    state = make_state(1, 2, 3, 4)
    for fn in (linear.recurrent, linear.chunkwise):
        o, (S, z) = fn(q, k, v, initial_state=state)
        assert o.shape == (1, 2, 0, 4)
        assert torch.equal(S, state[0]) and torch.equal(z, state[1])


# --------------------------------------------------------------------------- causality and the seed


def _perturb_token(x, t, seed=123):
    y = x.clone()
    g = torch.Generator().manual_seed(seed)
    y[:, :, t] = linear.elu1(torch.randn(y[:, :, t].shape, generator=g, dtype=y.dtype)) + 1.0
    return y


@pytest.mark.parametrize("t", [0, 3, 9])
def test_ours_is_causal_seed_prefill_is_not(t):
    q, k, v = make(1, 2, 10, 4, 3, seed=5)
    k2, v2 = _perturb_token(k, t), _perturb_token(v, t, seed=7)
    forms = {
        "parallel": lambda q, k, v: linear.parallel(q, k, v)[0],
        "recurrent": lambda q, k, v: linear.recurrent(q, k, v)[0],
        "chunkwise": lambda q, k, v: linear.chunkwise(q, k, v, chunk_size=4)[0],
    }
    for name, fn in forms.items():
        before, after = fn(q, k, v), fn(q, k2, v2)
        assert torch.equal(before[:, :, :t], after[:, :, :t]), name  # the past is untouched
        assert not torch.allclose(before[:, :, t], after[:, :, t]), name  # token t itself changes
    seed_before = seed.seed_prefill(q, k, v)[0]
    seed_after = seed.seed_prefill(q, k2, v2)[0]
    # the seed's outputs for EVERY earlier position depend on token t: it sees the future
    if t > 0:
        diff = (seed_before[:, :, :t] - seed_after[:, :, :t]).abs().amax(dim=(0, 1, 3))
        assert (diff > 1e-6).all()


def test_seed_prefill_is_right_only_at_the_end():
    """Its state and its LAST output are correct; every earlier output has seen the future."""
    q, k, v = make(2, 2, 12, 4, 5, seed=11)
    o_seed, (S_seed, z_seed) = seed.seed_prefill(q, k, v)
    o_ref, (S_ref, z_ref) = linear.recurrent(q, k, v)
    assert_close(S_seed, S_ref)
    assert_close(z_seed, z_ref)
    assert_close(o_seed[:, :, -1], o_ref[:, :, -1])
    assert not torch.allclose(o_seed[:, :, :-1], o_ref[:, :, :-1])
    # for a single token the one-shot prefill is the recurrence
    assert_close(seed.seed_prefill(q[:, :, :1], k[:, :, :1], v[:, :, :1])[0], o_ref[:, :, :1])


# --------------------------------------------------------------------------- epsilon and dtypes


def test_eps_keeps_underflowed_features_finite():
    """elu1 of a very negative number rounds to 0 in float32; eps keeps 0/0 away."""
    q = linear.elu1(torch.full((1, 1, 6, 4), -20.0))
    assert (q == 0).all()
    k = linear.elu1(torch.full((1, 1, 6, 4), -20.0))
    v = torch.randn(1, 1, 6, 3)
    for o in (
        linear.parallel(q, k, v)[0],
        linear.recurrent(q, k, v)[0],
        linear.chunkwise(q, k, v, chunk_size=4)[0],
        seed.seed_prefill(q, k, v)[0],
    ):
        assert torch.isfinite(o).all()
        assert (o == 0).all()


def test_eps_enters_only_the_denominator():
    q, k, v = make(1, 1, 5, 3, 2)
    num = linear.parallel(q, k, v, normalize=False)[0]
    den = (q * k.cumsum(2)).sum(-1, keepdim=True)
    for eps in (1e-300, 1e-6, 0.5):
        assert_close(linear.parallel(q, k, v, eps=eps)[0], num / (den + eps))
    assert linear.EPS == 1e-6


@pytest.mark.parametrize("eps", [0, 0.0, -1e-6, float("nan"), float("inf"), True, "1e-6"])
def test_eps_must_be_positive(eps):
    """Issue #19: eps = 0 turned a zero normaliser into 0/0 = NaN silently; it is refused."""
    q, k, v = make(1, 1, 5, 3, 2)
    for call in _all_forms(q, k, v, eps=eps):
        with pytest.raises(ValueError, match="eps must be a finite float > 0"):
            call()
    with pytest.raises(ValueError, match="eps must be a finite float > 0"):
        linear.decode_step(q[:, :, :1], k[:, :, :1], v[:, :, :1], eps=eps)
    with pytest.raises(ValueError, match="eps must be a finite float > 0"):
        seed.seed_prefill(q, k, v, eps=eps)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_low_precision_inputs(dtype):
    q, k, v = make(1, 2, 20, 4, 4, seed=3, dtype=dtype)
    o, (S, z) = linear.chunkwise(q, k, v, chunk_size=8)
    assert o.dtype == dtype and S.dtype == torch.float32 and z.dtype == torch.float32
    ref = linear.parallel(q.double(), k.double(), v.double())[0]
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(o.double(), ref, atol=tol, rtol=tol)


# --------------------------------------------------------------------------- fla oracle


def to_fla(x):
    """(B, H, T, D) <-> fla's (B, T, H, D) (a swap of axes 1 and 2, its own inverse)."""
    return x.transpose(1, 2).contiguous()


def test_fla_naive_recurrent_unnormalised():
    naive = load_naive("linear_attn")
    q, k, v = make(2, 3, 37, 8, 6, seed=21, dtype=torch.float32)
    S0, _ = make_state(2, 3, 8, 6, dtype=torch.float32)
    o_ref, S_ref = naive.naive_recurrent_linear_attn(
        to_fla(q), to_fla(k), to_fla(v), scale=1.0, initial_state=S0, output_final_state=True
    )
    state = (S0, torch.zeros(2, 3, 8))
    o, (S, _) = linear.recurrent(q, k, v, initial_state=state, normalize=False)
    o_chk, _ = linear.chunkwise(q, k, v, chunk_size=16, initial_state=state, normalize=False)
    torch.testing.assert_close(o, to_fla(o_ref), atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(o_chk.transpose(1, 2), o_ref, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(S, S_ref, atol=1e-4, rtol=1e-5)


def test_fla_naive_recurrent_normalised_with_state():
    naive = load_naive("linear_attn")
    q, k, v = make(2, 3, 29, 8, 6, seed=22, dtype=torch.float32)
    S0, z0 = make_state(2, 3, 8, 6, dtype=torch.float32)
    # fla's normaliser z is carried as (B, 1, H, K) and its epsilon is 1e-10
    o_ref, (S_ref, z_ref) = naive.naive_recurrent_linear_attn(
        to_fla(q), to_fla(k), to_fla(v), scale=1.0, initial_state=(S0, z0[:, None]),
        output_final_state=True, normalize=True,
    )
    o, (S, z) = linear.chunkwise(q, k, v, chunk_size=8, initial_state=(S0, z0), eps=1e-10)
    torch.testing.assert_close(o.transpose(1, 2), o_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(S, S_ref, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(z, z_ref[:, 0], atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("normalize", [False, True])
def test_fla_naive_chunk(normalize):
    naive = load_naive("linear_attn")
    q, k, v = make(1, 2, 128, 8, 8, seed=23, dtype=torch.float32)  # fla's chunk form needs T % 64 == 0
    o_ref = to_fla(
        naive.naive_chunk_linear_attn(to_fla(q), to_fla(k), to_fla(v), scale=1.0, normalize=normalize)
    )
    o_chk, _ = linear.chunkwise(q, k, v, chunk_size=64, eps=1e-10, normalize=normalize)
    o_par = linear.parallel(q, k, v, eps=1e-10, normalize=normalize)[0]
    torch.testing.assert_close(o_chk, o_ref, atol=2e-4, rtol=1e-5)
    torch.testing.assert_close(o_par, o_ref, atol=2e-4, rtol=1e-5)


# --------------------------------------------------------------------------- bad input


def _all_forms(q, k, v, **kw):
    yield lambda: linear.parallel(q, k, v, **kw)[0]
    yield lambda: linear.recurrent(q, k, v, **kw)
    yield lambda: linear.chunkwise(q, k, v, **kw)


@pytest.mark.parametrize(
    "case, match",
    [
        ("q_ndim", r"q must have 4 dimensions"),
        ("k_shape", r"k must have the same shape as q"),
        ("v_batch", r"v must have shape \(B, H, T, Dv\)"),
        ("v_heads", r"v must have shape \(B, H, T, Dv\)"),
        ("v_time", r"v must have shape \(B, H, T, Dv\)"),
        ("v_ndim", r"v must have 4 dimensions"),
        ("not_tensor", r"q must be a torch.Tensor"),
        ("eps", r"eps must be a finite float > 0"),
        ("int_dtype", r"v must have a floating-point dtype"),
        ("normalize", r"normalize must be True or False"),
    ],
)
def test_bad_input_raises(case, match):
    q, k, v = make(2, 3, 5, 4, 4)
    kw = {}
    if case == "q_ndim":
        q = q[0]
    elif case == "k_shape":
        k = k[..., :3]
    elif case == "v_batch":
        v = v[:1]
    elif case == "v_heads":
        v = v[:, :2]
    elif case == "v_time":
        v = v[:, :, :4]
    elif case == "v_ndim":
        v = v[..., 0]
    elif case == "not_tensor":
        q = q.tolist()
    elif case == "eps":
        kw["eps"] = -1e-6
    elif case == "int_dtype":
        v = v.long()
    elif case == "normalize":
        kw["normalize"] = 1
    for call in _all_forms(q, k, v, **kw):
        with pytest.raises(ValueError, match=match):
            call()


def test_no_host_sync_on_any_form():
    """The one argument check reads shapes and dtypes only: on meta tensors, which hold no
    values (any read raises), every form runs, the decode step included. Finite, non-negative
    features are the caller's promise (the layer checks its input and applies elu1)."""
    q, k, v = (torch.empty(1, 2, 5, 4, device="meta") for _ in range(3))
    state = (torch.empty(1, 2, 4, 4, device="meta"), torch.empty(1, 2, 4, device="meta"))
    assert linear.parallel(q, k, v)[0].device.type == "meta"
    assert linear.recurrent(q, k, v, initial_state=state)[0].shape == (1, 2, 5, 4)
    assert linear.chunkwise(q, k, v, initial_state=state, chunk_size=2)[0].shape == (1, 2, 5, 4)
    for inplace in (False, True):
        o, _ = linear.decode_step(q[:, :, :1], k[:, :, :1], v[:, :, :1], initial_state=state,
                                  inplace=inplace)
        assert o.shape == (1, 2, 1, 4)


def test_negative_features_allowed_unnormalised():
    q, k, v = make(1, 1, 5, 3, 2)
    o = linear.chunkwise(q - 2.0, k - 2.0, v, chunk_size=2, normalize=False)[0]
    assert_close(o, linear.parallel(q - 2.0, k - 2.0, v, normalize=False)[0])


@pytest.mark.parametrize("chunk_size", [0, -3, 1.5, 2.0, True, "4", None])
def test_bad_chunk_size(chunk_size):
    q, k, v = make(1, 1, 5, 3, 2)
    with pytest.raises(ValueError, match="chunk_size must be a positive int"):
        linear.chunkwise(q, k, v, chunk_size=chunk_size)


@pytest.mark.parametrize(
    "state, match",
    [
        (torch.zeros(2, 3, 4, 4), r"initial_state must be a tuple \(S, z\)"),
        ((torch.zeros(2, 3, 4, 4),), r"initial_state must be a tuple \(S, z\)"),
        ((torch.zeros(2, 3, 4, 5), torch.zeros(2, 3, 4)), r"initial_state\[0\] \(S\) must have shape \(B, H, Dk, Dv"),
        ((torch.zeros(1, 3, 4, 4), torch.zeros(2, 3, 4)), r"initial_state\[0\] \(S\) must have shape"),
        ((torch.zeros(2, 3, 4, 4), torch.zeros(2, 3, 4, 1)), r"initial_state\[1\] \(z\) must have shape \(B, H, Dk"),
        ((torch.zeros(2, 3, 4, 4), "z"), r"initial_state\[1\] \(z\) must be a torch.Tensor"),
    ],
)
def test_bad_state(state, match):
    q, k, v = make(2, 3, 5, 4, 4)
    for fn in (linear.recurrent, linear.chunkwise):
        with pytest.raises(ValueError, match=match):
            fn(q, k, v, initial_state=state)
    with pytest.raises(ValueError, match=match):
        linear.decode_step(q[:, :, :1], k[:, :, :1], v[:, :, :1], initial_state=state)


# --------------------------------------------------------------------------- the decode step


@SETTINGS
@given(shape=shapes, normalize=st.booleans(), seed=st.integers(0, 2**16), inplace=st.booleans())
def test_decode_steps_equal_recurrent(shape, normalize, seed, inplace):
    """Token by token through decode_step (copying or in place) equals the recurrence."""
    B, H, T, Dk, Dv = shape
    q, k, v = make(*shape, seed=seed)
    state = make_state(B, H, Dk, Dv, seed=seed + 1)
    o_ref, (S_ref, z_ref) = linear.recurrent(q, k, v, initial_state=state, normalize=normalize)
    st_ = (state[0].clone(), state[1].clone())
    outs = []
    for t in range(T):
        o_t, st_ = linear.decode_step(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1],
                                      initial_state=st_, normalize=normalize, inplace=inplace)
        outs.append(o_t)
    assert_close(torch.cat(outs, dim=2), o_ref)
    assert_close(st_[0], S_ref)
    assert_close(st_[1], z_ref)


def test_decode_step_inplace_or_not():
    q, k, v = make(2, 3, 1, 4, 5, seed=4, dtype=torch.float32)
    S0, z0 = make_state(2, 3, 4, 5, dtype=torch.float32)
    S_keep, z_keep = S0.clone(), z0.clone()
    _, (S1, z1) = linear.decode_step(q, k, v, initial_state=(S0, z0))
    assert torch.equal(S0, S_keep) and torch.equal(z0, z_keep)  # default: the input is untouched
    _, (S2, z2) = linear.decode_step(q, k, v, initial_state=(S0, z0), inplace=True)
    assert S2 is S0 and z2 is z0  # updated in place, no new allocation
    torch.testing.assert_close(S2, S1)
    torch.testing.assert_close(z2, z1)
    # a float16 state cannot be updated in place in float32: a new one is returned, still right
    Sh, zh = S_keep.half(), z_keep.half()
    _, (S3, _) = linear.decode_step(q, k, v, initial_state=(Sh, zh), inplace=True)
    assert S3.dtype == torch.float32 and torch.equal(Sh, S_keep.half())
    torch.testing.assert_close(S3, S1, atol=1e-2, rtol=1e-2)
    # without a state it starts from zeros
    o, (S4, z4) = linear.decode_step(q, k, v)
    torch.testing.assert_close(S4, k.transpose(-1, -2) @ v)
    torch.testing.assert_close(o, linear.parallel(q, k, v)[0])


def test_decode_step_bad_input():
    q, k, v = make(1, 2, 3, 4, 4)
    with pytest.raises(ValueError, match="must hold one token"):
        linear.decode_step(q, k, v)
    with pytest.raises(ValueError, match="k must have the same shape as q"):
        linear.decode_step(q[:, :, :1], k[:, :, :1, :3], v[:, :, :1])
    with pytest.raises(ValueError, match=r"initial_state\[0\] \(S\) must have shape"):
        linear.decode_step(q[:, :, :1], k[:, :, :1], v[:, :, :1],
                           initial_state=(torch.zeros(1, 2, 4, 3), torch.zeros(1, 2, 4)))

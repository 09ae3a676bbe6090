"""DeltaNet: the chunkwise WY/UT form equals the token-by-token definition; fla oracle; seed snippet."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from fla_oracle import load_naive
from gpt2k3.mixers import delta

SETTINGS = settings(max_examples=30, deadline=None)


def make(B, H, T, Dk, Dv, seed=0, dtype=torch.float64, beta_max=2.0):
    """L2-normalised q, k (as the layer makes them), values, and beta in [0, beta_max]."""
    g = torch.Generator().manual_seed(seed)
    q = F.normalize(torch.randn(B, H, T, Dk, generator=g, dtype=dtype), dim=-1)
    k = F.normalize(torch.randn(B, H, T, Dk, generator=g, dtype=dtype), dim=-1)
    v = torch.randn(B, H, T, Dv, generator=g, dtype=dtype)
    beta = beta_max * torch.rand(B, H, T, generator=g, dtype=dtype)
    return q, k, v, beta


def make_state(B, H, Dk, Dv, seed=1, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, H, Dk, Dv, generator=g, dtype=dtype)


def assert_close(a, b, atol=1e-10, rtol=1e-10):
    torch.testing.assert_close(a, b, atol=atol, rtol=rtol)


shapes = st.tuples(
    st.integers(1, 2),  # B
    st.integers(1, 3),  # H
    st.integers(1, 40),  # T
    st.integers(1, 6),  # Dk
    st.integers(1, 6),  # Dv
)


# --------------------------------------------------------------------------- the definition


def test_recurrent_is_the_delta_rule():
    """Spell the rule out once more, as S_t = (I - beta k^T k) S + beta k^T v, for one head."""
    q, k, v, beta = make(1, 1, 9, 4, 3, seed=2)
    S = make_state(1, 1, 4, 3)
    o, S_end = delta.recurrent(q, k, v, beta, state=S)
    S_ref = S[0, 0]
    for t in range(9):
        kt, vt, bt = k[0, 0, t : t + 1], v[0, 0, t : t + 1], beta[0, 0, t]  # (1, D) rows
        S_ref = (torch.eye(4, dtype=S_ref.dtype) - bt * kt.T @ kt) @ S_ref + bt * kt.T @ vt
        assert_close(o[0, 0, t], (q[0, 0, t : t + 1] @ S_ref)[0])
    assert_close(S_end[0, 0], S_ref)


def test_unit_key_beta_one_overwrites():
    """Writing (k, v) with a unit key and beta = 1 makes the state return exactly v for k."""
    _, k, v, _ = make(1, 1, 1, 5, 3, seed=4)
    S0 = make_state(1, 1, 5, 3)
    _, S = delta.recurrent(k, k, v, torch.ones(1, 1, 1, dtype=k.dtype), state=S0)
    assert_close(k[0, 0] @ S[0, 0], v[0, 0])


# --------------------------------------------------------------------------- chunkwise = recurrent


@SETTINGS
@given(shape=shapes, chunk=st.integers(1, 17), with_state=st.booleans(), seed=st.integers(0, 2**16))
def test_chunkwise_equals_recurrent(shape, chunk, with_state, seed):
    B, H, T, Dk, Dv = shape
    q, k, v, beta = make(*shape, seed=seed)
    state = make_state(B, H, Dk, Dv, seed=seed + 1) if with_state else None
    o_rec, S_rec = delta.recurrent(q, k, v, beta, state=state)
    o_chk, S_chk = delta.chunkwise(q, k, v, beta, chunk_size=chunk, state=state)
    assert_close(o_chk, o_rec)
    assert_close(S_chk, S_rec)


@pytest.mark.parametrize("chunk_size", [16, 32, 64, 128])
@pytest.mark.parametrize("T", [1, 77, 150])
def test_chunk_sizes_float32(chunk_size, T):
    q, k, v, beta = make(2, 2, T, 16, 8, seed=T + chunk_size, dtype=torch.float32)
    S0 = make_state(2, 2, 16, 8, dtype=torch.float32)
    o_rec, S_rec = delta.recurrent(q, k, v, beta, state=S0)
    o_chk, S_chk = delta.chunkwise(q, k, v, beta, chunk_size=chunk_size, state=S0)
    assert o_chk.dtype == S_chk.dtype == torch.float32
    torch.testing.assert_close(o_chk, o_rec, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(S_chk, S_rec, atol=1e-5, rtol=1e-5)


@SETTINGS
@given(shape=shapes, chunk=st.integers(1, 17), split=st.integers(0, 40), seed=st.integers(0, 2**16))
def test_split_processing_with_state(shape, chunk, split, seed):
    B, H, T, Dk, Dv = shape
    split = min(split, T)
    q, k, v, beta = make(*shape, seed=seed)
    S0 = make_state(B, H, Dk, Dv, seed=seed + 1)
    o_all, S_all = delta.recurrent(q, k, v, beta, state=S0)
    first = [x[:, :, :split] for x in (q, k, v, beta)]
    rest = [x[:, :, split:] for x in (q, k, v, beta)]
    o1, S1 = delta.chunkwise(*first, chunk_size=chunk, state=S0)
    o2, S2 = delta.chunkwise(*rest, chunk_size=chunk, state=S1)
    assert_close(torch.cat([o1, o2], dim=2), o_all)
    assert_close(S2, S_all)
    o3, S3 = delta.recurrent(*first, state=S0)
    o4, S4 = delta.recurrent(*rest, state=S3)
    assert_close(torch.cat([o3, o4], dim=2), o_all)
    assert_close(S4, S_all)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_inputs(dtype):
    q, k, v, beta = make(1, 2, 40, 8, 8, seed=6, dtype=dtype)
    o, S = delta.chunkwise(q, k, v, beta, chunk_size=16)
    assert o.dtype == dtype and S.dtype == torch.float32
    o_ref, _ = delta.recurrent(q.double(), k.double(), v.double(), beta.double())
    torch.testing.assert_close(o.double(), o_ref, atol=3e-2, rtol=3e-2)


# --------------------------------------------------------------------------- the seed's snippet


def test_seed_one_shot_is_the_rule_only_for_one_token():
    q, k, v, beta = make(2, 2, 12, 6, 4, seed=8, beta_max=1.0)
    S0 = make_state(2, 2, 6, 4)
    for t in range(3):  # token by token (T = 1 per call) it IS the delta rule
        token = [x[:, :, t : t + 1] for x in (q, k, v, beta)]
        o1, S1 = delta.seed_one_shot(*token, state=S0)
        o2, S2 = delta.recurrent(*token, state=S0)
        assert_close(o1, o2)
        assert_close(S1, S2)
        S0 = S1
    # over a whole sequence it is not: neither the outputs nor the final state
    o_seed, S_seed = delta.seed_one_shot(q, k, v, beta)
    o_ref, S_ref = delta.recurrent(q, k, v, beta)
    assert (o_seed - o_ref).abs().max() > 1e-2
    assert (S_seed - S_ref).abs().max() > 1e-2
    # with an empty incoming state the seed's write is purely additive: S = K^T (beta V)
    assert_close(S_seed, k.transpose(-1, -2) @ (beta[..., None] * v))


# --------------------------------------------------------------------------- fla oracle


def test_fla_delta_rule_recurrence():
    naive = load_naive("delta_rule")
    q, k, v, beta = make(2, 3, 45, 16, 8, seed=31, dtype=torch.float32)
    S0 = make_state(2, 3, 16, 8, dtype=torch.float32)
    # this reference uses our (B, H, T, D) layout but always scales q by Dk**-0.5: undo it
    o_ref, S_ref = naive.delta_rule_recurrence(q * 16**0.5, k, v, beta, initial_state=S0.clone())
    o, S = delta.chunkwise(q, k, v, beta, chunk_size=16, state=S0)
    torch.testing.assert_close(o, o_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(S, S_ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("chunk_size", [16, 32])
def test_fla_delta_rule_chunkwise(chunk_size):
    naive = load_naive("delta_rule")
    q, k, v, beta = make(2, 2, 96, 16, 8, seed=32, dtype=torch.float32)  # theirs needs T % chunk == 0
    o_ref, S_ref = naive.delta_rule_chunkwise(q * 16**0.5, k, v, beta, chunk_size=chunk_size)
    o, S = delta.recurrent(q, k, v, beta)
    torch.testing.assert_close(o, o_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(S, S_ref, atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------------------- bad input


def _forms(*args, **kw):
    yield lambda: delta.recurrent(*args, **kw)
    yield lambda: delta.chunkwise(*args, **kw)
    yield lambda: delta.seed_one_shot(*args, **kw)


@pytest.mark.parametrize(
    "case, match",
    [
        ("q_ndim", r"q must have 4 dimensions"),
        ("k_shape", r"k must have the same shape as q"),
        ("v_time", r"v must have shape \(B, H, T, Dv\)"),
        ("v_batch", r"v must have shape \(B, H, T, Dv\)"),
        ("beta_trailing_dim", r"beta must have shape \(B, H, T\) = \(2, 3, 5\)"),
        ("beta_time", r"beta must have shape \(B, H, T\)"),
        ("beta_heads", r"beta must have shape \(B, H, T\)"),
        ("beta_not_tensor", r"beta must be a torch.Tensor"),
        ("state_shape", r"state must have shape \(B, H, Dk, Dv\) = \(2, 3, 4, 4\)"),
        ("state_ndim", r"state must have shape \(B, H, Dk, Dv\)"),
        ("state_tuple", r"state must be a torch.Tensor"),
    ],
)
def test_bad_input_raises(case, match):
    q, k, v, beta = make(2, 3, 5, 4, 4)
    state = None
    if case == "q_ndim":
        q = q[..., None]
    elif case == "k_shape":
        k = k[:, :, :4]
    elif case == "v_time":
        v = v[:, :, 1:]
    elif case == "v_batch":
        v = v[:1]
    elif case == "beta_trailing_dim":
        beta = beta[..., None]
    elif case == "beta_time":
        beta = beta[..., :4]
    elif case == "beta_heads":
        beta = beta[:, :1]
    elif case == "beta_not_tensor":
        beta = 0.5
    elif case == "state_shape":
        state = torch.zeros(2, 3, 4, 5)
    elif case == "state_ndim":
        state = torch.zeros(3, 4, 4)
    elif case == "state_tuple":
        state = (torch.zeros(2, 3, 4, 4), torch.zeros(2, 3, 4))
    for call in _forms(q, k, v, beta, state=state):
        with pytest.raises(ValueError, match=match):
            call()


@pytest.mark.parametrize("chunk_size", [0, -1, 2.5, False, "64"])
def test_bad_chunk_size(chunk_size):
    q, k, v, beta = make(1, 1, 5, 3, 2)
    with pytest.raises(ValueError, match="chunk_size must be a positive int"):
        delta.chunkwise(q, k, v, beta, chunk_size=chunk_size)

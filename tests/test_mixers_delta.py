"""DeltaNet: the chunkwise WY/UT form equals the token-by-token definition; fla oracle; seed snippet;
the pieces of the chunkwise derivation (Householder product, WY factors, UT transform); the cost model."""

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from fla_oracle import load_naive
from gpt2k3 import seed
from gpt2k3.checks import check_write_strength
from gpt2k3.ops import chunks, delta, wy
from mixer_testing import assert_close, make_state, shapes  # noqa: E402

SETTINGS = settings(max_examples=30, deadline=None)


def make(B, H, T, Dk, Dv, seed=0, dtype=torch.float64, beta_max=2.0):
    """L2-normalised q, k (as the layer makes them), values, and beta in [0, beta_max]."""
    g = torch.Generator().manual_seed(seed)
    q = F.normalize(torch.randn(B, H, T, Dk, generator=g, dtype=dtype), dim=-1)
    k = F.normalize(torch.randn(B, H, T, Dk, generator=g, dtype=dtype), dim=-1)
    v = torch.randn(B, H, T, Dv, generator=g, dtype=dtype)
    beta = beta_max * torch.rand(B, H, T, generator=g, dtype=dtype)
    return q, k, v, beta


# --------------------------------------------------------------------------- the definition


def test_recurrent_is_the_delta_rule():
    """Spell the rule out once more, as S_t = (I - beta k^T k) S + beta k^T v, for one head."""
    q, k, v, beta = make(1, 1, 9, 4, 3, seed=2)
    S = make_state(1, 1, 4, 3)
    o, S_end = delta.recurrent(q, k, v, beta, initial_state=S)
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
    _, S = delta.recurrent(k, k, v, torch.ones(1, 1, 1, dtype=k.dtype), initial_state=S0)
    assert_close(k[0, 0] @ S[0, 0], v[0, 0])


# --------------------------------------------------------------------------- chunkwise = recurrent


@SETTINGS
@given(shape=shapes, chunk=st.integers(1, 17), with_state=st.booleans(), seed=st.integers(0, 2**16))
def test_chunkwise_equals_recurrent(shape, chunk, with_state, seed):
    B, H, T, Dk, Dv = shape
    q, k, v, beta = make(*shape, seed=seed)
    state = make_state(B, H, Dk, Dv, seed=seed + 1) if with_state else None
    o_rec, S_rec = delta.recurrent(q, k, v, beta, initial_state=state)
    o_chk, S_chk = delta.chunkwise(q, k, v, beta, chunk_size=chunk, initial_state=state)
    assert_close(o_chk, o_rec)
    assert_close(S_chk, S_rec)


@pytest.mark.parametrize("chunk_size", [16, 32, 64, 128])
@pytest.mark.parametrize("T", [1, 77, 150])
def test_chunk_sizes_float32(chunk_size, T):
    q, k, v, beta = make(2, 2, T, 16, 8, seed=T + chunk_size, dtype=torch.float32)
    S0 = make_state(2, 2, 16, 8, dtype=torch.float32)
    o_rec, S_rec = delta.recurrent(q, k, v, beta, initial_state=S0)
    o_chk, S_chk = delta.chunkwise(q, k, v, beta, chunk_size=chunk_size, initial_state=S0)
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
    o_all, S_all = delta.recurrent(q, k, v, beta, initial_state=S0)
    first = [x[:, :, :split] for x in (q, k, v, beta)]
    rest = [x[:, :, split:] for x in (q, k, v, beta)]
    o1, S1 = delta.chunkwise(*first, chunk_size=chunk, initial_state=S0)
    o2, S2 = delta.chunkwise(*rest, chunk_size=chunk, initial_state=S1)
    assert_close(torch.cat([o1, o2], dim=2), o_all)
    assert_close(S2, S_all)
    o3, S3 = delta.recurrent(*first, initial_state=S0)
    o4, S4 = delta.recurrent(*rest, initial_state=S3)
    assert_close(torch.cat([o3, o4], dim=2), o_all)
    assert_close(S4, S_all)


@settings(max_examples=20, deadline=None)
@given(
    shape=st.tuples(st.integers(1, 2), st.integers(1, 2), st.integers(1, 300), st.integers(1, 8),
                    st.integers(1, 8)),
    chunk=st.sampled_from([16, 32, 64, 128]),
    beta_max=st.sampled_from([0.0, 1.0, 2.0]),
    split=st.integers(0, 300),
    seed=st.integers(0, 2**16),
)
def test_book_chunk_sizes_with_state_and_splits(shape, chunk, beta_max, split, seed):
    """The chunk sizes the book uses, beta anywhere in [0, 2], an initial state, two pieces."""
    B, H, T, Dk, Dv = shape
    split = min(split, T)
    q, k, v, beta = make(*shape, seed=seed, beta_max=beta_max)
    S0 = make_state(B, H, Dk, Dv, seed=seed + 1)
    o_rec, S_rec = delta.recurrent(q, k, v, beta, initial_state=S0)
    o1, S1 = delta.chunkwise(*(x[:, :, :split] for x in (q, k, v, beta)), chunk_size=chunk, initial_state=S0)
    o2, S2 = delta.chunkwise(*(x[:, :, split:] for x in (q, k, v, beta)), chunk_size=chunk, initial_state=S1)
    assert_close(torch.cat([o1, o2], dim=2), o_rec, atol=1e-9, rtol=1e-9)
    assert_close(S2, S_rec, atol=1e-9, rtol=1e-9)


@pytest.mark.parametrize("elements", [1, 5_000])
def test_chunks_processed_in_groups(monkeypatch, elements):
    """A small memory budget splits the chunks into many groups (one chunk each at the extreme)."""
    monkeypatch.setattr(chunks, "BLOCK_ELEMENTS", elements)
    q, k, v, beta = make(2, 2, 203, 6, 5, seed=41)
    S0 = make_state(2, 2, 6, 5)
    o_rec, S_rec = delta.recurrent(q, k, v, beta, initial_state=S0)
    o_chk, S_chk = delta.chunkwise(q, k, v, beta, chunk_size=16, initial_state=S0)
    assert_close(o_chk, o_rec)
    assert_close(S_chk, S_rec)


def test_gradients_match_the_recurrence():
    """The chunked form is differentiable (layers train through it) with the recurrence's gradients."""
    q, k, v, beta = (x.requires_grad_() for x in make(1, 2, 37, 5, 3, seed=43))
    S0 = make_state(1, 2, 5, 3).requires_grad_()
    inputs = (q, k, v, beta, S0)

    def grads(fn, **kw):
        o, S = fn(q, k, v, beta, initial_state=S0, **kw)
        return torch.autograd.grad((o * o).sum() + S.sum(), inputs)

    for g_chk, g_rec in zip(grads(delta.chunkwise, chunk_size=8), grads(delta.recurrent)):
        assert_close(g_chk, g_rec)


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
        o1, S1 = seed.seed_one_shot(*token, initial_state=S0)
        o2, S2 = delta.recurrent(*token, initial_state=S0)
        assert_close(o1, o2)
        assert_close(S1, S2)
        S0 = S1
    # over a whole sequence it is not: neither the outputs nor the final state
    o_seed, S_seed = seed.seed_one_shot(q, k, v, beta)
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
    o, S = delta.chunkwise(q, k, v, beta, chunk_size=16, initial_state=S0)
    torch.testing.assert_close(o, o_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(S, S_ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("chunk_size", [16, 32, 64])
def test_fla_delta_rule_chunkwise(chunk_size):
    naive = load_naive("delta_rule")
    q, k, v, beta = make(2, 2, 192, 16, 8, seed=32, dtype=torch.float32)  # theirs needs T % chunk == 0
    o_ref, S_ref = naive.delta_rule_chunkwise(q * 16**0.5, k, v, beta, chunk_size=chunk_size)
    for o, S in (delta.recurrent(q, k, v, beta), delta.chunkwise(q, k, v, beta, chunk_size=chunk_size),
                 delta.chunkwise_reference(q, k, v, beta, chunk_size=chunk_size)):
        torch.testing.assert_close(o, o_ref, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(S, S_ref, atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------------------- chunkwise reference


@pytest.mark.parametrize("T, chunk", [(1, 4), (7, 4), (16, 4), (45, 16), (100, 64), (63, 64)])
@pytest.mark.parametrize("with_state", [False, True])
def test_chunkwise_reference_equals_recurrent_and_the_fast_core(T, chunk, with_state):
    q, k, v, beta = make(2, 3, T, 8, 5, seed=T)
    S0 = make_state(2, 3, 8, 5, seed=T + 1) if with_state else None
    o_ref, S_ref = delta.chunkwise_reference(q, k, v, beta, initial_state=S0, chunk_size=chunk)
    for o, S in (delta.recurrent(q, k, v, beta, initial_state=S0),
                 delta.chunkwise(q, k, v, beta, initial_state=S0, chunk_size=chunk)):
        assert_close(o, o_ref)
        assert_close(S, S_ref)


def test_chunkwise_reference_equals_fla_naive_chunkwise():
    naive = load_naive("delta_rule")
    q, k, v, beta = make(2, 2, 128, 16, 8, seed=33, dtype=torch.float32)  # theirs needs T % chunk == 0
    o_fla, S_fla = naive.delta_rule_chunkwise(q * 16**0.5, k, v, beta, chunk_size=32)
    o, S = delta.chunkwise_reference(q, k, v, beta, chunk_size=32)
    torch.testing.assert_close(o, o_fla, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(S, S_fla, atol=1e-5, rtol=1e-5)


def test_chunkwise_reference_low_precision_inputs():
    q, k, v, beta = make(1, 2, 20, 8, 4, seed=34, dtype=torch.bfloat16, beta_max=1.0)
    o, S = delta.chunkwise_reference(q, k, v, beta, chunk_size=8)
    o_rec, S_rec = delta.recurrent(q, k, v, beta)
    assert o.dtype == torch.bfloat16 and S.dtype == torch.float32
    torch.testing.assert_close(S, S_rec, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("form", ["recurrent", "chunkwise_reference", "chunkwise"])
@pytest.mark.parametrize("empty", ["B", "H", "T"])
def test_empty_batch_heads_or_time_give_empty_results(form, empty):
    B, H, T = (0 if empty == n else d for n, d in (("B", 2), ("H", 3), ("T", 5)))
    q, k, v, beta = make(B, H, T, 4, 3)
    S0 = make_state(B, H, 4, 3)
    o, S = getattr(delta, form)(q, k, v, beta, initial_state=S0)
    assert o.shape == (B, H, T, 3) and S.shape == (B, H, 4, 3)
    assert torch.equal(S, S0)


# --------------------------------------------------------------------------- bad input


SHAPE = r"must be a floating tensor of shape"


@pytest.mark.parametrize(
    "case, match",
    [
        ("q_ndim", r"q and v must be tensors \(B, H, T, D\)"),
        ("k_shape", rf"k {SHAPE} \(2, 3, 5, 4\), got shape \(2, 3, 4, 4\)"),
        ("v_time", rf"v {SHAPE} \(2, 3, 5, 4\)"),
        ("v_batch", rf"v {SHAPE}|k {SHAPE}"),
        ("beta_trailing_dim", rf"beta {SHAPE} \(2, 3, 5\)"),
        ("beta_time", rf"beta {SHAPE}"),
        ("beta_heads", rf"beta {SHAPE}"),
        ("beta_not_tensor", rf"beta {SHAPE} \(2, 3, 5\), got float"),
        ("state_shape", rf"initial_state {SHAPE} \(2, 3, 4, 4\)"),
        ("state_ndim", rf"initial_state {SHAPE}"),
        ("state_tuple", rf"initial_state {SHAPE} \(2, 3, 4, 4\), got tuple"),
        ("int_v", r"v must be|q, k and v must share one dtype"),
        ("int_beta", rf"beta {SHAPE}"),
        ("k_dtype", r"q, k and v must share one dtype"),
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
    elif case == "int_v":
        v = v.long()
    elif case == "int_beta":
        beta = torch.ones(2, 3, 5, dtype=torch.long)
    elif case == "k_dtype":
        k = k.float()
    for call in _ops(q, k, v, beta, initial_state=state):
        with pytest.raises(ValueError, match=match):
            call()


def _ops(*args, **kw):
    yield lambda: delta.recurrent(*args, **kw)
    yield lambda: delta.chunkwise(*args, **kw)
    yield lambda: delta.chunkwise_reference(*args, **kw)


BETA_K = r"beta \* \|\|k\|\|\^2 must be in \[0, 2\]"


@pytest.mark.parametrize("case", ["q_nan", "k_inf", "beta_nan", "state_nan"])
def test_the_door_reads_no_value(case):
    """The ops' door checks shapes and dtypes only (it never waits on the device): a NaN or an inf
    in an input is outside their contract and flows through the arithmetic, in every form alike.
    The layers give the ops finite inputs by construction."""
    q, k, v, beta = make(2, 3, 5, 4, 4)
    state = torch.zeros(2, 3, 4, 4, dtype=q.dtype)
    {"q_nan": q, "k_inf": k, "beta_nan": beta, "state_nan": state}[case].view(-1)[7] = \
        float("inf") if case == "k_inf" else float("nan")
    for call in _ops(q, k, v, beta, initial_state=state):
        o, S = call()
        assert not torch.isfinite(o).all() or not torch.isfinite(S).all()


@pytest.mark.parametrize("bad", [-0.01, 2.01, 5.0, float("nan"), float("inf")])
def test_write_strength_outside_0_2_is_named_by_the_diagnostic(bad):
    """beta |k|^2 outside [0, 2] makes the update expansive (issue #19's all-NaN states): the ops
    compute it as asked, and :func:`gpt2k3.checks.check_write_strength` -- the check the
    chapter-5 pieces run at their door -- names beta and k."""
    q, k, v, beta = make(1, 2, 6, 4, 3)
    beta[0, 1, 3] = bad
    match = BETA_K if math.isfinite(bad) else "beta"
    with pytest.raises(ValueError, match=match):
        check_write_strength(beta, k)
    for fn in (wy.householder_product, wy.ut_transform, delta.ut_transform):
        with pytest.raises(ValueError, match=match):
            fn(k[0, 1], beta[0, 1])
    with pytest.raises(ValueError, match=match):
        wy.wy_representation(k[0, 1], v[0, 1], beta[0, 1])


@pytest.mark.parametrize("norm", [10.0, 30.0])
def test_long_keys_named_by_the_diagnostic(norm):
    """Issue #19: keys of norm 10-30 with beta = 1 give an expansive update. The diagnostic names
    beta and |k|^2; scaled down to beta |k|^2 <= 2 the same keys are fine and the forms agree."""
    q, k, v, beta = make(1, 2, 200, 4, 3, seed=3)
    k = k * norm
    with pytest.raises(ValueError, match=BETA_K) as info:
        check_write_strength(torch.ones_like(beta), k)
    assert f"||k||^2 = {norm ** 2:g}" in str(info.value)
    scaled = beta / norm**2
    o_rec, S_rec = delta.recurrent(q, k, v, scaled)
    o_chk, S_chk = delta.chunkwise(q, k, v, scaled, chunk_size=16)
    assert torch.isfinite(o_rec).all()
    assert_close(o_chk, o_rec, atol=1e-9, rtol=1e-9)
    assert_close(S_chk, S_rec, atol=1e-9, rtol=1e-9)


def test_write_strength_tolerates_rounding_only():
    """beta = 2 with float32-normalised keys (|k|^2 = 1 +- 1e-7) passes the diagnostic;
    2 (1 + 1e-4) does not."""
    q, k, v, _ = make(1, 1, 50, 16, 4, seed=5, dtype=torch.float32)
    two = torch.full((1, 1, 50), 2.0)
    check_write_strength(two, k)
    o_rec, _ = delta.recurrent(q, k, v, two)
    o_chk, _ = delta.chunkwise(q, k, v, two, chunk_size=16)
    torch.testing.assert_close(o_chk, o_rec, atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match=BETA_K):
        check_write_strength(two * (1 + 1e-4), k)
    # zero keys write nothing, whatever beta is
    zero_k = torch.zeros_like(k)
    _, S = delta.chunkwise(q, zero_k, v, two, chunk_size=8)
    assert not S.any()


def test_beta_at_the_ends_of_the_range_is_accepted():
    q, k, v, _ = make(1, 1, 6, 4, 3)
    for b in (0.0, 2.0):
        beta = torch.full((1, 1, 6), b, dtype=q.dtype)
        o_rec, S_rec = delta.recurrent(q, k, v, beta)
        o_chk, S_chk = delta.chunkwise(q, k, v, beta, chunk_size=4)
        assert_close(o_chk, o_rec)
        assert_close(S_chk, S_rec)
        if b == 0.0:
            assert not S_rec.any()  # beta = 0 writes nothing
    # one write with beta = 2 into an empty state: the key reads back 2 v
    _, S = delta.recurrent(k[:, :, :1], k[:, :, :1], v[:, :, :1], torch.full((1, 1, 1), 2.0, dtype=q.dtype))
    assert_close(k[0, 0, :1] @ S[0, 0], 2 * v[0, 0, :1])


@pytest.mark.parametrize("chunk_size", [0, -1, 2.5, False, "64"])
def test_bad_chunk_size(chunk_size):
    q, k, v, beta = make(1, 1, 5, 3, 2)
    with pytest.raises(ValueError, match="chunk_size must be a positive int"):
        delta.chunkwise(q, k, v, beta, chunk_size=chunk_size)


# --------------------------------------------------------------------------- the derivation, piece by piece


def chunk(C, Dk, Dv, seed, lead=()):
    g = torch.Generator().manual_seed(seed)
    k = F.normalize(torch.randn(*lead, C, Dk, generator=g, dtype=torch.float64), dim=-1)
    v = torch.randn(*lead, C, Dv, generator=g, dtype=torch.float64)
    beta = 2 * torch.rand(*lead, C, generator=g, dtype=torch.float64)
    return k, v, beta


@pytest.mark.parametrize("lead", [(), (3,), (2, 2)])
def test_householder_product_is_the_product_of_the_factors(lead):
    k, _, beta = chunk(7, 5, 3, seed=50, lead=lead)
    P = delta.householder_product(k, beta)
    assert P.shape == (*lead, 5, 5)
    eye = torch.eye(5, dtype=torch.float64)
    ref = eye.expand(*lead, 5, 5)
    for t in range(7):
        kt = k[..., t, :, None]  # column vector k_t^T
        ref = (eye - beta[..., t, None, None] * kt @ kt.transpose(-1, -2)) @ ref
    assert_close(P, ref)


def test_unit_key_beta_two_is_a_reflection():
    k, _, _ = chunk(1, 6, 1, seed=51)
    H = delta.householder_product(k, torch.full((1,), 2.0, dtype=torch.float64))
    assert_close(H @ H.T, torch.eye(6, dtype=torch.float64))  # orthogonal
    assert_close(k @ H, -k)  # flips the key's direction


@pytest.mark.parametrize("C", [1, 2, 9, 16, 33, 64])
def test_wy_factors_represent_the_chunk(C):
    """I - K^T W is the chunk's transition; S + K^T (U - W S) is the state after the chunk."""
    k, v, beta = chunk(C, 6, 4, seed=52 + C)
    W, U = delta.wy_representation(k, v, beta)
    eye = torch.eye(6, dtype=torch.float64)
    assert_close(delta.householder_product(k, beta), eye - k.T @ W)
    S0 = make_state(1, 1, 6, 4, seed=C)[0, 0]
    _, S = delta.recurrent(k[None, None], k[None, None], v[None, None], beta[None, None],
                           initial_state=S0[None, None])
    assert_close(S[0, 0], S0 + k.T @ (U - W @ S0))


@pytest.mark.parametrize("C", [1, 5, 16, 17, 33, 64, 100])
def test_ut_transform_gives_the_wy_factors(C):
    k, v, beta = chunk(C, 8, 3, seed=60 + C, lead=(2,))
    T_ut = delta.ut_transform(k, beta)
    # the definition, with a general-purpose inverse
    A = torch.tril(beta[..., None] * (k @ k.transpose(-1, -2)), -1)
    ref = torch.linalg.inv(torch.eye(C, dtype=torch.float64) + A) @ torch.diag_embed(beta)
    assert_close(T_ut, ref, atol=1e-9, rtol=1e-9)
    assert torch.equal(T_ut, T_ut.tril())
    W, U = delta.wy_representation(k, v, beta)
    assert_close(T_ut @ k, W, atol=1e-9, rtol=1e-9)
    assert_close(T_ut @ v, U, atol=1e-9, rtol=1e-9)


def test_chunk_outputs_from_the_wy_factors():
    """Inside one chunk: O = Q S0 + tril(Q K^T) (U - W S0) is the recurrence's output."""
    k, v, beta = chunk(12, 5, 4, seed=70)
    g = torch.Generator().manual_seed(71)
    q = F.normalize(torch.randn(12, 5, generator=g, dtype=torch.float64), dim=-1)
    S0 = make_state(1, 1, 5, 4, seed=72)[0, 0]
    T_ut = delta.ut_transform(k, beta)
    O = q @ S0 + (q @ k.T).tril() @ (T_ut @ v - T_ut @ k @ S0)
    o_rec, _ = delta.recurrent(q[None, None], k[None, None], v[None, None], beta[None, None],
                               initial_state=S0[None, None])
    assert_close(O, o_rec[0, 0])


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda k, v, b: delta.householder_product(k[0], b), r"k must have shape \(\.\.\., C, Dk\)"),
        (lambda k, v, b: delta.householder_product(k, b[:-1]), r"beta must have shape \(\.\.\., C\)"),
        (lambda k, v, b: delta.wy_representation(k, v[:-1], b), r"v must have shape \(\.\.\., C, Dv\)"),
        (lambda k, v, b: delta.ut_transform(k, 0.5), r"beta must be a torch.Tensor"),
        (lambda k, v, b: delta.wy_representation(k.tolist(), v, b), r"k must be a torch.Tensor"),
    ],
)
def test_derivation_helpers_reject_bad_input(call, match):
    k, v, beta = chunk(4, 3, 2, seed=80)
    with pytest.raises(ValueError, match=match):
        call(k, v, beta)


# --------------------------------------------------------------------------- the cost model


def test_chunkwise_cost_counts():
    T, C, d = 4096, 64, 64
    c = delta.chunkwise_cost(T, C, d)
    assert c.sequential_steps == 64 and c.recurrent_steps == T
    assert c.recurrent_flops == 2 * 3 * T * d * d
    assert c.sequential_flops == 2 * 2 * T * d * d  # u = U - W S and S += K^T u
    n = T // C
    inverse = wy._inverse_macs(C)
    per_chunk = 2 * C * C * d + inverse + C * C * 2 * d + C * d * d + C * C * d
    assert c.parallel_flops == 2 * n * per_chunk
    assert c.flops == c.parallel_flops + c.sequential_flops
    assert math.isclose(c.flops_ratio, c.flops / c.recurrent_flops)
    # more work per token with bigger chunks, fewer sequential steps
    costs = [delta.chunkwise_cost(T, cs, d) for cs in (1, 16, 64, 256)]
    assert all(a.flops < b.flops for a, b in zip(costs, costs[1:]))
    assert [c.sequential_steps for c in costs] == [4096, 256, 64, 16]
    # a shorter last chunk is counted as what it is
    ragged = delta.chunkwise_cost(100, 64, 8, 4)
    assert ragged.sequential_steps == 2 and ragged.d_v == 4
    assert ragged.parallel_flops == sum(2 * wy._chunk_macs(c, 8, 4)[0] for c in (64, 36))


def test_inverse_macs_follow_the_recursion():
    assert wy._inverse_macs(16) == 16**3 // 2
    assert wy._inverse_macs(32) == 2 * (16**3 // 2) + 16**3 + 16**3


@pytest.mark.parametrize("args, match", [((0, 64), "T must be a positive int"),
                                         ((64, 0), "chunk_size must be a positive int"),
                                         ((64, 16, 0), "d_k must be a positive int"),
                                         ((64, 16, 8, 2.5), "d_v must be a positive int")])
def test_chunkwise_cost_rejects_bad_input(args, match):
    with pytest.raises(ValueError, match=match):
        delta.chunkwise_cost(*args)


def test_wy_pieces_are_re_exported():
    for name in ("householder_product", "wy_representation", "ut_transform", "ChunkCost", "chunkwise_cost"):
        assert getattr(delta, name) is getattr(wy, name)


def test_reference_form_shares_no_code_with_the_chunked_core(monkeypatch):
    """delta.recurrent and delta.chunkwise_reference are their own loops: breaking the chunked
    core leaves them untouched."""
    q, k, v, beta = make(1, 2, 9, 3, 2, seed=90)
    before = delta.recurrent(q, k, v, beta)

    def broken(*args, **kwargs):
        raise AssertionError("the reference form must not call the chunked core")

    for name in ("unit_lower_inverse", "channel_decays", "chunk_decays", "intra_chunk",
                 "intra_chunk_gated", "pass_state"):
        monkeypatch.setattr(chunks, name, broken)
    after = delta.recurrent(q, k, v, beta)
    assert torch.equal(before[0], after[0]) and torch.equal(before[1], after[1])
    reference = delta.chunkwise_reference(q, k, v, beta, chunk_size=4)  # nor does the chunked reference
    assert_close(reference[0], before[0]) and assert_close(reference[1], before[1])
    with pytest.raises(AssertionError, match="must not call"):
        monkeypatch.setattr(delta, "intra_chunk", broken)
        delta.chunkwise(q, k, v, beta)

"""Softmax attention: the fast form (whole sequences, chunks after a cache, one decode query)
equals the one-query-at-a-time reference, SDPA and GPT-2's attention; bad input raises."""

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from gpt2k3.ops import softmax

SETTINGS = settings(max_examples=25, deadline=None)


def make(B, H, T, D, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, H, T, D, generator=g, dtype=dtype) for _ in range(3))


def definition(q, k, v, scale=None):
    """Position by position, straight from the formula (queries are the last Tq positions);
    independent of both forms under test."""
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    Tq, Tk = q.shape[2], k.shape[2]
    out = torch.empty(*q.shape[:3], v.shape[-1], dtype=q.dtype)
    for i in range(Tq):
        p = Tk - Tq + i
        w = torch.softmax((q[:, :, i:i + 1] @ k[:, :, :p + 1].transpose(-1, -2)) * scale, dim=-1)
        out[:, :, i:i + 1] = w @ v[:, :, :p + 1]
    return out


shapes = st.tuples(st.integers(1, 2), st.integers(1, 3), st.integers(1, 24), st.integers(1, 8))


@SETTINGS
@given(shape=shapes, seed=st.integers(0, 2**16), scale=st.sampled_from([None, 0.3, 2.0]))
def test_parallel_matches_definition_recurrent_and_sdpa(shape, seed, scale):
    q, k, v = make(*shape, seed=seed)
    o = softmax.parallel(q, k, v, scale=scale)
    torch.testing.assert_close(o, definition(q, k, v, scale), atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(o, softmax.recurrent(q, k, v, scale=scale), atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(o, F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale),
                               atol=1e-12, rtol=1e-12)


@SETTINGS
@given(shape=shapes, past=st.integers(0, 24), seed=st.integers(0, 2**16),
       scale=st.sampled_from([None, 0.5]))
def test_a_chunk_after_a_cache_is_the_tail_of_the_whole(shape, past, seed, scale):
    """Queries for the last Tq positions (Tq = 1 and Tq > 1 paths): the full run's last rows."""
    B, H, T, D = shape
    past = min(past, T - 1)
    q, k, v = make(*shape, seed=seed)
    full = softmax.parallel(q, k, v, scale=scale)
    tail = softmax.parallel(q[:, :, past:], k, v, scale=scale)
    torch.testing.assert_close(tail, full[:, :, past:], atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(softmax.recurrent(q[:, :, past:], k, v, scale=scale), tail,
                               atol=1e-12, rtol=1e-12)
    # decode token by token: Tq = 1 against the keys so far
    for t in range(past, T):
        o_t = softmax.parallel(q[:, :, t:t + 1], k[:, :, :t + 1], v[:, :, :t + 1], scale=scale)
        torch.testing.assert_close(o_t, full[:, :, t:t + 1], atol=1e-12, rtol=1e-12)


def test_causal_mask():
    m = softmax.causal_mask(2, 3)
    assert m.shape == (2, 5) and m.dtype == torch.bool
    assert m.tolist() == [[True] * 4 + [False], [True] * 5]
    assert torch.equal(softmax.causal_mask(4, 0), torch.ones(4, 4, dtype=torch.bool).tril())


def test_parallel_equals_gpt2_attention_heads():
    """With GPT-2's projections around it, parallel() is GPT-2's attention."""
    from gpt2k3.layers.attention import CausalSelfAttention
    from gpt2k3.config import GPTConfig

    torch.manual_seed(0)
    cfg = GPTConfig(n_embd=32, n_head=4, n_layer=1, vocab_size=11, block_size=16)
    attn = CausalSelfAttention(cfg).eval()
    x = torch.randn(2, 9, 32)
    q, k, v = attn.c_attn(x).split(32, dim=2)
    q, k, v = (t.view(2, 9, 4, 8).transpose(1, 2) for t in (q, k, v))
    y = softmax.parallel(q, k, v).transpose(1, 2).reshape(2, 9, 32)
    torch.testing.assert_close(attn.c_proj(y), attn(x), atol=1e-6, rtol=1e-5)


def test_written_out_attention_equals_the_fused_layer_and_the_token_loop():
    """Chapter 1's GPT2Attention (scores, mask, softmax, weighted values written out) equals the
    fused layer with the same weights, and its heads equal recurrent(), one query at a time."""
    from gpt2k3.config import GPTConfig
    from gpt2k3.layers.attention import CausalSelfAttention, GPT2Attention

    torch.manual_seed(0)
    cfg = GPTConfig(n_embd=32, n_head=4, n_layer=1, vocab_size=11, block_size=16)
    written, fused = GPT2Attention(cfg).eval(), CausalSelfAttention(cfg).eval()
    fused.load_state_dict(written.state_dict())
    x = torch.randn(2, 9, 32)
    torch.testing.assert_close(written(x), fused(x), atol=1e-6, rtol=1e-5)
    q, k, v = written.c_attn(x).split(32, dim=2)
    q, k, v = (t.view(2, 9, 4, 8).transpose(1, 2) for t in (q, k, v))
    y = softmax.recurrent(q, k, v).transpose(1, 2).reshape(2, 9, 32)
    torch.testing.assert_close(written.c_proj(y), written(x), atol=1e-6, rtol=1e-5)


def test_parallel_is_causal():
    q, k, v = make(1, 2, 10, 4, seed=3)
    k2, v2 = k.clone(), v.clone()
    k2[:, :, 6] += 1.0
    v2[:, :, 6] -= 2.0
    for fn in (softmax.parallel, softmax.recurrent):
        a, b = fn(q, k, v), fn(q, k2, v2)
        assert torch.equal(a[:, :, :6], b[:, :, :6])
        assert not torch.allclose(a[:, :, 6:], b[:, :, 6:])


def test_one_query_over_a_long_cache_float32():
    q, k, v = make(1, 3, 50, 16, seed=9, dtype=torch.float32)
    o = softmax.parallel(q[:, :, -1:], k, v)
    assert o.dtype == torch.float32
    torch.testing.assert_close(o, softmax.recurrent(q, k, v)[:, :, -1:], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_inputs(dtype):
    q, k, v = make(1, 2, 12, 8, seed=4, dtype=dtype)
    ref = softmax.recurrent(q.double(), k.double(), v.double())
    for qq in (q, q[:, :, -1:], q[:, :, 5:]):
        o = softmax.parallel(qq, k, v)
        assert o.dtype == dtype
        torch.testing.assert_close(o.double(), ref[:, :, -qq.shape[2]:], atol=2e-2, rtol=2e-2)
    assert softmax.recurrent(q, k, v).dtype == dtype


def test_dropout():
    q, k, v = make(1, 2, 6, 4, seed=5)
    torch.manual_seed(0)
    o = softmax.parallel(q, k, v, dropout_p=0.5)
    assert o.shape == (1, 2, 6, 4) and torch.isfinite(o).all()
    assert not torch.allclose(o, softmax.parallel(q, k, v))
    o1 = softmax.parallel(q[:, :, -1:], k, v, dropout_p=0.5)  # the Tq = 1 path with dropout
    assert o1.shape == (1, 2, 1, 4)


def test_empty_query_chunk():
    q, k, v = make(1, 2, 4, 3)
    assert softmax.parallel(q[:, :, :0], k, v).shape == (1, 2, 0, 3)
    assert softmax.recurrent(q[:, :, :0], k, v).shape == (1, 2, 0, 3)


@pytest.mark.parametrize("Tq", [1, 3, 8])
def test_no_host_sync_on_any_path(Tq):
    """The argument check reads shapes and dtypes only: on meta tensors, which hold no values
    (any read of one raises), every path of parallel runs, a decode step (Tq = 1) included.
    Whether values are finite is checked at the front doors (layer input, cache writes)."""
    q, k, v = (torch.randn(1, 2, n, 4, device="meta") for n in (Tq, 8, 8))
    assert softmax.parallel(q, k, v).shape == (1, 2, Tq, 4)
    assert softmax.parallel(q, k, v, scale=0.5).device.type == "meta"


def test_mixed_dtypes_raise():
    q, k, v = make(1, 2, 4, 3)
    with pytest.raises(ValueError, match="k and v must have q's dtype"):
        softmax.parallel(q.float(), k, v)


@pytest.mark.parametrize("scale", [0, -1.0, float("nan"), float("inf"), True, "0.5"])
def test_bad_scale(scale):
    q, k, v = make(1, 1, 3, 4)
    for fn in (softmax.parallel, softmax.recurrent):
        with pytest.raises(ValueError, match="scale must be None or a finite float > 0"):
            fn(q, k, v, scale=scale)


@pytest.mark.parametrize("p", [-0.1, 1.0, float("nan"), "0.1", True])
def test_bad_dropout(p):
    q, k, v = make(1, 1, 3, 4)
    with pytest.raises(ValueError, match=r"dropout_p must be a float in \[0, 1\)"):
        softmax.parallel(q, k, v, dropout_p=p)


@pytest.mark.parametrize("case, match", [
    ("k_dim", r"k must have shape \(B, H, Tk, Dk\) = \(1, 2, \*, 4\)"),
    ("k_heads", r"k must have shape \(B, H, Tk, Dk\)"),
    ("v_time", r"v must have shape \(B, H, Tk, Dv\)"),
    ("short_k", r"k must hold at least as many positions as q"),
    ("q_ndim", r"q must have 4 dimensions"),
    ("int", r"q must have a floating-point dtype"),
    ("list", r"v must be a torch.Tensor"),
])
def test_bad_shapes(case, match):
    q, k, v = make(1, 2, 5, 4)
    if case == "k_dim":
        k = k[..., :3]
    elif case == "k_heads":
        k = k[:, :1]
    elif case == "v_time":
        v = v[:, :, :4]
    elif case == "short_k":
        k, v = k[:, :, :3], v[:, :, :3]
    elif case == "q_ndim":
        q = q[0]
    elif case == "int":
        q = q.long()
    elif case == "list":
        v = v.tolist()
    for fn in (softmax.parallel, softmax.recurrent):
        with pytest.raises(ValueError, match=match):
            fn(q, k, v)

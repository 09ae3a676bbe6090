"""Softmax attention: the masked parallel form, and decode steps against a KV cache."""

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from gpt2k3.gpt2 import CausalSelfAttention, GPTConfig
from gpt2k3.kv_cache import KVCache
from gpt2k3.layers import StateCache
from gpt2k3.mixers import softmax

SETTINGS = settings(max_examples=25, deadline=None)


def make(B, H, T, D, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, H, T, D, generator=g, dtype=dtype) for _ in range(3))


def reference(q, k, v, scale=None):
    """Position by position, straight from the definition."""
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    out = torch.empty_like(v)
    for t in range(q.shape[2]):
        w = torch.softmax((q[:, :, t:t + 1] @ k[:, :, :t + 1].transpose(-1, -2)) * scale, dim=-1)
        out[:, :, t:t + 1] = w @ v[:, :, :t + 1]
    return out


shapes = st.tuples(st.integers(1, 2), st.integers(1, 3), st.integers(1, 24), st.integers(1, 8))


@SETTINGS
@given(shape=shapes, seed=st.integers(0, 2**16), scale=st.sampled_from([None, 0.3, 2.0]))
def test_parallel_matches_definition_and_sdpa(shape, seed, scale):
    q, k, v = make(*shape, seed=seed)
    o = softmax.parallel(q, k, v, scale=scale)
    torch.testing.assert_close(o, reference(q, k, v, scale), atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(o, F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale),
                               atol=1e-12, rtol=1e-12)


def test_parallel_equals_gpt2_attention_heads():
    """With GPT-2's projections around it, parallel() is GPT-2's attention."""
    torch.manual_seed(0)
    cfg = GPTConfig(n_embd=32, n_head=4, n_layer=1, vocab_size=11, block_size=16)
    attn = CausalSelfAttention(cfg).eval()
    x = torch.randn(2, 9, 32)
    q, k, v = attn.c_attn(x).split(32, dim=2)
    q, k, v = (t.view(2, 9, 4, 8).transpose(1, 2) for t in (q, k, v))
    y = softmax.parallel(q, k, v).transpose(1, 2).reshape(2, 9, 32)
    torch.testing.assert_close(attn.c_proj(y), attn(x), atol=1e-6, rtol=1e-5)


def test_parallel_is_causal():
    q, k, v = make(1, 2, 10, 4, seed=3)
    k2, v2 = k.clone(), v.clone()
    k2[:, :, 6] += 1.0
    v2[:, :, 6] -= 2.0
    a, b = softmax.parallel(q, k, v), softmax.parallel(q, k2, v2)
    assert torch.equal(a[:, :, :6], b[:, :, :6])
    assert not torch.allclose(a[:, :, 6:], b[:, :, 6:])


@SETTINGS
@given(shape=shapes, prefill=st.integers(0, 24), seed=st.integers(0, 2**16))
def test_decode_steps_equal_parallel(shape, prefill, seed):
    """Prefill some tokens into the cache, decode the rest one by one: every output equals
    the parallel form's row for that position."""
    B, H, T, D = shape
    prefill = min(prefill, T - 1)
    q, k, v = make(*shape, seed=seed)
    full = softmax.parallel(q, k, v)
    cache = KVCache(2, B, H, T, D, dtype=torch.float64)
    layer = 1
    if prefill:
        cache.update(layer, k[:, :, :prefill], v[:, :, :prefill])
        cache.advance(prefill)
    for t in range(prefill, T):
        o_t = softmax.decode_step(q[:, :, t:t + 1], cache, layer, k_t=k[:, :, t:t + 1], v_t=v[:, :, t:t + 1])
        assert cache.length == t  # decode_step does not move the pointer
        cache.advance(1)
        torch.testing.assert_close(o_t, full[:, :, t:t + 1], atol=1e-12, rtol=1e-12)
        # reading again without k_t, v_t sees the same positions (the new one is now filled)
        torch.testing.assert_close(softmax.decode_step(q[:, :, t:t + 1], cache, layer), o_t,
                                   atol=1e-12, rtol=1e-12)
    assert torch.equal(cache.k[layer], k) and torch.equal(cache.v[layer], v)
    assert not cache.k[0].any()  # the other layer is untouched


def test_decode_step_reads_the_whole_cache_in_float32():
    q, k, v = make(1, 3, 50, 16, seed=9, dtype=torch.float32)
    cache = KVCache(1, 1, 3, 64, 16)
    cache.update(0, k, v)
    cache.advance(50)
    o = softmax.decode_step(q[:, :, -1:], cache, 0)
    torch.testing.assert_close(o, softmax.parallel(q, k, v)[:, :, -1:], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("case, match", [
    ("q_shape", r"q_t must have shape \(B, H, 1, D\) = \(1, 2, 1, 4\)"),
    ("q_ndim", r"q_t must have 4 dimensions"),
    ("q_two_tokens", r"q_t must have shape"),
    ("layer", r"layer must be in \[0, 2\)"),
    ("dtype", r"q_t must have the cache's dtype"),
    ("empty", r"the cache is empty"),
    ("only_k", r"k_t and v_t must be given together"),
    ("k_shape", r"k_t must have shape \(B, H, 1, D\)"),
    ("overflow", r"KVCache overflow"),
    ("not_a_cache", r"cache must be a gpt2k3.kv_cache.KVCache"),
])
def test_decode_step_bad_input(case, match):
    cache = KVCache(2, 1, 2, 3, 4, dtype=torch.float64)
    q, k, v = make(1, 2, 1, 4)
    kw = dict(k_t=k, v_t=v)
    layer = 0
    if case == "q_shape":
        q = q[..., :3]
    elif case == "q_ndim":
        q = q[0]
    elif case == "q_two_tokens":
        q = torch.cat([q, q], dim=2)
    elif case == "layer":
        layer = 2
    elif case == "dtype":
        q = q.float()
    elif case == "empty":
        kw = {}
    elif case == "only_k":
        kw = dict(k_t=k)
    elif case == "k_shape":
        kw = dict(k_t=k[..., :2], v_t=v)
    elif case == "overflow":
        cache.length = 3
    elif case == "not_a_cache":
        cache = StateCache(2)
    with pytest.raises(ValueError, match=match):
        softmax.decode_step(q, cache, layer, **kw)


@pytest.mark.parametrize("scale", [0, -1.0, float("nan"), float("inf"), True, "0.5"])
def test_bad_scale(scale):
    q, k, v = make(1, 1, 3, 4)
    with pytest.raises(ValueError, match="scale must be None or a finite float > 0"):
        softmax.parallel(q, k, v, scale=scale)


def test_parallel_bad_shapes():
    q, k, v = make(1, 2, 5, 4)
    with pytest.raises(ValueError, match="k must have the same shape as q"):
        softmax.parallel(q, k[..., :3], v)
    with pytest.raises(ValueError, match=r"v must have shape \(B, H, T, Dv\)"):
        softmax.parallel(q, k, v[:, :, :4])

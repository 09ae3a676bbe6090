"""The linear-attention layer in GPT-2's block: fixed-size decode equals the parallel forward."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gpt2k3 import cache as core_cache
from gpt2k3.cache import ModelCache
from gpt2k3.model import GPT
from gpt2k3.config import GPTConfig
from gpt2k3.cache import StateCache
from gpt2k3.layers.linear_attention import LinearAttention, decode_token_by_token, state_nbytes
from gpt2k3.ops import linear

TINY = GPTConfig(block_size=64, vocab_size=97, n_layer=2, n_head=4, n_embd=32)


def linear_gpt(config=TINY, chunk_size=8, dtype=torch.float64, seed=0):
    torch.manual_seed(seed)
    return GPT(config, mixer=lambda c, i: LinearAttention(c, chunk_size=chunk_size)).to(dtype).eval()


@pytest.fixture(scope="module")
def model():
    return linear_gpt()


def tokens(B, T, seed=0):
    return torch.randint(0, TINY.vocab_size, (B, T), generator=torch.Generator().manual_seed(seed))


def test_drops_into_gpt_with_gpt2s_parameter_count(model):
    gpt2 = GPT(TINY)
    assert model.num_params() == gpt2.num_params()
    assert all(isinstance(b.attn, LinearAttention) for b in model.transformer.h)
    assert model(tokens(3, 10)).shape == (3, 10, TINY.vocab_size)


def test_matches_the_mixer_by_hand():
    """The layer is c_proj(linear attention of elu1(q), elu1(k), v), heads side by side."""
    torch.manual_seed(1)
    layer = LinearAttention(TINY).double()
    x = torch.randn(2, 11, 32, dtype=torch.float64)
    q, k, v = layer.c_attn(x).split(32, dim=2)
    q, k, v = (t.view(2, 11, 4, 8).transpose(1, 2) for t in (q, k, v))
    o, _ = linear.parallel(linear.elu1(q), linear.elu1(k), v)  # (o, final state), like every form
    expected = layer.c_proj(o.transpose(1, 2).reshape(2, 11, 32))
    torch.testing.assert_close(layer(x), expected, atol=1e-12, rtol=1e-12)


def test_token_by_token_decode_equals_the_parallel_forward(model):
    idx = tokens(2, 40)
    full = model(idx)
    cache = model.new_cache(2)
    assert isinstance(cache, ModelCache) and cache.kinds == ("StateCache",) * TINY.n_layer
    steps, nbytes = decode_token_by_token(model, idx, cache)
    torch.testing.assert_close(steps, full, atol=1e-10, rtol=1e-10)
    assert cache.length == 40
    # the state's size is fixed from the first token on, and it is what the formula says
    assert len(set(nbytes)) == 1
    assert nbytes[0] == state_nbytes(TINY.n_layer, TINY.n_head, TINY.n_embd // TINY.n_head, batch=2,
                                     dtype_bytes=8)


def test_float32_decode_within_rounding():
    m = linear_gpt(dtype=torch.float32)
    idx = tokens(1, 33, seed=5)
    steps, _ = decode_token_by_token(m, idx, m.new_cache(1))
    torch.testing.assert_close(steps, m(idx), atol=1e-5, rtol=1e-5)


def test_kv_cache_grows_state_does_not():
    idx = tokens(1, 24, seed=2)
    gpt2 = GPT(TINY).eval()
    _, kv_bytes = decode_token_by_token(gpt2, idx, gpt2.new_cache(1))
    lin = linear_gpt(dtype=torch.float32)
    _, st_bytes = decode_token_by_token(lin, idx, lin.new_cache(1))
    per_token = 2 * TINY.n_layer * TINY.n_embd * 4
    assert kv_bytes == [per_token * (t + 1) for t in range(24)]
    assert st_bytes == [st_bytes[0]] * 24
    assert st_bytes[0] == state_nbytes(TINY.n_layer, TINY.n_head, 8)


@settings(max_examples=15, deadline=None)
@given(cuts=st.lists(st.integers(1, 29), max_size=3, unique=True), chunk=st.integers(1, 12),
       seed=st.integers(0, 1000))
def test_prefill_in_pieces_then_decode(model, cuts, chunk, seed):
    """Any split of the prompt into chunks, at any chunk size: same logits and state as one pass."""
    idx = tokens(2, 30, seed=seed)
    full = model(idx)
    try:
        for block in model.transformer.h:
            block.attn.chunk_size = chunk
        cache = model.new_cache(2)
        bounds = [0, *sorted(cuts), 30]
        outs = [model(idx[:, a:b], cache=cache) for a, b in zip(bounds, bounds[1:])]
    finally:
        for block in model.transformer.h:
            block.attn.chunk_size = 8
    torch.testing.assert_close(torch.cat(outs, dim=1), full, atol=1e-10, rtol=1e-10)
    one = model.new_cache(2)
    model(idx, cache=one)
    assert cache.length == one.length == 30
    for layer in range(TINY.n_layer):
        for a, b in zip(cache[layer].state, one[layer].state):  # (S, z)
            torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)


def test_chunk_size_does_not_change_the_result():
    idx = tokens(1, 37, seed=3)
    a = linear_gpt(chunk_size=1)(idx)
    b = linear_gpt(chunk_size=64)(idx)
    torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)


def test_causal(model):
    idx = tokens(1, 20, seed=4)
    idx2 = idx.clone()
    idx2[0, 12] = (idx2[0, 12] + 1) % TINY.vocab_size
    a, b = model(idx), model(idx2)
    torch.testing.assert_close(a[:, :12], b[:, :12], atol=0, rtol=0)
    assert not torch.allclose(a[:, 12:], b[:, 12:])


def test_decode_with_autograd_on_does_not_break_backward():
    m = linear_gpt(dtype=torch.float32).train()
    idx = tokens(1, 6)
    cache = m.new_cache(1)
    out = torch.cat([m(idx[:, :3], cache=cache)] + [m(idx[:, t:t + 1], cache=cache) for t in range(3, 6)], 1)
    out.sum().backward()  # the decode steps did not overwrite a state autograd still needs
    assert m.transformer.h[0].attn.c_attn.weight.grad is not None
    m.zero_grad()
    m(idx).sum().backward()


def test_decode_under_no_grad_updates_the_state_in_place(model):
    cache = model.new_cache(1)
    with torch.no_grad():
        model(tokens(1, 5), cache=cache)
        S_before = cache[0].state[0]
        model(tokens(1, 1, seed=9), cache=cache)
    assert cache[0].state[0] is S_before  # same storage: no allocation per token
    assert cache.length == 6


def test_layer_with_its_own_state_cache():
    """One layer on its own: ``new_cache`` gives an empty StateCache (no length limit); feeding
    pieces through it equals one pass, and its bytes are the (S, z) state's."""
    torch.manual_seed(1)
    layer = LinearAttention(TINY, chunk_size=4).double()
    x = torch.randn(2, 13, 32, dtype=torch.float64)
    cache = layer.new_cache(2, 13)
    assert isinstance(cache, StateCache) and cache.state is None and cache.nbytes == 0
    assert StateCache is core_cache.StateCache  # gpt2k3.layers re-exports the protocol's class
    out = torch.cat([layer(x[:, :6], cache=cache)] + [layer(x[:, t:t + 1], cache=cache)
                                                       for t in range(6, 13)], dim=1)
    torch.testing.assert_close(out, layer(x), atol=1e-12, rtol=1e-12)
    assert cache.length == 13 and cache.max_len == 13  # what new_cache promised
    assert cache.nbytes == cache.used_nbytes == 2 * 4 * (8 * 8 + 8) * 8
    layer.new_cache(2).check_room(10**9)  # without a max_len, a state never runs out of room
    cache.reset()
    assert cache.length == 0 and cache.state is None


@pytest.mark.parametrize("kwargs, match", [
    (dict(chunk_size=0), "chunk_size must be a positive int"),
    (dict(chunk_size=2.5), "chunk_size must be a positive int"),
    (dict(eps=-1.0), "eps must be a finite float > 0"),
    (dict(eps=0.0), "eps must be a finite float > 0"),  # the mixers now refuse 0 too
    (dict(eps=float("nan")), "eps must be a finite float > 0"),
])
def test_bad_layer_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LinearAttention(TINY, **kwargs)


def test_bad_forward_input(model):
    layer = model.transformer.h[0].attn
    with pytest.raises(ValueError, match=r"x must have shape \(B, T, n_embd=32\)"):
        layer(torch.zeros(1, 3, 16, dtype=torch.float64))
    with pytest.raises(ValueError, match="cache must be a StateCache for block 0"):
        model(tokens(1, 3), cache=GPT(TINY).new_cache(1))  # GPT-2's KV caches
    with pytest.raises(ValueError, match="config must be a GPTConfig"):
        LinearAttention({"n_embd": 32})
    with pytest.raises(ValueError, match=r"idx must have shape \(B, T\) with T >= 1"):
        decode_token_by_token(model, torch.zeros(1, 0, dtype=torch.long), model.new_cache(1))
    # the layer reads shapes only (a decode step never waits on the device): NaN in, NaN out
    x = torch.zeros(1, 3, 32, dtype=torch.float64)
    x[0, 1, 2] = float("nan")
    assert torch.isnan(layer(x)).any()


@pytest.mark.parametrize("args", [(0, 1, 1), (1, 0, 1), (1, 1, 0), (1, 1, 1.5), (True, 1, 1)])
def test_state_nbytes_rejects_bad_sizes(args):
    with pytest.raises(ValueError, match="must be a positive int"):
        state_nbytes(*args)


def test_generate_decodes_a_linear_gpt_through_its_state():
    """generate decodes with the layers' fixed-size states (``model.new_cache``, the default)
    and gives the same greedy tokens as recomputing the whole sequence each step."""
    import torch

    from gpt2k3.model import GPT, generate
    from gpt2k3.config import GPTConfig
    from gpt2k3.layers.linear_attention import LinearAttention

    torch.manual_seed(0)
    cfg = GPTConfig(block_size=40, vocab_size=30, n_layer=2, n_head=2, n_embd=16)
    model = GPT(cfg, mixer=lambda c, i: LinearAttention(c)).eval()
    idx = torch.randint(0, 30, (2, 6))
    ref = generate(model, idx, 12, use_cache=False, temperature=0)
    assert torch.equal(generate(model, idx, 12, temperature=0), ref)
    cache = model.new_cache(2, 18)
    assert torch.equal(generate(model, idx, 12, temperature=0, cache=cache), ref)
    assert cache.length == 17 and cache.kinds == ("StateCache", "StateCache")

"""Unit tests for gpt2k3.model and gpt2k3.cache (no external oracle; see test_gpt2_oracle)."""

import pytest
import torch

from gpt2k3.cache import ModelCache
from gpt2k3.model import GPT, generate
from gpt2k3.models.gpt2 import CONV1D, from_hf_state_dict
from gpt2k3.config import GPTConfig
from gpt2k3.book.trace import trace_shapes
from gpt2k3.cache import KVCache, concat_cache
from gpt2k3.ops.softmax import causal_mask
from mixer_testing import count_host_syncs  # noqa: E402

TINY = dict(block_size=32, vocab_size=97, n_layer=2, n_head=4, n_embd=32)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return GPT(GPTConfig(**TINY)).eval()


@pytest.mark.parametrize("field,value", [
    ("n_layer", 0), ("n_head", -1), ("n_embd", 0), ("vocab_size", 0), ("block_size", 0),
    ("n_layer", 2.5), ("dropout", 1.0), ("dropout", -0.1), ("bias", 1),
    ("position", "rope"), ("position", None), ("tie_embeddings", 1), ("tie_embeddings", "no"),
])
def test_config_rejects_bad_field(field, value):
    with pytest.raises(ValueError, match=field):
        GPTConfig(**{**TINY, field: value})


def test_config_rejects_indivisible_heads():
    with pytest.raises(ValueError, match="divisible by n_head"):
        GPTConfig(**{**TINY, "n_embd": 30})


def test_forward_shapes_and_tied_head(model):
    idx = torch.randint(0, 97, (3, 10))
    assert model(idx).shape == (3, 10, 97)
    assert model.lm_head.weight is model.transformer.wte.weight
    assert model.num_params() == sum(p.numel() for p in model.parameters())
    assert model.num_params(non_embedding=True) == model.num_params() - 32 * 32


def test_no_position_table_and_an_untied_head():
    """``position="none"`` drops ``wpe`` (nothing left for ``non_embedding`` to drop);
    ``tie_embeddings=False`` gives the head a matrix of its own."""
    torch.manual_seed(0)
    m = GPT(GPTConfig(**TINY, position="none", tie_embeddings=False)).eval()
    assert "wpe" not in m.transformer
    assert m.lm_head.weight is not m.transformer.wte.weight
    plain = GPT(GPTConfig(**TINY))
    assert m.num_params() == plain.num_params() - 32 * 32 + 97 * 32
    assert m.num_params(non_embedding=True) == m.num_params()
    idx = torch.randint(0, 97, (2, 9))
    with torch.no_grad():
        full = m(idx)
        cache = m.new_cache(2)
        steps = torch.cat([m(idx[:, :4], cache=cache)] +
                          [m(idx[:, t:t + 1], cache=cache) for t in range(4, 9)], dim=1)
    torch.testing.assert_close(steps, full, atol=1e-5, rtol=1e-5)


def test_constructor_rejects_bad_parts():
    cfg = GPTConfig(**TINY)
    with pytest.raises(ValueError, match="config must be a GPTConfig"):
        GPT(TINY)
    for name in ("mixer", "mlp", "norm"):
        with pytest.raises(ValueError, match=name):
            GPT(cfg, **{name: "not callable"})
    with pytest.raises(ValueError, match="residual"):
        GPT(cfg, residual=lambda blocks, x, caches: x)


def test_forward_is_causal(model):
    idx = torch.randint(0, 97, (1, 12))
    changed = idx.clone()
    changed[0, 7] = (changed[0, 7] + 1) % 97
    with torch.no_grad():
        a, b = model(idx), model(changed)
    torch.testing.assert_close(a[:, :7], b[:, :7])
    assert not torch.allclose(a[:, 7:], b[:, 7:])


@pytest.mark.parametrize("idx,match", [
    (torch.zeros(33, dtype=torch.long)[None], "block_size"),
    (torch.zeros(1, 0, dtype=torch.long), "at least one token"),
    (torch.zeros(4, dtype=torch.long), "idx must be"),
    (torch.zeros(1, 4), "idx must be"),
    (torch.full((1, 3), 97), r"token ids in \[0, vocab_size=97\)"),
    (torch.tensor([[0, -1, 2]]), r"token ids in \[0, vocab_size=97\)"),
])
def test_forward_rejects_bad_input(model, idx, match):
    with pytest.raises(ValueError, match=match):
        model(idx)


def test_cached_forward_equals_full_forward_for_any_chunking(model):
    idx = torch.randint(0, 97, (2, 20))
    with torch.no_grad():
        full = model(idx)
        for cuts in ([20], [1] * 20, [7, 6, 7], [5, 1, 1, 13]):
            cache = model.new_cache(2)
            pieces, start = [], 0
            for n in cuts:
                pieces.append(model(idx[:, start:start + n], cache=cache))
                start += n
            assert cache.length == 20
            torch.testing.assert_close(torch.cat(pieces, dim=1), full, atol=1e-5, rtol=1e-5)


def test_chunked_prefill_fills_the_same_cache(model):
    idx = torch.randint(0, 97, (1, 16))
    one, chunked = (model.new_cache(1, 16) for _ in range(2))
    with torch.no_grad():
        model(idx, cache=one)
        model(idx[:, :5], cache=chunked)
        model(idx[:, 5:], cache=chunked)
    assert len(one) == len(chunked) == model.config.n_layer
    for a, b in zip(one, chunked):  # one KVCache per layer
        torch.testing.assert_close(a.k, b.k, atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(a.v, b.v, atol=1e-6, rtol=1e-5)


def test_causal_mask_for_a_chunk_after_a_cache():
    m = causal_mask(3, 2)
    assert m.tolist() == [[True, True, True, False, False],
                          [True, True, True, True, False],
                          [True, True, True, True, True]]


def test_kv_cache_bytes_overflow_and_validation(model):
    c = KVCache(batch=1, n_head=4, max_len=8, head_dim=16)  # one layer's cache
    assert c.nbytes == 2 * 1 * 4 * 8 * 16 * 4  # (K, V) x batch x heads x max_len x D x fp32
    assert c.length == 0 and c.used_nbytes == 0
    k = torch.randn(1, 4, 5, 16)
    full_k, full_v = c.extend(k, 2 * k)  # writes and moves the length: no separate advance
    assert full_k.shape == full_v.shape == (1, 4, 5, 16) and c.length == 5
    torch.testing.assert_close(full_k, k, rtol=0, atol=0)
    torch.testing.assert_close(full_v, 2 * k, rtol=0, atol=0)
    assert c.used_nbytes == c.nbytes * 5 // 8
    with pytest.raises(ValueError, match="max_len=8"):
        c.extend(k, k)
    assert c.length == 5 and torch.equal(c.k[:, :, 5:], torch.zeros(1, 4, 3, 16))  # nothing written
    with pytest.raises(ValueError, match="shape"):
        c.extend(torch.randn(1, 3, 1, 16), torch.randn(1, 3, 1, 16))
    # the old cache took a layer index; a model's cache is now one KVCache per layer, and one of
    # the wrong number of layers is refused
    with pytest.raises(ValueError, match="one layer cache per block"):
        model(torch.zeros(1, 1, dtype=torch.long), cache=ModelCache([c]))
    with pytest.raises(ValueError, match="max_len"):
        KVCache(batch=1, n_head=1, max_len=0, head_dim=4)
    c.reset()
    assert c.length == 0 and c.used_nbytes == 0 and c.nbytes == 2 * 1 * 4 * 8 * 16 * 4


def test_model_refuses_to_overflow_its_cache(model):
    cache = model.new_cache(1, max_len=6)
    with torch.no_grad():
        model(torch.zeros(1, 5, dtype=torch.long), cache=cache)
        with pytest.raises(ValueError, match="overflow"):
            model(torch.zeros(1, 2, dtype=torch.long), cache=cache)
    assert cache.length == 5  # nothing was written past the end
    assert all(c.length == 5 for c in cache)


def test_check_room_refuses_an_overflow_before_any_layer_is_written(model):
    cache = model.new_cache(1, max_len=6)
    with torch.no_grad():
        model(torch.ones(1, 4, dtype=torch.long), cache=cache)
    before = [(c.k.clone(), c.v.clone()) for c in cache]
    with pytest.raises(ValueError, match="overflow"):
        cache.check_room(3)
    cache.check_room(2)  # what fits passes
    with pytest.raises(ValueError, match="t must be a non-negative int"):
        cache.check_room(-1)
    with torch.no_grad(), pytest.raises(ValueError, match="overflow"):
        model(torch.ones(1, 3, dtype=torch.long), cache=cache)
    # no layer was written, not even the first: the model checked every layer's room first
    assert [c.length for c in cache] == [4] * model.config.n_layer
    for c, (k, v) in zip(cache, before):
        assert torch.equal(c.k, k) and torch.equal(c.v, v)


def test_model_cache_protocol(model):
    cache = model.new_cache(2, 10)
    assert isinstance(cache, ModelCache) and len(cache) == model.config.n_layer
    assert cache.kinds == ("KVCache",) * model.config.n_layer
    assert all(isinstance(c, KVCache) for c in cache) and cache[0] is cache.layers[0]
    per_layer = 2 * 2 * 4 * 10 * 8 * 4  # (K, V) x batch x heads x max_len x D x fp32
    assert cache.nbytes == model.config.n_layer * per_layer and cache.used_nbytes == 0
    with torch.no_grad():
        model(torch.zeros(2, 4, dtype=torch.long), cache=cache)
    assert cache.length == 4
    assert cache.used_nbytes == cache.nbytes * 4 // 10
    assert cache.nbytes_by_kind() == {"KVCache": cache.used_nbytes}
    cache.reset()
    assert cache.length == 0 and cache.used_nbytes == 0
    with pytest.raises(ValueError, match="at least one layer"):
        ModelCache([])
    with pytest.raises(ValueError, match=r"layers\[1\] must be a LayerCache"):
        ModelCache([cache[0], "kv"])
    with pytest.raises(ValueError, match="cache must be a ModelCache"):
        model(torch.zeros(1, 1, dtype=torch.long), cache=cache[0])


def test_model_cache_refuses_layers_that_disagree_on_the_length(model):
    cache = model.new_cache(1, 8)
    with torch.no_grad():
        model(torch.zeros(1, 3, dtype=torch.long), cache=cache)
    cache[0].extend(torch.zeros(1, 4, 1, 8), torch.zeros(1, 4, 1, 8))  # one layer runs ahead
    with pytest.raises(ValueError, match=r"disagree on the length: \[3, 4\]"):
        _ = cache.length
    with torch.no_grad(), pytest.raises(ValueError, match="disagree"):
        model(torch.zeros(1, 1, dtype=torch.long), cache=cache)
    cache.reset()
    assert cache.length == 0


@pytest.mark.parametrize("kwargs, match", [
    (dict(batch=1, max_len=33), "max_len must be at most block_size=32"),
    (dict(batch=0), "batch"),
    (dict(batch=1, max_len=0), "max_len"),
    (dict(batch=1.0), "batch"),
])
def test_new_cache_rejects_bad_sizes(model, kwargs, match):
    with pytest.raises(ValueError, match=match):
        model.new_cache(**kwargs)


def test_new_cache_default_size_dtype_and_device(model):
    cache = model.new_cache()
    assert all(c.max_len == 32 and c.batch == 1 and c.k.dtype == torch.float32 for c in cache)
    wide = model.new_cache(1, 4, dtype=torch.float64)
    assert all(c.k.dtype == torch.float64 for c in wide)


def test_generate_greedy_same_with_and_without_cache(model):
    idx = torch.randint(0, 97, (2, 5))
    a = generate(model, idx, 20, use_cache=True, temperature=0)
    b = generate(model, idx, 20, use_cache=False, temperature=0)
    assert a.shape == (2, 25)
    assert torch.equal(a, b)
    assert torch.equal(a[:, :5], idx)


def test_generate_sampling_is_seeded_and_respects_top_k(model):
    idx = torch.randint(0, 97, (1, 4))
    kw = dict(temperature=1.5, top_k=1)
    # top_k=1 is greedy whatever the temperature
    assert torch.equal(generate(model, idx, 8, **kw), generate(model, idx, 8, temperature=0))
    g = lambda: torch.Generator().manual_seed(3)  # noqa: E731
    a = generate(model, idx, 8, temperature=1.0, generator=g())
    b = generate(model, idx, 8, temperature=1.0, generator=g(), use_cache=False)
    assert torch.equal(a, b)
    # top_k=3: every sampled token is among the 3 most likely at its step
    out = generate(model, idx, 6, temperature=5.0, top_k=3, generator=g())
    with torch.no_grad():
        logits = model(out[:, :-1])
    for t in range(4, 10):
        assert out[0, t] in torch.topk(logits[0, t - 1], 3).indices


def test_generate_zero_tokens_returns_prompt(model):
    idx = torch.randint(0, 97, (1, 4))
    assert torch.equal(generate(model, idx, 0), idx)
    assert torch.equal(generate(model, idx, 0, use_cache=False), idx)


def test_generate_through_a_given_cache(model):
    """An empty cache passed in is the one generate decodes through (here the seed's
    concatenating cache, and a preallocated one of room for exactly prompt + new tokens)."""
    idx = torch.randint(0, 97, (2, 5))
    ref = generate(model, idx, 9, temperature=0, use_cache=False)
    concat = concat_cache(model, 2)
    assert torch.equal(generate(model, idx, 9, temperature=0, cache=concat), ref)
    assert concat.length == 5 + 9 - 1  # the last token is sampled, never fed back
    pre = model.new_cache(2, 14)
    assert torch.equal(generate(model, idx, 9, temperature=0, cache=pre), ref)
    assert pre.length == 13
    with pytest.raises(ValueError, match="overflow"):
        generate(model, idx, 9, temperature=0, cache=model.new_cache(2, 12))


@pytest.mark.parametrize("kwargs,match", [
    (dict(max_new_tokens=-1), "max_new_tokens"),
    (dict(max_new_tokens=30), "block_size"),
    (dict(max_new_tokens=2, temperature=-1.0), "temperature"),
    (dict(max_new_tokens=2, temperature=float("nan")), "temperature"),
    (dict(max_new_tokens=2, top_k=0), "top_k"),
    (dict(max_new_tokens=2, top_k=98), "top_k"),
    (dict(max_new_tokens=2, use_cache=1), "use_cache"),
    (dict(max_new_tokens=2, cache="preallocated"), "cache must be a ModelCache"),
    (dict(max_new_tokens=2, cache_impl="concat"), "cache_impl"),  # gone: a TypeError
])
def test_generate_rejects_bad_arguments(model, kwargs, match):
    err = TypeError if "cache_impl" in kwargs else ValueError
    with pytest.raises(err, match=match):
        generate(model, torch.zeros(1, 4, dtype=torch.long), **kwargs)


def test_generate_rejects_a_cache_it_cannot_use(model):
    idx = torch.zeros(1, 4, dtype=torch.long)
    with pytest.raises(ValueError, match="use_cache=False"):
        generate(model, idx, 2, use_cache=False, cache=model.new_cache(1))
    used = model.new_cache(1)
    with torch.no_grad():
        model(idx, cache=used)
    with pytest.raises(ValueError, match=r"cache must be empty \(length 0\), got length 4"):
        generate(model, idx, 2, cache=used)
    other = GPT(GPTConfig(**{**TINY, "n_layer": 3}))
    with pytest.raises(ValueError, match="one layer cache per block"):
        generate(model, idx, 2, cache=other.new_cache(1))
    with pytest.raises(ValueError, match="token ids"):
        generate(model, torch.full((1, 4), 97), 2)


def test_trace_shapes(model):
    rows = dict(trace_shapes(model, torch.zeros(2, 5, dtype=torch.long)))
    assert rows["token embeddings wte(idx)"] == (2, 5, 32)
    assert rows["position embeddings wpe(pos)"] == (5, 32)
    assert rows["block 0: c_attn -> q, k, v packed"] == (2, 5, 96)
    assert rows["block 0: q, k, v split into heads"] == (2, 4, 5, 8)
    assert rows["block 0: MLP c_fc (4x wider)"] == (2, 5, 128)
    assert rows["logits"] == (2, 5, 97)


def test_from_hf_state_dict_roundtrip_and_errors(model):
    # our own state dict, in the HF layout: Conv1D weights stored (in, out)
    sd = {k: v.t() if k.endswith(CONV1D) else v for k, v in model.state_dict().items()}
    loaded = from_hf_state_dict(sd, n_head=4)
    idx = torch.randint(0, 97, (1, 9))
    with torch.no_grad():
        torch.testing.assert_close(loaded(idx), model(idx))
    with pytest.raises(ValueError, match="divisible by n_head"):
        from_hf_state_dict(sd, n_head=5)
    with pytest.raises(ValueError, match="wpe"):
        from_hf_state_dict({k: v for k, v in sd.items() if "wpe" not in k})
    with pytest.raises(ValueError, match="unexpected key"):
        from_hf_state_dict({**sd, "transformer.h.0.extra.weight": torch.zeros(1)}, n_head=4)
    with pytest.raises(ValueError, match="missing"):
        from_hf_state_dict({k: v for k, v in sd.items() if "ln_f" not in k}, n_head=4)
    with pytest.raises(ValueError, match="lm_head"):
        from_hf_state_dict({**sd, "lm_head.weight": torch.zeros_like(sd["lm_head.weight"])}, n_head=4)
    with pytest.raises(ValueError, match="layers"):
        from_hf_state_dict({k: v for k, v in sd.items() if ".h.0." not in k}, n_head=4)


# --------------------------------------------------------------------- front doors, host syncs
def test_a_batch_of_no_sequences_is_refused_naming_idx(model):
    empty = torch.zeros(0, 3, dtype=torch.long)
    with pytest.raises(ValueError, match=r"idx must hold at least one sequence"):
        model(empty)
    with pytest.raises(ValueError, match=r"idx must hold at least one sequence"):
        generate(model, empty, 2)


def test_forwards_body_is_the_door_without_its_checks(model):
    """generate calls forward's body (the door checked the call once): the same logits."""
    import inspect
    idx = torch.randint(0, 97, (2, 6), generator=torch.Generator().manual_seed(1))
    assert torch.equal(inspect.unwrap(GPT.forward)(model, idx), model(idx))
    assert inspect.unwrap(GPT.forward) is not GPT.forward


def test_gpt2_and_gpt_are_the_same_model_from_the_same_seed():
    """Chapter 1's GPT2 and the general GPT with no parts: same modules, same order, so one seed
    gives the same weights, the same state-dict keys and the same logits (written-out attention
    against the fused kernel)."""
    from gpt2k3.model import GPT2
    config = GPTConfig(**TINY)
    torch.manual_seed(3)
    plain = GPT2(config).eval()
    torch.manual_seed(3)
    general = GPT(config).eval()
    a, b = plain.state_dict(), general.state_dict()
    assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)
    assert plain.num_params() == general.num_params()
    idx = torch.randint(0, TINY["vocab_size"], (2, 9), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        torch.testing.assert_close(plain(idx), general(idx), rtol=1e-5, atol=1e-5)
    greedy = generate(plain, idx, 5, use_cache=False, temperature=0)
    assert torch.equal(greedy, generate(general, idx, 5, temperature=0))
    with pytest.raises(ValueError, match="use_cache"):
        generate(plain, idx, 2)  # GPT2 has no cache
    with pytest.raises(ValueError, match="position"):
        GPT2(GPTConfig(**{**TINY, "position": "none"}))


def test_generate_with_a_cache_of_another_batch_blames_the_cache(model):
    idx = torch.zeros(2, 3, dtype=torch.long)
    with pytest.raises(ValueError, match="cache was made for batch 1"):
        generate(model, idx, 2, cache=model.new_cache(1, 8))


def test_no_tokens_through_a_layer_give_an_empty_result():
    from gpt2k3.layers.attention import CausalSelfAttention, GPT2Attention
    config = GPTConfig(**TINY)
    x = torch.zeros(2, 0, config.n_embd)
    for layer in (GPT2Attention(config), CausalSelfAttention(config)):
        assert layer(x).shape == (2, 0, config.n_embd)
    with pytest.raises(ValueError, match="x must have shape"):
        CausalSelfAttention(config)(torch.zeros(2, 3, config.n_embd + 1))


def test_generate_refuses_a_model_that_gives_non_finite_logits():
    torch.manual_seed(0)
    m = GPT(GPTConfig(**TINY)).eval()
    with torch.no_grad():
        m.transformer.h[1].mlp.c_proj.bias[0] = float("nan")
    with pytest.raises(ValueError, match="non-finite logits"):
        generate(m, torch.zeros(1, 2, dtype=torch.long), 3, temperature=0.0)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_decode_step_reads_nothing_back_to_the_host(monkeypatch, temperature):
    """generate checks its arguments once per call; a decode step on a 4-layer model makes no
    host sync of its own (choosing the token stays on the device too: argmax, multinomial)."""
    torch.manual_seed(0)
    m = GPT(GPTConfig(block_size=64, vocab_size=97, n_layer=4, n_head=2, n_embd=16)).eval()
    idx = torch.randint(0, 97, (2, 5), generator=torch.Generator().manual_seed(0))
    counts = count_host_syncs(monkeypatch)
    per_call = []
    for n in (4, 12):
        counts["n"] = 0
        generate(m, idx, n, temperature=temperature, generator=torch.Generator().manual_seed(0))
        per_call.append(counts["n"])
    per_token = (per_call[1] - per_call[0]) / 8
    assert per_token == 0, per_call  # was 14 per token (3 per layer + 2 for the ids)
    assert per_call[0] <= 2  # the ids' range and, at the end, whether the logits were finite

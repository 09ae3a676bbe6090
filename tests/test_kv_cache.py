"""The KV cache is exact: property tests over random small configs, prompts and chunk splits."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gpt2k3.model import GPT, generate
from gpt2k3.config import GPTConfig
from gpt2k3.cache import ConcatKVCache, KVCache, concat_cache
from gpt2k3.ops.softmax import causal_mask
from gpt2k3.seed import seed_cached_attention


@st.composite
def model_and_splits(draw):
    n_head = draw(st.integers(1, 4))
    cfg = GPTConfig(block_size=48, vocab_size=draw(st.integers(5, 60)), n_layer=draw(st.integers(1, 3)),
                    n_head=n_head, n_embd=n_head * draw(st.sampled_from([4, 8])))
    T = draw(st.integers(1, 40))
    cuts = sorted(draw(st.sets(st.integers(1, T - 1), max_size=4))) if T > 1 else []
    sizes = [b - a for a, b in zip([0, *cuts], [*cuts, T])]
    return cfg, T, sizes, draw(st.integers(0, 2**31 - 1)), draw(st.integers(1, 3))


@settings(max_examples=25, deadline=None)
@given(model_and_splits())
def test_chunked_prefill_equals_one_pass_logits_and_cache(args):
    cfg, T, sizes, seed, batch = args
    torch.manual_seed(seed)
    model = GPT(cfg).eval()
    idx = torch.randint(0, cfg.vocab_size, (batch, T))
    one, chunked = model.new_cache(batch), model.new_cache(batch)
    with torch.no_grad():
        full = model(idx)
        ref = model(idx, cache=one)
        pieces, start = [], 0
        for n in sizes:
            pieces.append(model(idx[:, start:start + n], cache=chunked))
            start += n
    assert (torch.cat(pieces, 1) - full).abs().max() < 1e-5
    assert (ref - full).abs().max() < 1e-5
    assert one.length == chunked.length == T
    for a, b in zip(one, chunked):
        assert (a.k - b.k).abs().max() < 1e-5 and (a.v - b.v).abs().max() < 1e-5


@settings(max_examples=15, deadline=None)
@given(model_and_splits(), st.integers(1, 8))
def test_greedy_tokens_identical_with_every_cache(args, n_new):
    cfg, T, _, seed, batch = args
    T = min(T, cfg.block_size - n_new)
    torch.manual_seed(seed)
    model = GPT(cfg).eval()
    idx = torch.randint(0, cfg.vocab_size, (batch, T))
    ref = generate(model, idx, n_new, use_cache=False, temperature=0)
    assert torch.equal(generate(model, idx, n_new, temperature=0), ref)
    assert torch.equal(generate(model, idx, n_new, temperature=0, cache=concat_cache(model, batch)), ref)


def test_decode_logits_match_recompute():
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=40, vocab_size=50, n_layer=2, n_head=2, n_embd=16)).eval()
    idx = torch.randint(0, 50, (2, 30))
    cache = model.new_cache(2)
    with torch.no_grad():
        model(idx[:, :10], cache=cache)
        for t in range(10, 30):
            step = model(idx[:, t:t + 1], cache=cache)[:, -1]
            full = model(idx[:, :t + 1])[:, -1]
            assert (step - full).abs().max() < 1e-5


def test_concat_cache_copies_linearly_more_per_step():
    cfg = GPTConfig(block_size=64, vocab_size=20, n_layer=1, n_head=1, n_embd=8)
    model = GPT(cfg).eval()
    cache = concat_cache(model)
    copied = []
    with torch.no_grad():
        model(torch.zeros(1, 4, dtype=torch.long), cache=cache)
        for _ in range(5):
            before = cache[0].bytes_copied
            model(torch.zeros(1, 1, dtype=torch.long), cache=cache)
            copied.append(cache[0].bytes_copied - before)
    steps = [b - a for a, b in zip(copied, copied[1:])]
    assert len(set(steps)) == 1 and steps[0] > 0  # each step copies a fixed amount more: O(N)
    assert cache.nbytes == 2 * 9 * 8 * 4


def test_concat_and_preallocated_caches_hold_the_same_keys_and_values():
    torch.manual_seed(1)
    model = GPT(GPTConfig(block_size=32, vocab_size=40, n_layer=2, n_head=2, n_embd=16)).eval()
    idx = torch.randint(0, 40, (2, 11))
    pre, cat = model.new_cache(2, 11), concat_cache(model, 2)
    assert pre.kinds == ("KVCache",) * 2 and cat.kinds == ("ConcatKVCache",) * 2
    with torch.no_grad():
        for cache in (pre, cat):
            model(idx[:, :6], cache=cache)
            for t in range(6, 11):
                model(idx[:, t:t + 1], cache=cache)
    assert pre.length == cat.length == 11
    assert cat.nbytes == pre.nbytes == pre.used_nbytes  # full: the filled part is all of it
    for a, b in zip(pre, cat):
        torch.testing.assert_close(a.k, b.k, rtol=0, atol=0)
        torch.testing.assert_close(a.v, b.v, rtol=0, atol=0)
    cat.reset()
    assert cat.length == 0 and cat.nbytes == 0 and all(c.k is None for c in cat)


def test_seed_snippet_masks_only_an_empty_cache():
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 6, 4) for _ in range(3))
    full, _ = seed_cached_attention(q, k, v)  # prefill in one piece: masked, correct
    # correct reference for the second chunk: attend with the right mask
    mask = causal_mask(3, 3)
    scores = (q[:, :, 3:] @ k.transpose(-1, -2)) / 2.0
    right = scores.masked_fill(~mask, float("-inf")).softmax(-1) @ v
    torch.testing.assert_close(full[:, :, 3:], right)
    _, past = seed_cached_attention(q[:, :, :3], k[:, :, :3], v[:, :, :3])
    chunk, _ = seed_cached_attention(q[:, :, 3:], k[:, :, 3:], v[:, :, 3:], past_kv=past)
    assert (chunk - right).abs().max() > 1e-3  # the second chunk sees its own future
    # one token at a time the snippet is right: there is no future inside a 1-token chunk
    one, _ = seed_cached_attention(q[:, :, 3:4], k[:, :, 3:4], v[:, :, 3:4], past_kv=past)
    torch.testing.assert_close(one, right[:, :, :1])


@pytest.mark.parametrize("bad,match", [
    (dict(k=torch.zeros(2, 2, 1, 4)), "shape"),                       # batch 2 into a batch-1 cache
    (dict(k=torch.zeros(1, 2, 1, 4, dtype=torch.float64)), "dtype"),  # wrong dtype
    (dict(k=torch.zeros(1, 2, 1, 4, device="meta")), "device"),       # wrong device
])
def test_cache_rejects_mismatched_inputs(bad, match):
    cache = KVCache(batch=1, n_head=2, max_len=4, head_dim=4)
    k = bad["k"]
    with pytest.raises(ValueError, match=match):
        cache.extend(k, k)
    assert cache.length == 0  # a refused write moves nothing


def test_concat_cache_validates():
    with pytest.raises(ValueError, match="n_head"):
        ConcatKVCache(batch=1, n_head=0, head_dim=4)
    cache = ConcatKVCache(batch=1, n_head=2, head_dim=4)
    with pytest.raises(ValueError, match="shape"):
        cache.extend(torch.zeros(1, 3, 1, 4), torch.zeros(1, 3, 1, 4))
    model = GPT(GPTConfig(block_size=8, vocab_size=5, n_layer=1, n_head=1, n_embd=4))
    with pytest.raises(ValueError, match="ModelCache"):
        generate(model, torch.zeros(1, 1, dtype=torch.long), 1, cache="ring")
    with pytest.raises(ValueError, match="empty"):
        full = model.new_cache(1)
        model(torch.zeros(1, 2, dtype=torch.long), cache=full)
        generate(model, torch.zeros(1, 1, dtype=torch.long), 1, cache=full)


def test_concat_copy_bytes_matches_the_cache():
    from gpt2k3.cache import concat_copy_bytes

    cfg = GPTConfig(block_size=64, vocab_size=20, n_layer=2, n_head=2, n_embd=8)
    model = GPT(cfg).eval()
    cache = concat_cache(model)
    with torch.no_grad():
        model(torch.zeros(1, 5, dtype=torch.long), cache=cache)
        for _ in range(7):
            model(torch.zeros(1, 1, dtype=torch.long), cache=cache)
    assert sum(c.bytes_copied for c in cache) == concat_copy_bytes(2, 8, 5, 7, 4)
    with pytest.raises(ValueError, match="n_new"):
        concat_copy_bytes(2, 8, 5, -1)


def test_results_loader(tmp_path, monkeypatch):
    from gpt2k3.book import results

    with pytest.raises(ValueError, match="plain file name"):
        results.load("../secrets.json")
    d = tmp_path / "benchmarks" / "results"
    d.mkdir(parents=True)
    (d / "x.json").write_text('{"a": 1}')
    monkeypatch.chdir(tmp_path)
    assert results.results_dir() == d
    assert results.exists("x.json") and not results.exists("y.json")
    assert results.load("x.json") == {"a": 1}


def test_decode_cache_traffic_counts_what_the_caches_do():
    """The closed forms of chapter 2's cache traffic against the caches themselves: the
    concatenating cache's copies are what it reports copying, attention reads every filled
    position of the preallocated cache at every step, and the ratio stays below 3."""
    from gpt2k3.accounting.decode import decode_cache_traffic
    from gpt2k3.archs import spec_from_gpt_config
    from gpt2k3.cache import concat_copy_bytes

    cfg = GPTConfig(block_size=64, vocab_size=20, n_layer=2, n_head=2, n_embd=8)
    model = GPT(cfg).eval()
    spec = spec_from_gpt_config(cfg)
    prompt, n_new, batch = 5, 7, 2
    cat, pre = concat_cache(model, batch), model.new_cache(batch, prompt + n_new)
    read = 0
    with torch.no_grad():
        for cache in (cat, pre):
            model(torch.zeros(batch, prompt, dtype=torch.long), cache=cache)
        for _ in range(n_new):
            for cache in (cat, pre):
                model(torch.zeros(batch, 1, dtype=torch.long), cache=cache)
            read += pre.used_nbytes  # attention reads every filled position, this one included
    t = decode_cache_traffic(spec, prompt, n_new, batch, dtype_bytes=4)
    assert t.concat_write == sum(c.bytes_copied for c in cat) == batch * concat_copy_bytes(2, 8, prompt, n_new, 4)
    assert t.attention_read == t.concat_read == read
    assert t.append_write == n_new * pre.used_nbytes // pre.length
    assert t.preallocated == t.attention_read + t.append_write
    assert t.concatenating == 3 * t.attention_read
    assert 2 < t.ratio < 3
    long = decode_cache_traffic(spec, 32768, 8)
    assert 2.999 < long.ratio < 3  # a constant factor at long context, not a growing one
    assert decode_cache_traffic(spec, 4, 0).concatenating == 0
    for bad, match in (((spec, 0, 1), "prompt_len"), ((spec, 1, -1), "n_new"),
                       ((spec, 1, 1, 0), "batch"), (("gpt2", 1, 1), "spec")):
        with pytest.raises(ValueError, match=match):
            decode_cache_traffic(*bad)


def test_weights_cache_crossing_is_where_the_lines_meet():
    import math

    from gpt2k3.accounting import cache_bound_context, count_params, kv_cache_bytes, state_bytes
    from gpt2k3.accounting.decode import weights_cache_crossing
    from gpt2k3.archs import GPT2_SMALL, KIMI_LINEAR_48B

    n = weights_cache_crossing(GPT2_SMALL)
    assert n == count_params(GPT2_SMALL).total / kv_cache_bytes(GPT2_SMALL, 1, dtype_bytes=1)
    w = count_params(GPT2_SMALL).total * 2
    assert kv_cache_bytes(GPT2_SMALL, math.floor(n)) < w < kv_cache_bytes(GPT2_SMALL, math.ceil(n))
    # memory held (the whole position table) against what a step reads (one row of it)
    assert cache_bound_context(GPT2_SMALL) < n
    assert weights_cache_crossing(GPT2_SMALL, 4) == pytest.approx(n / 4)
    assert weights_cache_crossing(GPT2_SMALL, 1, 2, 1) == pytest.approx(2 * n)
    # a hybrid: the fixed states are held too, once
    h = weights_cache_crossing(KIMI_LINEAR_48B, 2)
    held = kv_cache_bytes(KIMI_LINEAR_48B, 1, 2) * h + state_bytes(KIMI_LINEAR_48B, 2, 4)
    assert held == pytest.approx(count_params(KIMI_LINEAR_48B).total * 2)
    with pytest.raises(ValueError, match="weight_bytes"):
        weights_cache_crossing(GPT2_SMALL, 1, 0)
    with pytest.raises(ValueError, match="batch"):
        weights_cache_crossing(GPT2_SMALL, 0)

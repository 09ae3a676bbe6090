"""Unit tests for gpt2k3.gpt2 and gpt2k3.kv_cache (no external oracle; see test_gpt2_oracle)."""

import pytest
import torch

from gpt2k3.gpt2 import GPT, GPTConfig, generate, trace_shapes
from gpt2k3.kv_cache import KVCache, causal_mask

TINY = dict(block_size=32, vocab_size=97, n_layer=2, n_head=4, n_embd=32)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return GPT(GPTConfig(**TINY)).eval()


@pytest.mark.parametrize("field,value", [
    ("n_layer", 0), ("n_head", -1), ("n_embd", 0), ("vocab_size", 0), ("block_size", 0),
    ("n_layer", 2.5), ("dropout", 1.0), ("dropout", -0.1), ("bias", 1),
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
])
def test_forward_rejects_bad_input(model, idx, match):
    with pytest.raises(ValueError, match=match):
        model(idx)


def test_cached_forward_equals_full_forward_for_any_chunking(model):
    idx = torch.randint(0, 97, (2, 20))
    with torch.no_grad():
        full = model(idx)
        for cuts in ([20], [1] * 20, [7, 6, 7], [5, 1, 1, 13]):
            cache = KVCache.for_model(model.config, batch=2)
            pieces, start = [], 0
            for n in cuts:
                pieces.append(model(idx[:, start:start + n], cache=cache))
                start += n
            assert cache.length == 20
            torch.testing.assert_close(torch.cat(pieces, dim=1), full, atol=1e-5, rtol=1e-5)


def test_chunked_prefill_fills_the_same_cache(model):
    idx = torch.randint(0, 97, (1, 16))
    one, chunked = (KVCache.for_model(model.config, max_len=16) for _ in range(2))
    with torch.no_grad():
        model(idx, cache=one)
        model(idx[:, :5], cache=chunked)
        model(idx[:, 5:], cache=chunked)
    for a, b in zip(one.k + one.v, chunked.k + chunked.v):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_causal_mask_for_a_chunk_after_a_cache():
    m = causal_mask(3, 2)
    assert m.tolist() == [[True, True, True, False, False],
                          [True, True, True, True, False],
                          [True, True, True, True, True]]


def test_kv_cache_bytes_overflow_and_validation():
    c = KVCache(n_layer=2, batch=1, n_head=4, max_len=8, head_dim=16)
    assert c.nbytes == 2 * 2 * 1 * 4 * 8 * 16 * 4
    k = torch.randn(1, 4, 5, 16)
    full_k, _ = c.update(0, k, k)
    assert full_k.shape == (1, 4, 5, 16)
    c.advance(5)
    assert c.used_nbytes == c.nbytes * 5 // 8
    with pytest.raises(ValueError, match="max_len=8"):
        c.update(0, k, k)
    with pytest.raises(ValueError, match="shape"):
        c.update(0, torch.randn(1, 3, 1, 16), torch.randn(1, 3, 1, 16))
    with pytest.raises(ValueError, match="layer"):
        c.update(2, k[:, :, :1], k[:, :, :1])
    with pytest.raises(ValueError, match="max_len"):
        KVCache(n_layer=1, batch=1, n_head=1, max_len=0, head_dim=4)


def test_model_refuses_to_overflow_its_cache(model):
    cache = KVCache.for_model(model.config, max_len=6)
    with torch.no_grad():
        model(torch.zeros(1, 5, dtype=torch.long), cache=cache)
        with pytest.raises(ValueError, match="overflow"):
            model(torch.zeros(1, 2, dtype=torch.long), cache=cache)
    assert cache.length == 5  # nothing was written past the end


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


@pytest.mark.parametrize("kwargs,match", [
    (dict(max_new_tokens=-1), "max_new_tokens"),
    (dict(max_new_tokens=30), "block_size"),
    (dict(max_new_tokens=2, temperature=-1.0), "temperature"),
    (dict(max_new_tokens=2, temperature=float("nan")), "temperature"),
    (dict(max_new_tokens=2, top_k=0), "top_k"),
    (dict(max_new_tokens=2, top_k=98), "top_k"),
])
def test_generate_rejects_bad_arguments(model, kwargs, match):
    with pytest.raises(ValueError, match=match):
        generate(model, torch.zeros(1, 4, dtype=torch.long), **kwargs)


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
    sd = {k: v.t() if k.endswith(GPT._CONV1D) else v for k, v in model.state_dict().items()}
    loaded = GPT.from_hf_state_dict(sd, n_head=4)
    idx = torch.randint(0, 97, (1, 9))
    with torch.no_grad():
        torch.testing.assert_close(loaded(idx), model(idx))
    with pytest.raises(ValueError, match="divisible by n_head"):
        GPT.from_hf_state_dict(sd, n_head=5)
    with pytest.raises(ValueError, match="wpe"):
        GPT.from_hf_state_dict({k: v for k, v in sd.items() if "wpe" not in k})
    with pytest.raises(ValueError, match="unexpected key"):
        GPT.from_hf_state_dict({**sd, "transformer.h.0.extra.weight": torch.zeros(1)}, n_head=4)
    with pytest.raises(ValueError, match="missing"):
        GPT.from_hf_state_dict({k: v for k, v in sd.items() if "ln_f" not in k}, n_head=4)
    with pytest.raises(ValueError, match="lm_head"):
        GPT.from_hf_state_dict({**sd, "lm_head.weight": torch.zeros_like(sd["lm_head.weight"])}, n_head=4)
    with pytest.raises(ValueError, match="layers"):
        GPT.from_hf_state_dict({k: v for k, v in sd.items() if ".h.0." not in k}, n_head=4)

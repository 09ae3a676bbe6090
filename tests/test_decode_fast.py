"""FastDecoder: the packed-weight decode path gives the reference path's tokens (and Hugging Face's).

The reference is ``gpt2k3.model.generate`` with its preallocated ``KVCache`` per layer (the
model's ``new_cache``) -- the decode loop
chapter 2 teaches. Speed is the benchmark's business (``benchmarks/decode.py``); these tests only
check that the fast path computes the same thing.
"""

import pytest
import torch

from gpt2k3.model import GPT, generate
from gpt2k3.models.gpt2 import from_hf_state_dict
from gpt2k3.models.gpt2_fast import FastDecoder
from gpt2k3.config import GPTConfig
from gpt2k3.cache import KVCache, concat_cache

TINY = dict(block_size=40, vocab_size=211, n_layer=3, n_head=4, n_embd=64)


def make_model(seed=0, dtype=torch.float32, **overrides):
    torch.manual_seed(seed)
    model = GPT(GPTConfig(**{**TINY, **overrides})).eval().to(dtype)
    with torch.no_grad():  # biases and LayerNorm affine away from their init, so all are exercised
        for name, p in model.named_parameters():
            if name.endswith("bias") or ".ln_" in name:
                p.add_(0.1 * torch.randn_like(p))
    return model


def prompt(model, batch, length, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, model.config.vocab_size, (batch, length), generator=g)


@pytest.mark.parametrize("batch, length, n_new", [(1, 1, 20), (1, 7, 25), (3, 5, 12), (2, 16, 24)])
def test_greedy_tokens_identical_to_reference(batch, length, n_new):
    model = make_model()
    idx = prompt(model, batch, length)
    fast = FastDecoder(model, batch=batch)
    assert torch.equal(fast.generate(idx, n_new, temperature=0), generate(model, idx, n_new, temperature=0))


@pytest.mark.parametrize("overrides", [
    dict(bias=False),  # no biases: the packed ones are zeros
    dict(n_head=3, n_embd=48),  # head size 16: 1/sqrt(D) is a power of two
    dict(n_head=4, n_embd=48),  # head size 12: the folded scale rounds, tokens still agree
    dict(n_layer=1, n_head=1, n_embd=8),
])
def test_greedy_tokens_identical_for_other_shapes(overrides):
    model = make_model(seed=3, **overrides)
    idx = prompt(model, 2, 6)
    fast = FastDecoder(model, batch=2)
    assert torch.equal(fast.generate(idx, 20, temperature=0), generate(model, idx, 20, temperature=0))


def test_step_logits_match_the_cached_forward():
    """Every decode step's logits, not only their argmax, equal the reference's to float32 rounding."""
    model = make_model()
    idx = prompt(model, 2, 9)
    fast = FastDecoder(model, batch=2, max_len=30)
    cache = model.new_cache(2, 30)
    with torch.no_grad():
        ref = model(idx, cache=cache)[:, -1]
        got = fast.prefill(idx)
        torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
        for pos in range(9, 30):
            tok = ref.argmax(-1)
            ref = model(tok[:, None], cache=cache)[:, -1]
            got = fast.step(tok, pos)
            torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
        assert len(cache) == model.config.n_layer
        for layer in range(model.config.n_layer):  # the caches hold the same keys and values
            torch.testing.assert_close(fast.k[layer], cache[layer].k, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(fast.v[layer], cache[layer].v, atol=1e-5, rtol=1e-5)


def test_float64_model_logits_agree_to_double_rounding():
    model = make_model(dtype=torch.float64)
    idx = prompt(model, 1, 5)
    fast = FastDecoder(model)
    assert fast.dtype == torch.float64
    with torch.no_grad():
        torch.testing.assert_close(fast.prefill(idx), model(idx)[:, -1], atol=1e-12, rtol=1e-12)
    assert torch.equal(fast.generate(idx, 10, temperature=0), generate(model, idx, 10, temperature=0))


def test_sampling_uses_the_generator_like_the_reference():
    model = make_model()
    idx = prompt(model, 2, 4)
    fast = FastDecoder(model, batch=2)
    for seed in range(3):
        for top_k in (None, 7):
            a = fast.generate(idx, 15, temperature=0.8, top_k=top_k,
                              generator=torch.Generator().manual_seed(seed))
            b = generate(model, idx, 15, temperature=0.8, top_k=top_k,
                         generator=torch.Generator().manual_seed(seed))
            assert torch.equal(a, b)


def test_reusable_and_independent_of_later_weight_changes():
    model = make_model()
    idx = prompt(model, 1, 6)
    fast = FastDecoder(model)
    first = fast.generate(idx, 12, temperature=0)
    assert torch.equal(fast.generate(idx, 12, temperature=0), first)  # the cache is simply overwritten
    assert torch.equal(fast.generate(idx[:, :3], 5, temperature=0),
                       generate(model, idx[:, :3], 5, temperature=0))
    with torch.no_grad():
        model.transformer.h[0].mlp.c_fc.weight.zero_()  # the decoder holds its own packed copy
    assert torch.equal(fast.generate(idx, 12, temperature=0), first)


def test_zero_new_tokens_and_full_length():
    model = make_model()
    idx = prompt(model, 1, 5)
    fast = FastDecoder(model)
    assert torch.equal(fast.generate(idx, 0), idx)
    n = model.config.block_size - 5  # up to the last position of the block
    assert torch.equal(fast.generate(idx, n, temperature=0), generate(model, idx, n, temperature=0))


def test_nbytes_counts_packed_weights_and_cache():
    model = make_model()
    fast = FastDecoder(model, max_len=16)
    cfg = model.config
    cache = model.new_cache(1, 16).nbytes
    assert cache == cfg.n_layer * KVCache(1, cfg.n_head, 16, cfg.head_dim).nbytes
    params = model.num_params() * 4  # tied: wte once as rows, once packed as the head
    assert fast.nbytes == params + cfg.vocab_size * cfg.n_embd * 4 + cache


def test_rejects_models_it_cannot_pack():
    from gpt2k3.layers.linear_attention import LinearAttention

    with pytest.raises(ValueError, match="model must be a GPT"):
        FastDecoder(torch.nn.Linear(2, 2))
    cfg = GPTConfig(**TINY)
    other = GPT(cfg, mixer=lambda c, i: LinearAttention(c))
    with pytest.raises(ValueError, match="causal self-attention"):
        FastDecoder(other)
    for changed in (dict(position="none"), dict(tie_embeddings=False)):
        with pytest.raises(ValueError, match="learned positions, a tied head"):
            FastDecoder(GPT(GPTConfig(**TINY, **changed)))


@pytest.mark.parametrize("kwargs, match", [
    (dict(max_len=0), "max_len"),
    (dict(max_len=41), "max_len"),
    (dict(batch=0), "batch"),
])
def test_rejects_bad_construction(kwargs, match):
    with pytest.raises(ValueError, match=match):
        FastDecoder(make_model(), **kwargs)


@pytest.mark.parametrize("call, match", [
    (lambda f, i: f.generate(i, -1), "max_new_tokens"),
    (lambda f, i: f.generate(i, 2.0), "max_new_tokens"),
    (lambda f, i: f.generate(i, 2, temperature=-1.0), "temperature"),
    (lambda f, i: f.generate(i, 2, top_k=0), "top_k"),
    (lambda f, i: f.generate(i[:0], 2), "idx"),  # batch 0
    (lambda f, i: f.generate(i.float(), 2), "idx"),
    (lambda f, i: f.generate(i[0], 2), "idx"),
    (lambda f, i: f.generate(i.repeat(2, 1), 2), "idx"),  # batch 2 for a batch-1 decoder
    (lambda f, i: f.generate(i[:, :0], 2), "idx"),
    (lambda f, i: f.generate(i, 40), "max_len"),
    # negative ids would index wte from the end; ids >= vocab would raise IndexError
    (lambda f, i: f.generate(torch.full_like(i, -1), 2), r"idx must hold token ids in \[0"),
    (lambda f, i: f.generate(torch.full_like(i, f.config.vocab_size), 2), "idx.*vocab_size"),
])
def test_rejects_bad_generate_arguments(call, match):
    model = make_model()
    with pytest.raises(ValueError, match=match):
        call(FastDecoder(model), prompt(model, 1, 4))


@pytest.mark.parametrize("cfg", [
    dict(n_layer=2, n_head=4, n_embd=64, vocab_size=211, n_positions=48),
    dict(n_layer=3, n_head=6, n_embd=96, vocab_size=503, n_positions=64),
], ids=["2L-4H-64", "3L-6H-96"])
def test_tokens_identical_to_hugging_face_generate(cfg):
    """The oracle: Hugging Face's GPT2LMHeadModel.generate, same weights, greedy."""
    transformers = pytest.importorskip("transformers")
    from transformers import GPT2Config, GPT2LMHeadModel

    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    hf = GPT2LMHeadModel(GPT2Config(**cfg, bos_token_id=0, eos_token_id=0)).eval()
    ours = from_hf_state_dict(hf.state_dict(), n_head=cfg["n_head"])
    idx = prompt(ours, 1, 8)
    n = cfg["n_positions"] - 8
    with torch.no_grad():
        expected = hf.generate(idx, attention_mask=torch.ones_like(idx), max_new_tokens=n,
                               min_new_tokens=n, do_sample=False, use_cache=True, pad_token_id=0)
    assert torch.equal(FastDecoder(ours).generate(idx, n, temperature=0), expected)
    assert torch.equal(generate(ours, idx, n, temperature=0), expected)
    assert torch.equal(generate(ours, idx, n, temperature=0, cache=concat_cache(ours)), expected)

"""Chapter 2's exercise solutions (``gpt2k3.book.exercises.ch02``) give what their prose states."""

from __future__ import annotations

import pytest
import torch

from gpt2k3.accounting import count_params, kv_cache_bytes
from gpt2k3.accounting.decode import weights_cache_crossing
from gpt2k3.archs import GPT2_FAMILY, GPT2_SMALL, GPT2_XL
from gpt2k3.book.exercises import ch02
from gpt2k3.config import GPTConfig
from gpt2k3.ops import softmax


def test_2_1_xl_crosses_later_but_by_less_than_its_width():
    cross = ch02.crossings(GPT2_FAMILY)
    for spec in GPT2_FAMILY:  # the crossing: weights bytes over one token's cache bytes, both bf16
        assert cross[spec.name] == pytest.approx(
            count_params(spec).total * 2 / kv_cache_bytes(spec, 1, dtype_bytes=2), rel=1e-12)
    ratio = cross[GPT2_XL.name] / cross[GPT2_SMALL.name]
    assert 1 < ratio < GPT2_XL.n_embd / GPT2_SMALL.n_embd
    assert [cross[s.name] for s in GPT2_FAMILY] == sorted(cross[s.name] for s in GPT2_FAMILY)


def test_2_2_the_formula_is_the_crossing_term_by_term():
    for spec in GPT2_FAMILY:
        f = ch02.crossing_formula(spec)
        assert f["total"] == pytest.approx(weights_cache_crossing(spec, 1, 2, 2), rel=1e-12)
        assert f["total"] == pytest.approx(weights_cache_crossing(spec, 1, 4, 4), rel=1e-12)  # format-free
        assert f["blocks"] == 6 * spec.n_embd + 6.5
        assert f["embeddings"] == (spec.vocab_size + spec.max_positions) / (2 * spec.n_layer)
    small, xl = ch02.crossing_formula(GPT2_SMALL), ch02.crossing_formula(GPT2_XL)
    assert small["embeddings"] / xl["embeddings"] == GPT2_XL.n_layer / GPT2_SMALL.n_layer
    assert weights_cache_crossing(GPT2_SMALL, 8, 2, 2) == pytest.approx(small["total"] / 8)


def _qkv(T, seed=0, D=8, H=2):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, H, T, D, generator=g) for _ in range(3)]


@pytest.mark.parametrize("prompt", [1, 3, 6])
def test_2_3_the_window_cache_is_banded_attention(prompt):
    W, T = 6, 23
    q, k, v = _qkv(T)
    cache = ch02.SlidingWindowKVCache(1, 2, W, 8)
    K, V = cache.extend(k[:, :, :prompt], v[:, :, :prompt])
    outs = [softmax.parallel(q[:, :, :prompt], K, V)]
    for t in range(prompt, T):
        K, V = cache.extend(k[:, :, t:t + 1], v[:, :, t:t + 1])
        assert K.shape[2] == min(t + 1, W)
        outs.append(softmax.parallel(q[:, :, t:t + 1], K, V))
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    band = (j <= i) & (j > i - W)
    scores = (q @ k.transpose(-1, -2)) / 8 ** 0.5
    reference = scores.masked_fill(~band, float("-inf")).softmax(-1) @ v
    torch.testing.assert_close(torch.cat(outs, 2), reference, rtol=1e-5, atol=1e-5)
    assert cache.length == T and cache.nbytes == 2 * 2 * W * 8 * 4 == cache.used_nbytes


def test_2_3_the_window_cache_refuses_a_chunk_past_the_window():
    q, k, v = _qkv(10)
    cache = ch02.SlidingWindowKVCache(1, 2, 4, 8)
    with pytest.raises(ValueError, match="one token at a time"):
        cache.extend(k[:, :, :5], v[:, :, :5])
    cache.extend(k[:, :, :3], v[:, :, :3])
    with pytest.raises(ValueError, match="one token at a time"):
        cache.extend(k[:, :, 3:5], v[:, :, 3:5])
    assert cache.length == 3  # nothing was written
    with pytest.raises(ValueError, match="shape"):
        cache.extend(k[:, :1, 3:4], v[:, :1, 3:4])


def test_2_3_a_gpt2_through_window_caches_is_the_banded_model():
    cfg = GPTConfig(block_size=40, vocab_size=64, n_layer=3, n_head=2, n_embd=32)
    w = ch02.sliding_window_check(cfg, window=8, prompt_len=5, n_tokens=40, seed=1)
    assert w["vs_banded"] < 1e-5 and w["vs_full_inside_window"] < 1e-5
    assert w["vs_full_after_window"] > 1e-3
    assert w["length"] == 40
    assert w["cache_bytes"] * 40 == w["full_cache_bytes"] * 8  # W positions held instead of T
    # with a window as long as the sequence it is the full cache, for a prompt in one piece too
    w = ch02.sliding_window_check(cfg, window=40, prompt_len=40, n_tokens=40, seed=1)
    assert w["vs_full_inside_window"] < 1e-5 and w["cache_bytes"] == w["full_cache_bytes"]

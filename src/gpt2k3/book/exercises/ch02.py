"""Chapter 2's exercises: where a GPT-2's KV cache outgrows its weights, from the shape alone, and a
KV cache that keeps only a sliding window of positions."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gpt2k3.accounting import ArchSpec
from gpt2k3.accounting.decode import weights_cache_crossing
from gpt2k3.cache import KVCache, ModelCache, _check_kv
from gpt2k3.config import GPTConfig
from gpt2k3.layers.attention import CausalSelfAttention
from gpt2k3.model import GPT

__all__ = ["crossings", "crossing_formula", "SlidingWindowKVCache", "BandedAttention",
           "sliding_window_check"]


def crossings(specs) -> dict[str, float]:
    """Exercise 2.1: the context at which one sequence's KV cache holds as many bytes as the
    model's weights, both in bf16 (figure 2.2's titles), per model."""
    return {s.name: weights_cache_crossing(s, 1, 2, 2) for s in specs}


def crossing_formula(spec: ArchSpec) -> dict[str, float]:
    """Exercise 2.2: that crossing from a GPT-2's shape. The weights are ``(V + P) d + L (12 d^2 +
    13 d) + 2 d`` numbers and a token's cache ``2 L d``; their ratio, term by term."""
    V, P, L, d = spec.vocab_size, spec.max_positions, spec.n_layer, spec.n_embd
    terms = {"blocks": 6 * d + 13 / 2,           # L (12 d^2 + 13 d) / (2 L d)
             "embeddings": (V + P) / (2 * L),    # the two tables, shared out over the layers
             "final LayerNorm": 1 / L}           # 2 d / (2 L d)
    terms["total"] = sum(terms.values())
    return terms


class SlidingWindowKVCache(KVCache):
    """Exercise 2.3: a KV cache that keeps only the last ``window`` positions, in a buffer of
    ``window`` rows that a new position overwrites in turn (a rolling buffer). Memory and the
    bytes a step reads stop growing at ``window`` positions; attention becomes banded: position
    ``i`` sees keys ``i - window + 1 .. i``.

    A prompt (or a chunk) of ``t > 1`` tokens must fit in the window before it wraps; after
    that, tokens come one at a time. One query needs no order among its keys, so the rolling
    order of the rows is harmless; a chunk past the window would need a banded mask.
    """

    def __init__(self, batch: int, n_head: int, window: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device=None):
        super().__init__(batch, n_head, window, head_dim, dtype=dtype, device=device)
        self.window, self.max_len = window, None  # unbounded length: old rows are overwritten

    @property
    def used_nbytes(self) -> int:
        return self.nbytes * min(self.length, self.window) // self.window

    def extend(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        _check_kv(k, v, self.batch, self.n_head, self.head_dim, self.k)
        if k.shape[2] > 1 and self.length + k.shape[2] > self.window:
            raise ValueError(f"a chunk of {k.shape[2]} tokens after {self.length} does not fit "
                             f"the window of {self.window} unwrapped: send one token at a time")
        start = self.length % self.window  # the row of the oldest position, once the buffer is full
        self._advance(k.shape[2])
        self.k[:, :, start:start + k.shape[2]] = k
        self.v[:, :, start:start + k.shape[2]] = v
        n = min(self.length, self.window)
        return self.k[:, :, :n], self.v[:, :, :n]


class BandedAttention(CausalSelfAttention):
    """Exercise 2.3's reference: GPT-2's attention over a whole sequence, no cache, with a banded
    causal mask -- query ``i`` sees keys ``i - window + 1 .. i`` -- and GPT-2's parameters."""

    def __init__(self, config: GPTConfig, window: int):
        super().__init__(config)
        self.window = window

    def forward(self, x: torch.Tensor, cache=None) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
        band = (j <= i) & (j > i - self.window)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=band)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


def sliding_window_check(config: GPTConfig, window: int, prompt_len: int, n_tokens: int,
                         seed: int = 0) -> dict:
    """Exercise 2.3: a random GPT-2 decodes ``n_tokens`` through sliding-window caches (the first
    ``prompt_len <= window`` in one prefill, then one at a time) and, with the same weights, runs
    them in one pass with banded attention, and in one pass with full causal attention."""
    torch.manual_seed(seed)
    model = GPT(config).eval()
    banded = GPT(config, mixer=lambda c, i: BandedAttention(c, window)).eval()
    banded.load_state_dict(model.state_dict())
    idx = torch.randint(0, config.vocab_size, (1, n_tokens), generator=torch.Generator().manual_seed(seed))
    cache = ModelCache(SlidingWindowKVCache(1, config.n_head, window, config.head_dim)
                       for _ in range(config.n_layer))
    with torch.no_grad():
        steps = [model(idx[:, :prompt_len], cache)] + [model(idx[:, t:t + 1], cache)
                                                        for t in range(prompt_len, n_tokens)]
        windowed, reference, full = torch.cat(steps, 1), banded(idx), model(idx)
    return {"vs_banded": (windowed - reference).abs().max().item(),
            "vs_full_inside_window": (windowed[:, :window] - full[:, :window]).abs().max().item(),
            "vs_full_after_window": ((windowed[:, window:] - full[:, window:]).abs().max().item()
                                     if n_tokens > window else 0.0),
            "cache_bytes": cache.nbytes, "cache_used_bytes": cache.used_nbytes,
            "full_cache_bytes": model.new_cache(1, n_tokens).nbytes, "length": cache.length}

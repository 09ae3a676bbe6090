"""GPT-2's causal self-attention layer: projections around :func:`gpt2k3.ops.softmax.parallel`,
with a :class:`gpt2k3.cache.KVCache` of its own.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from gpt2k3.cache import ConcatKVCache, KVCache
from gpt2k3.config import GPTConfig
from gpt2k3.ops import softmax


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with one fused QKV projection (``c_attn``).

    The token mixing itself is :func:`gpt2k3.ops.softmax.parallel`; this layer adds GPT-2's
    projections and owns its cache, a :class:`gpt2k3.cache.KVCache` (:meth:`new_cache`); it
    also accepts the seed's :class:`gpt2k3.cache.ConcatKVCache`. Nothing here reads a value
    back to the host, so a decode step through it makes no host sync.
    """

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.attn_dropout = config.dropout
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head = config.n_head
        self.n_embd = config.n_embd

    def new_cache(self, batch: int, max_len: int, *, dtype: torch.dtype | None = None,
                  device=None) -> KVCache:
        """An empty preallocated K/V cache for this layer (dtype and device of the weights)."""
        w = self.c_attn.weight
        return KVCache(batch, self.n_head, max_len, self.n_embd // self.n_head,
                       dtype=w.dtype if dtype is None else dtype,
                       device=w.device if device is None else device)

    def forward(self, x: torch.Tensor, cache: KVCache | ConcatKVCache | None = None) -> torch.Tensor:
        if cache is not None and not isinstance(cache, (KVCache, ConcatKVCache)):  # a host check
            raise ValueError(f"cache must be a KVCache or ConcatKVCache (from new_cache or "
                             f"concat_cache), got {type(cache).__name__}")
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        # (B, T, C) -> (B, nh, T, hs): heads become a batch dimension
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        if cache is not None:  # write this chunk; attend over everything cached so far
            k, v = cache.extend(k, v)
        y = softmax.parallel(q, k, v, dropout_p=self.attn_dropout if self.training else 0.0)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # re-assemble the heads side by side
        return self.resid_dropout(self.c_proj(y))


# Imported here rather than at the top so that the lines of GPT-2's layer above, which
# chapter 1 shows with their line numbers, stay where they are.
from gpt2k3.checks import check_finite_number  # noqa: E402
from gpt2k3.layers.mla import apply_rope  # noqa: E402


class RotaryCausalSelfAttention(CausalSelfAttention):
    """:class:`CausalSelfAttention` with rotary position embeddings (RoPE): every head's queries
    and keys are rotated by their positions before the scores, so a score depends on how far
    apart two positions are, not on where they are (Su et al., 2021). The attention of the
    Llama-style "Transformer++" baseline, which needs no position table.

    The rotation is :func:`gpt2k3.layers.mla.apply_rope` in the "rotate half" pairing of Llama
    and Hugging Face (``interleave=False``), pair ``i`` of a head turned by ``position *
    rope_theta ** (-2 i / head_dim)``. The cache stores rotated keys, so a decode step rotates
    only the new query and key, at positions from ``cache.length``. A deliberate second forward:
    GPT-2's, with the two lines that rotate ``q`` and ``k`` added (chapter 11 shows the diff);
    GPT-2's own layer is left exactly as it is.
    """

    def __init__(self, config: GPTConfig, rope_theta: float = 10000.0):
        super().__init__(config)
        if config.head_dim % 2:
            raise ValueError(f"RoPE rotates pairs of dimensions: head_dim must be even, got "
                             f"{config.head_dim}")
        self.rope_theta = check_finite_number(rope_theta, "rope_theta", 1)

    def forward(self, x: torch.Tensor, cache: KVCache | ConcatKVCache | None = None) -> torch.Tensor:
        if cache is not None and not isinstance(cache, (KVCache, ConcatKVCache)):  # a host check
            raise ValueError(f"cache must be a KVCache or ConcatKVCache (from new_cache or "
                             f"concat_cache), got {type(cache).__name__}")
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        # (B, T, C) -> (B, nh, T, hs): heads become a batch dimension
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        past = cache.length if cache is not None else 0  # rotate by position, from the cache's end
        q, k = (apply_rope(t, torch.arange(past, past + T), self.rope_theta, interleave=False)
                for t in (q, k))
        if cache is not None:  # write this chunk; attend over everything cached so far
            k, v = cache.extend(k, v)
        y = softmax.parallel(q, k, v, dropout_p=self.attn_dropout if self.training else 0.0)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # re-assemble the heads side by side
        return self.resid_dropout(self.c_proj(y))

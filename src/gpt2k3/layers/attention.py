"""GPT-2's causal self-attention: the written-out form chapter 1 reads (:class:`GPT2Attention`),
the same layer with a KV cache and the fused kernel (:class:`CausalSelfAttention`, chapter 2),
and its rotary variant (:class:`RotaryCausalSelfAttention`).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from gpt2k3.cache import ConcatKVCache, KVCache, check_layer_cache
from gpt2k3.checks import check_finite_number, check_float_tensor, checked
from gpt2k3.config import GPTConfig
from gpt2k3.layers.mla import apply_rope
from gpt2k3.ops import softmax

__all__ = ["GPT2Attention", "CausalSelfAttention", "RotaryCausalSelfAttention", "check_attention_call"]


class GPT2Attention(nn.Module):
    """GPT-2's multi-head causal self-attention, written out: ``softmax(q k^T / sqrt(D) + M) v``
    per head, with one fused projection ``c_attn`` for queries, keys and values."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.attn_dropout = nn.Dropout(config.dropout)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head = config.n_head
        self.n_embd = config.n_embd

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        # (B, T, C) -> (B, nh, T, hs): heads become a batch dimension
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(k.shape[-1])  # (B, nh, T, T) scores
        causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        att = att.masked_fill(~causal, float("-inf"))  # no position sees a later one
        att = self.attn_dropout(att.softmax(dim=-1))  # each row: weights adding up to 1
        y = att @ v  # (B, nh, T, hs): every position's weighted average of the values
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # re-assemble the heads side by side
        return self.resid_dropout(self.c_proj(y))


def check_attention_call(layer, x, cache=None) -> None:
    """The door of :class:`CausalSelfAttention`'s ``forward``: ``x`` a float tensor ``(B, T,
    n_embd)`` and ``cache`` ``None`` or a key-value cache. Shapes and types only (no host sync)."""
    if check_float_tensor(x, "x", 3).shape[-1] != layer.n_embd:
        raise ValueError(f"x must have shape (B, T, {layer.n_embd}), got {tuple(x.shape)}")
    check_layer_cache(layer, cache)


class CausalSelfAttention(GPT2Attention):
    """:class:`GPT2Attention` with a KV cache of its own (:meth:`new_cache`, a
    :class:`gpt2k3.cache.KVCache`; the seed's :class:`gpt2k3.cache.ConcatKVCache` works too) and
    the fused kernel, :func:`gpt2k3.ops.softmax.parallel` (tested equal to the written-out form).
    Nothing here reads a value back to the host, so a decode step through it makes no host sync.
    """

    cache_types = (KVCache, ConcatKVCache)  #: the layer caches it accepts

    def new_cache(self, batch: int, max_len: int, *, dtype: torch.dtype | None = None,
                  device=None) -> KVCache:
        """An empty preallocated K/V cache for this layer (dtype and device of the weights)."""
        w = self.c_attn.weight
        return KVCache(batch, self.n_head, max_len, self.n_embd // self.n_head,
                       dtype=w.dtype if dtype is None else dtype,
                       device=w.device if device is None else device)

    @checked(check_attention_call)
    def forward(self, x: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        # (B, T, C) -> (B, nh, T, hs): heads become a batch dimension
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        if cache is not None:  # write this chunk's keys and values; read back every cached one
            k, v = cache.extend(k, v)
        y = softmax.parallel(q, k, v, dropout_p=self.attn_dropout.p if self.training else 0.0)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # re-assemble the heads side by side
        return self.resid_dropout(self.c_proj(y))


class RotaryCausalSelfAttention(CausalSelfAttention):
    """:class:`CausalSelfAttention` with rotary position embeddings (RoPE): every head's queries
    and keys are rotated by their positions before the scores, so a score depends on how far
    apart two positions are, not on where they are (Su et al., 2021). The attention of the
    Llama-style "Transformer++" baseline, which needs no position table.

    The rotation is :func:`gpt2k3.layers.mla.apply_rope` in the "rotate half" pairing of Llama
    and Hugging Face (``interleave=False``), pair ``i`` of a head turned by ``position *
    rope_theta ** (-2 i / head_dim)``. The cache stores rotated keys, so a decode step rotates
    only the new query and key, at positions from ``cache.length``. A deliberate second forward:
    the cached layer's, with the two lines that rotate ``q`` and ``k`` added (chapter 11 shows
    the diff).
    """

    def __init__(self, config: GPTConfig, rope_theta: float = 10000.0):
        super().__init__(config)
        if config.head_dim % 2:
            raise ValueError(f"RoPE rotates pairs of dimensions: head_dim must be even, got "
                             f"{config.head_dim}")
        self.rope_theta = check_finite_number(rope_theta, "rope_theta", 1)

    @checked(check_attention_call)
    def forward(self, x: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        # (B, T, C) -> (B, nh, T, hs): heads become a batch dimension
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        past = cache.length if cache is not None else 0  # rotate by position, from the cache's end
        q, k = (apply_rope(t, torch.arange(past, past + T), self.rope_theta, interleave=False)
                for t in (q, k))
        if cache is not None:  # write this chunk's keys and values; read back every cached one
            k, v = cache.extend(k, v)
        y = softmax.parallel(q, k, v, dropout_p=self.attn_dropout.p if self.training else 0.0)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # re-assemble the heads side by side
        return self.resid_dropout(self.c_proj(y))

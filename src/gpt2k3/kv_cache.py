"""A preallocated key/value cache for autoregressive decoding.

During decoding every new token attends to the keys and values of all earlier
tokens.  Those never change once computed, so we keep them: for each attention
layer one K and one V tensor of shape ``(B, H, max_len, D)``, allocated once, plus
a length pointer ``length`` that says how many positions are filled.

A forward pass over ``t`` new tokens (a whole prompt, a chunk of one, or a single
decoded token) writes its keys and values at positions ``length .. length+t-1``
(:meth:`KVCache.extend`, which the attention layer calls).  Nothing is ever copied
or re-allocated, and writing past ``max_len`` raises ``ValueError`` instead of
wrapping around.  Each layer's cache speaks the protocol of :mod:`gpt2k3.cache`;
a model's cache is the :class:`~gpt2k3.cache.ModelCache` of its layers' caches.
"""

from __future__ import annotations

import torch

from ._validate import check_finite, check_positive_int
from .cache import LayerCache, ModelCache
from .mixers.softmax import causal_mask  # the mask a chunk after a non-empty cache needs

__all__ = ["KVCache", "ConcatKVCache", "concat_cache", "causal_mask", "seed_cached_attention",
           "concat_copy_bytes"]


class KVCache(LayerCache):
    """One attention layer's preallocated K and V buffers with a length pointer.

    Parameters
    ----------
    batch, n_head, max_len, head_dim:
        Sizes; K and V are each ``(batch, n_head, max_len, head_dim)``.
    dtype, device:
        Storage dtype and device of the buffers.

    :meth:`extend` writes ``t`` new positions at ``length .. length+t-1`` and returns views of
    every filled position; nothing is ever copied or re-allocated, and writing past ``max_len``
    raises ``ValueError``. A model holds one per attention layer, inside a
    :class:`gpt2k3.cache.ModelCache` (``model.new_cache(batch, max_len)``).
    """

    def __init__(self, batch: int, n_head: int, max_len: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str | None = None):
        super().__init__()
        for name, value in (("batch", batch), ("n_head", n_head), ("max_len", max_len),
                            ("head_dim", head_dim)):
            check_positive_int(value, name)
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise ValueError(f"dtype must be a floating torch dtype, got {dtype!r}")
        shape = (batch, n_head, max_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.batch, self.n_head, self.max_len, self.head_dim = batch, n_head, max_len, head_dim

    @property
    def nbytes(self) -> int:
        """Bytes allocated for K and V (independent of ``length``)."""
        return self.k.numel() * self.k.element_size() * 2

    @property
    def used_nbytes(self) -> int:
        """Bytes of the filled part: what one decode step must read."""
        return self.nbytes * self.length // self.max_len

    def extend(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write ``k, v`` of shape ``(B, H, t, D)`` at positions ``length..length+t-1``, move
        ``length`` by ``t``, and return views of all filled positions ``(B, H, length, D)``."""
        _check_kv(k, v, self.batch, self.n_head, self.head_dim)
        if k.dtype != self.k.dtype or v.dtype != self.k.dtype:
            raise ValueError(f"k and v must have the cache's dtype {self.k.dtype}, got {k.dtype} and {v.dtype}")
        if k.device != self.k.device or v.device != self.k.device:
            raise ValueError(f"k and v must be on the cache's device {self.k.device}, got {k.device}")
        check_finite(k, "k")  # once per entry, when written: readers need not scan the cache
        check_finite(v, "v")
        start, t = self.length, k.shape[2]
        self._advance(t)
        self.k[:, :, start:self.length] = k
        self.v[:, :, start:self.length] = v
        return self.k[:, :, :self.length], self.v[:, :, :self.length]


def _check_kv(k: torch.Tensor, v: torch.Tensor, batch: int, n_head: int, head_dim: int) -> None:
    if not isinstance(k, torch.Tensor) or not isinstance(v, torch.Tensor) or k.dim() != 4 \
            or k.shape != v.shape or k.shape[0] != batch or k.shape[1] != n_head \
            or k.shape[3] != head_dim:
        raise ValueError(f"k and v must have shape (B, H, t, D) = ({batch}, {n_head}, t, {head_dim}), "
                         f"got {tuple(getattr(k, 'shape', ()))} and {tuple(getattr(v, 'shape', ()))}")


class ConcatKVCache(LayerCache):
    """The seed article's cache for one layer: every step concatenates the new keys and values
    onto the old ones with ``torch.cat``.

    Same protocol as :class:`KVCache`, same results; the difference is cost. Each step
    allocates new tensors and copies the whole cache, so step ``n`` moves O(n) bytes just to
    append one position, where :class:`KVCache` writes one position in place. Kept as the
    comparison point of chapter 2's benchmark; :func:`concat_cache` builds one per layer of a
    GPT-2-style model.
    """

    def __init__(self, batch: int, n_head: int, head_dim: int):
        super().__init__()
        for name, value in (("batch", batch), ("n_head", n_head), ("head_dim", head_dim)):
            check_positive_int(value, name)
        self.batch, self.n_head, self.head_dim = batch, n_head, head_dim
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None
        self.bytes_copied = 0  #: bytes moved by torch.cat so far (the O(N) per step)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.k, self.v) if t is not None)

    def extend(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        _check_kv(k, v, self.batch, self.n_head, self.head_dim)
        check_finite(k, "k")
        check_finite(v, "v")
        self._advance(k.shape[2])
        if self.k is not None:
            k = torch.cat((self.k, k), dim=2)
            v = torch.cat((self.v, v), dim=2)
            self.bytes_copied += 2 * k.numel() * k.element_size()
        self.k, self.v = k, v
        return k, v

    def reset(self) -> None:
        super().reset()
        self.k = self.v = None


def concat_cache(model, batch: int = 1) -> ModelCache:
    """A :class:`~gpt2k3.cache.ModelCache` of the seed's concatenating caches, one per layer of
    ``model`` (any model with a GPT-2 ``config``: ``n_layer``, ``n_head``, ``n_embd``)."""
    c = model.config
    return ModelCache(ConcatKVCache(batch, c.n_head, c.n_embd // c.n_head) for _ in range(c.n_layer))


def concat_copy_bytes(n_layer: int, n_embd: int, prompt_len: int, n_new: int, dtype_bytes: int = 4) -> int:
    """Bytes :class:`ConcatKVCache` copies while decoding ``n_new`` tokens after a
    ``prompt_len``-token prefill: step ``i`` rebuilds K and V of every layer at length
    ``prompt_len + i`` — a sum that grows quadratically with ``n_new`` — where the
    preallocated cache writes one position per step."""
    for name, value in (("n_layer", n_layer), ("n_embd", n_embd), ("prompt_len", prompt_len),
                        ("dtype_bytes", dtype_bytes)):
        check_positive_int(value, name)
    if not isinstance(n_new, int) or n_new < 0:
        raise ValueError(f"n_new must be a non-negative int, got {n_new!r}")
    positions = sum(prompt_len + i for i in range(1, n_new + 1))
    return 2 * n_layer * n_embd * positions * dtype_bytes


def seed_cached_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                          past_kv: tuple[torch.Tensor, torch.Tensor] | None = None
                          ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """The seed article's cached attention, reproduced to show its masking bug.

    It concatenates the cache and applies the causal mask *only when the cache is
    empty*.  That is right for a whole-prompt prefill and for one-token decode steps,
    but a chunk of ``t > 1`` tokens arriving after a non-empty cache lets every token
    of the chunk attend to the chunk's later tokens — its future.  Compare
    :func:`causal_mask`, which the model uses.  Shapes ``(B, H, t, D)``.
    """
    if past_kv is not None:
        k = torch.cat((past_kv[0], k), dim=2)
        v = torch.cat((past_kv[1], v), dim=2)
    scores = (q @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5
    if past_kv is None:  # the bug: no mask once a cache exists
        t = q.shape[2]
        scores = scores.masked_fill(torch.triu(torch.ones(t, t, dtype=torch.bool), 1), float("-inf"))
    return scores.softmax(-1) @ v, (k, v)

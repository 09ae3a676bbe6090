"""The one cache protocol every token-mixing layer speaks.

A decoder layer that mixes tokens (softmax attention, linear attention, DeltaNet and its gated
forms, MLA) keeps something between forward calls so that decoding one more token does not
recompute the past. What it keeps differs -- keys and values that grow with every token, a
fixed-size state, a compressed latent -- but how the model talks to it does not:

* the layer **creates** its cache: ``layer.new_cache(batch, max_len, dtype=..., device=...)``;
* the layer **extends** it inside its own ``forward(x, cache)``: ``cache.extend(...)`` takes the
  new tokens' contribution and moves ``cache.length`` by their number;
* anyone can ask ``cache.length`` (tokens seen), ``cache.nbytes`` (bytes allocated),
  ``cache.used_nbytes`` (bytes a decode step reads), ``cache.check_room(t)`` (``ValueError`` if
  ``t`` more tokens do not fit) and ``cache.reset()``.

A model's cache is a :class:`ModelCache`: the list of its layers' caches, one per block, with the
same questions answered for the whole stack. :func:`gpt2k3.model.generate` asks the model for one
(``model.new_cache``) and passes it back to every forward call; it never needs to know which
mixers the model holds.

The cache kinds live here too: :class:`KVCache` (softmax attention's preallocated keys and values),
:class:`ConcatKVCache` (the seed's ``torch.cat`` cache), :class:`StateCache` (a recurrent mixer's
fixed-size state) and :class:`ConvCache` (a short convolution's tail).

This module is the bottom of the package: it imports only :mod:`gpt2k3.checks`.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

import torch

from gpt2k3.checks import check_positive_int, is_int

__all__ = ["LayerCache", "StateCache", "ModelCache", "nbytes_of", "check_cache", "check_tokens", "sizes_of", "KVCache", "ConcatKVCache", "concat_cache", "concat_copy_bytes", "ConvCache"]


def nbytes_of(obj: Any) -> int:
    """Bytes held by a tensor, or by the tensors in a (nested) tuple, list or dict."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, (tuple, list)):
        return sum(nbytes_of(o) for o in obj)
    if isinstance(obj, dict):
        return sum(nbytes_of(o) for o in obj.values())
    return 0


def check_tokens(t: Any, name: str = "t") -> int:
    """A number of new tokens: an int >= 0 (``ValueError`` otherwise)."""
    if not is_int(t) or t < 0:
        raise ValueError(f"{name} must be a non-negative int (a number of tokens), got {t!r}")
    return t


class LayerCache:
    """What every layer's cache offers. Subclasses add ``extend`` for their kind of content.

    ``max_len`` is the capacity in tokens (``None``: unbounded, as for the seed's concatenating
    cache) and ``batch`` the number of sequences it holds (``None``: not fixed).
    """

    max_len: int | None = None
    batch: int | None = None

    def __init__(self) -> None:
        self.length = 0

    def check_room(self, t: int) -> None:
        """Raise ``ValueError`` if ``t`` more tokens do not fit."""
        check_tokens(t)
        if self.max_len is not None and self.length + t > self.max_len:
            raise ValueError(f"{type(self).__name__} overflow: {self.length} cached + {t} new "
                             f"tokens exceeds max_len={self.max_len}")

    def _advance(self, t: int) -> None:
        """Move ``length`` by ``t`` tokens (called by ``extend``)."""
        self.check_room(t)
        self.length += t

    @property
    def nbytes(self) -> int:
        """Bytes allocated."""
        raise NotImplementedError

    @property
    def used_nbytes(self) -> int:
        """Bytes a decode step reads (the filled part; all of it for a fixed-size state)."""
        return self.nbytes

    def reset(self) -> None:
        """Forget every token (buffers may be kept)."""
        self.length = 0


class StateCache(LayerCache):
    """A fixed-size recurrent state (a tensor, or a tuple of tensors): the cache of linear
    attention, DeltaNet, Gated DeltaNet and KDA layers. Its size does not grow with length.

    ``state`` is ``None`` before the first token; ``extend(state, t)`` replaces it with the state
    after ``t`` more tokens. ``batch`` and ``max_len`` (``None``: not fixed) are what
    ``new_cache(batch, max_len)`` promised: a write of a state for another batch, or past
    ``max_len`` tokens, is refused.
    """

    def __init__(self, batch: int | None = None, max_len: int | None = None) -> None:
        super().__init__()
        self.batch = None if batch is None else check_positive_int(batch, "batch")
        self.max_len = None if max_len is None else check_positive_int(max_len, "max_len")
        self.state: Any = None

    def extend(self, state: Any, t: int) -> None:
        """Store the state reached after ``t`` (>= 1) more tokens."""
        check_tokens(t)
        if t == 0:
            raise ValueError("t must be >= 1: a state is extended by at least one token")
        first = state[0] if isinstance(state, (tuple, list)) and state else state
        if not isinstance(first, torch.Tensor):
            raise ValueError(f"state must be the new state (a tensor or a tuple of tensors), "
                             f"got {type(state).__name__}")
        if self.batch is not None and first.shape[0] != self.batch:
            raise ValueError(f"state must have batch {self.batch} (the cache's), got shape "
                             f"{tuple(first.shape)}")
        self._advance(t)
        self.state = state

    @property
    def nbytes(self) -> int:
        return nbytes_of(self.state)

    def reset(self) -> None:
        super().reset()
        self.state = None


class ModelCache:
    """A model's cache: one :class:`LayerCache` per block, in order.

    ``cache[i]`` is block ``i``'s cache. ``length`` is the number of tokens every layer has seen
    (the layers move together; a mismatch is an error), ``nbytes`` and ``used_nbytes`` add the
    layers up, and ``kinds`` names each layer's cache type.
    """

    def __init__(self, layers: Iterable[LayerCache]):
        self.layers: list[LayerCache] = list(layers)
        if not self.layers:
            raise ValueError("layers must hold at least one layer cache")
        for i, c in enumerate(self.layers):
            if not isinstance(c, LayerCache):
                raise ValueError(f"layers[{i}] must be a LayerCache, got {type(c).__name__}")

    def __len__(self) -> int:
        return len(self.layers)

    def __getitem__(self, i: int) -> LayerCache:
        return self.layers[i]

    def __iter__(self):
        return iter(self.layers)

    @property
    def length(self) -> int:
        lengths = {c.length for c in self.layers}
        if len(lengths) != 1:
            raise ValueError(f"the layers' caches disagree on the length: {sorted(lengths)} "
                             "(a forward pass was interrupted; call reset())")
        return lengths.pop()

    def check_room(self, t: int) -> None:
        for c in self.layers:
            c.check_room(t)

    def check_batch(self, batch: int) -> None:
        """Raise ``ValueError`` unless every layer's cache holds ``batch`` sequences."""
        for c in self.layers:
            if c.batch is not None and c.batch != batch:
                raise ValueError(f"idx holds {batch} sequences, but the cache was made for "
                                 f"batch {c.batch} (new_cache(batch, max_len))")

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.layers)

    @property
    def used_nbytes(self) -> int:
        return sum(c.used_nbytes for c in self.layers)

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(type(c).__name__ for c in self.layers)

    def nbytes_by_kind(self) -> dict[str, int]:
        """``used_nbytes`` summed per cache type (e.g. KV cache vs states in a hybrid)."""
        out: dict[str, int] = {}
        for c in self.layers:
            out[type(c).__name__] = out.get(type(c).__name__, 0) + c.used_nbytes
        return out

    def reset(self) -> None:
        for c in self.layers:
            c.reset()


def check_layer_cache(layer: Any, cache: Any, where: str = "") -> None:
    """``cache`` ``None`` or a layer cache of a kind ``layer`` accepts (its ``cache_types``: a
    ``KVCache`` for softmax attention, a ``StateCache`` for the recurrent mixers, a
    ``LatentCache`` for MLA); ``where`` names the layer in a model's message."""
    kinds = getattr(layer, "cache_types", None)
    if cache is not None and kinds is not None and not isinstance(cache, kinds):
        raise ValueError(f"cache must be a {' or '.join(k.__name__ for k in kinds)}{where} "
                         f"(from new_cache), got {type(cache).__name__}")


def check_cache(cache: Any, n_layer: int) -> ModelCache | None:
    """``None`` or a :class:`ModelCache` of ``n_layer`` layers (``ValueError`` otherwise)."""
    if cache is None:
        return None
    if not isinstance(cache, ModelCache):
        raise ValueError(f"cache must be a ModelCache (from model.new_cache), got "
                         f"{type(cache).__name__}")
    if len(cache) != n_layer:
        raise ValueError(f"cache must hold one layer cache per block ({n_layer}), got {len(cache)}")
    return cache


def sizes_of(sizes: Sequence[int], total: int) -> list[int]:
    """Positive ints adding up to ``total`` (``ValueError`` otherwise)."""
    if not is_int(total) or total < 1:
        raise ValueError(f"total must be a positive int (a number of tokens), got {total!r}")
    if isinstance(sizes, (str, bytes)) or not hasattr(sizes, "__iter__"):
        raise ValueError(f"sizes must be a sequence of positive ints, got {sizes!r}")
    sizes = list(sizes)
    if any(not is_int(s) or s <= 0 for s in sizes) \
            or sum(sizes) != total:
        raise ValueError(f"sizes must be positive ints adding up to T = {total}, got {sizes}")
    return sizes


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
        _check_kv(k, v, self.batch, self.n_head, self.head_dim, self.k)
        start = self.length
        self._advance(k.shape[2])
        self.k[:, :, start:self.length] = k
        self.v[:, :, start:self.length] = v
        return self.k[:, :, :self.length], self.v[:, :, :self.length]


def _check_kv(k, v, batch: int, n_head: int, head_dim: int,
                   like: torch.Tensor | None = None) -> None:
    """New keys and values for a cache: ``(batch, n_head, t, head_dim)`` each, with the dtype and
    device of ``like`` (the cache's buffer) when given. Shapes only: it reads no entry, so a
    decode step that writes a cache makes no host sync."""
    if not isinstance(k, torch.Tensor) or not isinstance(v, torch.Tensor) or k.dim() != 4 \
            or k.shape != v.shape or k.shape[0] != batch or k.shape[1] != n_head \
            or k.shape[3] != head_dim:
        raise ValueError(f"k and v must have shape (B, H, t, D) = ({batch}, {n_head}, t, {head_dim}), "
                         f"got {tuple(getattr(k, 'shape', ()))} and {tuple(getattr(v, 'shape', ()))}")
    if like is not None and not (k.dtype == v.dtype == like.dtype
                                 and k.device == v.device == like.device):
        raise ValueError(f"k and v must have the cache's dtype {like.dtype} and device "
                         f"{like.device}, got {k.dtype} on {k.device} and {v.dtype} on {v.device}")


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
        _check_kv(k, v, self.batch, self.n_head, self.head_dim, self.k)
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


class ConvCache(LayerCache):
    """The cache of a :class:`ConvMixer`: its inner layer's cache (``inner``: a KV cache or a
    recurrent state) and the convolution's last ``kernel_size - 1`` inputs (``conv``,
    ``(B, C, kernel_size - 1)``; ``None`` before the first token). Length, room and bytes are
    the inner cache's, plus the convolution's tail."""

    def __init__(self, inner: LayerCache):
        if not isinstance(inner, LayerCache):
            raise ValueError(f"inner must be a LayerCache, got {type(inner).__name__}")
        self.inner = inner
        self.conv: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return self.inner.length

    @property
    def max_len(self):
        return self.inner.max_len

    @property
    def batch(self):
        return self.inner.batch

    def check_room(self, t: int) -> None:
        self.inner.check_room(t)

    @property
    def nbytes(self) -> int:
        return self.inner.nbytes + nbytes_of(self.conv)

    @property
    def used_nbytes(self) -> int:
        return self.inner.used_nbytes + nbytes_of(self.conv)

    def reset(self) -> None:
        self.inner.reset()
        self.conv = None

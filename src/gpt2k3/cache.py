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
same questions answered for the whole stack. :func:`gpt2k3.gpt2.generate` asks the model for one
(``model.new_cache``) and passes it back to every forward call; it never needs to know which
mixers the model holds.

This module is the bottom of the package: it imports nothing from ``gpt2k3``.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

import torch

__all__ = ["LayerCache", "StateCache", "ModelCache", "nbytes_of", "check_cache", "check_tokens",
           "sizes_of"]


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
    if isinstance(t, bool) or not isinstance(t, int) or t < 0:
        raise ValueError(f"{name} must be a non-negative int (a number of tokens), got {t!r}")
    return t


class LayerCache:
    """What every layer's cache offers. Subclasses add ``extend`` for their kind of content.

    ``max_len`` is the capacity in tokens (``None``: unbounded, as for a fixed-size state or
    the seed's concatenating cache).
    """

    max_len: int | None = None

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
    after ``t`` more tokens.
    """

    def __init__(self) -> None:
        super().__init__()
        self.state: Any = None

    def extend(self, state: Any, t: int) -> None:
        """Store the state reached after ``t`` (>= 1) more tokens."""
        check_tokens(t)
        if t == 0:
            raise ValueError("t must be >= 1: a state is extended by at least one token")
        if state is None:
            raise ValueError("state must be the new state (a tensor or a tuple of tensors), got None")
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
    if isinstance(total, bool) or not isinstance(total, int) or total < 1:
        raise ValueError(f"total must be a positive int (a number of tokens), got {total!r}")
    if isinstance(sizes, (str, bytes)) or not hasattr(sizes, "__iter__"):
        raise ValueError(f"sizes must be a sequence of positive ints, got {sizes!r}")
    sizes = list(sizes)
    if any(isinstance(s, bool) or not isinstance(s, int) or s <= 0 for s in sizes) \
            or sum(sizes) != total:
        raise ValueError(f"sizes must be positive ints adding up to T = {total}, got {sizes}")
    return sizes


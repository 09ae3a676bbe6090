"""A preallocated key/value cache for autoregressive decoding.

During decoding every new token attends to the keys and values of all earlier
tokens.  Those never change once computed, so we keep them: one K and one V
tensor per layer, each of shape ``(B, H, max_len, D)``, allocated once, plus a
length pointer ``length`` that says how many positions are filled.

A forward pass over ``t`` new tokens (a whole prompt, a chunk of one, or a single
decoded token) writes its keys and values at positions ``length .. length+t-1``
of every layer (:meth:`KVCache.update`) and then moves the pointer once
(:meth:`KVCache.advance`).  Nothing is ever copied or re-allocated, and writing
past ``max_len`` raises ``ValueError`` instead of wrapping around.
"""

from __future__ import annotations

import torch

from ._validate import check_positive_int

__all__ = ["KVCache", "ConcatKVCache", "causal_mask", "seed_cached_attention", "concat_copy_bytes"]


def causal_mask(t: int, past: int, device=None) -> torch.Tensor:
    """Boolean mask ``(t, past + t)``: query ``i`` (absolute position ``past + i``)
    may attend to key ``j`` iff ``j <= past + i``.

    This is the mask a chunk of ``t > 1`` tokens needs when it arrives after
    ``past`` cached tokens: every query sees the whole cache plus the new tokens
    up to itself.  (The seed article's snippet masked only when the cache was
    empty, so a second prefill chunk could see its own future.)
    """
    q_pos = torch.arange(past, past + t, device=device)[:, None]
    k_pos = torch.arange(past + t, device=device)[None, :]
    return k_pos <= q_pos


class KVCache:
    """Per-layer preallocated K and V tensors with a shared length pointer.

    Parameters
    ----------
    n_layer, batch, n_head, max_len, head_dim:
        Sizes; the K and V buffers of every layer are ``(batch, n_head, max_len, head_dim)``.
    dtype, device:
        Storage dtype and device of the buffers.
    """

    def __init__(self, n_layer: int, batch: int, n_head: int, max_len: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str | None = None):
        for name, value in (("n_layer", n_layer), ("batch", batch), ("n_head", n_head),
                            ("max_len", max_len), ("head_dim", head_dim)):
            check_positive_int(value, name)
        shape = (batch, n_head, max_len, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layer)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layer)]
        self.n_layer, self.batch, self.n_head = n_layer, batch, n_head
        self.max_len, self.head_dim = max_len, head_dim
        self.length = 0

    @classmethod
    def for_model(cls, config, batch: int = 1, max_len: int | None = None,
                  dtype: torch.dtype = torch.float32, device=None) -> "KVCache":
        """A cache sized for a :class:`gpt2k3.gpt2.GPTConfig` (``max_len`` defaults to its block size)."""
        return cls(config.n_layer, batch, config.n_head, max_len or config.block_size,
                   config.n_embd // config.n_head, dtype=dtype, device=device)

    @property
    def nbytes(self) -> int:
        """Bytes allocated for all layers' K and V buffers (independent of ``length``)."""
        return sum(t.numel() * t.element_size() for t in (*self.k, *self.v))

    @property
    def used_nbytes(self) -> int:
        """Bytes of the filled part: what one decode step must read."""
        return self.nbytes * self.length // self.max_len

    def check_room(self, t: int) -> None:
        """Raise ``ValueError`` if ``t`` more positions do not fit."""
        if self.length + t > self.max_len:
            raise ValueError(f"KVCache overflow: {self.length} cached + {t} new tokens "
                             f"exceeds max_len={self.max_len}")

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write ``k, v`` of shape ``(B, H, t, D)`` at positions ``length..length+t-1`` of
        ``layer`` and return views of all filled positions ``(B, H, length+t, D)``.

        The pointer is not moved here (every layer writes the same positions);
        call :meth:`advance` once after the last layer.
        """
        if not 0 <= layer < self.n_layer:
            raise ValueError(f"layer must be in [0, {self.n_layer}), got {layer}")
        _check_kv(k, v, self.batch, self.n_head, self.head_dim)
        buf = self.k[layer]
        if k.dtype != buf.dtype or v.dtype != buf.dtype:
            raise ValueError(f"k and v must have the cache's dtype {buf.dtype}, got {k.dtype} and {v.dtype}")
        if k.device != buf.device or v.device != buf.device:
            raise ValueError(f"k and v must be on the cache's device {buf.device}, got {k.device}")
        t = k.shape[2]
        self.check_room(t)
        end = self.length + t
        self.k[layer][:, :, self.length:end] = k
        self.v[layer][:, :, self.length:end] = v
        return self.k[layer][:, :, :end], self.v[layer][:, :, :end]

    def advance(self, t: int) -> None:
        """Move the length pointer after all layers have written ``t`` positions."""
        self.check_room(t)
        self.length += t

    def reset(self) -> None:
        """Forget every cached position (buffers are kept)."""
        self.length = 0


def _check_kv(k: torch.Tensor, v: torch.Tensor, batch: int, n_head: int, head_dim: int) -> None:
    if k.dim() != 4 or k.shape != v.shape or k.shape[0] != batch or k.shape[1] != n_head \
            or k.shape[3] != head_dim:
        raise ValueError(f"k and v must have shape (B, H, t, D) = ({batch}, {n_head}, t, {head_dim}), "
                         f"got {tuple(k.shape)} and {tuple(v.shape)}")


class ConcatKVCache:
    """The seed article's cache: every step concatenates the new keys and values onto the
    old ones with ``torch.cat``.

    Same interface as :class:`KVCache`, same results; the difference is cost.  Each
    step allocates new tensors and copies the whole cache, so step ``n`` moves O(n)
    bytes just to append one position, where :class:`KVCache` writes one position in
    place.  Kept as the comparison point of chapter 2's benchmark.
    """

    def __init__(self, n_layer: int, batch: int, n_head: int, head_dim: int):
        for name, value in (("n_layer", n_layer), ("batch", batch), ("n_head", n_head),
                            ("head_dim", head_dim)):
            check_positive_int(value, name)
        self.n_layer, self.batch, self.n_head, self.head_dim = n_layer, batch, n_head, head_dim
        self.k: list[torch.Tensor | None] = [None] * n_layer
        self.v: list[torch.Tensor | None] = [None] * n_layer
        self.length = 0
        self.bytes_copied = 0  #: bytes moved by torch.cat so far (the O(N) per step)

    @classmethod
    def for_model(cls, config, batch: int = 1) -> "ConcatKVCache":
        return cls(config.n_layer, batch, config.n_head, config.n_embd // config.n_head)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.k, *self.v) if t is not None)

    def check_room(self, t: int) -> None:
        """A concatenating cache has no fixed capacity (the model's block size still applies)."""

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= layer < self.n_layer:
            raise ValueError(f"layer must be in [0, {self.n_layer}), got {layer}")
        _check_kv(k, v, self.batch, self.n_head, self.head_dim)
        if self.k[layer] is not None:
            k = torch.cat((self.k[layer], k), dim=2)
            v = torch.cat((self.v[layer], v), dim=2)
            self.bytes_copied += 2 * k.numel() * k.element_size()
        self.k[layer], self.v[layer] = k, v
        return k, v

    def advance(self, t: int) -> None:
        self.length += t

    def reset(self) -> None:
        self.k = [None] * self.n_layer
        self.v = [None] * self.n_layer
        self.length = 0


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

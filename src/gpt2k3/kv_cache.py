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

__all__ = ["KVCache", "causal_mask"]


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
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
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
        expected = (self.batch, self.n_head, k.shape[2], self.head_dim)
        if k.shape != expected or v.shape != expected:
            raise ValueError(f"k and v must have shape (B, H, t, D) = {expected}, "
                             f"got {tuple(k.shape)} and {tuple(v.shape)}")
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

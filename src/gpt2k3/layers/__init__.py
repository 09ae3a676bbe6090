"""Token-mixer layers that drop into the GPT block in place of softmax attention.

A mixer layer is an ``nn.Module`` with ``forward(x, cache=None, layer=0) -> y`` for
``x`` of shape ``(B, T, n_embd)``; :class:`gpt2k3.gpt2.GPT` builds one per block when
given ``mixer=lambda config, i: SomeLayer(config)``.  The model's forward calls
``cache.check_room(T)`` before the blocks and ``cache.advance(T)`` after them, so any
cache object offering those two methods, ``length`` and ``nbytes`` works.

* Softmax attention keeps a growing :class:`gpt2k3.kv_cache.KVCache`.
* Recurrent mixers (linear attention, DeltaNet and its gated forms) keep a fixed-size
  state per layer in a :class:`StateCache`: ``get(layer)`` before the chunkwise
  forward, ``set(layer, state)`` after it.  Its ``nbytes`` does not grow with length.

Chapter modules add their layers beside this one (``gpt2k3.layers.linear``,
``gpt2k3.layers.delta``).
"""

from __future__ import annotations

from typing import Any

import torch

from .._validate import check_positive_int

__all__ = ["StateCache", "nbytes_of"]


def nbytes_of(obj: Any) -> int:
    """Bytes held by a tensor, or by the tensors in a (nested) tuple, list or dict."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, (tuple, list)):
        return sum(nbytes_of(o) for o in obj)
    if isinstance(obj, dict):
        return sum(nbytes_of(o) for o in obj.values())
    return 0


class StateCache:
    """Per-layer recurrent state (any tensor or tuple of tensors), the fixed-size
    counterpart of :class:`gpt2k3.kv_cache.KVCache`."""

    def __init__(self, n_layer: int):
        check_positive_int(n_layer, "n_layer")
        self.n_layer = n_layer
        self.states: list[Any] = [None] * n_layer
        self.length = 0

    def _check(self, layer: int) -> None:
        if not 0 <= layer < self.n_layer:
            raise ValueError(f"layer must be in [0, {self.n_layer}), got {layer}")

    def get(self, layer: int) -> Any:
        """The state after the tokens seen so far (``None`` before the first token)."""
        self._check(layer)
        return self.states[layer]

    def set(self, layer: int, state: Any) -> None:
        self._check(layer)
        self.states[layer] = state

    def check_room(self, t: int) -> None:
        """A fixed-size state never runs out of room."""

    def advance(self, t: int) -> None:
        self.length += t

    @property
    def nbytes(self) -> int:
        """Bytes held by all layers' states: constant once the first token is in."""
        return sum(nbytes_of(s) for s in self.states)

    def reset(self) -> None:
        self.states = [None] * self.n_layer
        self.length = 0

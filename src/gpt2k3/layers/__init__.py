"""Token-mixer layers that drop into the decoder's blocks in place of softmax attention.

A token-mixer layer is an ``nn.Module`` with ``forward(x, cache=None) -> y`` for ``x`` of shape
``(B, T, n_embd)`` and ``new_cache(batch, max_len, dtype=None, device=None)``, the cache it
keeps between calls (the protocol of :mod:`gpt2k3.cache`). :class:`gpt2k3.gpt2.GPT` builds one
per block when given ``mixer=lambda config, i: SomeLayer(config)``.

* Softmax attention (:class:`gpt2k3.gpt2.CausalSelfAttention`) keeps a growing
  :class:`gpt2k3.kv_cache.KVCache`.
* The recurrent mixers -- :class:`~gpt2k3.layers.linear.LinearAttention`,
  :class:`~gpt2k3.layers.delta.DeltaNet`, :class:`~gpt2k3.layers.delta.GatedDeltaNet`,
  :class:`~gpt2k3.layers.delta.KDA` -- keep a fixed-size state in a
  :class:`gpt2k3.cache.StateCache`; its ``nbytes`` does not grow with length.
* :mod:`gpt2k3.layers.hybrid` mixes the two kinds by a layer schedule.
"""

from ..cache import StateCache, nbytes_of

__all__ = ["StateCache", "nbytes_of"]

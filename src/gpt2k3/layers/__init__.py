"""Token-mixer layers that drop into the decoder's blocks in place of softmax attention.

A token-mixer layer is an ``nn.Module`` with ``forward(x, cache=None) -> y`` for ``x`` of shape
``(B, T, n_embd)`` and ``new_cache(batch, max_len, dtype=None, device=None)``, the cache it
keeps between calls (the protocol of :mod:`gpt2k3.cache`). :class:`gpt2k3.model.GPT` builds one
per block when given ``mixer=lambda config, i: SomeLayer(config)``.

* Softmax attention (:class:`gpt2k3.layers.attention.CausalSelfAttention`) keeps a growing
  :class:`gpt2k3.cache.KVCache`.
* The recurrent mixers -- :class:`~gpt2k3.layers.linear_attention.LinearAttention`,
  :class:`~gpt2k3.layers.deltanet.DeltaNet`, :class:`~gpt2k3.layers.deltanet.GatedDeltaNet`,
  :class:`~gpt2k3.layers.deltanet.KDA` -- keep a fixed-size state in a
  :class:`gpt2k3.cache.StateCache`; its ``nbytes`` does not grow with length.
* :mod:`~gpt2k3.layers.mla` (latent attention), :mod:`~gpt2k3.layers.mlp` (MLP, SwiGLU, SiTU),
  :mod:`~gpt2k3.layers.moe` (router, MoE, latent MoE), :mod:`~gpt2k3.layers.norms`,
  :mod:`~gpt2k3.layers.conv` and :mod:`~gpt2k3.layers.residual` (Attention Residuals) are the
  other parts a block is built from.

Layers import ops, never a model.
"""

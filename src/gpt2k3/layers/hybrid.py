r"""The hybrid stack: fixed-state KDA layers with a global softmax-attention layer every few.

Kimi Linear (Kimi Team, 2025) interleaves three Kimi Delta Attention layers with one global
attention layer, and ends on an attention layer: with 27 layers, attention sits at layers
4, 8, ..., 24 and 27 (1-based). The KDA layers carry a fixed-size state; only the attention
layers keep a cache that grows with every token. This module builds such a stack from GPT-2's
parts:

* :func:`hybrid_schedule` -- which layer is which (``"kda"`` or ``"attention"``), from
  :func:`gpt2k3.accounting.hybrid_layers`, the schedule the accounting chapters count with;
* :func:`hybrid_mixer` -- the ``mixer`` factory for :class:`gpt2k3.gpt2.GPT`: GPT-2's causal
  self-attention where the schedule says ``"attention"``, a delta-family layer
  (:class:`gpt2k3.layers.delta.KDA` by default) elsewhere;
* :class:`HybridCache` -- one cache for the whole stack: a preallocated
  :class:`gpt2k3.kv_cache.KVCache` for the attention layers only, and a fixed-size state per
  linear layer;
* :func:`forward_in_pieces` -- feed a sequence through a model in pieces (a prompt, then one
  token at a time) and record the cache's size after each piece.

``gpt2k3.gpt2.generate(model, idx, n, cache_impl=HybridCache.for_model)`` decodes a hybrid
through its cache.

The attention layers here are GPT-2's multi-head attention with learned positions; Kimi Linear
uses multi-head latent attention without positional encoding. The cache *pattern* -- which layers
grow -- is the same; the bytes per token are not, and :mod:`gpt2k3.accounting` computes them for
the published model.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
import torch.nn as nn

from ..accounting import hybrid_layers
from ..gpt2 import GPT, CausalSelfAttention, GPTConfig
from ..kv_cache import KVCache
from . import nbytes_of
from .delta import KDA

__all__ = ["KDA_KIND", "ATTENTION_KIND", "hybrid_schedule", "hybrid_mixer", "hybrid_gpt",
           "schedule_of", "HybridCache", "forward_in_pieces"]

KDA_KIND = "kda"
ATTENTION_KIND = "attention"
_KINDS = (KDA_KIND, ATTENTION_KIND)


def hybrid_schedule(n_layer: int, ratio: int | None = 3) -> tuple[str, ...]:
    """The mixer of every layer: ``ratio`` KDA layers, then one attention layer, repeated.

    The last layer is always attention (Kimi Linear's choice: its 27 layers put attention at
    4, 8, ..., 24 and 27, 1-based). ``ratio=0`` is all attention (GPT-2); ``ratio=None`` is all
    KDA, with no growing cache at all. Returns a tuple of ``"kda"`` / ``"attention"``.
    """
    if isinstance(n_layer, bool) or not isinstance(n_layer, int) or n_layer <= 0:
        raise ValueError(f"n_layer must be a positive int, got {n_layer!r}")
    if ratio is None:
        return (KDA_KIND,) * n_layer
    if isinstance(ratio, bool) or not isinstance(ratio, int) or ratio < 0:
        raise ValueError(f"ratio must be None (all KDA) or a non-negative int, got {ratio!r}")
    linear = set(hybrid_layers(n_layer, ratio))
    return tuple(KDA_KIND if i in linear else ATTENTION_KIND for i in range(n_layer))


def _check_schedule(schedule: Sequence[str]) -> tuple[str, ...]:
    if isinstance(schedule, str) or not hasattr(schedule, "__iter__"):
        raise ValueError(f"schedule must be a sequence of {_KINDS}, got {schedule!r}")
    schedule = tuple(schedule)
    if not schedule or any(kind not in _KINDS for kind in schedule):
        raise ValueError(f"schedule must be a non-empty sequence of {_KINDS}, got {schedule!r}")
    return schedule


def hybrid_mixer(schedule: Sequence[str], linear: Callable[..., nn.Module] = KDA, **linear_kwargs):
    """A ``mixer`` factory for :class:`gpt2k3.gpt2.GPT` following ``schedule``.

    Layer ``i`` gets GPT-2's :class:`~gpt2k3.gpt2.CausalSelfAttention` if ``schedule[i]`` is
    ``"attention"``, else ``linear(config, **linear_kwargs)`` (KDA by default; any delta-family
    layer works). The factory checks that the model has ``len(schedule)`` layers.
    """
    schedule = _check_schedule(schedule)

    def make(config: GPTConfig, i: int) -> nn.Module:
        if config.n_layer != len(schedule):
            raise ValueError(f"the schedule has {len(schedule)} layers but config.n_layer is "
                             f"{config.n_layer}")
        if schedule[i] == ATTENTION_KIND:
            return CausalSelfAttention(config)
        return linear(config, **linear_kwargs)

    return make


def hybrid_gpt(config: GPTConfig, ratio: int | None = 3, linear=KDA, **linear_kwargs) -> GPT:
    """A GPT whose layers follow ``hybrid_schedule(config.n_layer, ratio)``."""
    return GPT(config, mixer=hybrid_mixer(hybrid_schedule(config.n_layer, ratio), linear,
                                          **linear_kwargs))


def schedule_of(model: GPT) -> tuple[str, ...]:
    """Read a model's schedule off its blocks: ``"attention"`` for GPT-2 attention, else ``"kda"``."""
    if not isinstance(model, GPT):
        raise ValueError(f"model must be a GPT, got {type(model).__name__}")
    return tuple(ATTENTION_KIND if isinstance(b.attn, CausalSelfAttention) else KDA_KIND
                 for b in model.transformer.h)


class HybridCache:
    """The decode cache of a hybrid stack: a KV cache for the attention layers, a state for the rest.

    It offers what both kinds of layer ask of a cache -- ``update(layer, k, v)`` for attention
    (forwarded to a :class:`~gpt2k3.kv_cache.KVCache` that holds only the attention layers, so no
    memory is reserved for the others) and ``get(layer)`` / ``set(layer, state)`` for the linear
    layers -- plus the model's ``length`` / ``check_room`` / ``advance``.

    ``nbytes`` counts what is allocated (the KV buffers for ``max_len`` tokens and the states);
    ``used_nbytes`` what a decode step reads: the filled part of the KV cache plus the states.
    """

    def __init__(self, schedule: Sequence[str], batch: int, n_head: int, max_len: int,
                 head_dim: int, dtype: torch.dtype = torch.float32, device=None):
        self.schedule = _check_schedule(schedule)
        self.attention_layers = tuple(i for i, s in enumerate(self.schedule) if s == ATTENTION_KIND)
        self.linear_layers = tuple(i for i, s in enumerate(self.schedule) if s == KDA_KIND)
        self._slot = {layer: slot for slot, layer in enumerate(self.attention_layers)}
        self.kv = (KVCache(len(self.attention_layers), batch, n_head, max_len, head_dim,
                           dtype=dtype, device=device) if self.attention_layers else None)
        self.states: dict[int, object] = dict.fromkeys(self.linear_layers)
        self.length = 0

    @classmethod
    def for_model(cls, model: GPT, batch: int = 1, max_len: int | None = None) -> "HybridCache":
        """A cache for ``model`` (schedule read with :func:`schedule_of`), in its parameters'
        dtype and device; ``max_len`` defaults to the model's block size."""
        config, p = model.config, next(model.parameters())
        return cls(schedule_of(model), batch, config.n_head, max_len or config.block_size,
                   config.head_dim, dtype=p.dtype, device=p.device)

    # ---------------------------------------------------------------- attention layers
    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        """Write an attention layer's keys and values (see :meth:`KVCache.update`)."""
        if layer not in self._slot:
            raise ValueError(f"layer {layer} is not an attention layer; attention layers are "
                             f"{self.attention_layers}")
        return self.kv.update(self._slot[layer], k, v)

    # ---------------------------------------------------------------- linear layers
    def get(self, layer: int):
        """A linear layer's state after the tokens seen so far (``None`` before the first)."""
        self._check_linear(layer)
        return self.states[layer]

    def set(self, layer: int, state) -> None:
        self._check_linear(layer)
        self.states[layer] = state

    def _check_linear(self, layer: int) -> None:
        if layer not in self.states:
            raise ValueError(f"layer {layer} is not a linear (KDA) layer; linear layers are "
                             f"{self.linear_layers}")

    # ---------------------------------------------------------------- the model's protocol
    def check_room(self, t: int) -> None:
        """Only the KV cache can run out of room; the states never do."""
        if self.kv is not None:
            self.kv.check_room(t)

    def advance(self, t: int) -> None:
        if self.kv is not None:
            self.kv.advance(t)
        self.length += t

    def reset(self) -> None:
        if self.kv is not None:
            self.kv.reset()
        self.states = dict.fromkeys(self.linear_layers)
        self.length = 0

    # ---------------------------------------------------------------- sizes
    @property
    def state_nbytes(self) -> int:
        """Bytes of all linear layers' states: fixed once the first token is in."""
        return sum(nbytes_of(s) for s in self.states.values())

    @property
    def kv_nbytes(self) -> int:
        """Bytes of the filled part of the attention layers' KV cache: grows with every token."""
        return self.kv.used_nbytes if self.kv is not None else 0

    @property
    def used_nbytes(self) -> int:
        """What a decode step reads: the filled KV cache plus the states."""
        return self.kv_nbytes + self.state_nbytes

    @property
    def nbytes(self) -> int:
        """What is allocated: the KV buffers (for ``max_len`` tokens) plus the states."""
        return (self.kv.nbytes if self.kv is not None else 0) + self.state_nbytes


@torch.no_grad()
def forward_in_pieces(model: GPT, idx: torch.Tensor, cache, sizes: Sequence[int]):
    """Run ``idx`` ``(B, T)`` through ``model`` in consecutive pieces of ``sizes`` tokens.

    ``sizes`` must add up to ``T`` (e.g. ``[prompt_len] + [1] * n_new``: a prefill, then one
    decode step per token). Returns ``(logits, used)``: the logits ``(B, T, vocab)`` of all
    pieces, and after each piece the cache's ``used_nbytes`` (or ``nbytes`` if it has none).
    """
    if not isinstance(idx, torch.Tensor) or idx.dim() != 2:
        raise ValueError(f"idx must be a (B, T) tensor of token ids, got {getattr(idx, 'shape', idx)!r}")
    sizes = list(sizes)
    if any(isinstance(s, bool) or not isinstance(s, int) or s <= 0 for s in sizes) \
            or sum(sizes) != idx.shape[1]:
        raise ValueError(f"sizes must be positive ints adding up to T = {idx.shape[1]}, got {sizes}")
    logits, used, start = [], [], 0
    for s in sizes:
        logits.append(model(idx[:, start:start + s], cache=cache))
        used.append(getattr(cache, "used_nbytes", cache.nbytes))
        start += s
    return torch.cat(logits, dim=1), used

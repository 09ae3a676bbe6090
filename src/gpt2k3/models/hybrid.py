r"""The hybrid stack: fixed-state KDA layers with a global softmax-attention layer every few.

Kimi Linear (Kimi Team, 2025) interleaves three Kimi Delta Attention layers with one global
attention layer, and ends on an attention layer: with 27 layers, attention sits at layers
4, 8, ..., 24 and 27 (1-based). The KDA layers carry a fixed-size state; only the attention
layers keep a cache that grows with every token. This module builds such a stack from GPT-2's
parts:

* :func:`hybrid_schedule` -- which layer is which (``"kda"`` or ``"attention"``), from
  :func:`gpt2k3.accounting.hybrid_layers`, the schedule the accounting chapters count with;
* :func:`hybrid_mixer` -- the ``mixer`` factory for :class:`gpt2k3.model.GPT`: GPT-2's causal
  self-attention where the schedule says ``"attention"``, a delta-family layer
  (:class:`gpt2k3.layers.deltanet.KDA` by default) elsewhere;
* the cache needs no class of its own: ``model.new_cache(batch, max_len)`` collects each
  layer's -- a preallocated :class:`gpt2k3.cache.KVCache` for an attention layer, a
  fixed-size :class:`gpt2k3.cache.StateCache` for a linear one;
* :func:`forward_in_pieces` -- feed a sequence through a model in pieces (a prompt, then one
  token at a time) and record the cache's size after each piece.

``gpt2k3.model.generate(model, idx, n)`` decodes a hybrid through its layers' caches like any
other model.

The attention layers here are GPT-2's multi-head attention with learned positions; Kimi Linear
uses multi-head latent attention without positional encoding. The cache *pattern* -- which layers
grow -- is the same; the bytes per token are not, and :mod:`gpt2k3.accounting` computes them for
the published model.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
import torch.nn as nn

from gpt2k3.accounting import hybrid_layers
from gpt2k3.cache import ModelCache, sizes_of
from gpt2k3.config import GPTConfig
from gpt2k3.layers.attention import CausalSelfAttention
from gpt2k3.layers.deltanet import KDA
from gpt2k3.model import GPT
from gpt2k3.checks import check_positive_int, is_int

__all__ = ["KDA_KIND", "ATTENTION_KIND", "hybrid_schedule", "hybrid_mixer", "hybrid_gpt",
           "schedule_of", "forward_in_pieces"]

KDA_KIND = "kda"
ATTENTION_KIND = "attention"
_KINDS = (KDA_KIND, ATTENTION_KIND)


def hybrid_schedule(n_layer: int, ratio: int | None = 3) -> tuple[str, ...]:
    """The mixer of every layer: ``ratio`` KDA layers, then one attention layer, repeated.

    The last layer is always attention (Kimi Linear's choice: its 27 layers put attention at
    4, 8, ..., 24 and 27, 1-based). ``ratio=0`` is all attention (GPT-2); ``ratio=None`` is all
    KDA, with no growing cache at all. Returns a tuple of ``"kda"`` / ``"attention"``.
    """
    check_positive_int(n_layer, "n_layer")
    if ratio is None:
        return (KDA_KIND,) * n_layer
    if not is_int(ratio) or ratio < 0:
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
    """A ``mixer`` factory for :class:`gpt2k3.model.GPT` following ``schedule``.

    Layer ``i`` gets GPT-2's :class:`~gpt2k3.layers.attention.CausalSelfAttention` if ``schedule[i]`` is
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


@torch.no_grad()
def forward_in_pieces(model: GPT, idx: torch.Tensor, cache: ModelCache, sizes: Sequence[int]):
    """Run ``idx`` ``(B, T)`` through ``model`` in consecutive pieces of ``sizes`` tokens.

    ``sizes`` must add up to ``T`` (e.g. ``[prompt_len] + [1] * n_new``: a prefill, then one
    decode step per token). Returns ``(logits, used)``: the logits ``(B, T, vocab)`` of all
    pieces, and after each piece the cache's ``used_nbytes`` (what a decode step reads).
    """
    if not isinstance(idx, torch.Tensor) or idx.dim() != 2:
        raise ValueError(f"idx must be a (B, T) tensor of token ids, got {getattr(idx, 'shape', idx)!r}")
    sizes = sizes_of(sizes, idx.shape[1])
    logits, used, start = [], [], 0
    for s in sizes:
        logits.append(model(idx[:, start:start + s], cache=cache))
        used.append(cache.used_nbytes)
        start += s
    return torch.cat(logits, dim=1), used

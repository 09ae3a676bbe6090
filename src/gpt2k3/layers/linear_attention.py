r"""A linear-attention layer that drops into the GPT-2 block in place of softmax attention.

It keeps GPT-2's projections -- one fused ``c_attn`` for q, k, v and an output ``c_proj``, so a
"linear GPT-2" has exactly GPT-2's parameter count -- and changes only how positions are mixed:
``q`` and ``k`` go through the feature map ``elu1`` (Katharopoulos et al., 2020) and the heads run
:mod:`gpt2k3.ops.linear` instead of a softmax over all earlier keys::

    model = GPT(config, mixer=lambda c, i: LinearAttention(c))

Two paths, one function:

* a forward over ``T > 1`` tokens (a prompt, or a chunk of one) runs the chunkwise form,
  starting from the cached state if there is one;
* a forward over one token with a cache (a decode step) runs
  :func:`gpt2k3.ops.linear.decode_step`: read and write the ``(S, z)`` state, nothing else.
  Under ``torch.no_grad()`` the cached state is updated in place (no allocation per token);
  with autograd on, a new state replaces it.

The layer's cache (:meth:`LinearAttention.new_cache`) is a :class:`gpt2k3.cache.StateCache` holding ``(S, z)``, shapes
``(B, H, D, D)`` and ``(B, H, D)`` in float32 (or float64 for a float64 model): its size is
fixed by the model's shape, not by the number of tokens seen. Decoding token by token gives the
same outputs as one forward over the whole sequence, to float rounding (the tests check it).

The layer is the front door: it checks its input (shape, dtype, finite values) once per call,
and the ops it calls then check only shapes, so a decode step never waits on a value scan
inside them; ``elu1`` makes the features non-negative, as the normalised ops require.

No ``1/sqrt(D)`` scale is applied: the normalising denominator would cancel it (up to the
epsilon), and the feature map is applied to the unscaled projections, as in the seed's snippet.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from gpt2k3.accounting import mixer_state_numbers
from gpt2k3.cache import StateCache, check_layer_cache
from gpt2k3.checks import (check_chunk_size, check_layer_input, check_positive_float,
                           check_positive_int, checked)
from gpt2k3.config import GPTConfig
from gpt2k3.ops import linear as _linear

__all__ = ["LinearAttention", "decode_token_by_token", "state_nbytes"]


def check_linear_layer_call(layer, x, cache=None) -> None:
    """The door of :meth:`LinearAttention.forward`: ``x`` ``(B, T, n_embd)`` in the weights'
    dtype, ``cache`` ``None`` or a :class:`StateCache` (shapes and types only: no host sync)."""
    check_layer_input(x, "x", layer.n_embd, next(layer.parameters()).dtype,
                      shape=f"(B, T, n_embd={layer.n_embd})", finite=False)
    check_layer_cache(layer, cache)


class LinearAttention(nn.Module):
    """Causal multi-head linear attention with GPT-2's ``c_attn`` / ``c_proj`` projections.

    Args:
        config: a :class:`gpt2k3.config.GPTConfig` (``n_embd``, ``n_head``, ``bias``, ``dropout``).
        chunk_size: tokens per chunk in the chunkwise prefill.
        eps: the normaliser's epsilon (see :mod:`gpt2k3.ops.linear`).

    ``forward(x, cache=None)`` takes ``x`` of shape ``(B, T, n_embd)``; with the layer's
    :class:`~gpt2k3.cache.StateCache` it continues from ``cache.state`` and stores the new
    state with ``cache.extend(state, T)``.
    """

    cache_types = (StateCache,)  #: the layer caches it accepts

    def __init__(self, config: GPTConfig, chunk_size: int = 64, eps: float = _linear.EPS):
        super().__init__()
        if not isinstance(config, GPTConfig):
            raise ValueError(f"config must be a GPTConfig, got {type(config).__name__}")
        chunk_size = check_chunk_size(chunk_size)
        eps = check_positive_float(eps, "eps")  # what the mixer accepts: a finite float > 0
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head, self.n_embd = config.n_head, config.n_embd
        self.chunk_size, self.eps = chunk_size, eps

    def new_cache(self, batch: int, max_len: int | None = None, *, dtype=None, device=None) -> StateCache:
        """An empty fixed-size state for ``batch`` sequences of at most ``max_len`` tokens
        (``None``: no limit, since the state does not grow); dtype and device are fixed by the
        first tokens it sees."""
        return StateCache(batch, max_len)

    @checked(check_linear_layer_call)
    def forward(self, x: torch.Tensor, cache: StateCache | None = None) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        # (B, T, C) -> (B, H, T, D): heads become a batch dimension, as in GPT-2
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        q, k = _linear.elu1(q), _linear.elu1(k)
        state = cache.state if cache is not None else None
        if cache is not None and T == 1:
            # in place, like a KV cache write -- unless autograd may still need the old state
            y, state = _linear.decode_step(q, k, v, initial_state=state, eps=self.eps,
                                           inplace=not torch.is_grad_enabled())
        else:
            y, state = _linear.chunkwise(q, k, v, initial_state=state, chunk_size=self.chunk_size,
                                         eps=self.eps)
        if cache is not None:
            cache.extend(state, T)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # re-assemble the heads side by side
        return self.resid_dropout(self.c_proj(y))


def state_nbytes(n_layer: int, n_head: int, head_dim: int, batch: int = 1, dtype_bytes: int = 4) -> int:
    """Bytes of the ``(S, z)`` states of a linear-attention model: ``L * B * H * (D^2 + D)`` numbers
    (:func:`gpt2k3.accounting.mixer_state_numbers` with the normaliser).

    It does not depend on the context length -- compare ``2 * L * B * H * N * D`` numbers for a
    KV cache at ``N`` tokens.
    """
    for name, value in (("n_layer", n_layer), ("n_head", n_head), ("head_dim", head_dim),
                        ("batch", batch), ("dtype_bytes", dtype_bytes)):
        check_positive_int(value, name)
    per_layer = sum(mixer_state_numbers(n_head, head_dim, normalizer=True).values())
    return n_layer * batch * per_layer * dtype_bytes


@torch.no_grad()
def decode_token_by_token(model, idx: torch.Tensor, cache) -> tuple[torch.Tensor, list[int]]:
    """Feed ``idx`` ``(B, T)`` to ``model`` one token at a time through ``cache`` (a
    :class:`gpt2k3.cache.ModelCache` from ``model.new_cache``).

    Returns:
        ``(logits, nbytes)``: the logits ``(B, T, vocab)`` of all steps, and after each step the
        bytes a decode step must read from the cache (``used_nbytes``): the filled part of a KV
        cache, which grows with every token, or a fixed-size state.
    """
    if idx.dim() != 2 or idx.shape[1] == 0:
        raise ValueError(f"idx must have shape (B, T) with T >= 1, got {tuple(idx.shape)}")
    logits, nbytes = [], []
    for t in range(idx.shape[1]):
        logits.append(model(idx[:, t:t + 1], cache=cache))
        nbytes.append(cache.used_nbytes)
    return torch.cat(logits, dim=1), nbytes

r"""Gated DeltaNet and Kimi Delta Attention: the delta rule with a forgetting gate.

The delta rule (:mod:`gpt2k3.mixers.delta`) can overwrite one association at a time but has no
way to clear the state quickly. Gated DeltaNet (Yang, Kautz & Hatamizadeh, 2025) first decays the
whole state by a data-dependent factor ``alpha_t in [0, 1]`` and then applies the delta rule to
the decayed state:

.. math::

    S'_t = \operatorname{Diag}(\alpha_t)\, S_{t-1}, \qquad
    u_t = \beta_t\,(v_t - k_t S'_t), \qquad
    S_t = S'_t + k_t^\top u_t, \qquad
    o_t = q_t S_t .

Two gate shapes are supported, told apart by the shape of ``log_alpha``:

* ``(B, H, T)`` -- **Gated DeltaNet**: one scalar per head and token, ``Diag(alpha_t) = alpha_t I``;
* ``(B, H, T, Dk)`` -- **Kimi Delta Attention** (KDA, Kimi Linear, 2025): one factor per key
  channel, i.e. per row of ``S``, so different "slots" of the memory fade at different rates.

Gates are passed in log space, ``log_alpha = log(alpha) <= 0`` (``-inf`` is a full reset), which is
how they are produced (e.g. ``-softplus(.)``) and what makes the chunked form stable: products of
decays become sums of logs. With ``log_alpha = 0`` both forms are exactly DeltaNet, and a KDA gate
that is equal across channels is exactly Gated DeltaNet.

:func:`recurrent` is the definition token by token. :func:`chunkwise` is the WY / UT-transform
algorithm of :mod:`gpt2k3.mixers.delta` with the decays threaded through it (the same shared core,
``gpt2k3.mixers.delta._chunked``). Inside a chunk, token ``j``'s write has decayed by
``exp(g_i - g_j)`` by token ``i``, with ``g`` the chunk-local cumulative log decay:

* **one decay per head** (Gated DeltaNet): the factor is a scalar per pair and leaves the dot
  products, ``(q_i . k_j) exp(g_i - g_j)``; the ``C x C`` factors are formed from differences
  of ``g`` (in float64), masked above the diagonal *before* ``exp``, so only exponents ``<= 0``
  are ever taken;
* **one decay per key channel** (KDA): the factor differs per channel and cannot leave the dot
  product. Forming it for every pair and channel would cost a ``C x C x Dk`` tensor. Instead it
  is split through a reference token ``r`` between ``j`` and ``i``,
  ``exp(g_i - g_j) = exp(g_i - g_r) exp(g_r - g_j)``, which turns a block of pairs into one
  matrix product of ``q * exp(g - g_r)`` with ``k * exp(g_r - g)`` (the GLA / Kimi Linear
  factorisation). A reference between the two keeps both factors ``<= 1``, so nothing can
  overflow; the chunk is halved recursively so that every pair has one (``log2 C`` levels of
  batched matrix products; see ``gpt2k3.mixers.delta._channel_decays``). The factors are built
  as products of per-token decays, never as differences of large cumulative sums, so they keep
  their precision after strong decays.

Each chunk only sees its own decays, so the result stays finite however long the sequence
(tested at ``T = 65,536``) and for decays as strong as ``log_alpha = -20`` per token, where the
decay over one chunk, ``e^{-1280}``, is far below the smallest float.
"""

from __future__ import annotations

from .._validate import check_chunk_size, check_log_alpha, check_qkv
from .delta import _chunked, _prepare, _recurrence

__all__ = ["recurrent", "chunkwise"]


def _prepare_gated(q, k, v, beta, log_alpha, state):
    """Validate (including ``log_alpha``), cast, and bring the gate to shape ``(B, H, T, G)``."""
    B, H, T, Dk, _ = check_qkv(q, k, v)
    check_log_alpha(log_alpha, B, H, T, Dk)
    _, odt, q, k, v, beta, S, log_alpha = _prepare(q, k, v, beta, state, extra=(log_alpha,))
    if log_alpha.ndim == 3:  # Gated DeltaNet: one decay per head -> G = 1, broadcasts over Dk
        log_alpha = log_alpha.unsqueeze(-1)
    return odt, q, k, v, beta, log_alpha, S


def recurrent(q, k, v, beta, log_alpha, state=None):
    """Gated DeltaNet / KDA token by token: the definition (see the module docstring).

    Args:
        q, k: ``(B, H, T, Dk)``, already normalised; no hidden scale. v: ``(B, H, T, Dv)``.
        beta: ``(B, H, T)`` write strengths.
        log_alpha: log decay, ``<= 0``; ``(B, H, T)`` for Gated DeltaNet or ``(B, H, T, Dk)``
            for Kimi Delta Attention.
        state: optional ``(B, H, Dk, Dv)`` state from a previous call.

    Returns:
        ``(o, S)``: outputs ``(B, H, T, Dv)`` and the final state (compute dtype, >= float32).
    """
    odt, q, k, v, beta, log_alpha, S = _prepare_gated(q, k, v, beta, log_alpha, state)
    o, S = _recurrence(q, k, v, beta, log_alpha, S)
    return o.to(odt), S


def chunkwise(q, k, v, beta, log_alpha, chunk_size: int = 64, state=None):
    """Gated DeltaNet / KDA a chunk at a time; equals :func:`recurrent` for any ``T``.

    Args:
        q, k, v, beta, log_alpha, state: as in :func:`recurrent`.
        chunk_size: tokens per chunk, a positive int; ``T`` need not be a multiple of it.

    Returns:
        ``(o, S)`` as in :func:`recurrent`.
    """
    chunk_size = check_chunk_size(chunk_size)
    odt, q, k, v, beta, log_alpha, S = _prepare_gated(q, k, v, beta, log_alpha, state)
    o, S = _chunked(q, k, v, beta, log_alpha, S, chunk_size)
    return o.to(odt), S

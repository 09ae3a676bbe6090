r"""Gated DeltaNet and Kimi Delta Attention: the delta rule with a forgetting gate.

The delta rule (:mod:`gpt2k3.ops.delta`) can overwrite one association at a time but has no
way to clear the state quickly. Gated DeltaNet (Yang, Kautz & Hatamizadeh, 2025) first decays the
whole state by a data-dependent factor ``alpha_t in [0, 1]`` and then applies the delta rule to
the decayed state:

.. math::

    S'_t = \operatorname{Diag}(\alpha_t)\, S_{t-1}, \qquad
    u_t = \beta_t\,(v_t - k_t S'_t), \qquad
    S_t = S'_t + k_t^\top u_t, \qquad
    o_t = q_t S_t .

Two gate shapes are supported, told apart by the shape of the log decay ``g``:

* ``(B, H, T)`` -- **Gated DeltaNet**: one scalar per head and token, ``Diag(alpha_t) = alpha_t I``;
* ``(B, H, T, Dk)`` -- **Kimi Delta Attention** (KDA, Kimi Linear, 2025): one factor per key
  channel, i.e. per row of ``S``, so different "slots" of the memory fade at different rates.

Gates are passed in log space, ``g = log(alpha) <= 0`` (``-inf`` is a full reset; the name
follows flash-linear-attention), which is how they are produced (e.g. ``-softplus(.)``) and what makes the chunked form stable: products of
decays become sums of logs. With ``g = 0`` both forms are exactly DeltaNet, and a KDA gate
that is equal across channels is exactly Gated DeltaNet.

:func:`recurrent` is the definition token by token, a plain loop written here that shares nothing
with the fast form but argument validation. :func:`chunkwise` is the WY / UT-transform algorithm
of :mod:`gpt2k3.ops.delta` with the decays threaded through it (the core in the private module
``gpt2k3.ops._chunked``, shared with DeltaNet). Inside a chunk, token ``j``'s write has decayed by
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
  batched matrix products; see ``gpt2k3.ops._chunked.channel_decays``). The factors are built
  as products of per-token decays, never as differences of large cumulative sums, so they keep
  their precision after strong decays.

Each chunk only sees its own decays, so the result stays finite however long the sequence
(tested at ``T = 8,192``; ``benchmarks/gates.py`` runs ``T = 65,536``) and for decays as strong as
``g = -50`` per token, where the decay over one chunk, ``e^{-3200}``, is far below the smallest
float, or ``g = -inf``.

The write strength is checked as in DeltaNet: ``beta * |k|^2`` must be in ``[0, 2]`` for every
token, or repeated writes amplify the state (``beta = 5`` with unit keys turns it to NaN within
two hundred tokens, gate or no gate).
"""

from __future__ import annotations

from gpt2k3.checks import (
    check_chunk_size,
    check_gated_delta_rule,
    compute_dtype,
    output_dtype,
)
from gpt2k3.ops._chunked import chunked

__all__ = ["recurrent", "chunkwise"]


def recurrent(q, k, v, beta, g, *, initial_state=None):
    """Gated DeltaNet / KDA token by token: the definition (see the module docstring).

    For each ``t``: ``S <- Diag(exp(g_t)) S`` (row ``i`` of ``S`` scaled by ``exp(g_t[i])``, or all
    rows by ``exp(g_t)``), ``u = beta_t (v_t - k_t S)``, ``S <- S + k_t^T u``, ``o_t = q_t S``.

    Args:
        q, k: ``(B, H, T, Dk)``, already normalised; no hidden scale. v: ``(B, H, T, Dv)``.
        beta: ``(B, H, T)`` write strengths with ``beta * |k|^2`` in ``[0, 2]``.
        g: log decay ``log(alpha) <= 0`` (``-inf`` allowed, NaN not); ``(B, H, T)`` for Gated
            DeltaNet or ``(B, H, T, Dk)`` for Kimi Delta Attention.
        initial_state: optional ``(B, H, Dk, Dv)`` state from a previous call.

    Returns:
        ``(o, S)``: outputs ``(B, H, T, Dv)`` in the promoted input dtype and the final state
        (compute dtype, at least float32).
    """
    B, H, T, Dk, Dv = check_gated_delta_rule(q, k, v, beta, g, initial_state)
    cdt, odt = compute_dtype(q, k, v, beta, g, initial_state), output_dtype(q, k, v)
    q, k, v, beta, g = q.to(cdt), k.to(cdt), v.to(cdt), beta.to(cdt), g.to(cdt)
    alpha = g.exp()  # exp(-inf) = 0: a full reset
    if alpha.ndim == 3:  # one decay per head: the same factor for every row of S
        alpha = alpha.unsqueeze(-1)
    S = q.new_zeros(B, H, Dk, Dv) if initial_state is None else initial_state.to(cdt)
    o, S = _loop(q, k, v, beta, alpha, S)
    return o.to(odt), S


def _loop(q, k, v, beta, alpha, S):
    """The token loop of :func:`recurrent` on validated inputs in the compute dtype; ``alpha`` is
    ``(B, H, T, 1)`` or ``(B, H, T, Dk)``. (``benchmarks/gpu.py`` captures it in a CUDA graph,
    which the host-side validation cannot be part of.)"""
    B, H, T, _ = q.shape
    o = q.new_empty(B, H, T, v.shape[-1])
    for t in range(T):
        S = S * alpha[:, :, t].unsqueeze(-1)  # decay: row i of S times alpha_t[i]
        k_t = k[:, :, t]  # (B, H, Dk)
        v_old = (k_t.unsqueeze(-2) @ S).squeeze(-2)  # what the decayed state returns for k_t
        u = beta[:, :, t, None] * (v[:, :, t] - v_old)  # the correction to write
        S = S + k_t.unsqueeze(-1) * u.unsqueeze(-2)  # outer product k_t^T u
        o[:, :, t] = (q[:, :, t].unsqueeze(-2) @ S).squeeze(-2)
    return o, S


def chunkwise(q, k, v, beta, g, *, initial_state=None, chunk_size: int = 64):
    """Gated DeltaNet / KDA a chunk at a time; equals :func:`recurrent` for any ``T``.

    Args:
        q, k, v, beta, g, initial_state: as in :func:`recurrent`.
        chunk_size: tokens per chunk, a positive int; ``T`` need not be a multiple of it.

    Returns:
        ``(o, S)`` as in :func:`recurrent`.
    """
    chunk_size = check_chunk_size(chunk_size)
    B, H, T, Dk, Dv = check_gated_delta_rule(q, k, v, beta, g, initial_state)
    cdt, odt = compute_dtype(q, k, v, beta, g, initial_state), output_dtype(q, k, v)
    S0 = q.new_zeros(B, H, Dk, Dv, dtype=cdt) if initial_state is None else initial_state.to(cdt)
    log_alpha = g.to(cdt)
    if log_alpha.ndim == 3:  # Gated DeltaNet: one decay per head -> (B, H, T, 1), broadcasts over Dk
        log_alpha = log_alpha.unsqueeze(-1)
    o, S = chunked(q.to(cdt), k.to(cdt), v.to(cdt), beta.to(cdt), log_alpha, S0, chunk_size)
    return o.to(odt), S

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

:func:`recurrent` is the definition token by token, a plain loop that shares nothing with the
fast form but the door's checks. :func:`chunkwise` is :func:`gpt2k3.ops.delta.chunkwise` with
the decays threaded through its two steps: the UT/WY step becomes
:func:`~gpt2k3.ops.chunks.intra_chunk_gated`, and the state pass decays the state over each
chunk. :func:`chunked` runs either body for callers that hold a
state and a log decay side by side. Inside a chunk, token ``j``'s write has decayed by
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
  batched matrix products; see ``gpt2k3.ops.chunks.channel_decays``). The factors are built
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

import torch

from gpt2k3.checks import check_gated_chunkwise_call, check_gated_delta_rule_call, checked
from gpt2k3.ops import delta
from gpt2k3.ops.chunks import as_chunks, chunk_spans, intra_chunk_gated, pass_state

__all__ = ["recurrent", "chunkwise", "chunked"]


@checked(check_gated_delta_rule_call)
def recurrent(q, k, v, beta, g, *, initial_state=None):
    """Gated DeltaNet / KDA token by token, the definition: decay ``S`` by ``exp(g_t)``, then the
    delta rule of :func:`gpt2k3.ops.delta.recurrent`. ``g``: the log decay ``<= 0`` (``-inf`` a
    full reset), ``(B, H, T)`` for Gated DeltaNet or ``(B, H, T, Dk)`` for KDA; the rest, and
    the result ``(o, S)``, as in :func:`gpt2k3.ops.delta.recurrent`."""
    out_dtype, dtype = v.dtype, torch.promote_types(v.dtype, torch.float32)  # state: >= float32
    q, k, v, beta, g = (x.to(dtype) for x in (q, k, v, beta, g))
    B, H, T, Dk = k.shape
    S = k.new_zeros(B, H, Dk, v.shape[-1]) if initial_state is None else initial_state.to(dtype)
    alpha = g.exp() if g.ndim == 4 else g.exp().unsqueeze(-1)  # (B, H, T, Dk or 1); exp(-inf) = 0
    o = torch.empty_like(v)
    for t in range(T):
        q_t, k_t, v_t = q[:, :, t], k[:, :, t], v[:, :, t]  # (B, H, D)
        S = S * alpha[:, :, t].unsqueeze(-1)  # decay first: row i of S times alpha_t[i]
        v_old = (k_t.unsqueeze(-2) @ S).squeeze(-2)  # what the state returns for k_t now
        u = beta[:, :, t, None] * (v_t - v_old)  # write only the correction
        S = S + k_t.unsqueeze(-1) * u.unsqueeze(-2)  # outer product k_t^T u
        o[:, :, t] = (q_t.unsqueeze(-2) @ S).squeeze(-2)
    return o.to(out_dtype), S


@checked(check_gated_chunkwise_call)
def chunkwise(q, k, v, beta, g, *, initial_state=None, chunk_size: int = 64):
    """Gated DeltaNet / KDA a chunk of ``chunk_size`` tokens at a time, the fast form of
    :func:`gpt2k3.ops.delta.chunkwise` with the decays threaded through its steps; equals
    :func:`recurrent` for any ``T``. Arguments and result as there."""
    out_dtype, dtype = v.dtype, torch.promote_types(v.dtype, torch.float32)
    q, k, v, beta, g = (x.to(dtype) for x in (q, k, v, beta, g))
    g = g if g.ndim == 4 else g.unsqueeze(-1)  # (B, H, T, Dk) or (B, H, T, 1)
    (B, H, T, Dk), Dv = k.shape, v.shape[-1]
    S = k.new_zeros(B * H, Dk, Dv) if initial_state is None else initial_state.to(dtype).reshape(B * H, Dk, Dv)
    o = torch.empty_like(v)
    for span, size in chunk_spans(T, chunk_size, B * H, Dk, Dv, g.shape[-1]):  # groups that fit in memory
        Q, K, V, b, G = (as_chunks(x[:, :, span], size) for x in (q, k, v, beta, g))  # (B*H, N, C, .)
        W, U, P, Q, K, decay = intra_chunk_gated(Q, K, V, b, G)  # step 1, decays included
        u, S_in, S = pass_state(W, U, K, S, decay)  # step 2, chunk after chunk: the state pass
        o[:, :, span] = (Q @ S_in + P @ u).view_as(o[:, :, span])  # step 3: O = Q S_in + P u
    return o.to(out_dtype), S.view(B, H, Dk, Dv)


def chunked(q, k, v, beta, log_alpha, S, chunk_size: int):
    """The fast (gated) delta rule on inputs already checked: ``(o, S)``, for callers that hold a
    state and a log decay side by side (``benchmarks/gpu.py`` captures it in a CUDA graph). The
    body of :func:`gpt2k3.ops.delta.chunkwise` when ``log_alpha`` is None, else of
    :func:`chunkwise`; checks nothing and reads nothing back to the host."""
    if log_alpha is None:
        return delta.chunkwise.__wrapped__(q, k, v, beta, initial_state=S, chunk_size=chunk_size)
    return chunkwise.__wrapped__(q, k, v, beta, log_alpha, initial_state=S, chunk_size=chunk_size)

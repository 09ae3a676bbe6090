r"""DeltaNet: linear attention whose state is written with the delta rule.

Plain linear attention only ever *adds* ``k_t^T v_t`` to its state, so associations pile up and
interfere. The delta rule (Widrow & Hoff; Schlag et al., 2021, "Linear Transformers Are Secretly
Fast Weight Programmers") first reads what the state currently returns for the key and writes
only the correction, with a per-token strength ``beta_t``:

.. math::

    v^{\text{old}}_t = k_t S_{t-1}, \qquad
    u_t = \beta_t \,(v_t - v^{\text{old}}_t), \qquad
    S_t = S_{t-1} + k_t^\top u_t, \qquad
    o_t = q_t S_t .

Equivalently ``S_t = (I - beta_t k_t^T k_t) S_{t-1} + beta_t k_t^T v_t``: for a unit key and
``beta = 1`` the old value stored under ``k_t`` is replaced exactly.

:func:`recurrent` is this definition, token by token. :func:`chunkwise` computes the same thing
a chunk of ``C`` tokens at a time (Yang et al., 2024, "Parallelizing Linear Transformers with the
Delta Rule over Sequence Length"). Inside a chunk entered with state ``S``, unrolling the rule
gives ``u_i = beta_i (v_i - k_i S - sum_{j<i} (k_i . k_j) u_j)``: a lower-triangular linear
system for all ``u`` at once,

.. math::

    (I + \operatorname{tril}(\operatorname{diag}(\beta) K K^\top, -1))\, U_{\text{new}}
    = \operatorname{diag}(\beta)\,(V - K S).

With ``T_c = (I + tril(diag(beta) K K^T, -1))^{-1} diag(beta)`` (the "UT transform"),
``W = T_c K`` and ``U = T_c V`` do not depend on the state (the WY representation), so
``U_new = U - W S``, and then

.. math::

    O = Q S + \operatorname{tril}(Q K^\top)\, U_{\text{new}}, \qquad
    S \leftarrow S + K^\top U_{\text{new}} .

The triangular system is solved with ``torch.linalg.solve_triangular`` rather than by forming
the inverse.

The same chunked algorithm, with decay factors threaded through it, gives Gated DeltaNet and
Kimi Delta Attention; :mod:`gpt2k3.mixers.gated_delta` calls the shared cores
``_recurrence`` and ``_chunked`` defined here, and this module's public functions are
those cores with no decay.

:func:`seed_one_shot` is the seed article's snippet applied to a whole sequence at once; it is
the delta rule only for ``T = 1``.
"""

from __future__ import annotations

import torch

from .._validate import (
    check_chunk_size,
    check_per_token,
    check_qkv,
    check_state,
    compute_dtype,
    output_dtype,
)

__all__ = ["recurrent", "chunkwise", "seed_one_shot"]

#: In the chunked core, log-decays are clamped to at least this (``exp`` of it is exactly 0 in
#: float32 and float64), so that ``log_alpha = -inf`` (a full reset) never meets ``-inf - -inf``.
_LOG_ALPHA_FLOOR = -1.0e4


# ---------------------------------------------------------------------------------------------
# validation shared with gated_delta
# ---------------------------------------------------------------------------------------------


def _prepare(q, k, v, beta, state, extra=()):
    """Validate ``q, k, v, beta, state``; cast everything to the compute dtype.

    ``extra`` are further (already validated) tensors, e.g. ``log_alpha``, that take part in the
    dtype promotion and are cast too. Returns ``(dims, out_dtype, q, k, v, beta, S0, *extra)``.
    """
    B, H, T, Dk, Dv = check_qkv(q, k, v)
    check_per_token(beta, "beta", B, H, T)
    if state is not None:
        check_state(state, "state", (B, H, Dk, Dv), "(B, H, Dk, Dv)")
    cdt = compute_dtype(q, k, v, beta, state, *extra)
    odt = output_dtype(q, k, v)
    q, k, v, beta = (x.to(cdt) for x in (q, k, v, beta))
    S0 = q.new_zeros(B, H, Dk, Dv) if state is None else state.to(cdt)
    return (B, H, T, Dk, Dv), odt, q, k, v, beta, S0, *(x.to(cdt) for x in extra)


# ---------------------------------------------------------------------------------------------
# shared cores (inputs already validated and cast)
# ---------------------------------------------------------------------------------------------


def _recurrence(q, k, v, beta, log_alpha, S):
    """The (gated) delta rule token by token.

    ``log_alpha`` is None (no decay) or of shape ``(B, H, T, G)`` with ``G = 1`` (one decay per
    head) or ``G = Dk`` (one per key channel). Per token:
    ``S <- Diag(alpha_t) S``; ``u = beta_t (v_t - k_t S)``; ``S <- S + k_t^T u``; ``o_t = q_t S``.
    """
    B, H, T, _ = q.shape
    o = q.new_empty(B, H, T, v.shape[-1])
    for t in range(T):
        if log_alpha is not None:
            S = S * log_alpha[:, :, t].exp().unsqueeze(-1)  # scales row i of S by alpha_t[i]
        k_t = k[:, :, t]  # (B, H, Dk)
        v_old = (k_t.unsqueeze(-2) @ S).squeeze(-2)  # what the state returns for k_t
        u = beta[:, :, t, None] * (v[:, :, t] - v_old)  # the correction to write
        S = S + k_t.unsqueeze(-1) * u.unsqueeze(-2)  # outer product k_t^T u
        o[:, :, t] = (q[:, :, t].unsqueeze(-2) @ S).squeeze(-2)
    return o, S


def _pairwise_decay(g: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    r"""``D[i, j] = exp(g_i - g_j)`` for ``j <= i`` and 0 above the diagonal: shape ``(..., C, C, G)``.

    ``g`` holds chunk-local cumulative log-decays (non-increasing along the chunk), shape
    ``(..., C, G)``; ``D[i, j]`` is the decay a write at token ``j`` has undergone by token ``i``.
    The exponent is ``<= 0`` where it is kept and may be hugely positive where it is not, so those
    positions are set to ``-inf`` *before* exponentiating: no ``exp`` of a positive number is
    ever taken. The differences are formed in ``g``'s (high) precision, then rounded to ``dtype``.
    """
    C = g.shape[-2]
    diff = (g.unsqueeze(-2) - g.unsqueeze(-3)).to(dtype)  # [i, j] = g_i - g_j
    above = torch.ones(C, C, dtype=torch.bool, device=g.device).triu(1)
    return diff.masked_fill(above.unsqueeze(-1), float("-inf")).exp()


def _decayed_scores(x: torch.Tensor, y: torch.Tensor, decay: torch.Tensor | None) -> torch.Tensor:
    r"""Scores ``M[i, j] = sum_d x_i[d] y_j[d] decay[i, j, d]`` (``x_i . y_j`` if ``decay`` is None).

    Callers apply the causal mask (``tril``) they need. With one decay per head (``G = 1``) the
    factor comes out of the dot product; with one per channel it cannot, and the product is taken
    as a batch of small matrix-vector products.
    """
    if decay is None:
        return x @ y.transpose(-1, -2)
    if decay.shape[-1] == 1:
        return (x @ y.transpose(-1, -2)) * decay.squeeze(-1)
    # (..., i, j, d) @ (..., i, d, 1) -> (..., i, j, 1)
    return ((decay * y.unsqueeze(-3)) @ x.unsqueeze(-1)).squeeze(-1)


def _gate_dtype(t: torch.Tensor) -> torch.dtype:
    """dtype for cumulative log-decays: float64 where the device has it.

    A cumulative sum of many strong decays reaches magnitudes in the thousands, where float32 has
    a spacing of ~1e-4; a small decay added after that would lose most of its digits in the
    differences ``g_i - g_j``. The gate tensors are tiny compared with ``q, k, v``, so the extra
    precision is nearly free.
    """
    return torch.float32 if t.device.type == "mps" else torch.float64


def _chunked(q, k, v, beta, log_alpha, S, chunk_size: int):
    r"""The (gated) delta rule a chunk at a time via the WY representation / UT transform.

    ``log_alpha`` is None or ``(B, H, T, G)`` as in ``_recurrence``. Inside a chunk, with
    chunk-local cumulative log-decays ``g_i = sum_{s<=i} log_alpha_s`` (so ``exp(g_i)`` is the
    decay from the chunk's start to token ``i``, and ``g = 0`` without gates), unrolling the
    recurrence gives

    * ``u_i = beta_i (v_i - (k_i * exp(g_i)) S - sum_{j<i} A_ij u_j)`` with
      ``A_ij = sum_d k_i[d] k_j[d] exp(g_i[d] - g_j[d])``: solve
      ``(I + diag(beta) A) [W | U] = diag(beta) [K * exp(g) | V]`` (unit lower triangular),
      then ``u = U - W S``;
    * ``o_i = (q_i * exp(g_i)) S + sum_{j<=i} P_ij u_j`` with ``P_ij`` as ``A_ij`` but with
      ``q_i``;
    * ``S <- Diag(exp(g_C)) S + sum_j (k_j * exp(g_C - g_j))^T u_j``.

    Every exponent is ``<= 0`` (see ``_pairwise_decay``), so nothing overflows however
    strong the decay or long the sequence. The last chunk may be shorter than ``chunk_size``.
    """
    B, H, T, Dk = q.shape
    o = q.new_empty(B, H, T, v.shape[-1])
    for start in range(0, T, chunk_size):
        c = slice(start, min(start + chunk_size, T))
        q_c, k_c, v_c, b_c = q[:, :, c], k[:, :, c], v[:, :, c], beta[:, :, c, None]
        if log_alpha is None:
            decay = None
            q_dec, k_dec, k_tail, chunk_decay = q_c, k_c, k_c, None
        else:
            la = log_alpha[:, :, c].to(_gate_dtype(q)).clamp_min(_LOG_ALPHA_FLOOR)
            g = la.cumsum(-2)  # (B, H, C, G), non-increasing, <= 0
            decay = _pairwise_decay(g, q.dtype)  # (B, H, C, C, G)
            to_start = g.exp().to(q.dtype)  # decay from the chunk's start to token i
            to_end = (g[:, :, -1:] - g).exp().to(q.dtype)  # decay from token j to the chunk's end
            q_dec, k_dec, k_tail = q_c * to_start, k_c * to_start, k_c * to_end
            chunk_decay = to_start[:, :, -1].unsqueeze(-1)  # (B, H, G, 1): decay over the chunk

        # UT transform: (I + diag(beta) A) X = diag(beta) [K_dec | V]. solve_triangular with
        # unitriangular=True takes the unit diagonal as given, so the strictly lower part suffices.
        A = b_c * _decayed_scores(k_c, k_c, decay).tril(-1)
        rhs = b_c * torch.cat([k_dec, v_c], dim=-1)
        WU = torch.linalg.solve_triangular(A, rhs, upper=False, unitriangular=True)
        W, U = WU.split([Dk, v.shape[-1]], dim=-1)

        u = U - W @ S  # the corrections actually written, given the incoming state
        P = _decayed_scores(q_c, k_c, decay).tril()
        o[:, :, c] = q_dec @ S + P @ u
        if chunk_decay is not None:
            S = S * chunk_decay
        S = S + k_tail.transpose(-1, -2) @ u
    return o, S


# ---------------------------------------------------------------------------------------------
# public API
# ---------------------------------------------------------------------------------------------


def recurrent(q, k, v, beta, state=None):
    """DeltaNet token by token: the definition (see the module docstring).

    Args:
        q, k: ``(B, H, T, Dk)``, already normalised (the layer L2-normalises them); no scale.
        v: ``(B, H, T, Dv)``.
        beta: ``(B, H, T)`` write strengths, usually in ``[0, 1]`` (``[0, 2]`` keeps the update
            a contraction for unit keys).
        state: optional ``(B, H, Dk, Dv)`` state from a previous call.

    Returns:
        ``(o, S)``: outputs ``(B, H, T, Dv)`` and the state after the last token (in the compute
        dtype, at least float32).
    """
    _, odt, q, k, v, beta, S = _prepare(q, k, v, beta, state)
    o, S = _recurrence(q, k, v, beta, None, S)
    return o.to(odt), S


def chunkwise(q, k, v, beta, chunk_size: int = 64, state=None):
    """DeltaNet a chunk at a time (WY representation / UT transform); equals :func:`recurrent`.

    Args:
        q, k, v, beta, state: as in :func:`recurrent`.
        chunk_size: tokens per chunk, a positive int; ``T`` need not be a multiple of it.

    Returns:
        ``(o, S)`` as in :func:`recurrent`.
    """
    chunk_size = check_chunk_size(chunk_size)
    _, odt, q, k, v, beta, S = _prepare(q, k, v, beta, state)
    o, S = _chunked(q, k, v, beta, None, S, chunk_size)
    return o.to(odt), S


def seed_one_shot(q, k, v, beta, state=None):
    """The seed article's DeltaNet snippet applied to a whole sequence at once -- wrong for ``T > 1``.

    It reads every old value from the *incoming* state, ``V_old = K S0``, writes all corrections
    together, ``S = S0 + K^T (beta * (V - V_old))``, and reads ``O = Q S``. For one token this is
    exactly the delta rule; for ``T > 1`` each token ignores what the earlier tokens of the same
    call wrote (and each output also sees later tokens' writes), so it differs from
    :func:`recurrent`.

    Returns:
        ``(o, S)``.
    """
    _, odt, q, k, v, beta, S0 = _prepare(q, k, v, beta, state)
    v_old = k @ S0
    U = beta.unsqueeze(-1) * (v - v_old)
    S = S0 + k.transpose(-1, -2) @ U
    return (q @ S).to(odt), S

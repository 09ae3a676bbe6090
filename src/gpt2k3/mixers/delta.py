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

The unit lower-triangular matrix is inverted blockwise (a triangular solve only on small
diagonal blocks, batched matrix products for the rest), and the work that does not depend on the
state -- all of the above except ``U_new`` and the state update -- is batched over many chunks at
once; only ``T / C`` small steps remain sequential.

**Why ``beta`` is in [0, 2].** One step multiplies the state by ``I - beta_t k_t^T k_t``. For a
unit key that matrix has eigenvalue ``1 - beta_t`` along ``k_t`` and 1 elsewhere: ``beta = 1``
replaces the stored value (a projection), ``beta = 2`` reflects it (a Householder reflection),
and outside ``[0, 2]`` the eigenvalue leaves ``[-1, 1]`` and repeated writes amplify what is
stored. Every function here raises ``ValueError`` for such a ``beta``.

For the chapter that derives the chunkwise form, the pieces are exposed one by one and tested
against each other: :func:`householder_product` (the chunk's transition matrix),
:func:`wy_representation` (its WY factors, by their defining recursion), :func:`ut_transform`
(the same factors from one triangular inverse) and :func:`chunkwise_cost` (a FLOP and
sequential-step count against the chunk size).

The same chunked algorithm, with decay factors threaded through it, gives Gated DeltaNet and
Kimi Delta Attention; :mod:`gpt2k3.mixers.gated_delta` calls the shared cores
``_recurrence`` and ``_chunked`` defined here, and this module's public functions are
those cores with no decay.

:func:`seed_one_shot` is the seed article's snippet applied to a whole sequence at once; it is
the delta rule only for ``T = 1``.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .._validate import (
    check_chunk_size,
    check_tensor,
    check_per_token,
    check_qkv,
    check_state,
    compute_dtype,
    output_dtype,
)

__all__ = [
    "recurrent",
    "chunkwise",
    "seed_one_shot",
    "householder_product",
    "wy_representation",
    "ut_transform",
    "ChunkCost",
    "chunkwise_cost",
]

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


#: The write strengths this module accepts (see "Why beta is in [0, 2]" above).
BETA_RANGE = (0.0, 2.0)


def _check_beta_range(beta: torch.Tensor) -> None:
    """Require every ``beta`` in ``[0, 2]`` (NaN is rejected too)."""
    lo, hi = BETA_RANGE
    if not bool(((beta >= lo) & (beta <= hi)).all()):
        b = beta.detach().double()
        shown = b[~((b >= lo) & (b <= hi))].flatten()[0].item()
        raise ValueError(
            f"beta must be in [{lo:g}, {hi:g}] (the update I - beta k^T k stops being "
            f"non-expansive for unit keys outside it); got a value of {shown:g}"
        )


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
    Used for one decay per head (``G = 1``); per-channel decays go through
    :func:`_channel_decayed_scores`, which never forms this ``C x C x Dk`` tensor.
    """
    C = g.shape[-2]
    diff = (g.unsqueeze(-2) - g.unsqueeze(-3)).to(dtype)  # [i, j] = g_i - g_j
    above = torch.ones(C, C, dtype=torch.bool, device=g.device).triu(1)
    return diff.masked_fill(above.unsqueeze(-1), float("-inf")).exp()


def _decayed_scores(x: torch.Tensor, y: torch.Tensor, decay: torch.Tensor | None) -> torch.Tensor:
    r"""Scores ``M[i, j] = (x_i . y_j) decay[i, j]`` for no decay or one decay per head.

    Callers apply the causal mask (``tril``) they need. With one decay per head (``G = 1``) the
    factor comes out of the dot product.
    """
    if decay is None:
        return x @ y.transpose(-1, -2)
    return (x @ y.transpose(-1, -2)) * decay.squeeze(-1)


def _channel_decays(q: torch.Tensor, k: torch.Tensor, log_alpha: torch.Tensor):
    r"""Per-channel decays of a batch of chunks, as matrix products: ``(A, P, to_start, to_end)``.

    ``q, k`` and ``log_alpha`` are ``(..., C, Dk)``, in the compute dtype. With
    ``g_i = sum_{s<=i} log_alpha_s`` the chunk-local cumulative log-decay, returns

    * ``A[i, j] = sum_d k_i[d] k_j[d] exp(g_i[d] - g_j[d])`` for ``j < i``, 0 elsewhere;
    * ``P[i, j] = sum_d q_i[d] k_j[d] exp(g_i[d] - g_j[d])`` for ``j <= i``, 0 elsewhere;
    * ``to_start = exp(g)`` and ``to_end = exp(g_C - g)``, each ``(..., C, Dk)``.

    (``log_alpha = -inf``, a full reset, is fine here: its factor is ``exp(-inf) = 0``.)

    With a decay per channel the factor ``exp(g_i - g_j)`` cannot leave the dot product, and
    forming it for every pair costs a ``C x C x Dk`` tensor. It does factor through any
    reference token ``r`` between ``j`` and ``i``:
    ``exp(g_i - g_j) = exp(g_i - g_r) exp(g_r - g_j)``, and then the block of all queries after
    ``r`` against all keys up to ``r`` is one matrix product of ``q * exp(g - g_r)`` with
    ``k * exp(g_r - g)`` (the GLA / Kimi Linear factorisation). A reference *between* ``j`` and
    ``i`` keeps both exponents ``<= 0``: neither factor can overflow, and a factor that
    underflows only hides a product smaller than itself. One reference for the whole chunk
    cannot do that (one side would need ``exp`` of a positive number, which overflows for strong
    decays), so the chunk is split in halves, recursively: at each level, the right half of
    every block against its left half, referenced at the left half's last token. Every pair
    ``j < i`` meets exactly once, in the block where they part, so ``log2 C`` levels of batched
    matrix products and ``O(C Dk log C)`` exponentials replace ``C^2 Dk`` of each.

    The factors themselves are products of per-token decays ``alpha = exp(log_alpha)`` over a
    stretch of tokens, built level by level from the level below: within a right half, the
    product from its first token to ``i``; within a left half, from after ``j`` to its last
    token. Products of numbers in ``[0, 1]`` never overflow, and no ``g_i - g_j`` of two large
    cumulative sums is ever formed, so each factor is accurate to a few units in the last place
    of its own size, in the compute dtype, however strong the decay before it. After the last
    level they are the decays from the chunk's start and to its end. A chunk whose length is not
    a power of two is padded with empty tokens (zero ``q, k``, no decay).
    """
    C, D = q.shape[-2], q.shape[-1]
    Cp = 1 << (C - 1).bit_length()  # the next power of two
    if Cp != C:
        q, k, log_alpha = (F.pad(x, (0, 0, 0, Cp - C)) for x in (q, k, log_alpha))
    lead, nd = q.shape[:-2], q.ndim - 2
    # autograd needs the factors it saved unchanged: update them out of place when it records
    in_place = not (torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, log_alpha)))
    rows = torch.stack([k, q], dim=-3)  # (..., 2, Cp, D): the rows of A and of P
    M = q.new_zeros(*lead, 2, Cp, Cp)
    pre = log_alpha.exp()  # product of alpha from the start of each block of h tokens to i
    suf = torch.ones_like(pre)  # product of alpha after j to the end of its block of h tokens
    h = 1
    while h < Cp:
        n = Cp // (2 * h)  # blocks of 2h tokens, each a left and a right half of h tokens
        pv, sv = pre.view(*lead, n, 2, h, D), suf.view(*lead, n, 2, h, D)
        from_ref, to_ref = pv[..., 1, :, :], sv[..., 0, :, :]  # exp(g_i - g_ref), exp(g_ref - g_j)
        keys = k.view(*lead, n, 2, h, D)[..., 0, :, :] * to_ref
        queries = rows.view(*lead, 2, n, 2, h, D)[..., 1, :, :] * from_ref.unsqueeze(-4)
        blocks = queries @ keys.unsqueeze(-4).transpose(-1, -2)  # (..., 2, n, h, h)
        # block b of M holds rows b*2h + h + r against columns b*2h + c
        tiles = M.view(*lead, 2, n, 2, h, n, 2, h).diagonal(dim1=nd + 1, dim2=nd + 4)
        tiles[..., 1, :, 0, :, :].copy_(blocks.movedim(-3, -1))
        # one level up: a left half's products gain the right half's whole product, and the
        # right half's products the left half's
        right_all, left_all = pv[..., 1, h - 1 : h, :], pv[..., 0, h - 1 : h, :]
        if in_place:
            sv[..., 0, :, :] *= right_all
            pv[..., 1, :, :] *= left_all
        else:
            suf = torch.stack([sv[..., 0, :, :] * right_all, sv[..., 1, :, :]], dim=-3).view_as(suf)
            pre = torch.stack([pv[..., 0, :, :], pv[..., 1, :, :] * left_all], dim=-3).view_as(pre)
        h *= 2
    M[..., 1, :, :].diagonal(dim1=-2, dim2=-1).copy_((q * k).sum(-1))  # P[i, i] = q_i . k_i
    return M[..., 0, :C, :C], M[..., 1, :C, :C], pre[..., :C, :], suf[..., :C, :]


def _gate_dtype(t: torch.Tensor) -> torch.dtype:
    """dtype for cumulative log-decays: float64 where the device has it.

    A cumulative sum of many strong decays reaches magnitudes in the thousands, where float32 has
    a spacing of ~1e-4; a small decay added after that would lose most of its digits in the
    differences ``g_i - g_j``. The gate tensors are tiny compared with ``q, k, v``, so the extra
    precision is nearly free.
    """
    return torch.float32 if t.device.type == "mps" else torch.float64


def _unit_lower_inverse(A: torch.Tensor, base: int = 16) -> torch.Tensor:
    r"""``(I + L)^{-1}`` where ``L`` is the strictly lower triangle of ``A`` (the rest is ignored).

    Block recursion on ``[[L11, 0], [L21, L22]]``: the inverse is
    ``[[X11, 0], [-X22 L21 X11, X22]]`` with ``X11``, ``X22`` the inverses of the diagonal blocks,
    down to ``base x base`` blocks, which a triangular solve inverts. Almost all the work is
    then batched matrix products, several times faster on a CPU than a triangular solve with
    many right-hand sides, and the result is the UT-transform matrix the chapter shows.
    """
    C = A.shape[-1]
    if C <= base:
        eye = torch.eye(C, dtype=A.dtype, device=A.device).expand(A.shape)
        return torch.linalg.solve_triangular(A, eye, upper=False, unitriangular=True)
    h = C // 2
    X11 = _unit_lower_inverse(A[..., :h, :h], base)
    X22 = _unit_lower_inverse(A[..., h:, h:], base)
    X = A.new_zeros(A.shape)
    X[..., :h, :h] = X11
    X[..., h:, h:] = X22
    X[..., h:, :h] = -(X22 @ (A[..., h:, :h] @ X11))
    return X


def _intra_chunk(q, k, v, beta, log_alpha):
    r"""Everything about a group of chunks that does not depend on the state entering them.

    Inputs are laid out ``(BH, N, C, D)`` (batch x head, chunk, token in chunk, channel), ``beta``
    is ``(BH, N, C)`` and ``log_alpha`` None or ``(BH, N, C, G)``. With chunk-local cumulative
    log-decays ``g_i = sum_{s<=i} log_alpha_s`` (so ``exp(g_i)`` is the decay from the chunk's start
    to token ``i``, and ``g = 0`` without gates), unrolling the recurrence inside a chunk gives

    * ``u_i = beta_i (v_i - (k_i * exp(g_i)) S - sum_{j<i} A_ij u_j)`` with
      ``A_ij = sum_d k_i[d] k_j[d] exp(g_i[d] - g_j[d])``: a unit lower-triangular system,
      ``(I + diag(beta) A) [W | U] = diag(beta) [K * exp(g) | V]``. Its solution is
      ``[W | U] = T_ut [K * exp(g) | V]`` with the UT-transform matrix
      ``T_ut = (I + tril(diag(beta) A, -1))^{-1} diag(beta)``; ``W`` and ``U`` are the WY factors,
      and ``u = U - W S`` for whatever ``S`` enters the chunk;
    * ``o_i = (q_i * exp(g_i)) S + sum_{j<=i} P_ij u_j`` with ``P_ij`` as ``A_ij`` but with ``q_i``;
    * ``S <- Diag(exp(g_C)) S + sum_j (k_j * exp(g_C - g_j))^T u_j``.

    Returns ``(W, U, q_dec, P, k_tail, chunk_decay)``: ``q_dec = Q * exp(g)``,
    ``k_tail = K * exp(g_C - g)`` and ``chunk_decay = exp(g_C)`` of shape ``(BH, N, G, 1)``
    (``q_dec = Q``, ``k_tail = K`` and ``chunk_decay = None`` without gates). Every decay factor
    is at most 1 (see ``_pairwise_decay`` for one decay per head and ``_channel_decays`` for one
    per channel, which never forms the ``C x C x Dk`` pairwise factors), so nothing overflows
    however strong the decay.
    """
    if log_alpha is not None and log_alpha.shape[-1] > 1:  # KDA: a decay per key channel
        A, P, to_start, to_end = _channel_decays(q, k, log_alpha.to(q.dtype))
    else:  # no decay, or one per head: it leaves the dot products
        decay = None
        if log_alpha is not None:
            g = log_alpha.to(_gate_dtype(q)).clamp_min(_LOG_ALPHA_FLOOR).cumsum(-2)  # (..., C, 1)
            decay = _pairwise_decay(g, q.dtype)
            to_start = g.exp().to(q.dtype)  # decay from the chunk's start to token i
            to_end = (g[..., -1:, :] - g).exp().to(q.dtype)  # from token j to the chunk's end
        A = _decayed_scores(k, k, decay)
        P = _decayed_scores(q, k, decay).tril_()
    if log_alpha is None:
        chunk_decay = None
        q_dec, k_dec, k_tail = q, k, k
    else:
        q_dec, k_dec, k_tail = q * to_start, k * to_start, k * to_end
        chunk_decay = to_start[..., -1, :].unsqueeze(-1)  # (..., G, 1): decay over the chunk

    # The UT transform: T_ut = (I + tril(diag(beta) A, -1))^{-1} diag(beta). Only the strictly
    # lower triangle is read, so no mask; diag(beta) on the right scales the columns.
    T_ut = _unit_lower_inverse(beta.unsqueeze(-1) * A)
    T_ut = T_ut * beta.unsqueeze(-2)
    W, U = T_ut @ k_dec, T_ut @ v
    return W, U, q_dec, P, k_tail, chunk_decay


def _pass_state(W, U, k_tail, chunk_decay, S):
    """The only sequential part: carry the state across the ``N`` chunks of a group.

    ``W``, ``U``, ``k_tail`` are ``(BH, N, C, .)``, ``S`` is ``(BH, Dk, Dv)``. Per chunk, two
    batched matrix products (``baddbmm``): ``u = U - W S`` and ``S <- S + K_tail^T u`` (the state
    decayed first under a gate). Returns the corrections ``u`` written in every chunk
    ``(BH, N, C, Dv)``, the states entering every chunk ``(BH, N, Dk, Dv)``, and the state after
    the group.
    """
    corrections, starts = [], []
    k_tail_T = k_tail.transpose(-1, -2)
    for n in range(W.shape[1]):
        starts.append(S)
        u = torch.baddbmm(U[:, n], W[:, n], S, alpha=-1)
        corrections.append(u)
        if chunk_decay is not None:
            S = S * chunk_decay[:, n]
        S = torch.baddbmm(S, k_tail_T[:, n], u)
    return torch.stack(corrections, 1), torch.stack(starts, 1), S


#: Upper bound on the tensor elements the chunked core works on at once (about 128 MiB of float32
#: per tensor). Chunks are processed in groups: a group's state-independent work is a few batched
#: matrix products, its state is then carried across its chunks (the sequential part), and its
#: outputs are one batched product again. The group size keeps memory bounded for any ``T``.
_BLOCK_ELEMENTS = 2**25


def _group_chunks(x: torch.Tensor, start: int, stop: int, size: int) -> torch.Tensor:
    """Tokens ``start:stop`` of a ``(B, H, T, ...)`` tensor as ``(B*H, N, size, ...)`` chunks."""
    B, H = x.shape[:2]
    return x[:, :, start:stop].reshape(B * H, (stop - start) // size, size, *x.shape[3:])


def _chunked(q, k, v, beta, log_alpha, S, chunk_size: int):
    r"""The (gated) delta rule a chunk at a time via the WY representation / UT transform.

    ``log_alpha`` is None or ``(B, H, T, G)`` as in ``_recurrence``; see ``_intra_chunk`` for the
    algebra. The work is split the way fast kernels split it: everything that does not depend on
    the incoming state (the ``C x C`` score matrices, the UT transform, the WY factors) is one
    batch of matrix products over a whole group of chunks; then ``_pass_state`` carries the state
    across the group's chunks (``T / C`` sequential steps instead of ``T``); then every output of
    the group comes from ``O = Q_dec S_start + P u`` in one batch. ``T`` need not be a multiple
    of ``chunk_size``: the last chunk is shorter.
    """
    B, H, T, Dk = q.shape
    Dv = v.shape[-1]
    BH, C = B * H, chunk_size
    o = q.new_empty(B, H, T, Dv)
    S = S.reshape(BH, Dk, Dv)
    G = 1 if log_alpha is None else log_alpha.shape[-1]
    if G == 1:  # the C x C matrices of a chunk (scores, UT transform, pairwise decay), its vectors
        per_chunk = BH * (C * C * (G + 2) + Dk * Dv + 4 * C * (Dk + Dv))
    else:  # per-channel decays: no C x C x Dk tensor, but a dozen (C, D)-sized factors
        per_chunk = BH * (6 * C * C + Dk * Dv + 12 * C * (Dk + Dv))
    group = max(1, _BLOCK_ELEMENTS // per_chunk) * C  # tokens per group, a multiple of C

    full = T - T % C
    spans = [(s, min(s + group, full), C) for s in range(0, full, group)]
    if full < T:
        spans.append((full, T, T - full))  # the last, shorter chunk
    for start, stop, size in spans:
        q_c, k_c, v_c, b_c = (_group_chunks(x, start, stop, size) for x in (q, k, v, beta))
        la_c = None if log_alpha is None else _group_chunks(log_alpha, start, stop, size)
        W, U, q_dec, P, k_tail, chunk_decay = _intra_chunk(q_c, k_c, v_c, b_c, la_c)
        u, S_start, S = _pass_state(W, U, k_tail, chunk_decay, S)
        # O = Q_dec S_start + P u, as one batch of (size x Dk) @ (Dk x Dv) products plus P u
        o_c = torch.baddbmm((P @ u).flatten(0, 1), q_dec.flatten(0, 1), S_start.flatten(0, 1))
        o[:, :, start:stop] = o_c.reshape(B, H, stop - start, Dv)
    return o, S.reshape(B, H, Dk, Dv)


# ---------------------------------------------------------------------------------------------
# public API
# ---------------------------------------------------------------------------------------------


def recurrent(q, k, v, beta, state=None):
    """DeltaNet token by token: the definition (see the module docstring).

    Args:
        q, k: ``(B, H, T, Dk)``, already normalised (the layer L2-normalises them); no scale.
        v: ``(B, H, T, Dv)``.
        beta: ``(B, H, T)`` write strengths in ``[0, 2]`` (usually ``[0, 1]``, a sigmoid);
            ``ValueError`` otherwise.
        state: optional ``(B, H, Dk, Dv)`` state from a previous call.

    Returns:
        ``(o, S)``: outputs ``(B, H, T, Dv)`` and the state after the last token (in the compute
        dtype, at least float32).
    """
    _, odt, q, k, v, beta, S = _prepare(q, k, v, beta, state)
    _check_beta_range(beta)
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
    _check_beta_range(beta)
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
    _check_beta_range(beta)
    v_old = k @ S0
    U = beta.unsqueeze(-1) * (v - v_old)
    S = S0 + k.transpose(-1, -2) @ U
    return (q @ S).to(odt), S


# ---------------------------------------------------------------------------------------------
# the chunkwise derivation, piece by piece (chapter 5)
# ---------------------------------------------------------------------------------------------


def _prepare_chunk(k, beta, v=None):
    """Validate one chunk (or a batch of chunks): ``k (..., C, Dk)``, ``beta (..., C)``,
    ``v (..., C, Dv)``; cast to the compute dtype (at least float32)."""
    check_tensor(k, "k")
    if k.ndim < 2:
        raise ValueError(f"k must have shape (..., C, Dk), at least 2 dimensions; got {tuple(k.shape)}")
    check_tensor(beta, "beta")
    if beta.shape != k.shape[:-1]:
        raise ValueError(
            f"beta must have shape (..., C) = {tuple(k.shape[:-1])} to match k; got {tuple(beta.shape)}"
        )
    if v is not None:
        check_tensor(v, "v")
        if v.ndim != k.ndim or v.shape[:-1] != k.shape[:-1]:
            raise ValueError(
                f"v must have shape (..., C, Dv) with (..., C) = {tuple(k.shape[:-1])} to match k; "
                f"got {tuple(v.shape)}"
            )
    dtype = compute_dtype(k, beta, v)
    _check_beta_range(beta)
    return k.to(dtype), beta.to(dtype), None if v is None else v.to(dtype)


def householder_product(k, beta):
    r"""The transition matrix of a chunk: ``P = H_C \cdots H_2 H_1`` with ``H_t = I - beta_t k_t^T k_t``.

    Writing a chunk of ``C`` tokens into a state ``S`` gives ``P S + (what the chunk writes into an
    empty state)``; ``P`` is that product of generalised Householder matrices (true Householder
    reflections for unit keys and ``beta = 2``). Computed by applying the factors one by one --
    the definition the WY representation is checked against.

    Args:
        k: ``(..., C, Dk)`` keys of one chunk (any leading batch dimensions).
        beta: ``(..., C)`` write strengths in ``[0, 2]``.

    Returns:
        ``(..., Dk, Dk)``.
    """
    k, beta, _ = _prepare_chunk(k, beta)
    Dk = k.shape[-1]
    P = torch.eye(Dk, dtype=k.dtype, device=k.device).expand(*k.shape[:-2], Dk, Dk)
    for t in range(k.shape[-2]):
        k_t = k[..., t, :]
        # H_t P = P - beta_t k_t^T (k_t P)
        P = P - beta[..., t, None, None] * k_t.unsqueeze(-1) * (k_t.unsqueeze(-2) @ P)
    return P


def wy_representation(k, v, beta):
    r"""The WY factors of a chunk by their defining recursion: ``(W, U)``, each ``(..., C, D)``.

    .. math::

        w_t = \beta_t \Big(k_t - \sum_{j<t} (k_t \cdot k_j)\, w_j\Big), \qquad
        u_t = \beta_t \Big(v_t - \sum_{j<t} (k_t \cdot k_j)\, u_j\Big),

    so that the chunk's transition is ``householder_product(k, beta) = I - K^T W`` and a chunk
    entered with state ``S`` leaves it as ``S + K^T (U - W S)``. Token by token, for checking;
    :func:`ut_transform` gives the same factors from one matrix product.
    """
    k, beta, v = _prepare_chunk(k, beta, v)
    W, U = torch.zeros_like(k), torch.zeros_like(v)
    for t in range(k.shape[-2]):
        dots = k[..., :t, :] @ k[..., t, :, None]  # (..., t, 1): k_t . k_j for j < t
        W[..., t, :] = beta[..., t, None] * (k[..., t, :] - (dots * W[..., :t, :]).sum(-2))
        U[..., t, :] = beta[..., t, None] * (v[..., t, :] - (dots * U[..., :t, :]).sum(-2))
    return W, U


def ut_transform(k, beta):
    r"""The UT-transform matrix of a chunk: ``T = (I + tril(diag(beta) K K^T, -1))^{-1} diag(beta)``.

    The WY recursions of :func:`wy_representation` are the lower-triangular system
    ``(I + tril(diag(beta) K K^T, -1)) W = diag(beta) K`` (and the same with ``V``), so
    ``W = T K`` and ``U = T V``: one ``C x C`` matrix, independent of the values and of the state,
    turns the chunk's keys and values into its WY factors with two matrix products. Computed the
    way :func:`chunkwise` computes it (a blockwise unit-triangular inverse).

    Args:
        k: ``(..., C, Dk)``; beta: ``(..., C)`` in ``[0, 2]``.

    Returns:
        ``(..., C, C)``, lower triangular.
    """
    k, beta, _ = _prepare_chunk(k, beta)
    return _unit_lower_inverse(beta.unsqueeze(-1) * (k @ k.transpose(-1, -2))) * beta.unsqueeze(-2)


# ---------------------------------------------------------------------------------------------
# a cost model (chapter 5)
# ---------------------------------------------------------------------------------------------


def _inverse_macs(C: int, base: int = 16) -> int:
    """Multiply-adds of ``_unit_lower_inverse`` on a ``C x C`` matrix (the same recursion)."""
    if C <= base:
        return C * C * C // 2  # a triangular solve with C right-hand sides: C^2 / 2 each
    h = C // 2
    return _inverse_macs(h, base) + _inverse_macs(C - h, base) + (C - h) * h * h + (C - h) * (C - h) * h


def _chunk_macs(c: int, d_k: int, d_v: int) -> tuple[int, int]:
    """(parallel, sequential) multiply-adds of one chunk of ``c`` tokens in :func:`chunkwise`."""
    parallel = (
        2 * c * c * d_k  # the scores K K^T and Q K^T (full products, then masked)
        + _inverse_macs(c)  # the UT transform
        + c * c * (d_k + d_v)  # W = T K, U = T V
        + c * d_k * d_v  # Q S_start
        + c * c * d_v  # P u
    )
    sequential = 2 * c * d_k * d_v  # u = U - W S and S += K^T u, chunk after chunk
    return parallel, sequential


@dataclass(frozen=True)
class ChunkCost:
    """FLOPs (2 per multiply-add, matrix products only) and sequential steps of DeltaNet over
    ``T`` tokens of one head, chunkwise with ``chunk_size`` against token by token."""

    T: int
    chunk_size: int
    d_k: int
    d_v: int
    parallel_flops: int  #: chunkwise work independent of the incoming state, batched over chunks
    sequential_flops: int  #: chunkwise work inside the loop over chunks
    sequential_steps: int  #: chunks, one after another
    recurrent_flops: int  #: token by token: k S, k^T u and q S per token
    recurrent_steps: int  #: tokens, one after another

    @property
    def flops(self) -> int:
        """All chunkwise FLOPs."""
        return self.parallel_flops + self.sequential_flops

    @property
    def flops_ratio(self) -> float:
        """Chunkwise FLOPs over token-by-token FLOPs (the price paid for parallelism)."""
        return self.flops / self.recurrent_flops


def chunkwise_cost(T: int, chunk_size: int, d_k: int = 64, d_v: int | None = None) -> ChunkCost:
    r"""Count the work of :func:`chunkwise` against :func:`recurrent` for one head.

    Per chunk of ``C`` tokens the chunkwise form does ``2 C^2 d_k`` (scores) + ``~C^3/3`` (UT
    transform) + ``C^2 (d_k + d_v)`` (WY factors) + ``C d_k d_v + C^2 d_v`` (outputs) multiply-adds
    that do not depend on the state, and ``2 C d_k d_v`` inside the sequential loop; the recurrent
    form does ``3 d_k d_v`` per token, all of it sequential. So per token the chunkwise form pays
    about ``C (3 d_k + 2 d_v) + C^2 / 3`` extra multiply-adds to turn ``T`` sequential steps into
    ``T / C``. A model, not a measurement: it counts the matrix products our implementation
    performs (full ``C x C`` products even where a mask zeroes half) and ignores elementwise work
    and memory traffic.
    """
    T = _check_positive_int(T, "T")
    chunk_size = check_chunk_size(chunk_size)
    d_k = _check_positive_int(d_k, "d_k")
    d_v = d_k if d_v is None else _check_positive_int(d_v, "d_v")
    n_full, rest = divmod(T, chunk_size)
    par, seq = (n_full * x for x in _chunk_macs(chunk_size, d_k, d_v))
    if rest:
        p_rest, s_rest = _chunk_macs(rest, d_k, d_v)
        par, seq = par + p_rest, seq + s_rest
    return ChunkCost(
        T=T, chunk_size=chunk_size, d_k=d_k, d_v=d_v,
        parallel_flops=2 * par, sequential_flops=2 * seq,
        sequential_steps=math.ceil(T / chunk_size),
        recurrent_flops=2 * 3 * T * d_k * d_v, recurrent_steps=T,
    )


def _check_positive_int(x, name: str) -> int:
    if isinstance(x, bool) or not hasattr(x, "__index__") or operator.index(x) < 1:
        raise ValueError(f"{name} must be a positive int, got {x!r}")
    return operator.index(x)

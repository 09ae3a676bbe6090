r"""The fast chunked core shared by DeltaNet and Gated DeltaNet / KDA.

Its entry, :func:`chunked`, is public as :func:`gpt2k3.ops.gated_delta.chunked`; the rest of
this module are its pieces.

DeltaNet is the gated delta rule with no decay (``log_alpha = 0``), so one chunked algorithm
serves :func:`gpt2k3.ops.delta.chunkwise` (called with ``log_alpha=None``) and
:func:`gpt2k3.ops.gated_delta.chunkwise`. The algebra is in :mod:`gpt2k3.ops.delta`
(the WY representation and the UT transform) and :mod:`gpt2k3.ops.gated_delta` (how the
decays are threaded through it); the reference forms, ``recurrent`` in those modules, are
separate token loops that share nothing with this file, so the tests that hold the two forms
equal check this code against an independent definition.

Everything here takes inputs that the front doors (``chunkwise`` in those modules, or a layer
that builds valid inputs itself) have already validated and cast to the compute dtype. The per-token log decay is called ``log_alpha`` throughout this module
(the public functions call it ``g``); inside a chunk ``g`` is its chunk-local cumulative sum.
"""

from __future__ import annotations

import operator

import torch
import torch.nn.functional as F

__all__ = ["chunked", "channel_decays", "unit_lower_inverse", "BLOCK_ELEMENTS"]

#: In the chunked core, log-decays are clamped to at least this (``exp`` of it is exactly 0 in
#: float32 and float64), so that ``log_alpha = -inf`` (a full reset) never meets ``-inf - -inf``.
_LOG_ALPHA_FLOOR = -1.0e4


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


def channel_decays(q: torch.Tensor, k: torch.Tensor, log_alpha: torch.Tensor):
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


def unit_lower_inverse(A: torch.Tensor, base: int = 16) -> torch.Tensor:
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
    X11 = unit_lower_inverse(A[..., :h, :h], base)
    X22 = unit_lower_inverse(A[..., h:, h:], base)
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
    is at most 1 (see ``_pairwise_decay`` for one decay per head and ``channel_decays`` for one
    per channel, which never forms the ``C x C x Dk`` pairwise factors), so nothing overflows
    however strong the decay.
    """
    if log_alpha is not None and log_alpha.shape[-1] > 1:  # KDA: a decay per key channel
        A, P, to_start, to_end = channel_decays(q, k, log_alpha.to(q.dtype))
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
    T_ut = unit_lower_inverse(beta.unsqueeze(-1) * A)
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
BLOCK_ELEMENTS = 2**25


def _group_chunks(x: torch.Tensor, start: int, stop: int, size: int) -> torch.Tensor:
    """Tokens ``start:stop`` of a ``(B, H, T, ...)`` tensor as ``(B*H, N, size, ...)`` chunks."""
    B, H = x.shape[:2]
    return x[:, :, start:stop].reshape(B * H, (stop - start) // size, size, *x.shape[3:])


def chunked(q, k, v, beta, log_alpha, S, chunk_size: int):
    r"""The fast (gated) delta rule, a chunk at a time via the WY representation / UT transform.

    Public as :func:`gpt2k3.ops.gated_delta.chunked`: the core of :func:`gpt2k3.ops.delta.chunkwise`
    and :func:`gpt2k3.ops.gated_delta.chunkwise`, on inputs they have validated and cast to one
    compute dtype (float32 or wider). It checks nothing and reads nothing back to the host, so
    the layers call it in a decode step and ``benchmarks/gpu.py`` captures it in a CUDA graph.

    Args:
        q, k: ``(B, H, T, Dk)``; v: ``(B, H, T, Dv)``; beta: ``(B, H, T)``.
        log_alpha: the log decay ``g <= 0``: None (DeltaNet), ``(B, H, T)`` or ``(B, H, T, 1)``
            (one per head, Gated DeltaNet) or ``(B, H, T, Dk)`` (one per key channel, KDA).
        S: the ``(B, H, Dk, Dv)`` state entering the first chunk.
        chunk_size: tokens per chunk; ``T`` need not be a multiple of it (the last chunk is
            shorter), and ``B = 0``, ``H = 0`` or ``T = 0`` give empty outputs.

    Returns:
        ``(o, S)``: ``o`` ``(B, H, T, Dv)`` and the final state, in the inputs' dtype.

    The work is split the way fast kernels split it (see ``_intra_chunk`` for the algebra):
    everything that does not depend on the incoming state (the ``C x C`` score matrices, the UT
    transform, the WY factors) is one batch of matrix products over a whole group of chunks;
    then ``_pass_state`` carries the state across the group's chunks (``T / C`` sequential steps
    instead of ``T``); then every output of the group comes from ``O = Q_dec S_start + P u`` in
    one batch.
    """
    B, H, T, Dk = q.shape
    Dv = v.shape[-1]
    BH, C = B * H, operator.index(chunk_size)
    o = q.new_empty(B, H, T, Dv)
    S = S.reshape(BH, Dk, Dv)
    if log_alpha is not None and log_alpha.ndim == 3:  # one decay per head: broadcast over Dk
        log_alpha = log_alpha.unsqueeze(-1)
    G = 1 if log_alpha is None else log_alpha.shape[-1]
    if G == 1:  # the C x C matrices of a chunk (scores, UT transform, pairwise decay), its vectors
        per_chunk = BH * (C * C * (G + 2) + Dk * Dv + 4 * C * (Dk + Dv))
    else:  # per-channel decays: no C x C x Dk tensor, but a dozen (C, D)-sized factors
        per_chunk = BH * (6 * C * C + Dk * Dv + 12 * C * (Dk + Dv))
    group = max(1, BLOCK_ELEMENTS // max(per_chunk, 1)) * C  # tokens per group, a multiple of C

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

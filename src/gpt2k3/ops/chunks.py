r"""The steps of the fast chunked delta rule, shared by DeltaNet, Gated DeltaNet and KDA.

A chunked form (:func:`gpt2k3.ops.delta.chunkwise`, :func:`gpt2k3.ops.gated_delta.chunkwise`)
is a short loop over groups of chunks (:func:`chunk_spans`, which budgets memory) that calls
two steps, each listed in the book:

1. :func:`intra_chunk` (:func:`intra_chunk_gated` with a forget gate) -- the UT/WY step: for
   every chunk of the group at once, the scores, the UT transform by a blockwise inverse
   (:func:`unit_lower_inverse`) and the WY factors, none of which depend on the state;
2. :func:`pass_state` -- the only sequential part: carry the state across the group's chunks,
   one pair of small matrix products per chunk;

then the outputs of every chunk in one batch, ``O = Q S_in + P u``. The reference forms,
``recurrent`` in those modules, are separate token loops that share nothing with this file,
so the tests that hold the forms equal check this code against an independent definition.

Everything here takes inputs its caller has checked and cast. The per-token log decay is ``g``
(the public functions' name); inside a chunk ``G`` is its chunk-local cumulative sum.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["intra_chunk", "intra_chunk_gated", "chunk_decays", "channel_decays", "pass_state",
           "unit_lower_inverse", "chunk_spans", "as_chunks", "BLOCK_ELEMENTS"]

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
    :func:`channel_decays`, which never forms this ``C x C x Dk`` tensor.
    """
    C = g.shape[-2]
    diff = (g.unsqueeze(-2) - g.unsqueeze(-3)).to(dtype)  # [i, j] = g_i - g_j
    above = torch.ones(C, C, dtype=torch.bool, device=g.device).triu(1)
    return diff.masked_fill(above.unsqueeze(-1), float("-inf")).exp()


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


def unit_lower_inverse(L: torch.Tensor, base: int = 16) -> torch.Tensor:
    r"""``(I + L)^{-1}`` for a strictly lower-triangular ``L`` (``(..., C, C)``; the caller masks it).

    Block recursion on ``[[L11, 0], [L21, L22]]``: the inverse is
    ``[[X11, 0], [-X22 L21 X11, X22]]`` with ``X11``, ``X22`` the inverses of the diagonal blocks,
    down to ``base x base`` blocks, which a triangular solve inverts. Almost all the work is
    then batched matrix products, several times faster on a CPU than a triangular solve with
    many right-hand sides, and the result is the UT-transform matrix the chapter shows.
    """
    C = L.shape[-1]
    if C <= base:
        eye = torch.eye(C, dtype=L.dtype, device=L.device).expand(L.shape)
        return torch.linalg.solve_triangular(L + eye, eye, upper=False, unitriangular=True)
    h = C // 2
    X11 = unit_lower_inverse(L[..., :h, :h], base)
    X22 = unit_lower_inverse(L[..., h:, h:], base)
    X = L.new_zeros(L.shape)
    X[..., :h, :h] = X11
    X[..., h:, h:] = X22
    X[..., h:, :h] = -(X22 @ (L[..., h:, :h] @ X11))
    return X


def intra_chunk(Q, K, V, beta):
    r"""Step 1, the UT/WY step: all that a chunk computes before it knows its incoming state.

    ``Q, K, V`` are ``(..., C, D)`` chunks (any batch of them at once), ``beta`` ``(..., C)``.
    Unrolling the delta rule inside a chunk gives the unit lower-triangular system
    ``(I + tril(diag(beta) K K^T, -1)) U_new = diag(beta) (V - K S)``; its inverse times
    ``diag(beta)`` is the UT transform ``T``, and ``W = T K``, ``U = T V`` are the WY factors,
    so that ``U_new = U - W S`` for whatever ``S`` enters the chunk. Returns ``(W, U, P)``,
    ``P = tril(Q K^T)`` the causal scores inside the chunk.
    """
    A, P = K @ K.transpose(-1, -2), (Q @ K.transpose(-1, -2)).tril()  # the scores; P causal
    L = (beta.unsqueeze(-1) * A).tril(-1)  # below the unit diagonal
    T = unit_lower_inverse(L) * beta.unsqueeze(-2)  # (I + L)^-1 diag(beta)
    W, U = T @ K, T @ V  # the WY factors
    return W, U, P


def intra_chunk_gated(Q, K, V, beta, g):
    r"""Step 1 with a forget gate: :func:`intra_chunk` with every pair's decay in the scores.

    ``g`` is the per-token log decay, ``(..., C, 1)`` (one per head) or ``(..., C, Dk)`` (one
    per key channel). Token ``j``'s write has decayed by ``exp(g_i - g_j)`` by token ``i`` (``g``
    summed over the chunk here), which :func:`chunk_decays` folds into the scores. The state
    entering the chunk reaches token ``i`` decayed by ``exp(g_i)`` (``Q`` and ``K`` pick that up),
    and a write reaches the chunk's end decayed by ``exp(g_C - g_j)``. Returns
    ``(W, U, P, Q_in, K_out, decay)``: the WY factors, the scores, the decayed queries and keys,
    and the decay over the whole chunk, ``(..., G, 1)``.
    """
    A, P, to_start, to_end = chunk_decays(Q, K, g)  # the scores, with the decays inside them
    L = (beta.unsqueeze(-1) * A).tril(-1)  # below the unit diagonal
    T = unit_lower_inverse(L) * beta.unsqueeze(-2)  # (I + L)^-1 diag(beta)
    W, U = T @ (K * to_start), T @ V  # the WY factors; S reaches token i decayed by to_start
    return W, U, P, Q * to_start, K * to_end, to_start[..., -1, :].unsqueeze(-1)


def chunk_decays(Q, K, g):
    r"""Decayed scores of a batch of chunks: ``(A, P, to_start, to_end)``.

    ``A[i, j] = sum_d K_i[d] K_j[d] exp(G_i[d] - G_j[d])`` (``j < i``), ``P`` the same with
    ``Q_i`` (``j <= i``), ``to_start = exp(G)`` and ``to_end = exp(G_C - G)``, with ``G`` the
    chunk-local cumulative sum of ``g``. One decay per head leaves the dot products (pairwise
    factors, formed in float64 and masked before ``exp``); one per key channel goes through
    :func:`channel_decays`, which never forms the ``C x C x Dk`` factors.
    """
    if g.shape[-1] > 1:  # KDA: a decay per key channel
        return channel_decays(Q, K, g.to(Q.dtype))
    G = g.to(_gate_dtype(Q)).clamp_min(_LOG_ALPHA_FLOOR).cumsum(-2)  # (..., C, 1)
    decay = _pairwise_decay(G, Q.dtype).squeeze(-1)  # exp(G_i - G_j), 0 above the diagonal
    A = (K @ K.transpose(-1, -2)) * decay
    P = (Q @ K.transpose(-1, -2)) * decay
    return A, P, G.exp().to(Q.dtype), (G[..., -1:, :] - G).exp().to(Q.dtype)


def pass_state(W, U, K_out, S, decay=None):
    """Step 2, the state pass: the only sequential part, one small step per chunk.

    ``W``, ``U``, ``K_out`` are ``(BH, N, C, .)`` for ``N`` chunks, ``S`` the ``(BH, Dk, Dv)``
    state entering the first. Per chunk: the corrections ``u = U - W S``, then
    ``S <- S + K_out^T u`` (with a gate, the state decays over the chunk first). Returns the
    corrections of every chunk ``(BH, N, C, Dv)``, the state entering every chunk
    ``(BH, N, Dk, Dv)`` and the state after the last.
    """
    corrections, states = [], []
    for n in range(W.shape[1]):
        states.append(S)
        u = U[:, n] - W[:, n] @ S  # what this chunk writes, now that S is known
        corrections.append(u)
        if decay is not None:
            S = S * decay[:, n]  # the gate enters here: the state fades over the chunk
        S = S + K_out[:, n].transpose(-1, -2) @ u
    return torch.stack(corrections, 1), torch.stack(states, 1), S


#: Upper bound on the tensor elements the chunked forms work on at once (about 128 MiB of
#: float32 per tensor). Chunks are processed in groups: a group's state-independent work is a
#: few batched matrix products, its state is then carried across its chunks, and its outputs
#: are one batched product again. The group size keeps memory bounded for any ``T``.
BLOCK_ELEMENTS = 2**25


def chunk_spans(T: int, C: int, BH: int, Dk: int, Dv: int, G: int = 0):
    """The groups of chunks a chunked form works on, ``[(tokens, chunk length), ...]``.

    Memory budgeting, kept out of the steps: a group holds as many whole chunks as fit in
    :data:`BLOCK_ELEMENTS` (``G``: decays per token, 0 without a gate, 1 per head, ``Dk`` per
    channel); a last, shorter chunk gets a group of its own when ``T`` is not a multiple of ``C``.
    """
    if G <= 1:  # the C x C matrices of a chunk (scores, UT transform, pairwise decay), its vectors
        per_chunk = BH * (3 * C * C + Dk * Dv + 4 * C * (Dk + Dv))
    else:  # per-channel decays: no C x C x Dk tensor, but a dozen (C, D)-sized factors
        per_chunk = BH * (6 * C * C + Dk * Dv + 12 * C * (Dk + Dv))
    group = max(1, BLOCK_ELEMENTS // max(per_chunk, 1)) * C  # tokens per group, a multiple of C
    full = T - T % C
    spans = [(slice(s, min(s + group, full)), C) for s in range(0, full, group)]
    return spans + ([(slice(full, T), T - full)] if full < T else [])


def as_chunks(x: torch.Tensor, size: int) -> torch.Tensor:
    """A ``(B, H, n * size, ...)`` stretch of tokens as ``(B * H, n, size, ...)`` chunks."""
    B, H, T = x.shape[:3]
    return x.reshape(B * H, T // size, size, *x.shape[3:])

"""Chapter 5's exercises: DeltaNet in parallel, the chunkwise form.

* 5.1 (predict): on Figure 5.3's grid of chunk sizes, the largest chunk size whose chunkwise
  FLOPs stay under twice the recurrence's is the same fraction of the head dimension at every
  slider step (:func:`largest_chunk_under_twice`).
* 5.2 (derive): the UT transform of a chunk of two tokens, by hand (:func:`two_token_ut`).
* 5.3 (change the code): ``tril()`` to ``tril(-1)`` in the chunk's output makes each token read
  the state *before* its own write (:func:`chunkwise_read_first`, :func:`recurrent_read_first`).
* 5.4 (change the code): the WY factors by their row-by-row recursion instead of the UT
  transform give the same answer in as many sequential steps as the recurrence
  (:func:`chunkwise_wy`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from gpt2k3.checks import check_chunkwise_call, check_delta_rule_call, check_int, check_positive_int, checked
from gpt2k3.ops import delta
from gpt2k3.ops.wy import chunkwise_cost

__all__ = ["largest_chunk_under_twice", "two_token_ut", "chunkwise_read_first",
           "recurrent_read_first", "chunkwise_wy", "compare_read_first", "compare_wy",
           "random_delta_inputs"]

#: Figure 5.3's grid: its chunk sizes and its slider's head dimensions.
FIGURE_CHUNK_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
FIGURE_HEAD_DIMS = (32, 64, 128, 256)


# ------------------------------------------------------------------------------ 5.1 predict
@dataclass(frozen=True)
class UnderTwice:
    """For one head dimension ``d``: the largest chunk size on the grid whose chunkwise FLOPs
    are under twice the recurrent ones, and the FLOP ratio at ``C = d/2`` and ``C = d``
    (counted by :func:`gpt2k3.ops.wy.chunkwise_cost`) beside the approximation
    ``1 + 5x/3 + x^2/9`` with ``x = C/d``."""

    d: int
    largest_chunk: int
    ratio_half_d: float
    ratio_d: float
    approx_half_d: float
    approx_d: float


def _approx_ratio(x: float) -> float:
    # per token: 3 d^2 + 5 C d + C^2 / 3 multiply-adds against 3 d^2 (UT transform ~ C^3/3)
    return 1 + 5 * x / 3 + x * x / 9


def largest_chunk_under_twice(T: int = 4096, ds=FIGURE_HEAD_DIMS,
                              chunk_sizes=FIGURE_CHUNK_SIZES) -> list[UnderTwice]:
    """Exercise 5.1: for each head dimension of Figure 5.3's slider, the chunk sizes that keep
    the chunkwise form under twice the recurrent FLOPs (``T`` tokens of one head)."""
    T = check_positive_int(T, "T")
    rows = []
    for d in ds:
        d = check_positive_int(d, "each head dimension")
        under = [c for c in chunk_sizes if chunkwise_cost(T, c, d).flops_ratio < 2]
        rows.append(UnderTwice(d, max(under), chunkwise_cost(T, d // 2, d).flops_ratio,
                               chunkwise_cost(T, d, d).flops_ratio, _approx_ratio(0.5),
                               _approx_ratio(1.0)))
    return rows


# ------------------------------------------------------------------------------- 5.2 derive
def two_token_ut(D: int = 8, seed: int = 0) -> dict:
    """Exercise 5.2: the UT transform of two tokens written out by hand,
    ``T = [[b1, 0], [-b1 b2 (k1 . k2), b2]]``, against :func:`gpt2k3.ops.delta.ut_transform`;
    its second WY row against the recursion ``w2 = b2 (k2 - (k2 . k1) w1)``; ``I - K^T W``
    against the product ``H2 H1``; and the case of one key written twice with ``beta = 1``,
    where the second row of ``W`` vanishes and the second of ``U`` is ``v2 - v1``.
    Returns the largest differences (float64) and the values of the repeated-key case."""
    D = check_positive_int(D, "D")
    g = torch.Generator().manual_seed(check_int(seed, "seed", 0))
    k = F.normalize(torch.randn(2, D, generator=g, dtype=torch.float64), dim=-1)
    v = torch.randn(2, D, generator=g, dtype=torch.float64)
    b = 2 * torch.rand(2, generator=g, dtype=torch.float64)  # write strengths in [0, 2)
    dot = float(k[0] @ k[1])
    by_hand = torch.tensor([[b[0], 0.0], [-b[0] * b[1] * dot, b[1]]], dtype=torch.float64)
    T_ut = delta.ut_transform(k, b)
    W = T_ut @ k
    w2 = b[1] * (k[1] - dot * W[0])
    H = [torch.eye(D, dtype=torch.float64) - b[i] * torch.outer(k[i], k[i]) for i in range(2)]
    twice = k[:1].expand(2, D)                    # one key, written twice with beta = 1
    T_twice = delta.ut_transform(twice, torch.ones(2, dtype=torch.float64))
    return {
        "k1_dot_k2": dot,
        "T_vs_hand": float((T_ut - by_hand).abs().max()),
        "w2_vs_recursion": float((W[1] - w2).abs().max()),
        "P_vs_H2H1": float(((torch.eye(D, dtype=torch.float64) - k.T @ W) - H[1] @ H[0]).abs().max()),
        "P_vs_householder_product": float(((torch.eye(D, dtype=torch.float64) - k.T @ W)
                                           - delta.householder_product(k, b)).abs().max()),
        "twice_T": T_twice.tolist(),
        "twice_w2_norm": float((T_twice @ twice)[1].norm()),
        "twice_u2_vs_v2_minus_v1": float(((T_twice @ v)[1] - (v[1] - v[0])).abs().max()),
    }


# ---------------------------------------------------------------------- 5.3 change the code
@checked(check_delta_rule_call)
def recurrent_read_first(q, k, v, beta, *, initial_state=None):
    """:func:`gpt2k3.ops.delta.recurrent` with its output line moved up: token ``t`` reads the
    state before its own write, ``o_t = q_t S_{t-1}`` (the reference for
    :func:`chunkwise_read_first`)."""
    out_dtype, dtype = v.dtype, torch.promote_types(v.dtype, torch.float32)  # state: >= float32
    q, k, v, beta = (x.to(dtype) for x in (q, k, v, beta))
    B, H, T, Dk = k.shape
    S = k.new_zeros(B, H, Dk, v.shape[-1]) if initial_state is None else initial_state.to(dtype)
    o = torch.empty_like(v)
    for t in range(T):
        q_t, k_t, v_t = q[:, :, t], k[:, :, t], v[:, :, t]  # (B, H, D)
        o[:, :, t] = (q_t.unsqueeze(-2) @ S).squeeze(-2)  # read first: the state before t's write
        v_old = (k_t.unsqueeze(-2) @ S).squeeze(-2)  # what the state returns for k_t now
        u = beta[:, :, t, None] * (v_t - v_old)  # write only the correction
        S = S + k_t.unsqueeze(-1) * u.unsqueeze(-2)  # outer product k_t^T u
    return o.to(out_dtype), S


@checked(check_chunkwise_call)
def chunkwise_read_first(q, k, v, beta, *, initial_state=None, chunk_size: int = 64):
    """:func:`gpt2k3.ops.delta.chunkwise_reference` with the chunk's causal mask one diagonal
    lower, ``tril(-1)``: token ``i`` of a chunk no longer sees its own correction, so it reads
    the state before its write. Nothing else changes; the final state is the same."""
    out_dtype, dtype = v.dtype, torch.promote_types(v.dtype, torch.float32)
    q, k, v, beta = (x.to(dtype) for x in (q, k, v, beta))
    B, H, T, Dk = k.shape
    S = k.new_zeros(B, H, Dk, v.shape[-1]) if initial_state is None else initial_state.to(dtype)
    o = torch.empty_like(v)
    for s in range(0, T, chunk_size):
        c = slice(s, s + chunk_size)  # the last chunk may be shorter
        Q, K, V, b = q[:, :, c], k[:, :, c], v[:, :, c], beta[:, :, c, None]
        I = torch.eye(K.shape[2], dtype=K.dtype, device=K.device)
        # UT transform: unrolling the rule in a chunk gives (I + tril(diag(b) K K^T, -1)) u = ...
        L = I + (b * (K @ K.transpose(-1, -2))).tril(-1)
        T_ut = torch.linalg.solve_triangular(L, I.expand_as(L), upper=False) * b.transpose(-1, -2)
        W, U = T_ut @ K, T_ut @ V  # WY factors: they do not depend on S
        u = U - W @ S  # the corrections, once the state entering the chunk is known
        o[:, :, c] = Q @ S + (Q @ K.transpose(-1, -2)).tril(-1) @ u  # j < i only: read first
        S = S + K.transpose(-1, -2) @ u
    return o.to(out_dtype), S


# ---------------------------------------------------------------------- 5.4 change the code
@checked(check_chunkwise_call)
def chunkwise_wy(q, k, v, beta, *, initial_state=None, chunk_size: int = 64):
    """:func:`gpt2k3.ops.delta.chunkwise_reference` with the UT transform replaced by the WY
    recursion row by row (:func:`gpt2k3.ops.wy.wy_representation`): the same ``W`` and ``U``,
    the same answer, but ``C`` sequential row steps inside every chunk."""
    out_dtype, dtype = v.dtype, torch.promote_types(v.dtype, torch.float32)
    q, k, v, beta = (x.to(dtype) for x in (q, k, v, beta))
    B, H, T, Dk = k.shape
    S = k.new_zeros(B, H, Dk, v.shape[-1]) if initial_state is None else initial_state.to(dtype)
    o = torch.empty_like(v)
    for s in range(0, T, chunk_size):
        c = slice(s, s + chunk_size)  # the last chunk may be shorter
        Q, K, V, b = q[:, :, c], k[:, :, c], v[:, :, c], beta[:, :, c, None]
        W, U = delta.wy_representation(K, V, b.squeeze(-1))  # row by row: C sequential steps
        u = U - W @ S  # the corrections, once the state entering the chunk is known
        o[:, :, c] = Q @ S + (Q @ K.transpose(-1, -2)).tril() @ u
        S = S + K.transpose(-1, -2) @ u
    return o.to(out_dtype), S


def random_delta_inputs(B: int = 1, H: int = 2, T: int = 100, D: int = 16, seed: int = 0):
    """Float64 unit keys and queries, normal values, ``beta`` in [0, 1) and a random initial
    state ``(q, k, v, beta, S0)`` for the comparisons below."""
    B, H, T, D = (check_positive_int(x, n) for x, n in ((B, "B"), (H, "H"), (T, "T"), (D, "D")))
    g = torch.Generator().manual_seed(check_int(seed, "seed", 0))
    q, k = (F.normalize(torch.randn(B, H, T, D, generator=g, dtype=torch.float64), dim=-1)
            for _ in range(2))
    v = torch.randn(B, H, T, D, generator=g, dtype=torch.float64)
    beta = torch.rand(B, H, T, generator=g, dtype=torch.float64)
    return q, k, v, beta, torch.randn(B, H, D, D, generator=g, dtype=torch.float64)


def compare_read_first(T: int = 100, chunk_sizes=(16, 64), seed: int = 0) -> dict:
    """Exercise 5.3: the changed chunkwise form against the read-first recurrence (outputs and
    final state), and how far reading first moves the outputs from the chapter's rule."""
    q, k, v, beta, S0 = random_delta_inputs(T=T, seed=seed)
    o_ref, S_ref = recurrent_read_first(q, k, v, beta, initial_state=S0)
    o_rule, S_rule = delta.recurrent(q, k, v, beta, initial_state=S0)
    worst = 0.0
    for C in chunk_sizes:
        o, S = chunkwise_read_first(q, k, v, beta, initial_state=S0, chunk_size=C)
        worst = max(worst, float((o - o_ref).abs().max()), float((S - S_ref).abs().max()))
    return {"T": T, "chunk_sizes": tuple(chunk_sizes), "vs_read_first": worst,
            "same_final_state": float((S_ref - S_rule).abs().max()),
            "vs_rule": float((o_ref - o_rule).abs().max())}


def compare_wy(T: int = 100, chunk_sizes=(7, 16, 64), seed: int = 0) -> dict:
    """Exercise 5.4: :func:`chunkwise_wy` against the recurrence for chunk sizes that do and do
    not divide ``T``, and the sequential steps each form takes: ``T`` for the recurrence,
    ``ceil(T/C)`` chunks for the UT form, ``ceil(T/C)`` chunks plus ``T`` rows for the WY one,
    and ``min(C, T) + ceil(T/C)`` for the WY recursion run on every chunk at once (it does not
    depend on the state) before the state pass."""
    q, k, v, beta, S0 = random_delta_inputs(T=T, seed=seed)
    o_rule, S_rule = delta.recurrent(q, k, v, beta, initial_state=S0)
    worst, steps = 0.0, {}
    for C in chunk_sizes:
        o, S = chunkwise_wy(q, k, v, beta, initial_state=S0, chunk_size=C)
        worst = max(worst, float((o - o_rule).abs().max()), float((S - S_rule).abs().max()))
        steps[C] = {"ut": math.ceil(T / C), "wy": math.ceil(T / C) + T,
                    "wy_batched": min(C, T) + math.ceil(T / C)}
    return {"T": T, "chunk_sizes": tuple(chunk_sizes), "vs_recurrent": worst, "steps": steps}

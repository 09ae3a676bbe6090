r"""The chunkwise DeltaNet derivation, piece by piece, and its cost model (chapter 5).

:mod:`gpt2k3.ops.delta` computes the delta rule a chunk at a time. The pieces of that
algorithm are exposed here one by one, on a single chunk (any leading batch dimensions), so that
the chapter can show them and the tests can check each against the next:

* :func:`householder_product` -- the chunk's transition matrix, the product of the generalised
  Householder factors ``I - beta_t k_t^T k_t``, applied one by one (the definition);
* :func:`wy_representation` -- its WY factors ``(W, U)`` by their defining recursion;
* :func:`ut_transform` -- the same factors from one triangular inverse, the way
  :func:`gpt2k3.ops.delta.chunkwise` computes them;
* :func:`chunkwise_cost` / :class:`ChunkCost` -- a FLOP and sequential-step count of the
  chunkwise form against the token-by-token one.

Like the mixers, every function requires ``beta * |k|^2`` in ``[0, 2]`` for each token
(``beta in [0, 2]`` for unit keys): see :func:`gpt2k3.checks.check_write_strength`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from gpt2k3.checks import (
    check_chunk_size,
    check_finite,
    check_float_tensor,
    check_positive_int,
    check_write_strength,
    checked,
)
from gpt2k3.ops.chunks import unit_lower_inverse

__all__ = ["householder_product", "wy_representation", "ut_transform", "ChunkCost", "chunkwise_cost"]


def _check_chunk(k, beta, v=None) -> None:
    """The door of the chunk pieces: ``k (..., C, Dk)``, ``beta (..., C)``, ``v (..., C, Dv)``
    if given, floating and finite, ``beta * |k|^2`` in ``[0, 2]``. Changes nothing."""
    check_float_tensor(k, "k")
    if k.ndim < 2:
        raise ValueError(f"k must have shape (..., C, Dk), at least 2 dimensions; got {tuple(k.shape)}")
    check_float_tensor(beta, "beta")
    if beta.shape != k.shape[:-1]:
        raise ValueError(
            f"beta must have shape (..., C) = {tuple(k.shape[:-1])} to match k; got {tuple(beta.shape)}"
        )
    if v is not None:
        check_float_tensor(v, "v")
        if v.ndim != k.ndim or v.shape[:-1] != k.shape[:-1]:
            raise ValueError(
                f"v must have shape (..., C, Dv) with (..., C) = {tuple(k.shape[:-1])} to match k; "
                f"got {tuple(v.shape)}"
            )
        check_finite(v, "v")
    check_finite(k, "k")
    check_finite(beta, "beta")
    check_write_strength(beta, k)


def _check_wy(k, v, beta) -> None:
    if v is None:
        raise ValueError("v must be a torch.Tensor of shape (..., C, Dv), got None")
    _check_chunk(k, beta, v)


@checked(_check_chunk)
def householder_product(k, beta):
    r"""The transition matrix of a chunk: ``P = H_C \cdots H_2 H_1`` with ``H_t = I - beta_t k_t^T k_t``.

    Writing a chunk of ``C`` tokens into a state ``S`` gives ``P S + (what the chunk writes into an
    empty state)``; ``P`` is that product of generalised Householder matrices (true Householder
    reflections for unit keys and ``beta = 2``). Computed by applying the factors one by one --
    the definition the WY representation is checked against.

    Args:
        k: ``(..., C, Dk)`` keys of one chunk (any leading batch dimensions).
        beta: ``(..., C)`` write strengths, ``beta * |k|^2`` in ``[0, 2]``.

    Returns:
        ``(..., Dk, Dk)``.
    """
    k, beta = (x.to(torch.promote_types(k.dtype, torch.float32)) for x in (k, beta))
    Dk = k.shape[-1]
    P = torch.eye(Dk, dtype=k.dtype, device=k.device).expand(*k.shape[:-2], Dk, Dk)
    for t in range(k.shape[-2]):
        k_t = k[..., t, :]
        # H_t P = P - beta_t k_t^T (k_t P)
        P = P - beta[..., t, None, None] * k_t.unsqueeze(-1) * (k_t.unsqueeze(-2) @ P)
    return P


@checked(_check_wy)
def wy_representation(k, v, beta):
    r"""The WY factors of a chunk by their defining recursion: ``(W, U)``, each ``(..., C, D)``.

    .. math::

        w_t = \beta_t \Big(k_t - \sum_{j<t} (k_t \cdot k_j)\, w_j\Big), \qquad
        u_t = \beta_t \Big(v_t - \sum_{j<t} (k_t \cdot k_j)\, u_j\Big),

    so that the chunk's transition is ``householder_product(k, beta) = I - K^T W`` and a chunk
    entered with state ``S`` leaves it as ``S + K^T (U - W S)``. Token by token, for checking;
    :func:`ut_transform` gives the same factors from one matrix product.
    """
    k, v, beta = (x.to(torch.promote_types(k.dtype, torch.float32)) for x in (k, v, beta))
    W, U = torch.zeros_like(k), torch.zeros_like(v)
    for t in range(k.shape[-2]):
        dots = k[..., :t, :] @ k[..., t, :, None]  # (..., t, 1): k_t . k_j for j < t
        W[..., t, :] = beta[..., t, None] * (k[..., t, :] - (dots * W[..., :t, :]).sum(-2))
        U[..., t, :] = beta[..., t, None] * (v[..., t, :] - (dots * U[..., :t, :]).sum(-2))
    return W, U


@checked(_check_chunk)
def ut_transform(k, beta):
    r"""The UT-transform matrix of a chunk: ``T = (I + tril(diag(beta) K K^T, -1))^{-1} diag(beta)``.

    The WY recursions of :func:`wy_representation` are the lower-triangular system
    ``(I + tril(diag(beta) K K^T, -1)) W = diag(beta) K`` (and the same with ``V``), so
    ``W = T K`` and ``U = T V``: one ``C x C`` matrix, independent of the values and of the state,
    turns the chunk's keys and values into its WY factors with two matrix products. Computed the
    way :func:`gpt2k3.ops.delta.chunkwise` computes it (a blockwise unit-triangular inverse).

    Args:
        k: ``(..., C, Dk)``; beta: ``(..., C)``, ``beta * |k|^2`` in ``[0, 2]``.

    Returns:
        ``(..., C, C)``, lower triangular.
    """
    k, beta = (x.to(torch.promote_types(k.dtype, torch.float32)) for x in (k, beta))
    L = (beta.unsqueeze(-1) * (k @ k.transpose(-1, -2))).tril(-1)  # below the unit diagonal
    return unit_lower_inverse(L) * beta.unsqueeze(-2)


# ---------------------------------------------------------------------------------------------
# a cost model (chapter 5)
# ---------------------------------------------------------------------------------------------


def _inverse_macs(C: int, base: int = 16) -> int:
    """Multiply-adds of ``unit_lower_inverse`` on a ``C x C`` matrix (the same recursion)."""
    if C <= base:
        return C * C * C // 2  # a triangular solve with C right-hand sides: C^2 / 2 each
    h = C // 2
    return _inverse_macs(h, base) + _inverse_macs(C - h, base) + (C - h) * h * h + (C - h) * (C - h) * h


def _chunk_macs(c: int, d_k: int, d_v: int) -> tuple[int, int]:
    """(parallel, sequential) multiply-adds of one chunk of ``c`` tokens in the chunkwise form."""
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
    #: chunkwise work outside the loop over chunks, batched over all chunks; the outputs'
    #: ``Q S_start`` and ``P u`` use the states, so they run after the loop, once those are known
    parallel_flops: int
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
    r"""Count the work of :func:`gpt2k3.ops.delta.chunkwise` against
    :func:`~gpt2k3.ops.delta.recurrent` for one head.

    Per chunk of ``C`` tokens the chunkwise form does ``2 C^2 d_k`` (scores) + ``~C^3/3`` (UT
    transform) + ``C^2 (d_k + d_v)`` (WY factors) + ``C d_k d_v + C^2 d_v`` (outputs) multiply-adds
    done outside the sequential loop (the outputs after it, for all chunks at once, once the
    states entering the chunks are known), and ``2 C d_k d_v`` inside it; the recurrent
    form does ``3 d_k d_v`` per token, all of it sequential. So per token the chunkwise form pays
    about ``C (3 d_k + 2 d_v) + C^2 / 3`` extra multiply-adds to turn ``T`` sequential steps into
    ``T / C``. A model, not a measurement: it counts the matrix products our implementation
    performs (full ``C x C`` products even where a mask zeroes half) and ignores elementwise work
    and memory traffic.
    """
    T = check_positive_int(T, "T")
    chunk_size = check_chunk_size(chunk_size)
    d_k = check_positive_int(d_k, "d_k")
    d_v = d_k if d_v is None else check_positive_int(d_v, "d_v")
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

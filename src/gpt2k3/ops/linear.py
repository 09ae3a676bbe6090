r"""Causal linear attention (Katharopoulos et al., 2020) in three equivalent forms.

Softmax attention weighs value ``v_s`` by ``exp(q_t . k_s)``. Linear attention replaces the
exponential with a dot product of non-negative features, ``phi(q_t) . phi(k_s)`` (here
``phi = elu1``, applied by the caller), which lets the sum be re-associated:

.. math::

    o_t = \frac{\sum_{s \le t} (q_t \cdot k_s)\, v_s}{q_t \cdot \sum_{s \le t} k_s + \varepsilon}
        = \frac{q_t S_t}{q_t \cdot z_t + \varepsilon},
    \qquad S_t = \sum_{s \le t} k_s^\top v_s \ (D_k \times D_v), \quad z_t = \sum_{s \le t} k_s.

So the whole past fits in a fixed-size state ``(S, z)`` instead of a growing KV cache.

Three forms compute the same thing:

* :func:`parallel` -- the masked ``T x T`` score matrix, O(T^2) work, the "attention" view;
* :func:`recurrent` -- token by token through the state, O(T) work: the definition, a plain loop
  that shares nothing with the other forms but argument validation;
* :func:`chunkwise` -- the masked parallel form inside chunks of ``chunk_size`` tokens and the
  recurrence between chunks: what fast kernels do.

All three return ``(o, (S, z))``, the outputs and the state after the last token (for
:func:`parallel`, ``S = K^T V`` and ``z = sum_s k_s``, the same state), and :func:`recurrent`
and :func:`chunkwise` take an ``initial_state`` so a sequence can be processed in pieces.

:func:`decode_step` is the recurrence for one new token with no loop around it -- the O(D^2)
per-token cost of decoding with a state, which chapter 3 times against a KV cache.

All take ``q, k`` *after* the feature map and apply no hidden ``1/sqrt(D)`` scale (the
normalising denominator makes such a scale cancel anyway, up to the epsilon).

**The epsilon.** ``eps`` (default ``EPS = 1e-6``, and it must be ``> 0``) is added to the
denominator ``q_t . z_t`` and nowhere else. For non-negative features the denominator is a sum of
non-negative terms, so it can only be zero when every ``q_t . k_s`` is zero -- and in floating
point that happens: ``elu1`` is computed as ``elu(x) + 1 = (exp(x) - 1) + 1``, which rounds to
exactly 0 once ``exp(x)`` drops below half the float32 spacing just under 1, i.e. for ``x`` below
roughly ``-17`` (the exact threshold depends on the vectorised ``expm1`` in use; about ``-37`` in
float64). Without the epsilon such features would give ``0/0 = NaN``; with it they give 0, which
is why ``eps = 0`` is refused with a ``ValueError`` rather than allowed to produce NaN. Otherwise
it is negligible: with features of order one, ``q_t . z_t`` is of order ``t * D``.
(flash-linear-attention uses ``1e-10``; pass ``eps=1e-10`` to match it.) With
``normalize=False`` the functions return only the numerator ``q_t S_t`` -- the unnormalised
variant used by later models and by flash-linear-attention's default -- and ``eps`` is unused.

Because a negative feature could make the denominator cross zero, the normalised forms raise
``ValueError`` when ``q`` or ``k`` has a negative entry: apply :func:`elu1` (or another
non-negative feature map) first.

:func:`seed_prefill` reproduces the one-shot prefill of the seed article, which sums ``k^T v``
over *all* ``T`` tokens before reading and is therefore not causal; it exists so the book can
show that bug next to the correct forms.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gpt2k3.checks import (
    check_chunk_size,
    check_float_tensor,
    check_linear_state,
    check_nonnegative,
    check_positive_float,
    check_qkv,
    compute_dtype,
    output_dtype,
)

__all__ = ["EPS", "elu1", "parallel", "recurrent", "chunkwise", "decode_step"]

#: Default epsilon added to the normalising denominator (see the module docstring).
EPS = 1e-6

_NONNEG_HINT = (
    " for the normalised form (apply a feature map such as elu1 first, or pass normalize=False)"
)


def elu1(x: torch.Tensor) -> torch.Tensor:
    """The feature map ``elu(x) + 1``: ``x + 1`` for ``x > 0`` and ``exp(x)`` otherwise.

    Positive in exact arithmetic; in floating point it rounds to 0 for very negative ``x``
    (below roughly -17 in float32), which is what the denominator's ``eps`` guards against.
    """
    check_float_tensor(x, "x")
    return F.elu(x) + 1.0


def _check(q, k, v, initial_state, eps, normalize):
    """Validate the arguments of every form (nothing is computed or cast here).

    Returns ``((B, H, T, Dk, Dv), eps, S0, z0)`` with ``(S0, z0)`` the incoming state or
    ``(None, None)``.
    """
    dims = check_qkv(q, k, v)
    eps = check_positive_float(eps, "eps")
    if not isinstance(normalize, bool):
        raise ValueError(f"normalize must be a bool, got {normalize!r}")
    if normalize:
        check_nonnegative(q, "q", _NONNEG_HINT)
        check_nonnegative(k, "k", _NONNEG_HINT)
    B, H, _, Dk, Dv = dims
    S0, z0 = check_linear_state(initial_state, "initial_state", B, H, Dk, Dv)
    return dims, eps, S0, z0


# ---------------------------------------------------------------------------------------------
# the three forms
# ---------------------------------------------------------------------------------------------


def parallel(q, k, v, *, eps: float = EPS, normalize: bool = True):
    """Causal linear attention as a masked ``T x T`` product (quadratic in ``T``).

    ``A = tril(Q K^T)``; the output is ``A V`` divided, row by row, by ``rowsum(A) + eps``
    (``rowsum(A)_t = q_t . sum_{s<=t} k_s``, the same denominator as the recurrence).

    Args:
        q, k: ``(B, H, T, Dk)`` non-negative features. v: ``(B, H, T, Dv)``.
        eps: a float ``> 0`` added to the denominator (see the module docstring).
        normalize: if False, return the numerator ``A V`` only.

    Returns:
        ``(o, (S, z))``: outputs ``(B, H, T, Dv)`` and the state after the last token,
        ``S = K^T V`` and ``z = sum_s k_s`` (compute dtype, at least float32), as the other
        forms return it.
    """
    _, eps, _, _ = _check(q, k, v, None, eps, normalize)
    cdt, odt = compute_dtype(q, k, v), output_dtype(q, k, v)
    q, k, v = q.to(cdt), k.to(cdt), v.to(cdt)
    A = (q @ k.transpose(-1, -2)).tril()  # A[t, s] = q_t . k_s for s <= t
    o = A @ v
    if normalize:
        o = o / (A.sum(-1, keepdim=True) + eps)
    return o.to(odt), (k.transpose(-1, -2) @ v, k.sum(-2))


def recurrent(q, k, v, *, initial_state=None, eps: float = EPS, normalize: bool = True):
    """Causal linear attention token by token: the definition.

    For each ``t``: ``S <- S + k_t^T v_t``, ``z <- z + k_t``, ``o_t = q_t S / (q_t . z + eps)``.

    Args:
        q, k: ``(B, H, T, Dk)`` non-negative features. v: ``(B, H, T, Dv)``.
        initial_state: optional ``(S, z)`` from a previous call, shapes ``(B, H, Dk, Dv)`` and
            ``(B, H, Dk)``.
        eps, normalize: as in :func:`parallel`.

    Returns:
        ``(o, (S, z))``: outputs ``(B, H, T, Dv)`` and the state after the last token (kept in
        the compute dtype, at least float32).
    """
    (B, H, T, Dk, Dv), eps, S0, z0 = _check(q, k, v, initial_state, eps, normalize)
    cdt, odt = compute_dtype(q, k, v, S0, z0), output_dtype(q, k, v)
    q, k, v = q.to(cdt), k.to(cdt), v.to(cdt)
    S = q.new_zeros(B, H, Dk, Dv) if S0 is None else S0.to(cdt)
    z = q.new_zeros(B, H, Dk) if z0 is None else z0.to(cdt)
    o = q.new_empty(B, H, T, Dv)
    for t in range(T):
        q_t, k_t, v_t = q[:, :, t], k[:, :, t], v[:, :, t]  # (B, H, D)
        S = S + k_t.unsqueeze(-1) * v_t.unsqueeze(-2)  # outer product k_t^T v_t
        z = z + k_t
        num = (q_t.unsqueeze(-2) @ S).squeeze(-2)  # q_t S, (B, H, Dv)
        if normalize:
            num = num / ((q_t * z).sum(-1, keepdim=True) + eps)
        o[:, :, t] = num
    return o.to(odt), (S, z)


def chunkwise(q, k, v, *, initial_state=None, chunk_size: int = 64, eps: float = EPS,
              normalize: bool = True):
    """Causal linear attention in chunks: masked parallel inside a chunk, state between chunks.

    For a chunk with rows ``Q, K, V`` entered with state ``(S, z)``:
    ``numerator = Q S + tril(Q K^T) V``, ``denominator = Q z + rowsum(tril(Q K^T)) + eps``, then
    ``S <- S + K^T V`` and ``z <- z + sum_rows(K)``. The last chunk may be shorter than
    ``chunk_size``; the result is exact for any ``T``.

    Args:
        q, k, v, initial_state, eps, normalize: as in :func:`recurrent`.
        chunk_size: tokens per chunk, a positive int.

    Returns:
        ``(o, (S, z))`` as in :func:`recurrent`.
    """
    chunk_size = check_chunk_size(chunk_size)
    (B, H, T, Dk, Dv), eps, S0, z0 = _check(q, k, v, initial_state, eps, normalize)
    cdt, odt = compute_dtype(q, k, v, S0, z0), output_dtype(q, k, v)
    q, k, v = q.to(cdt), k.to(cdt), v.to(cdt)
    S = q.new_zeros(B, H, Dk, Dv) if S0 is None else S0.to(cdt)
    z = q.new_zeros(B, H, Dk) if z0 is None else z0.to(cdt)
    o = q.new_empty(B, H, T, Dv)
    for start in range(0, T, chunk_size):
        c = slice(start, min(start + chunk_size, T))
        q_c, k_c, v_c = q[:, :, c], k[:, :, c], v[:, :, c]
        A = (q_c @ k_c.transpose(-1, -2)).tril()  # intra-chunk scores, causal
        num = q_c @ S + A @ v_c  # inter-chunk (earlier chunks via S) + intra-chunk
        if normalize:
            num = num / (q_c @ z.unsqueeze(-1) + A.sum(-1, keepdim=True) + eps)
        o[:, :, c] = num
        S = S + k_c.transpose(-1, -2) @ v_c
        z = z + k_c.sum(-2)
    return o.to(odt), (S, z)


# ---------------------------------------------------------------------------------------------
# one decode step
# ---------------------------------------------------------------------------------------------


def decode_step(q_t, k_t, v_t, *, initial_state=None, eps: float = EPS, normalize: bool = True,
                inplace: bool = False):
    """One decode step through the state: :func:`recurrent` for a single token, without the loop.

    ``S <- S + k_t^T v_t``, ``z <- z + k_t``, ``o_t = q_t S / (q_t . z + eps)``. The work and
    the bytes touched are O(Dk Dv) whatever the context length: the step reads and writes the
    state, never the past tokens.

    Args:
        q_t, k_t: ``(B, H, 1, Dk)`` non-negative features. v_t: ``(B, H, 1, Dv)``.
        initial_state, eps, normalize: as in :func:`recurrent` (the state so far).
        inplace: if False (default) the incoming state is left alone and a new one is returned.
            If True, ``S`` and ``z`` are updated in place when they are contiguous and already in
            the compute dtype (float32 or float64) -- as a KV cache is written in place, with no
            new allocation per token. Either way, use the returned state.

    Returns:
        ``(o_t, (S, z))``: the output ``(B, H, 1, Dv)`` and the updated state.
    """
    (B, H, T, Dk, Dv), eps, S0, z0 = _check(q_t, k_t, v_t, initial_state, eps, normalize)
    if T != 1:
        raise ValueError(f"q_t, k_t and v_t must hold one token, shape (B, H, 1, D); got T={T}")
    cdt, odt = compute_dtype(q_t, k_t, v_t, S0, z0), output_dtype(q_t, k_t, v_t)
    q, k, v = q_t.to(cdt), k_t.to(cdt), v_t.to(cdt)
    S = q.new_zeros(B, H, Dk, Dv) if S0 is None else S0.to(cdt)  # .to is a no-op in cdt
    z = q.new_zeros(B, H, Dk) if z0 is None else z0.to(cdt)
    o, S, z = _decode(q, k, v, S, z, eps, normalize, inplace)
    return o.to(odt), (S, z)


def _decode(q, k, v, S, z, eps: float, normalize: bool, inplace: bool):
    """The step itself, on validated inputs in the compute dtype (``benchmarks/crossover.py``
    times this, so that the per-call validation does not count as the state's cost)."""
    B, H, _, Dk = q.shape
    Dv = v.shape[-1]
    k_col = k.reshape(B * H, 1, Dk).transpose(1, 2)  # (BH, Dk, 1)
    v_row = v.reshape(B * H, 1, Dv)  # (BH, 1, Dv)
    if inplace and S.is_contiguous() and z.is_contiguous():
        S.view(B * H, Dk, Dv).baddbmm_(k_col, v_row)  # S += k^T v, the outer product
        z.add_(k[:, :, 0])
    else:
        S = torch.baddbmm(S.reshape(B * H, Dk, Dv), k_col, v_row).view(B, H, Dk, Dv)
        z = z + k[:, :, 0]
    o = q @ S  # (B, H, 1, Dv)
    if normalize:
        o = o / (q @ z.unsqueeze(-1) + eps)
    return o, S, z



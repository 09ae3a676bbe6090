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
  that shares nothing with the other forms but the argument check;
* :func:`chunkwise` -- the masked parallel form inside chunks of ``chunk_size`` tokens and the
  recurrence between chunks: what fast kernels do.

All three return ``(o, (S, z))``, the outputs and the state after the last token (for
:func:`parallel`, ``S = K^T V`` and ``z = sum_s k_s``, the same state), and :func:`recurrent`
and :func:`chunkwise` take an ``initial_state`` so a sequence can be processed in pieces.

:func:`decode_step` is the recurrence for one new token with no loop around it, optionally
updating the state in place -- the fast form of a decode step, tested equal to
:func:`recurrent`, and the O(D^2) per-token cost that chapter 3 times against a KV cache.

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

Every form is a pure body behind one door, :func:`gpt2k3.checks.checked` with
:func:`gpt2k3.checks.check_linear_attention_call` (``check_linear_decode_call`` for
:func:`decode_step`): the door checks the arguments from their shapes and dtypes, reading no
value, so it never waits for the device, and changes nothing. The body casts the inputs to the
compute dtype, at least float32, creates the state (zeros unless one is given) and returns the
outputs in the input dtype. Two promises are the caller's and are not scanned: finite inputs
(the layer's input is checked, at the front door) and, for the normalised forms, non-negative
``q`` and ``k`` (a negative feature could make the denominator cross zero; apply :func:`elu1`
or another non-negative feature map first).

The seed article's one-shot prefill, which sums ``k^T v`` over *all* ``T`` tokens before
reading and is therefore not causal, is :func:`gpt2k3.seed.seed_prefill`, kept so the book can
show that bug next to these forms.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gpt2k3.checks import check_float_tensor, check_linear_attention_call, check_linear_decode_call, checked

__all__ = ["EPS", "elu1", "parallel", "recurrent", "chunkwise", "decode_step"]

#: Default epsilon added to the normalising denominator (see the module docstring).
EPS = 1e-6


def check_elu1(x) -> None:
    """:func:`elu1`'s door: a floating tensor."""
    check_float_tensor(x, "x")


@checked(check_elu1)
def elu1(x: torch.Tensor) -> torch.Tensor:
    """The feature map ``elu(x) + 1``: ``x + 1`` for ``x > 0`` and ``exp(x)`` otherwise.

    Positive in exact arithmetic; in floating point it rounds to 0 for very negative ``x``
    (below roughly -17 in float32), which is what the denominator's ``eps`` guards against.
    """
    return F.elu(x) + 1.0


# ---------------------------------------------------------------------------------------------
# the three forms
# ---------------------------------------------------------------------------------------------


@checked(check_linear_attention_call)
def parallel(q, k, v, *, eps: float = EPS, normalize: bool = True):
    """Causal linear attention as a masked ``T x T`` product (quadratic in ``T``).

    ``A = tril(Q K^T)``; the output is ``A V`` divided, row by row, by ``rowsum(A) + eps``
    (``rowsum(A)_t = q_t . sum_{s<=t} k_s``, the same denominator as the recurrence).

    Args:
        q, k: ``(B, H, T, Dk)`` non-negative features. v: ``(B, H, T, Dv)``.
        eps: a float ``> 0`` added to the denominator (see the module docstring).
        normalize: if False, return the numerator ``A V`` only.

    Returns:
        ``(o, (S, z))``: outputs ``(B, H, T, Dv)`` in the promoted input dtype, and the state
        after the last token, ``S = K^T V`` and ``z = sum_s k_s`` (compute dtype, at least
        float32), as the other forms return it.
    """
    out_dtype, dtype = v.dtype, torch.promote_types(v.dtype, torch.float32)  # state: >= float32
    q, k, v = (x.to(dtype) for x in (q, k, v))
    A = (q @ k.transpose(-1, -2)).tril()  # A[t, s] = q_t . k_s for s <= t
    o = A @ v
    if normalize:
        o = o / (A.sum(-1, keepdim=True) + eps)
    return o.to(out_dtype), (k.transpose(-1, -2) @ v, k.sum(-2))


@checked(check_linear_attention_call)
def recurrent(q, k, v, *, initial_state=None, eps: float = EPS, normalize: bool = True):
    """Causal linear attention token by token: the definition, the reference form.

    For each ``t``: ``S <- S + k_t^T v_t``, ``z <- z + k_t``, ``o_t = q_t S / (q_t . z + eps)``.

    Args:
        q, k: ``(B, H, T, Dk)`` non-negative features. v: ``(B, H, T, Dv)``.
        initial_state: optional ``(S, z)`` from a previous call, shapes ``(B, H, Dk, Dv)`` and
            ``(B, H, Dk)``.
        eps, normalize: as in :func:`parallel`.

    Returns:
        ``(o, (S, z))``: outputs ``(B, H, T, Dv)`` in the promoted input dtype, and the state
        after the last token (in the compute dtype, at least float32).
    """
    out_dtype, dtype = v.dtype, torch.promote_types(v.dtype, torch.float32)  # state: >= float32
    q, k, v = (x.to(dtype) for x in (q, k, v))
    (B, H, T, Dk), Dv = k.shape, v.shape[-1]
    S, z = (k.new_zeros(B, H, Dk, Dv), k.new_zeros(B, H, Dk)) if initial_state is None \
        else (initial_state[0].to(dtype), initial_state[1].to(dtype))
    o = torch.empty_like(v)
    for t in range(T):
        q_t, k_t, v_t = q[:, :, t], k[:, :, t], v[:, :, t]  # (B, H, D)
        S = S + k_t.unsqueeze(-1) * v_t.unsqueeze(-2)  # outer product k_t^T v_t
        z = z + k_t
        o[:, :, t] = (q_t.unsqueeze(-2) @ S).squeeze(-2)
        if normalize:
            o[:, :, t] /= (q_t * z).sum(-1, keepdim=True) + eps
    return o.to(out_dtype), (S, z)


@checked(check_linear_attention_call)
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
    out_dtype, dtype = v.dtype, torch.promote_types(v.dtype, torch.float32)  # state: >= float32
    q, k, v = (x.to(dtype) for x in (q, k, v))
    (B, H, T, Dk), Dv = k.shape, v.shape[-1]
    S, z = (k.new_zeros(B, H, Dk, Dv), k.new_zeros(B, H, Dk)) if initial_state is None \
        else (initial_state[0].to(dtype), initial_state[1].to(dtype))
    o = torch.empty_like(v)
    for start in range(0, T, chunk_size):
        c = slice(start, min(start + chunk_size, T))
        q_c, k_c, v_c = q[:, :, c], k[:, :, c], v[:, :, c]
        A = (q_c @ k_c.transpose(-1, -2)).tril()  # intra-chunk scores, causal
        o[:, :, c] = q_c @ S + A @ v_c  # earlier chunks through the state, this one directly
        if normalize:
            o[:, :, c] /= q_c @ z.unsqueeze(-1) + A.sum(-1, keepdim=True) + eps
        S = S + k_c.transpose(-1, -2) @ v_c
        z = z + k_c.sum(-2)
    return o.to(out_dtype), (S, z)


# ---------------------------------------------------------------------------------------------
# one decode step
# ---------------------------------------------------------------------------------------------


@checked(check_linear_decode_call)
def decode_step(q_t, k_t, v_t, *, initial_state=None, eps: float = EPS, normalize: bool = True,
                inplace: bool = False):
    """One decode step through the state: the fast form of :func:`recurrent` for one token.

    ``S <- S + k_t^T v_t``, ``z <- z + k_t``, ``o_t = q_t S / (q_t . z + eps)``, with no loop and,
    optionally, no new allocation. The work and the bytes touched are O(Dk Dv) whatever the
    context length: the step reads and writes the state, never the past tokens. Its argument
    check reads no value, so the step never waits for the device; the tests check it equals
    :func:`recurrent` token by token.

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
    out_dtype, dtype = v_t.dtype, torch.promote_types(v_t.dtype, torch.float32)  # state: >= float32
    q, k, v = (x.to(dtype) for x in (q_t, k_t, v_t))
    (B, H, T, Dk), Dv = k.shape, v.shape[-1]
    S, z = (k.new_zeros(B, H, Dk, Dv), k.new_zeros(B, H, Dk)) if initial_state is None \
        else (initial_state[0].to(dtype), initial_state[1].to(dtype))
    k_col, v_row = k.reshape(B * H, Dk, 1), v.reshape(B * H, 1, Dv)
    if inplace and S.is_contiguous() and z.is_contiguous():
        S.view(B * H, Dk, Dv).baddbmm_(k_col, v_row)  # S += k^T v with no new allocation
        z.add_(k[:, :, 0])
    else:
        S = torch.baddbmm(S.reshape(B * H, Dk, Dv), k_col, v_row).view(B, H, Dk, Dv)
        z = z + k[:, :, 0]
    o = q @ S  # (B, H, 1, Dv)
    if normalize:
        o = o / (q @ z.unsqueeze(-1) + eps)
    return o.to(out_dtype), (S, z)

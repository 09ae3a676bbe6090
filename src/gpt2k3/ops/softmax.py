r"""Causal softmax attention: the reference the linear mixers are measured against.

For queries, keys and values ``(B, H, T, D)`` and a scale ``s`` (by default ``1/sqrt(Dk)``,
GPT-2's), position ``t`` returns a weighted average of the values at positions ``<= t``:

.. math::

    o_t = \sum_{j \le t} \frac{\exp(s\, q_t \cdot k_j)}{\sum_{j' \le t} \exp(s\, q_t \cdot k_{j'})}\, v_j .

The exponential is taken *after* the dot product, so each weight couples one query with one
key and nothing can be summed ahead of time: a new query must meet every earlier key again.
That is why decoding keeps the keys and values of every earlier position in a KV cache, and why
each decode step reads all of them -- O(N D) bytes and work at context length N, where linear
attention reads a fixed D x D state.

Two functions:

* :func:`parallel` -- the fast form. The queries may be fewer than the keys: ``q`` holds the
  *last* ``Tq`` of the ``Tk`` positions in ``k`` and ``v`` (a chunk arriving after ``Tk - Tq``
  cached tokens), causal within the chunk and full over the past. A whole sequence
  (``Tq = Tk``), a prefill chunk, and one decode step (``Tq = 1``) are all this one call;
  PyTorch's ``scaled_dot_product_attention`` does the work.
* :func:`recurrent` -- the reference: one query at a time, an explicit loop over positions,
  straight from the formula above.

Unlike the linear mixers (which take features and apply no scale, see
:mod:`gpt2k3.ops.linear`), softmax attention is not invariant to the scale of its scores, so
the scale is an explicit argument; its default ``1/sqrt(Dk)`` makes :func:`parallel` equal to
GPT-2's attention.

Non-finite inputs are rejected with ``ValueError``: fused attention kernels do not all
propagate a NaN the same way (one turned a NaN query into zeros), so it is caught at the door.
That check reads every input once; ``benchmarks/`` time :func:`_attend`, the computation
after it.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from gpt2k3.checks import (
    check_attention_qkv,
    check_int,
    check_number,
    check_positive_float,
    compute_dtype,
    output_dtype,
)

__all__ = ["parallel", "recurrent", "causal_mask"]


def causal_mask(t: int, past: int, device=None) -> torch.Tensor:
    """Boolean mask ``(t, past + t)``: query ``i`` (absolute position ``past + i``) may attend to
    key ``j`` iff ``j <= past + i``.

    This is the mask a chunk of ``t`` tokens needs when it arrives after ``past`` cached tokens:
    every query sees the whole cache plus the new tokens up to itself.
    """
    t = check_int(t, "t", 0)
    past = check_int(past, "past", 0)
    q_pos = torch.arange(past, past + t, device=device)[:, None]
    k_pos = torch.arange(past + t, device=device)[None, :]
    return k_pos <= q_pos


def _check_args(q, k, v, scale, finite_kv: bool = True):
    dims = check_attention_qkv(q, k, v, finite_kv)
    scale = check_positive_float(scale, "scale", none_ok=True)
    return dims, (1.0 / math.sqrt(dims[4]) if scale is None else scale)


def parallel(q, k, v, *, scale: float | None = None, dropout_p: float = 0.0,
             check_kv: bool = True) -> torch.Tensor:
    """Causal softmax attention of the last ``Tq`` positions over all ``Tk``.

    ``A = softmax(s Q K^T + M)``, ``O = A V``, where ``M`` lets query ``i`` (absolute position
    ``Tk - Tq + i``) see keys ``0 .. Tk - Tq + i``: causal within the chunk, everything before it.

    Args:
        q: ``(B, H, Tq, Dk)``. k: ``(B, H, Tk, Dk)`` with ``Tk >= Tq``. v: ``(B, H, Tk, Dv)``.
        scale: multiplies the scores; ``None`` means ``1/sqrt(Dk)``.
        dropout_p: attention-weight dropout probability in ``[0, 1)`` (training only; ``0``
            makes the function deterministic).
        check_kv: check that ``k`` and ``v`` are finite (shapes and dtypes are always
            checked, and ``q`` always). A layer reading a KV cache passes ``False``: the cache
            checked each entry once when it was written, and scanning the whole cache again
            on every decode step would cost as much as the attention itself.

    Returns:
        ``o`` of shape ``(B, H, Tq, Dv)``, in the promoted input dtype (computed in it too: the
        kernels accumulate half-precision inputs in float32 themselves, and casting a long KV
        cache up would copy it on every decode step).
    """
    if not isinstance(check_kv, bool):
        raise ValueError(f"check_kv must be a bool, got {check_kv!r}")
    (B, H, Tq, Tk, Dk, Dv), scale = _check_args(q, k, v, scale, check_kv)
    dropout_p = check_number(dropout_p, "dropout_p", 0.0, 1.0, what="a float in [0, 1)")
    if dropout_p == 1.0:
        raise ValueError(f"dropout_p must be a float in [0, 1), got {dropout_p!r}")
    dtype = output_dtype(q, k, v)
    if Tq == 0:
        return q.new_zeros(B, H, 0, Dv, dtype=dtype)
    return _attend(q.to(dtype), k.to(dtype), v.to(dtype), scale, dropout_p)


def _attend(q, k, v, scale: float, dropout_p: float = 0.0) -> torch.Tensor:
    """:func:`parallel` after validation: inputs of one dtype, ``Tk >= Tq >= 1``."""
    Tq, Tk = q.shape[2], k.shape[2]
    if Tq == Tk:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale,
                                              dropout_p=dropout_p)
    if Tq == 1:
        # One query at the newest position sees every key: no mask.
        if dropout_p == 0.0 and q.device.type == "cpu":
            # Two plain matmuls, because SDPA's CPU kernel dispatches to the thread pool even
            # for a single query, which costs more than the whole product at short contexts.
            # (On a GPU, SDPA's fused kernel reads the cache once at full bandwidth: keep it.)
            weights = ((q @ k.transpose(-1, -2)) * scale).softmax(dim=-1)
            return weights @ v
        return F.scaled_dot_product_attention(q, k, v, scale=scale, dropout_p=dropout_p)
    mask = causal_mask(Tq, Tk - Tq, device=q.device)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale,
                                          dropout_p=dropout_p)


def recurrent(q, k, v, *, scale: float | None = None) -> torch.Tensor:
    """Causal softmax attention one query at a time: the definition.

    For each query ``i`` (absolute position ``p = Tk - Tq + i``): scores ``s q_i . k_j`` for
    ``j <= p``, their softmax, and the weighted sum of ``v_0 .. v_p``. Shares nothing with
    :func:`parallel` but argument validation.

    Args:
        q, k, v, scale: as in :func:`parallel`.

    Returns:
        ``o`` of shape ``(B, H, Tq, Dv)`` in the promoted input dtype (computed in at least
        float32).
    """
    (B, H, Tq, Tk, Dk, Dv), scale = _check_args(q, k, v, scale)
    cdt, odt = compute_dtype(q, k, v), output_dtype(q, k, v)
    q, k, v = q.to(cdt), k.to(cdt), v.to(cdt)
    past = Tk - Tq
    o = q.new_empty(B, H, Tq, Dv)
    for i in range(Tq):
        p = past + i  # the query's absolute position
        scores = (k[:, :, : p + 1] * q[:, :, i : i + 1]).sum(-1) * scale  # (B, H, p + 1)
        scores = scores - scores.amax(-1, keepdim=True)
        w = scores.exp()
        w = w / w.sum(-1, keepdim=True)
        o[:, :, i] = (w.unsqueeze(-1) * v[:, :, : p + 1]).sum(-2)
    return o.to(odt)

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

Each form checks its arguments at its door (:func:`gpt2k3.checks.checked` with
:func:`gpt2k3.checks.check_attention`, outside the body), which reads shapes and dtypes but no
value: it never waits for the device, so a decode step can afford it, and the public function
is the one to time. Whether the values are finite is checked at the
front doors -- a layer's input, and a KV cache when an entry is written -- not here, where it
would read the whole cache again on every decode step.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gpt2k3.checks import check_attention, check_int, checked, compute_dtype

__all__ = ["parallel", "recurrent", "causal_mask"]


def causal_mask(t: int, past: int, device=None) -> torch.Tensor:
    """Boolean mask ``(t, past + t)``: query ``i`` (absolute position ``past + i``) may attend to
    key ``j`` iff ``j <= past + i``.

    This is the mask a chunk of ``t`` tokens needs when it arrives after ``past`` cached tokens:
    every query sees the whole cache plus the new tokens up to itself.
    """
    t, past = check_int(t, "t", 0), check_int(past, "past", 0)
    q_pos = torch.arange(past, past + t, device=device)[:, None]
    k_pos = torch.arange(past + t, device=device)[None, :]
    return k_pos <= q_pos


@checked(check_attention)
def parallel(q, k, v, *, scale: float | None = None, dropout_p: float = 0.0) -> torch.Tensor:
    """Causal softmax attention of the last ``Tq`` positions over all ``Tk``: the fast form.
    ``q (B, H, Tq, Dk)``, ``k (B, H, Tk, Dk)`` with ``Tk >= Tq``, ``v (B, H, Tk, Dv)``, one dtype;
    ``scale`` ``None`` means ``1/sqrt(Dk)``. Returns ``(B, H, Tq, Dv)`` in the input dtype (the
    kernels accumulate half precision in float32; casting a long cache up would copy it)."""
    Tq, Tk = q.shape[2], k.shape[2]
    if Tq == Tk:  # a whole sequence: plain causal attention
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale,
                                              dropout_p=dropout_p)
    if Tq == 1 and dropout_p == 0.0 and q.device.type == "cpu":
        # A decode step on a CPU: two plain matmuls, because SDPA's CPU kernel dispatches to the
        # thread pool even for one query, which costs more than the product at short contexts.
        # (On a GPU, SDPA's fused kernel reads the cache once at full bandwidth: keep it.)
        s = q.shape[-1] ** -0.5 if scale is None else scale
        return ((q @ k.transpose(-1, -2)) * s).softmax(dim=-1) @ v
    # one query at the newest position sees every key; a chunk after a cache needs the mask
    mask = None if Tq == 1 else causal_mask(Tq, Tk - Tq, device=q.device)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale,
                                          dropout_p=dropout_p)


@checked(check_attention)
def recurrent(q, k, v, *, scale: float | None = None) -> torch.Tensor:
    """Causal softmax attention one query at a time: the definition, the reference form.

    Query ``t`` (absolute position ``p = Tk - Tq + t``) meets the cache of every key and value
    up to ``p``: scores ``s q_t . k_j``, their softmax, the weighted sum of ``v_0 .. v_p``. Shares
    nothing with :func:`parallel` but the door's argument check.

    Args:
        q, k, v, scale: as in :func:`parallel`.

    Returns:
        ``o`` of shape ``(B, H, Tq, Dv)`` in the input dtype (computed in at least float32).
    """
    dtype, scale = q.dtype, q.shape[-1] ** -0.5 if scale is None else scale
    q, k, v = (x.to(compute_dtype(q)) for x in (q, k, v))
    past = k.shape[2] - q.shape[2]  # keys cached before the first query
    o = q.new_empty(*q.shape[:3], v.shape[-1])
    for t in range(q.shape[2]):
        q_t = q[:, :, t]  # (B, H, D)
        K, V = k[:, :, : past + t + 1], v[:, :, : past + t + 1]  # the cache: a row per token
        w = ((K @ q_t.unsqueeze(-1)).squeeze(-1) * scale).softmax(-1)  # (B, H, past + t + 1)
        o[:, :, t] = (w.unsqueeze(-2) @ V).squeeze(-2)  # read: w V
    return o.to(dtype)

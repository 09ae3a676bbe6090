r"""Causal softmax attention: the reference the linear mixers are measured against.

For queries, keys and values ``(B, H, T, D)`` and a scale ``s`` (by default ``1/sqrt(Dk)``,
GPT-2's), position ``t`` returns a weighted average of the values at positions ``<= t``:

.. math::

    o_t = \sum_{j \le t} \frac{\exp(s\, q_t \cdot k_j)}{\sum_{j' \le t} \exp(s\, q_t \cdot k_{j'})}\, v_j .

The exponential is taken *after* the dot product, so each weight couples one query with one
key and nothing can be summed ahead of time: a new query must meet every earlier key again.
That is why decoding keeps the keys and values of every earlier position in a
:class:`gpt2k3.kv_cache.KVCache`, and why each decode step reads all of them -- O(N D) bytes and
work at context length N, where linear attention reads a fixed D x D state.

Two functions:

* :func:`parallel` -- the masked ``T x T`` form, written out (no fused kernel), the definition;
* :func:`decode_step` -- one new query against the keys and values in a ``KVCache``: the
  per-token cost that chapter 3's benchmark sets against the linear state update.

Unlike the linear mixers (which take features and apply no scale, see
:mod:`gpt2k3.mixers.linear`), softmax attention is not invariant to the scale of its scores, so
the scale is an explicit argument; its default ``1/sqrt(Dk)`` makes :func:`parallel` equal to
``F.scaled_dot_product_attention(q, k, v, is_causal=True)`` and to GPT-2's attention.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .._validate import check_qkv, check_tensor, compute_dtype, output_dtype
from ..kv_cache import KVCache

__all__ = ["parallel", "decode_step"]


def _check_scale(scale, dk: int) -> float:
    if scale is None:
        return 1.0 / math.sqrt(dk)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale) \
            or scale <= 0:
        raise ValueError(f"scale must be None or a finite float > 0, got {scale!r}")
    return float(scale)


def parallel(q, k, v, scale: float | None = None) -> torch.Tensor:
    """Causal softmax attention over a whole sequence, as a masked ``T x T`` product.

    ``A = softmax(s Q K^T + M)`` with ``M`` the causal mask (``-inf`` above the diagonal),
    then ``O = A V``. Quadratic in ``T`` in time and memory; it is the definition the
    cached decode step is tested against, not a fast kernel.

    Args:
        q, k: ``(B, H, T, Dk)``. v: ``(B, H, T, Dv)``.
        scale: multiplies the scores; ``None`` means ``1/sqrt(Dk)``.

    Returns:
        ``o`` of shape ``(B, H, T, Dv)``, in the promoted input dtype (computed in at least
        float32).
    """
    B, H, T, Dk, Dv = check_qkv(q, k, v)
    scale = _check_scale(scale, Dk)
    cdt, odt = compute_dtype(q, k, v), output_dtype(q, k, v)
    q, k, v = (x.to(cdt) for x in (q, k, v))
    scores = (q @ k.transpose(-1, -2)) * scale
    future = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
    weights = scores.masked_fill(future, float("-inf")).softmax(dim=-1)
    return (weights @ v).to(odt)


def decode_step(q_t, cache, layer: int, k_t=None, v_t=None, scale: float | None = None) -> torch.Tensor:
    """One decode step of softmax attention: query ``q_t`` against a :class:`~gpt2k3.kv_cache.KVCache`.

    The query attends to every position the cache holds for ``layer``:

    * called as ``decode_step(q_t, cache, layer)``, the filled positions ``0 .. cache.length-1``
      (the new token's own key and value must already be among them);
    * with ``k_t`` and ``v_t`` (each ``(B, H, 1, D)``), those are first written at position
      ``cache.length`` with :meth:`KVCache.update`, and the query attends to
      ``0 .. cache.length`` -- itself included. As with ``update``, the length pointer is not
      moved: call ``cache.advance(1)`` once every layer has written (the model does this).

    Either way the step reads all ``N`` cached keys and values of the layer: O(N D) work and
    bytes, growing with the context, which is the cost linear attention removes. It runs
    ``F.scaled_dot_product_attention`` on the cached views (no mask is needed: one query at
    the newest position may see everything before it), so it is as fast as PyTorch makes it.

    Args:
        q_t: ``(B, H, 1, D)`` with the cache's batch, heads, head dim, dtype and device.
        cache: a :class:`gpt2k3.kv_cache.KVCache`.
        layer: which layer's keys and values to read.
        k_t, v_t: optional key and value of the new token, written before reading.
        scale: as in :func:`parallel`.

    Returns:
        ``o_t`` of shape ``(B, H, 1, D)``; it equals the last row of :func:`parallel` over the
        cached sequence.
    """
    if not isinstance(cache, KVCache):
        raise ValueError(f"cache must be a gpt2k3.kv_cache.KVCache, got {type(cache).__name__}")
    check_tensor(q_t, "q_t", 4)
    B, H, D = cache.batch, cache.n_head, cache.head_dim
    if tuple(q_t.shape) != (B, H, 1, D):
        raise ValueError(f"q_t must have shape (B, H, 1, D) = ({B}, {H}, 1, {D}) to match the cache; "
                         f"got {tuple(q_t.shape)}")
    if not 0 <= layer < cache.n_layer:
        raise ValueError(f"layer must be in [0, {cache.n_layer}), got {layer!r}")
    buf = cache.k[layer]
    if q_t.dtype != buf.dtype or q_t.device != buf.device:
        raise ValueError(f"q_t must have the cache's dtype {buf.dtype} and device {buf.device}; "
                         f"got {q_t.dtype} on {q_t.device}")
    if (k_t is None) != (v_t is None):
        raise ValueError("k_t and v_t must be given together (or neither)")
    if k_t is not None:
        for name, x in (("k_t", k_t), ("v_t", v_t)):
            check_tensor(x, name, 4)
            if tuple(x.shape) != (B, H, 1, D):
                raise ValueError(f"{name} must have shape (B, H, 1, D) = ({B}, {H}, 1, {D}); "
                                 f"got {tuple(x.shape)}")
        keys, values = cache.update(layer, k_t, v_t)
    else:
        if cache.length == 0:
            raise ValueError("the cache is empty: pass k_t and v_t, or fill the cache first")
        keys, values = cache.k[layer][:, :, :cache.length], cache.v[layer][:, :, :cache.length]
    return F.scaled_dot_product_attention(q_t, keys, values, scale=_check_scale(scale, D))

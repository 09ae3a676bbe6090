"""The source worklog's snippets, reproduced with their bugs so the book can run, show and fix
them. Nothing in the package calls these; each names the correct form that replaces it:

* :func:`seed_cached_attention` -- the cached attention, right for the two cases its comments
  name (a prefill into an empty cache, one-token decode steps), which leaves the mask of a chunk
  arriving after the cache to its caller (:func:`gpt2k3.ops.softmax.parallel` builds
  :func:`gpt2k3.ops.softmax.causal_mask` itself);
* :func:`seed_prefill` -- linear attention's prefill as the worklog wrote it, its normaliser
  repaired so that it runs at all, which leaves its causality bug (correct:
  :func:`gpt2k3.ops.linear.chunkwise`);
* :func:`seed_one_shot` -- the delta rule applied to a whole sequence in one update (correct
  only for one token: :func:`gpt2k3.ops.delta.recurrent`).
"""

from __future__ import annotations

import torch

from gpt2k3.checks import check_delta_rule_call, check_linear_attention_call, checked
from gpt2k3.ops.linear import EPS


def seed_cached_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                          mask: torch.Tensor | None = None,
                          past_kv: tuple[torch.Tensor, torch.Tensor] | None = None
                          ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """The seed article's cached attention: right for a prefill into an empty cache and for
    one-token decode steps, the two cases its comments name; a chunk after the cache needs a mask
    from its caller.

    The snippet's attention between its projections, with its arguments in its order: ``q, k, v``
    ``(B, H, t, D)`` stand for what its ``qkv_proj`` produces, and the heads' outputs are returned
    before its ``o_proj``. It concatenates the cache and builds the causal mask *only while the
    cache is empty*. It also applies an optional boolean ``mask`` from the caller (``True`` where a
    query may see a key, as :func:`gpt2k3.ops.softmax.causal_mask` returns it), but nothing in it
    builds the ``t x (p + t)`` mask that a chunk of ``t > 1`` tokens needs after ``p`` cached ones.
    A whole prompt and one-token decode steps are right; a chunk after a non-empty cache whose
    caller passes no mask lets every token attend to the chunk's later tokens -- its future. That
    case is outside what the snippet claims; :func:`gpt2k3.ops.softmax.parallel` covers it by
    building the offset mask itself.
    """
    if past_kv is not None:
        k = torch.cat((past_kv[0], k), dim=2)
        v = torch.cat((past_kv[1], v), dim=2)
    scores = (q @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5
    if past_kv is None:  # the only mask it builds: a chunk after a cache needs the caller's
        t = q.shape[2]
        causal = torch.triu(torch.ones(t, t, dtype=torch.bool, device=q.device), diagonal=1)
        scores = scores.masked_fill(causal, float("-inf"))
    if mask is not None:  # the caller's, if any: nothing here builds one for a chunk
        scores = scores.masked_fill(~mask, float("-inf"))
    return scores.softmax(-1) @ v, (k, v)


@checked(check_linear_attention_call)
def seed_prefill(q, k, v, *, eps: float = EPS):
    """The seed article's one-shot prefill, repaired only so that it runs -- WRONG for ``T > 1``.

    As written, the seed's snippet cannot prefill at all. It transposes the keys,
    ``k = k.transpose(-1, -2)`` (``(B, H, D, T)``), and then ``S = S + k @ v`` is right (the
    ``D x D`` sum over the tokens), but ``z = z + k`` keeps the transposed keys: ``z`` has shape
    ``(B, H, D, T)`` and is never summed over the tokens, so ``denom = q @ z`` is ``T x T`` and
    ``o / denom`` raises a broadcast error whenever ``1 < T != d_head`` (when they are equal it
    divides by a ``T x T`` matrix, elementwise). Here the normaliser is repaired,
    ``z = k.sum(-2)``, to show the bug that remains: the state is built from the whole prompt
    at once, ``S = K^T V = sum_s k_s^T v_s``, and only then read at every position,
    ``o_t = q_t S / (q_t . z + eps)``. Each output therefore sees *future* tokens: it is not
    causal. The final state ``(S, z)`` and the last output are nevertheless the correct ones,
    which is why the bug is easy to miss. (The ``eps`` is not in the seed either; it is added so
    that causality is the only difference from :func:`gpt2k3.ops.linear.parallel`.)

    Returns:
        ``(o, (S, z))``.
    """
    out_dtype, dtype = v.dtype, torch.promote_types(v.dtype, torch.float32)
    q, k, v = (x.to(dtype) for x in (q, k, v))
    S = k.transpose(-1, -2) @ v  # (B, H, Dk, Dv): all T tokens, the future included
    z = k.sum(-2)  # repaired: the seed's z = z + k is (B, H, Dk, T), never summed over tokens
    o = (q @ S) / (q @ z.unsqueeze(-1) + eps)
    return o.to(out_dtype), (S, z)


@checked(check_delta_rule_call)
def seed_one_shot(q, k, v, beta, *, initial_state=None):
    """The seed article's DeltaNet snippet applied to a whole sequence at once -- wrong for ``T > 1``.

    It reads every old value from the *incoming* state, ``V_old = K S0``, writes all corrections
    together, ``S = S0 + K^T (beta * (V - V_old))`` (``K^T diag(beta) V`` from a zero state), and
    reads ``O = Q S``: the delta rule for one token; for ``T > 1`` no token sees the writes of the
    earlier ones (and each output sees later ones'). The snippet starts from ``S = 0.0``, which
    ``k @ S`` rejects: here a zero matrix. Correct form: :func:`gpt2k3.ops.delta.recurrent`.

    Returns:
        ``(o, S)``.
    """
    out_dtype, dtype = v.dtype, torch.promote_types(v.dtype, torch.float32)
    q, k, v, beta = (x.to(dtype) for x in (q, k, v, beta))
    B, H, T, Dk = k.shape
    S0 = k.new_zeros(B, H, Dk, v.shape[-1]) if initial_state is None else initial_state.to(dtype)
    v_old = k @ S0  # every old value read from the incoming state
    U = beta.unsqueeze(-1) * (v - v_old)
    S = S0 + k.transpose(-1, -2) @ U
    return (q @ S).to(out_dtype), S

"""The source worklog's snippets, reproduced with their bugs so the book can run, show and fix
them. Nothing in the package calls these; each names the correct form that replaces it:

* :func:`seed_cached_attention` -- the cached attention whose mask ignores the cache
  (correct: :func:`gpt2k3.ops.softmax.parallel` with :func:`gpt2k3.ops.softmax.causal_mask`);
* :func:`seed_prefill` -- linear attention's prefill as the worklog wrote it, its normaliser
  repaired so it runs (correct: :func:`gpt2k3.ops.linear.parallel`);
* :func:`seed_one_shot` -- the delta rule applied to a whole sequence in one update (correct
  only for one token: :func:`gpt2k3.ops.delta.recurrent`).
"""

from __future__ import annotations

import torch

from gpt2k3.checks import check_delta_rule, compute_dtype, output_dtype
from gpt2k3.ops.linear import EPS, _check


def seed_cached_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                          past_kv: tuple[torch.Tensor, torch.Tensor] | None = None
                          ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """The seed article's cached attention, reproduced to show its masking bug.

    It concatenates the cache and applies the causal mask *only when the cache is
    empty*.  That is right for a whole-prompt prefill and for one-token decode steps,
    but a chunk of ``t > 1`` tokens arriving after a non-empty cache lets every token
    of the chunk attend to the chunk's later tokens — its future.  Compare
    :func:`causal_mask`, which the model uses.  Shapes ``(B, H, t, D)``.
    """
    if past_kv is not None:
        k = torch.cat((past_kv[0], k), dim=2)
        v = torch.cat((past_kv[1], v), dim=2)
    scores = (q @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5
    if past_kv is None:  # the bug: no mask once a cache exists
        t = q.shape[2]
        scores = scores.masked_fill(torch.triu(torch.ones(t, t, dtype=torch.bool), 1), float("-inf"))
    return scores.softmax(-1) @ v, (k, v)


def seed_prefill(q, k, v, *, eps: float = EPS):
    """The seed article's one-shot prefill -- deliberately WRONG for ``T > 1``.

    It builds the state from the whole prompt at once, ``S = K^T V = sum_s k_s^T v_s`` and
    ``z = sum_s k_s``, and only then reads every position with it:
    ``o_t = q_t S / (q_t . z + eps)``. Each output therefore sees *future* tokens; it is not
    causal. The final state ``(S, z)`` is nevertheless the correct one, which is why the bug is
    easy to miss. (The ``eps`` is not in the seed; it is added so that causality is the only
    difference from :func:`parallel`.)

    Returns:
        ``(o, (S, z))``.
    """
    _, eps, _, _ = _check(q, k, v, None, eps, True)
    cdt, odt = compute_dtype(q, k, v), output_dtype(q, k, v)
    q, k, v = q.to(cdt), k.to(cdt), v.to(cdt)
    S = k.transpose(-1, -2) @ v  # (B, H, Dk, Dv): all T tokens, including the future
    z = k.sum(-2)  # (B, H, Dk)
    o = (q @ S) / (q @ z.unsqueeze(-1) + eps)
    return o.to(odt), (S, z)


def seed_one_shot(q, k, v, beta, *, initial_state=None):
    """The seed article's DeltaNet snippet applied to a whole sequence at once -- wrong for ``T > 1``.

    It reads every old value from the *incoming* state, ``V_old = K S0``, writes all corrections
    together, ``S = S0 + K^T (beta * (V - V_old))``, and reads ``O = Q S``. For one token this is
    exactly the delta rule; for ``T > 1`` each token ignores what the earlier tokens of the same
    call wrote (and each output also sees later tokens' writes), so it differs from
    :func:`recurrent`. Arguments as in :func:`recurrent`.

    Returns:
        ``(o, S)``.
    """
    B, H, T, Dk, Dv = check_delta_rule(q, k, v, beta, initial_state)
    cdt, odt = compute_dtype(q, k, v, beta, initial_state), output_dtype(q, k, v)
    q, k, v, beta = q.to(cdt), k.to(cdt), v.to(cdt), beta.to(cdt)
    S0 = q.new_zeros(B, H, Dk, Dv) if initial_state is None else initial_state.to(cdt)
    v_old = k @ S0
    U = beta.unsqueeze(-1) * (v - v_old)
    S = S0 + k.transpose(-1, -2) @ U
    return (q @ S).to(odt), S

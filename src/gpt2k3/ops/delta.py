r"""DeltaNet: linear attention whose state is written with the delta rule.

Plain linear attention only ever *adds* ``k_t^T v_t`` to its state, so associations pile up and
interfere. The delta rule (Widrow & Hoff; Schlag et al., 2021, "Linear Transformers Are Secretly
Fast Weight Programmers") first reads what the state currently returns for the key and writes
only the correction, with a per-token strength ``beta_t``:

.. math::

    v^{\text{old}}_t = k_t S_{t-1}, \qquad
    u_t = \beta_t \,(v_t - v^{\text{old}}_t), \qquad
    S_t = S_{t-1} + k_t^\top u_t, \qquad
    o_t = q_t S_t .

Equivalently ``S_t = (I - beta_t k_t^T k_t) S_{t-1} + beta_t k_t^T v_t``: for a unit key and
``beta = 1`` the old value stored under ``k_t`` is replaced exactly.

:func:`recurrent` is this definition, token by token. :func:`chunkwise` computes the same thing
a chunk of ``C`` tokens at a time (Yang et al., 2024, "Parallelizing Linear Transformers with the
Delta Rule over Sequence Length"). Inside a chunk entered with state ``S``, unrolling the rule
gives ``u_i = beta_i (v_i - k_i S - sum_{j<i} (k_i . k_j) u_j)``: a lower-triangular linear
system for all ``u`` at once,

.. math::

    (I + \operatorname{tril}(\operatorname{diag}(\beta) K K^\top, -1))\, U_{\text{new}}
    = \operatorname{diag}(\beta)\,(V - K S).

With ``T_c = (I + tril(diag(beta) K K^T, -1))^{-1} diag(beta)`` (the "UT transform"),
``W = T_c K`` and ``U = T_c V`` do not depend on the state (the WY representation), so
``U_new = U - W S``, and then

.. math::

    O = Q S + \operatorname{tril}(Q K^\top)\, U_{\text{new}}, \qquad
    S \leftarrow S + K^\top U_{\text{new}} .

The unit lower-triangular matrix is inverted blockwise (a triangular solve only on small
diagonal blocks, batched matrix products for the rest), and the work that does not depend on the
state -- all of the above except ``U_new`` and the state update -- is batched over many chunks at
once; only ``T / C`` small steps remain sequential.

**Why ``beta |k|^2`` is in [0, 2].** One step multiplies the state by ``I - beta_t k_t^T k_t``,
which has eigenvalue ``1 - beta_t |k_t|^2`` along ``k_t`` and 1 elsewhere. For a unit key,
``beta = 1`` replaces the stored value (a projection), ``beta = 2`` reflects it (a Householder
reflection), and outside ``[0, 2]`` the eigenvalue leaves ``[-1, 1]`` and repeated writes amplify
what is stored until the state overflows (keys of norm 10 with ``beta = 1`` give an all-NaN
state within a few hundred tokens). Every function here raises ``ValueError`` unless
``beta_t |k_t|^2`` is in ``[0, 2]`` for every token (with a relative slack for rounding): the
layers L2-normalise the keys and take ``beta`` from a sigmoid, so ``beta in [0, 1]``.

The two forms share nothing but argument validation: :func:`recurrent` is a plain token loop
written here, and :func:`chunkwise` runs the chunked core in the private module
``gpt2k3.ops._chunked``, which also serves :mod:`gpt2k3.ops.gated_delta` (DeltaNet is the
gated delta rule with no decay). For the chapter that derives the chunkwise form, its pieces
-- :func:`~gpt2k3.ops.wy.householder_product`, :func:`~gpt2k3.ops.wy.wy_representation`,
:func:`~gpt2k3.ops.wy.ut_transform` and the cost model
:func:`~gpt2k3.ops.wy.chunkwise_cost` -- live in :mod:`gpt2k3.ops.wy` and are re-exported
here, so ``gpt2k3.ops.delta.ut_transform`` works too.

:func:`seed_one_shot` is the seed article's snippet applied to a whole sequence at once; it is
the delta rule only for ``T = 1``.
"""

from __future__ import annotations

from gpt2k3.checks import (
    check_chunk_size,
    check_delta_rule,
    compute_dtype,
    output_dtype,
)
from gpt2k3.ops._chunked import chunked
from gpt2k3.ops.wy import (
    ChunkCost,
    chunkwise_cost,
    householder_product,
    ut_transform,
    wy_representation,
)

__all__ = ["recurrent", "chunkwise", "householder_product", "wy_representation", "ut_transform", "ChunkCost", "chunkwise_cost"]


def recurrent(q, k, v, beta, *, initial_state=None):
    """DeltaNet token by token: the definition (see the module docstring).

    For each ``t``: ``u = beta_t (v_t - k_t S)``, ``S <- S + k_t^T u``, ``o_t = q_t S``.

    Args:
        q, k: ``(B, H, T, Dk)``, already normalised (the layer L2-normalises them); no scale.
        v: ``(B, H, T, Dv)``.
        beta: ``(B, H, T)`` write strengths with ``beta * |k|^2`` in ``[0, 2]`` (for unit keys,
            ``beta`` in ``[0, 2]``, usually ``[0, 1]`` from a sigmoid); ``ValueError`` otherwise.
        initial_state: optional ``(B, H, Dk, Dv)`` state from a previous call.

    Returns:
        ``(o, S)``: outputs ``(B, H, T, Dv)`` in the promoted input dtype, and the state after
        the last token (in the compute dtype, at least float32).
    """
    B, H, T, Dk, Dv = check_delta_rule(q, k, v, beta, initial_state)
    cdt, odt = compute_dtype(q, k, v, beta, initial_state), output_dtype(q, k, v)
    q, k, v, beta = q.to(cdt), k.to(cdt), v.to(cdt), beta.to(cdt)
    S = q.new_zeros(B, H, Dk, Dv) if initial_state is None else initial_state.to(cdt)
    o = q.new_empty(B, H, T, Dv)
    for t in range(T):
        k_t = k[:, :, t]  # (B, H, Dk)
        v_old = (k_t.unsqueeze(-2) @ S).squeeze(-2)  # what the state returns for k_t now
        u = beta[:, :, t, None] * (v[:, :, t] - v_old)  # the correction to write
        S = S + k_t.unsqueeze(-1) * u.unsqueeze(-2)  # outer product k_t^T u
        o[:, :, t] = (q[:, :, t].unsqueeze(-2) @ S).squeeze(-2)
    return o.to(odt), S


def chunkwise(q, k, v, beta, *, initial_state=None, chunk_size: int = 64):
    """DeltaNet a chunk at a time (WY representation / UT transform); equals :func:`recurrent`.

    Args:
        q, k, v, beta, initial_state: as in :func:`recurrent`.
        chunk_size: tokens per chunk, a positive int; ``T`` need not be a multiple of it.

    Returns:
        ``(o, S)`` as in :func:`recurrent`.
    """
    chunk_size = check_chunk_size(chunk_size)
    B, H, T, Dk, Dv = check_delta_rule(q, k, v, beta, initial_state)
    cdt, odt = compute_dtype(q, k, v, beta, initial_state), output_dtype(q, k, v)
    S0 = q.new_zeros(B, H, Dk, Dv, dtype=cdt) if initial_state is None else initial_state.to(cdt)
    o, S = chunked(q.to(cdt), k.to(cdt), v.to(cdt), beta.to(cdt), None, S0, chunk_size)
    return o.to(odt), S



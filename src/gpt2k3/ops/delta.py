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

Three forms compute this. :func:`recurrent` is the definition, token by token.
:func:`chunkwise_reference` is the derivation above in plain steps, one chunk after another (a
triangular solve per chunk). :func:`chunkwise` is the fast form, a loop over groups of chunks
that calls the two steps of :mod:`gpt2k3.ops.chunks`: the UT/WY step
(:func:`~gpt2k3.ops.chunks.intra_chunk`) for every chunk of a group at once, then the state
pass (:func:`~gpt2k3.ops.chunks.pass_state`), the only sequential part, ``T / C`` small steps;
the outputs of the group follow in one batch. Gated DeltaNet and KDA thread their decays
through the same steps (:mod:`gpt2k3.ops.gated_delta`). The tests hold all three forms equal,
and equal to flash-linear-attention's references.

Each form is a pure body: it casts its inputs to float32 or wider, creates its state, and does
its arithmetic. Its arguments are checked once, at its door (:func:`gpt2k3.checks.checked` with
:func:`gpt2k3.checks.check_delta_rule_call`, or :func:`gpt2k3.checks.check_chunkwise_call` where
there is a ``chunk_size``), which reads shapes and dtypes but never a value, so no call waits on
the device. The values are the caller's contract: the layers produce unit keys,
``beta`` from a sigmoid and ``g <= 0`` by construction, and
:func:`gpt2k3.checks.check_write_strength` names a write strength outside the range below.

**Why ``beta |k|^2`` is in [0, 2].** One step multiplies the state by ``I - beta_t k_t^T k_t``,
which has eigenvalue ``1 - beta_t |k_t|^2`` along ``k_t`` and 1 elsewhere. For a unit key,
``beta = 1`` replaces the stored value (a projection), ``beta = 2`` reflects it (a Householder
reflection), and outside ``[0, 2]`` the eigenvalue leaves ``[-1, 1]`` and repeated writes amplify
what is stored until the state overflows (keys of norm 10 with ``beta = 1`` give an all-NaN
state within a few hundred tokens). The layers L2-normalise the keys and take ``beta`` from a
sigmoid, so ``beta in [0, 1]``; :func:`gpt2k3.checks.check_write_strength` checks the range
for inputs from elsewhere (it reads every value, so the ops' doors do not run it).

For the chapter that derives the chunkwise form, its pieces --
:func:`~gpt2k3.ops.wy.householder_product`, :func:`~gpt2k3.ops.wy.wy_representation`,
:func:`~gpt2k3.ops.wy.ut_transform` and the cost model :func:`~gpt2k3.ops.wy.chunkwise_cost` --
live in :mod:`gpt2k3.ops.wy` and are re-exported here, so ``gpt2k3.ops.delta.ut_transform``
works too. The seed article's one-shot write, :func:`gpt2k3.seed.seed_one_shot`, is the delta
rule only for ``T = 1``.
"""

from __future__ import annotations

import torch

from gpt2k3.checks import check_chunkwise_call, check_delta_rule_call, checked
from gpt2k3.ops.chunks import as_chunks, chunk_spans, intra_chunk, pass_state
from gpt2k3.ops.wy import (
    ChunkCost,
    chunkwise_cost,
    householder_product,
    ut_transform,
    wy_representation,
)

__all__ = ["recurrent", "chunkwise_reference", "chunkwise", "householder_product", "wy_representation", "ut_transform", "ChunkCost", "chunkwise_cost"]


@checked(check_delta_rule_call)
def recurrent(q, k, v, beta, *, initial_state=None):
    """DeltaNet token by token, the definition: ``u = beta_t (v_t - k_t S)``, ``S <- S + k_t^T u``,
    ``o_t = q_t S``. ``q, k (B, H, T, Dk)`` normalised (no scale), ``v (B, H, T, Dv)``, ``beta
    (B, H, T)`` with ``beta |k|^2`` in ``[0, 2]``, ``initial_state (B, H, Dk, Dv)`` or None.
    Returns ``(o, S)``: ``o`` in the inputs' dtype, the final state ``S`` in at least float32."""
    out_dtype, dtype = v.dtype, torch.promote_types(v.dtype, torch.float32)  # state: >= float32
    q, k, v, beta = (x.to(dtype) for x in (q, k, v, beta))
    B, H, T, Dk = k.shape
    S = k.new_zeros(B, H, Dk, v.shape[-1]) if initial_state is None else initial_state.to(dtype)
    o = torch.empty_like(v)
    for t in range(T):
        q_t, k_t, v_t = q[:, :, t], k[:, :, t], v[:, :, t]  # (B, H, D)
        v_old = (k_t.unsqueeze(-2) @ S).squeeze(-2)  # what the state returns for k_t now
        u = beta[:, :, t, None] * (v_t - v_old)  # write only the correction
        S = S + k_t.unsqueeze(-1) * u.unsqueeze(-2)  # outer product k_t^T u
        o[:, :, t] = (q_t.unsqueeze(-2) @ S).squeeze(-2)
    return o.to(out_dtype), S


@checked(check_chunkwise_call)
def chunkwise_reference(q, k, v, beta, *, initial_state=None, chunk_size: int = 64):
    """DeltaNet a chunk at a time, the chapter's derivation step by step: one chunk after another,
    its UT transform by one triangular solve. A teaching duplicate of the fast form
    :func:`chunkwise`, which batches the state-independent steps over many chunks and inverts
    blockwise. Arguments and result as in :func:`recurrent`; ``T`` need not divide evenly."""
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
        o[:, :, c] = Q @ S + (Q @ K.transpose(-1, -2)).tril() @ u
        S = S + K.transpose(-1, -2) @ u
    return o.to(out_dtype), S


@checked(check_chunkwise_call)
def chunkwise(q, k, v, beta, *, initial_state=None, chunk_size: int = 64):
    """DeltaNet a chunk of ``chunk_size`` tokens at a time, the fast form: the state-independent
    step (:func:`~gpt2k3.ops.chunks.intra_chunk`) for a whole group of chunks at once, then the
    state pass (:func:`~gpt2k3.ops.chunks.pass_state`), then every output of the group in one
    batch. Equals :func:`recurrent` for any ``T``; arguments and result as there."""
    out_dtype, dtype = v.dtype, torch.promote_types(v.dtype, torch.float32)
    q, k, v, beta = (x.to(dtype) for x in (q, k, v, beta))
    (B, H, T, Dk), Dv = k.shape, v.shape[-1]
    S = k.new_zeros(B * H, Dk, Dv) if initial_state is None else initial_state.to(dtype).reshape(B * H, Dk, Dv)
    o = torch.empty_like(v)
    for span, size in chunk_spans(T, chunk_size, B * H, Dk, Dv):  # groups that fit in memory
        Q, K, V, b = (as_chunks(x[:, :, span], size) for x in (q, k, v, beta))  # (B*H, N, C, .)
        W, U, P = intra_chunk(Q, K, V, b)  # step 1, all N chunks at once: the UT/WY step
        u, S_in, S = pass_state(W, U, K, S)  # step 2, chunk after chunk: the state pass
        o[:, :, span] = (Q @ S_in + P @ u).view_as(o[:, :, span])  # step 3: O = Q S_in + P u
    return o.to(out_dtype), S.view(B, H, Dk, Dv)
